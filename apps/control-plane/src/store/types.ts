/**
 * The control plane's durable state behind one small interface, so that a PostgreSQL
 * backend (several control-plane replicas) can follow the embedded SQLite one. Records are
 * plain data; deployment specs travel as protobuf JSON text so the store never needs to know
 * the spec's fields. Live readings (GPU readings, load, problems, engine log tails, engine
 * keys) never come here. Of replica statuses only what routing needs is kept
 * ({@link ReplicaStatusRecord}), written when it changes, not per heartbeat: a restarted
 * control plane then routes to the replicas that were ready before any agent reports again.
 */

/** A deployment as stored: the spec (protobuf JSON of `llmgw.v1.Deployment`) and its revision. */
export interface DeploymentRecord {
  readonly name: string;
  readonly specJson: string;
  readonly revision: number;
  readonly createdAtMs: number;
  readonly updatedAtMs: number;
  /** The deployment's latest change of revision; absent before its first update. */
  readonly rollout?: RolloutRecord;
}

/** The latest change of revision of a deployment (`llmgw.v1.Rollout`). */
export interface RolloutRecord {
  readonly state: "in-progress" | "complete" | "rolled-back";
  readonly fromRevision: number;
  readonly toRevision: number;
  /** Progress, or why it rolled back. */
  readonly message: string;
  readonly startedAtMs: number;
  readonly updatedAtMs: number;
}

/**
 * The spec of one revision of a deployment: the current one, and older ones while replicas
 * still run them (a rolling update, a drain after an undeploy). Deleted once no placement
 * runs it and it is not the deployment's current revision.
 */
export interface DeploymentRevisionRecord {
  readonly name: string;
  readonly revision: number;
  /** Same form as {@link DeploymentRecord.specJson}. */
  readonly specJson: string;
}

/**
 * A placement on its way out (`llmgw.v1.ReplicaRetirement`): `waiting` still takes new
 * requests until its replacement is ready; `draining` takes none and is stopped once its
 * in-flight requests end or at `deadlineMs`.
 */
export interface RetirementRecord {
  /** The reason's stable code (`scale-down`, `node-draining`, `rollout`, …). */
  readonly code: string;
  readonly message: string;
  readonly phase: "waiting" | "draining";
  readonly sinceMs: number;
  /** Set with phase `draining`. */
  readonly drainingSinceMs?: number;
  /** Set with phase `draining`. */
  readonly deadlineMs?: number;
}

/** One rank of a placed replica. */
export interface PlacementRankRecord {
  readonly rank: number;
  readonly nodeId: string;
  readonly gpuIndices: readonly number[];
}

/** Where one replica runs. `replicaId` is stable for the replica's whole life. */
export interface PlacementRecord {
  readonly replicaId: string;
  readonly deployment: string;
  readonly revision: number;
  /** Rank 0 first. */
  readonly ranks: readonly PlacementRankRecord[];
  readonly fabricId?: string;
  /** Rendezvous port on rank 0 for multi-node replicas. */
  readonly rendezvousPort?: number;
  readonly createdAtMs: number;
  /** Absent while the replica serves normally. */
  readonly retirement?: RetirementRecord;
}

/** An API key: only the sha256 of its secret is kept. */
export interface ApiKeyRecord {
  readonly id: string;
  readonly name: string;
  /** First characters of the secret, for recognising it. */
  readonly prefix: string;
  /** Hex sha256 of the full secret. */
  readonly secretHash: string;
  /** Models this key may call; empty = all. */
  readonly models: readonly string[];
  readonly requestsPerMinute?: number;
  readonly tokensPerMinute?: number;
  readonly maxConcurrency?: number;
  readonly createdAtMs: number;
  readonly revokedAtMs?: number;
  /** The tenant that owns the key; absent: none. */
  readonly tenant?: string;
  /** Empty: none. */
  readonly budgets: readonly TokenBudgetRecord[];
  /** Absent: the tenant's class, else standard. */
  readonly priority?: PriorityClassName;
}

/** A priority class by its lower-case name (`llmgw.v1.PriorityClass`). */
export type PriorityClassName = "critical" | "standard" | "batch";

/** How far a tenant asks routers to keep its prefix caches apart (`llmgw.v1.Tenant.cache_isolation`). */
export type TenantCacheIsolationName = "tenant" | "key";

