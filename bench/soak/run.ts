/**
 * Soak under faults, in three phases of one run, each with its own cluster (a real control plane
 * and two agents on simulated nodes, a sim deployment with replicas on both) and a sustained mix
 * of streaming and non-streaming chat completions, every request classified:
 *
 * - `single`: the control plane serves the public API itself (the in-process router) while an
 *   engine is killed, an agent is SIGKILLed and restarted, the control plane is restarted
 *   (SIGTERM) and SIGKILLed, and a slow replica joins — the baseline;
 * - `routers`: the control plane runs `--no-public-api`; two `llmgw router` processes behind
 *   HAProxy round robin (`/readyz` health check) serve the load while the control plane is
 *   SIGKILLed and restarted, then SIGKILLed and kept down (60 s; 8 s with --quick), and one
 *   router is SIGKILLed;
 * - `lifecycle` (issue 21): the same shape as `routers`, while planned changes run one after
 *   the other — scale down and up, a rolling update, a node drain, an agent leaving with
 *   `--stop-engines`, the undeploy of a second deployment of the model — none of which any
 *   client may notice.
 *
 * The report gives error budgets, recovery times and adoption per fault, per phase.
 *
 *   node --conditions=@llmgw/source --import tsx bench/soak/run.ts [--quick] [--duration S]
 *        [--concurrency N] [--seed N] [--phases single,routers,lifecycle] [--cp-down S]
 *        [--haproxy-mode http|tcp]
 */
import { randomBytes } from "node:crypto";
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { loadavg } from "node:os";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";
import { NodeState } from "@llmgw/proto";
import {
  AgentProc,
  ControlPlaneProc,
  deployment,
  ensureCliBuilt,
  freePort,
  stopAll,
  tempRoot,
  waitFor,
} from "../../apps/cli/test/cluster-harness.js";
import type { RunningProxy } from "../lib/proxies.js";
import { formatTable } from "../lib/table.js";
import { BAD_CLASSES, OUTCOME_CLASSES } from "./classify.js";
import {
  addSlowReplica,
  deployAndWait,
  killControlPlane,
  killEngine,
  killRouter,
  restartAgent,
  restartControlPlane,
  type SoakCluster,
  simDeployment,
} from "./faults.js";
import {
  agentLeave,
  drainNode,
  type LifecycleOptions,
  rollingUpdate,
  scaleMain,
  undeployExtra,
} from "./lifecycle.js";
import { startLoad } from "./load.js";
import {
  type FaultKind,
  type FaultRecord,
  type FaultSummary,
  type Goal,
  lifecycleGoals,
  notOkClasses,
  type RequestRecord,
  type SoakTotals,
  summarizeFaults,
  summarizeTotals,
} from "./report.js";
import { ROUTER_CHECK, RouterProc, startRouterBalancer } from "./routers.js";

type Phase = "single" | "routers" | "lifecycle";
const PHASES: readonly Phase[] = ["single", "routers", "lifecycle"];

const { values: args } = parseArgs({
  options: {
    quick: { type: "boolean", default: false },
    duration: { type: "string" },
    concurrency: { type: "string" },
    seed: { type: "string", default: "1" },
    phases: { type: "string" },
    "cp-down": { type: "string" },
    "haproxy-mode": { type: "string" },
  },
});
const quick = args.quick ?? false;
const phases = (args.phases ?? PHASES.join(",")).split(",").map((p) => p.trim());
for (const p of phases) {
  if (!PHASES.includes(p as Phase))
    throw new Error(`--phases: no such phase ${p} (expected ${PHASES.join(", ")})`);
}
const haproxyMode = args["haproxy-mode"] ?? "http";
if (haproxyMode !== "http" && haproxyMode !== "tcp")
  throw new Error(`--haproxy-mode ${haproxyMode}: expected http or tcp`);
