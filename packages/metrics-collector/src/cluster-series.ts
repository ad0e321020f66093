import type { ClusterView, GpuView, NodeView } from "./cluster-view.js";
import { GPU_STATES, NODE_STATES, REPLICA_STATES, ROUTER_STATES } from "./families.js";
import { boundLabelValue } from "./labels.js";
import type { LineWriter } from "./line-writer.js";

/**
 * One sample and a finite value. Its full label set is `{ ...sharedLabels, ...labels }`
 * (see {@link sampleLabels}). `sharedLabels` is one object per node or GPU, the same across
 * families and across scrapes (held in a {@link LabelCache}); prom-client renders such an
 * object once and caches the text by identity, which is what keeps a 76k-sample scrape cheap.
 */
export interface Sample {
  /** Labels of this sample beyond `sharedLabels` (often none). */
  readonly labels: Readonly<Record<string, string>>;
  readonly sharedLabels?: Readonly<Record<string, string>>;
  readonly value: number;
}

/** The full label set of a sample. */
export function sampleLabels(sample: Sample): Record<string, string> {
  return sample.sharedLabels === undefined
    ? { ...sample.labels }
    : { ...sample.sharedLabels, ...sample.labels };
}

/**
 * One node's or GPU's label set, as an object (for prom-client, which renders it once and
 * caches the text by identity) and as rendered exposition text (`node="n1",gpu="0",…`,
 * escaped), so neither path formats it again while the node or GPU exists.
 */
export interface CachedLabels {
  readonly labels: Readonly<Record<string, string>>;
  /** `name="value"` pairs in key order, joined by commas, values escaped. */
  readonly text: string;
}

/**
 * Keeps the per-node and per-GPU label sets (object and rendered text) stable from one scrape
 * to the next, holding only the entries the latest scrape used (bounded by the cluster's size).
 */
export class LabelCache {
  /** Per-family byte buffers of `renderClusterText`, reused from scrape to scrape. */
  readonly writers = new Map<string, LineWriter>();
  #previous = new Map<string, CachedLabels>();
  #current = new Map<string, CachedLabels>();

  /** Starts a scrape: entries not used since the last `begin()` are dropped. */
  begin(): void {
    this.#previous = this.#current;
    this.#current = new Map();
  }

  /** The cached label set for `key`, or `make()` (frozen and rendered) remembered under it. */
  get(key: string, make: () => Record<string, string>): CachedLabels {
    let v = this.#current.get(key) ?? this.#previous.get(key);
    if (v === undefined) {
      const labels = Object.freeze(make());
      v = { labels, text: formatLabelPairs(labels) };
    }
    this.#current.set(key, v);
    return v;
  }

  /** Entries held (for tests). */
  get size(): number {
    return this.#current.size;
  }
}

/**
 * Receives every sample of one walk over the view ({@link walkClusterSeries}). Values are
 * finite; label values are already bounded (not yet escaped).
 */
export interface SeriesSink {
  /** A sample labelled exactly `labels` (cluster totals, deployments). */
  plain(family: string, labels: Readonly<Record<string, string>>, value: number): void;
  /**
   * A sample labelled by a node's or GPU's cached set plus `extra` (the empty
   * `NO_LABELS` object when the family adds nothing).
   */
  shared(
    family: string,
    shared: CachedLabels,
    extra: Readonly<Record<string, string>>,
    value: number,
  ): void;
}

/** The empty label set passed as `extra` when a family adds nothing to a node's or GPU's. */
export const NO_LABELS: Readonly<Record<string, string>> = Object.freeze({});

