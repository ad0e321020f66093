/**
 * Soak under faults: a real control plane (serving the router) and two agents on simulated
 * nodes, a sim deployment with replicas on both, and a sustained mix of streaming and
 * non-streaming chat completions while an engine is killed, an agent is SIGKILLed and
 * restarted, the control plane restarts and a slow replica joins. Every request is
 * classified; the report gives error budgets, recovery times and adoption per fault.
 *
 *   node --conditions=@llmgw/source --import tsx bench/soak/run.ts [--quick] [--duration S]
 *        [--concurrency N] [--seed N]
 */
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
import { formatTable } from "../lib/table.js";
import { BAD_CLASSES, OUTCOME_CLASSES } from "./classify.js";
import {
  addSlowReplica,
  deployAndWait,
  killEngine,
  restartAgent,
  restartControlPlane,
  type SoakCluster,
  simDeployment,
} from "./faults.js";
import { startLoad } from "./load.js";
import {
  type FaultKind,
  type FaultRecord,
  type RequestRecord,
  summarizeFaults,
  summarizeTotals,
} from "./report.js";

const { values: args } = parseArgs({
  options: {
    quick: { type: "boolean", default: false },
    duration: { type: "string" },
    concurrency: { type: "string" },
    seed: { type: "string", default: "1" },
  },
});
const quick = args.quick ?? false;
const config = {
  durationS: Number(args.duration ?? (quick ? 34 : 240)),
  concurrency: Number(args.concurrency ?? (quick ? 4 : 16)),
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
  nodeLostAfter: "15s",
};
/** Fault start times, as fractions of the load's duration. */
const SCHEDULE: readonly { kind: FaultKind; at: number }[] = [
  { kind: "engine-kill", at: 0.12 },
  { kind: "agent-restart", at: 0.32 },
  { kind: "control-plane-restart", at: 0.55 },
  { kind: "slow-replica", at: 0.75 },
];
const MODEL = "soak-chat";
const DEPLOYMENT = "chat";

const root = tempRoot("llmgw-soak-");