const positive = (value: string | undefined, fallback: number, flag: string): number => {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isFinite(n) || n <= 0) throw new Error(`--${flag} ${value}: expected a number > 0`);
  return n;
};
const config = {
  /** Load per phase, s. */
  durationS: positive(args.duration, quick ? 34 : 240, "duration"),
  concurrency: Math.round(positive(args.concurrency, quick ? 4 : 16, "concurrency")),
  thinkMs: quick ? 50 : 0,
  maxTokens: (quick ? [4, 24] : [8, 64]) as [number, number],
  streamShare: 0.5,
  // The worst expected answer is a slow-replica stream of max tokens plus a router queue wait
  // (30 s default): far below this, so a hang shows up as a hang.
  timeoutMs: quick ? 45_000 : 60_000,
  slowTokenMs: quick ? 40 : 120,
  replicas: 3,
  seed: Number(args.seed),
  heartbeat: "500ms",
  /** Long enough that an agent restart is not a lost node; the 60 s outage is not counted. */
  nodeLostAfter: "15s",
  /** How long the `control-plane-down` fault keeps the control plane down, s. */
  controlPlaneDownS: positive(args["cp-down"], quick ? 8 : 60, "cp-down"),
  /**
   * How long a SIGKILLed router stays down: long enough for HAProxy to mark it down
   * (fall × inter), plus a second.
   */
  routerDownMs: ROUTER_CHECK.fall * ROUTER_CHECK.intervalMs + 1_000,
  haproxyMode,
  /**
   * The lifecycle phase's load, s: its six changes take ~25 s in all on an idle machine (the
   * rolling update, three make-before-break steps, the longest), so the quick run's 34 s
   * would leave them no quiet time between them.
   */
  lifecycleDurationS: positive(args.duration, quick ? 50 : 240, "duration"),
  /**
   * The goal for each planned change, command to done, s: a few times the slowest measured
   * (see the README), and far below the default drainTimeoutSeconds (300 s), so a drain that
   * only ended by its timeout cannot pass.
   */
  lifecycleBoundS: 60,
  /** How long the soak waits for one planned change before reporting it as never done, ms. */
  lifecycleWaitMs: 120_000,
};
/** Fault start times per phase, as fractions of the load's duration. */
const SCHEDULES: Readonly<Record<Phase, readonly { kind: FaultKind; at: number }[]>> = {
  single: [
    { kind: "engine-kill", at: 0.1 },
    { kind: "agent-restart", at: 0.26 },
    { kind: "control-plane-restart", at: 0.42 },
    { kind: "control-plane-kill", at: 0.58 },
    { kind: "slow-replica", at: 0.76 },
  ],
  // The outage (controlPlaneDownS) runs from 0.22: 60 s of 240 s, or 8 s of 34 s.
  routers: [
    { kind: "control-plane-kill", at: 0.08 },
    { kind: "control-plane-down", at: 0.22 },
    { kind: "router-kill", at: 0.7 },
  ],
  lifecycle: [
    { kind: "scale-down", at: 0.05 },
    { kind: "scale-up", at: 0.15 },
    { kind: "rolling-update", at: 0.25 },
    { kind: "node-drain", at: 0.45 },
    { kind: "agent-leave", at: 0.62 },
    { kind: "undeploy", at: 0.85 },
  ],
};
const MODEL = "soak-chat";
const DEPLOYMENT = "chat";
/** The lifecycle phase's second deployment of the model: 1 replica, undeployed last. */
const EXTRA_DEPLOYMENT = "chat-extra";

/** SIGKILLs every engine recorded under the agents' state dirs (process groups first). */
function killEngines(root: string): number[] {
  const pids: number[] = [];
  let dirs: string[] = [];
  try {
    dirs = readdirSync(root);
  } catch {
    return pids;
  }
  for (const agent of dirs) {
    const dir = path.join(root, agent, "pids");
    let files: string[] = [];
    try {
      files = readdirSync(dir).filter((f) => f.endsWith(".pid.json"));
    } catch {
      continue;
    }
    for (const file of files) {
      try {
        const record = JSON.parse(readFileSync(path.join(dir, file), "utf8")) as { pid?: number };
        if (typeof record.pid !== "number") continue;
        pids.push(record.pid);
        for (const target of [-record.pid, record.pid]) {
          try {
            process.kill(target, "SIGKILL");
          } catch {
            // already gone
          }
        }
      } catch {
        // unreadable pid file: nothing to kill
      }
    }
  }
  return pids;
}

