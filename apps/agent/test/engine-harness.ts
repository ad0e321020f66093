// Helpers for engines.int.test.ts: build a replica exactly the way the agent's ReplicaManager
// (`#prepare`, `#probeFor`) does — deployment → buildLaunchSpec → ProcessSpec → hashProcessSpec
// → createSupervisedReplica with the agent's probes — and inspect process groups through
// /proc independently of the supervisor under test.
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { simulateInventory } from "@llmgw/discovery";
import {
  buildLaunchSpec,
  type DeploymentSpecInput,
  type LaunchSpec,
  type NodeEngineConfig,
  parseDeploymentSpecOrThrow,
  validateLaunch,
} from "@llmgw/engines";
import {
  createSupervisedReplica,
  hashProcessSpec,
  type ProbeOutcome,
  type ProcessSpec,
  type ReplicaState,
  type ReplicaTransition,
  type RestartPolicyOptions,
  type SupervisedReplica,
  type Supervisor,
} from "@llmgw/supervisor";
import { createEngineProbes } from "../src/probes.js";
import { generateEngineApiKey } from "../src/replica-manager.js";

/** The repository root. */
export const REPO = fileURLToPath(new URL("../../..", import.meta.url));
/** The built CLI the `sim` engine command runs (`llmgw engine-sim`). */
export const CLI_MAIN = path.join(REPO, "apps", "cli", "dist", "main.js");
const HOST = fileURLToPath(new URL("./engine-host.ts", import.meta.url));

/** Builds the CLI with `pnpm --filter llmgw build` when `dist/main.js` is missing. */
export function ensureCliBuilt(): void {
  if (existsSync(CLI_MAIN)) return;
  const r = spawnSync("pnpm", ["--filter", "llmgw", "build"], { cwd: REPO, encoding: "utf8" });
  if (r.status !== 0 || !existsSync(CLI_MAIN)) {
    throw new Error(
      `pnpm --filter llmgw build failed (${String(r.status)}):\n${r.stdout}\n${r.stderr}`,
    );
  }
}

export { freePort } from "@llmgw/supervisor";

