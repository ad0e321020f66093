// The control plane's own /metrics path at fleet scale (issue 19): a real `Cluster` (SQLite
// store in a temp dir) with --nodes simulated 8×H100 nodes registered and heartbeating, and
// --deployments placed; scraped through what `startControlPlane` wires: `createClusterView`
// → `createClusterCollector(registry, view, { exposition: "text" })` → `createMetricsEndpoint`.
// Before every scrape each node heartbeats once with fresh readings (every reading changed: the
// worst case for anything cached between scrapes).
//
// Per scrape, medians of --runs: the view's `nodes()` alone; `endpoint.exposition()` (sliced,
// what the handler sends) and `endpoint.body()` (the same joined) as wall and CPU time, with
// the longest stretch each held the event loop; the synchronous render. Event-loop holds are measured with a setImmediate ticker.
//
//   node --conditions=@llmgw/source --import tsx bench/metrics/cluster-scrape.ts
//     [--nodes N] [--deployments D] [--runs R] [--cpu-prof (node's own flag, before --import)]
import { mkdtempSync, rmSync } from "node:fs";
import os from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";
import { Cluster, createClusterView, openSqliteStore } from "@llmgw/control-plane";
import { simulateInventory } from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import {
  createClusterCollector,
  createMetricsEndpoint,
  createMetricsRegistry,
  LabelCache,
  walkClusterSeries,
} from "@llmgw/metrics-collector";
import { schedule } from "@llmgw/scheduler";
import { gpuReadingFromProto, gpuReadingToProto } from "@llmgw/wire";
import { formatTable, quantile } from "../lib/table.js";

const { values } = parseArgs({
  options: {
    nodes: { type: "string", default: "1000" },
    deployments: { type: "string", default: "200" },
    runs: { type: "string", default: "15" },
  },
});
const nodes = Number(values.nodes);
const deployments = Number(values.deployments);
const runs = Number(values.runs);
const median = (xs: readonly number[]) => quantile(xs, 0.5) ?? Number.NaN;
const fmt = (v: number | undefined) => (v === undefined ? "-" : v.toFixed(1));

const dir = mkdtempSync(join(os.tmpdir(), "llmgw-bench-cluster-scrape-"));
const store = openSqliteStore({ file: join(dir, "state.db") });
let now = 1_800_000_000_000;
const deferred: (() => void)[] = [];
const cluster = new Cluster({
  store,
  schedule,
  clock: { now: () => now },
  heartbeatIntervalMs: 2_000,
  unreachableAfterMs: 6_000,
  nodeLostAfterMs: 60_000,
  rendezvousPortMin: 29_500,
  rendezvousPortMax: 29_999,
  maxNodes: 1_000_000,
  defer: (run) => deferred.push(run),
});
const drain = () => {
  for (const run of deferred.splice(0)) run();
};

const fleet = Array.from({ length: nodes }, (_, i) => {
  const plain = simulateInventory(`8xh100-80g@ib-${"abcd"[i % 4]}`, {
    hostname: `n${String(i).padStart(4, "0")}`,
    addresses: ["10.0.0.1"],
    nowMs: now,
  });
  return { plain, nodeId: "" };
});
store.transaction(() => {
  for (const a of fleet) {
    a.nodeId = cluster.register({
      inventory: a.plain,
      advertiseAddress: "10.0.0.1",
      replicas: [],
    }).nodeId;
  }
});
drain();
for (let i = 0; i < deployments; i++) {
  cluster.applyDeployment(
    parseDeploymentSpecOrThrow({
      name: `m${String(i).padStart(4, "0")}`,
      engine: "sim",
      model: "org/m",
      gpuClass: "h100-80g",
      tensorParallel: [1, 2, 4, 8][i % 4],
      replicas: 2 + ((i * 3) % 7),
    }),
  );
  drain();
}

let beat = 0;
/** Every node heartbeats once: fresh readings, every assigned rank READY. */
function heartbeatAll(): void {
  beat++;
  now += 2_000;
  for (const a of fleet) {
    const desired = cluster.desiredSet(a.nodeId);
    cluster.heartbeat(a.nodeId, {
      // As the control plane's agent edge hands them over (`convert/agent-reports.ts`).
      gpus: a.plain.gpus.map((g) =>
        gpuReadingFromProto(
          gpuReadingToProto({
            ...g,
            utilizationPercent: 40 + ((beat + g.index) % 20),
            memoryUsedBytes: 60 * 1024 ** 3,
            temperatureCelsius: 35 + ((beat + g.index) % 10),
            powerWatts: 400 + (beat % 7),
          }),
        ),
      ),
      replicas: desired.assignments.map((r, k) => ({
        replicaId: r.replicaId,
        rank: r.rank,
        state: "ready" as const,
        stateSinceMs: now,
        pid: 1000 + k,
        apiPort: 40_000 + k,
        restarts: 0,
        logTail: [],
        message: "",
        specHash: "",
        revision: r.spec.revision,
        adopted: false,
      })),
      problems: [],
    });
    drain();
  }
}

