/**
 * Tenants and priorities (issue 23): two tenants share a small fleet of simulated engines
 * behind one router; `critical` sends at a steady Poisson rate well under the fleet's
 * capacity, `batch` bursts at 10× that capacity for a window. In one run, rounds of three
 * scenarios: critical alone (its baseline), critical + burst with priorities, the same burst
 * with priorities off (both tenants `standard`, same weight). Goals: critical's TTFT p99 under
 * the burst within 10% of its baseline, and the fleet's throughput no lower than without
 * priorities. See bench/README.md.
 */
import { parseArgs } from "node:util";
import {
  type BenchChild,
  benchChildrenRunAs,
  loadAverage,
  shipBenchChildren,
  startBenchChild,
} from "../lib/children.js";
import { median } from "../lib/load.js";
import type { RouterChildAuth, RouterChildConfig } from "../lib/processes.js";
import { printReport } from "../lib/report.js";
import { type SimFleet, startSimFleet } from "../lib/sim-fleet.js";
import { formatTable, quantile } from "../lib/table.js";
import { runTenants, type TenantSample } from "./client.js";

const { values: flags } = parseArgs({
  options: {
    quick: { type: "boolean", default: false },
    rounds: { type: "string" },
    replicas: { type: "string" },
    /** In-flight requests per replica the router keeps (its capacity). */
    capacity: { type: "string" },
    /**
     * The engines' max running sequences (default: 2 × `--capacity`): an engine's batch limit
     * sits above the router's target, as vLLM's `--max-num-seqs` (256) sits above llmgw's
     * default `maxConcurrencyPerReplica` (64); critical requests use the difference.
     */
    "engine-seqs": { type: "string" },
    "time-scale": { type: "string" },
    /** Seconds (wall clock) of each burst window. */
    window: { type: "string" },
    /** critical's rate as a fraction of the fleet's capacity. */
    "critical-load": { type: "string" },
    /** batch's rate during the burst as a multiple of the fleet's capacity. */
    burst: { type: "string" },
    /** Mean output tokens; each request's is uniform in [mean ÷ 4, mean × 7 ÷ 4]. */
    "output-tokens": { type: "string" },
    "prompt-chars": { type: "string" },
    /** The router's admission queue length per deployment. */
    queue: { type: "string" },
    /** `llmgw router --critical-prefill-reserve` (default: the router's). */
    reserve: { type: "string" },
    /** Run the router and engines from source under tsx, not bundled as shipped. */
    source: { type: "boolean", default: false },
  },
});
const quick = flags.quick === true;
const positive = (name: string, text: string | undefined, fallback: number): number => {
  const value = text === undefined ? fallback : Number(text);
  if (!Number.isFinite(value) || value <= 0)
    throw new Error(`--${name} ${String(text)}: expected a positive number`);
  return value;
};
const rounds = Math.round(positive("rounds", flags.rounds, quick ? 1 : 3));
const replicas = Math.round(positive("replicas", flags.replicas, quick ? 2 : 4));
const capacity = Math.round(positive("capacity", flags.capacity, 8));
const engineSeqs = Math.round(positive("engine-seqs", flags["engine-seqs"], 2 * capacity));
/** Engine time scale: simulated ms = wall ms × this (below 1: slower than real time). */
const timeScale = positive("time-scale", flags["time-scale"], 0.3);
const windowMs = positive("window", flags.window, quick ? 5 : 40) * 1000;
const criticalLoad = positive("critical-load", flags["critical-load"], 0.35);
const burst = positive("burst", flags.burst, 10);
const outputTokens = Math.round(positive("output-tokens", flags["output-tokens"], 32));
/**
 * Each request's output length is drawn uniformly around the mean (the sim's natural output,
 * seeded): with one fixed length, requests admitted together finish together, and a fleet
 * refilled by a burst runs in synchronized generations — a convoy in which a queued request
 * waits half a service time for the next wave, which real traffic does not do.
 */
const minOutputTokens = Math.max(1, Math.round(outputTokens / 4));
const maxOutputTokens = Math.round((outputTokens * 7) / 4);
const promptChars = Math.round(positive("prompt-chars", flags["prompt-chars"], 800));
/** The router's default queue length (256): the burst is run against the router as shipped. */
const queueLength = Math.round(positive("queue", flags.queue, 256));
const reserve = flags.reserve === undefined ? undefined : Number(flags.reserve);
if (reserve !== undefined && !(Number.isInteger(reserve) && reserve >= 0))
  throw new Error(`--reserve ${String(flags.reserve)}: expected a whole number`);
