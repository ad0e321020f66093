import { Registry } from "prom-client";
import { describe, expect, it } from "vitest";
import { createClusterCollector } from "./cluster-collector.js";
import { buildClusterSeries, gpuCapacityState, LabelCache } from "./cluster-series.js";
import type { NodeView } from "./cluster-view.js";
import { isMetricsCollectorError } from "./errors.js";
import { CLUSTER_FAMILIES } from "./families.js";
import { parseExposition } from "./testing/exposition.js";
import { FakeClusterView, h100Gpu, l40sGpu, readyNode } from "./testing/index.js";

async function scrape(registry: Registry) {
  return parseExposition(await registry.metrics()).samples;
}

function values(samples: Awaited<ReturnType<typeof scrape>>, name: string) {
  return samples.filter((s) => s.name === name);
}

function smallCluster(): FakeClusterView {
  return new FakeClusterView({
    nodes: [
      readyNode(
        "n1",
        [
          h100Gpu(0, { allocatedDeployment: "llama" }),
          h100Gpu(1, { utilizationPercent: undefined, powerWatts: undefined }),
          h100Gpu(2, {
            healthy: false,
            eccUncorrectedErrors: 2,
            healthProblems: ["LLMGW_DISCOVERY_GPU_ECC_UNCORRECTED", "LLMGW_DISCOVERY_GPU_FAULT"],
            faultsSeen: [{ code: 79, kind: "xid", action: "reset-gpu", count: 2 }],
          }),
          h100Gpu(3, { mig: true }),
        ],
        {
          ports: [
            { device: "mlx5_0", port: 1, healthy: false },
            { device: "mlx5_1", port: 1 },
          ],
        },
      ),
      readyNode("n2", [l40sGpu(0)], {
        state: "unreachable",
        lastHeartbeatUnixMs: undefined,
        fabrics: [],
      }),
    ],
    deployments: [
      {
        name: "llama",
        servedModelName: "meta-llama/Llama-3.1-8B",
        desired: 2,
        ready: 1,
        unschedulable: true,
        gpuClass: "h100-80g",
        engine: "vllm",
      },
    ],
    replicas: [
      { id: "llama-0", deployment: "llama", state: "ready" },
      { id: "llama-1", deployment: "llama", state: "pending" },
    ],
    routers: [
      { id: "in-process", connected: true },
      { id: "router-a", connected: true },
      { id: "router-b", connected: false },
    ],
  });
}