/** Escapes a label value for the text format: backslash, double quote and newline. */
const NEEDS_ESCAPE = /[\\\n"]/;

/**
 * Escapes a label value as the Prometheus text format requires (and prom-client does):
 * backslash → `\\`, newline → `\n`, double quote → `\"`. Other characters pass through.
 */
export function escapeLabelValue(value: string): string {
  if (!NEEDS_ESCAPE.test(value)) return value;
  return value.replace(/\\/g, "\\\\").replace(/\n/g, "\\n").replace(/"/g, '\\"');
}

/** `a="1",b="2"` for a label object, in key order, values escaped (empty string for none). */
export function formatLabelPairs(labels: Readonly<Record<string, string>>): string {
  let out = "";
  for (const key in labels) {
    if (out.length > 0) out += ",";
    out += `${key}="${escapeLabelValue(labels[key] as string)}"`;
  }
  return out;
}

/** Samples of every cluster gauge family for one scrape, by family name. */
export type ClusterSeries = ReadonlyMap<string, readonly Sample[]>;

const NODE_STATE_LABELS: Readonly<Record<string, Readonly<Record<string, string>>>> =
  Object.fromEntries(NODE_STATES.map((s) => [s, Object.freeze({ state: s })]));
const ROUTER_STATE_LABELS: Readonly<Record<string, Readonly<Record<string, string>>>> =
  Object.fromEntries(ROUTER_STATES.map((s) => [s, Object.freeze({ state: s })]));

/** The GPU capacity state used by fabric and cluster totals (see `GPU_STATES`). */
export type GpuCapacityState = (typeof GPU_STATES)[number];

/** Classifies one GPU on its node: unhealthy > allocated > unavailable > free. */
export function gpuCapacityState(node: NodeView, gpu: GpuView): GpuCapacityState {
  if (!gpu.healthy) return "unhealthy";
  if (gpu.allocatedDeployment !== undefined) return "allocated";
  if (gpu.mig || node.state !== "ready" || node.cordoned || node.draining) return "unavailable";
  return "free";
}

const finite = (v: unknown): v is number => typeof v === "number" && Number.isFinite(v);
const nonNegative = (v: unknown): v is number => finite(v) && v >= 0;
const flag = (b: unknown): number => (b === true ? 1 : 0);

/**
 * Computes every cluster gauge family from the view, pure. Readings that are absent,
 * non-finite or negative produce no sample (absent is not zero); label values are bounded to
 * `labelValueMaxLength`. Counts that are genuinely zero (no replica in a state, no free GPU
 * of a class) are emitted as 0, because they are known.
 */
export function buildClusterSeries(
  view: ClusterView,
  labelValueMaxLength: number,
  cache: LabelCache = new LabelCache(),
): ClusterSeries {
  const out = new Map<string, Sample[]>();
  const list = (name: string) => {
    let l = out.get(name);
    if (l === undefined) {
      l = [];
      out.set(name, l);
    }
    return l;
  };
  walkClusterSeries(view, labelValueMaxLength, cache, {
    plain: (name, labels, value) => list(name).push({ labels, value }),
    // The node's or GPU's cached label object goes in `sharedLabels` (rendered once by
    // prom-client, by identity); `labels` holds only what a family adds to it.
    shared: (name, shared, extra, value) =>
      list(name).push({ labels: extra, sharedLabels: shared.labels, value }),
  });
  return out;
}

/**
 * The one place the cluster families' semantics live: reads the view once and hands every
 * sample to `sink`, in family-catalogue order within each node and GPU. Readings that are
 * absent, non-finite or negative produce no sample; label values are bounded to
 * `labelValueMaxLength`. Both {@link buildClusterSeries} (prom-client path) and
 * `renderClusterText` (direct text path) are sinks over this walk.
 * @throws whatever the view throws (callers turn that into an empty scrape).
 */
export function walkClusterSeries(
  view: ClusterView,
  labelValueMaxLength: number,
  cache: LabelCache,
  sink: SeriesSink,
): void {
  for (const _ of clusterSeriesSteps(view, labelValueMaxLength, cache, sink)) {
    // Each step is one node; nothing to do between them here.
  }
}

/** Options of {@link walkClusterSeriesYielding}. */
export interface YieldingWalkOptions {
  /** Longest stretch of walking between two pauses, in ms. Default 5. */
  readonly sliceMs?: number;
  /** Lets other work run; default: until the next turn of the event loop (`setImmediate`). */
  readonly pause?: () => Promise<void>;
  /** Monotonic milliseconds; default `performance.now`. */
  readonly now?: () => number;
}

const nextTurn = () => new Promise<void>((resolve) => setImmediate(resolve));

/**
 * {@link walkClusterSeries}, pausing whenever a stretch of walking has taken `sliceMs`, so
 * that a fleet-sized scrape (1,000 nodes × 8 GPUs: tens of ms of rendering, hundreds on a
 * loaded machine) never holds the event loop that answers heartbeats for that long. The
 * view is read once, before the first pause, so the samples are of one moment. `cache` and `sink` must
 * not be used by another walk until the returned promise settles.
 * @throws (rejects with) whatever the view throws.
 */
export async function walkClusterSeriesYielding(
  view: ClusterView,
  labelValueMaxLength: number,
  cache: LabelCache,
  sink: SeriesSink,
  options: YieldingWalkOptions = {},
): Promise<void> {
  const sliceMs = options.sliceMs ?? 5;
  const pause = options.pause ?? nextTurn;
  const now = options.now ?? (() => performance.now());
  let sliceStart = now();
  for (const _ of clusterSeriesSteps(view, labelValueMaxLength, cache, sink)) {
    if (now() - sliceStart < sliceMs) continue;
    await pause();
    sliceStart = now();
  }
}

/** The walk itself, one step per node, so callers choose whether to pause between steps. */
function* clusterSeriesSteps(
  view: ClusterView,
  labelValueMaxLength: number,
  cache: LabelCache,
  sink: SeriesSink,
): Generator<void, void, undefined> {
  // All three read before the first step: one moment, however long the walk pauses.
  const nodes = view.nodes();
  const deployments = view.deployments();
  const replicas = view.replicas();
  const routers = view.routers?.();
  cache.begin();
  const b = (v: unknown) => boundLabelValue(v, labelValueMaxLength);
  const push = (name: string, labels: Record<string, string>, value: number) =>
    sink.plain(name, labels, value);
  const pushShared = (name: string, shared: CachedLabels, value: number) =>
    sink.shared(name, shared, NO_LABELS, value);
  const pushExtra = (
    name: string,
    shared: CachedLabels,
    extra: Readonly<Record<string, string>>,
    value: number,
  ) => sink.shared(name, shared, extra, value);

  const clusterGpus = new Map<string, Map<GpuCapacityState, number>>();
  const fabricGpus = new Map<
    string,
    {
      fabric: string;
      linkLayer: string;
      gpuClass: string;
      counts: Map<GpuCapacityState, number>;
      nodes: number;
    }
  >();
  const nodeStates = new Map<string, number>(NODE_STATES.map((s) => [s, 0]));
  const agentVersions = new Map<string, number>();

  for (const node of nodes) {
    const id = b(node.id);
    // A state outside the union (a newer control plane) counts as not up, never as ready.
    const state = (NODE_STATES as readonly string[]).includes(node.state) ? node.state : "lost";
    const version = b(node.agentVersion);
    const nodeLabels = cache.get(id, () => ({ node: id }));
    pushExtra(
      "llmgw_node_info",
      nodeLabels,
      {
        hostname: b(node.hostname),
        agent_version: version,
        simulated: String(node.simulated === true),
      },
      1,
    );
    pushShared("llmgw_node_up", nodeLabels, state === "ready" ? 1 : 0);
    for (const s of NODE_STATES)
      pushExtra(
        "llmgw_node_state",
        nodeLabels,
        NODE_STATE_LABELS[s] ?? { state: s },
        s === state ? 1 : 0,
      );
    pushShared("llmgw_node_healthy", nodeLabels, flag(node.healthy));
    pushShared("llmgw_node_cordoned", nodeLabels, flag(node.cordoned));
    pushShared("llmgw_node_draining", nodeLabels, flag(node.draining));
    if (nonNegative(node.lastHeartbeatUnixMs)) {
      pushShared(
        "llmgw_node_last_heartbeat_timestamp_seconds",
        nodeLabels,
        node.lastHeartbeatUnixMs / 1000,
      );
    }
    nodeStates.set(state, (nodeStates.get(state) ?? 0) + 1);
    agentVersions.set(version, (agentVersions.get(version) ?? 0) + 1);

    const fabrics = node.fabrics.length > 0 ? node.fabrics : [{ id: "none", linkLayer: "none" }];
    const nodeClasses = new Map<string, number>();
    for (const gpu of node.gpus) {
      const gpuClass = b(gpu.gpuClass);
      const labels = cache.get(`${id}\u0000${gpu.index}\u0000${gpuClass}`, () => ({
        node: id,
        gpu: String(gpu.index),
        gpu_class: gpuClass,
      }));
      pushExtra(
        "llmgw_gpu_info",
        labels,
        { uuid: b(gpu.uuid), name: b(gpu.name), mig: String(gpu.mig === true) },
        1,
      );
      if (nonNegative(gpu.memoryTotalBytes))
        pushShared("llmgw_gpu_memory_total_bytes", labels, gpu.memoryTotalBytes);
      if (nonNegative(gpu.memoryUsedBytes))
        pushShared("llmgw_gpu_memory_used_bytes", labels, gpu.memoryUsedBytes);
      if (nonNegative(gpu.utilizationPercent))
        pushShared("llmgw_gpu_utilization_ratio", labels, gpu.utilizationPercent / 100);
      if (nonNegative(gpu.eccUncorrectedErrors))
        pushShared("llmgw_gpu_ecc_uncorrected_errors", labels, gpu.eccUncorrectedErrors);
      if (finite(gpu.temperatureCelsius))
        pushShared("llmgw_gpu_temperature_celsius", labels, gpu.temperatureCelsius);
      if (nonNegative(gpu.powerWatts)) pushShared("llmgw_gpu_power_watts", labels, gpu.powerWatts);
      pushShared("llmgw_gpu_healthy", labels, flag(gpu.healthy));
      for (const code of new Set(gpu.healthProblems ?? []))
        push("llmgw_gpu_health_problem", { node: id, gpu: String(gpu.index), code: b(code) }, 1);
      for (const f of gpu.faultsSeen ?? []) {
        if (!nonNegative(f.count)) continue;
        push(
          "llmgw_gpu_faults_total",
          {
            node: id,
            gpu: String(gpu.index),
            code: String(f.code),
            kind: b(f.kind),
            action: b(f.action),
          },
          f.count,
        );
      }
      if (gpu.allocatedDeployment !== undefined) {
        pushExtra("llmgw_gpu_allocation", labels, { deployment: b(gpu.allocatedDeployment) }, 1);
      }
      nodeClasses.set(gpuClass, (nodeClasses.get(gpuClass) ?? 0) + 1);
      const cap = gpuCapacityState(node, gpu);
      let byState = clusterGpus.get(gpuClass);
      if (byState === undefined) {
        byState = new Map(GPU_STATES.map((s) => [s, 0]));
        clusterGpus.set(gpuClass, byState);
      }
      byState.set(cap, (byState.get(cap) ?? 0) + 1);
      for (const fabric of fabrics) {
        const fabricId = b(fabric.id);
        const key = `${fabricId}\u0000${gpuClass}`;
        let entry = fabricGpus.get(key);
        if (entry === undefined) {
          entry = {
            fabric: fabricId,
            linkLayer: b(fabric.linkLayer),
            gpuClass,
            counts: new Map(GPU_STATES.map((s) => [s, 0])),
            nodes: 0,
          };
          fabricGpus.set(key, entry);
        }
        entry.counts.set(cap, (entry.counts.get(cap) ?? 0) + 1);
      }
    }
    for (const p of node.ports ?? []) {
      if (typeof p.healthy !== "boolean") continue;
      push(
        "llmgw_port_healthy",
        { node: id, device: b(p.device), port: String(p.port) },
        flag(p.healthy),
      );
    }
    for (const [gpuClass, count] of nodeClasses) {
      pushExtra("llmgw_node_gpus", nodeLabels, { gpu_class: gpuClass }, count);
      for (const fabric of fabrics) {
        const entry = fabricGpus.get(`${b(fabric.id)}\u0000${gpuClass}`);
        if (entry !== undefined) entry.nodes += 1;
      }
    }
    yield;
  }

  for (const [gpuClass, byState] of clusterGpus) {
    for (const [state, count] of byState)
      push("llmgw_cluster_gpus", { gpu_class: gpuClass, state }, count);
  }
  for (const e of fabricGpus.values()) {
    for (const [state, count] of e.counts) {
      push(
        "llmgw_fabric_gpus",
        { fabric: e.fabric, link_layer: e.linkLayer, gpu_class: e.gpuClass, state },
        count,
      );
    }
    push(
      "llmgw_fabric_nodes",
      { fabric: e.fabric, link_layer: e.linkLayer, gpu_class: e.gpuClass },
      e.nodes,
    );
  }
  for (const [state, count] of nodeStates) push("llmgw_cluster_nodes", { state }, count);
  for (const [version, count] of agentVersions) push("llmgw_agent_versions", { version }, count);

  const replicaCounts = new Map<string, Map<string, number>>();
  const countsFor = (deployment: string) => {
    let m = replicaCounts.get(deployment);
    if (m === undefined) {
      m = new Map(REPLICA_STATES.map((s) => [s, 0]));
      replicaCounts.set(deployment, m);
    }
    return m;
  };
  for (const d of deployments) {
    const name = b(d.name);
    countsFor(name);
    push(
      "llmgw_deployment_info",
      {
        deployment: name,
        model: b(d.servedModelName ?? d.name),
        gpu_class: b(d.gpuClass),
        engine: b(d.engine),
      },
      1,
    );
    if (nonNegative(d.desired))
      push("llmgw_deployment_replicas_desired", { deployment: name }, d.desired);
    if (nonNegative(d.ready))
      push("llmgw_deployment_replicas_ready", { deployment: name }, d.ready);
    push("llmgw_deployment_unschedulable", { deployment: name }, flag(d.unschedulable));
  }
  for (const r of replicas) {
    const m = countsFor(b(r.deployment));
    const state = (REPLICA_STATES as readonly string[]).includes(r.state) ? r.state : "unknown";
    m.set(state, (m.get(state) ?? 0) + 1);
  }
  for (const [deployment, m] of replicaCounts) {
    for (const [state, count] of m) push("llmgw_replicas", { deployment, state }, count);
  }
  if (routers !== undefined) {
    const connected = routers.filter((r) => r.connected === true).length;
    for (const state of ROUTER_STATES) {
      push(
        "llmgw_routers",
        ROUTER_STATE_LABELS[state] ?? { state },
        state === "connected" ? connected : routers.length - connected,
      );
    }
  }
}
