import { Registry, type RegistryContentType } from "prom-client";
import { describe, expect, it } from "vitest";
import { createClusterCollector } from "./cluster-collector.js";
import { escapeLabelValue, formatLabelPairs, LabelCache } from "./cluster-series.js";
import {
  CLUSTER_TEXT_FAMILIES,
  renderClusterBytes,
  renderClusterText,
  renderEmptyClusterText,
} from "./cluster-text.js";
import { isMetricsCollectorError } from "./errors.js";
import { CLUSTER_FAMILIES } from "./families.js";
import { createMetricsEndpoint } from "./metrics-endpoint.js";
import { createRouterMetrics } from "./router-metrics.js";
import { type ParsedSample, parseExposition } from "./testing/exposition.js";
import {
  buildSyntheticCluster,
  exerciseRouterMetrics,
  FakeClusterView,
  h100Gpu,
  l40sGpu,
  readyNode,
} from "./testing/index.js";

/** Family name → its block (`# HELP` … last sample) as prom-client or the renderer wrote it. */
function blocks(text: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const block of text.trimEnd().split("\n\n")) {
    const name = /^# HELP (\S+) /.exec(block)?.[1];
    if (name !== undefined) out.set(name, block);
  }
  return out;
}

/** A sample as one comparable string: name, sorted labels, value. */
const key = (s: ParsedSample) =>
  `${s.name}${JSON.stringify(Object.entries(s.labels).sort(([a], [b]) => a.localeCompare(b)))} ${s.value}`;

function sampleSet(text: string, names: readonly string[]): string[] {
  const wanted = new Set(names);
  return parseExposition(text)
    .samples.filter((s) => wanted.has(s.name))
    .map(key)
    .sort();
}

/** The gauge families through prom-client (the compatible registry path). */
async function viaRegistry(view: FakeClusterView): Promise<string> {
  const registry = new Registry();
  createClusterCollector(registry, view);
  return registry.metrics();
}

function hostileCluster(): FakeClusterView {
  const view = buildSyntheticCluster({ nodes: 12, gpusPerNode: 4, replicas: 9 });
  view.updateNode("node-0001", (n) => ({
    ...n,
    hostname: `evil"\\\n\r\u0000\u2028${"h".repeat(500)}`,
    agentVersion: 'v"1\\2\n3',
    gpus: n.gpus.map((g, i) =>
      i === 0
        ? { ...g, name: 'NVIDIA \u00e9\u{1F600} "quoted"', utilizationPercent: Number.NaN }
        : g,
    ),
  }));
  view.updateNode("node-0002", (n) => ({
    ...n,
    lastHeartbeatUnixMs: undefined,
    gpus: n.gpus.map((g) => ({ ...g, memoryUsedBytes: -1, powerWatts: Number.POSITIVE_INFINITY })),
  }));
  view.deploymentList = [
    ...view.deploymentList,
    {
      name: 'dep\nwith\\odd"name',
      desired: Number.NaN,
      ready: 1,
      unschedulable: false,
      gpuClass: "h100-80g",
      engine: "vllm",
    },
  ];
  return view;
}

describe("escapeLabelValue", () => {
  it.each([
    ["plain", "plain"],
    ['say "hi"', 'say \\"hi\\"'],
    ["back\\slash", "back\\\\slash"],
    ["two\nlines", "two\\nlines"],
    ['\\"\n', '\\\\\\"\\n'],
    ["carriage\rreturn and \u2028 stay", "carriage\rreturn and \u2028 stay"],
    ["é😀", "é😀"],
    ["", ""],
  ])("%j → %j", (raw, escaped) => {
    expect(escapeLabelValue(raw)).toBe(escaped);
  });

  it("formats label pairs in key order, values escaped", () => {
    expect(formatLabelPairs({ b: 'x"', a: "1" })).toBe('b="x\\"",a="1"');
    expect(formatLabelPairs({})).toBe("");
  });
});

