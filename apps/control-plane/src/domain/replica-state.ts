import { ReplicaState } from "@llmgw/proto";

/** A rank's or replica's state, as the control plane keeps it (and the store writes it). */
export type ReplicaStateName =
  | "pending"
  | "starting"
  | "loading"
  | "ready"
  | "unhealthy"
  | "stopping"
  | "exited"
  | "failed";

/** Progress order of healthy states; a replica is as far as its least advanced rank. */
const PROGRESS: readonly ReplicaStateName[] = ["pending", "starting", "loading", "ready"];
/** Bad states win over progress, worst first. */
const BAD: readonly ReplicaStateName[] = ["failed", "exited", "stopping", "unhealthy"];

/**
 * A replica's overall state from its ranks' states (`undefined` = not reported yet =
 * pending): the worst bad state if any rank has one, else the least advanced rank.
 */
export function aggregateRankStates(
  ranks: readonly (ReplicaStateName | undefined)[],
): ReplicaStateName {
  if (ranks.length === 0) return "pending";
  let bad = BAD.length;
  let least = PROGRESS.length - 1;
  for (const s of ranks) {
    if (s === undefined) {
      least = 0;
      continue;
    }
    const b = BAD.indexOf(s);
    if (b >= 0) bad = Math.min(bad, b);
    else least = Math.min(least, PROGRESS.indexOf(s));
  }
  return bad < BAD.length ? (BAD[bad] as ReplicaStateName) : (PROGRESS[least] as ReplicaStateName);
}

const FROM_PROTO: Readonly<Record<number, ReplicaStateName>> = {
  [ReplicaState.PENDING]: "pending",
  [ReplicaState.STARTING]: "starting",
  [ReplicaState.LOADING]: "loading",
  [ReplicaState.READY]: "ready",
  [ReplicaState.UNHEALTHY]: "unhealthy",
  [ReplicaState.STOPPING]: "stopping",
  [ReplicaState.EXITED]: "exited",
  [ReplicaState.FAILED]: "failed",
};

const TO_PROTO: Readonly<Record<ReplicaStateName, ReplicaState>> = {
  pending: ReplicaState.PENDING,
  starting: ReplicaState.STARTING,
  loading: ReplicaState.LOADING,
  ready: ReplicaState.READY,
  unhealthy: ReplicaState.UNHEALTHY,
  stopping: ReplicaState.STOPPING,
  exited: ReplicaState.EXITED,
  failed: ReplicaState.FAILED,
};

/**
 * The wire state's name. Unset, and a state this build does not know (a newer agent's),
 * read as pending: never ready, so never routed to, and not failed, so nothing is restarted
 * on its account.
 */
export function replicaStateFromProto(state: ReplicaState): ReplicaStateName {
  return FROM_PROTO[state] ?? "pending";
}

/** The name as the wire enum. */
export function replicaStateToProto(state: ReplicaStateName): ReplicaState {
  return TO_PROTO[state];
}

/** A stored name back (see `ReplicaStatusRecord.state`); undefined when it is not one. */
export function replicaStateFromRecord(name: string): ReplicaStateName | undefined {
  return Object.hasOwn(TO_PROTO, name) ? (name as ReplicaStateName) : undefined;
}

/**
 * A replica's overall state from its ranks' wire states (`undefined` = not reported yet), as
 * {@link aggregateRankStates} decides it: for clients reading the admin API.
 */
export function aggregateReplicaState(ranks: readonly (ReplicaState | undefined)[]): ReplicaState {
  return TO_PROTO[
    aggregateRankStates(ranks.map((s) => (s === undefined ? undefined : replicaStateFromProto(s))))
  ];
}

/** Lower-case name of a wire replica state, e.g. "loading" (for events, tables and metrics). */
export function replicaStateName(state: ReplicaState): string {
  return (ReplicaState[state] ?? "UNSPECIFIED").toLowerCase();
}

/** `host:port` for an endpoint, bracketing IPv6 literals. */
export function joinHostPort(host: string, port: number): string {
  return host.includes(":") && !host.startsWith("[") ? `[${host}]:${port}` : `${host}:${port}`;
}
