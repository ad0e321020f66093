import type { ClusterView, GpuReadingView, GpuView, NodeView } from "./cluster-view.js";
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
  /**
   * A sink's rendered lines of this label set by family, kept while the set is (the text
   * renderer keeps `name{labels} ` and the last value's line here, so a reading that did not
   * change costs no formatting). Owned by whichever sink writes it; empty until then.
   */
  readonly lines: Map<string, RenderedLine>;
}

/** One sample line as a text sink rendered it last: reused while the value stays the same. */
export interface RenderedLine {
  /** `name{labels} `, everything before the value, as UTF-8. */
  readonly prefix: Uint8Array;
  value: number;
  /** `value` formatted (`${value}`). */
  text: string;
}

/**
 * What one walk derived from a node's fields other than its readings (bounded labels, the
 * GPUs' cached label sets), kept by a {@link LabelCache} for the next walk. A new object
 * whenever any such field changed, so a sink may key what it rendered from the node's fixed
 * samples by this object's identity (see {@link SeriesSink.fixedSamples}).
 */
export interface NodeMemo {
  /** The view the memo was derived from, or a later one equal apart from readings. */
  readonly node: NodeView;
  readonly labelValueMaxLength: number;
  readonly id: string;
  readonly labels: CachedLabels;
  /** One per `node.gpus` entry, same order. */
  readonly gpuLabels: readonly CachedLabels[];
  /** The {@link LabelCache} keys of `gpuLabels`. */
  readonly gpuKeys: readonly string[];
  /** Bounded `gpuClass` per `node.gpus` entry. */
  readonly gpuClasses: readonly string[];
  /** The node's fabrics (`none` when it lists none), bounded. */
  readonly fabrics: readonly { readonly id: string; readonly linkLayer: string }[];
  /** Per `node.gpus` entry, its `fabric\u0000gpuClass` key for each of {@link fabrics}. */
  readonly fabricKeys: readonly (readonly string[])[];
  readonly state: (typeof NODE_STATES)[number];
  readonly agentVersion: string;
}

/**
 * The view fields a heartbeat moves and the walk reads only for readings' samples
 * ({@link walkClusterSeries}); every other field of a node or GPU is "fixed": a change to any
 * of them renders the node's other samples again.
 */
export const READING_FIELDS: ReadonlySet<string> = new Set([
  "lastHeartbeatUnixMs",
  "gpuReadings",
  "memoryUsedBytes",
  "utilizationPercent",
  "eccUncorrectedErrors",
  "temperatureCelsius",
  "powerWatts",
]);

/**
 * Whether two views of a node agree on everything but {@link READING_FIELDS}: a deep
 * comparison of own enumerable fields (a field set to `undefined` equals a missing one),
 * short-cut by identity. `NaN` never equals itself here, which only costs a re-render.
 */
export function sameApartFromReadings(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false;
  if (Array.isArray(a)) {
    if (!Array.isArray(b) || a.length !== b.length) return false;
    for (let i = 0; i < a.length; i++) if (!sameApartFromReadings(a[i], b[i])) return false;
    return true;
  }
  if (Array.isArray(b)) return false;
  const x = a as Record<string, unknown>;
  const y = b as Record<string, unknown>;
  for (const k in x) {
    const xv = x[k];
    const yv = y[k];
    if (xv === yv || READING_FIELDS.has(k)) continue;
    if (typeof xv !== "object" || typeof yv !== "object" || !sameApartFromReadings(xv, yv))
      return false;
  }
  for (const k in y) {
    if (x[k] === undefined && y[k] !== undefined && !READING_FIELDS.has(k)) return false;
  }
  return true;
}

/**
 * Keeps the per-node and per-GPU label sets (object and rendered text) stable from one scrape
 * to the next, holding only what the latest scrape used (bounded by the cluster's size). They
 * live on each node's {@link NodeMemo}, the one entry per node a walk writes.
 */
export class LabelCache {
  /** Per-family byte buffers of `renderClusterText`, reused from scrape to scrape. */
  readonly writers = new Map<string, LineWriter>();
  /**
   * `renderClusterText`'s bytes of each node's fixed samples, by family writer, kept while
   * the node's memo is (a changed node gets a new memo, and renders again).
   */
  readonly fixedBlocks = new WeakMap<NodeMemo, readonly (readonly [LineWriter, Buffer])[]>();
  #previousNodes = new Map<string, NodeMemo>();
  #currentNodes = new Map<string, NodeMemo>();

