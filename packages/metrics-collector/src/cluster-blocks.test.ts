import { Registry } from "prom-client";
import { describe, expect, it } from "vitest";
import { createClusterCollector } from "./cluster-collector.js";
import {
  LabelCache,
  READING_FIELDS,
  sameApartFromReadings,
  walkClusterSeriesYielding,
} from "./cluster-series.js";
import { renderClusterBytesYielding, renderClusterText } from "./cluster-text.js";
import type { GpuView, NodeView } from "./cluster-view.js";
import { buildSyntheticCluster, FakeClusterView, h100Gpu, readyNode } from "./testing/index.js";

/** Two nodes with every optional part present, so that each field has a series to move. */
function cluster(): FakeClusterView {
  const gpu = (i: number, o: Partial<GpuView> = {}) =>
    h100Gpu(i, {
      eccUncorrectedErrors: 0,
      allocatedDeployment: i === 0 ? "llama" : undefined,
      healthProblems: i === 1 ? ["LLMGW_DISCOVERY_GPU_HOT"] : undefined,
      faultsSeen: i === 1 ? [{ code: 79, kind: "xid", action: "reset-gpu", count: 1 }] : undefined,
      ...o,
    });
  return new FakeClusterView({
    nodes: [
      readyNode("n1", [gpu(0), gpu(1)], {
        ports: [{ device: "mlx5_0", port: 1, healthy: true }],
      }),
      readyNode("n2", [gpu(0), gpu(1)]),
    ],
    deployments: [
      {
        name: "llama",
        desired: 1,
        ready: 1,
        unschedulable: false,
        gpuClass: "h100-80g",
        engine: "vllm",
      },
    ],
    replicas: [{ id: "llama-0", deployment: "llama", state: "ready" }],
  });
}

type Change = [string, (n: NodeView) => NodeView];
const onGpu = (g: Partial<GpuView>) => (n: NodeView) => ({
  ...n,
  gpus: n.gpus.map((x, i) => (i === 1 ? { ...x, ...g } : x)),
});
const changes: Change[] = [
  // Readings: rendered again on every scrape, from the latest values.
  ["lastHeartbeatUnixMs", (n) => ({ ...n, lastHeartbeatUnixMs: 1_796_000_002_000 })],
  ["memoryUsedBytes", onGpu({ memoryUsedBytes: 1234 })],
  ["utilizationPercent", onGpu({ utilizationPercent: 7 })],
  ["eccUncorrectedErrors", onGpu({ eccUncorrectedErrors: 3 })],
  ["temperatureCelsius", onGpu({ temperatureCelsius: -4.5 })],
  ["powerWatts", onGpu({ powerWatts: 99.25 })],
  ["a reading that went away (absent, not zero)", onGpu({ utilizationPercent: undefined })],
  ["a heartbeat that went away", (n) => ({ ...n, lastHeartbeatUnixMs: undefined })],
  // Fixed fields: the cached block is dropped and rendered again.
  ["hostname", (n) => ({ ...n, hostname: "renamed" })],
  ["agentVersion", (n) => ({ ...n, agentVersion: "0.2.0" })],
  ["simulated", (n) => ({ ...n, simulated: true })],
  ["state", (n) => ({ ...n, state: "unreachable" })],
  ["cordoned", (n) => ({ ...n, cordoned: true })],
  ["draining", (n) => ({ ...n, draining: true })],
  ["healthy", (n) => ({ ...n, healthy: false })],
  ["fabrics", (n) => ({ ...n, fabrics: [{ id: "ib-b", linkLayer: "infiniband" }] })],
  ["ports", (n) => ({ ...n, ports: [{ device: "mlx5_0", port: 1, healthy: false }] })],
  ["a GPU more", (n) => ({ ...n, gpus: [...n.gpus, h100Gpu(2)] })],
  ["gpu healthy", onGpu({ healthy: false })],
  ["gpu uuid", onGpu({ uuid: "GPU-new" })],
  ["gpu name", onGpu({ name: "NVIDIA H200" })],
  ["gpu class", onGpu({ gpuClass: "h200-141g" })],
  ["gpu mig", onGpu({ mig: true })],
  ["gpu memoryTotalBytes", onGpu({ memoryTotalBytes: 1 })],
  ["gpu allocatedDeployment", onGpu({ allocatedDeployment: "other" })],
  ["gpu healthProblems", onGpu({ healthProblems: ["LLMGW_DISCOVERY_GPU_ECC"] })],
  ["gpu healthProblems gone", onGpu({ healthProblems: undefined })],
  [
    "gpu faultsSeen count",
    onGpu({ faultsSeen: [{ code: 79, kind: "xid", action: "reset-gpu", count: 2 }] }),
  ],
];

