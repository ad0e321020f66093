/**
 * The placement function: nodes + deployments + current placements → a plan with reasons.
 * Pure and deterministic: every input list is sorted by id before use, and every choice ends
 * in a tie-break on ids, so shuffled input yields the identical plan.
 */

import { SchedulerError } from "./errors.js";
import { buildNvlinkMatrix, type NvlinkMatrix, selectGpus } from "./gpu-selection.js";
import type { RemovalReasonCode, UnschedulableReasonCode } from "./reasons.js";
import type {
  Placement,
  PlacementRank,
  PlacementRemoval,
  Reason,
  ScheduleInput,
  ScheduleResult,
  SchedulerDeployment,
  SchedulerGpu,
  SchedulerNode,
  UnschedulableDeployment,
} from "./types.js";

/** One placement tracked during a run: kept from the input or added by this run. */
interface ReplicaRecord {
  readonly placement: Placement;
  readonly priority: number;
  /** Index into the deployment's replica numbering, for "newest first" on scale-down. */
  readonly ordinal: number;
}

/**
 * What a run derives from one {@link SchedulerNode} that does not depend on placements, nor on
 * the node's id: nodes of one layout (the same `gpus` and `fabrics` arrays, both ready or
 * both not) share one. Cached per node object (inputs are readonly), so a re-plan that passes
 * the same node objects again skips even the lookup: that is most of what makes the
 * incremental re-plan cheap; and per layout, so a plan over thousands of fresh node objects
 * (a control plane starting) derives each layout once, where the caller shares the arrays.
 */
interface NodeInfo {
  /** Ready, not cordoned, not draining: may receive new replicas. */
  readonly schedulable: boolean;
  readonly fabrics: readonly string[];
  /** GPU index → class, for GPUs that are healthy, not MIG and of a known class. */
  readonly usableClass: ReadonlyMap<number, string>;
  /** Class → usable GPU indices, ascending. */
  readonly usableByClass: ReadonlyMap<string, readonly number[]>;
  /** Every GPU of the node by index, usable or not. */
  readonly gpuByIndex: ReadonlyMap<number, SchedulerGpu>;
  /** Class → counts over all GPUs of the class on this node. */
  readonly classCounts: ReadonlyMap<string, ClassStats>;
  /** Class → keys of the free-count histograms the node is counted in (class, class on fabric). */
  readonly histogramKeys: ReadonlyMap<string, readonly string[]>;
  /** The entries of {@link classCounts}, {@link usableByClass} and {@link histogramKeys} as
   * arrays: the per-run loops over every node walk these without iterator allocations. */
  readonly countedPools: readonly string[];
  readonly countedStats: readonly ClassStats[];
  readonly usablePools: readonly string[];
  readonly histogramPools: readonly string[];
  readonly histogramKeyLists: readonly (readonly string[])[];
}

const nodeInfoCache = new WeakMap<SchedulerNode, NodeInfo>();
/** `gpus` → `fabrics` → [info when schedulable, info when not]. */
const layoutCache = new WeakMap<
  readonly SchedulerGpu[],
  WeakMap<readonly string[], [NodeInfo | undefined, NodeInfo | undefined]>
>();
/** A node's `nvlinks` list → its matrix, built on first use and shared by nodes that share the list. */
const nvlinkCache = new WeakMap<object, NvlinkMatrix>();
const NO_NVLINKS: readonly never[] = [];

/** Mutable per-node view during one run; the maps are created on first write. */
interface NodeState {
  readonly info: NodeInfo;
  /** Position in the id-sorted node list. */
  readonly ordinal: number;
  readonly node: SchedulerNode;
  readonly id: string;
  readonly schedulable: boolean;
  readonly fabrics: readonly string[];
  readonly usableClass: ReadonlyMap<number, string>;
  /** Class → free usable GPU indices; a class not in the map has all its usable GPUs free. */
  free: Map<string, Set<number>> | undefined;
  /** Placements with a rank on this node. */
  replicas: Set<ReplicaRecord> | undefined;
  /** GPU index → the kept placement that claimed it first (duplicate claims are removed). */
  claimedBy: Map<number, string> | undefined;
  /** Deployment name → number of its replicas with a rank here. */
  perDeployment: Map<string, number> | undefined;
  /** Deployments whose engines failed here lately (`ScheduleInput.avoid`): placed here last. */
  avoided: Set<string> | undefined;
}

/**
 * Added to a node's spread for a deployment that avoids it: more than any real count of
 * replicas, so every node not avoided comes first, and among avoided nodes spread still counts.
 */
const AVOIDED = 1_000_000;

/** 1 when a node of `candidate` is one `deployment` avoids, else 0: compared before its score. */
function avoids(deployment: SchedulerDeployment, candidate: Candidate): number {
  return candidate.nodes.some((n) => n.avoided?.has(deployment.name) === true) ? 1 : 0;
}

/** How many replicas of `deployment` `node` carries, plus {@link AVOIDED} where it avoids it. */
function spreadOf(node: NodeState, deployment: string): number {
  const count = node.perDeployment?.get(deployment) ?? 0;
  return node.avoided?.has(deployment) === true ? count + AVOIDED : count;
}

/** The shape of one replica: how many nodes and GPUs per node. */
interface Shape {
  readonly nodes: number;
  readonly perNode: number;
}

/** A place found for a replica, before GPUs are chosen. */
interface Candidate {
  readonly gpuClass: string | undefined;
  readonly nodes: readonly NodeState[];
  readonly perNode: number;
  readonly fabricId: string | undefined;
  /** Lexicographic score; lower is better. */
  readonly score: readonly number[];
}

const byString = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0);

function compareScores(a: readonly number[], b: readonly number[]): number {
  for (let i = 0; i < Math.max(a.length, b.length); i++) {
    const d = (a[i] ?? 0) - (b[i] ?? 0);
    if (d !== 0) return d;
  }
  return 0;
}

function reason(code: RemovalReasonCode | UnschedulableReasonCode, message: string): Reason {
  return { code, message };
}

function plural(n: number, word: string): string {
  return `${n} ${word}${n === 1 ? "" : "s"}`;
}

/**
 * Plans placements. Returns what to add, what to remove (each with a reason) and, for every
 * deployment short of replicas, how many are missing and why.
 *
 * Rules (see the package README for the full list): existing placements stay unless a cause
 * removes them (node lost or gone, GPU unusable, node draining, deployment deleted or at a new
 * revision, scale-down, preemption); unreachable nodes keep their replicas; new replicas go only
 * on ready, uncordoned, non-draining nodes and healthy non-MIG GPUs; higher priority is placed
 * first, then larger replicas; a replica that fits one node stays on one node, a larger one is
 * gang-placed on one fabric and one class; replicas spread over nodes, then best-fit packing.
 *
 * @throws SchedulerError `LLMGW_SCHEDULER_INVALID_INPUT` for duplicate node ids, GPU indices,
 *   deployment names or replica ids, and for counts that are not non-negative integers.
 */
