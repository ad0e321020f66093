/*
 * Rows of the state store's tables as both engines return them (the same column names and
 * types once PostgreSQL's 64-bit integers are read as numbers), and the records they hold.
 * The `…Values` functions give a record's columns in table order, for positional parameters.
 */
import type {
  ApiKeyRecord,
  DeploymentRecord,
  EventRecord,
  EventSeverity,
  FaultClearRecord,
  NodeRecord,
  PlacementRecord,
  ReplicaStatusRecord,
} from "./types.js";

export interface DeploymentRow {
  name: string;
  spec_json: string;
  revision: number;
  created_at_ms: number;
  updated_at_ms: number;
}
export interface PlacementRow {
  replica_id: string;
  deployment: string;
  revision: number;
  ranks_json: string;
  fabric_id: string | null;
  rendezvous_port: number | null;
  created_at_ms: number;
}
export interface ApiKeyRow {
  id: string;
  name: string;
  prefix: string;
  secret_hash: string;
  models_json: string;
  requests_per_minute: number | null;
  tokens_per_minute: number | null;
  max_concurrency: number | null;
  created_at_ms: number;
  revoked_at_ms: number | null;
}
export interface NodeRow {
  id: string;
  hostname: string;
  credential_hash: string;
  inventory: Buffer;
  advertise_address: string;
  cordoned: number;
  draining: number;
  revoked: number;
  registered_at_ms: number;
  reset_pending: number;
  state: string | null;
  state_since_ms: number | null;
}
export interface FaultClearRow {
  gpu_uuid: string;
  fault_key: string;
  last_seen_unix_ms: number;
  cleared_at_ms: number;
}
export interface ReplicaStatusRow {
  replica_id: string;
  rank: number;
  node_id: string;
  state: string;
  api_port: number | null;
  state_since_ms: number;
  spec_hash: string;
  revision: number;
  pid: number | null;
  started_at_ms: number | null;
}
export interface EventRow {
  id: number;
  at_ms: number;
  kind: string;
  subject: string;
  message: string;
  severity: string;
}

const opt = <T>(v: T | null): T | undefined => (v === null ? undefined : v);

export const deploymentFromRow = (r: DeploymentRow): DeploymentRecord => ({
  name: r.name,
  specJson: r.spec_json,
  revision: r.revision,
  createdAtMs: r.created_at_ms,
  updatedAtMs: r.updated_at_ms,
});

export const placementFromRow = (r: PlacementRow): PlacementRecord => ({
  replicaId: r.replica_id,
  deployment: r.deployment,
  revision: r.revision,
  ranks: JSON.parse(r.ranks_json) as PlacementRecord["ranks"],
  fabricId: opt(r.fabric_id),
  rendezvousPort: opt(r.rendezvous_port),
  createdAtMs: r.created_at_ms,
});

/** Columns (replica_id, deployment, revision, ranks_json, fabric_id, rendezvous_port, created_at_ms). */
export const placementValues = (r: PlacementRecord): unknown[] => [
  r.replicaId,
  r.deployment,
  r.revision,
  JSON.stringify(r.ranks),
  r.fabricId ?? null,
  r.rendezvousPort ?? null,
  r.createdAtMs,
];

export const apiKeyFromRow = (r: ApiKeyRow): ApiKeyRecord => ({
  id: r.id,
  name: r.name,
  prefix: r.prefix,
  secretHash: r.secret_hash,
  models: JSON.parse(r.models_json) as string[],
  requestsPerMinute: opt(r.requests_per_minute),
  tokensPerMinute: opt(r.tokens_per_minute),
  maxConcurrency: opt(r.max_concurrency),
  createdAtMs: r.created_at_ms,
  revokedAtMs: opt(r.revoked_at_ms),
});

/**
 * Columns (id, name, prefix, secret_hash, models_json, requests_per_minute,
 * tokens_per_minute, max_concurrency, created_at_ms, revoked_at_ms).
 */
export const apiKeyValues = (r: ApiKeyRecord): unknown[] => [
  r.id,
  r.name,
  r.prefix,
  r.secretHash,
  JSON.stringify(r.models),
  r.requestsPerMinute ?? null,
  r.tokensPerMinute ?? null,
  r.maxConcurrency ?? null,
  r.createdAtMs,
  r.revokedAtMs ?? null,
];

export const nodeFromRow = (r: NodeRow): NodeRecord => ({
  id: r.id,
  hostname: r.hostname,
  credentialHash: r.credential_hash,
  inventory: new Uint8Array(r.inventory),
  advertiseAddress: r.advertise_address,
  cordoned: r.cordoned === 1,
  draining: r.draining === 1,
  revoked: r.revoked === 1,
  registeredAtMs: r.registered_at_ms,
  // The column holds the reset's expiry (epoch ms, 0 = none); a 1 written before resets
  // expired reads as long past, so such a reset lapses.
  resetUntilMs: r.reset_pending > 0 ? r.reset_pending : undefined,
  ...(isNodeLiveness(r.state) && r.state_since_ms !== null
    ? { state: r.state, stateSinceMs: r.state_since_ms }
    : {}),
});

const isNodeLiveness = (s: string | null): s is NonNullable<NodeRecord["state"]> =>
  s === "ready" || s === "unreachable" || s === "lost";

/**
 * Columns (id, hostname, credential_hash, inventory, advertise_address, cordoned, draining,
 * revoked, registered_at_ms, reset_pending, state, state_since_ms).
 */
export const nodeValues = (r: NodeRecord): unknown[] => [
  r.id,
  r.hostname,
  r.credentialHash,
  Buffer.from(r.inventory),
  r.advertiseAddress,
  r.cordoned ? 1 : 0,
  r.draining ? 1 : 0,
  r.revoked ? 1 : 0,
  r.registeredAtMs,
  r.resetUntilMs ?? 0,
  r.state ?? null,
  r.stateSinceMs ?? null,
];

export const faultClearFromRow = (r: FaultClearRow): FaultClearRecord => ({
  gpuUuid: r.gpu_uuid,
  faultKey: r.fault_key,
  lastSeenUnixMs: r.last_seen_unix_ms,
  clearedAtMs: r.cleared_at_ms,
});

export const replicaStatusFromRow = (r: ReplicaStatusRow): ReplicaStatusRecord => ({
  replicaId: r.replica_id,
  rank: r.rank,
  nodeId: r.node_id,
  state: r.state,
  apiPort: opt(r.api_port),
  stateSinceMs: r.state_since_ms,
  specHash: r.spec_hash,
  revision: r.revision,
  pid: opt(r.pid),
  startedAtMs: opt(r.started_at_ms),
});

/**
 * Columns (replica_id, rank, node_id, state, api_port, state_since_ms, spec_hash, revision,
 * pid, started_at_ms).
 */
export const replicaStatusValues = (r: ReplicaStatusRecord): unknown[] => [
  r.replicaId,
  r.rank,
  r.nodeId,
  r.state,
  r.apiPort ?? null,
  r.stateSinceMs,
  r.specHash,
  r.revision,
  r.pid ?? null,
  r.startedAtMs ?? null,
];

export const eventFromRow = (r: EventRow): EventRecord => ({
  id: r.id,
  atMs: r.at_ms,
  kind: r.kind,
  subject: r.subject,
  message: r.message,
  severity: r.severity as EventSeverity,
});
