import { replicaStateName } from "@llmgw/control-plane/client";
import {
  type DeploymentStatus,
  type Replica,
  ReplicaState,
  RetirementPhase,
  type Rollout,
  RolloutState,
} from "@llmgw/proto";
import { replicaPlacement, replicaStateText } from "./cluster-format.js";
import { formatDuration } from "./table.js";

/*
 * What `llmgw deploy|scale|undeploy|drain --wait` print while replicas come and go, as pure
 * functions of what two polls of the control plane saw. The loops that poll live in
 * lifecycle-wait.ts; nothing here reads a clock or writes output.
 */

/** One poll's replicas and when it answered (Unix ms). */
export interface ReplicaSnapshot {
  readonly replicas: readonly Replica[];
  readonly atMs: number;
}

/** A LOADING replica repeats its progress line this often, so a long load shows it is alive. */
export const LOADING_REPEAT_MS = 10_000;

/**
 * When the replica's loading began, from its ranks' reports (the earliest loading rank);
 * undefined when no rank reported the time.
 */
function loadingSinceMs(r: Replica): number | undefined {
  const since = r.ranks
    .map((k) => k.status)
    .filter((s) => s?.state === ReplicaState.LOADING && s.stateSinceUnixMs > 0n)
    .map((s) => Number(s?.stateSinceUnixMs));
  return since.length > 0 ? Math.min(...since) : undefined;
}

/** What a replica is doing now, for a progress line: "loading (12s)", "ready at …", … */
function stepText(r: Replica, nowMs: number): string {
  if (r.retirement) {
    const text = replicaStateText(r, nowMs);
    return r.retirement.phase === RetirementPhase.WAITING
      ? `${text}: serves until its replacement is ready`
      : text;
  }
  switch (r.state) {
    case ReplicaState.PENDING:
      return "pending";
    case ReplicaState.LOADING: {
      const since = loadingSinceMs(r);
      return since === undefined ? "loading" : `loading (${formatDuration(nowMs - since)})`;
    }
    case ReplicaState.READY:
      return `ready${r.endpoint ? ` at ${r.endpoint}` : ""}`;
    default: {
      const message = r.ranks.find((k) => k.status?.message)?.status?.message;
      return `${replicaStateName(r.state)}${message ? ` (${message})` : ""}`;
    }
  }
}

/** What of a retirement is worth a line when it changes: the phase and the in-flight count. */
function retirementKey(r: Replica): string {
  const t = r.retirement;
  return t ? `${t.phase}/${t.inFlight ?? "-"}` : "";
}

/** How a replica that is no longer listed ended, from the last poll that saw it. */
function goneText(last: Replica, nowMs: number): string {
  const t = last.retirement;
  if (!t) return "removed";
  if (
    t.phase === RetirementPhase.DRAINING &&
    t.inFlight !== undefined &&
    t.inFlight > 0 &&
    t.drainDeadlineUnixMs !== undefined &&
    Number(t.drainDeadlineUnixMs) <= nowMs
  ) {
    return `stopped at its drain deadline with ${t.inFlight} in flight`;
  }
  return "stopped";
}

/**
 * The progress lines between two polls, one per replica that moved: "chat-3  placed on
 * node-b[0] (revision 3)", "chat-3  loading (12s)", "chat-3  ready at 10.0.0.2:41234",
 * "chat-1  ready,draining (rollout, 3 in flight, 4m 55s left)", "chat-1  stopped". A replica
 * first seen past PENDING says where it runs and what it does; one whose revision moved in
 * place says so. A loading replica repeats its line every {@link LOADING_REPEAT_MS}. With no
 * previous poll, every replica gets its line.
 */
export function replicaProgressLines(
  prev: ReplicaSnapshot | undefined,
  next: ReplicaSnapshot,
): string[] {
  const before = new Map((prev?.replicas ?? []).map((r) => [r.replicaId, r]));
  const now = next.atMs;
  const lines: string[] = [];
  const line = (r: Replica, text: string) => lines.push(`${r.replicaId}  ${text}`);
  for (const r of next.replicas) {
    const p = before.get(r.replicaId);
    if (p === undefined) {
      const where = `${replicaPlacement(r)} (revision ${r.revision})`;
      line(
        r,
        r.state === ReplicaState.PENDING && !r.retirement
          ? `placed on ${where}`
          : `on ${where}: ${stepText(r, now)}`,
      );
    } else if (p.revision !== r.revision) {
      line(r, `revision ${p.revision} → ${r.revision}: ${stepText(r, now)}`);
    } else if (p.state !== r.state || retirementKey(p) !== retirementKey(r)) {
      line(r, stepText(r, now));
    } else if (r.state === ReplicaState.LOADING && prev !== undefined) {
      const since = loadingSinceMs(r);
      if (
        since !== undefined &&
        Math.floor((now - since) / LOADING_REPEAT_MS) >
          Math.floor((prev.atMs - since) / LOADING_REPEAT_MS)
      )
        line(r, stepText(r, now));
    }
  }
  const listed = new Set(next.replicas.map((r) => r.replicaId));
  for (const p of prev?.replicas ?? []) {
    if (!listed.has(p.replicaId)) line(p, goneText(p, now));
  }
  return lines;
}