export function schedule(input: ScheduleInput): ScheduleResult {
  validateInput(input);
  const sortedNodes = sortedBy(input.nodes, nodeId);
  const nodes: NodeState[] = new Array(sortedNodes.length);
  const nodeById = new Map<string, NodeState>();
  for (let i = 0; i < sortedNodes.length; i++) {
    const state = buildNodeState(sortedNodes[i] as SchedulerNode, i);
    nodes[i] = state;
    nodeById.set(state.id, state);
  }
  const deployments = sortedBy(input.deployments, deploymentName);
  const deploymentByName = new Map<string, SchedulerDeployment>();
  for (const d of deployments) deploymentByName.set(d.name, d);
  const placements = sortedBy(input.placements, replicaIdOf);
  for (const a of input.avoid ?? []) {
    const node = nodeById.get(a.nodeId);
    if (node === undefined) continue;
    node.avoided ??= new Set();
    node.avoided.add(a.deployment);
  }
  /** Replica id → why it is moved if it can be (`ScheduleInput.failing`). */
  const failing = new Map<string, string>();
  for (const f of input.failing ?? []) failing.set(f.replicaId, f.message);
  /** Replica id → how far it is from serving: 2 failed, 1 not ready (`ScheduleInput.notServing`). */
  const notServing = new Map<string, number>();
  for (const r of input.notServing ?? []) notServing.set(r.replicaId, r.failed ? 2 : 1);
  const context = buildContext(nodes);
  const remove: PlacementRemoval[] = [];
  const add: Placement[] = [];
  /** Deployment name → its live records (kept or added). */
  const live = new Map<string, Set<ReplicaRecord>>();
  /** Deployment name → replica ids that must not be reused in this plan. */
  const usedIds = new Map<string, Set<string>>();

  const useId = (deployment: string, replicaId: string): void => {
    let ids = usedIds.get(deployment);
    if (ids === undefined) {
      ids = new Set();
      usedIds.set(deployment, ids);
    }
    ids.add(replicaId);
  };
  const liveOf = (deployment: string): Set<ReplicaRecord> => {
    let set = live.get(deployment);
    if (set === undefined) {
      set = new Set();
      live.set(deployment, set);
    }
    return set;
  };
  const allocate = (record: ReplicaRecord): void => {
    liveOf(record.placement.deployment).add(record);
    for (const rank of record.placement.ranks) {
      const node = nodeById.get(rank.nodeId);
      if (node === undefined) continue;
      changeFree(context, node, rank.gpuIndices, true);
      node.replicas ??= new Set();
      if (!node.replicas.has(record)) {
        node.replicas.add(record);
        const name = record.placement.deployment;
        node.perDeployment ??= new Map();
        node.perDeployment.set(name, (node.perDeployment.get(name) ?? 0) + 1);
      }
    }
  };
  const release = (record: ReplicaRecord): void => {
    live.get(record.placement.deployment)?.delete(record);
    for (const rank of record.placement.ranks) {
      const node = nodeById.get(rank.nodeId);
      if (node === undefined) continue;
      changeFree(context, node, rank.gpuIndices, false);
      if (node.replicas?.delete(record) === true) {
        const name = record.placement.deployment;
        node.perDeployment?.set(name, (node.perDeployment.get(name) ?? 1) - 1);
      }
    }
  };
  const removeRecord = (record: ReplicaRecord, why: Reason): void => {
    release(record);
    remove.push({
      replicaId: record.placement.replicaId,
      deployment: record.placement.deployment,
      reason: why,
    });
  };

  // 1. Existing placements: keep unless a cause removes them; a new revision of the same
  // shape keeps them at that revision.
  const revised = new Map<string, Placement>();
  for (const stored of placements) {
    useId(stored.deployment, stored.replicaId);
    const why = removalCause(stored, deploymentByName, nodeById);
    if (why !== undefined) {
      remove.push({
        replicaId: stored.replicaId,
        deployment: stored.deployment,
        reason: why,
      });
      continue;
    }
    const revision = deploymentByName.get(stored.deployment)?.revision ?? stored.revision;
    const placement = revision === stored.revision ? stored : { ...stored, revision };
    if (placement !== stored) revised.set(placement.replicaId, placement);
    for (const rank of placement.ranks) {
      const node = nodeById.get(rank.nodeId);
      if (node === undefined) continue;
      node.claimedBy ??= new Map();
      for (const gpu of rank.gpuIndices) node.claimedBy.set(gpu, placement.replicaId);
    }
    const deployment = deploymentByName.get(placement.deployment);
    allocate({
      placement,
      priority: deployment?.priority ?? 0,
      ordinal: ordinalOf(placement.deployment, placement.replicaId),
    });
  }

  for (const r of input.retired ?? []) useId(r.deployment, r.replicaId);
  // Held placements keep their GPUs until the control plane lets them go; only a loss
  // removes one here.
  for (const held of sortedBy(input.held ?? [], replicaIdOf)) {
    useId(held.deployment, held.replicaId);
    const why = removalCause(held, undefined, nodeById);
    if (why !== undefined) {
      remove.push({ replicaId: held.replicaId, deployment: held.deployment, reason: why });
      continue;
    }
    for (const rank of held.ranks) {
      const node = nodeById.get(rank.nodeId);
      if (node === undefined) continue;
      node.claimedBy ??= new Map();
      for (const gpu of rank.gpuIndices) node.claimedBy.set(gpu, held.replicaId);
      changeFree(context, node, rank.gpuIndices, true);
    }
  }

  // 2. Scale-down: drop the surplus whose removal frees the most useful capacity.
  for (const deployment of deployments) {
    const records = liveOf(deployment.name);
    while (records.size > deployment.replicas) {
      const victim = [...records].sort((a, b) =>
        compareScores(
          scaleDownScore(a, nodeById, failing, notServing),
          scaleDownScore(b, nodeById, failing, notServing),
        ),
      )[0];
      if (victim === undefined) break;
      removeRecord(
        victim,
        reason(
          "scale-down",
          `deployment ${deployment.name} scaled to ${plural(deployment.replicas, "replica")}; ${records.size} running`,
        ),
      );
    }
  }

  indexFree(context);

  // 3. Place missing replicas: higher priority first, then larger replicas, then by name.
  const order = [...deployments].sort(
    (a, b) =>
      b.priority - a.priority || b.gpusPerReplica - a.gpusPerReplica || byString(a.name, b.name),
  );
  const failures = new Map<string, readonly Reason[]>();
  let retry = false;
  const placeOne = (deployment: SchedulerDeployment, candidate: Candidate): void => {
    const placement = commit(deployment, candidate, usedIds);
    useId(deployment.name, placement.replicaId);
    add.push(placement);
    allocate({
      placement,
      priority: deployment.priority,
      ordinal: ordinalOf(deployment.name, placement.replicaId),
    });
  };
  for (const deployment of order) {
    const records = liveOf(deployment.name);
    while (records.size < deployment.replicas) {
      const planned = planReplica(deployment, context);
      let candidate = planned.candidate;
      if (candidate === undefined && planned.shapes.length > 0 && deployment.allowPreemption) {
        const eviction = planPreemption(deployment, planned.shapes, context);
        if (eviction === undefined) {
          failures.set(deployment.name, [
            ...planned.reasons,
            reason(
              "preemption-insufficient",
              `preempting every replica with priority below ${deployment.priority} would still not make room`,
            ),
          ]);
          break;
        }
        for (const victim of eviction.victims) {
          removeRecord(
            victim,
            reason(
              "preempted",
              `preempted by deployment ${deployment.name} (priority ${deployment.priority} > ${victim.priority}) to free ${eviction.describe}`,
            ),
          );
        }
        retry = true;
        candidate = planReplica(deployment, context).candidate;
      }
      if (candidate === undefined) {
        failures.set(deployment.name, planned.reasons);
        break;
      }
      placeOne(deployment, candidate);
    }
  }

  // A preemptor evicts whole replicas and may free more than it takes; deployments earlier in
  // the order (same priority, or the victims' own) get another try at what is left, until
  // nothing more fits. Without this a second run would place them: the plan must be final.
  while (retry) {
    retry = false;
    for (const deployment of order) {
      const records = liveOf(deployment.name);
      while (records.size < deployment.replicas) {
        const planned = planReplica(deployment, context);
        if (planned.candidate === undefined) {
          const insufficient = (failures.get(deployment.name) ?? []).filter(
            (r) => r.code === "preemption-insufficient",
          );
          failures.set(deployment.name, [...planned.reasons, ...insufficient]);
          break;
        }
        placeOne(deployment, planned.candidate);
        retry = true;
      }
    }
  }

  // 4. Replicas that keep failing where they are move when their deployment fits on a node it
  // does not avoid; where it does not, they stay (moving back onto the same node would only
  // restart the agent's backoff). Never by preemption.
  for (const stored of failing.size === 0 ? [] : placements) {
    const why = failing.get(stored.replicaId);
    if (why === undefined) continue;
    const deployment = deploymentByName.get(stored.deployment);
    let record: ReplicaRecord | undefined;
    for (const r of liveOf(stored.deployment))
      if (r.placement.replicaId === stored.replicaId) record = r;
    if (deployment === undefined || record === undefined) continue;
    // Planned without it: a gang may keep the nodes of its ranks that did not fail, and its
    // GPUs there (removals are carried out before additions, as for a revision change).
    release(record);
    const candidate = planReplica(deployment, context).candidate;
    allocate(record);
    if (candidate === undefined || avoids(deployment, candidate) === 1) continue;
    removeRecord(record, reason("replica-failed", why));
    placeOne(deployment, candidate);
  }

  const unschedulable: UnschedulableDeployment[] = [];
  for (const deployment of order) {
    const missing = deployment.replicas - liveOf(deployment.name).size;
    if (missing > 0) {
      unschedulable.push({
        deployment: deployment.name,
        missingReplicas: missing,
        reasons: failures.get(deployment.name) ?? [],
      });
    }
  }

  for (const r of remove) revised.delete(r.replicaId);
  return {
    add: add.sort((a, b) => byString(a.replicaId, b.replicaId)),
    remove: remove.sort((a, b) => byString(a.replicaId, b.replicaId)),
    revised: [...revised.values()],
    unschedulable: unschedulable.sort((a, b) => byString(a.deployment, b.deployment)),
  };
}