  /** Starts a scrape: nodes not walked since the last `begin()` are dropped. */
  begin(): void {
    this.#previousNodes = this.#currentNodes;
    this.#currentNodes = new Map();
  }

  /**
   * The label set `key` (node `id` itself, or one of its GPUs' keys) had in the node's last
   * memo, or `make()` (frozen and rendered): a node whose fixed fields changed keeps the label
   * sets that did not, and the lines rendered with them.
   */
  labels(id: string, key: string, make: () => Record<string, string>): CachedLabels {
    const old = this.#currentNodes.get(id) ?? this.#previousNodes.get(id);
    if (old !== undefined) {
      if (key === id) return old.labels;
      const g = old.gpuKeys.indexOf(key);
      if (g >= 0) return old.gpuLabels[g] as CachedLabels;
    }
    const labels = Object.freeze(make());
    return { labels, text: formatLabelPairs(labels), lines: new Map() };
  }

  /**
   * The memo of the node with bounded id `id` from the previous walk if `node` still agrees
   * with it apart from readings (then with `node` as its view, same identity otherwise),
   * else `undefined`; nothing is remembered until {@link keepNode}.
   */
  node(id: string, node: NodeView, labelValueMaxLength: number): NodeMemo | undefined {
    const memo = this.#currentNodes.get(id) ?? this.#previousNodes.get(id);
    if (
      memo === undefined ||
      memo.labelValueMaxLength !== labelValueMaxLength ||
      !sameApartFromReadings(memo.node, node)
    ) {
      return undefined;
    }
    // Keep the newest view: the next walk compares with it (same fixed fields, by the check).
    (memo as { node: NodeView }).node = node;
    return memo;
  }

  /** Remembers `memo` for the next walk, and with it its label sets. */
  keepNode(memo: NodeMemo): void {
    this.#currentNodes.set(memo.id, memo);
  }