/**
 * "1 waiting, 2 draining, 5 in flight": the replicas among `replicas` that are leaving; the
 * in-flight sum only when a router reported a count for one of them. Empty when none leaves.
 */
export function retiringSummary(replicas: readonly Replica[]): string {
  let waiting = 0;
  let draining = 0;
  let inFlight: number | undefined;
  for (const r of replicas) {
    const t = r.retirement;
    if (!t) continue;
    if (t.phase === RetirementPhase.DRAINING) draining++;
    else waiting++;
    if (t.inFlight !== undefined) inFlight = (inFlight ?? 0) + t.inFlight;
  }
  const parts = [
    ...(waiting > 0 ? [`${waiting} waiting`] : []),
    ...(draining > 0 ? [`${draining} draining`] : []),
    ...(inFlight !== undefined ? [`${inFlight} in flight`] : []),
  ];
  return parts.join(", ");
}

/**
 * True when the replica runs `revision`: placed at it, and every rank that reported a revision
 * reports it (a rank's 0 means its agent did not say; an engine replaced in place reports the
 * old revision until its new one starts).
 */
export function runsRevision(r: Replica, revision: bigint): boolean {
  return (
    r.revision === revision &&
    r.ranks.every((k) => !k.status || k.status.revision === 0n || k.status.revision === revision)
  );
}

/**
 * The rollout line of `llmgw deploy --wait`: "chat: 2/4 ready at revision 3, 1 at an older
 * revision, 1 waiting, 1 draining, 3 in flight".
 */
export function rolloutProgress(d: DeploymentStatus, revision: bigint): string {
  const staying = d.replicas.filter((r) => !r.retirement);
  const ready = staying.filter(
    (r) => r.state === ReplicaState.READY && runsRevision(r, revision),
  ).length;
  const older = staying.filter((r) => r.revision !== revision).length;
  const retiring = retiringSummary(d.replicas);
  return [
    `${d.spec?.name ?? "?"}: ${ready}/${d.desiredReplicas} ready at revision ${revision}`,
    ...(older > 0 ? [`${older} at an older revision`] : []),
    ...(retiring ? [retiring] : []),
  ].join(", ");
}

/**
 * True when the deployment has finished reaching `revision`: exactly the desired number of
 * replicas, each ready and running it, and none leaving (a leaving replica may still have
 * requests in flight).
 */
export function rolloutDone(d: DeploymentStatus, revision: bigint): boolean {
  return (
    d.replicas.length === d.desiredReplicas &&
    d.replicas.every(
      (r) => !r.retirement && r.state === ReplicaState.READY && runsRevision(r, revision),
    )
  );
}

/** True when `rollout` says that the change to `revision` was rolled back. */
export function rolledBack(rollout: Rollout | undefined, revision: bigint): boolean {
  return rollout?.state === RolloutState.ROLLED_BACK && rollout.toRevision === revision;
}

/** True when a rank of the replica runs on the node (by node id). */
export function onNode(r: Replica, nodeId: string): boolean {
  return r.ranks.some((k) => k.nodeId === nodeId);
}

/**
 * The drain line of `llmgw drain --wait`: "gpu-07: 2 replica(s) left (1 waiting, 1 draining,
 * 3 in flight); 3 ready elsewhere", where "elsewhere" counts the ready replicas, not leaving,
 * of the deployments followed that run off the node.
 */
export function drainProgress(label: string, replicas: readonly Replica[], nodeId: string): string {
  const left = replicas.filter((r) => onNode(r, nodeId));
  const elsewhere = replicas.filter(
    (r) => !onNode(r, nodeId) && !r.retirement && r.state === ReplicaState.READY,
  ).length;
  const retiring = retiringSummary(left);
  return `${label}: ${left.length} replica(s) left${retiring ? ` (${retiring})` : ""}; ${elsewhere} ready elsewhere`;
}

/** "chat-1 ready,draining (node-draining, 3 in flight); chat-2 ready": what is left, for a timeout. */
export function leftText(replicas: readonly Replica[], nowMs: number): string {
  return replicas.map((r) => `${r.replicaId} ${replicaStateText(r, nowMs)}`).join("; ");
}
