// Scrape time and exposition size of the cluster collector at 1,000 nodes × 8 GPUs with 500
// replicas (DESIGN §12), plus the router families registered on the same registry.
// Baselines side by side: the pure series builder alone (what the collector adds on top is
// prom-client's gauge bookkeeping and text rendering), and an empty registry.
// Run: npx tsx bench/metrics/run.ts [--runs N] [--nodes N] [--gpus N] [--replicas N]
import os from "node:os";
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";
import {
  buildClusterSeries,
  createClusterCollector,
  createMetricsRegistry,
  createRouterMetrics,
  LabelCache,
} from "@llmgw/metrics-collector";
import { buildSyntheticCluster } from "@llmgw/metrics-collector/testing";
import { formatTable, quantile } from "../lib/table.js";

const { values } = parseArgs({
  options: {
    runs: { type: "string", default: "15" },
    nodes: { type: "string", default: "1000" },
    gpus: { type: "string", default: "8" },
    replicas: { type: "string", default: "500" },
  },
});
const runs = Number(values.runs);
const spec = {
  nodes: Number(values.nodes),
  gpusPerNode: Number(values.gpus),
  replicas: Number(values.replicas),
};

const view = buildSyntheticCluster(spec);
const registry = createMetricsRegistry();
createClusterCollector(registry, view);
const router = createRouterMetrics(registry);
// Some router traffic so its families carry series too (20 models × a few replicas).
for (let m = 0; m < 20; m++) {
  const model = `model-${m}`;
  for (let r = 0; r < 25; r++)
    router.replicaInFlight.set({ model, replica: `${model}-r${r}` }, r % 4);
  router.requests.inc({ model, endpoint: "chat_completions", code: "200" }, 100);
  router.requestDuration.observe({ model, endpoint: "chat_completions" }, 0.4);
  router.timeToFirstToken.observe({ model }, 0.08);
}

interface Timing {
  wallMs: number[];
  cpuMs: number[];
}

/** Wall and CPU time (process.cpuUsage, less sensitive to a loaded shared machine) per run. */
async function time(fn: () => unknown | Promise<unknown>): Promise<Timing> {
  await fn(); // warm-up
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

const text = await registry.metrics();
const series = text.split("\n").filter((l) => l.length > 0 && !l.startsWith("#")).length;
const scrape = await time(() => registry.metrics());
const labelCache = new LabelCache(); // as the collector keeps one across scrapes
const builder = await time(() => buildClusterSeries(view, 128, labelCache));
const empty = createMetricsRegistry();
const emptyScrape = await time(() => empty.metrics());

// Floor: joining the same number of preformatted lines, no prom-client at all.
const lines = text.split("\n");
const floor = await time(() => lines.map((l) => `${l}`).join("\n"));

const fmt = (v: number | undefined) => (v === undefined ? "-" : v.toFixed(2));
const row = (what: string, t: Timing) => [
  what,
  fmt(quantile(t.wallMs, 0.5)),
  fmt(quantile(t.wallMs, 0.9)),
  fmt(quantile(t.cpuMs, 0.5)),
];
const rows = [
  row("registry.metrics() (cluster + router)", scrape),
  row("baseline: buildClusterSeries only", builder),
  row("baseline: join of the same lines", floor),
  row("baseline: empty registry", emptyScrape),
];
console.log(
  `cluster: ${spec.nodes} nodes × ${spec.gpusPerNode} GPUs, ${spec.replicas} replicas; ${runs} runs; load average ${os.loadavg()[0]?.toFixed(1)} on ${os.cpus().length} CPUs`,
);
console.log(
  `exposition: ${(Buffer.byteLength(text) / 1024 / 1024).toFixed(2)} MiB, ${series} samples`,
);
console.log(formatTable(["what", "wall p50 ms", "wall p90 ms", "cpu p50 ms"], rows));
console.log(
  JSON.stringify({
    bench: "metrics-scrape",
    ...spec,
    runs,
    load_average_1m: os.loadavg()[0],
    exposition_bytes: Buffer.byteLength(text),
    samples: series,
    scrape_wall_ms_p50: quantile(scrape.wallMs, 0.5),
    scrape_wall_ms_p90: quantile(scrape.wallMs, 0.9),
    scrape_cpu_ms_p50: quantile(scrape.cpuMs, 0.5),
    build_series_cpu_ms_p50: quantile(builder.cpuMs, 0.5),
    join_floor_cpu_ms_p50: quantile(floor.cpuMs, 0.5),
    goal_scrape_ms: 100,
    goal_met_wall: (quantile(scrape.wallMs, 0.5) ?? Number.POSITIVE_INFINITY) < 100,
  }),
);
