// Deployments a node refuses before launching anything: what the env or the model path of a
// deployment may not make the agent do. Each ends as a FAILED status naming the reason.
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { create } from "@bufbuild/protobuf";
import { simulateInventory } from "@llmgw/discovery";
import { deploymentSpecSchema } from "@llmgw/engines";
import { ReplicaAssignmentSchema, ReplicaState } from "@llmgw/proto";
import { createSupervisor, silentLogger } from "@llmgw/supervisor";
import { deploymentSpecToProto } from "@llmgw/wire";
import { afterEach, describe, expect, it } from "vitest";
import { isAgentError } from "./errors.js";
import { checkModelRoot } from "./model-root.js";
import { ReplicaManager, type ReplicaManagerOptions } from "./replica-manager.js";

const dirs: string[] = [];
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});
function tempDir(): string {
  const dir = mkdtempSync(path.join(tmpdir(), "llmgw-hostile-"));
  dirs.push(dir);
  return dir;
}

function manager(extra: Partial<ReplicaManagerOptions> = {}) {
  const stateDir = tempDir();
  const node = simulateInventory("1xh100-80g", { hostname: "node-a" });
  return new ReplicaManager({
    supervisor: createSupervisor({ stateDir: path.join(stateDir, "pids") }),
    stateDir,
    inventory: () => node,
    nodeConfig: {},
    probes: { probe: async () => "ready", scrapeLoad: async () => ({}) },
    baseEnv: {},
    secretEnv: {},
    logger: silentLogger,
    probeIntervalMs: 1000,
    probeTimeoutMs: 1000,
    defaultLoadingDeadlineMs: 60_000,
    localAddress: "127.0.0.1",
    ...extra,
  });
}

/**
 * An assignment as the control plane would send it. The schema is bypassed on purpose
 * (`deploymentSpecSchema.parse` is not used for the env) so that a deployment the control
 * plane should have refused still reaches the agent, which must refuse it itself.
 */
function assignment(spec: Record<string, unknown>) {
  const parsed = deploymentSpecSchema.parse({
    name: "m",
    model: "org/model",
    engine: "sim",
    ...spec,
    env: {},
  });
  const deployment = deploymentSpecToProto({
    ...parsed,
    env: (spec.env as Record<string, string>) ?? {},
  });
  return create(ReplicaAssignmentSchema, {
    replicaId: "m-0",
    rank: 0,
    gpuIndices: [0],
    deployment,
  });
}

/** A logger that keeps the fields of each warning, to read the refusal's code from. */
function recordingLogger() {
  const warnings: Readonly<Record<string, unknown>>[] = [];
  return {
    warnings,
    logger: { info: () => {}, warn: (_: string, fields = {}) => void warnings.push(fields) },
  };
}

/** What `fn` throws (undefined when it returns). */
function thrown(fn: () => unknown): unknown {
  try {
    fn();
  } catch (error) {
    return error;
  }
  return undefined;
}

async function failure(m: ReplicaManager, spec: Record<string, unknown>): Promise<string> {
  await m.apply([assignment(spec)]);
  const [status] = m.statuses();
  expect(status?.state).toBe(ReplicaState.FAILED);
  expect(m.managedPids().size).toBe(0);
  await m.close(true);
  return status?.message ?? "";
}

describe("a deployment's env on the agent", () => {
  it("PATH pointing at a fake engine is refused before anything runs", async () => {
    const bin = tempDir();
    writeFileSync(path.join(bin, "llmgw"), "#!/bin/sh\ntouch ran\n", { mode: 0o755 });
    const message = await failure(manager(), { env: { PATH: bin } });
    expect(message).toContain(
      "PATH chooses which executables or configuration files the engine runs",
    );
  });

  it("a name off the allow-list fails the replica with the flag that would allow it", async () => {
    const message = await failure(manager(), { env: { MY_TUNING: "1" } });
    expect(message).toContain(
      "MY_TUNING is not on this node's engine environment allow-list; an operator can allow it on a node with `llmgw agent --allow-engine-env MY_TUNING`",
    );
  });
});

