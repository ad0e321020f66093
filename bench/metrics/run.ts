// Scrape time and exposition size of the cluster collector at 1,000 nodes × 8 GPUs with 500
// replicas (DESIGN §12), plus the router families registered on the same registry.
// Baselines side by side: the pure series builder alone (what the collector adds on top is
// prom-client's gauge bookkeeping and text rendering), and an empty registry.
// Run: npx tsx bench/metrics/run.ts [--runs N] [--nodes N] [--gpus N] [--replicas N]
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";
import {
  buildClusterSeries,
  createClusterCollector,
  createMetricsRegistry,
  createRouterMetrics,
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

async function time(fn: () => unknown | Promise<unknown>): Promise<number[]> {
  await fn(); // warm-up
  const out: number[] = [];
  for (let i = 0; i < runs; i++) {
    const t0 = performance.now();
    await fn();
    out.push(performance.now() - t0);
  }
  return out;
}

const text = await registry.metrics();
const series = text.split("\n").filter((l) => l.length > 0 && !l.startsWith("#")).length;
const scrape = await time(() => registry.metrics());
const builder = await time(() => buildClusterSeries(view, 128));
const empty = createMetricsRegistry();
const emptyScrape = await time(() => empty.metrics());

const fmt = (v: number | undefined) => (v === undefined ? "-" : v.toFixed(2));
const rows = [
  [
    "registry.metrics() (cluster + router)",
    fmt(quantile(scrape, 0.5)),
    fmt(quantile(scrape, 0.9)),
    fmt(Math.max(...scrape)),
  ],
  [
    "baseline: buildClusterSeries only",
    fmt(quantile(builder, 0.5)),
    fmt(quantile(builder, 0.9)),
    fmt(Math.max(...builder)),
  ],
  [
    "baseline: empty registry",
    fmt(quantile(emptyScrape, 0.5)),
    fmt(quantile(emptyScrape, 0.9)),
    fmt(Math.max(...emptyScrape)),
  ],
];
console.log(
  `cluster: ${spec.nodes} nodes × ${spec.gpusPerNode} GPUs, ${spec.replicas} replicas; ${runs} runs`,
);
console.log(
  `exposition: ${(Buffer.byteLength(text) / 1024 / 1024).toFixed(2)} MiB, ${series} samples`,
);
console.log(formatTable(["what", "p50 ms", "p90 ms", "max ms"], rows));
console.log(
  JSON.stringify({
    bench: "metrics-scrape",
    ...spec,
    runs,
    exposition_bytes: Buffer.byteLength(text),
    samples: series,
    scrape_ms_p50: quantile(scrape, 0.5),
    scrape_ms_p90: quantile(scrape, 0.9),
    build_series_ms_p50: quantile(builder, 0.5),
    empty_registry_ms_p50: quantile(emptyScrape, 0.5),
    goal_scrape_ms: 100,
    goal_met: (quantile(scrape, 0.5) ?? Number.POSITIVE_INFINITY) < 100,
  }),
);