const nodeId = (n: SchedulerNode): string => n.id;
const deploymentName = (d: SchedulerDeployment): string => d.name;
const replicaIdOf = (p: Placement): string => p.replicaId;

/** Whether the keys of `items` strictly ascend: then they are unique and already sorted. */
function strictlyAscending<T>(items: readonly T[], key: (item: T) => string): boolean {
  for (let i = 1; i < items.length; i++) {
    if (!(key(items[i - 1] as T) < key(items[i] as T))) return false;
  }
  return true;
}

/**
 * `items` sorted by `key` (unique, checked by {@link validateInput}). The control plane passes
 * its lists already sorted: an O(n) check then spares the copy and the sort.
 */
function sortedBy<T>(items: readonly T[], key: (item: T) => string): readonly T[] {
  if (strictlyAscending(items, key)) return items;
  return [...items].sort((a, b) => byString(key(a), key(b)));
}

/** The first key of `items` seen twice, in input order. */
function firstDuplicate<T>(items: readonly T[], key: (item: T) => string): string | undefined {
  if (strictlyAscending(items, key)) return undefined;
  const seen = new Set<string>();
  for (const item of items) {
    const k = key(item);
    if (seen.has(k)) return k;
    seen.add(k);
  }
  return undefined;
}

function validateInput(input: ScheduleInput): void {
  const fail = (message: string): never => {
    throw new SchedulerError("LLMGW_SCHEDULER_INVALID_INPUT", message);
  };
  const isCount = (v: number, min: number): boolean => Number.isInteger(v) && v >= min;
  const nodeDuplicate = firstDuplicate(input.nodes, nodeId);
  if (nodeDuplicate !== undefined) fail(`duplicate node id ${JSON.stringify(nodeDuplicate)}`);
  // Deployments are checked in input order, so a duplicate name is reported before a bad
  // count of a later deployment, as before.
  const names = strictlyAscending(input.deployments, deploymentName)
    ? undefined
    : new Set<string>();
  for (const d of input.deployments) {
    if (names !== undefined) {
      if (names.has(d.name)) fail(`duplicate deployment name ${JSON.stringify(d.name)}`);
      names.add(d.name);
    }
    if (!isCount(d.gpusPerReplica, 0)) {
      fail(`deployment ${d.name}: gpusPerReplica must be an integer ≥ 0, got ${d.gpusPerReplica}`);
    }
    if (!isCount(d.replicas, 0)) {
      fail(`deployment ${d.name}: replicas must be an integer ≥ 0, got ${d.replicas}`);
    }
    if (d.nodesPerReplica !== undefined && !isCount(d.nodesPerReplica, 1)) {
      fail(
        `deployment ${d.name}: nodesPerReplica must be an integer ≥ 1, got ${d.nodesPerReplica}`,
      );
    }
    if (!Number.isFinite(d.priority)) {
      fail(`deployment ${d.name}: priority must be a finite number, got ${d.priority}`);
    }
  }
  const replicaDuplicate = firstDuplicate(
    input.held === undefined || input.held.length === 0
      ? input.placements
      : [...input.placements, ...input.held],
    replicaIdOf,
  );
  if (replicaDuplicate !== undefined)
    fail(`duplicate replica id ${JSON.stringify(replicaDuplicate)}`);
}

function buildNodeInfo(node: SchedulerNode): NodeInfo {
  const cached = nodeInfoCache.get(node);
  if (cached !== undefined) return cached;
  const schedulable = node.state === "ready" && !node.cordoned && !node.draining;
  let byFabrics = layoutCache.get(node.gpus);
  if (byFabrics === undefined) {
    byFabrics = new WeakMap();
    layoutCache.set(node.gpus, byFabrics);
  }
  let pair = byFabrics.get(node.fabrics);
  if (pair === undefined) {
    pair = [undefined, undefined];
    byFabrics.set(node.fabrics, pair);
  }
  const slot = schedulable ? 0 : 1;
  const info = pair[slot] ?? deriveNodeInfo(node, schedulable);
  pair[slot] = info;
  nodeInfoCache.set(node, info);
  return info;
}