/** True while `pid` exists and is not a zombie waiting for its (killed) agent's reaper. */
const alive = (pid: number) => {
  try {
    return !/^\d+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, "utf8"));
  } catch {
    return false;
  }
};

/** Kills what a phase started (engines first), removes its dir; says when an engine survived. */
async function cleanUp(root: string, balancer: RunningProxy | undefined): Promise<void> {
  await balancer?.stop();
  const engines = killEngines(root);
  await stopAll([root]);
  for (let i = 0; i < 20 && engines.some(alive); i++) await new Promise((r) => setTimeout(r, 100));
  const left = engines.filter(alive);
  if (left.length > 0) console.error(`engines still alive after cleanup: ${left.join(" ")}`);
}

/** Everything one phase measured. */
interface PhaseResult {
  readonly phase: Phase;
  readonly setupS: number;
  readonly loadS: number;
  readonly drainS: number;
  readonly faults: readonly FaultSummary[];
  readonly totals: SoakTotals;
  readonly goals: readonly Goal[];
  readonly slowReplica?: {
    readonly replicas: readonly string[];
    readonly requestsAfterReady: number;
    readonly answeredBySlow: number;
    readonly slowOkP50Ms: number | undefined;
  };
  readonly records: readonly RequestRecord[];
}

const BAD = (f: FaultSummary) => BAD_CLASSES.reduce((n, c) => n + f.byClass[c], 0);

/** The single-process phase's goals: as before routers ran apart. */
function singleGoals(perFault: readonly FaultSummary[], totals: SoakTotals): Goal[] {
  const engineFault = perFault.find((f) => f.kind === "engine-kill");
  const kill = perFault.find((f) => f.kind === "control-plane-kill");
  const restartBackoffS = 1; // supervisor's default initial restart delay
  return [
    {
      goal: "zero unanswered requests (no hang, reset, malformed or lost)",
      value: `${totals.unanswered} (hang ${totals.byClass.hang}, reset ${totals.byClass.reset - totals.immediateResetsInOutage}, malformed ${totals.byClass.malformed}, lost ${totals.sent - totals.classified}); ${totals.immediateResetsInOutage} immediate resets during the control plane's restarts not counted`,
      met: totals.unanswered === 0,
    },
    {
      goal: `steady success after an engine kill within the restart backoff (${restartBackoffS} s)`,
      value: `${engineFault?.steadyAfterS ?? "?"} s (replica ready again after ${engineFault?.readyAfterS ?? "never"} s)`,
      met: engineFault !== undefined && engineFault.steadyAfterS <= restartBackoffS,
    },
    {
      goal: "engines adopted, not relaunched, across agent and control-plane restarts",
      value: perFault
        .filter((f) => f.adopted !== null)
        .map((f) => `${f.kind}: ${f.adopted ? "adopted" : "NOT adopted"}`)
        .join(", "),
      met: perFault.every((f) => f.adopted !== false),
    },
    ...(kill
      ? [
          {
            goal: "(baseline, not a goal) control plane SIGKILL + restart with the router in-process",
            value: `${kill.notOk} of ${kill.requests} not ok (cp-down ${kill.byClass["cp-down"]}, 5xx ${kill.serverErrors}, BAD ${BAD(kill)}); steady after ${kill.steadyAfterS} s`,
            met: true,
          },
        ]
      : []),
  ];
}