describe("cached node blocks of the text renderer", () => {
  it.each(changes)("a change of %s shows in the next scrape over the same cache", (_, change) => {
    const view = cluster();
    const cache = new LabelCache();
    const before = renderClusterText(view, 128, cache);
    // Unchanged: the cached blocks give the same bytes.
    expect(renderClusterText(view, 128, cache)).toBe(before);
    view.updateNode("n1", change);
    const fresh = renderClusterText(view, 128, new LabelCache());
    expect(fresh).not.toBe(before);
    expect(renderClusterText(view, 128, cache)).toBe(fresh);
  });

  it("keeps absent readings absent after they were present", () => {
    const view = cluster();
    const cache = new LabelCache();
    expect(renderClusterText(view, 128, cache)).toContain(
      'llmgw_gpu_utilization_ratio{node="n1",gpu="1",gpu_class="h100-80g"} ',
    );
    view.updateNode("n1", onGpu({ utilizationPercent: undefined }));
    expect(renderClusterText(view, 128, cache)).not.toContain(
      'llmgw_gpu_utilization_ratio{node="n1",gpu="1",',
    );
  });

  it("renders a node whose view object is new but equal from its kept block", () => {
    const view = cluster();
    const cache = new LabelCache();
    const before = renderClusterText(view, 128, cache);
    view.nodeList = view.nodeList.map((n) => structuredClone(n));
    expect(renderClusterText(view, 128, cache)).toBe(before);
  });

  it("follows 1,000 nodes through rounds of changed readings, byte for byte with a fresh render", async () => {
    const view = buildSyntheticCluster({ nodes: 1_000, gpusPerNode: 8, replicas: 500 });
    const collector = createClusterCollector(new Registry(), view, { exposition: "text" });
    for (let round = 1; round <= 3; round++) {
      view.nodeList = view.nodeList.map((n, i) =>
        i % 3 === round % 3
          ? n
          : {
              ...n,
              lastHeartbeatUnixMs: (n.lastHeartbeatUnixMs ?? 0) + 2_000,
              cordoned: i === round,
              gpus: n.gpus.map((g) => ({ ...g, utilizationPercent: (round * 7 + i) % 101 })),
            },
      );
      const expected = renderClusterText(view, 128, new LabelCache());
      expect(collector.renderClusterMetrics()).toBe(expected);
      expect((await collector.renderClusterMetricsBytesYielding()).toString("utf8")).toBe(expected);
    }
  });
});

describe("readings apart from the GPUs (NodeView.gpuReadings)", () => {
  /** `view`'s nodes with their readings moved to `gpuReadings`, GPUs kept as `fixed` has them. */
  const apart = (view: FakeClusterView, fixed: Map<string, readonly GpuView[]>): NodeView[] =>
    view.nodeList.map((n) => {
      const readings = n.gpus.map((g) => ({
        memoryUsedBytes: g.memoryUsedBytes,
        utilizationPercent: g.utilizationPercent,
        eccUncorrectedErrors: g.eccUncorrectedErrors,
        temperatureCelsius: g.temperatureCelsius,
        powerWatts: g.powerWatts,
      }));
      const gpus =
        fixed.get(n.id) ??
        n.gpus.map(
          ({
            memoryUsedBytes: _m,
            utilizationPercent: _u,
            eccUncorrectedErrors: _e,
            temperatureCelsius: _t,
            powerWatts: _p,
            ...rest
          }) => rest,
        );
      fixed.set(n.id, gpus);
      return { ...n, gpus, gpuReadings: readings };
    });

  it("renders exactly as readings inside the GPUs, scrape after scrape", () => {
    const inline = cluster();
    const split = cluster();
    const fixed = new Map<string, readonly GpuView[]>();
    const cache = new LabelCache();
    for (const [, change] of changes.slice(0, 8)) {
      inline.updateNode("n1", change);
      split.updateNode("n1", change);
      const view = new FakeClusterView({
        nodes: apart(split, fixed),
        deployments: split.deploymentList,
        replicas: split.replicaList,
      });
      // The same GPU objects every time (only readings moved): the kept block serves.
      expect(renderClusterText(view, 128, cache)).toBe(
        renderClusterText(inline, 128, new LabelCache()),
      );
    }
  });

  it("reads no reading from the GPUs when they are given apart", () => {
    const node = readyNode("n1", [h100Gpu(0, { powerWatts: 300 })]);
    const view = new FakeClusterView({
      nodes: [{ ...node, gpuReadings: [{ powerWatts: 123 }] }],
      deployments: [],
      replicas: [],
    });
    const text = renderClusterText(view, 128, new LabelCache());
    expect(text).toContain('llmgw_gpu_power_watts{node="n1",gpu="0",gpu_class="h100-80g"} 123\n');
    expect(text).not.toContain("llmgw_gpu_temperature_celsius{");
  });
});