const view = createClusterView(cluster);
const registry = createMetricsRegistry();
const collector = createClusterCollector(registry, view, { exposition: "text" });
const endpoint = createMetricsEndpoint({ registry, cluster: collector });

/** Longest gap between setImmediate turns while `fn` runs: how long it held the loop. */
async function holding<T>(fn: () => Promise<T>): Promise<{ value: T; longestHoldMs: number }> {
  let longest = 0;
  let last = performance.now();
  let on = true;
  const tick = () => {
    const t = performance.now();
    longest = Math.max(longest, t - last);
    last = t;
    if (on) setImmediate(tick);
  };
  setImmediate(tick);
  const value = await fn();
  on = false;
  longest = Math.max(longest, performance.now() - last);
  return { value, longestHoldMs: longest };
}

const rows: Record<string, { wall: number[]; cpu: number[]; hold: number[] }> = {};
async function measure(what: string, fn: () => unknown): Promise<void> {
  heartbeatAll();
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  const { longestHoldMs } = await holding(async () => fn());
  const wall = performance.now() - t0;
  const c = process.cpuUsage(c0);
  rows[what] ??= { wall: [], cpu: [], hold: [] };
  const row = rows[what];
  row.wall.push(wall);
  row.cpu.push((c.user + c.system) / 1000);
  row.hold.push(longestHoldMs);
}

heartbeatAll();
const body = await endpoint.body();
const samples = body
  .toString("utf8")
  .split("\n")
  .filter((l) => l.length > 0 && !l.startsWith("#")).length;
for (let i = 0; i < 3; i++) await endpoint.body(); // warm-up: JIT, caches, buffers
for (let r = 0; r < runs; r++) {
  // Interleaved, so load drift on the shared machine hits every row alike.
  await measure("view.nodes() alone", () => view.nodes());
  if (process.env.PARTS) {
    await measure("cluster.nodeSnapshots()", () => cluster.nodeSnapshots());
    await measure("view.deployments()", () => view.deployments());
    await measure("view.replicas()", () => view.replicas());
    const c = new LabelCache();
    await measure("walk, no sink", () =>
      walkClusterSeries(view, 128, c, { plain() {}, shared() {} }),
    );
  }
  await measure("endpoint.exposition() (sliced, what /metrics sends)", async () =>
    (await endpoint.exposition()).release(),
  );
  await measure("endpoint.body() (the same joined into one buffer)", () => endpoint.body());
  await measure("renderClusterMetricsBytes() (one synchronous call)", () =>
    collector.renderClusterMetricsBytes(),
  );
}
console.log(
  `cluster scrape: ${nodes} nodes × 8 GPUs, ${cluster.listReplicas().length} replicas; ${(body.length / 1048576).toFixed(2)} MiB, ${samples} samples; ${runs} runs; load average ${os.loadavg()[0]?.toFixed(1)} on ${os.cpus().length} CPUs`,
);
console.log(
  formatTable(
    ["what", "wall p50 ms", "cpu p50 ms", "wall max ms", "longest loop hold p50 / max ms"],
    Object.entries(rows).map(([what, r]) => [
      what,
      fmt(median(r.wall)),
      fmt(median(r.cpu)),
      fmt(Math.max(...r.wall)),
      `${fmt(median(r.hold))} / ${fmt(Math.max(...r.hold))}`,
    ]),
  ),
);
console.log(
  JSON.stringify({
    bench: "metrics-cluster-scrape",
    nodes,
    replicas: cluster.listReplicas().length,
    bytes: body.length,
    samples,
    runs,
    load_average_1m: os.loadavg()[0],
    wall_ms_p50: Object.fromEntries(Object.entries(rows).map(([w, r]) => [w, median(r.wall)])),
    cpu_ms_p50: Object.fromEntries(Object.entries(rows).map(([w, r]) => [w, median(r.cpu)])),
    longest_hold_ms_max: Object.fromEntries(
      Object.entries(rows).map(([w, r]) => [w, Math.max(...r.hold)]),
    ),
  }),
);
store.close();
rmSync(dir, { recursive: true, force: true });