/** The {@link NodeInfo} of `node`'s layout; throws on a duplicate GPU index. */
function deriveNodeInfo(node: SchedulerNode, schedulable: boolean): NodeInfo {
  const usableClass = new Map<number, string>();
  const usableByClass = new Map<string, number[]>();
  const gpuByIndex = new Map<number, SchedulerGpu>();
  const classCounts = new Map<string, ClassStats>();
  for (const gpu of node.gpus) {
    if (gpuByIndex.has(gpu.index)) {
      throw new SchedulerError(
        "LLMGW_SCHEDULER_INVALID_INPUT",
        `node ${node.id}: duplicate GPU index ${gpu.index}`,
      );
    }
    gpuByIndex.set(gpu.index, gpu);
    if (gpu.gpuClass === undefined) continue;
    // Pools never mix vendors: every GPU of a replica, on every rank, comes from one pool.
    const pool = poolOf(gpu.gpuClass, gpu.vendor);
    let stats = classCounts.get(pool);
    if (stats === undefined) {
      stats = { total: 0, unhealthy: 0, mig: 0, onUnschedulable: 0 };
      classCounts.set(pool, stats);
    }
    stats.total++;
    if (!gpu.healthy) stats.unhealthy++;
    else if (gpu.migEnabled) stats.mig++;
    else if (!schedulable) stats.onUnschedulable++;
    if (!gpu.healthy || gpu.migEnabled) continue;
    usableClass.set(gpu.index, pool);
    let list = usableByClass.get(pool);
    if (list === undefined) {
      list = [];
      usableByClass.set(pool, list);
    }
    list.push(gpu.index);
  }
  for (const list of usableByClass.values()) list.sort((x, y) => x - y);
  const fabrics =
    node.fabrics.length === 1 ? node.fabrics : [...new Set(node.fabrics)].sort(byString);
  const histogramKeys = new Map<string, string[]>();
  const histogramKeyLists: string[][] = [];
  if (schedulable) {
    for (const cls of usableByClass.keys()) {
      const keys = [cls];
      for (const f of fabrics) keys.push(fabricKey(cls, f));
      histogramKeys.set(cls, keys);
      histogramKeyLists.push(keys);
    }
  }
  return {
    schedulable,
    fabrics,
    usableClass,
    usableByClass,
    gpuByIndex,
    classCounts,
    histogramKeys,
    countedPools: [...classCounts.keys()],
    countedStats: [...classCounts.values()],
    usablePools: [...usableByClass.keys()],
    histogramPools: [...histogramKeys.keys()],
    histogramKeyLists,
  };
}

/** The NVLink matrix of `node`, shared by every node with the same `nvlinks` list. */
function nvlinkOf(node: SchedulerNode): NvlinkMatrix {
  const key = node.nvlinks ?? NO_NVLINKS;
  let matrix = nvlinkCache.get(key);
  if (matrix === undefined) {
    matrix = buildNvlinkMatrix(key);
    nvlinkCache.set(key, matrix);
  }
  return matrix;
}

/** `${pool} ${fabric}` → the one string for it, so that nodes share their histogram keys. */
const fabricKeys = new Map<string, Map<string, string>>();

/** The histogram key of `pool` on `fabric` (see {@link PlacementContext.freeLists}). */
function fabricKey(pool: string, fabric: string): string {
  let byFabric = fabricKeys.get(pool);
  if (byFabric === undefined) {
    // Bounded: pools × fabrics is small, but a long-lived caller should not grow it forever.
    if (fabricKeys.size > 1_000) fabricKeys.clear();
    byFabric = new Map();
    fabricKeys.set(pool, byFabric);
  }
  let key = byFabric.get(fabric);
  if (key === undefined) {
    if (byFabric.size > 1_000) byFabric.clear();
    key = `${pool} ${fabric}`;
    byFabric.set(fabric, key);
  }
  return key;
}

/**
 * The pool a GPU is placed from: its class, qualified by vendor when that is not NVIDIA
 * (`mi300x-192g (amd)`), so that a replica never spans two vendors even where two vendors'
 * GPUs share a class name. NVIDIA (and absent, from older agents) keeps the bare class, so
 * messages about NVIDIA GPUs read as before.
 */
function poolOf(gpuClass: string, vendor: SchedulerGpu["vendor"]): string {
  return vendor === undefined || vendor === "nvidia" ? gpuClass : `${gpuClass} (${vendor})`;
}

/** The class of a pool (see {@link poolOf}). */
function classOfPool(pool: string): string {
  const at = pool.lastIndexOf(" (");
  return at < 0 ? pool : pool.slice(0, at);
}

function buildNodeState(node: SchedulerNode, ordinal: number): NodeState {
  const info = buildNodeInfo(node);
  return {
    info,
    ordinal,
    node,
    id: node.id,
    schedulable: info.schedulable,
    fabrics: info.fabrics,
    usableClass: info.usableClass,
    free: undefined,
    replicas: undefined,
    claimedBy: undefined,
    perDeployment: undefined,
    avoided: undefined,
  };
}

/** The free set of `cls` on `node`, materialized from the usable GPUs on first use. */
function freeSet(node: NodeState, cls: string): Set<number> | undefined {
  let set = node.free?.get(cls);
  if (set !== undefined) return set;
  const usable = node.info.usableByClass.get(cls);
  if (usable === undefined) return undefined;
  set = new Set(usable);
  node.free ??= new Map();
  node.free.set(cls, set);
  return set;
}

/** The n of `${deployment}-${n}`, or -1 when the id does not follow the pattern. */
function ordinalOf(deployment: string, replicaId: string): number {
  const at = deployment.length + 1;
  if (
    replicaId.length <= at ||
    replicaId.charCodeAt(at - 1) !== 45 /* - */ ||
    !replicaId.startsWith(deployment)
  ) {
    return -1;
  }
  // Digits without a leading zero (`0` itself allowed), as `/^(0|[1-9][0-9]*)$/`.
  if (replicaId.charCodeAt(at) === 48 /* 0 */ && replicaId.length > at + 1) return -1;
  for (let i = at; i < replicaId.length; i++) {
    const c = replicaId.charCodeAt(i);
    if (c < 48 || c > 57) return -1;
  }
  return Number(replicaId.slice(at));
}

/**
 * Why a kept placement must go, or undefined. The checks run in the order of the README's
 * list (node gone or lost, then each GPU, rank by rank; then shape; then fabric trouble; then
 * draining): one pass over the ranks gathers what the later checks need, and a message is
 * built only for the reason returned.
 */