describe("sameApartFromReadings", () => {
  const node = readyNode("n1", [h100Gpu(0)]);
  it.each([
    ["the same object", node, node, true],
    ["a deep copy", node, structuredClone(node), true],
    [
      "only readings moved",
      node,
      { ...node, lastHeartbeatUnixMs: 1, gpus: [h100Gpu(0, { powerWatts: 1 })] },
      true,
    ],
    ["undefined and missing", { ...node, ports: undefined }, node, true],
    ["a fixed field moved", node, { ...node, cordoned: true }, false],
    ["a field added", node, { ...node, ports: [] }, false],
    ["a GPU's fixed field moved", node, { ...node, gpus: [h100Gpu(0, { healthy: false })] }, false],
    ["one GPU fewer", node, { ...node, gpus: [] }, false],
  ])("%s: %s", (_, a, b, same) => {
    expect(sameApartFromReadings(a, b)).toBe(same);
    expect(sameApartFromReadings(b, a)).toBe(same);
  });

  it("names only fields the views have", () => {
    const fields = new Set([
      ...Object.keys({ ...readyNode("n", []), gpuReadings: [] } satisfies NodeView),
      ...Object.keys(h100Gpu(0)),
    ]);
    for (const f of READING_FIELDS) expect(fields.has(f), f).toBe(true);
  });
});

describe("render slices", () => {
  it("lets callbacks queued during a render run before it ends, between nodes", async () => {
    const view = buildSyntheticCluster({ nodes: 50, gpusPerNode: 8, replicas: 20 });
    let nodesDone = 0;
    const seenAt: number[] = [];
    const sink = {
      plain() {},
      shared() {},
      fixedSamplesEnd() {},
    };
    // Count nodes by their first reading line's label set, as a sink sees the walk progress.
    const counted = {
      ...sink,
      shared(name: string) {
        if (name === "llmgw_node_last_heartbeat_timestamp_seconds") nodesDone++;
      },
    };
    // A "heartbeat" that keeps arriving while the render runs.
    let arriving = true;
    const heartbeat = () => {
      seenAt.push(nodesDone);
      if (arriving) setImmediate(heartbeat);
    };
    setImmediate(heartbeat);
    await walkClusterSeriesYielding(view, 128, new LabelCache(), counted, { sliceMs: 0 });
    arriving = false;
    expect(nodesDone).toBe(50);
    // It ran in the middle of the walk, not only before or after it.
    expect(seenAt.some((n) => n > 0 && n < 50)).toBe(true);
  });

  it("serves a heartbeat handler between the slices of a collector's render", async () => {
    const view = buildSyntheticCluster({ nodes: 200, gpusPerNode: 8, replicas: 50 });
    const cache = new LabelCache();
    let served = 0;
    let rendering = true;
    const serve = () => {
      if (!rendering) return;
      served++;
      setImmediate(serve);
    };
    setImmediate(serve);
    const body = await renderClusterBytesYielding(view, 128, cache, { sliceMs: 0 });
    rendering = false;
    // One pause per node at sliceMs 0, each a turn of the loop where the handler runs.
    expect(served).toBeGreaterThanOrEqual(199);
    expect(body.toString("utf8")).toBe(renderClusterText(view, 128, new LabelCache()));
  });
});
