import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { toJson } from "@bufbuild/protobuf";
import { ConnectError } from "@connectrpc/connect";
import { deploymentSpecToProto, replicaStateName } from "@llmgw/control-plane/client";
import { type DeploymentSpec, ENGINES, parseDeploymentSpec } from "@llmgw/engines";
import { type DeploymentStatus, DeploymentStatusSchema, ReplicaState } from "@llmgw/proto";
import { classifyControlPlaneError } from "@llmgw/wire";
import { parse as parseYaml } from "yaml";
import {
  ADMIN_FLAGS,
  ADMIN_FLAGS_USAGE,
  type AdminContext,
  adminContext,
  runAdmin,
} from "../admin-client.js";
import { replicaPlacement } from "../cluster-format.js";
import { type CliIo, type Command, parseCommandArgs, UsageError } from "../command.js";
import { formatDuration, terminalText } from "../table.js";

const USAGE = `Usage: llmgw deploy NAME --model M --engine E [options]
       llmgw deploy -f spec.yaml|spec.json [NAME] [options]

Creates or updates a deployment. With --wait, shows each replica's progress (placed →
starting → loading → ready), the reason it cannot be placed, or why it failed.

Options:
  --model M               Hugging Face id, a path on the nodes, or a GGUF file
  --engine E              ${ENGINES.join(" | ")}
  --gpu-class C           e.g. h100-80g (default: any class)
  --tp N                  tensor parallel size (default 1)
  --pp N                  pipeline parallel size (default 1)
  --replicas N            replicas (default 1)
  --nodes-per-replica N   nodes each replica spans (default: 1 when it fits)
  --max-model-len N       context length
  --served-model-name S   model id clients send (default NAME)
  --extra-arg A           engine flag appended after llmgw's own (repeatable)
  -f, --file F            spec file (YAML or JSON, fields as in the deployment spec)
  --wait                  wait until every replica is ready (exit 1 on failure/timeout)
  --timeout S             seconds --wait waits (default 900)
${ADMIN_FLAGS_USAGE}`;

function count(value: string | undefined, flag: string): number | undefined {
  if (value === undefined) return undefined;
  if (!/^\d+$/.test(value)) throw new UsageError(`${flag} must be a whole number, got "${value}"`);
  return Number(value);
}

function readSpecFile(file: string, cwd: string): Record<string, unknown> {
  const path = resolve(cwd, file);
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (error) {
    throw new UsageError(`cannot read ${path}: ${(error as Error).message}`);
  }
  let parsed: unknown;
  try {
    parsed = parseYaml(text);
  } catch (error) {
    throw new UsageError(`${path} is neither YAML nor JSON: ${(error as Error).message}`);
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
    throw new UsageError(`${path} must hold one deployment spec object`);
  }
  return parsed as Record<string, unknown>;
}

export const command: Command = {
  name: "deploy",
  summary: "create or update a deployment (--wait to follow the rollout)",
  usage: USAGE,
  async run(argv, io) {
    const { values, positionals } = parseCommandArgs(
      argv,
      {
        ...ADMIN_FLAGS,
        model: { type: "string" },
        engine: { type: "string" },
        "gpu-class": { type: "string" },
        tp: { type: "string" },
        pp: { type: "string" },
        replicas: { type: "string" },
        "nodes-per-replica": { type: "string" },
        "max-model-len": { type: "string" },
        "served-model-name": { type: "string" },
        "extra-arg": { type: "string", multiple: true },
        file: { type: "string", short: "f" },
        wait: { type: "boolean" },
        timeout: { type: "string" },
      },
      true,
    );
    if (positionals.length > 1)
      throw new UsageError(`expected one NAME, got ${positionals.length}`);
    const input: Record<string, unknown> = values.file ? readSpecFile(values.file, io.cwd) : {};
    const set = (key: string, value: unknown) => {
      if (value !== undefined) input[key] = value;
    };
    set("name", positionals[0]);
    set("model", values.model);
    set("engine", values.engine);
    set("gpuClass", values["gpu-class"]);
    set("tensorParallel", count(values.tp, "--tp"));
    set("pipelineParallel", count(values.pp, "--pp"));
    set("replicas", count(values.replicas, "--replicas"));
    set("nodesPerReplica", count(values["nodes-per-replica"], "--nodes-per-replica"));
    set("maxModelLen", count(values["max-model-len"], "--max-model-len"));
    set("servedModelName", values["served-model-name"]);
    if (values["extra-arg"]) set("extraArgs", values["extra-arg"]);
    if (input.name === undefined)
      throw new UsageError("NAME is required (or a name in the -f file)");
    if (input.model === undefined)
      throw new UsageError("--model is required (or model in the -f file)");
    if (input.engine === undefined)
      throw new UsageError(`--engine is required: ${ENGINES.join(", ")}`);
    const parsed = parseDeploymentSpec(input);
    if (!parsed.ok) throw new UsageError(parsed.error.message);
    const timeoutS = count(values.timeout, "--timeout") ?? 900;

    const ctx = adminContext(values, io);
    return runAdmin(io, ctx, async () => {
      const res = await ctx.client.applyDeployment({
        deployment: deploymentSpecToProto(parsed.spec),
      });
      const status = res.deployment;
      if (!values.wait) {
        if (ctx.json && status)
          io.stdout.write(`${JSON.stringify(toJson(DeploymentStatusSchema, status), null, 2)}\n`);
        else
          io.stdout.write(
            `${res.changed ? "applied" : "unchanged"} ${parsed.spec.name} (revision ${status?.spec?.revision ?? "?"}): ${status?.desiredReplicas ?? 0} replica(s); follow with 'llmgw deploy ${parsed.spec.name} … --wait' or 'llmgw replicas --deployment ${parsed.spec.name}'\n`,
          );
        return 0;
      }
      io.stderr.write(
        `${res.changed ? "applied" : "unchanged"} ${parsed.spec.name} (revision ${status?.spec?.revision ?? "?"}); waiting for ${status?.desiredReplicas ?? 0} replica(s)\n`,
      );
      return waitForRollout(ctx, io, parsed.spec, timeoutS * 1000);
    });
  },
};