/** The routers phase's goals (issue 17). */
function routerGoals(perFault: readonly FaultSummary[], totals: SoakTotals): Goal[] {
  const goals: Goal[] = [];
  for (const kind of ["control-plane-kill", "control-plane-down"] as const) {
    const f = perFault.find((x) => x.kind === kind);
    if (!f) continue;
    const what =
      kind === "control-plane-kill"
        ? "control plane SIGKILL + restart"
        : `control plane down ${config.controlPlaneDownS} s${quick ? " (quick: the full run holds it 60 s)" : ""}`;
    goals.push({
      goal: `${what}: 0 unanswered and 0 5xx through two routers`,
      value: `unanswered ${BAD(f)}, 5xx ${f.serverErrors} (not ok ${f.notOk} of ${f.requests}${notOkClasses(f)}); healed after ${f.readyAfterS ?? "never"} s`,
      met: BAD(f) === 0 && f.serverErrors === 0,
    });
  }
  const r = perFault.find((x) => x.kind === "router-kill");
  if (r) {
    goals.push({
      goal: "router SIGKILL: only requests in flight on it fail",
      value: `${r.notOkAfter} failed that started after the kill; ${r.notOkInFlight} in flight at the kill failed (of ${r.requests} in the window); router live again after ${r.readyAfterS ?? "never"} s`,
      met: r.notOkAfter === 0,
    });
  }
  const inFlight = r?.notOkInFlight ?? 0;
  goals.push({
    goal: "zero unanswered requests besides those in flight on the killed router",
    value: `${totals.unanswered - Math.min(inFlight, totals.unanswered)} (unanswered ${totals.unanswered}: hang ${totals.byClass.hang}, reset ${totals.byClass.reset}, malformed ${totals.byClass.malformed}, lost ${totals.sent - totals.classified}; in flight on the killed router ${inFlight})`,
    met: totals.unanswered - inFlight <= 0 && totals.sent === totals.classified,
  });
  goals.push({
    goal: "engines adopted, not relaunched, across control-plane kills",
    value: perFault
      .filter((f) => f.adopted !== null)
      .map((f) => `${f.kind}: ${f.adopted ? "adopted" : "NOT adopted"}`)
      .join(", "),
    met: perFault.every((f) => f.adopted !== false),
  });
  return goals;
}

