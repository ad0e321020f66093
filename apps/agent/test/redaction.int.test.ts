// A failed engine's log tail leaves the node in its ReplicaStatus (events, the admin API,
// the control plane's store): whatever secret the engine printed must be gone by then.
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { create } from "@bufbuild/protobuf";
import { simulateInventory } from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import { ReplicaAssignmentSchema, ReplicaState } from "@llmgw/proto";
import { createSupervisor, silentLogger } from "@llmgw/supervisor";
import { deploymentSpecToProto } from "@llmgw/wire";
import { afterEach, describe, expect, it } from "vitest";
import { ReplicaManager } from "../src/replica-manager.js";
import { waitUntil } from "./engine-harness.js";

const HF_TOKEN = "hf_QwErTyUiOpAsDfGhJkLzXcVbNm0123456789";
const dirs: string[] = [];
const managers: ReplicaManager[] = [];
afterEach(async () => {
  for (const m of managers.splice(0)) await m.close(true);
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

// The "engine": prints the token it was given, its API key and a bearer header, then hangs
// without ever serving, so the loading deadline fails it with its tail.
const ENGINE = [
  "console.log('HF_TOKEN is ' + process.env.HF_TOKEN);",
  "console.log('key=' + process.env.LLMGW_ENGINE_API_KEY);",
  "console.log('calling hub with Authorization: Bearer ' + process.env.HF_TOKEN);",
  "console.log('still loading');",
  "setInterval(() => {}, 1000);",
].join("\n");

describe("log tails reported to the control plane", () => {
  it("carry [redacted] where a failed engine printed HF_TOKEN or its API key", async () => {
    const stateDir = mkdtempSync(path.join(tmpdir(), "llmgw-redact-"));
    dirs.push(stateDir);
    const node = simulateInventory("1xh100-80g", { hostname: "node-a" });
    const manager = new ReplicaManager({
      supervisor: createSupervisor({
        stateDir: path.join(stateDir, "pids"),
        logPollIntervalMs: 50,
      }),
      stateDir,
      inventory: () => node,
      // "--": the sim flags llmgw appends are the script's arguments, not node options.
      nodeConfig: { simCommand: [process.execPath, "-e", ENGINE, "--"], bindHost: "127.0.0.1" },
      probes: { probe: async () => "starting", scrapeLoad: async () => ({}) },
      baseEnv: { PATH: process.env.PATH ?? "/usr/bin:/bin" },
      secretEnv: { HF_TOKEN },
      logger: silentLogger,
      probeIntervalMs: 100,
      probeTimeoutMs: 1000,
      defaultLoadingDeadlineMs: 60_000,
      localAddress: "127.0.0.1",
    });
    managers.push(manager);
    const deployment = deploymentSpecToProto(
      parseDeploymentSpecOrThrow({
        name: "leaky",
        model: "org/model",
        engine: "sim",
        loadingDeadlineSeconds: 1,
      }),
    );
    await manager.apply([
      create(ReplicaAssignmentSchema, {
        replicaId: "leaky-0",
        rank: 0,
        gpuIndices: [0],
        deployment,
      }),
    ]);
    const apiKey = manager.engineApiKeys()[0];
    expect(apiKey).toMatch(/^llmgw-engine-/);

    const status = await waitUntil(
      "the replica to fail past its loading deadline",
      () => manager.statuses().find((s) => s.state === ReplicaState.FAILED),
      15_000,
    );
    // The engine really printed the secrets (the log on the node, 0600 in a 0700 dir, keeps them).
    const log = readFileSync(path.join(stateDir, "logs", "leaky-0.log"), "utf8");
    expect(log).toContain(`HF_TOKEN is ${HF_TOKEN}`);
    expect(log).toContain(`key=${apiKey}`);

    const tail = status.logTail.join("\n");
    expect(status.logTail).toEqual(
      expect.arrayContaining([
        "HF_TOKEN is [redacted]",
        "key=[redacted]",
        "calling hub with Authorization: Bearer [redacted]",
        "still loading",
      ]),
    );
    expect(tail).not.toContain(HF_TOKEN);
    expect(tail).not.toContain(apiKey);
  }, 30_000);
});