/** Most tokens (prompt + completion) in each UTC day or month (`llmgw.v1.TokenBudget`). */
export interface TokenBudgetRecord {
  readonly period: "day" | "month";
  /** Served model name; absent: every model together. */
  readonly model?: string;
  readonly tokens: number;
}

/** A tenant (`llmgw.v1.Tenant`): a team owning keys, whose limits bound all of them together. */
export interface TenantRecord {
  /** Lower-case letters, digits and '-', at most 63 characters. */
  readonly name: string;
  readonly requestsPerMinute?: number;
  readonly tokensPerMinute?: number;
  readonly maxConcurrency?: number;
  readonly budgets: readonly TokenBudgetRecord[];
  /** Absent: standard. */
  readonly priority?: PriorityClassName;
  /** 1–1000. */
  readonly weight: number;
  /** The least isolation every router keeps its prefix caches at; absent: each router's own. */
  readonly cacheIsolation?: TenantCacheIsolationName;
  readonly createdAtMs: number;
  readonly updatedAtMs: number;
}

/** A node that joined, with its inventory as registered (protobuf binary). */
export interface NodeRecord {
  readonly id: string;
  readonly hostname: string;
  /** Hex sha256 of the node credential. */
  readonly credentialHash: string;
  /** `llmgw.v1.NodeInventory` in protobuf binary form. */
  readonly inventory: Uint8Array;
  readonly advertiseAddress: string;
  readonly cordoned: boolean;
  readonly draining: boolean;
  readonly revoked: boolean;
  readonly registeredAtMs: number;
  /**
   * Set by an operator's `llmgw nodes reset` (epoch ms): until then, the next Register
   * naming this id may take it with the join token alone (once), instead of proving the
   * node credential. Undefined or past: no reset open.
   */
  readonly resetUntilMs?: number;
  /**
   * The leader's last word on the node's liveness, written when it changes (never per
   * heartbeat), for followers to show; absent until a leader recorded one. A leader starting
   * does not trust it: a node is unreachable until it heartbeats to that leader.
   */
  readonly state?: "ready" | "unreachable" | "lost";
  readonly stateSinceMs?: number;
  /**
   * Who drained the node while `draining`: `operator` (`llmgw drain`) or `agent` (the agent
   * leaving with `--stop-engines`, undone when it starts again). Absent when not draining, or
   * for a drain stored before this was recorded (treated as the operator's).
   */
  readonly drainedBy?: "operator" | "agent";
}

/**
 * A kernel-log fault an operator declared dealt with (`llmgw gpu clear`): it stops counting
 * against its GPU until the agent reports it with a later `lastSeenUnixMs` (a new record).
 */
export interface FaultClearRecord {
  /** The GPU's uuid: a clear follows the GPU, not its index or node id. */
  readonly gpuUuid: string;
  /** `kind:pciBusId:code` (see `gpuFaultKey` in `@llmgw/wire`). */
  readonly faultKey: string;
  /** The fault's `lastSeenUnixMs` when it was cleared. */
  readonly lastSeenUnixMs: number;
  readonly clearedAtMs: number;
}

/**
 * What routing needs of the status a node last reported for one rank of a placed replica.
 * Written when one of these fields changes, deleted with the placement or when the node stops
 * reporting the rank. Never load, log lines or engine keys.
 */
export interface ReplicaStatusRecord {
  readonly replicaId: string;
  readonly rank: number;
  /** The node the rank is placed on, which reported it. */
  readonly nodeId: string;
  /** Lower-case state name, e.g. "ready" (`replicaStateName`). */
  readonly state: string;
  /** The engine's API port (rank 0's is the replica's endpoint). */
  readonly apiPort?: number;
  readonly stateSinceMs: number;
  /** Hash of the launch spec the engine runs. */
  readonly specHash: string;
  readonly revision: number;
  /**
   * The engine process, so that a replacement reusing the replica id on the same node is not
   * taken for ready on the old engine's word after a restart either.
   */
  readonly pid?: number;
  readonly startedAtMs?: number;
}

/**
 * A node a deployment avoids because a replica of it kept failing there and moved away
 * (failing-replicas.ts). Kept past `untilMs` for a day, so that the next move off the same
 * node is counted as a repeat and avoided for longer.
 */
