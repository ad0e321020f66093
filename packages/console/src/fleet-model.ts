/**
 * The fleet page's view of `ListNodes`: per node and GPU, the words and numbers shown, and a
 * signature of them, so that a poll re-renders only the cells whose text changed (at 1,000
 * nodes × 8 GPUs most cells do not change between heartbeats).
 */
import type { Gpu, GpuReading, Node, NodeInventory } from "@llmgw/proto";
import { NodeState } from "@llmgw/proto";
import { ABSENT, celsius, memory, nodeState, percent, watts } from "./format.js";

export interface GpuView {
  readonly index: number;
  readonly name: string;
  readonly gpuClass: string;
  readonly memory: string;
  readonly utilization: string;
  /** 0–100 for the bar; undefined when unreported (no bar, not an empty one). */
  readonly utilizationValue: number | undefined;
  readonly temperature: string;
  readonly power: string;
  readonly healthy: boolean;
  readonly lost: boolean;
  /** Why it is unhealthy, one line per problem or fault; empty when healthy. */
  readonly reasons: readonly string[];
  /** The replica ranks on it, e.g. "chat/r-1a2b rank 0". */
  readonly placed: readonly string[];
  readonly sig: string;
}

export interface NodeView {
  readonly id: string;
  readonly hostname: string;
  readonly state: string;
  readonly cordoned: boolean;
  readonly draining: boolean;
  readonly simulated: boolean;
  readonly agentVersion: string;
  readonly fabrics: string;
  readonly lastHeartbeatMs: number | undefined;
  readonly problems: readonly string[];
  /** Empty while the inventory is still being read ({@link inventoryPending}). */
  readonly gpus: readonly GpuView[];
  /** The node came without its inventory, which is still being read: no GPU grid yet. */
  readonly inventoryPending: boolean;
  /** GPUs and unhealthy ones, from the readings when the inventory is pending. */
  readonly gpuCount: number;
  readonly unhealthyCount: number;
  /** Everything above but the heartbeat time (shown relative, refreshed apart). */
  readonly sig: string;
}

function gpuView(gpu: Gpu, reading: GpuReading | undefined, placed: readonly string[]): GpuView {
  // A heartbeat's reading is newer than the inventory's registration-time one, field by field.
  const r = reading ?? gpu;
  const utilizationValue = r.utilizationPercent;
  // The health problems already name the faults behind them; faults alone only when no
  // problem does (a fault whose action keeps the GPU in service).
  const reasons =
    r.healthProblems.length > 0
      ? r.healthProblems.map((p) => p.message || p.code)
      : r.faults.map((f) => `${f.kind} ${f.code}: ${f.description || f.action} (×${f.count})`);
  if (r.lost && reasons.length === 0) reasons.push("lost: no longer seen by the driver");
  const view = {
    index: gpu.index,
    name: gpu.name,
    gpuClass: gpu.gpuClass || ABSENT,
    memory: memory(r.memoryUsedBytes, gpu.memoryTotalBytes),
    utilization: percent(utilizationValue),
    utilizationValue,
    temperature: celsius(r.temperatureCelsius),
    power: watts(r.powerWatts),
    healthy: r.healthy && !r.lost,
    lost: r.lost,
    reasons,
    placed,
  };
  return {
    ...view,
    sig: [
      view.gpuClass,
      view.memory,
      view.utilization,
      view.temperature,
      view.power,
      view.healthy,
      view.lost,
      ...reasons,
      "|",
      ...placed,
    ].join("\u0001"),
  };
}

export function nodeView(node: Node): NodeView {
  const readings = new Map<number, GpuReading>();
  for (const r of node.gpuReadings) readings.set(r.index, r);
  const placedOn = new Map<number, string[]>();
  for (const rank of node.placed)
    for (const g of rank.gpuIndices) {
      const list = placedOn.get(g) ?? [];
      list.push(`${rank.deployment} ${rank.replicaId} rank ${rank.rank}`);
      placedOn.set(g, list);
    }
  const inventory = node.inventory;
  const gpus = (inventory?.gpus ?? []).map((g) =>
    gpuView(g, readings.get(g.index), placedOn.get(g.index) ?? []),
  );
  const problems = node.problems.map((p) => p.message || p.code);
  const pending = inventory === undefined && node.inventoryDigest !== "";
  const unhealthyCount = pending
    ? node.gpuReadings.filter((r) => !r.healthy || r.lost).length
    : gpus.filter((g) => !g.healthy).length;
  const fabrics = (inventory?.fabrics ?? []).map((f) => `${f.id} (${f.linkLayer})`).join(", ");
  const base = {
    id: node.nodeId,
    hostname: node.hostname || inventory?.hostname || node.nodeId,
    state: nodeState(node.state),
    cordoned: node.cordoned,
    draining: node.draining,
    simulated: inventory?.simulated ?? false,
    agentVersion: inventory?.agentVersion || ABSENT,
    fabrics: fabrics || ABSENT,
    lastHeartbeatMs:
      node.lastHeartbeatUnixMs === undefined ? undefined : Number(node.lastHeartbeatUnixMs),
    problems,
    gpus,
    inventoryPending: pending,
    gpuCount: pending ? node.gpuReadings.length : gpus.length,
    unhealthyCount,
  };
  return {
    ...base,
    sig: [
      base.hostname,
      pending,
      base.gpuCount,
      unhealthyCount,
      base.state,
      base.cordoned,
      base.draining,
      base.agentVersion,
      base.fabrics,
      ...problems,
      ...gpus.map((g) => g.sig),
    ].join("\u0002"),
  };
}