/** critical alone before the burst starts (warms a freshly restarted router), wall ms. */
const leadMs = quick ? 500 : 1500;
/**
 * Fleet throughput is counted over the last three quarters of the window: the first quarter
 * fills the slots and the queue.
 */
const throughputFromMs = leadMs + windowMs / 4;

/** The sim's default timing (an 8B model on one H100), what the capacity estimate uses. */
const prefillTokensPerSecond = 10_000;
const decodeStepMs = 12;
const decodeStepMsPerSeq = 0.14;
/**
 * The fleet's capacity, requests per simulated second, from the sim's timing model: a replica
 * full at `capacity` sequences finishes one request per service time ÷ capacity; a service
 * time is `outputTokens` decode steps of a full batch plus, on average, one prefill of every
 * sequence in the batch (a prefill chunk stalls the whole step). The chat template adds a few
 * tokens to the user message. Measured throughput under the burst is printed beside it.
 */
const promptTokens = Math.ceil(promptChars / 4) + 8;
const serviceMs =
  outputTokens * (decodeStepMs + decodeStepMsPerSeq * (capacity - 1)) +
  capacity * ((promptTokens / prefillTokensPerSecond) * 1000);
const fleetCapacity = (replicas * capacity) / (serviceMs / 1000);
const criticalRate = criticalLoad * fleetCapacity;
const batchRate = burst * fleetCapacity;

const model = "m";
const keys = {
  critical: { secret: "sk-bench-critical", id: "k-critical", name: "critical" },
  batch: { secret: "sk-bench-batch", id: "k-batch", name: "batch" },
} as const;

/** The router's keys and tenants: with priorities, `critical` and `batch` classes. */
const authFor = (priorities: boolean): RouterChildAuth => ({
  keys: [
    { ...keys.critical, tenant: "critical" },
    { ...keys.batch, tenant: "batch" },
  ],
  tenants: [
    { name: "critical", weight: 1, ...(priorities ? { priority: "critical" as const } : {}) },
    { name: "batch", weight: 1, ...(priorities ? { priority: "batch" as const } : {}) },
  ],
});

interface Scenario {
  readonly name: string;
  readonly burst: boolean;
  readonly priorities: boolean;
}
const scenarios: readonly Scenario[] = [
  { name: "critical alone", burst: false, priorities: true },
  { name: "burst, priorities", burst: true, priorities: true },
  { name: "burst, no priorities", burst: true, priorities: false },
];

/** One scenario in one round, every latency in simulated ms, every rate per simulated second. */
interface Measurement {
  readonly round: number;
  readonly scenario: string;
  readonly loadavg: string;
  readonly critical: TenantFigures;
  readonly batch: TenantFigures;
  /** Requests (both tenants) answered in full per simulated second, over the counted window. */
  readonly fleetReqPerSec: number;
  /** Completion tokens of those answers per simulated second. */
  readonly fleetTokensPerSec: number;
}

interface TenantFigures {
  /** Requests sent (critical: those sent during the burst window). */
  readonly sent: number;
  readonly ok: number;
  /** 429s by `x-llmgw-limit` (`queue_full`, `queue_timeout`, …; `?` without the header). */
  readonly refused: Readonly<Record<string, number>>;
  /** Ended otherwise: errors, non-429 statuses, streams cut short. */
  readonly failed: number;
  /** Given up at the end of the window while queued or running (batch only). */
  readonly abandoned: number;
  readonly ttftP50Ms?: number;
  readonly ttftP90Ms?: number;
  readonly ttftP99Ms?: number;
  /** The first few errors, for the reader. */
  readonly errors: readonly string[];
}

const figures = (samples: readonly TenantSample[]): TenantFigures => {
  const refused: Record<string, number> = {};
  for (const s of samples) {
    if (s.status === 429) refused[s.limit ?? "?"] = (refused[s.limit ?? "?"] ?? 0) + 1;
  }
  const ttft = samples.flatMap((s) =>
    s.ok && s.ttftMs !== undefined ? [s.ttftMs * timeScale] : [],
  );
  const failures = samples.filter((s) => !s.ok && !s.abandoned && s.status !== 429);
  const q = (p: number) => quantile(ttft, p);
  const p50 = q(0.5);
  const p90 = q(0.9);
  const p99 = q(0.99);
  return {
    sent: samples.length,
    ok: samples.filter((s) => s.ok).length,
    refused,
    failed: failures.length,
    abandoned: samples.filter((s) => s.abandoned).length,
    ...(p50 === undefined ? {} : { ttftP50Ms: p50 }),
    ...(p90 === undefined ? {} : { ttftP90Ms: p90 }),
    ...(p99 === undefined ? {} : { ttftP99Ms: p99 }),
    errors: [...new Set(failures.map((s) => s.error ?? `HTTP ${s.status}`))].slice(0, 3),
  };
};