describe("renderClusterText", () => {
  it.each([
    ["a small hand-built cluster", () => smallCluster()],
    [
      "a synthetic cluster (40 nodes × 8 GPUs)",
      () => buildSyntheticCluster({ nodes: 40, gpusPerNode: 8, replicas: 30 }),
    ],
    ["hostile labels, NaN/negative/infinite readings", hostileCluster],
    ["an empty cluster", () => new FakeClusterView()],
  ])("writes the same family blocks as prom-client for %s", async (_, make) => {
    const view = make();
    const expected = blocks(await viaRegistry(view));
    const text = renderClusterText(view, 128);
    const actual = blocks(text);
    expect([...actual.keys()]).toEqual(CLUSTER_TEXT_FAMILIES);
    for (const name of CLUSTER_TEXT_FAMILIES)
      expect(actual.get(name), name).toBe(expected.get(name));
    // And parsed: the same sample sets.
    expect(sampleSet(text, CLUSTER_TEXT_FAMILIES)).toEqual(
      sampleSet(await viaRegistry(view), CLUSTER_TEXT_FAMILIES),
    );
  });

  it("writes the same text as UTF-8 bytes (renderClusterBytes), non-ASCII included", () => {
    const view = hostileCluster();
    const cache = new LabelCache();
    const text = renderClusterText(view, 128, cache);
    expect(text).toContain("\u{1F600}");
    expect(renderClusterBytes(view, 128, cache).equals(Buffer.from(text, "utf8"))).toBe(true);
    // Twice through the same cache: the reused buffers hold nothing from the last scrape.
    expect(renderClusterText(view, 128, cache)).toBe(text);
  });

  it("renders the gauges and the view's counters, no prom-client counter", () => {
    expect(CLUSTER_TEXT_FAMILIES).toEqual(
      CLUSTER_FAMILIES.filter((f) => f.type === "gauge" || f.fromView === true).map((f) => f.name),
    );
    expect(CLUSTER_TEXT_FAMILIES).toContain("llmgw_gpu_faults_total");
    expect(CLUSTER_TEXT_FAMILIES).not.toContain("llmgw_gpu_readings_rejected_total");
    expect(CLUSTER_TEXT_FAMILIES).not.toContain("llmgw_cluster_view_errors_total");
  });

  it("never writes NaN or Inf and leaves unreported readings missing", () => {
    const view = hostileCluster();
    const text = renderClusterText(view, 128);
    expect(text).not.toMatch(/ (NaN|Nan|[+-]?Inf)$/m);
    const samples = parseExposition(text).samples;
    const of = (name: string, node: string) =>
      samples.filter((s) => s.name === name && s.labels.node === node);
    expect(of("llmgw_gpu_memory_used_bytes", "node-0002")).toEqual([]);
    expect(of("llmgw_gpu_power_watts", "node-0002")).toEqual([]);
    expect(of("llmgw_node_last_heartbeat_timestamp_seconds", "node-0002")).toEqual([]);
    // GPU 0 of node-0001 reported NaN; the synthetic cluster leaves a few others unreported.
    const reported = view
      .nodes()[1]
      ?.gpus.filter((g) => Number.isFinite(g.utilizationPercent))
      .map((g) => String(g.index));
    expect(reported).not.toContain("0");
    expect(of("llmgw_gpu_utilization_ratio", "node-0001").map((s) => s.labels.gpu)).toEqual(
      reported,
    );
    expect(of("llmgw_gpu_memory_used_bytes", "node-0003")).toHaveLength(4);
  });

  it("escapes hostile label values so the text parses back to the bounded originals", () => {
    const text = renderClusterText(hostileCluster(), 64);
    const info = parseExposition(text).samples.find(
      (s) => s.name === "llmgw_node_info" && s.labels.node === "node-0001",
    );
    expect(info?.labels.hostname).toBe(`evil"\\\n\r\u0000\u2028${"h".repeat(64 - 10)}`);
    expect(info?.labels.agent_version).toBe('v"1\\2\n3');
    const gpu = parseExposition(text).samples.find(
      (s) => s.name === "llmgw_gpu_info" && s.labels.node === "node-0001" && s.labels.gpu === "0",
    );
    expect(gpu?.labels.name).toBe('NVIDIA \u00e9\u{1F600} "quoted"');
  });

  it("follows the view from one scrape to the next with one cache", () => {
    const view = smallCluster();
    const cache = new LabelCache();
    const before = parseExposition(renderClusterText(view, 128, cache)).samples;
    view.updateNode("n1", (n) => ({
      ...n,
      gpus: n.gpus.map((g) => (g.index === 0 ? { ...g, memoryUsedBytes: 42 } : g)),
    }));
    const after = parseExposition(renderClusterText(view, 128, cache)).samples;
    const used = (s: readonly ParsedSample[]) =>
      s.find(
        (x) =>
          x.name === "llmgw_gpu_memory_used_bytes" &&
          x.labels.node === "n1" &&
          x.labels.gpu === "0",
      )?.value;
    expect(used(before)).toBe(19818 * 1024 * 1024);
    expect(used(after)).toBe(42);
    expect(cache.size).toBe(2 + 5);
    view.nodeList = view.nodeList.slice(0, 1);
    renderClusterText(view, 128, cache);
    expect(cache.size).toBe(1 + 4);
  });

  it("keeps each node's and GPU's rendered labels across scrapes (same cached entry)", () => {
    const view = smallCluster();
    const cache = new LabelCache();
    renderClusterText(view, 128, cache);
    const first = cache.labels("n1", "n1", () => ({ node: "changed" }));
    renderClusterText(view, 128, cache);
    expect(cache.labels("n1", "n1", () => ({ node: "changed" }))).toBe(first);
    expect(first.text).toBe('node="n1"');
  });

  it("keeps the label sets of a node whose fixed fields changed", () => {
    const view = smallCluster();
    const cache = new LabelCache();
    renderClusterText(view, 128, cache);
    const gpuKey = "n1\u00000\u0000h100-80g";
    const node = cache.labels("n1", "n1", () => ({ node: "changed" }));
    const gpu = cache.labels("n1", gpuKey, () => ({ node: "changed" }));
    expect(gpu.text).toBe('node="n1",gpu="0",gpu_class="h100-80g"');
    view.nodeList = view.nodeList.map((n) => (n.id === "n1" ? { ...n, cordoned: !n.cordoned } : n));
    const text = renderClusterText(view, 128, cache);
    expect(text).toMatch(/llmgw_node_cordoned\{node="n1"\} [01]/);
    expect(cache.labels("n1", "n1", () => ({ node: "changed" }))).toBe(node);
    expect(cache.labels("n1", gpuKey, () => ({ node: "changed" }))).toBe(gpu);
    // A key the node never had is made.
    expect(cache.labels("n1", "n1\u00009\u0000h100-80g", () => ({ node: "new" })).text).toBe(
      'node="new"',
    );
  });

  it("renders header lines only when there is nothing to say", () => {
    const empty = renderEmptyClusterText();
    expect(parseExposition(empty).samples).toEqual([]);
    expect([...blocks(empty).keys()]).toEqual(CLUSTER_TEXT_FAMILIES);
    expect(empty.endsWith("gauge\n")).toBe(true);
  });
});