/** Nodes by state, worst first, each group by hostname. */
export function groupNodes<T extends { readonly state: string; readonly hostname: string }>(
  nodes: readonly T[],
): { state: string; nodes: T[] }[] {
  const order = [NodeState.LOST, NodeState.UNREACHABLE, NodeState.READY, NodeState.UNSPECIFIED].map(
    nodeState,
  );
  const groups = new Map<string, T[]>(order.map((s) => [s, []]));
  for (const n of nodes) groups.get(n.state)?.push(n);
  return order
    .map((state) => ({
      state,
      nodes: (groups.get(state) ?? []).sort((a, b) => a.hostname.localeCompare(b.hostname)),
    }))
    .filter((g) => g.nodes.length > 0);
}

/** The ids of the first `count` nodes the fleet page shows (before any filter). */
export function firstShown(nodes: readonly Node[], count: number): string[] {
  const keys = nodes.map((n) => ({
    id: n.nodeId,
    state: nodeState(n.state),
    hostname: n.hostname || n.nodeId,
  }));
  return groupNodes(keys)
    .flatMap((g) => g.nodes)
    .slice(0, count)
    .map((n) => n.id);
}

/** What the fleet page reads nodes with: `ClusterService.ListNodes`. */
export interface NodeSource {
  /** Every node, or only those in `nodes` (ids); without inventories when `omitInventory`. */
  list(omitInventory: boolean, signal: AbortSignal, nodes?: readonly string[]): Promise<Node[]>;
}

/** Options of {@link createFleetReader}. */
export interface FleetReaderOptions {
  /** The nodes a first read shows at once (their inventories are read before it returns). */
  readonly firstShown: (nodes: readonly Node[]) => readonly string[];
  /** Called when inventories read in the background arrived: read again to show them. */
  readonly inventoriesArrived: () => void;
}

type Kept = Map<string, { readonly digest: string; readonly inventory: NodeInventory }>;

/**
 * The fleet page's reads of nodes, with each inventory kept between reads: inventories are
 * three quarters of `ListNodes`' bytes at 1,000 nodes (2.7 MB, ~400 ms to decode in a busy
 * tab) and change only when an agent registers again.
 *
 * - The first read asks `ListNodes` with `omit_inventory`, then for the nodes shown first
 *   whole (`nodes`), and starts a whole `ListNodes` of every node in the background; until it is
 *   in, the other nodes come without inventory (the page shows their GPUs as being read).
 * - Later reads ask with `omit_inventory` and fill the inventories in; a node that is new or
 *   whose `inventory_digest` changed (its agent registered with other hardware) makes the
 *   read ask for the whole list.
 * - A control plane that sets no digest is always read whole.
 */
export function createFleetReader(
  source: NodeSource,
  options: FleetReaderOptions,
): (signal: AbortSignal) => Promise<Node[]> {
  const kept: Kept = new Map();
  let digests = true;
  const keep = (nodes: readonly Node[]) => {
    for (const n of nodes)
      if (n.inventory !== undefined)
        kept.set(n.nodeId, { digest: n.inventoryDigest, inventory: n.inventory });
  };
  const readWhole = async (signal: AbortSignal): Promise<Node[]> => {
    const full = await source.list(false, signal);
    kept.clear();
    digests = full.every((n) => n.inventoryDigest !== "");
    keep(full);
    return full;
  };
  const fillIn = (light: Node[]): Node[] => {
    for (const n of light) {
      const k = kept.get(n.nodeId);
      if (k !== undefined && k.digest === n.inventoryDigest) n.inventory = k.inventory;
    }
    if (light.length < kept.size) {
      const live = new Set(light.map((n) => n.nodeId));
      for (const id of kept.keys()) if (!live.has(id)) kept.delete(id);
    }
    return light;
  };
  let started = false;
  /** The background whole read is out. */
  let pending = false;
  return async (signal) => {
    if (!digests) return readWhole(signal);
    const light = await source.list(true, signal);
    if (!started) {
      started = true;
      if (light.some((n) => n.inventoryDigest === "")) {
        digests = false;
        return readWhole(signal);
      }
      const shown = options.firstShown(light);
      if (shown.length > 0) keep(await source.list(false, signal, shown));
      // Not tied to this read's signal: the page's next read still wants them.
      pending = true;
      readWhole(new AbortController().signal).then(
        () => {
          pending = false;
          options.inventoriesArrived();
        },
        () => {
          pending = false; // the next read finds nodes without inventory and reads whole
        },
      );
      return fillIn(light);
    }
    if (pending) return fillIn(light);
    const stale = light.some((n) => kept.get(n.nodeId)?.digest !== n.inventoryDigest);
    return stale ? readWhole(signal) : fillIn(light);
  };
}
