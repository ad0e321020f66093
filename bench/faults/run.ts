/**
 * Fault to drain (issue 20): from a fault line appearing in a node's kernel log to (a) routers
 * no longer sending to the replica on that GPU and (b) a replacement replica READY. Goal:
 * (a) ≤ 2 s, (b) ≤ 10 s plus the engine's own load time, over 20 faults.
 *
 * Real processes, as an operator runs them: a control plane (`--heartbeat-interval` as given;
 * the fault path sends an out-of-band heartbeat, so it should not matter, and each interval
 * runs its own cluster to show it) and three agents `--simulate 2xh100-80g`, each following a
 * kernel-log FILE (`--kernel-log PATH`); one SIM deployment of 2 replicas; closed loops of
 * small chat completions through the public API with an API key. Each fault appends a real
 * Xid line (health-formats.md §1.3, PCI id rewritten to the replica's GPU) to its node's log,
 * cycling 48, 95, 119, 120, 64, 79 (79 takes the whole node out), times the admin API and the
 * traffic, then clears every GPU the fault took out (ClearGpuFaults, what `llmgw gpu clear`
 * calls) and waits for it to be healthy before the next one.
 *
 *   node --conditions=@llmgw/source --import tsx bench/faults/run.ts [--faults 20] [--quick]
 *        [--heartbeat 500ms,2s] [--replicas 2] [--concurrency 4] [--cp-log PATH-PREFIX]
 */
import { appendFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";
import { create } from "@bufbuild/protobuf";
import {
  DeploymentSchema,
  type DeploymentStatus,
  Engine,
  NodeState,
  ReplicaState,
} from "@llmgw/proto";
import { Agent, request } from "undici";
import {
  AgentProc,
  allReady,
  ControlPlaneProc,
  deployment,
  ensureCliBuilt,
  freePort,
  stopAll,
  tempRoot,
  waitFor,
} from "../../apps/cli/test/cluster-harness.js";
import { loadAverage } from "../lib/children.js";
import { type GoalResult, printReport } from "../lib/report.js";
import { formatTable } from "../lib/table.js";
import { classifyFailure, classifyJson } from "../soak/classify.js";
import {
  FAULT_CYCLE,
  type FaultScope,
  failuresInWindow,
  faultLine,
  inScope,
  isNodeWideAction,
  lastRoutedAfter,
  lineAction,
  type RankPlace,
  type RequestRecord,
  replicasInScope,
  type Spread,
  spread,
  type WindowFailures,
} from "./measure.js";

const { values: args } = parseArgs({
  options: {
    quick: { type: "boolean", default: false },
    faults: { type: "string" },
    heartbeat: { type: "string" },
    replicas: { type: "string", default: "2" },
    concurrency: { type: "string", default: "4" },
    "cp-log": { type: "string" },
  },
});
const quick = args.quick ?? false;
const config = {
  faults: Number(args.faults ?? (quick ? 3 : 20)),
  heartbeats: (args.heartbeat ?? (quick ? "500ms" : "500ms,2s")).split(",").filter(Boolean),
  replicas: Number(args.replicas),
  concurrency: Number(args.concurrency),
  nodes: 3,
  simulate: "2xh100-80g",
  // Small answers so each loop sends often: the client's view of "routing stopped" is only as
  // sharp as the gap between one loop's requests.
  maxTokens: 8,
  thinkMs: 20,
  engineArgs: ["--time-scale", "10"],
  adminPollMs: 20,
  drainTimeoutMs: 10_000,
  readyTimeoutMs: 40_000,
  requestTimeoutMs: 30_000,
  /** The watcher folds a repeat of the same (GPU, code) within this window into one fault. */
  burstWindowMs: 60_000,
};
const MODEL = "faults-chat";
const DEPLOYMENT = "faults";

/** What one fault measured (ms from writing the line, `t0`). */
interface FaultResult {
  readonly n: number;
  readonly heartbeat: string;
  readonly code: number;
  readonly action: string;
  readonly node: string;
  readonly gpu: number | "all";
  readonly line: string;
  /** Same node, GPU and code written less than the watcher's burst window ago. */
  readonly repeat: boolean;
  readonly replicasOut: readonly string[];
  /** The admin API no longer lists a replica on the faulted GPU(s). */
  readonly adminGoneMs?: number;
  /** Last request sent after t0 that a faulted replica answered, minus t0 (0: none). */
  readonly lastRoutedMs?: number;
  /** Last request sent in the window that failed with a 502 upstream_unavailable or a reset. */
  readonly last502Ms?: number;
  /** (a): the later of the two. */
  readonly routingStopMs?: number;
  /** (b): every replica READY again, none on the faulted GPU(s). */
  readonly replacementReadyMs?: number;
  /** Replacement's engine start → READY as its agent reported (the engine's own load). */
  readonly loadMs?: number;
  /** Replacement first listed (placed) → seen READY, on this side's polling. */
  readonly placedToReadyMs?: number;
  readonly beyondLoadMs?: number;
  /** Admin polls in the window that listed an untouched replica as not READY (or no endpoint). */
  readonly keptNotReadyPolls?: number;
  readonly cleared: readonly string[];
  readonly clearedHealthyMs?: number;
  readonly window?: WindowFailures;
  readonly error?: string;
}

/** Each replica rank's place from the deployment status. */
function rankPlaces(d: DeploymentStatus | undefined): RankPlace[] {
  return (d?.replicas ?? []).flatMap((r) =>
    r.ranks.map((k) => ({ replicaId: r.replicaId, nodeId: k.nodeId, gpuIndices: k.gpuIndices })),
  );
}

const placeKey = (r: RankPlace) => `${r.replicaId}@${r.nodeId}/${r.gpuIndices.join("+")}`;

/** Closed loops of small non-streaming chat completions; every answer is recorded. */
function startLoad(baseUrl: string, apiKey: string, now: () => number) {
  const dispatcher = new Agent({ connections: config.concurrency * 2, keepAliveTimeout: 2_000 });
  const records: RequestRecord[] = [];
  let stopping = false;
  let id = 0;
  const one = async (): Promise<RequestRecord> => {
    id += 1;
    const body = JSON.stringify({
      model: MODEL,
      max_tokens: config.maxTokens,
      messages: [{ role: "user", content: `fault bench ${id}` }],
    });
    const startMs = now();
    let answered = false;
    let replica: string | undefined;
    let verdict: { class: string; detail: string };
    try {
      const res = await request(`${baseUrl}/v1/chat/completions`, {
        method: "POST",
        dispatcher,
        headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
        body,
        signal: AbortSignal.timeout(config.requestTimeoutMs),
      });
      answered = true;
      const header = res.headers["x-llmgw-replica"];
      replica = typeof header === "string" ? header : undefined;
      verdict = classifyJson(res.statusCode, await res.body.text());
    } catch (error) {
      verdict = classifyFailure(error, answered);
    }
    const ok = verdict.class === "ok";
    return {
      startMs,
      endMs: now(),
      ...(replica === undefined ? {} : { replica }),
      ok,
      ...(ok ? {} : { detail: `${verdict.class}: ${verdict.detail}` }),
    };
  };
  const loop = async () => {
    while (!stopping) {
      const r = await one();
      records.push(r);
      // An error comes back at once: pause a little longer so a 503 is not spun on.
      await new Promise((res) => setTimeout(res, r.ok ? config.thinkMs : 50));
    }
  };
  const loops = Array.from({ length: config.concurrency }, () => loop());
  return {
    records,
    async stop() {
      stopping = true;
      await Promise.all(loops);
      await dispatcher.close();
    },
  };
}

/** One cluster at one heartbeat interval, `config.faults` faults in a row. */
async function runCluster(heartbeat: string): Promise<{
  faults: FaultResult[];
  requests: number;
  setupS: number;
  loadavg: string;
}> {
  const root = tempRoot("llmgw-bench-faults-");
  const setupStart = performance.now();
  try {
    const cp = new ControlPlaneProc(root, await freePort(), await freePort(), [
      "--heartbeat-interval",
      heartbeat,
    ]);
    await cp.start();
    const admin = cp.admin();
    const headers = cp.adminHeaders();
    const logs = new Map<string, string>(); // hostname → kernel log file
    for (let i = 0; i < config.nodes; i++) {
      const name = `fault-${String.fromCharCode(97 + i)}`;
      const log = path.join(root, `${name}.kmsg`);
      writeFileSync(log, "");
      new AgentProc(root, name, config.simulate, cp).start(["--kernel-log", log]);
      logs.set(name, log);
    }
    await waitFor(`${config.nodes} agents to register`, async () => {
      const res = await admin.listNodes({}, headers);
      return res.nodes.filter((n) => n.state === NodeState.READY).length === config.nodes
        ? true
        : undefined;
    });
    await admin.applyDeployment(
      {
        deployment: create(DeploymentSchema, {
          name: DEPLOYMENT,
          model: `sim/${DEPLOYMENT}`,
          servedModelName: MODEL,
          engine: Engine.SIM,
          gpuClass: "h100-80g",
          replicas: config.replicas,
          extraArgs: config.engineArgs,
        }),
      },
      headers,
    );
    await waitFor(
      `${DEPLOYMENT} to be ready`,
      async () => (allReady(await deployment(cp, DEPLOYMENT), config.replicas) ? true : undefined),
      60_000,
    );
    const key = await admin.createApiKey({ name: "faults" }, headers);
    const setupS = (performance.now() - setupStart) / 1000;
    const load = startLoad(cp.publicUrl, key.secret, () => performance.now());
    await waitFor("steady traffic", () =>
      load.records.filter((r) => r.ok).length >= 20 ? true : undefined,
    );

    const written = new Map<string, number>(); // node/bus/code → when last written
    const faults: Omit<FaultResult, "lastRoutedMs" | "routingStopMs" | "last502Ms" | "window">[] =
      [];
    const t0s: number[] = [];
    const replacedAts: ReadonlyMap<string, number>[] = [];
    for (let n = 0; n < config.faults; n++) {
      const result = await oneFault(n);
      faults.push(result.fault);
      t0s.push(result.t0);
      replacedAts.push(result.replacedAt);
      console.error(
        `[${heartbeat}] fault ${n + 1}/${config.faults}: Xid ${result.fault.code} on ${result.fault.node} GPU ${result.fault.gpu}: off in ${result.fault.adminGoneMs ?? "?"} ms, replacement READY in ${result.fault.replacementReadyMs ?? "?"} ms${result.fault.error ? ` — ${result.fault.error}` : ""}`,
      );
      if (result.fault.error !== undefined && result.fault.clearedHealthyMs === undefined) break;
    }
    // Requests still in flight at the last READY end first: they may have been routed before.
    await new Promise((r) => setTimeout(r, 500));
    await load.stop();
    const loadavg = loadAverage();
    // The control plane's own log (router circuit events, reconciles) for reading a run after.
    if (args["cp-log"]) writeFileSync(`${args["cp-log"]}-${heartbeat}`, cp.proc?.output() ?? "");

    const measured = faults.map((f, i): FaultResult => {
      const t0 = t0s[i] ?? 0;
      if (f.adminGoneMs === undefined) return f;
      const lastRoutedMs = Math.round(
        lastRoutedAfter(load.records, f.replicasOut, t0, replacedAts[i]),
      );
      const routingStopMs = Math.max(lastRoutedMs, f.adminGoneMs);
      // A 502 carries no replica header, so it cannot be pinned on the faulted engine; shown
      // beside (a), not in it.
      const upstreamErrors = load.records.filter(
        (r) => r.startMs >= t0 && /upstream_unavailable|reset/.test(r.detail ?? ""),
      );
      const end0 = t0 + (f.replacementReadyMs ?? f.adminGoneMs);
      const inWindow = upstreamErrors.filter((r) => r.startMs <= end0);
      const last502Ms =
        inWindow.length === 0
          ? undefined
          : Math.round(Math.max(...inWindow.map((r) => r.startMs)) - t0);
      const end = t0 + (f.replacementReadyMs ?? f.adminGoneMs);
      return {
        ...f,
        lastRoutedMs,
        routingStopMs,
        ...(last502Ms === undefined ? {} : { last502Ms }),
        window: failuresInWindow(load.records, t0, end),
      };
    });
    return { faults: measured, requests: load.records.length, setupS, loadavg };

    async function oneFault(n: number): Promise<{
      t0: number;
      replacedAt: ReadonlyMap<string, number>;
      fault: Omit<FaultResult, "lastRoutedMs" | "routingStopMs" | "last502Ms" | "window">;
    }> {
      const code = FAULT_CYCLE[n % FAULT_CYCLE.length] as number;
      const before = await deployment(cp, DEPLOYMENT);
      const ranks = rankPlaces(before);
      const replicaIds = [...new Set(ranks.map((r) => r.replicaId))].sort();
      const targetId = replicaIds[n % replicaIds.length];
      const target = ranks.find((r) => r.replicaId === targetId);
      const nodes = (await admin.listNodes({}, headers)).nodes;
      const node = nodes.find((x) => x.nodeId === target?.nodeId);
      const gpuIndex = target?.gpuIndices[0] ?? 0;
      const gpu = node?.inventory?.gpus.find((g) => g.index === gpuIndex);
      const log = logs.get(node?.hostname ?? "");
      if (!target || !node || !gpu || !log) {
        throw new Error(`fault ${n + 1}: no replica placement to fault (${ranks.length} ranks)`);
      }
      const line = faultLine(code, gpu.pciBusId);
      const action = lineAction(line) ?? "unparsed";
      const scope: FaultScope = isNodeWideAction(lineAction(line))
        ? { nodeId: node.nodeId }
        : { nodeId: node.nodeId, gpuIndex };
      const replicasOut = replicasInScope(ranks, scope);
      const keptPlaces = new Set(ranks.filter((r) => !inScope(r, scope)).map(placeKey));
      const writtenKey = `${node.hostname}/${gpu.pciBusId}/${code}`;
      const lastWritten = written.get(writtenKey);
      const base = {
        n: n + 1,
        heartbeat,
        code,
        action,
        node: node.hostname,
        gpu: scope.gpuIndex ?? ("all" as const),
        line,
        repeat: lastWritten !== undefined && performance.now() - lastWritten < config.burstWindowMs,
        replicasOut,
      };
      const polls = () => ({ keptNotReadyPolls });

      const t0 = performance.now();
      const t0Unix = performance.timeOrigin + t0;
      appendFileSync(log, `${line}\n`);
      written.set(writtenKey, t0);
      const since = () => Math.round(performance.now() - t0);

      // A replacement counts once its own engine (started after the line was written) is
      // READY: one that reuses the faulted replica's id on the same node shows the old
      // engine's status until its agent reports the new one.
      const freshReady = (d: DeploymentStatus | undefined, r: RankPlace): boolean => {
        const status = d?.replicas
          .find((x) => x.replicaId === r.replicaId)
          ?.ranks.find((k) => k.nodeId === r.nodeId)?.status;
        return (
          status?.state === ReplicaState.READY &&
          status.startedAtUnixMs !== undefined &&
          Number(status.startedAtUnixMs) >= t0Unix
        );
      };
      let adminGoneMs: number | undefined;
      let replacementReadyMs: number | undefined;
      let after: DeploymentStatus | undefined;
      const placedAt = new Map<string, number>();
      // Polls in which a replica the fault did not touch was listed as anything but READY
      // with an endpoint: tells a control-plane view problem from a router one.
      let keptNotReadyPolls = 0;
      const deadline = t0 + config.readyTimeoutMs;
      while (performance.now() < deadline) {
        after = await deployment(cp, DEPLOYMENT);
        const places = rankPlaces(after);
        const onFaulted = places.some((r) => inScope(r, scope));
        if (adminGoneMs === undefined && !onFaulted) adminGoneMs = since();
        const fresh = places.filter((p) => !keptPlaces.has(placeKey(p)));
        const keptViews = (after?.replicas ?? []).filter((r) =>
          r.ranks.some((k) =>
            keptPlaces.has(
              placeKey({ replicaId: r.replicaId, nodeId: k.nodeId, gpuIndices: k.gpuIndices }),
            ),
          ),
        );
        if (keptViews.some((r) => r.state !== ReplicaState.READY || r.endpoint === "")) {
          keptNotReadyPolls += 1;
        }
        for (const p of fresh) {
          if (!placedAt.has(placeKey(p))) placedAt.set(placeKey(p), since());
        }
        if (
          !onFaulted &&
          allReady(after, config.replicas) &&
          fresh.every((p) => freshReady(after, p))
        ) {
          replacementReadyMs = since();
          break;
        }
        if (adminGoneMs === undefined && since() > config.drainTimeoutMs) break;
        await new Promise((r) => setTimeout(r, config.adminPollMs));
      }
      console.error(
        `  before: ${ranks.map(placeKey).join(" ")}; after: ${rankPlaces(after).map(placeKey).join(" ")}`,
      );

      // The replacement's own load, from its agent's report: engine start → READY.
      const replacementStatuses = (after?.replicas ?? []).flatMap((r) =>
        r.ranks
          .filter(
            (k) =>
              k.rank === 0 &&
              placedAt.has(
                placeKey({ replicaId: r.replicaId, nodeId: k.nodeId, gpuIndices: k.gpuIndices }),
              ),
          )
          .map((k) => ({ replicaId: r.replicaId, status: k.status })),
      );
      const loads = replacementStatuses.flatMap(({ status: s }) =>
        s?.startedAtUnixMs === undefined
          ? []
          : [Number(s.stateSinceUnixMs) - Number(s.startedAtUnixMs)],
      );
      // When each reused id's replacement became READY, on this process's clock.
      const replacedAt: [string, number][] = replacementStatuses.flatMap(({ replicaId, status }) =>
        status === undefined
          ? []
          : [[replicaId, Number(status.stateSinceUnixMs) - performance.timeOrigin]],
      );
      const loadMs = loads.length === 0 ? undefined : Math.max(...loads);
      const placed = [...placedAt.values()];
      const placedToReadyMs =
        replacementReadyMs === undefined || placed.length === 0
          ? undefined
          : replacementReadyMs - Math.min(...placed);

      // Give the GPUs back: clear every GPU the fault took out, then wait until all are healthy.
      const cleared: string[] = [];
      const clearStart = performance.now();
      let clearedHealthyMs: number | undefined;
      try {
        await waitFor(
          "every GPU healthy after gpu clear",
          async () => {
            const list = (await admin.listNodes({}, headers)).nodes;
            let unhealthy = 0;
            for (const x of list) {
              for (const reading of x.gpuReadings) {
                if (reading.healthy) continue;
                unhealthy += 1;
                await admin.clearGpuFaults({ node: x.nodeId, gpuIndex: reading.index }, headers);
                cleared.push(`${x.hostname}/${reading.index}`);
              }
            }
            return unhealthy === 0 ? true : undefined;
          },
          15_000,
          100,
        );
        await waitFor(
          `${DEPLOYMENT} ready after the clear`,
          async () =>
            allReady(await deployment(cp, DEPLOYMENT), config.replicas) ? true : undefined,
          config.readyTimeoutMs,
        );
        clearedHealthyMs = Math.round(performance.now() - clearStart);
      } catch (error) {
        return {
          t0,
          replacedAt: new Map(replacedAt),
          fault: {
            ...base,
            ...(adminGoneMs === undefined ? {} : { adminGoneMs }),
            ...polls(),
            cleared,
            error: (error as Error).message,
          },
        };
      }
      const error =
        adminGoneMs === undefined
          ? `the admin API still listed a replica on the faulted GPU after ${config.drainTimeoutMs} ms`
          : replacementReadyMs === undefined
            ? `no replacement READY within ${config.readyTimeoutMs} ms`
            : undefined;
      return {
        t0,
        replacedAt: new Map(replacedAt),
        fault: {
          ...base,
          ...(adminGoneMs === undefined ? {} : { adminGoneMs }),
          ...polls(),
          ...(replacementReadyMs === undefined ? {} : { replacementReadyMs }),
          ...(loadMs === undefined ? {} : { loadMs }),
          ...(placedToReadyMs === undefined ? {} : { placedToReadyMs }),
          ...(replacementReadyMs === undefined || loadMs === undefined
            ? {}
            : { beyondLoadMs: replacementReadyMs - loadMs }),
          cleared: [...new Set(cleared)],
          clearedHealthyMs,
          ...(error === undefined ? {} : { error }),
        },
      };
    }
  } finally {
    await stopAll([root]);
  }
}

const cell = (v: number | undefined) => (v === undefined ? "-" : String(v));
const spreadCells = (s: Spread) => [cell(s.p50), cell(s.p90), cell(s.max)];

async function main(): Promise<number> {
  ensureCliBuilt();
  const runs: {
    heartbeat: string;
    faults: FaultResult[];
    requests: number;
    setupS: number;
    loadavg: string;
  }[] = [];
  for (const heartbeat of config.heartbeats) {
    runs.push({ heartbeat, ...(await runCluster(heartbeat)) });
  }
  const all = runs.flatMap((r) => r.faults);
  const perFault = formatTable(
    [
      "hb",
      "#",
      "Xid",
      "action",
      "node",
      "gpu",
      "repeat",
      "routed ms",
      "admin ms",
      "(a) ms",
      "last 502",
      "(b) ms",
      "load ms",
      "(b)-load",
      "in window",
      "failed",
      "kept !ready",
      "failure codes",
    ],
    all.map((f) => [
      f.heartbeat,
      f.n,
      f.code,
      f.action,
      f.node,
      f.gpu,
      f.repeat ? "yes" : "",
      cell(f.lastRoutedMs),
      cell(f.adminGoneMs),
      cell(f.routingStopMs),
      cell(f.last502Ms),
      cell(f.replacementReadyMs),
      cell(f.loadMs),
      cell(f.beyondLoadMs),
      cell(f.window?.requests),
      cell(f.window?.failed),
      cell(f.keptNotReadyPolls),
      Object.entries(f.window?.byDetail ?? {})
        .map(([d, c]) => `${d} ×${c}`)
        .join(", ") ||
        (f.error ?? ""),
    ]),
  );
  const column = (faults: FaultResult[], pick: (f: FaultResult) => number | undefined) =>
    spread(faults.flatMap((f) => (pick(f) === undefined ? [] : [pick(f) as number])));
  const summaries = runs.map((r) => ({
    heartbeat: r.heartbeat,
    faults: r.faults.length,
    requests: r.requests,
    failedInWindows: r.faults.reduce((n, f) => n + (f.window?.failed ?? 0), 0),
    setupS: Math.round(r.setupS * 10) / 10,
    loadavg: r.loadavg,
    routingStopMs: column(r.faults, (f) => f.routingStopMs),
    lastRoutedMs: column(r.faults, (f) => f.lastRoutedMs),
    adminGoneMs: column(r.faults, (f) => f.adminGoneMs),
    replacementReadyMs: column(r.faults, (f) => f.replacementReadyMs),
    loadMs: column(r.faults, (f) => f.loadMs),
    beyondLoadMs: column(r.faults, (f) => f.beyondLoadMs),
  }));
  const summary = formatTable(
    ["hb", "faults", "measure", "p50 ms", "p90 ms", "max ms"],
    summaries.flatMap((s) =>
      (
        [
          ["(a) routing stop", s.routingStopMs],
          ["  last routed", s.lastRoutedMs],
          ["  admin gone", s.adminGoneMs],
          ["(b) replacement READY", s.replacementReadyMs],
          ["  engine load", s.loadMs],
          ["(b) - load", s.beyondLoadMs],
        ] as const
      ).map(([label, v]) => [s.heartbeat, s.faults, label, ...spreadCells(v)]),
    ),
  );
  const goals: GoalResult[] = summaries.flatMap((s) => [
    {
      goal: `[hb ${s.heartbeat}] (a) routing stops ≤ 2000 ms after the line, every fault`,
      measured: `max ${cell(s.routingStopMs.max)} ms over ${s.faults}`,
      met: s.routingStopMs.max !== undefined && s.routingStopMs.max <= 2_000,
    },
    {
      goal: `[hb ${s.heartbeat}] (b) replacement READY ≤ 10000 ms + engine load, every fault`,
      measured: `max ${cell(s.beyondLoadMs.max)} ms beyond load over ${s.faults}`,
      met: s.beyondLoadMs.max !== undefined && s.beyondLoadMs.max <= 10_000,
    },
  ]);
  const unmeasured = all.filter(
    (f) => f.routingStopMs === undefined || f.beyondLoadMs === undefined || f.error !== undefined,
  );
  const short = runs.filter((r) => r.faults.length < config.faults);
  const footer = [
    "",
    `(a) = max(routed, admin): routed = send time of the last request after the line that a faulted replica answered (0: none), admin = the admin API (polled every ${config.adminPollMs} ms) stops listing a replica on the faulted GPU(s).`,
    "last 502 = send time of the last request in the window that failed with 502 upstream_unavailable or a reset: it carries no replica header, so it is not counted in (a), but was most likely sent to the engine being stopped.",
    "(b) = every replica READY again, none on the faulted GPU(s); load = the replacement engine's start → READY as its agent reported it.",
    `repeat = the same GPU and Xid were written less than ${config.burstWindowMs / 1000} s before: the watcher folds it into the earlier fault (no new "opened" event).`,
    `"in window" = requests in flight between the line and (b); "failed" = those that did not end in a complete answer; "kept !ready" = admin polls in that window listing a replica the fault did not touch as not READY or without an endpoint.`,
    ...summaries.map(
      (s) =>
        `[hb ${s.heartbeat}] ${s.requests} requests, ${s.failedInWindows} failed inside fault windows; setup ${s.setupS} s; load average ${s.loadavg}`,
    ),
  ].join("\n");
  printReport("faults", `${perFault}\n\n${summary}\n${footer}`, goals, {
    bench: "faults",
    mode: quick ? "quick" : "full",
    at: new Date().toISOString(),
    config,
    summaries,
    faults: all,
    goals,
  });
  if (unmeasured.length > 0 || short.length > 0) {
    console.error(
      `not measured: ${unmeasured.map((f) => `[${f.heartbeat}] #${f.n} ${f.error ?? "incomplete"}`).join("; ")}${short.length ? `; runs stopped early: ${short.map((r) => r.heartbeat).join(", ")}` : ""}`,
    );
    return 1;
  }
  return 0;
}

let code = 1;
try {
  code = await main();
} catch (error) {
  console.error(`faults bench failed: ${(error as Error).stack ?? String(error)}`);
}
process.exit(code);