function removalCause(
  placement: Placement,
  deployments: ReadonlyMap<string, SchedulerDeployment> | undefined,
  nodes: ReadonlyMap<string, NodeState>,
): Reason | undefined {
  // Without deployments the placement is held: only the losses apply.
  const held = deployments === undefined;
  const deployment = deployments?.get(placement.deployment);
  if (!held && deployment === undefined) {
    return reason("deployment-deleted", `deployment ${placement.deployment} was deleted`);
  }
  const wantClass = deployment?.gpuClass;
  const ranks = placement.ranks;
  let gpus = 0;
  // The first GPU (rank by rank) not of the deployment's class: the shape check's answer.
  let wrongRank: PlacementRank | undefined;
  let wrongGpu = 0;
  for (const rank of ranks) {
    const node = nodes.get(rank.nodeId);
    if (node === undefined) {
      return reason("node-gone", `node ${rank.nodeId} (rank ${rank.rank}) is no longer registered`);
    }
    if (node.node.state === "lost") {
      return reason("node-lost", `node ${rank.nodeId} (rank ${rank.rank}) is lost`);
    }
    const gpuByIndex = node.info.gpuByIndex;
    const claimedBy = node.claimedBy;
    const indices = rank.gpuIndices;
    gpus += indices.length;
    for (const index of indices) {
      const gpu = gpuByIndex.get(index);
      if (gpu === undefined) {
        return reason("gpu-unusable", `GPU ${index} on node ${rank.nodeId} is no longer present`);
      }
      if (!gpu.healthy) {
        return reason("gpu-unusable", `GPU ${index} on node ${rank.nodeId} is unhealthy`);
      }
      if (gpu.migEnabled) {
        return reason("gpu-unusable", `GPU ${index} on node ${rank.nodeId} has MIG enabled`);
      }
      const owner = claimedBy?.get(index);
      if (owner !== undefined) {
        return reason(
          "gpu-conflict",
          `GPU ${index} on node ${rank.nodeId} is already used by replica ${owner}`,
        );
      }
      if (wantClass !== undefined && wrongRank === undefined && gpu.gpuClass !== wantClass) {
        wrongRank = rank;
        wrongGpu = index;
      }
    }
  }
  if (deployment === undefined) return portTrouble(placement, nodes);
  if (wrongRank !== undefined) {
    return reason(
      "shape-changed",
      `deployment ${deployment.name} now needs ${wantClass} GPUs; GPU ${wrongGpu} on node ${wrongRank.nodeId} is not one`,
    );
  }
  const want = deployment.gpusPerReplica;
  if (
    gpus !== want ||
    // Zero-GPU replicas run on one node whatever the spec says.
    (want > 0 &&
      deployment.nodesPerReplica !== undefined &&
      ranks.length !== deployment.nodesPerReplica)
  ) {
    return reason(
      "shape-changed",
      `deployment ${deployment.name} now needs ${plural(want, "GPU")}${
        deployment.nodesPerReplica === undefined
          ? ""
          : ` on ${plural(deployment.nodesPerReplica, "node")}`
      } per replica; this replica has ${gpus} on ${plural(ranks.length, "node")}`,
    );
  }
  const trouble = portTrouble(placement, nodes);
  if (trouble !== undefined) return trouble;
  for (const rank of ranks) {
    if (nodes.get(rank.nodeId)?.node.draining === true) {
      return reason("node-draining", `node ${rank.nodeId} is draining`);
    }
  }
  return undefined;
}

/** A multi-node placement's fabric turned bad on one of its nodes, or undefined. */
function portTrouble(
  placement: Placement,
  nodes: ReadonlyMap<string, NodeState>,
): Reason | undefined {
  if (placement.ranks.length < 2 || placement.fabricId === undefined) return undefined;
  for (const rank of placement.ranks) {
    const why = nodes.get(rank.nodeId)?.node.fabricTrouble?.[placement.fabricId];
    if (why !== undefined)
      return reason("port-unhealthy", `node ${rank.nodeId} (rank ${rank.rank}): ${why}`);
  }
  return undefined;
}

/**
 * Lower sorts first = removed first on scale-down: replicas that keep failing, then failed
 * ones, then others not serving (`notServing`), those on nodes that cannot take new work,
 * then those whose removal leaves the most free GPUs on their nodes (a whole free node best),
 * then those on nodes crowded with the same deployment, then the newest.
 */
function scaleDownScore(
  record: ReplicaRecord,
  nodes: ReadonlyMap<string, NodeState>,
  failing: ReadonlyMap<string, string>,
  notServing: ReadonlyMap<string, number>,
): number[] {
  let unschedulable = 0;
  let freedValue = 0;
  let crowding = 0;
  for (const rank of record.placement.ranks) {
    const node = nodes.get(rank.nodeId);
    if (node === undefined) continue;
    if (!node.schedulable) unschedulable = 1;
    crowding += node.perDeployment?.get(record.placement.deployment) ?? 0;
    let freeAfter = 0;
    let usable = 0;
    for (const [cls, list] of node.info.usableByClass) {
      freeAfter += freeOf(node, cls);
      usable += list.length;
    }
    freeAfter += rank.gpuIndices.filter((g) => node.usableClass.has(g)).length;
    if (rank.gpuIndices.length > 0) freedValue += freeAfter + (freeAfter === usable ? 1000 : 0);
  }
  const failed = failing.has(record.placement.replicaId) ? 1 : 0;
  const idle = notServing.get(record.placement.replicaId) ?? 0;
  return [-failed, -idle, -unschedulable, -freedValue, -crowding, -record.ordinal];
}

interface PlacementContext {
  readonly nodes: readonly NodeState[];
  /** Classes with at least one usable GPU, sorted. */
  readonly classes: readonly string[];
  /** Classes named by any GPU, usable or not. */
  readonly knownClasses: ReadonlySet<string>;
  /** Class → the most GPUs of that class on one node, any health: the class's node size. */
  readonly maxPerNode: ReadonlyMap<string, number>;
  /** Every fabric id, sorted. */
  readonly fabrics: readonly string[];
  /** Fabric id → its nodes, sorted by id. */
  readonly fabricNodes: ReadonlyMap<string, readonly NodeState[]>;
  /**
   * Class → (free count → the schedulable nodes with exactly that many free GPUs of the class,
   * sorted by id); the same per `${class} ${fabric}`. Kept current on every allocation, so
   * "does any node / do k nodes of a fabric have n free" is answered without scanning nodes.
   */
  readonly freeLists: Map<string, (NodeBucket | undefined)[]>;
  /** False until {@link indexFree} ran; until then `freeLists` is empty. */
  indexed: boolean;
  /** Class → GPU counts that do not change during a run, for reasons. */
  readonly classStats: ReadonlyMap<string, ClassStats>;
}

interface ClassStats {
  total: number;
  unhealthy: number;
  mig: number;
  /** Healthy, non-MIG GPUs on nodes that are not schedulable. */
  onUnschedulable: number;
}

/**
 * Builds the free-count histograms and lists from the current free sets and keeps them current
 * from then on. Called once kept placements are allocated: indexing after that bulk step is
 * cheaper than moving nodes between lists for every kept placement.
 */
function indexFree(ctx: PlacementContext): void {
  for (const node of ctx.nodes) {
    const { histogramPools, histogramKeyLists } = node.info;
    for (let c = 0; c < histogramPools.length; c++) {
      const free = freeOf(node, histogramPools[c] as string);
      for (const key of histogramKeyLists[c] as readonly string[]) {
        let lists = ctx.freeLists.get(key);
        if (lists === undefined) {
          lists = [];
          ctx.freeLists.set(key, lists);
        }
        bucketOf(lists, free, ctx.nodes.length).add(node.ordinal);
      }
    }
  }
  ctx.indexed = true;
}