  /** Label sets held: each node's and its GPUs' (for tests). */
  get size(): number {
    let n = 0;
    for (const memo of this.#currentNodes.values()) n += 1 + memo.gpuLabels.length;
    return n;
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
  /**
   * Optional: called before each node's fixed samples (every sample of the node's and its
   * GPUs' and ports' families but the readings of {@link READING_FIELDS}). `unchanged`: the
   * node's fixed fields are as in the previous walk over the same {@link LabelCache}, and
   * `memo` is then the very object of that walk. Return true to skip them (the sink writes
   * what it kept from an earlier walk itself); otherwise they follow, then
   * {@link fixedSamplesEnd}.
   */
  fixedSamples?(memo: NodeMemo, unchanged: boolean): boolean;
  /** Optional: the node's fixed samples announced by {@link fixedSamples} are all handed over. */
  fixedSamplesEnd?(memo: NodeMemo): void;
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
 * sample to `sink`, node by node (within a family, samples come in node order, then GPU
 * order): first each node's fixed samples, then its readings ({@link READING_FIELDS}).
 * Readings that are absent, non-finite or negative produce no sample; label values are
 * bounded to `labelValueMaxLength`. Both {@link buildClusterSeries} (prom-client path) and
 * `renderClusterText` (direct text path) are sinks over this walk. `cache` remembers what
 * each node's fixed fields gave ({@link NodeMemo}) for the next walk, so a sink with
 * {@link SeriesSink.fixedSamples} can skip an unchanged node's fixed samples.
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

/** Derives a node's {@link NodeMemo} from its fixed fields. */
function nodeMemo(
  node: NodeView,
  id: string,
  labelValueMaxLength: number,
  cache: LabelCache,
  b: (v: unknown) => string,
): NodeMemo {
  const gpuClasses = node.gpus.map((gpu) => b(gpu.gpuClass));
  const fabrics = (
    node.fabrics.length > 0 ? node.fabrics : [{ id: "none", linkLayer: "none" }]
  ).map((f) => ({ id: b(f.id), linkLayer: b(f.linkLayer) }));
  const gpuKeys = node.gpus.map((gpu, g) => `${id}\u0000${gpu.index}\u0000${gpuClasses[g]}`);
  return {
    node,
    labelValueMaxLength,
    id,
    labels: cache.labels(id, id, () => ({ node: id })),
    gpuLabels: node.gpus.map((gpu, g) =>
      cache.labels(id, gpuKeys[g] as string, () => ({
        node: id,
        gpu: String(gpu.index),
        gpu_class: gpuClasses[g] as string,
      })),
    ),
    gpuKeys,
    gpuClasses,
    fabrics,
    fabricKeys: gpuClasses.map((gpuClass) => fabrics.map((f) => `${f.id}\u0000${gpuClass}`)),
    // A state outside the union (a newer control plane) counts as not up, never as ready.
    state: (NODE_STATES as readonly string[]).includes(node.state)
      ? (node.state as NodeMemo["state"])
      : "lost",
    agentVersion: b(node.agentVersion),
  };
}

/** A node's fixed samples: all of its, its GPUs' and its ports' but the readings. */
function nodeFixedSeries(
  node: NodeView,
  memo: NodeMemo,
  nodeClasses: ReadonlyMap<string, number>,
  b: (v: unknown) => string,
  sink: SeriesSink,
): void {
  const { id, labels: nodeLabels, state } = memo;
  sink.shared(
    "llmgw_node_info",
    nodeLabels,
    {
      hostname: b(node.hostname),
      agent_version: memo.agentVersion,
      simulated: String(node.simulated === true),
    },
    1,
  );
  sink.shared("llmgw_node_up", nodeLabels, NO_LABELS, state === "ready" ? 1 : 0);
  for (const s of NODE_STATES)
    sink.shared(
      "llmgw_node_state",
      nodeLabels,
      NODE_STATE_LABELS[s] ?? { state: s },
      s === state ? 1 : 0,
    );
  sink.shared("llmgw_node_healthy", nodeLabels, NO_LABELS, flag(node.healthy));
  sink.shared("llmgw_node_cordoned", nodeLabels, NO_LABELS, flag(node.cordoned));
  sink.shared("llmgw_node_draining", nodeLabels, NO_LABELS, flag(node.draining));
  node.gpus.forEach((gpu, g) => {
    const labels = memo.gpuLabels[g] as CachedLabels;
    sink.shared(
      "llmgw_gpu_info",
      labels,
      { uuid: b(gpu.uuid), name: b(gpu.name), mig: String(gpu.mig === true) },
      1,
    );
    if (nonNegative(gpu.memoryTotalBytes))
      sink.shared("llmgw_gpu_memory_total_bytes", labels, NO_LABELS, gpu.memoryTotalBytes);
    sink.shared("llmgw_gpu_healthy", labels, NO_LABELS, flag(gpu.healthy));
    for (const code of new Set(gpu.healthProblems ?? []))
      sink.plain(
        "llmgw_gpu_health_problem",
        { node: id, gpu: String(gpu.index), code: b(code) },
        1,
      );
    for (const f of gpu.faultsSeen ?? []) {
      if (!nonNegative(f.count)) continue;
      sink.plain(
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
      sink.shared("llmgw_gpu_allocation", labels, { deployment: b(gpu.allocatedDeployment) }, 1);
    }
  });
  for (const p of node.ports ?? []) {
    if (typeof p.healthy !== "boolean") continue;
    sink.plain(
      "llmgw_port_healthy",
      { node: id, device: b(p.device), port: String(p.port) },
      flag(p.healthy),
    );
  }
  for (const [gpuClass, count] of nodeClasses)
    sink.shared("llmgw_node_gpus", nodeLabels, { gpu_class: gpuClass }, count);
}

/**
 * A node's samples of {@link READING_FIELDS}: what moves with every heartbeat. Absent,
 * non-finite or negative (temperature: non-finite) readings have no sample.
 */
function nodeReadingSeries(node: NodeView, memo: NodeMemo, sink: SeriesSink): void {
  if (nonNegative(node.lastHeartbeatUnixMs)) {
    sink.shared(
      "llmgw_node_last_heartbeat_timestamp_seconds",
      memo.labels,
      NO_LABELS,
      node.lastHeartbeatUnixMs / 1000,
    );
  }
  // Family by family (each in GPU order, as always), so that a sink sees each family's lines
  // of the node in one run.
  const gpus: readonly (GpuReadingView | undefined)[] = node.gpuReadings ?? node.gpus;
  const labels = memo.gpuLabels as readonly CachedLabels[];
  for (let g = 0; g < labels.length; g++) {
    const v = gpus[g]?.memoryUsedBytes;
    if (nonNegative(v))
      sink.shared("llmgw_gpu_memory_used_bytes", labels[g] as CachedLabels, NO_LABELS, v);
  }
  for (let g = 0; g < labels.length; g++) {
    const v = gpus[g]?.utilizationPercent;
    if (nonNegative(v))
      sink.shared("llmgw_gpu_utilization_ratio", labels[g] as CachedLabels, NO_LABELS, v / 100);
  }
  for (let g = 0; g < labels.length; g++) {
    const v = gpus[g]?.eccUncorrectedErrors;
    if (nonNegative(v))
      sink.shared("llmgw_gpu_ecc_uncorrected_errors", labels[g] as CachedLabels, NO_LABELS, v);
  }
  for (let g = 0; g < labels.length; g++) {
    const v = gpus[g]?.temperatureCelsius;
    if (finite(v))
      sink.shared("llmgw_gpu_temperature_celsius", labels[g] as CachedLabels, NO_LABELS, v);
  }
  for (let g = 0; g < labels.length; g++) {
    const v = gpus[g]?.powerWatts;
    if (nonNegative(v))
      sink.shared("llmgw_gpu_power_watts", labels[g] as CachedLabels, NO_LABELS, v);
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
    let memo = cache.node(id, node, labelValueMaxLength);
    const unchanged = memo !== undefined;
    memo ??= nodeMemo(node, id, labelValueMaxLength, cache, b);
    cache.keepNode(memo);
    const { state, agentVersion, fabrics, fabricKeys, gpuClasses } = memo;
    nodeStates.set(state, (nodeStates.get(state) ?? 0) + 1);
    agentVersions.set(agentVersion, (agentVersions.get(agentVersion) ?? 0) + 1);
    const nodeClasses = new Map<string, number>();
    node.gpus.forEach((gpu, g) => {
      const gpuClass = gpuClasses[g] as string;
      nodeClasses.set(gpuClass, (nodeClasses.get(gpuClass) ?? 0) + 1);
      const cap = gpuCapacityState(node, gpu);
      let byState = clusterGpus.get(gpuClass);
      if (byState === undefined) {
        byState = new Map(GPU_STATES.map((s) => [s, 0]));
        clusterGpus.set(gpuClass, byState);
      }
      byState.set(cap, (byState.get(cap) ?? 0) + 1);
      const keys = fabricKeys[g] as readonly string[];
      for (let f = 0; f < fabrics.length; f++) {
        const fabric = fabrics[f] as NodeMemo["fabrics"][number];
        const key = keys[f] as string;
        let entry = fabricGpus.get(key);
        if (entry === undefined) {
          entry = {
            fabric: fabric.id,
            linkLayer: fabric.linkLayer,
            gpuClass,
            counts: new Map(GPU_STATES.map((s) => [s, 0])),
            nodes: 0,
          };
          fabricGpus.set(key, entry);
        }
        entry.counts.set(cap, (entry.counts.get(cap) ?? 0) + 1);
      }
    });
    for (const gpuClass of nodeClasses.keys()) {
      for (const fabric of fabrics) {
        const entry = fabricGpus.get(`${fabric.id}\u0000${gpuClass}`);
        if (entry !== undefined) entry.nodes += 1;
      }
    }
    if (sink.fixedSamples?.(memo, unchanged) !== true) {
      nodeFixedSeries(node, memo, nodeClasses, b, sink);
      sink.fixedSamplesEnd?.(memo);
    }
    nodeReadingSeries(node, memo, sink);
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
    push("llmgw_deployment_invalid", { deployment: name }, flag(d.invalid === true));
  }
  const leaving = new Map<string, { waiting: number; draining: number }>();
  for (const r of replicas) {
    const deployment = b(r.deployment);
    const m = countsFor(deployment);
    const state = (REPLICA_STATES as readonly string[]).includes(r.state) ? r.state : "unknown";
    m.set(state, (m.get(state) ?? 0) + 1);
    let l = leaving.get(deployment);
    if (l === undefined) {
      l = { waiting: 0, draining: 0 };
      leaving.set(deployment, l);
    }
    if (r.leaving !== undefined) l[r.leaving] += 1;
  }
  for (const [deployment, m] of replicaCounts) {
    for (const [state, count] of m) push("llmgw_replicas", { deployment, state }, count);
    const l = leaving.get(deployment) ?? { waiting: 0, draining: 0 };
    push("llmgw_replicas_leaving", { deployment, phase: "waiting" }, l.waiting);
    push("llmgw_replicas_leaving", { deployment, phase: "draining" }, l.draining);
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
