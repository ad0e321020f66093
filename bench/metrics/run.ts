// The cluster /metrics scrape at fleet scale (issue 9): 1,000 nodes × 8 GPUs with 500
// replicas (DESIGN §12) plus the router families, and the scrape's effect on heartbeats.
//
// Part 1, scrape cost, old path vs new path side by side:
//   old: createClusterCollector(registry, view) → registry.metrics() (prom-client renders the
//        76k cluster samples), what the control plane serves today;
//   new: createClusterCollector(registry, view, { exposition: "text" }) + createMetricsEndpoint
//        → registry.metrics() for the router families and counters + the directly rendered
//        cluster text.
//   Both also "+ encode": Buffer.byteLength of the result, the UTF-8 encoding res.end() does;
//   and endpoint.body(), the same exposition as bytes (what a handler should send).
//   Baselines: the series walk alone (no rendering) and an empty registry.
// Part 2, heartbeat latency: a real control plane in this process (startControlPlane, port 0,
//   temp data dir) and --agents lightweight agents (bench/control-plane's Fleet: real Connect
//   clients, simulated 8×H100 inventories, heartbeats every 2 s). Heartbeat p50/p99 in
//   phases: no scrape, old-path scrape loop, new-path scrape loop, no scrape again (drift
//   check). Scrapes run in this process against the control plane's own cluster state, so a
//   scrape blocks the same event loop that answers heartbeats — the effect being measured.
//
// Run: npx tsx --conditions=@llmgw/source bench/metrics/run.ts
//   [--runs N] [--nodes N] [--gpus N] [--replicas N]
//   [--agents N (0 skips part 2)] [--seconds S per phase] [--scrape-every-ms MS]
//   [--scrape synthetic|live]
// Part 2 defaults to 100 agents scraping the synthetic 1,000 × 8 view (--scrape synthetic):
// 1,000 in-process agents saturate this shared 2-core machine by themselves (heartbeats back
// up for seconds with no scrape at all), and what a scrape does to heartbeats depends on how
// long it blocks the event loop, i.e. on the scraped state's size, not on who holds it.
// --scrape live scrapes the control plane's own state (N agents × 8 GPUs) instead.
import { mkdtempSync, rmSync } from "node:fs";
import os from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";
import { type ControlPlane, createClusterView, startControlPlane } from "@llmgw/control-plane";
import {
  type ClusterView,
  createClusterCollector,
  createMetricsEndpoint,
  createMetricsRegistry,
  createRouterMetrics,
  LabelCache,
  walkClusterSeries,
} from "@llmgw/metrics-collector";
import { buildSyntheticCluster } from "@llmgw/metrics-collector/testing";
import { Fleet } from "../control-plane/fleet.js";
import { monitorLoopDelay } from "../lib/loop-delay.js";
import { formatTable, quantile } from "../lib/table.js";

const { values } = parseArgs({
  options: {
    runs: { type: "string", default: "15" },
    nodes: { type: "string", default: "1000" },
    gpus: { type: "string", default: "8" },
    replicas: { type: "string", default: "500" },
    agents: { type: "string", default: "100" },
    seconds: { type: "string", default: "15" },
    scrape: { type: "string", default: "synthetic" },
    "scrape-every-ms": { type: "string", default: "1000" },
  },
});
const runs = Number(values.runs);
const spec = {
  nodes: Number(values.nodes),
  gpusPerNode: Number(values.gpus),
  replicas: Number(values.replicas),
};
const agents = Number(values.agents);
const phaseSeconds = Number(values.seconds);
const scrapeEveryMs = Number(values["scrape-every-ms"]);
const scrapeSource = values.scrape === "live" ? "live" : "synthetic";
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
const fmt = (v: number | undefined) => (v === undefined ? "-" : v.toFixed(1));
const load = () => os.loadavg()[0]?.toFixed(1) ?? "?";

/** A registry with the router families carrying some traffic (20 models × 25 replicas). */
function routerRegistry() {
  const registry = createMetricsRegistry();
  const router = createRouterMetrics(registry);
  for (let m = 0; m < 20; m++) {
    const model = `model-${m}`;
    for (let r = 0; r < 25; r++)
      router.replicaInFlight.set({ model, replica: `${model}-r${r}` }, r % 4);
    router.requests.inc({ model, endpoint: "chat_completions", code: "200" }, 100);
    router.requestDuration.observe({ model, endpoint: "chat_completions" }, 0.4);
    router.timeToFirstToken.observe({ model }, 0.08);
  }
  return registry;
}

/** The two scrape paths over one view, each a function returning the exposition text. */
function scrapePaths(view: ClusterView) {
  const oldRegistry = routerRegistry();
  createClusterCollector(oldRegistry, view);
  const newRegistry = routerRegistry();
  const cluster = createClusterCollector(newRegistry, view, { exposition: "text" });
  const endpoint = createMetricsEndpoint({ registry: newRegistry, cluster });
  return {
    old: () => oldRegistry.metrics(),
    new: () => endpoint.metrics(),
    newBytes: () => endpoint.body(),
  };
}