export interface AvoidedNodeRecord {
  readonly deployment: string;
  readonly nodeId: string;
  /** New replicas of the deployment go elsewhere until then, when they fit elsewhere. */
  readonly untilMs: number;
  /** Moves off this node counted in a row (1 for the first); each doubles the period. */
  readonly moves: number;
  /** The latest move. */
  readonly movedAtMs: number;
}

/** Severity of an {@link EventRecord}. */
export type EventSeverity = "info" | "warning" | "error";

/** Something that happened, kept in a bounded log. */
export interface EventRecord {
  readonly id: number;
  readonly atMs: number;
  /** e.g. "node.joined", "replica.state", "deployment.unschedulable". */
  readonly kind: string;
  /** A node id, deployment name or replica id. */
  readonly subject: string;
  readonly message: string;
  readonly severity: EventSeverity;
}

/**
 * Durable cluster state. Every method is synchronous, so that the cluster's state changes
 * stay one synchronous step each: SQLite writes in-process; PostgreSQL applies each write to
 * its in-memory copy at once and commits in the background, in order ({@link flush}).
 */
export interface ClusterStore {
  /** Where the state lives, for messages ("/var/lib/llmgw/state.db"). */
  readonly location: string;
  listDeployments(): DeploymentRecord[];
  putDeployment(record: DeploymentRecord): void;
  deleteDeployment(name: string): void;
  /** Every stored revision spec, by name then revision. */
  listDeploymentRevisions(): DeploymentRevisionRecord[];
  /** Creates or replaces the spec of (`name`, `revision`). */
  putDeploymentRevision(record: DeploymentRevisionRecord): void;
  deleteDeploymentRevision(name: string, revision: number): void;
  listPlacements(): PlacementRecord[];
  putPlacement(record: PlacementRecord): void;
  deletePlacement(replicaId: string): void;
  listApiKeys(): ApiKeyRecord[];
  putApiKey(record: ApiKeyRecord): void;
  /** Every tenant, by name. */
  listTenants(): TenantRecord[];
  /** Creates or replaces the tenant `record.name`. */
  putTenant(record: TenantRecord): void;
  deleteTenant(name: string): void;
  listNodes(): NodeRecord[];
  putNode(record: NodeRecord): void;
  deleteNode(id: string): void;
  /** Records a node's liveness ({@link NodeRecord.state}); a node not stored is ignored. */
  putNodeState(id: string, state: NonNullable<NodeRecord["state"]>, sinceMs: number): void;
  /** Every GPU's cleared faults. */
  listFaultClears(): FaultClearRecord[];
  /** Replaces the cleared faults of one GPU with `records` (all for that `gpuUuid`). */
  replaceFaultClears(gpuUuid: string, records: readonly FaultClearRecord[]): void;
  /** Every kept replica status, by replica id and rank. */
  listReplicaStatuses(): ReplicaStatusRecord[];
  /** Creates or replaces the status of (`replicaId`, `rank`). */
  putReplicaStatus(record: ReplicaStatusRecord): void;
  /** Deletes the status of one rank of a replica, or of all its ranks when `rank` is absent. */
  deleteReplicaStatuses(replicaId: string, rank?: number): void;
  /** Every kept avoided node, by deployment then node id. */
  listAvoidedNodes(): AvoidedNodeRecord[];
  /** Creates or replaces the avoidance of (`deployment`, `nodeId`). */
  putAvoidedNode(record: AvoidedNodeRecord): void;
  deleteAvoidedNode(deployment: string, nodeId: string): void;
  /** Appends an event and drops the oldest beyond the store's bound. */
  appendEvent(event: Omit<EventRecord, "id">): EventRecord;
  /**
   * At most `limit` events, oldest first: with `afterId` (> 0) the first ones with a higher id
   * (paging: the next page starts after the last id of this one); without it, the newest.
   */
  listEvents(query: { afterId?: number; limit: number }): EventRecord[];
  /** Runs `fn` atomically: every write inside lands or none does. */
  transaction<T>(fn: () => T): T;
  /**
   * Resolves once every write made so far is durable: at once for SQLite (each write is),
   * after the commit for PostgreSQL. Rejects `LLMGW_CONTROL_PLANE_STORE_UNAVAILABLE` when the
   * database does not confirm within `timeoutMs` (default 5 s), `LLMGW_CONTROL_PLANE_NOT_LEADER`
   * when this instance lost the leader lease. An answer to a client waits for this.
   */
  flush(timeoutMs?: number): Promise<void>;
  close(): void;
}