let fleet: SimFleet | undefined;
let router: BenchChild | undefined;
const cleanUp = async (): Promise<void> => {
  await router?.stop();
  await fleet?.stop();
};
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => void cleanUp().then(() => process.exit(130)));
}

const t0 = Date.now();
const loadAtStart = loadAverage();
const measurements: Measurement[] = [];
const routerConfig = (s: Scenario, upstreams: readonly string[]): RouterChildConfig => ({
  model,
  policy: "llmgw",
  upstreams,
  capacity,
  auth: authFor(s.priorities),
  maxQueueLength: queueLength,
  ...(reserve === undefined ? {} : { criticalPrefillReserve: reserve }),
});
try {
  if (flags.source !== true) await shipBenchChildren();
  fleet = await startSimFleet({
    replicas,
    perProcess: replicas,
    options: (i) => ({
      model,
      seed: i,
      warmupSeconds: 0,
      timeScale,
      minOutputTokens,
      maxOutputTokens,
      timing: { maxRunningSeqs: engineSeqs, kvCacheTokens: 400_000 },
    }),
  });
  router = await startBenchChild("router", routerConfig(scenarios[0] as Scenario, fleet.urls));
  console.error(
    `fleet: ${replicas} engines × ${capacity} in flight; capacity ≈ ${fleetCapacity.toFixed(1)} req/s simulated; critical ${criticalRate.toFixed(1)} req/s, batch burst ${batchRate.toFixed(1)} req/s (wall: × ${timeScale})`,
  );
  for (let round = 1; round <= rounds; round++) {
    // Rotate the order each round so no scenario always runs first on a cold box.
    const order = scenarios.map((_, i) => scenarios[(i + round - 1) % scenarios.length]!);
    for (const s of order) {
      await fleet.restart(); // fresh engines: empty batches, caches and counters
      await router.request("restart", routerConfig(s, fleet.urls));
      const endMs = leadMs + windowMs;
      const [critical = [], batch = []] = await runTenants([
        {
          url: router.url,
          model,
          secret: keys.critical.secret,
          ratePerSecond: criticalRate * timeScale,
          startMs: 0,
          endMs,
          maxTokens: maxOutputTokens,
          promptChars,
          seed: round * 1000 + 1,
        },
        ...(s.burst
          ? [
              {
                url: router.url,
                model,
                secret: keys.batch.secret,
                ratePerSecond: batchRate * timeScale,
                startMs: leadMs,
                endMs,
                abandonAtMs: endMs,
                maxTokens: maxOutputTokens,
                promptChars,
                seed: round * 1000 + 2,
              },
            ]
          : []),
      ]);
      const counted = [...critical, ...batch].filter(
        (x) => x.ok && x.endMs >= throughputFromMs && x.endMs <= endMs,
      );
      const countedSimSeconds = ((endMs - throughputFromMs) / 1000) * timeScale;
      const m: Measurement = {
        round,
        scenario: s.name,
        loadavg: loadAverage(),
        critical: figures(critical.filter((x) => x.sentMs >= leadMs)),
        batch: figures(batch),
        fleetReqPerSec: counted.length / countedSimSeconds,
        fleetTokensPerSec:
          counted.reduce((n, x) => n + (x.completionTokens ?? 0), 0) / countedSimSeconds,
      };
      measurements.push(m);
      console.error(
        `round ${round} ${s.name}: critical ${m.critical.ok}/${m.critical.sent} TTFT p50/p99 ${m.critical.ttftP50Ms?.toFixed(0)}/${m.critical.ttftP99Ms?.toFixed(0)} ms; batch ${m.batch.ok}/${m.batch.sent} ${JSON.stringify(m.batch.refused)}; fleet ${m.fleetReqPerSec.toFixed(1)} req/s (load ${m.loadavg})`,
      );
    }
  }
} finally {
  await cleanUp();
}