/**
 * The nodes of one histogram key with one free count, as a bit set over node ordinals: moving
 * a node between counts is O(1) (a sorted array paid a splice of up to every node), and
 * walking the set visits nodes in ordinal (= id) order, as the choice rules need.
 */
class NodeBucket {
  size = 0;
  private readonly words: Uint32Array;

  constructor(nodeCount: number) {
    this.words = new Uint32Array((nodeCount + 31) >>> 5);
  }

  add(ordinal: number): void {
    const w = ordinal >>> 5;
    const bit = 1 << (ordinal & 31);
    const word = this.words[w] as number;
    if ((word & bit) !== 0) return;
    this.words[w] = word | bit;
    this.size++;
  }

  delete(ordinal: number): void {
    const w = ordinal >>> 5;
    const bit = 1 << (ordinal & 31);
    const word = this.words[w] as number;
    if ((word & bit) === 0) return;
    this.words[w] = word & ~bit;
    this.size--;
  }

  /** The smallest ordinal ≥ `from` in the set, or -1. */
  next(from: number): number {
    const words = this.words;
    let w = from >>> 5;
    if (w >= words.length) return -1;
    let word = (words[w] as number) & (-1 << (from & 31));
    while (word === 0) {
      if (++w >= words.length) return -1;
      word = words[w] as number;
    }
    return (w << 5) + (31 - Math.clz32(word & -word));
  }
}

function bucketOf(lists: (NodeBucket | undefined)[], free: number, nodeCount: number): NodeBucket {
  let bucket = lists[free];
  if (bucket === undefined) {
    // Fill any gap below, so the array stays packed.
    for (let f = lists.length; f < free; f++) lists[f] = undefined;
    bucket = new NodeBucket(nodeCount);
    lists[free] = bucket;
  }
  return bucket;
}

/** Takes (`take`) or returns `gpus` of `node`, keeping the histograms and lists current. */
function changeFree(
  ctx: PlacementContext,
  node: NodeState,
  gpus: readonly number[],
  take: boolean,
): void {
  let runClass: string | undefined;
  let runSet: Set<number> | undefined;
  let before = 0;
  for (const gpu of gpus) {
    const cls = node.usableClass.get(gpu);
    const set = cls === undefined ? undefined : freeSet(node, cls);
    if (cls === undefined || set === undefined || set.has(gpu) !== take) continue;
    if (cls !== runClass) {
      if (runClass !== undefined && runSet !== undefined) {
        trackFree(ctx, node, runClass, before, runSet.size);
      }
      runClass = cls;
      runSet = set;
      before = set.size;
    }
    if (take) set.delete(gpu);
    else set.add(gpu);
  }
  if (runClass !== undefined && runSet !== undefined) {
    trackFree(ctx, node, runClass, before, runSet.size);
  }
}

/** Moves `node` from the `before` to the `after` free-count bucket of `cls`. */
function trackFree(
  ctx: PlacementContext,
  node: NodeState,
  cls: string,
  before: number,
  after: number,
): void {
  if (before === after || !ctx.indexed) return;
  for (const key of node.info.histogramKeys.get(cls) ?? []) {
    const lists = ctx.freeLists.get(key);
    if (lists === undefined) continue;
    lists[before]?.delete(node.ordinal);
    bucketOf(lists, after, ctx.nodes.length).add(node.ordinal);
  }
}

/** How many schedulable nodes have at least `n` free GPUs of `cls` (on `fabric` if given). */
function nodesWithFree(ctx: PlacementContext, cls: string, n: number, fabric?: string): number {
  const lists = ctx.freeLists.get(fabric === undefined ? cls : fabricKey(cls, fabric));
  if (lists === undefined) return 0;
  let count = 0;
  for (let f = n; f < lists.length; f++) count += lists[f]?.size ?? 0;
  return count;
}

function buildContext(nodes: readonly NodeState[]): PlacementContext {
  const usable = new Set<string>();
  const maxPerNode = new Map<string, number>();
  const fabricNodes = new Map<string, NodeState[]>();
  const freeLists = new Map<string, (NodeBucket | undefined)[]>();
  const classStats = new Map<string, ClassStats>();
  for (const node of nodes) {
    const { countedPools, countedStats, usablePools } = node.info;
    for (let c = 0; c < countedPools.length; c++) {
      const cls = countedPools[c] as string;
      const counts = countedStats[c] as ClassStats;
      let stats = classStats.get(cls);
      if (stats === undefined) {
        stats = { total: 0, unhealthy: 0, mig: 0, onUnschedulable: 0 };
        classStats.set(cls, stats);
      }
      stats.total += counts.total;
      stats.unhealthy += counts.unhealthy;
      stats.mig += counts.mig;
      stats.onUnschedulable += counts.onUnschedulable;
      maxPerNode.set(cls, Math.max(maxPerNode.get(cls) ?? 0, counts.total));
    }
    for (const cls of usablePools) usable.add(cls);
    for (const fabric of node.fabrics) {
      let list = fabricNodes.get(fabric);
      if (list === undefined) {
        list = [];
        fabricNodes.set(fabric, list);
      }
      list.push(node);
    }
  }
  const fabrics = [...fabricNodes.keys()].sort(byString);
  return {
    nodes,
    classes: [...usable].sort(byString),
    knownClasses: new Set(classStats.keys()),
    maxPerNode,
    fabrics,
    fabricNodes,
    freeLists,
    indexed: false,
    classStats,
  };
}

interface PlannedReplica {
  readonly candidate: Candidate | undefined;
  /** The classes and shapes that were tried (empty when the deployment can never fit). */
  readonly shapes: readonly { readonly gpuClass: string; readonly shape: Shape }[];
  readonly reasons: readonly Reason[];
}

/** Finds the best place for one more replica in the current state, or says why there is none. */
function planReplica(deployment: SchedulerDeployment, ctx: PlacementContext): PlannedReplica {
  if (deployment.gpusPerReplica === 0) return planCpuReplica(deployment, ctx);
  const want = deployment.gpuClass;
  // A class names every vendor's pool of it; each pool is tried on its own.
  const wanted =
    want === undefined ? ctx.classes : ctx.classes.filter((pool) => classOfPool(pool) === want);
  const reasons: Reason[] = [];
  const shapes: { gpuClass: string; shape: Shape }[] = [];
  let best: Candidate | undefined;
  if (wanted.length === 0) {
    const message =
      want === undefined
        ? "no node has a healthy GPU of a known class"
        : [...ctx.knownClasses].some((pool) => classOfPool(pool) === want)
          ? `no node has a healthy, non-MIG ${want} GPU`
          : `no node has ${want} GPUs`;
    return { candidate: undefined, shapes, reasons: [reason("no-gpu-class", message)] };
  }
  for (const cls of wanted) {
    const shaped = deriveShape(deployment, cls, ctx);
    if ("code" in shaped) {
      reasons.push(shaped);
      continue;
    }
    shapes.push({ gpuClass: cls, shape: shaped });
    const candidate =
      shaped.nodes === 1
        ? findSingleNode(deployment, cls, shaped.perNode, ctx)
        : findGang(deployment, cls, shaped, ctx);
    if (candidate === undefined) {
      reasons.push(...explainFailure(deployment, cls, shaped, ctx));
    } else if (
      best === undefined ||
      compareScores(
        [avoids(deployment, candidate), ...candidate.score],
        [avoids(deployment, best), ...best.score],
      ) < 0
    ) {
      best = candidate;
    }
  }
  return { candidate: best, shapes, reasons: best === undefined ? reasons : [] };
}

