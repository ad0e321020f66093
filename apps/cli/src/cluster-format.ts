import { escapeOutsideText, replicaStateName } from "@llmgw/control-plane/client";
import {
  type DeploymentStatus,
  type Event,
  type Node,
  NodeState,
  type Replica,
  RetirementPhase,
  type Rollout,
  RolloutState,
} from "@llmgw/proto";
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
    n.inventory?.agentVersion || "-",
    last,
  ];
}

/** One component that reports a version: what it is, and which one. */
export interface VersionedComponent {
  kind: "control plane" | "agent" | "router";
  name: string;
  version: string;
}

/**
 * "0.2.0 everywhere", or, during an upgrade, each version with who runs it, newest first:
 * "mixed: 0.2.0 (control plane cp-1, agents node-a, node-b), 0.1.0 (agent node-c)". A component
 * that reported no version counts as "unknown".
 */
export function fleetVersions(components: readonly VersionedComponent[]): string {
  const byVersion = new Map<string, VersionedComponent[]>();
  for (const c of components) {
    const v = c.version || "unknown";
    byVersion.set(v, [...(byVersion.get(v) ?? []), c]);
  }
  if (byVersion.size <= 1) return `${[...byVersion.keys()][0] ?? "unknown"} everywhere`;
  const order = [...byVersion.keys()].sort((a, b) => compareVersions(b, a));
  const who = (cs: VersionedComponent[]) =>
    (["control plane", "agent", "router"] as const)
      .map((kind) => {
        const names = cs.filter((c) => c.kind === kind).map((c) => c.name);
        if (names.length === 0) return undefined;
        const shown =
          names.length > 3
            ? `${names.slice(0, 3).join(", ")} and ${names.length - 3} more`
            : names.join(", ");
        return `${names.length === 1 ? kind : `${kind}s`} ${shown}`;
      })
      .filter((s) => s !== undefined)
      .join(", ");
  return `mixed: ${order.map((v) => `${v} (${who(byVersion.get(v) ?? [])})`).join(", ")}`;
}

/** Orders dotted versions numerically ("0.10.0" after "0.9.1"); anything else sorts first. */
function compareVersions(a: string, b: string): number {
  const pa = a.split(/[.+-]/).map(Number);
  const pb = b.split(/[.+-]/).map(Number);
  for (let i = 0; i < Math.max(pa.length, pb.length); i++) {
    const x = pa[i] ?? 0;
    const y = pb[i] ?? 0;
    if (Number.isNaN(x) || Number.isNaN(y)) return Number.isNaN(x) ? (Number.isNaN(y) ? 0 : -1) : 1;
    if (x !== y) return x - y;
  }
  return 0;
}

/** Where a replica runs: "node-a[0,1] + node-b[0,1]". */
export function replicaPlacement(r: Replica): string {
  return r.ranks.map((k) => `${k.nodeId}[${k.gpuIndices.join(",")}]`).join(" + ") || "-";
}

/** "waiting", "draining", or "retiring" from a control plane newer than this CLI. */
function phaseWord(phase: RetirementPhase): string {
  return phase === RetirementPhase.WAITING
    ? "waiting"
    : phase === RetirementPhase.DRAINING
      ? "draining"
      : "retiring";
}

/**
 * A replica's state as `llmgw replicas` shows it: "ready", or while it leaves
 * "ready,waiting (rollout)" (still serving until its replacement is ready) and
 * "ready,draining (scale-down, 3 in flight, 4m 12s left)". The in-flight count appears only
 * once a router reported one; the time left only while a drain deadline is known.
 */
export function replicaStateText(r: Replica, nowMs: number): string {
  const state = replicaStateName(r.state);
  const t = r.retirement;
  if (!t) return state;
  const details: string[] = [];
  if (t.reason?.code) details.push(t.reason.code);
  if (t.inFlight !== undefined) details.push(`${t.inFlight} in flight`);
  if (t.phase === RetirementPhase.DRAINING && t.drainDeadlineUnixMs !== undefined) {
    const left = Number(t.drainDeadlineUnixMs) - nowMs;
    details.push(left > 0 ? `${formatDuration(left)} left` : "deadline passed");
  }
  return `${state},${phaseWord(t.phase)}${details.length > 0 ? ` (${details.join(", ")})` : ""}`;
}

/**
 * "rollout r1 → r2 in progress", "rollout r1 → r2 complete", "rolled back from r2 to r1:
 * <why>"; a state newer than this CLI reads "rollout r1 → r2 (state 7)". The control plane's
 * message follows when it has one.
 */
export function rolloutText(r: Rollout): string {
  const span = `r${r.fromRevision} → r${r.toRevision}`;
  const message = r.message ? `: ${r.message}` : "";
  switch (r.state) {
    case RolloutState.IN_PROGRESS:
      return `rollout ${span} in progress${message}`;
    case RolloutState.COMPLETE:
      return `rollout ${span} complete${message}`;
    case RolloutState.ROLLED_BACK:
      return `rolled back from r${r.toRevision} to r${r.fromRevision}${message}`;
    default:
      return `rollout ${span} (state ${r.state})${message}`;
  }
}

/** Table row of a replica. */
export function replicaRow(r: Replica, nowMs: number): string[] {
  return [
    r.replicaId,
    r.deployment,
    replicaStateText(r, nowMs),
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
  // A rollout under way or rolled back says more than "ok"; a complete one says nothing new.
  const rollout =
    d.rollout && d.rollout.state !== RolloutState.COMPLETE
      ? rolloutText(d.rollout).split("\n")[0]
      : undefined;
  return [
    spec?.name ?? "?",
    spec?.servedModelName || spec?.model || "?",
    `${engine}${tp}`,
    spec?.gpuClass || "any",
    `${d.readyReplicas}/${d.desiredReplicas}`,
    String(spec?.revision ?? 0n),
    problem ?? rollout ?? (d.readyReplicas >= d.desiredReplicas ? "ok" : "rolling out"),
  ];
}

/**
 * `llmgw deployments NAME`: one line on the deployment, its latest rollout, each reason
 * replicas cannot be placed or failed (first line of each), the nodes it avoids, then its
 * replicas as a table with
 * each one's revision. Every cell is escaped by {@link renderTable}; the rest by
 * `escapeOutsideText`.
 */
export function deploymentDetail(d: DeploymentStatus, nowMs: number): string {
  const esc = escapeOutsideText;
  const [name, model, engine, gpuClass, ready, revision] = deploymentRow(d);
  let out = `${esc(name ?? "")}: ${esc(model ?? "")} on ${esc(engine ?? "")}, class ${esc(gpuClass ?? "")}, revision ${revision}, ${ready} ready\n`;
  if (d.rollout) {
    const started = d.rollout.startedAtUnixMs;
    const ago = started > 0n ? ` (started ${formatDuration(nowMs - Number(started))} ago)` : "";
    out += `  ${esc(rolloutText(d.rollout))}${ago}\n`;
  }
  for (const r of [...d.unschedulable, ...d.failed])
    out += `  problem ${esc(r.code)}: ${esc(r.message.split("\n")[0] ?? "")}\n`;
  for (const r of d.avoided) out += `  ${esc(r.message)}\n`;
  const rows = d.replicas.map((r) => {
    const row = replicaRow(r, nowMs);
    return [row[0] ?? "", row[2] ?? "", String(r.revision), ...row.slice(3)];
  });
  out +=
    rows.length === 0
      ? "\nno replicas\n"
      : `\n${renderTable(["REPLICA", "STATE", "REV", "PLACEMENT", "ENDPOINT", "AGE"], rows)}`;
  return out;
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