const FAILED_CODE = "LLMGW_CONTROL_PLANE_REPLICA_FAILED";

/** Polls the deployment every 500 ms and prints each replica's progress until all are ready. */
async function waitForRollout(
  ctx: AdminContext,
  io: CliIo,
  spec: DeploymentSpec,
  timeoutMs: number,
): Promise<number> {
  const started = Date.now();
  const shown = new Map<string, string>();
  const loadingSince = new Map<string, number>();
  const lastLoadingLine = new Map<string, number>();
  let shownReasons = "";
  let last: DeploymentStatus | undefined;
  let waitingOut = false;
  // Everything printed here carries cluster text (reasons, status messages, log tails).
  const out = (line: string) => io.stderr.write(`${terminalText(line)}\n`);
  for (;;) {
    if (io.signal.aborted) {
      out("interrupted; the deployment keeps rolling out");
      return 130;
    }
    try {
      last = (await ctx.client.getDeployment({ name: spec.name })).deployment;
    } catch (error) {
      // A control plane restarting, or instances handing the lead over: the rollout goes on
      // without us, so keep asking until the timeout.
      // A read, so safe to repeat whatever the failure did: a refusal, a broken connection.
      if (classifyControlPlaneError(error).action === "stay" || Date.now() - started > timeoutMs)
        throw error;
      if (!waitingOut)
        out(`control plane unavailable (${ConnectError.from(error).rawMessage}); still waiting`);
      waitingOut = true;
      await pause(io.signal, 500);
      continue;
    }
    if (waitingOut) out(`control plane ${ctx.url} answers again`);
    waitingOut = false;
    if (!last) throw new Error(`deployment ${spec.name} disappeared`);
    const now = Date.now();
    const reasons = last.unschedulable
      .filter((r) => r.code !== FAILED_CODE)
      .map((r) => r.message)
      .join("; ");
    if (reasons !== shownReasons) {
      if (reasons) out(`${spec.name}: cannot place every replica: ${reasons}`);
      shownReasons = reasons;
    }
    for (const r of last.replicas) {
      const state = replicaStateName(r.state);
      const since = r.ranks[0]?.status?.stateSinceUnixMs;
      if (r.state === ReplicaState.LOADING && !loadingSince.has(r.replicaId)) {
        loadingSince.set(r.replicaId, since && since > 0n ? Number(since) : now);
      }
      if (shown.get(r.replicaId) !== state) {
        shown.set(r.replicaId, state);
        out(`${r.replicaId}  ${progressText(r, state, now, loadingSince.get(r.replicaId))}`);
        lastLoadingLine.set(r.replicaId, now);
      } else if (
        r.state === ReplicaState.LOADING &&
        now - (lastLoadingLine.get(r.replicaId) ?? now) >= 10_000
      ) {
        out(`${r.replicaId}  ${progressText(r, state, now, loadingSince.get(r.replicaId))}`);
        lastLoadingLine.set(r.replicaId, now);
      }
    }
    // `failed` apart from placement problems; a control plane before it lists them only
    // among the unschedulable reasons.
    const failed =
      last.failed.length > 0
        ? last.failed
        : last.unschedulable.filter((r) => r.code === FAILED_CODE);
    if (failed.length > 0) {
      for (const f of failed) out(f.message);
      out(
        `${spec.name}: ${failed.length} replica(s) failed; see 'llmgw events' and the agent's engine logs`,
      );
      return 1;
    }
    if (
      last.desiredReplicas > 0
        ? last.readyReplicas >= last.desiredReplicas
        : last.replicas.length === 0
    ) {
      out(
        `${spec.name}: ${last.readyReplicas}/${last.desiredReplicas} ready after ${formatDuration(now - started)}`,
      );
      if (ctx.json)
        io.stdout.write(`${JSON.stringify(toJson(DeploymentStatusSchema, last), null, 2)}\n`);
      return 0;
    }
    if (now - started > timeoutMs) {
      out(
        `${spec.name}: timed out after ${formatDuration(now - started)} with ${last.readyReplicas}/${last.desiredReplicas} ready${
          shownReasons ? `; ${shownReasons}` : ""
        }`,
      );
      return 1;
    }
    await pause(io.signal, 500);
  }
}

/** Waits `ms`, or less when `signal` aborts. */
function pause(signal: AbortSignal, ms: number): Promise<void> {
  return new Promise<void>((r) => {
    const t = setTimeout(r, ms);
    signal.addEventListener(
      "abort",
      () => {
        clearTimeout(t);
        r();
      },
      { once: true },
    );
  });
}

function progressText(
  r: DeploymentStatus["replicas"][number],
  state: string,
  now: number,
  loadingSince?: number,
): string {
  switch (r.state) {
    case ReplicaState.PENDING:
      return `placed on ${replicaPlacement(r)}`;
    case ReplicaState.LOADING:
      return `loading (${formatDuration(now - (loadingSince ?? now))})`;
    case ReplicaState.READY:
      return `ready${r.endpoint ? ` at ${r.endpoint}` : ""}`;
    default: {
      const message = r.ranks.find((k) => k.status?.message)?.status?.message;
      return `${state}${message ? ` (${message})` : ""}`;
    }
  }
}