async function runPhase(phase: Phase): Promise<PhaseResult> {
  const root = tempRoot(`llmgw-soak-${phase}-`);
  let balancer: RunningProxy | undefined;
  try {
    const setupStart = performance.now();
    // The lifecycle phase runs the routers shape too: it is what production runs.
    const apart = phase !== "single";
    const cp = new ControlPlaneProc(root, await freePort(), await freePort(), [
      "--heartbeat-interval",
      config.heartbeat,
      "--node-lost-after",
      config.nodeLostAfter,
      ...(apart ? ["--no-public-api"] : []),
    ]);
    await cp.start();
    const agents = [
      new AgentProc(root, "node-a", "4xh100-80g@ib-a", cp),
      new AgentProc(root, "node-b", "4xh100-80g@ib-a", cp),
    ];
    for (const agent of agents) agent.start();
    await waitFor("both agents to register", async () => {
      const res = await cp.admin().listNodes({}, cp.adminHeaders());
      return res.nodes.filter((n) => n.state === NodeState.READY).length === 2 ? true : undefined;
    });
    let t0 = performance.now();
    const routers = apart
      ? [
          new RouterProc(root, "router-a", await freePort(), cp),
          new RouterProc(root, "router-b", await freePort(), cp),
        ]
      : undefined;
    if (routers !== undefined) {
      // Each router the other's peer, one key file for both (docs/operations.md, "Peers").
      const keyFile = path.join(root, "peer-key");
      writeFileSync(keyFile, `${randomBytes(32).toString("hex")}\n`, { mode: 0o600 });
      for (const r of routers)
        r.peers = { urls: routers.filter((o) => o !== r).map((o) => o.url), keyFile };
    }
    const cluster: SoakCluster = {
      cp,
      agents,
      deployment: DEPLOYMENT,
      replicas: config.replicas,
      model: MODEL,
      now: () => performance.now() - t0,
      healTimeoutMs: quick ? 20_000 : 40_000,
      ...(routers ? { routers } : {}),
    };
    const ready = await deployAndWait(
      cluster,
      simDeployment(DEPLOYMENT, MODEL, config.replicas),
      60_000,
    );
    const spread = new Set(ready.replicas.map((r) => r.ranks[0]?.nodeId));
    if (phase === "lifecycle") {
      await deployAndWait(cluster, simDeployment(EXTRA_DEPLOYMENT, MODEL, 1), 60_000);
    }
    const key = await cp.admin().createApiKey({ name: "soak" }, cp.adminHeaders());
    let baseUrl = cp.publicUrl;
    if (routers) {
      await Promise.all(routers.map((r) => r.start()));
      await waitFor("both routers to stream live state", async () =>
        (await Promise.all(routers.map((r) => r.live()))).every(Boolean) ? true : undefined,
      );
      balancer = await startRouterBalancer(routers, config.haproxyMode as "http" | "tcp");
      baseUrl = balancer.url;
      // The key reached both routers (a grant in their state): one answered request each.
      await waitFor("the API key to be accepted by both routers", async () => {
        const codes = await Promise.all(
          routers.map((r) =>
            fetch(`${r.url}/v1/models`, {
              headers: { authorization: `Bearer ${key.secret}` },
            }).then((res) => res.status),
          ),
        );
        return codes.every((c) => c === 200) ? true : undefined;
      });
    }
    const setupS = (performance.now() - setupStart) / 1000;
    const durationS = phase === "lifecycle" ? config.lifecycleDurationS : config.durationS;
    console.error(
      `[${phase}] cluster up in ${setupS.toFixed(1)} s: ${config.replicas} replicas on ${spread.size} nodes${phase === "lifecycle" ? ` and ${EXTRA_DEPLOYMENT} (1 replica)` : ""}${routers ? `, ${routers.length} routers behind HAProxy (${config.haproxyMode} mode, round robin, ${ROUTER_CHECK.path} check)` : ", the control plane's in-process router"}; load for ${durationS} s × ${config.concurrency} loops`,
    );

    t0 = performance.now();
    const load = startLoad({
      baseUrl,
      apiKey: key.secret,
      model: MODEL,
      concurrency: config.concurrency,
      timeoutMs: config.timeoutMs,
      streamShare: config.streamShare,
      maxTokens: config.maxTokens,
      thinkMs: config.thinkMs,
      seed: config.seed,
      now: cluster.now,
    });
    const faults: FaultRecord[] = [];
    const durationMs = durationS * 1000;
    const lifecycle: LifecycleOptions = {
      waitMs: config.lifecycleWaitMs,
      extraDeployment: EXTRA_DEPLOYMENT,
    };
    const inject: Record<FaultKind, () => Promise<FaultRecord>> = {
      "engine-kill": () => killEngine(cluster),
      "agent-restart": () => restartAgent(cluster),
      "control-plane-restart": () => restartControlPlane(cluster),
      "control-plane-kill": () => killControlPlane(cluster, 0),
      "control-plane-down": () => killControlPlane(cluster, config.controlPlaneDownS * 1000),
      "router-kill": () => killRouter(cluster, 0, config.routerDownMs),
      "slow-replica": () => addSlowReplica(cluster, config.slowTokenMs),
      "scale-down": () => scaleMain(cluster, "scale-down", config.replicas - 1, lifecycle),
      "scale-up": () => scaleMain(cluster, "scale-up", config.replicas, lifecycle),
      "rolling-update": () => rollingUpdate(cluster, lifecycle),
      "node-drain": () => drainNode(cluster, lifecycle),
      "agent-leave": () => agentLeave(cluster, lifecycle),
      undeploy: () => undeployExtra(cluster, lifecycle),
    };
    for (const step of SCHEDULES[phase]) {
      const wait = step.at * durationMs - cluster.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      console.error(`[${phase}] +${(cluster.now() / 1000).toFixed(1)} s: ${step.kind}`);
      const record = await inject[step.kind]();
      faults.push(record);
      console.error(`  ${record.notes.join("; ")}`);
    }
    const rest = durationMs - cluster.now();
    if (rest > 0) await new Promise((r) => setTimeout(r, rest));
    const stopAt = cluster.now();
    await load.stop();
    const endMs = cluster.now();

    const records: readonly RequestRecord[] = load.records;
    const perFault = summarizeFaults(records, faults, endMs);
    const totals = summarizeTotals(
      records,
      load.sent(),
      faults.flatMap((f) => (f.outage ? [f.outage] : [])),
    );
    let slowReplica: PhaseResult["slowReplica"];
    const slowFault = faults.find((f) => f.kind === "slow-replica");
    if (slowFault) {
      // Which requests the slow replica answered, once it was ready.
      const slow = await deployment(cp, `${DEPLOYMENT}-slow`).catch(() => undefined);
      const slowIds = new Set(slow?.replicas.map((r) => r.replicaId) ?? []);
      const afterSlow = records.filter(
        (r) => slowFault.readyAtMs !== undefined && r.startMs >= slowFault.readyAtMs,
      );
      const onSlow = afterSlow.filter((r) => r.replica !== undefined && slowIds.has(r.replica));
      const ok = onSlow
        .filter((r) => r.class === "ok")
        .map((r) => r.endMs - r.startMs)
        .sort((a, b) => a - b);
      slowReplica = {
        replicas: [...slowIds],
        requestsAfterReady: afterSlow.length,
        answeredBySlow: onSlow.length,
        slowOkP50Ms: ok.length ? Math.round(ok[Math.floor(ok.length / 2)] ?? 0) : undefined,
      };
    }
    return {
      phase,
      setupS: Math.round(setupS * 10) / 10,
      loadS: Math.round(endMs / 100) / 10,
      drainS: Math.round((endMs - stopAt) / 100) / 10,
      faults: perFault,
      totals,
      goals:
        phase === "single"
          ? singleGoals(perFault, totals)
          : phase === "routers"
            ? routerGoals(perFault, totals)
            : lifecycleGoals(perFault, totals, config.lifecycleBoundS),
      ...(slowReplica ? { slowReplica } : {}),
      records,
    };
  } finally {
    await cleanUp(root, balancer);
  }
}