/** SIGKILLs every engine recorded under the agents' state dirs (process groups first). */
function killEngines(): number[] {
  const pids: number[] = [];
  for (const agent of readdirSync(root)) {
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

async function main(): Promise<number> {
  ensureCliBuilt();
  const setupStart = performance.now();
  const cp = new ControlPlaneProc(root, await freePort(), await freePort(), [
    "--heartbeat-interval",
    config.heartbeat,
    "--node-lost-after",
    config.nodeLostAfter,
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
  const cluster: SoakCluster = {
    cp,
    agents,
    deployment: DEPLOYMENT,
    replicas: config.replicas,
    model: MODEL,
    now: () => performance.now() - t0,
    healTimeoutMs: quick ? 20_000 : 40_000,
  };
  const ready = await deployAndWait(
    cluster,
    simDeployment(DEPLOYMENT, MODEL, config.replicas),
    60_000,
  );
  const spread = new Set(ready.replicas.map((r) => r.ranks[0]?.nodeId));
  const key = await cp.admin().createApiKey({ name: "soak" }, cp.adminHeaders());
  const setupS = (performance.now() - setupStart) / 1000;
  console.error(
    `cluster up in ${setupS.toFixed(1)} s: ${config.replicas} replicas on ${spread.size} nodes; load for ${config.durationS} s × ${config.concurrency} loops`,
  );

  t0 = performance.now();
  const load = startLoad({
    baseUrl: cp.publicUrl,
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
  const durationMs = config.durationS * 1000;
  for (const step of SCHEDULE) {
    const wait = step.at * durationMs - cluster.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    console.error(`+${(cluster.now() / 1000).toFixed(1)} s: ${step.kind}`);
    const record =
      step.kind === "engine-kill"
        ? await killEngine(cluster)
        : step.kind === "agent-restart"
          ? await restartAgent(cluster)
          : step.kind === "control-plane-restart"
            ? await restartControlPlane(cluster)
            : await addSlowReplica(cluster, config.slowTokenMs);
    faults.push(record);
    console.error(`  ${record.notes.join("; ")}`);
  }
  const rest = durationMs - cluster.now();
  if (rest > 0) await new Promise((r) => setTimeout(r, rest));
  const stopAt = cluster.now();
  await load.stop();
  const endMs = cluster.now();

  // Which requests the slow replica answered, once it was ready.
  const slow = await deployment(cp, `${DEPLOYMENT}-slow`).catch(() => undefined);
  const slowIds = new Set(slow?.replicas.map((r) => r.replicaId) ?? []);
  const slowFault = faults.find((f) => f.kind === "slow-replica");
  const afterSlow = load.records.filter(
    (r) => slowFault?.readyAtMs !== undefined && r.startMs >= slowFault.readyAtMs,
  );
  const onSlow = afterSlow.filter((r) => r.replica !== undefined && slowIds.has(r.replica));

  const records: readonly RequestRecord[] = load.records;
  const perFault = summarizeFaults(records, faults, endMs);
  const totals = summarizeTotals(
    records,
    load.sent(),
    faults.flatMap((f) => (f.outage ? [f.outage] : [])),
  );
  const engineFault = perFault.find((f) => f.kind === "engine-kill");
  const restartBackoffS = 1; // supervisor's default initial restart delay
  const goals = [
    {
      goal: "zero unanswered requests (no hang, reset, malformed or lost)",
      value: `${totals.unanswered} (hang ${totals.byClass.hang}, reset ${totals.byClass.reset - totals.immediateResetsInOutage}, malformed ${totals.byClass.malformed}, lost ${totals.sent - totals.classified}); ${totals.immediateResetsInOutage} immediate resets during the control plane's restart not counted`,
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
  ];

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
      "1st ok +s",
      "steady +s",
      "ready +s",
      "adopted",
      "ok p50 ms",
      "ok p99 ms",
    ],
    perFault.map((f) => [
      f.kind,
      f.atS,
      f.requests,
      f.byClass.ok,
      f.byClass.error,
      f.byClass["cp-down"],
      BAD_CLASSES.reduce((n, c) => n + f.byClass[c], 0),
      f.notOk,
      f.firstOkAfterS ?? "-",
      f.steadyAfterS,
      f.readyAfterS ?? "never",
      f.adopted === null ? "n/a" : f.adopted ? "yes" : "NO",
      f.okP50Ms ?? "-",
      f.okP99Ms ?? "-",
    ]),
  );
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
        totals.sent,
        totals.classified,
        ...OUTCOME_CLASSES.map((c) => totals.byClass[c]),
        totals.unanswered,
        totals.okP50Ms ?? "-",
        totals.okP99Ms ?? "-",
        totals.streamOkP50Ms ?? "-",
        totals.jsonOkP50Ms ?? "-",
      ],
    ],
  );
  const detailsTable = formatTable(
    ["class", "detail", "count"],
    totals.details.slice(0, 12).map((d) => [d.class, d.detail, d.count]),
  );
  const goalsTable = formatTable(
    ["goal", "value", "met"],
    goals.map((g) => [g.goal, g.value, g.met ? "yes" : "NO"]),
  );
  const result = {
    bench: "soak",
    mode: quick ? "quick" : "full",
    at: new Date().toISOString(),
    loadavg: loadavg().map((l) => Math.round(l * 100) / 100),
    config,
    setupS: Math.round(setupS * 10) / 10,
    loadS: Math.round(endMs / 100) / 10,
    drainS: Math.round((endMs - stopAt) / 100) / 10,
    faults: perFault,
    totals,
    slowReplica: {
      replicas: [...slowIds],
      requestsAfterReady: afterSlow.length,
      answeredBySlow: onSlow.length,
      slowOkP50Ms: (() => {
        const ok = onSlow
          .filter((r) => r.class === "ok")
          .map((r) => r.endMs - r.startMs)
          .sort((a, b) => a - b);
        return ok.length ? Math.round(ok[Math.floor(ok.length / 2)] ?? 0) : undefined;
      })(),
    },
    goals,
  };
  console.log(
    `\nsoak (${result.mode}): ${config.concurrency} loops × ${result.loadS} s, load average ${result.loadavg.join(" ")}\n`,
  );
  const notes = perFault.map((f) => `  ${f.kind}: ${f.notes.join("; ")}`).join("\n");
  console.log(`${faultTable}\n\n${notes}\n\n${totalsTable}\n`);
  if (totals.details.length > 0) console.log(`${detailsTable}\n`);
  console.log(
    `slow replica: ${onSlow.length} of ${afterSlow.length} requests after it was ready went to it (ok p50 ${result.slowReplica.slowOkP50Ms ?? "-"} ms)\n`,
  );
  console.log(`${goalsTable}\n`);
  const resultsDir = path.join(import.meta.dirname, "..", "results");
  mkdirSync(resultsDir, { recursive: true });
  writeFileSync(
    path.join(resultsDir, `soak-${result.at.replace(/[:.]/g, "-")}.json`),
    `${JSON.stringify({ ...result, records: quick ? undefined : records }, null, 2)}\n`,
  );
  console.log(JSON.stringify(result, null, 2));
  // Exit status: only what cannot flake — every request classified, none hung.
  return totals.sent === totals.classified && totals.byClass.hang === 0 ? 0 : 1;
}

let code = 1;
try {
  code = await main();
} catch (error) {
  console.error(`soak failed: ${(error as Error).stack ?? String(error)}`);
} finally {
  const engines = killEngines();
  await stopAll([root]);
  for (let i = 0; i < 20 && engines.some(alive); i++) await new Promise((r) => setTimeout(r, 100));
  const left = engines.filter(alive);
  if (left.length > 0) console.error(`engines still alive after cleanup: ${left.join(" ")}`);
}
process.exit(code);