describe("trustRemoteCode on the agent", () => {
  it("fails the replica unless the node's operator allows it", async () => {
    const message = await failure(manager(), { trustRemoteCode: true });
    expect(message).toBe(
      "trustRemoteCode runs the model repository's own Python code on this node; its operator allows that with `llmgw agent --allow-trust-remote-code` (LLMGW_ALLOW_TRUST_REMOTE_CODE=1)",
    );
  });

  it("is refused with LLMGW_AGENT_ASSIGNMENT_REFUSED", async () => {
    const { warnings, logger } = recordingLogger();
    await failure(manager({ logger }), { trustRemoteCode: true });
    expect(warnings).toMatchObject([{ replicaId: "m-0", code: "LLMGW_AGENT_ASSIGNMENT_REFUSED" }]);
  });

  it("is not refused on a node that allows it", async () => {
    const m = manager({ allowTrustRemoteCode: true });
    await m.apply([assignment({ trustRemoteCode: true })]);
    const [status] = m.statuses();
    await m.close(true);
    expect(status?.message ?? "").not.toContain("trustRemoteCode");
  });
});

describe("--model-root", () => {
  function layout() {
    const base = tempDir();
    const root = path.join(base, "models");
    mkdirSync(path.join(root, "m"), { recursive: true });
    writeFileSync(path.join(root, "m.gguf"), "GGUF");
    writeFileSync(path.join(base, "secret.gguf"), "not a model");
    symlinkSync(path.join(base, "secret.gguf"), path.join(root, "escape.gguf"));
    return { base, root };
  }

  it.each([
    ["an absolute path inside", "m", "vllm"],
    ["a llama.cpp file inside", "m.gguf", "llamacpp"],
  ])("accepts %s", (_, model, engine) => {
    const { root } = layout();
    expect(() => checkModelRoot(path.join(root, model), engine, root)).not.toThrow();
  });

  it("lets Hugging Face ids through: they are not paths", () => {
    const { base, root } = layout();
    expect(() => checkModelRoot("meta-llama/Llama-3.1-8B-Instruct", "vllm", root)).not.toThrow();
    expect(() => checkModelRoot("gpt2", "vllm", root, base)).not.toThrow();
  });

  // vLLM and transformers load a local directory first when the name exists relative to the
  // engine's cwd, so a relative path dressed as an id must resolve inside the root too.
  it.each([
    [
      "a relative path that exists from the engine's cwd",
      "outside/model",
      "outside the model root",
    ],
    ["a bare name that exists from the engine's cwd", "outside", "outside the model root"],
    ["a name with more than one /", "org/model/extra", "cannot be resolved"],
    ["a name with a . segment", "org/./model", "cannot be resolved"],
  ])("refuses %s (%j) for vllm", (_, model, message) => {
    const { base, root } = layout();
    mkdirSync(path.join(base, "outside", "model"), { recursive: true });
    expect(() => checkModelRoot(model, "vllm", root, base)).toThrow(message);
  });

  it.each([
    ["a path outside", (base: string) => path.join(base, "secret.gguf")],
    ["a path that does not exist", (base: string) => path.join(base, "missing")],
  ])("refuses %s with LLMGW_AGENT_MODEL_OUTSIDE_ROOT", (_, model) => {
    const { base, root } = layout();
    const error = thrown(() => checkModelRoot(model(base), "llamacpp", root));
    expect(isAgentError(error) && error.code).toBe("LLMGW_AGENT_MODEL_OUTSIDE_ROOT");
  });

  it("accepts a relative name that resolves inside the root", () => {
    const { base, root } = layout();
    expect(() => checkModelRoot("models/m", "vllm", root, base)).not.toThrow();
  });

  it.each([
    [
      "an absolute path outside",
      (base: string) => path.join(base, "secret.gguf"),
      "outside the model root",
    ],
    [
      "a symlink inside that points outside",
      (_: string, root: string) => path.join(root, "escape.gguf"),
      "outside the model root",
    ],
    [
      "a .. escape",
      (_: string, root: string) => `${root}/../secret.gguf`,
      "outside the model root",
    ],
    [
      "a path that does not exist",
      (_: string, root: string) => path.join(root, "missing"),
      "cannot be resolved: ENOENT",
    ],
  ])("refuses %s", (_, model, message) => {
    const { base, root } = layout();
    expect(() => checkModelRoot(model(base, root), "llamacpp", root)).toThrow(message);
  });

  it("fails the replica on the agent, naming the model and the root", async () => {
    const { base, root } = layout();
    const model = path.join(base, "secret.gguf");
    const { warnings, logger } = recordingLogger();
    const message = await failure(manager({ modelRoot: root, logger }), {
      engine: "llamacpp",
      model,
      gpusPerReplica: 1,
    });
    expect(message).toBe(
      `model ${JSON.stringify(model)} resolves to ${model}, outside the model root ${root} (llmgw agent --model-root)`,
    );
    expect(warnings).toMatchObject([{ code: "LLMGW_AGENT_MODEL_OUTSIDE_ROOT" }]);
  });
});
