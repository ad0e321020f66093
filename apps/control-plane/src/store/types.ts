/**
 * The control plane's durable state behind one small interface, so that a PostgreSQL
 * backend (several control-plane replicas) can follow the embedded SQLite one. Records are
 * plain data; deployment specs travel as protobuf JSON text so the store never needs to know
 * the spec's fields. Live readings (GPU readings, replica statuses, load) never come here.
 */

/** A deployment as stored: the spec (protobuf JSON of `llmgw.v1.Deployment`) and its revision. */
export interface DeploymentRecord {
  readonly name: string;
  readonly specJson: string;
  readonly revision: number;
  readonly createdAtMs: number;
  readonly updatedAtMs: number;
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

/** Durable cluster state. All methods are synchronous (the embedded store is in-process). */
export interface ClusterStore {
  /** Where the state lives, for messages ("/var/lib/llmgw/state.db"). */
  readonly location: string;
  listDeployments(): DeploymentRecord[];
  putDeployment(record: DeploymentRecord): void;
  deleteDeployment(name: string): void;
  listPlacements(): PlacementRecord[];
  putPlacement(record: PlacementRecord): void;
  deletePlacement(replicaId: string): void;
  listApiKeys(): ApiKeyRecord[];
  putApiKey(record: ApiKeyRecord): void;
  listNodes(): NodeRecord[];
  putNode(record: NodeRecord): void;
  deleteNode(id: string): void;
  /** Every GPU's cleared faults. */
  listFaultClears(): FaultClearRecord[];
  /** Replaces the cleared faults of one GPU with `records` (all for that `gpuUuid`). */
  replaceFaultClears(gpuUuid: string, records: readonly FaultClearRecord[]): void;
  /** Appends an event and drops the oldest beyond the store's bound. */
  appendEvent(event: Omit<EventRecord, "id">): EventRecord;
  /** Events with id above `afterId`, oldest first, at most `limit` (the newest ones). */
  listEvents(query: { afterId?: number; limit: number }): EventRecord[];
  /** Runs `fn` atomically: every write inside lands or none does. */
  transaction<T>(fn: () => T): T;
  close(): void;
}