describe("createClusterCollector({ exposition: 'text' })", () => {
  it("registers only the counters and renders the gauges on demand", async () => {
    const registry = new Registry();
    const view = smallCluster();
    const collector = createClusterCollector(registry, view, { exposition: "text" });
    expect(collector.exposition).toBe("text");
    expect(collector.families).toEqual(CLUSTER_FAMILIES.map((f) => f.name));
    expect(registry.getMetricsAsArray().map((m) => m.name)).toEqual([
      "llmgw_gpu_readings_rejected_total",
      "llmgw_cluster_view_errors_total",
    ]);
    expect(collector.renderClusterMetrics()).toBe(renderClusterText(view, 128));
    collector.unregister();
    expect(registry.getMetricsAsArray()).toEqual([]);
    expect(collector.renderClusterMetrics()).toBe("");
  });

  it("turns a throwing view into header-only families, logged and counted", async () => {
    const logs: string[] = [];
    const registry = new Registry();
    const view = smallCluster();
    const collector = createClusterCollector(registry, view, {
      exposition: "text",
      log: (m) => logs.push(m),
    });
    view.failWith = new Error("state lock poisoned");
    const endpoint = createMetricsEndpoint({ registry, cluster: collector });
    const text = await endpoint.metrics();
    const samples = parseExposition(text).samples;
    expect(samples.filter((s) => s.name.startsWith("llmgw_node_"))).toEqual([]);
    expect(samples.find((s) => s.name === "llmgw_cluster_view_errors_total")?.value).toBe(1);
    const bytes = parseExposition((await endpoint.body()).toString("utf8")).samples;
    expect(bytes.find((s) => s.name === "llmgw_cluster_view_errors_total")?.value).toBe(2);
    expect(logs).toEqual([
      "cluster view failed during scrape; cluster families empty: Error: state lock poisoned",
      "cluster view failed during scrape; cluster families empty: Error: state lock poisoned",
    ]);
  });

  it("rejects an unknown exposition naming the option", () => {
    expect(() =>
      createClusterCollector(new Registry(), smallCluster(), {
        exposition: "json" as unknown as "text",
      }),
    ).toThrow('exposition must be "registry" or "text", got "json"');
  });
});