// ---------------------------------------------------------------- part 1: scrape cost

interface Timing {
  wallMs: number[];
  cpuMs: number[];
}

/** Wall and CPU time (process.cpuUsage, less sensitive to a loaded shared machine) per run. */
async function time(fn: () => unknown | Promise<unknown>): Promise<Timing> {
  for (let i = 0; i < 3; i++) await fn(); // warm-up (JIT, label caches, render buffers)
  const wallMs: number[] = [];
  const cpuMs: number[] = [];
  for (let i = 0; i < runs; i++) {
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    await fn();
    wallMs.push(performance.now() - t0);
    const c = process.cpuUsage(c0);
    cpuMs.push((c.user + c.system) / 1000);
  }
  return { wallMs, cpuMs };
}

const view = buildSyntheticCluster(spec);
const paths = scrapePaths(view);
const oldText = await paths.old();
const newText = await paths.new();
const samples = (text: string) =>
  text.split("\n").filter((l) => l.length > 0 && !l.startsWith("#")).length;

const part1: [string, Timing, number | undefined][] = [];
const measure = async (what: string, fn: () => unknown, bytes?: number) => {
  part1.push([what, await time(fn), bytes]);
};
// Interleave old and new so load drift on the shared machine hits both alike.
await measure("old: registry.metrics()", paths.old, Buffer.byteLength(oldText));
await measure("new: endpoint.metrics()", paths.new, Buffer.byteLength(newText));
await measure("old + encode", async () => Buffer.byteLength(await paths.old()));
await measure("new + encode", async () => Buffer.byteLength(await paths.new()));
await measure("new: endpoint.body() (bytes, nothing to encode)", paths.newBytes);
const walkCache = new LabelCache();
const noop = { plain() {}, shared() {} };
await measure("baseline: series walk, no rendering", () =>
  walkClusterSeries(view, 128, walkCache, noop),
);
const empty = createMetricsRegistry();
await measure("baseline: empty registry", () => empty.metrics());

console.log(
  `scrape: ${spec.nodes} nodes × ${spec.gpusPerNode} GPUs, ${spec.replicas} replicas + router families; ${runs} runs; load average ${load()} on ${os.cpus().length} CPUs`,
);
console.log(
  `exposition: old ${(Buffer.byteLength(oldText) / 1048576).toFixed(2)} MiB / ${samples(oldText)} samples, new ${(Buffer.byteLength(newText) / 1048576).toFixed(2)} MiB / ${samples(newText)} samples`,
);
console.log(
  formatTable(
    ["what", "cpu p50 ms", "wall p50 ms", "wall p90 ms", "bytes"],
    part1.map(([what, t, bytes]) => [
      what,
      fmt(quantile(t.cpuMs, 0.5)),
      fmt(quantile(t.wallMs, 0.5)),
      fmt(quantile(t.wallMs, 0.9)),
      bytes ?? "",
    ]),
  ),
);
const p50 = (label: string, key: "cpuMs" | "wallMs") =>
  quantile(part1.find(([w]) => w === label)?.[1][key] ?? [], 0.5);

// ------------------------------------------------------- part 2: heartbeats vs scrapes

interface Phase {
  readonly phase: string;
  readonly heartbeats: number;
  readonly errors: number;
  readonly p50Ms?: number;
  readonly p99Ms?: number;
  readonly maxMs?: number;
  readonly scrapes: number;
  readonly scrapeP50Ms?: number;
  readonly scrapeMaxMs?: number;
  readonly eventLoopDelayP99Ms: number;
  readonly loadAverage: string;
}

/** Runs one phase: heartbeats recorded for `phaseSeconds`, with `scrape` in a loop if given. */
async function phase(fleet: Fleet, name: string, scrape?: () => Promise<unknown>): Promise<Phase> {
  const errors0 = fleet.counters.errors;
  const delay = monitorLoopDelay(10);
  fleet.startRecording();
  const scrapeMs: number[] = [];
  const end = performance.now() + phaseSeconds * 1000;
  const loop = async () => {
    if (!scrape) return;
    while (performance.now() < end) {
      const t0 = performance.now();
      const body = await scrape();
      if (typeof body === "string") Buffer.byteLength(body); // what res.end() does with it
      scrapeMs.push(performance.now() - t0);
      await sleep(Math.max(0, scrapeEveryMs - (performance.now() - t0)));
    }
  };
  await Promise.all([loop(), sleep(phaseSeconds * 1000)]);
  // The fleet heartbeats as calls here (its default), so every beat has a latency.
  const { latencies } = fleet.stopRecording();
  delay.disable();
  await sleep(4_000); // let a backlog drain before the next phase starts recording
  return {
    phase: name,
    heartbeats: latencies.length,
    errors: fleet.counters.errors - errors0,
    p50Ms: quantile(latencies, 0.5),
    p99Ms: quantile(latencies, 0.99),
    maxMs: quantile(latencies, 1),
    scrapes: scrapeMs.length,
    scrapeP50Ms: quantile(scrapeMs, 0.5),
    scrapeMaxMs: quantile(scrapeMs, 1),
    eventLoopDelayP99Ms: delay.percentileMs(99),
    loadAverage: load(),
  };
}