describe("createClusterCollector", () => {
  it("registers every cluster family on the injected registry only", () => {
    const registry = new Registry();
    const collector = createClusterCollector(registry, smallCluster());
    expect(collector.families).toEqual(CLUSTER_FAMILIES.map((f) => f.name));
    expect(
      registry
        .getMetricsAsArray()
        .map((m) => m.name)
        .sort(),
    ).toEqual([...collector.families].sort());
  });

  it("labels every sample with exactly its family's catalogue labels", async () => {
    const registry = new Registry();
    createClusterCollector(registry, smallCluster());
    const samples = await scrape(registry);
    for (const f of CLUSTER_FAMILIES) {
      const own = values(samples, f.name);
      expect(own.length, f.name).toBeGreaterThan(0);
      for (const s of own)
        expect(Object.keys(s.labels).sort(), f.name).toEqual([...f.labelNames].sort());
    }
  });

  it("counts routers by state, and exports none for a view without routers", async () => {
    const registry = new Registry();
    createClusterCollector(registry, smallCluster());
    expect(
      values(await scrape(registry), "llmgw_routers").map((s) => [s.labels.state, s.value]),
    ).toEqual([
      ["connected", 2],
      ["disconnected", 1],
    ]);
    const bare = smallCluster();
    const other = new Registry();
    createClusterCollector(other, {
      nodes: () => bare.nodes(),
      deployments: () => bare.deployments(),
      replicas: () => bare.replicas(),
    });
    expect(values(await scrape(other), "llmgw_routers")).toEqual([]);
  });

  it("exports GPU faults as a counter, current problems by code, and port health only when read", async () => {
    const registry = new Registry();
    createClusterCollector(registry, smallCluster());
    const text = await registry.metrics();
    expect(text).toContain("# TYPE llmgw_gpu_faults_total counter");
    const samples = await scrape(registry);
    const plain = (name: string) =>
      values(samples, name).map((s) => ({ labels: s.labels, value: s.value }));
    expect(plain("llmgw_gpu_faults_total")).toEqual([
      { labels: { node: "n1", gpu: "2", code: "79", kind: "xid", action: "reset-gpu" }, value: 2 },
    ]);
    expect(
      values(samples, "llmgw_gpu_health_problem").map((s) => [
        s.labels.gpu,
        s.labels.code,
        s.value,
      ]),
    ).toEqual([
      ["2", "LLMGW_DISCOVERY_GPU_ECC_UNCORRECTED", 1],
      ["2", "LLMGW_DISCOVERY_GPU_FAULT", 1],
    ]);
    // mlx5_1 reported no health: no series, not a 1 and not a 0.
    expect(plain("llmgw_port_healthy")).toEqual([
      { labels: { node: "n1", device: "mlx5_0", port: "1" }, value: 0 },
    ]);
  });

  it("leaves a reading nobody reported missing, never 0", async () => {
    const registry = new Registry();
    createClusterCollector(registry, smallCluster());
    const samples = await scrape(registry);
    const util = values(samples, "llmgw_gpu_utilization_ratio").filter(
      (s) => s.labels.node === "n1",
    );
    expect(util.map((s) => s.labels.gpu).sort()).toEqual(["0", "2", "3"]);
    expect(util.find((s) => s.labels.gpu === "0")?.value).toBe(1);
    expect(
      values(samples, "llmgw_gpu_power_watts").some(
        (s) => s.labels.node === "n1" && s.labels.gpu === "1",
      ),
    ).toBe(false);
    // n2 never heartbeated: no heartbeat timestamp at all.
    expect(
      values(samples, "llmgw_node_last_heartbeat_timestamp_seconds").map((s) => s.labels.node),
    ).toEqual(["n1"]);
    expect(values(samples, "llmgw_node_last_heartbeat_timestamp_seconds")[0]?.value).toBe(
      1_796_000_000,
    );
  });

  it.each([
    ["NaN", Number.NaN],
    ["Infinity", Number.POSITIVE_INFINITY],
    ["negative", -5],
  ])("treats a %s reading in the view as missing", async (_label, bad) => {
    const view = new FakeClusterView({
      nodes: [
        readyNode("n1", [
          h100Gpu(0, { memoryUsedBytes: bad, utilizationPercent: bad, powerWatts: bad }),
        ]),
      ],
    });
    const registry = new Registry();
    createClusterCollector(registry, view);
    const samples = await scrape(registry);
    expect(values(samples, "llmgw_gpu_memory_used_bytes")).toEqual([]);
    expect(values(samples, "llmgw_gpu_utilization_ratio")).toEqual([]);
    expect(values(samples, "llmgw_gpu_power_watts")).toEqual([]);
    expect(values(samples, "llmgw_gpu_memory_total_bytes")).toHaveLength(1);
  });

  it("follows view changes between scrapes", async () => {
    const view = smallCluster();
    const registry = new Registry();
    createClusterCollector(registry, view);
    const before = await scrape(registry);
    expect(values(before, "llmgw_node_up").find((s) => s.labels.node === "n2")?.value).toBe(0);

    view.updateNode("n2", (n) => ({
      ...n,
      state: "ready",
      lastHeartbeatUnixMs: 1_796_000_060_000,
    }));
    view.updateNode("n1", (n) => ({
      ...n,
      gpus: n.gpus.map((g) => (g.index === 1 ? { ...g, utilizationPercent: 37 } : g)),
    }));
    const leavingBefore = values(before, "llmgw_replicas_leaving").map(
      (s) => `${s.labels.phase}=${s.value}`,
    );
    // Every phase present per deployment, 0 when none is leaving.
    expect(leavingBefore.sort()).toEqual(["draining=0", "waiting=0"]);
    view.replicaList = view.replicaList.map((r, i) => ({
      ...r,
      state: "ready" as const,
      ...(i === 0 ? { leaving: "draining" as const } : {}),
    }));
    const after = await scrape(registry);
    expect(
      values(after, "llmgw_replicas_leaving")
        .map((s) => `${s.labels.phase}=${s.value}`)
        .sort(),
    ).toEqual(["draining=1", "waiting=0"]);
    expect(values(after, "llmgw_node_up").find((s) => s.labels.node === "n2")?.value).toBe(1);
    expect(
      values(after, "llmgw_node_last_heartbeat_timestamp_seconds").find(
        (s) => s.labels.node === "n2",
      )?.value,
    ).toBe(1_796_000_060);
    expect(
      values(after, "llmgw_gpu_utilization_ratio").find(
        (s) => s.labels.node === "n1" && s.labels.gpu === "1",
      )?.value,
    ).toBe(0.37);
    expect(values(after, "llmgw_replicas").find((s) => s.labels.state === "ready")?.value).toBe(2);
    expect(values(after, "llmgw_replicas").find((s) => s.labels.state === "pending")?.value).toBe(
      0,
    );

    view.nodeList = view.nodeList.filter((n) => n.id !== "n2");
    const removed = await scrape(registry);
    expect(removed.some((s) => s.labels.node === "n2")).toBe(false);
  });

  it("answers 'was it full' by class and state, and per fabric", async () => {
    const registry = new Registry();
    createClusterCollector(registry, smallCluster());
    const samples = await scrape(registry);
    const cluster = Object.fromEntries(
      values(samples, "llmgw_cluster_gpus").map((s) => [
        `${s.labels.gpu_class}/${s.labels.state}`,
        s.value,
      ]),
    );
    expect(cluster).toEqual({
      "h100-80g/free": 1,
      "h100-80g/allocated": 1,
      "h100-80g/unhealthy": 1,
      "h100-80g/unavailable": 1,
      "l40s-45g/free": 0,
      "l40s-45g/allocated": 0,
      "l40s-45g/unhealthy": 0,
      "l40s-45g/unavailable": 1,
    });
    const fabric = values(samples, "llmgw_fabric_gpus").filter((s) => s.labels.state === "free");
    expect(
      fabric.map((s) => [s.labels.fabric, s.labels.link_layer, s.labels.gpu_class, s.value]),
    ).toEqual([
      ["ib-a", "infiniband", "h100-80g", 1],
      ["none", "none", "l40s-45g", 0],
    ]);
    expect(values(samples, "llmgw_fabric_nodes").map((s) => [s.labels.fabric, s.value])).toEqual([
      ["ib-a", 1],
      ["none", 1],
    ]);
    expect(values(samples, "llmgw_cluster_nodes").map((s) => [s.labels.state, s.value])).toEqual([
      ["ready", 1],
      ["unreachable", 1],
      ["lost", 0],
    ]);
    expect(
      values(samples, "llmgw_gpu_allocation").map((s) => [
        s.labels.node,
        s.labels.gpu,
        s.labels.deployment,
      ]),
    ).toEqual([["n1", "0", "llama"]]);
    expect(values(samples, "llmgw_deployment_info")[0]?.labels).toEqual({
      deployment: "llama",
      model: "meta-llama/Llama-3.1-8B",
      gpu_class: "h100-80g",
      engine: "vllm",
    });
    expect(values(samples, "llmgw_deployment_unschedulable")[0]?.value).toBe(1);
    // Absent from the view: not refused.
    expect(values(samples, "llmgw_deployment_invalid")[0]?.value).toBe(0);
    expect(
      values(samples, "llmgw_node_state")
        .filter((s) => s.labels.node === "n2")
        .map((s) => [s.labels.state, s.value]),
    ).toEqual([
      ["ready", 0],
      ["unreachable", 1],
      ["lost", 0],
    ]);
  });

  it.each<[string, Partial<NodeView>, Parameters<typeof h100Gpu>[1], string]>([
    ["healthy idle GPU on a ready node", {}, {}, "free"],
    ["unhealthy beats allocated", {}, { healthy: false, allocatedDeployment: "x" }, "unhealthy"],
    ["allocated", {}, { allocatedDeployment: "x" }, "allocated"],
    ["MIG enabled", {}, { mig: true }, "unavailable"],
    ["cordoned node", { cordoned: true }, {}, "unavailable"],
    ["draining node", { draining: true }, {}, "unavailable"],
    ["lost node", { state: "lost" }, {}, "unavailable"],
    [
      "allocated on an unreachable node",
      { state: "unreachable" },
      { allocatedDeployment: "x" },
      "allocated",
    ],
  ])("classifies %s", (_name, node, gpu, expected) => {
    const g = h100Gpu(0, gpu);
    expect(gpuCapacityState(readyNode("n", [g], node), g)).toBe(expected);
  });

  it("bounds hostile label values and keeps the exposition parseable", async () => {
    const huge = "x".repeat(10 * 1024 * 1024);
    const view = new FakeClusterView({
      nodes: [
        readyNode("n1", [h100Gpu(0, { name: huge, uuid: 'GPU-"quoted"\\\n' })], {
          hostname: huge,
          agentVersion: "\uD800broken",
        }),
      ],
    });
    const registry = new Registry();
    createClusterCollector(registry, view, { labelValueMaxLength: 64 });
    const text = await registry.metrics();
    expect(text.length).toBeLessThan(100_000);
    const samples = parseExposition(text).samples;
    const info = values(samples, "llmgw_node_info")[0]!;
    expect(info.labels.hostname).toBe("x".repeat(64));
    expect(info.labels.agent_version).toBe("\uFFFDbroken");
    expect(values(samples, "llmgw_gpu_info")[0]?.labels.uuid).toBe('GPU-"quoted"\\\n');
  });

  it("never breaks the scrape when the view throws, and counts it", async () => {
    const view = smallCluster();
    const logs: string[] = [];
    const registry = new Registry();
    createClusterCollector(registry, view, { log: (m) => logs.push(m) });
    view.failWith = new Error("store closed");
    const samples = await scrape(registry);
    expect(values(samples, "llmgw_node_up")).toEqual([]);
    expect(values(samples, "llmgw_cluster_view_errors_total")[0]?.value).toBe(1);
    expect(logs).toEqual([
      "cluster view failed during scrape; cluster families empty: Error: store closed",
    ]);
    view.failWith = undefined;
    expect(values(await scrape(registry), "llmgw_node_up")).toHaveLength(2);
  });

  it("reads the view once per scrape", async () => {
    const view = smallCluster();
    let calls = 0;
    const counting = {
      nodes: () => {
        calls++;
        return view.nodes();
      },
      deployments: () => view.deployments(),
      replicas: () => view.replicas(),
    };
    const registry = new Registry();
    createClusterCollector(registry, counting);
    await registry.metrics();
    expect(calls).toBe(1);
    await registry.metrics();
    expect(calls).toBe(2);
  });

  it("refuses a second registration on the same registry with a stable code", () => {
    const registry = new Registry();
    createClusterCollector(registry, smallCluster());
    let caught: unknown;
    try {
      createClusterCollector(registry, smallCluster());
    } catch (error) {
      caught = error;
    }
    expect(isMetricsCollectorError(caught)).toBe(true);
    expect(caught).toMatchObject({
      code: "LLMGW_METRICS_COLLECTOR_ALREADY_REGISTERED",
      message: "metric family llmgw_node_info is already registered on this registry",
    });
  });

  it("rejects a bad labelValueMaxLength naming the option", () => {
    expect(() =>
      createClusterCollector(new Registry(), smallCluster(), { labelValueMaxLength: 2 }),
    ).toThrow("labelValueMaxLength must be an integer >= 8, got 2");
  });

  it("logs and counts readings refused at ingest", async () => {
    const logs: string[] = [];
    const registry = new Registry();
    const collector = createClusterCollector(registry, smallCluster(), {
      log: (m) => logs.push(m),
    });
    const result = collector.validateGpuReading(
      { index: 0, uuid: "GPU-1", healthy: true, memoryUsedBytes: -1 },
      "node n1",
    );
    expect(result).toEqual({
      ok: false,
      field: "memoryUsedBytes",
      reason: "negative",
      message: "memoryUsedBytes is negative (-1)",
    });
    collector.sanitizeGpuReading({
      index: 0,
      uuid: "GPU-1",
      healthy: true,
      utilizationPercent: Number.NaN,
    });
    expect(logs).toEqual([
      "GPU reading rejected (node n1): negative: memoryUsedBytes is negative (-1)",
      "GPU reading field dropped: non_finite: utilizationPercent is not finite (NaN)",
    ]);
    const rejected = values(await scrape(registry), "llmgw_gpu_readings_rejected_total");
    expect(Object.fromEntries(rejected.map((s) => [s.labels.reason, s.value]))).toEqual({
      not_an_object: 0,
      wrong_type: 0,
      non_finite: 1,
      negative: 1,
      out_of_range: 0,
      label_too_long: 0,
    });
  });

  it("composes with registry default labels", async () => {
    const registry = new Registry();
    registry.setDefaultLabels({ cluster: "eu-1" });
    createClusterCollector(registry, smallCluster());
    const used = values(await scrape(registry), "llmgw_gpu_memory_used_bytes")[0];
    expect(used?.labels).toEqual({ cluster: "eu-1", node: "n1", gpu: "0", gpu_class: "h100-80g" });
  });

  it("holds label objects only for what the latest scrape saw", () => {
    const view = smallCluster();
    const cache = new LabelCache();
    buildClusterSeries(view, 128, cache);
    expect(cache.size).toBe(2 + 5); // 2 nodes + 5 GPUs
    view.nodeList = view.nodeList.slice(0, 1);
    buildClusterSeries(view, 128, cache);
    expect(cache.size).toBe(1 + 4);
  });

  it("unregister removes every family", () => {
    const registry = new Registry();
    createClusterCollector(registry, smallCluster()).unregister();
    expect(registry.getMetricsAsArray()).toEqual([]);
  });

  it("exposes the same samples through getMetricsAsJSON", async () => {
    const registry = new Registry();
    createClusterCollector(registry, smallCluster());
    const json = await registry.getMetricsAsJSON();
    const used = json.find((m) => m.name === "llmgw_gpu_memory_used_bytes");
    expect(used?.values[0]?.labels).toEqual({ node: "n1", gpu: "0", gpu_class: "h100-80g" });
  });
});