/** The tables of one phase. */
/** The lifecycle phase's table: one row per planned change. */
function plannedTable(faults: readonly FaultSummary[]): string {
  return formatTable(
    [
      "event",
      "at s",
      "took s",
      "healed +s",
      "requests",
      "ok",
      "by leaving",
      "failures",
      "truncated",
      "5xx",
      "min capacity",
      "ok p50 ms",
      "ok p99 ms",
    ],
    faults.map((f) => [
      f.kind,
      f.atS,
      f.planned?.tookS ?? "never",
      f.readyAfterS ?? "never",
      f.requests,
      f.byClass.ok,
      f.planned?.servedByLeaving ?? "-",
      f.notOk,
      f.truncatedStreams,
      f.serverErrors,
      `${f.planned?.minCapacity ?? "-"}${f.planned?.capacityFloor === undefined ? "" : ` (≥ ${f.planned.capacityFloor})`}`,
      f.okP50Ms ?? "-",
      f.okP99Ms ?? "-",
    ]),
  );
}

function printPhase(r: PhaseResult): void {
  const faultTable = formatTable(
    [
      "fault",
      "at s",
      "requests",
      "ok",
      "error",
      "cp-down",
      "BAD",
      "not ok",
      "in flight / after",
      "5xx",
      "1st ok +s",
      "steady +s",
      "ready +s",
      "adopted",
      "ok p50 ms",
      "ok p99 ms",
    ],
    r.faults.map((f) => [
      f.kind,
      f.atS,
      f.requests,
      f.byClass.ok,
      f.byClass.error,
      f.byClass["cp-down"],
      BAD(f),
      f.notOk,
      `${f.notOkInFlight} / ${f.notOkAfter}`,
      f.serverErrors,
      f.firstOkAfterS ?? "-",
      f.steadyAfterS,
      f.readyAfterS ?? "never",
      f.adopted === null ? "n/a" : f.adopted ? "yes" : "NO",
      f.okP50Ms ?? "-",
      f.okP99Ms ?? "-",
    ]),
  );
  const t = r.totals;
  const totalsTable = formatTable(
    [
      "sent",
      "classified",
      ...OUTCOME_CLASSES,
      "unanswered",
      "ok p50 ms",
      "ok p99 ms",
      "stream p50",
      "json p50",
    ],
    [
      [
        t.sent,
        t.classified,
        ...OUTCOME_CLASSES.map((c) => t.byClass[c]),
        t.unanswered,
        t.okP50Ms ?? "-",
        t.okP99Ms ?? "-",
        t.streamOkP50Ms ?? "-",
        t.jsonOkP50Ms ?? "-",
      ],
    ],
  );
  const where =
    r.phase === "single"
      ? "the control plane's in-process router"
      : `two llmgw routers behind HAProxy (${config.haproxyMode} mode, round robin, ${ROUTER_CHECK.path} check), control plane --no-public-api`;
  console.log(
    `\n== phase ${r.phase}: ${where}; ${config.concurrency} loops × ${r.loadS} s (setup ${r.setupS} s)\n`,
  );
  const notes = r.faults.map((f) => `  ${f.kind}: ${f.notes.join("; ")}`).join("\n");
  const table = r.phase === "lifecycle" ? plannedTable(r.faults) : faultTable;
  console.log(`${table}\n\n${notes}\n\n${totalsTable}\n`);
  if (t.details.length > 0) {
    console.log(
      `${formatTable(
        ["class", "detail", "count"],
        t.details.slice(0, 12).map((d) => [d.class, d.detail, d.count]),
      )}\n`,
    );
  }
  if (r.slowReplica) {
    console.log(
      `slow replica: ${r.slowReplica.answeredBySlow} of ${r.slowReplica.requestsAfterReady} requests after it was ready went to it (ok p50 ${r.slowReplica.slowOkP50Ms ?? "-"} ms)\n`,
    );
  }
  console.log(
    `${formatTable(
      ["goal", "value", "met"],
      r.goals.map((g) => [g.goal, g.value, g.met ? "yes" : "NO"]),
    )}`,
  );
}