function planCpuReplica(deployment: SchedulerDeployment, ctx: PlacementContext): PlannedReplica {
  let best: NodeState | undefined;
  let bestScore: number[] = [];
  for (const node of ctx.nodes) {
    if (!node.schedulable) continue;
    const score = [spreadOf(node, deployment.name), node.replicas?.size ?? 0];
    if (best === undefined || compareScores(score, bestScore) < 0) {
      best = node;
      bestScore = score;
    }
  }
  if (best === undefined) {
    const count = (p: (n: SchedulerNode) => boolean): number =>
      ctx.nodes.filter((n) => p(n.node)).length;
    return {
      candidate: undefined,
      shapes: [],
      reasons: [
        reason(
          "no-schedulable-node",
          `no schedulable node: ${plural(ctx.nodes.length, "node")}, ${count((n) => n.state !== "ready")} not ready, ${count((n) => n.cordoned)} cordoned, ${count((n) => n.draining)} draining`,
        ),
      ],
    };
  }
  return {
    candidate: {
      gpuClass: undefined,
      nodes: [best],
      perNode: 0,
      fabricId: undefined,
      score: bestScore,
    },
    shapes: [],
    reasons: [],
  };
}

function deriveShape(
  deployment: SchedulerDeployment,
  cls: string,
  ctx: PlacementContext,
): Shape | Reason {
  const g = deployment.gpusPerReplica;
  const max = ctx.maxPerNode.get(cls) ?? 0;
  const k = deployment.nodesPerReplica;
  if (k !== undefined) {
    if (k > 1 && !deployment.multiNode) {
      return reason(
        "single-node-only",
        `nodesPerReplica is ${k} but the engine of ${deployment.name} cannot span nodes`,
      );
    }
    if (g % k !== 0) {
      return reason("uneven-split", `${g} GPUs do not split evenly over ${k} nodes`);
    }
    if (g / k > max) {
      return reason("exceeds-node", `needs ${g / k} ${cls} per node; the largest node has ${max}`);
    }
    return { nodes: k, perNode: g / k };
  }
  if (g <= max) return { nodes: 1, perNode: g };
  if (!deployment.multiNode) {
    return reason(
      "exceeds-node",
      `needs ${g} ${cls} on one node (the engine cannot span nodes); the largest node has ${max}`,
    );
  }
  for (let nodes = 2; nodes <= g; nodes++) {
    if (g % nodes === 0 && g / nodes <= max) return { nodes, perNode: g / nodes };
  }
  return reason("exceeds-node", `needs ${g} ${cls}; no node has any`);
}

function freeOf(node: NodeState, cls: string): number {
  const set = node.free?.get(cls);
  return set === undefined ? (node.info.usableByClass.get(cls)?.length ?? 0) : set.size;
}

/**
 * Spread first (fewest replicas of this deployment, nodes it avoids last), then best fit (least
 * leftover), then id.
 */
function findSingleNode(
  deployment: SchedulerDeployment,
  cls: string,
  perNode: number,
  ctx: PlacementContext,
): Candidate | undefined {
  // Free lists are ordered by free count, then id: walking them in order visits nodes by
  // (leftover, id), so the first node without a replica of this deployment is the answer.
  const lists = ctx.freeLists.get(cls) ?? [];
  let best: NodeState | undefined;
  let bestSpread = Number.POSITIVE_INFINITY;
  let bestLeftover = 0;
  const all = ctx.nodes;
  for (let free = perNode; free < lists.length && bestSpread > 0; free++) {
    const bucket = lists[free];
    if (bucket === undefined) continue;
    for (let o = bucket.next(0); o >= 0; o = bucket.next(o + 1)) {
      const node = all[o] as NodeState;
      const spread = spreadOf(node, deployment.name);
      if (spread < bestSpread) {
        best = node;
        bestSpread = spread;
        bestLeftover = free - perNode;
        if (spread === 0) break;
      }
    }
  }
  if (best === undefined) return undefined;
  return {
    gpuClass: cls,
    nodes: [best],
    perNode,
    fabricId: undefined,
    score: [1, bestSpread, bestLeftover],
  };
}

function allowedFabrics(deployment: SchedulerDeployment, ctx: PlacementContext): readonly string[] {
  if (deployment.fabric === undefined) return ctx.fabrics;
  return ctx.fabricNodes.has(deployment.fabric) ? [deployment.fabric] : [];
}

function nodesOf(fabric: string, ctx: PlacementContext): readonly NodeState[] {
  return ctx.fabricNodes.get(fabric) ?? [];
}

/** Per fabric: the k best nodes by spread then best fit; the fabric with the best sum wins. */
function findGang(
  deployment: SchedulerDeployment,
  cls: string,
  shape: Shape,
  ctx: PlacementContext,
): Candidate | undefined {
  let best: Candidate | undefined;
  for (const fabric of allowedFabrics(deployment, ctx)) {
    if (nodesWithFree(ctx, cls, shape.perNode, fabric) < shape.nodes) continue;
    // Walk nodes by (leftover, id); k nodes without this deployment found this way are the
    // k best. Only when there are fewer does spread force a full sort.
    const lists = ctx.freeLists.get(fabricKey(cls, fabric)) ?? [];
    let fits: { node: NodeState; spread: number; leftover: number }[] = [];
    const all: { node: NodeState; spread: number; leftover: number }[] = [];
    for (let free = shape.perNode; free < lists.length && fits.length < shape.nodes; free++) {
      const bucket = lists[free];
      if (bucket === undefined) continue;
      for (let o = bucket.next(0); o >= 0; o = bucket.next(o + 1)) {
        const node = ctx.nodes[o] as NodeState;
        const fit = {
          node,
          spread: spreadOf(node, deployment.name),
          leftover: free - shape.perNode,
        };
        all.push(fit);
        if (fit.spread === 0) fits.push(fit);
        if (fits.length === shape.nodes) break;
      }
    }
    if (fits.length < shape.nodes) {
      if (all.length < shape.nodes) continue;
      fits = all.sort(
        (a, b) => a.spread - b.spread || a.leftover - b.leftover || a.node.ordinal - b.node.ordinal,
      );
    }
    const chosen = fits.slice(0, shape.nodes);
    const score = [
      shape.nodes,
      chosen.reduce((s, c) => s + c.spread, 0),
      chosen.reduce((s, c) => s + c.leftover, 0),
    ];
    if (best === undefined || compareScores(score, best.score) < 0) {
      best = {
        gpuClass: cls,
        nodes: chosen.map((c) => c.node),
        perNode: shape.perNode,
        fabricId: fabric,
        score,
      };
    }
  }
  return best;
}

