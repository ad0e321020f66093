import { escapeOutsideText, replicaStateName } from "@llmgw/control-plane/client";
import type { DeploymentStatus, Event, Node, Replica } from "@llmgw/proto";
import { NodeState } from "@llmgw/proto";
import { formatDuration, renderTable } from "./table.js";

/** "ready", "unreachable,cordoned", "ready,draining". */
export function nodeStateText(n: Node): string {
  const base = (NodeState[n.state] ?? "UNSPECIFIED").toLowerCase();
  return [base, ...(n.draining ? ["draining"] : n.cordoned ? ["cordoned"] : [])].join(",");
}

/** "8×h100-80g" or "2×h100-80g,1×l4-23g", "-" for none. */
export function gpuSummary(n: Node): string {
  const counts = new Map<string, number>();
  for (const g of n.inventory?.gpus ?? [])
    counts.set(g.gpuClass || "unknown", (counts.get(g.gpuClass || "unknown") ?? 0) + 1);
  return counts.size === 0 ? "-" : [...counts].map(([c, k]) => `${k}×${c}`).join(",");
}

/** Table row of a node. */
export function nodeRow(n: Node, nowMs: number): string[] {
  const used = new Set(n.placed.flatMap((p) => p.gpuIndices));
  const last =
    n.lastHeartbeatUnixMs === undefined
      ? "never"
      : `${formatDuration(nowMs - Number(n.lastHeartbeatUnixMs))} ago`;
  return [
    n.nodeId,
    n.hostname,
    nodeStateText(n),
    gpuSummary(n),
    `${used.size}/${n.inventory?.gpus.length ?? 0}`,
    (n.inventory?.fabrics ?? []).map((f) => f.id).join(",") || "-",
    n.advertiseAddress,
    last,
  ];
}

/** Where a replica runs: "node-a[0,1] + node-b[0,1]". */
export function replicaPlacement(r: Replica): string {
  return r.ranks.map((k) => `${k.nodeId}[${k.gpuIndices.join(",")}]`).join(" + ") || "-";
}

/** Table row of a replica. */
export function replicaRow(r: Replica, nowMs: number): string[] {
  return [
    r.replicaId,
    r.deployment,
    replicaStateName(r.state),
    replicaPlacement(r),
    r.endpoint || "-",
    formatDuration(nowMs - Number(r.createdAtUnixMs)),
  ];
}

/** Table row of a deployment. */
export function deploymentRow(d: DeploymentStatus): string[] {
  const spec = d.spec;
  const engine = spec ? (["?", "vllm", "sglang", "llamacpp", "sim"][spec.engine] ?? "?") : "?";
  const tp =
    spec && spec.tensorParallel * spec.pipelineParallel > 1
      ? ` tp${spec.tensorParallel}${spec.pipelineParallel > 1 ? `pp${spec.pipelineParallel}` : ""}`
      : "";
  const problem = d.unschedulable[0]?.message.split("\n")[0];
  return [
    spec?.name ?? "?",
    spec?.servedModelName || spec?.model || "?",
    `${engine}${tp}`,
    spec?.gpuClass || "any",
    `${d.readyReplicas}/${d.desiredReplicas}`,
    String(spec?.revision ?? 0n),
    problem ?? (d.readyReplicas >= d.desiredReplicas ? "ok" : "rolling out"),
  ];
}

/** "2026-11-30T04:20:08Z warning node.unreachable node-a-1f2e3d: …". */
export function eventLine(e: Event): string {
  const at = new Date(Number(e.atUnixMs)).toISOString().replace(/\.\d{3}Z$/, "Z");
  return `${at} ${e.severity.padEnd(7)} ${e.kind} ${escapeOutsideText(e.subject)}: ${escapeOutsideText(e.message)}`;
}

/** "Xid 79", "SXid 12028", "fallen off the bus". */
function faultLabel(f: { kind: string; code: number }): string {
  return f.kind === "sxid"
    ? `SXid ${f.code}`
    : f.kind === "fallen-off-bus"
      ? "fallen off the bus"
      : `Xid ${f.code}`;
}

/**
 * `llmgw nodes show`: the node, then one table of its GPUs (health as the control plane
 * decides it) and one of the kernel-log faults per GPU that still stand (cleared ones are
 * gone from the answer), each with its evidence line. Every cell is escaped by
 * {@link renderTable}; the rest by `escapeOutsideText`.
 */
export function nodeDetail(n: Node, nowMs: number): string {
  const esc = escapeOutsideText;
  const readings = new Map(n.gpuReadings.map((r) => [r.index, r]));
  const when = (ms: bigint) => new Date(Number(ms)).toISOString().replace(/\.\d{3}Z$/, "Z");
  const [, , state, gpus, allocated, fabrics, address, heartbeat] = nodeRow(n, nowMs);
  let out = `${esc(n.hostname)} (${esc(n.nodeId)}): ${state}\n`;
  out += `  address ${esc(address ?? "")}, fabrics ${esc(fabrics ?? "")}, GPUs ${gpus} (${allocated} allocated), heartbeat ${heartbeat}\n`;
  for (const p of n.problems) out += `  problem ${esc(p.code)}: ${esc(p.message)}\n`;
  const gpuRows = (n.inventory?.gpus ?? []).map((g) => {
    const r = readings.get(g.index);
    const healthy = r ? r.healthy && !r.lost : g.healthy && !g.lost;
    const problems = (r ?? g).healthProblems.map((p) => p.message).join("; ");
    return [
      String(g.index),
      g.gpuClass || "unknown",
      g.vendor || "nvidia",
      g.pciBusId,
      healthy ? "healthy" : (r ?? g).lost ? "lost" : "unhealthy",
      problems || "-",
    ];
  });
  out += `\n${renderTable(["GPU", "CLASS", "VENDOR", "PCI", "HEALTH", "PROBLEMS"], gpuRows)}`;
  const faultRows = (n.inventory?.gpus ?? []).flatMap((g) =>
    (readings.get(g.index) ?? g).faults.map((f) => [
      String(g.index),
      faultLabel(f),
      f.action,
      String(f.count),
      when(f.firstSeenUnixMs),
      f.evidence,
    ]),
  );
  out +=
    faultRows.length === 0
      ? "\nno kernel-log faults\n"
      : `\n${renderTable(["GPU", "FAULT", "ACTION", "COUNT", "FIRST SEEN", "EVIDENCE"], faultRows)}`;
  return out;
}