async function main(): Promise<number> {
  ensureCliBuilt();
  const results: PhaseResult[] = [];
  for (const phase of phases as Phase[]) results.push(await runPhase(phase));
  const at = new Date().toISOString();
  const result = {
    bench: "soak",
    mode: quick ? "quick" : "full",
    at,
    loadavg: loadavg().map((l) => Math.round(l * 100) / 100),
    config,
    phases: results.map(({ records: _, ...r }) => r),
    goals: results.flatMap((r) => r.goals.map((g) => ({ phase: r.phase, ...g }))),
  };
  console.log(
    `\nsoak (${result.mode}): phases ${phases.join(", ")}; load average ${result.loadavg.join(" ")}`,
  );
  for (const r of results) printPhase(r);
  console.log("");
  const resultsDir = path.join(import.meta.dirname, "..", "results");
  mkdirSync(resultsDir, { recursive: true });
  writeFileSync(
    path.join(resultsDir, `soak-${at.replace(/[:.]/g, "-")}.json`),
    `${JSON.stringify(
      {
        ...result,
        records: quick ? undefined : Object.fromEntries(results.map((r) => [r.phase, r.records])),
      },
      null,
      2,
    )}\n`,
  );
  console.log(JSON.stringify(result, null, 2));
  // Exit status: only what cannot flake — every request classified, none hung.
  return results.every((r) => r.totals.sent === r.totals.classified && r.totals.byClass.hang === 0)
    ? 0
    : 1;
}

let code = 1;
try {
  code = await main();
} catch (error) {
  console.error(`soak failed: ${(error as Error).stack ?? String(error)}`);
}
process.exit(code);