let phases: Phase[] = [];
let heartbeatSetup: Record<string, unknown> = {};
if (agents > 0) {
  const dir = mkdtempSync(join(os.tmpdir(), "llmgw-bench-metrics-"));
  let cp: ControlPlane | undefined;
  let fleet: Fleet | undefined;
  try {
    cp = await startControlPlane({
      dataDir: dir,
      listen: "127.0.0.1:0",
      controlListen: "127.0.0.1:0",
      heartbeatIntervalMs: 2_000,
      // Nodes must stay registered even if this loaded process falls behind on heartbeats.
      nodeLostAfterMs: 600_000,
      shutdownGraceMs: 2_000,
    });
    fleet = new Fleet({
      controlUrl: cp.controlUrl,
      joinToken: cp.joinToken,
      agents,
      simSpec: "8xh100-80g@ib-a",
    });
    const t0 = performance.now();
    const interval = await fleet.registerAll();
    const registerS = (performance.now() - t0) / 1000;
    fleet.start();
    await sleep(interval * 4); // registration backlog drained, every agent heartbeating
    // live: old path = the control plane's own registry (its cluster collector, registry
    // exposition); new path = a text-exposition collector over the same live cluster state.
    // synthetic: part 1's two paths over the 1,000 × 8 view, in this same process.
    const cpRegistry = cp.registry;
    const liveNew = (() => {
      const registry = createMetricsRegistry();
      const cluster = createClusterCollector(registry, createClusterView(cp.cluster), {
        exposition: "text",
      });
      return createMetricsEndpoint({ registry, cluster });
    })();
    const scrapeOld = scrapeSource === "live" ? () => cpRegistry.metrics() : paths.old;
    const scrapeNew = scrapeSource === "live" ? () => liveNew.body() : paths.newBytes;
    const liveOld = await scrapeOld();
    const liveNewText = (await scrapeNew()).toString("utf8");
    heartbeatSetup = {
      agents,
      gpusPerAgent: 8,
      heartbeatIntervalMs: interval,
      registerS: Number(registerS.toFixed(1)),
      phaseSeconds,
      scrapeEveryMs,
      scrapeSource,
      scrapedExpositionBytes: {
        old: Buffer.byteLength(liveOld),
        new: Buffer.byteLength(liveNewText),
      },
      scrapedSamples: { old: samples(liveOld), new: samples(liveNewText) },
    };
    console.log(
      `\nheartbeats: ${agents} agents × 8 GPUs in this process, heartbeat ${interval} ms, registered in ${registerS.toFixed(1)} s; ${phaseSeconds} s per phase, scrape every ${scrapeEveryMs} ms of the ${scrapeSource} state (${samples(liveOld)} samples)`,
    );
    // Twice round, alternating, so load drift on the shared machine hits every phase alike.
    for (const round of [1, 2]) {
      phases.push(await phase(fleet, `${round}: no scrape`));
      phases.push(await phase(fleet, `${round}: old-path scrape loop`, scrapeOld));
      phases.push(await phase(fleet, `${round}: new-path scrape loop (body)`, scrapeNew));
    }
    if (fleet.counters.errors > 0)
      console.log(`heartbeat errors by kind: ${JSON.stringify([...fleet.counters.errorKinds])}`);
    console.log(
      formatTable(
        [
          "phase",
          "heartbeats",
          "errors",
          "hb p50 ms",
          "hb p99 ms",
          "hb max ms",
          "scrapes",
          "scrape p50 ms",
          "loop delay p99 ms",
          "load",
        ],
        phases.map((p) => [
          p.phase,
          p.heartbeats,
          p.errors,
          fmt(p.p50Ms),
          fmt(p.p99Ms),
          fmt(p.maxMs),
          p.scrapes,
          fmt(p.scrapeP50Ms),
          fmt(p.eventLoopDelayP99Ms),
          p.loadAverage,
        ]),
      ),
    );
  } finally {
    fleet?.stop();
    await cp?.close();
    rmSync(dir, { recursive: true, force: true });
  }
} else {
  phases = [];
}

const newWall = p50("new: endpoint.body() (bytes, nothing to encode)", "wallMs");
console.log(
  JSON.stringify({
    bench: "metrics-scrape",
    ...spec,
    runs,
    cpus: os.cpus().length,
    load_average_1m: os.loadavg()[0],
    exposition_bytes: { old: Buffer.byteLength(oldText), new: Buffer.byteLength(newText) },
    samples: { old: samples(oldText), new: samples(newText) },
    cpu_ms_p50: Object.fromEntries(part1.map(([w, t]) => [w, quantile(t.cpuMs, 0.5)])),
    wall_ms_p50: Object.fromEntries(part1.map(([w, t]) => [w, quantile(t.wallMs, 0.5)])),
    goal_scrape_ms: 100,
    goal_met_wall_new: (newWall ?? Number.POSITIVE_INFINITY) < 100,
    heartbeat: agents > 0 ? { ...heartbeatSetup, phases } : "skipped (--agents 0)",
  }),
);