function explainFailure(
  deployment: SchedulerDeployment,
  cls: string,
  shape: Shape,
  ctx: PlacementContext,
): Reason[] {
  if (shape.nodes > 1) {
    const fabrics = allowedFabrics(deployment, ctx);
    if (deployment.fabric !== undefined && fabrics.length === 0) {
      return [reason("fabric-unknown", `no node reports fabric ${deployment.fabric}`)];
    }
    const head = `needs ${shape.nodes} nodes × ${shape.perNode} ${cls} on one fabric`;
    if (fabrics.length === 0) {
      return [reason("no-fabric-fits", `${head}; no node is on any fabric`)];
    }
    const parts = fabrics.map((fabric) => {
      const n = nodesWithFree(ctx, cls, shape.perNode, fabric);
      return n === 0
        ? `fabric ${fabric} has none`
        : `fabric ${fabric} has ${plural(n, "node")} with ${shape.perNode} free`;
    });
    return [reason("no-fabric-fits", `${head}; ${parts.join(", ")}`)];
  }
  const {
    total,
    unhealthy,
    mig,
    onUnschedulable: unschedulable,
  } = ctx.classStats.get(cls) ?? {
    total: 0,
    unhealthy: 0,
    mig: 0,
    onUnschedulable: 0,
  };
  const lists = ctx.freeLists.get(cls) ?? [];
  let free = 0;
  let mostFree = 0;
  let mostFreeNode = "";
  for (let f = 1; f < lists.length; f++) {
    const bucket = lists[f];
    if (bucket === undefined || bucket.size === 0) continue;
    free += f * bucket.size;
    mostFree = f;
    mostFreeNode = ctx.nodes[bucket.next(0)]?.id ?? "";
  }
  const allocated = total - unhealthy - mig - unschedulable - free;
  const tail = [
    `${total} total`,
    `${allocated} allocated`,
    `${unhealthy} unhealthy`,
    ...(mig > 0 ? [`${mig} MIG`] : []),
    ...(unschedulable > 0 ? [`${unschedulable} on unschedulable nodes`] : []),
  ].join(", ");
  if (free === 0) {
    return [reason("no-free-gpus", `no healthy ${cls} GPU free: ${tail}`)];
  }
  return [
    reason(
      "no-node-fits",
      `needs ${shape.perNode} ${cls} on one node; the most free on one node is ${mostFree} (${mostFreeNode}), ${free} free in all: ${tail}`,
    ),
  ];
}

interface Eviction {
  readonly victims: readonly ReplicaRecord[];
  readonly describe: string;
}

/** Per node: the lowest-priority replicas whose GPUs bring `cls` free up to `need`. */
function evictionOnNode(
  node: NodeState,
  cls: string,
  perNode: number,
  priority: number,
): { victims: ReplicaRecord[]; cost: number[] } | undefined {
  if (!node.schedulable || (node.info.usableByClass.get(cls)?.length ?? 0) < perNode)
    return undefined;
  let free = freeOf(node, cls);
  if (free >= perNode) return { victims: [], cost: [0, 0, 0] };
  const freedBy = (r: ReplicaRecord): number =>
    r.placement.ranks
      .filter((rank) => rank.nodeId === node.id)
      .reduce(
        (s, rank) => s + rank.gpuIndices.filter((g) => node.usableClass.get(g) === cls).length,
        0,
      );
  const options = [...(node.replicas ?? [])]
    .filter((r) => r.priority < priority && freedBy(r) > 0)
    .sort(
      (a, b) =>
        a.priority - b.priority ||
        freedBy(b) - freedBy(a) ||
        byString(a.placement.replicaId, b.placement.replicaId),
    );
  const victims: ReplicaRecord[] = [];
  let evicted = 0;
  for (const r of options) {
    if (free >= perNode) break;
    victims.push(r);
    const n = freedBy(r);
    free += n;
    evicted += r.placement.ranks.reduce((s, rank) => s + rank.gpuIndices.length, 0);
  }
  if (free < perNode) return undefined;
  const top = Math.max(...victims.map((v) => v.priority));
  return { victims, cost: [top, victims.length, evicted] };
}

/** The cheapest set of lower-priority replicas to evict so one replica of `deployment` fits. */
function planPreemption(
  deployment: SchedulerDeployment,
  shapes: readonly { readonly gpuClass: string; readonly shape: Shape }[],
  ctx: PlacementContext,
): Eviction | undefined {
  let best: { victims: ReplicaRecord[]; cost: number[]; describe: string } | undefined;
  const consider = (victims: ReplicaRecord[], cost: number[], describe: string): void => {
    if (best === undefined || compareScores(cost, best.cost) < 0)
      best = { victims, cost, describe };
  };
  for (const { gpuClass: cls, shape } of shapes) {
    if (shape.nodes === 1) {
      for (const node of ctx.nodes) {
        const option = evictionOnNode(node, cls, shape.perNode, deployment.priority);
        if (option === undefined || option.victims.length === 0) continue;
        consider(option.victims, [...option.cost], `${shape.perNode} ${cls} on node ${node.id}`);
      }
      continue;
    }
    for (const fabric of allowedFabrics(deployment, ctx)) {
      const options = nodesOf(fabric, ctx)
        .map((node) => ({
          node,
          option: evictionOnNode(node, cls, shape.perNode, deployment.priority),
        }))
        .filter((o) => o.option !== undefined)
        .sort(
          (a, b) =>
            compareScores(a.option?.cost ?? [], b.option?.cost ?? []) ||
            byString(a.node.id, b.node.id),
        )
        .slice(0, shape.nodes);
      if (options.length < shape.nodes) continue;
      const victims = [...new Set(options.flatMap((o) => o.option?.victims ?? []))].sort((a, b) =>
        byString(a.placement.replicaId, b.placement.replicaId),
      );
      if (victims.length === 0) continue;
      const top = Math.max(...victims.map((v) => v.priority));
      const evicted = victims.reduce(
        (s, v) => s + v.placement.ranks.reduce((t, r) => t + r.gpuIndices.length, 0),
        0,
      );
      consider(
        victims,
        [top, victims.length, evicted],
        `${shape.nodes} nodes × ${shape.perNode} ${cls} on fabric ${fabric}`,
      );
    }
  }
  return best;
}

/** Chooses GPUs on the candidate's nodes and names the replica with the lowest free ordinal. */
function commit(
  deployment: SchedulerDeployment,
  candidate: Candidate,
  usedIds: ReadonlyMap<string, ReadonlySet<string>>,
): Placement {
  const used = usedIds.get(deployment.name);
  let n = 0;
  while (used?.has(`${deployment.name}-${n}`) === true) n++;
  const ranks: PlacementRank[] = candidate.nodes.map((node, rank) => {
    const free =
      candidate.gpuClass === undefined ? [] : [...(freeSet(node, candidate.gpuClass) ?? [])];
    if (candidate.perNode >= free.length) {
      return { rank, nodeId: node.id, gpuIndices: free.sort((x, y) => x - y) };
    }
    return {
      rank,
      nodeId: node.id,
      gpuIndices: selectGpus(free, candidate.perNode, nvlinkOf(node.node), node.node.nicDistance),
    };
  });
  return {
    replicaId: `${deployment.name}-${n}`,
    deployment: deployment.name,
    revision: deployment.revision,
    ranks,
    ...(candidate.fabricId === undefined ? {} : { fabricId: candidate.fabricId }),
  };
}