describe("createMetricsEndpoint", () => {
  async function both(view: FakeClusterView) {
    const legacy = new Registry();
    createClusterCollector(legacy, view);
    exerciseRouterMetrics(createRouterMetrics(legacy));
    const fast = new Registry();
    const cluster = createClusterCollector(fast, view, { exposition: "text" });
    exerciseRouterMetrics(createRouterMetrics(fast));
    return { legacy, fast: createMetricsEndpoint({ registry: fast, cluster }) };
  }

  it("serves the same samples and family types as the registry path, each family once", async () => {
    const { legacy, fast } = await both(hostileCluster());
    const a = await legacy.metrics();
    const b = await fast.metrics();
    const all = [...parseExposition(a).types.keys()];
    expect(all.length).toBeGreaterThan(40);
    expect(sampleSet(b, all)).toEqual(sampleSet(a, all));
    expect(parseExposition(b).types).toEqual(parseExposition(a).types);
    const helps = b.split("\n").filter((l) => l.startsWith("# HELP "));
    expect(new Set(helps).size).toBe(helps.length);
    expect(fast.contentType).toBe(legacy.contentType);
    expect((await fast.body()).toString("utf8")).toBe(b);
    expect(b.endsWith("\n")).toBe(true);
    expect(b).not.toContain("\n\n\n");
  });

  it("with a registry-exposition collector (or none) is just registry.metrics()", async () => {
    const registry = new Registry();
    const cluster = createClusterCollector(registry, smallCluster());
    expect(await createMetricsEndpoint({ registry, cluster }).metrics()).toBe(
      await registry.metrics(),
    );
    expect(await createMetricsEndpoint({ registry }).metrics()).toBe(await registry.metrics());
    expect((await createMetricsEndpoint({ registry }).body()).toString("utf8")).toBe(
      await registry.metrics(),
    );
  });

  it("refuses an OpenMetrics registry with text-rendered cluster families", () => {
    const registry = new Registry();
    // The collector's API takes the default (0.0.4) registry type; switch it the way an app would.
    (registry as unknown as Registry<RegistryContentType>).setContentType(
      Registry.OPENMETRICS_CONTENT_TYPE,
    );
    const cluster = createClusterCollector(registry, smallCluster(), { exposition: "text" });
    let caught: unknown;
    try {
      createMetricsEndpoint({ registry, cluster });
    } catch (error) {
      caught = error;
    }
    expect(isMetricsCollectorError(caught)).toBe(true);
    expect(caught).toMatchObject({ code: "LLMGW_METRICS_COLLECTOR_INVALID_OPTION" });
  });
});

function smallCluster(): FakeClusterView {
  return new FakeClusterView({
    nodes: [
      readyNode("n1", [
        h100Gpu(0, { allocatedDeployment: "llama" }),
        h100Gpu(1, { utilizationPercent: undefined, powerWatts: undefined }),
        h100Gpu(2, { healthy: false, eccUncorrectedErrors: 2 }),
        h100Gpu(3, { mig: true }),
      ]),
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
  });
}
