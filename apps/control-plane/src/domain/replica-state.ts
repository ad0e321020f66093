import { ReplicaState } from "@llmgw/proto";

/** Progress order of healthy states; a replica is as far as its least advanced rank. */
const PROGRESS: readonly ReplicaState[] = [
  ReplicaState.PENDING,
  ReplicaState.STARTING,
  ReplicaState.LOADING,
  ReplicaState.READY,
];
/** Bad states win over progress, worst first. */
const BAD: readonly ReplicaState[] = [
  ReplicaState.FAILED,
  ReplicaState.EXITED,
  ReplicaState.STOPPING,
  ReplicaState.UNHEALTHY,
];

/**
 * A replica's overall state from its ranks' states (`undefined` = not reported yet =
 * PENDING): the worst bad state if any rank has one, else the least advanced rank.
 */
export function aggregateReplicaState(ranks: readonly (ReplicaState | undefined)[]): ReplicaState {
  const states: ReplicaState[] = ranks.map((s) =>
    s === undefined || s === ReplicaState.UNSPECIFIED ? ReplicaState.PENDING : s,
  );
  for (const bad of BAD) if (states.includes(bad)) return bad;
  let least: ReplicaState = ReplicaState.READY;
  for (const s of states) if (PROGRESS.indexOf(s) < PROGRESS.indexOf(least)) least = s;
  return states.length === 0 ? ReplicaState.PENDING : least;
}

/** Lower-case name of a replica state, e.g. "loading" (for events, tables and metrics). */
export function replicaStateName(state: ReplicaState): string {
  return (ReplicaState[state] ?? "UNSPECIFIED").toLowerCase();
}

/** `host:port` for an endpoint, bracketing IPv6 literals. */
export function joinHostPort(host: string, port: number): string {
  return host.includes(":") && !host.startsWith("[") ? `[${host}]:${port}` : `${host}:${port}`;
}
