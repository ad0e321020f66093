/**
 * The fleet page's view of `ListNodes`: per node and GPU, the words and numbers shown, and a
 * signature of them, so that a poll re-renders only the cells whose text changed (at 1,000
 * nodes × 8 GPUs most cells do not change between heartbeats).
 */
import type { Gpu, GpuReading, Node } from "@llmgw/proto";
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
  readonly gpus: readonly GpuView[];
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
    memory: memory(r.memoryUsedBytes ?? gpu.memoryUsedBytes, gpu.memoryTotalBytes),
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
  };
  return {
    ...base,
    sig: [
      base.hostname,
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
export function groupNodes(nodes: readonly NodeView[]): { state: string; nodes: NodeView[] }[] {
  const order = [NodeState.LOST, NodeState.UNREACHABLE, NodeState.READY, NodeState.UNSPECIFIED].map(
    nodeState,
  );
  const groups = new Map<string, NodeView[]>(order.map((s) => [s, []]));
  for (const n of nodes) groups.get(n.state)?.push(n);
  return order
    .map((state) => ({
      state,
      nodes: (groups.get(state) ?? []).sort((a, b) => a.hostname.localeCompare(b.hostname)),
    }))
    .filter((g) => g.nodes.length > 0);
}