/** Medians over rounds per scenario. */
interface Row {
  readonly scenario: string;
  readonly rounds: number;
  readonly criticalSent: number;
  readonly criticalOk: number;
  readonly criticalRefused: number;
  readonly criticalFailed: number;
  readonly ttftP50Ms: number;
  readonly ttftP90Ms: number;
  readonly ttftP99Ms: number;
  readonly batchSent: number;
  readonly batchOk: number;
  /** Σ over rounds, by `x-llmgw-limit`. */
  readonly batchRefused: Readonly<Record<string, number>>;
  readonly batchAbandoned: number;
  readonly batchFailed: number;
  readonly fleetReqPerSec: number;
  readonly fleetTokensPerSec: number;
}
const sum = (xs: readonly number[]): number => xs.reduce((a, b) => a + b, 0);
const rows: Row[] = scenarios.flatMap((s) => {
  const mine = measurements.filter((m) => m.scenario === s.name);
  if (mine.length === 0) return [];
  const batchRefused: Record<string, number> = {};
  for (const m of mine)
    for (const [k, v] of Object.entries(m.batch.refused))
      batchRefused[k] = (batchRefused[k] ?? 0) + v;
  const med = (f: (m: Measurement) => number | undefined): number =>
    median(mine.map((m) => f(m) ?? Number.NaN));
  return [
    {
      scenario: s.name,
      rounds: mine.length,
      criticalSent: sum(mine.map((m) => m.critical.sent)),
      criticalOk: sum(mine.map((m) => m.critical.ok)),
      criticalRefused: sum(mine.map((m) => sum(Object.values(m.critical.refused)))),
      criticalFailed: sum(mine.map((m) => m.critical.failed)),
      ttftP50Ms: med((m) => m.critical.ttftP50Ms),
      ttftP90Ms: med((m) => m.critical.ttftP90Ms),
      ttftP99Ms: med((m) => m.critical.ttftP99Ms),
      batchSent: sum(mine.map((m) => m.batch.sent)),
      batchOk: sum(mine.map((m) => m.batch.ok)),
      batchRefused,
      batchAbandoned: sum(mine.map((m) => m.batch.abandoned)),
      batchFailed: sum(mine.map((m) => m.batch.failed)),
      fleetReqPerSec: med((m) => m.fleetReqPerSec),
      fleetTokensPerSec: med((m) => m.fleetTokensPerSec),
    },
  ];
});

const f = (n: number | undefined, d = 0): string =>
  n === undefined || Number.isNaN(n) ? "-" : n.toFixed(d);
const table = formatTable(
  [
    "scenario",
    "critical ok/sent",
    "429",
    "TTFT p50 / p90 / p99 ms",
    "batch ok/sent",
    "batch 429 by x-llmgw-limit",
    "abandoned",
    "failed",
    "fleet req/s",
    "fleet tok/s",
  ],
  rows.map((r) => [
    r.scenario,
    `${r.criticalOk}/${r.criticalSent}`,
    r.criticalRefused,
    `${f(r.ttftP50Ms)} / ${f(r.ttftP90Ms)} / ${f(r.ttftP99Ms)}`,
    r.batchSent === 0 ? "-" : `${r.batchOk}/${r.batchSent}`,
    Object.entries(r.batchRefused)
      .map(([k, v]) => `${k} ${v}`)
      .join(", ") || "-",
    r.batchAbandoned,
    r.criticalFailed + r.batchFailed,
    f(r.fleetReqPerSec, 1),
    f(r.fleetTokensPerSec, 0),
  ]),
);

/**
 * Per-round ratios of `a` over `b` (both measured minutes apart at most, on the same fleet),
 * with their range: a goal is judged on the ratio of the medians, the range says how much one
 * round can move it.
 */
const ratios = (a: string, b: string, f: (m: Measurement) => number | undefined): number[] =>
  measurements
    .filter((m) => m.scenario === a)
    .flatMap((m) => {
      const other = measurements.find((x) => x.scenario === b && x.round === m.round);
      const x = f(m);
      const y = other === undefined ? undefined : f(other);
      return x === undefined || y === undefined || y <= 0 ? [] : [x / y];
    });
const range = (rs: readonly number[]): string =>
  rs.length < 2 ? "" : `, rounds ${f(Math.min(...rs), 3)}…${f(Math.max(...rs), 3)}`;