/** Live (non-zombie) processes whose process group is `pgid`, read from /proc. */
export function groupMembers(pgid: number): number[] {
  const out: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${entry}/stat`, "utf8");
    } catch {
      continue; // exited while scanning
    }
    // Fields after the comm (which may contain spaces and parens): state ppid pgrp …
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    if (fields[0] !== "Z" && Number(fields[2]) === pgid) out.push(Number(entry));
  }
  return out;
}

/** True while `pid` exists and is not a zombie. */
export function isAlive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3) !== "Z";
  } catch {
    return false;
  }
}

/** Polls `check` every 50 ms until it returns something other than undefined/false. */
export async function waitUntil<T>(
  what: string,
  check: () => T | undefined | false,
  timeoutMs: number,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = check();
    if (value !== undefined && value !== false) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Inputs of {@link prepareReplica}. */
export interface PrepareReplicaInput {
  readonly supervisor: Supervisor;
  /** The agent's state dir (logs go to `<stateDir>/logs/<replicaId>.log`, like the agent). */
  readonly stateDir: string;
  readonly replicaId: string;
  readonly deployment: DeploymentSpecInput;
  readonly nodeConfig: NodeEngineConfig;
  /** `simulateInventory` spec of this node, e.g. "1xh100-80g". */
  readonly simulate: string;
  readonly gpuIndices: readonly number[];
  readonly apiPort: number;
  /** The agent's probe interval (default 1000 ms in the agent; shorter here). */
  readonly probeIntervalMs: number;
  readonly probeTimeoutMs: number;
  readonly loadingDeadlineMs: number;
  /** Key of an engine a previous agent launched (the agent reads it from the replica record). */
  readonly adoptedApiKey?: string;
  /** The agent passes none (supervisor defaults); the crash-loop case shortens it. */
  readonly restartPolicy?: RestartPolicyOptions;
}

/** A replica built the agent's way, with every probe outcome and transition recorded. */
export interface PreparedReplica {
  readonly launch: LaunchSpec;
  readonly spec: ProcessSpec;
  readonly specHash: string;
  readonly replica: SupervisedReplica;
  readonly apiPort: number;
  readonly baseUrl: string;
  readonly metricsUrl: string;
  /** The engine's API key now (a new one per launch, as the agent draws it); undefined: none. */
  apiKey(): string | undefined;
  /** Every probe outcome, in order, with the time it was observed. */
  readonly outcomes: { readonly outcome: ProbeOutcome; readonly atMs: number }[];
  /** Every transition delivered to `subscribe`, in order. */
  readonly transitions: ReplicaTransition[];
  /** Resolves with the first transition (at or after index `from`) into `state`. */
  waitForState(state: ReplicaState, timeoutMs: number, from?: number): Promise<ReplicaTransition>;
}

/** Mirrors `ReplicaManager#prepare` + `#probeFor` for one single-node rank-0 replica. */
export function prepareReplica(input: PrepareReplicaInput): PreparedReplica {
  const deployment = parseDeploymentSpecOrThrow(input.deployment);
  const node = simulateInventory(input.simulate, { hostname: "engines-int" });
  const violations = validateLaunch({
    deployment,
    ranks: [{ nodeId: node.hostname, node, gpuIndices: input.gpuIndices }],
  });
  if (violations.length > 0) {
    throw new Error(violations.map((v) => `${v.code}: ${v.message}`).join("; "));
  }
  const launch = buildLaunchSpec({
    deployment,
    placement: { rank: 0, nnodes: 1, gpuIndices: input.gpuIndices },
    ports: { api: input.apiPort },
    node,
    nodeConfig: input.nodeConfig,
  });
  const base: ProcessSpec = {
    argv: launch.argv,
    env: {
      PATH: process.env.PATH ?? "/usr/bin:/bin",
      HOME: process.env.HOME ?? "/tmp",
      ...launch.env,
    },
    ...(launch.cwd ? { cwd: launch.cwd } : {}),
    stopSignal: launch.stopSignal,
    stopGraceMs: launch.stopGraceMs,
    logFile: path.join(input.stateDir, "logs", `${input.replicaId}.log`),
  };
  const specHash = hashProcessSpec(base);
  const spec: ProcessSpec = { ...base, specHash };
  const readiness = launch.readiness;
  if (!readiness) throw new Error("a rank-0 launch spec must carry readiness");
  const baseUrl = `http://127.0.0.1:${input.apiPort}`;
  const probes = createEngineProbes();
  const outcomes: { outcome: ProbeOutcome; atMs: number }[] = [];
  const apiKeyEnv = launch.apiKeyEnv;
  let apiKey = input.adoptedApiKey;
  const replica = createSupervisedReplica({
    supervisor: input.supervisor,
    replicaId: input.replicaId,
    spec,
    ...(apiKeyEnv === undefined
      ? {}
      : {
          launchEnv: () => {
            apiKey = generateEngineApiKey();
            return { [apiKeyEnv]: apiKey };
          },
        }),
    probe: async () => {
      const outcome = await probes.probe(baseUrl, readiness, input.probeTimeoutMs, apiKey);
      outcomes.push({ outcome, atMs: Date.now() });
      return outcome;
    },
    loadingDeadlineMs: input.loadingDeadlineMs,
    probeIntervalMs: input.probeIntervalMs,
    ...(input.restartPolicy ? { restartPolicy: input.restartPolicy } : {}),
  });
  const transitions: ReplicaTransition[] = [];
  const waiters = new Set<() => void>();
  replica.subscribe((t) => {
    transitions.push(t);
    for (const w of [...waiters]) w();
  });
  const waitForState = (state: ReplicaState, timeoutMs: number, from = 0) =>
    new Promise<ReplicaTransition>((resolve, reject) => {
      const check = (): void => {
        const hit = transitions.slice(from).find((t) => t.to === state);
        if (!hit) return;
        waiters.delete(check);
        clearTimeout(timer);
        resolve(hit);
      };
      const timer = setTimeout(() => {
        waiters.delete(check);
        const seen = transitions.map((t) => `${t.from}→${t.to} (${t.reason})`).join(", ");
        const tail = replica.handle?.tail().slice(-20).join("\n") ?? "";
        reject(
          new Error(`no transition to ${state} within ${timeoutMs} ms; saw: ${seen}\n${tail}`),
        );
      }, timeoutMs);
      waiters.add(check);
      check();
    });
  return {
    launch,
    spec,
    specHash,
    replica,
    apiPort: input.apiPort,
    baseUrl,
    metricsUrl: `${baseUrl}${launch.metricsPath}`,
    apiKey: () => apiKey,
    outcomes,
    transitions,
    waitForState,
  };
}

/** The metrics scrape exactly as the agent runs it (`createEngineProbes().scrapeLoad`). */
export function scrapeLoad(metricsUrl: string, timeoutMs: number, apiKey: string | undefined) {
  return createEngineProbes().scrapeLoad(metricsUrl, timeoutMs, apiKey);
}

/** A previous agent in its own process that launched `spec`; SIGKILL it to "crash the agent". */
export interface EngineHost {
  readonly child: ChildProcess;
  readonly pid: number;
  readonly pgid: number;
  readonly exited: Promise<void>;
}

/** Starts `engine-host.ts` (tsx, source condition) launching `spec` for `replicaId`. */
export async function startEngineHost(
  stateDir: string,
  replicaId: string,
  spec: ProcessSpec,
  timeoutMs: number,
): Promise<EngineHost> {
  const child = spawn(
    process.execPath,
    [
      "--conditions=@llmgw/source",
      "--import",
      "tsx",
      HOST,
      JSON.stringify({ stateDir, replicaId, spec }),
    ],
    { cwd: REPO, stdio: ["ignore", "pipe", "pipe"] },
  );
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  let out = "";
  let err = "";
  child.stderr?.on("data", (d: Buffer) => {
    err += d.toString("utf8");
  });
  const line = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`engine host printed nothing in ${timeoutMs} ms: ${err}`));
    }, timeoutMs);
    child.stdout?.on("data", (d: Buffer) => {
      out += d.toString("utf8");
      const nl = out.indexOf("\n");
      if (nl >= 0) {
        clearTimeout(timer);
        resolve(out.slice(0, nl));
      }
    });
    void exited.then(() => {
      clearTimeout(timer);
      reject(new Error(`engine host exited early: ${err}`));
    });
  });
  const parsed = JSON.parse(line) as { pid: number; pgid: number };
  return { child, pid: parsed.pid, pgid: parsed.pgid, exited };
}