const row = (name: string) => rows.find((r) => r.scenario === name);
const goals: { goal: string; measured: string; met: boolean }[] = [];
const alone = row("critical alone");
const withPriorities = row("burst, priorities");
const without = row("burst, no priorities");
if (alone !== undefined && withPriorities !== undefined) {
  const ratio = withPriorities.ttftP99Ms / alone.ttftP99Ms;
  goals.push({
    goal: "critical TTFT p99 under a 10× batch burst ≤ 1.1× its no-burst baseline (priorities on)",
    measured: `${f(withPriorities.ttftP99Ms)} vs ${f(alone.ttftP99Ms)} ms: ${f(ratio, 3)}×${range(ratios("burst, priorities", "critical alone", (m) => m.critical.ttftP99Ms))}`,
    met: ratio <= 1.1,
  });
  goals.push({
    goal: "critical: every request of the burst window answered (priorities on)",
    measured: `${withPriorities.criticalOk}/${withPriorities.criticalSent} (${withPriorities.criticalRefused} refused, ${withPriorities.criticalFailed} failed)`,
    met: withPriorities.criticalOk === withPriorities.criticalSent,
  });
}
/**
 * Throughput is the fleet's generated tokens per second: with output lengths drawn at random,
 * requests per second over a window moves with the mix of lengths that happened to finish in
 * it (a 10 s trial: 0.968× in req/s, 1.006× in tokens/s); req/s is printed beside it.
 */
if (withPriorities !== undefined && without !== undefined) {
  const ratio = withPriorities.fleetTokensPerSec / without.fleetTokensPerSec;
  goals.push({
    goal: "fleet throughput (tokens/s) under the burst with priorities ≥ without (2% for noise: the same saturated fleet)",
    measured: `${f(withPriorities.fleetTokensPerSec)} vs ${f(without.fleetTokensPerSec)} tok/s: ${f(ratio, 3)}×${range(ratios("burst, priorities", "burst, no priorities", (m) => m.fleetTokensPerSec))} (req/s ${f(withPriorities.fleetReqPerSec, 1)} vs ${f(without.fleetReqPerSec, 1)})`,
    met: ratio >= 0.98,
  });
}

const measuredCapacity = Math.max(
  withPriorities?.fleetReqPerSec ?? 0,
  without?.fleetReqPerSec ?? 0,
);
const result = {
  bench: "tenants",
  mode: quick ? "quick" : "full",
  rounds,
  replicas,
  capacityPerReplica: capacity,
  timeScale,
  windowSeconds: windowMs / 1000,
  leadSeconds: leadMs / 1000,
  outputTokens: { mean: outputTokens, min: minOutputTokens, max: maxOutputTokens },
  promptTokens,
  queueLength,
  estimatedFleetReqPerSec: fleetCapacity,
  criticalReqPerSec: criticalRate,
  batchReqPerSec: batchRate,
  node: process.version,
  children: benchChildrenRunAs(),
  wallSeconds: (Date.now() - t0) / 1000,
  loadavgAtStart: loadAtStart,
  loadavgAtEnd: loadAverage(),
  rows,
  goals,
  measurements,
};
console.log(
  `\nTenants and priorities — ${replicas} sim engines × ${capacity} in flight (router capacity; engine max running ${engineSeqs}), time scale ${timeScale}; llmgw ${result.children}; latencies in simulated ms, rates per simulated second; ${rounds} round(s) × ${windowMs / 1000} s (wall) windows, medians; load average ${loadAtStart} at start, ${result.loadavgAtEnd} at end; ${result.wallSeconds.toFixed(0)} s`,
);
console.log(
  `fleet capacity ≈ ${f(fleetCapacity, 1)} req/s (estimated; measured under the burst ${f(measuredCapacity, 1)}); critical ${f(criticalRate, 1)} req/s (${f(criticalLoad * 100)}%); batch burst ${f(batchRate, 1)} req/s (${f(burst)}× the estimate${measuredCapacity > 0 ? `, ${f(batchRate / measuredCapacity, 1)}× measured` : ""}); ${promptTokens}-token prompts, ${minOutputTokens}–${maxOutputTokens} output tokens; router queue ${queueLength}`,
);
console.log(
  "critical: requests sent during the burst window (in every scenario); fleet req/s and tok/s: answers of both tenants over the window's last three quarters",
);
printReport("tenants", table, goals, result);
process.exit(0);
