/*
 * Rows of the state store's tables as both engines return them (the same column names and
 * types once PostgreSQL's 64-bit integers are read as numbers), and the records they hold.
 * The `…Values` functions give a record's columns in the order of the matching `…_COLUMNS`,
 * for positional parameters; every statement that writes a whole row names its columns from
 * those lists, so a column added to a table cannot be left out of one engine's writes.
 *
 * A JSON or enumerated column this build did not write (hand-edited, or damaged) throws
 * `LLMGW_CONTROL_PLANE_STORE_CORRUPT` naming the row and the column: guessing would change
 * what the cluster does (a draining replica taken for serving, say), so the control plane
 * refuses to start on it, as it does for an inventory or a spec that does not decode.
 */
import { ControlPlaneError } from "../errors.js";
import type {
  ApiKeyRecord,
  AvoidedNodeRecord,
  DeploymentRecord,
  DeploymentRevisionRecord,
  EventRecord,
  EventSeverity,
  FaultClearRecord,
  NodeRecord,
  PlacementRecord,
  PriorityClassName,
  ReplicaStatusRecord,
  RetirementRecord,
  RolloutRecord,
  TenantCacheIsolationName,
  TenantRecord,
  TokenBudgetRecord,
} from "./types.js";

export interface DeploymentRow {
  name: string;
  spec_json: string;
  revision: number;
  created_at_ms: number;
  updated_at_ms: number;
  /** Schema v6; NULL: no rollout yet. */
  rollout_json: string | null;
}
export interface DeploymentRevisionRow {
  name: string;
  revision: number;
  spec_json: string;
}
export interface PlacementRow {
  replica_id: string;
  deployment: string;
  revision: number;
  ranks_json: string;
  fabric_id: string | null;
  rendezvous_port: number | null;
  created_at_ms: number;
  /** Schema v6; NULL: serving. */
  retirement_json: string | null;
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
  /** Schema v7; NULL: no tenant. */
  tenant: string | null;
  /** Schema v7; NULL: no budgets (keys created before). */
  budgets_json: string | null;
  /** Schema v7; NULL: inherited. */
  priority: string | null;
}
export interface TenantRow {
  name: string;
  requests_per_minute: number | null;
  tokens_per_minute: number | null;
  max_concurrency: number | null;
  budgets_json: string;
  priority: string | null;
  weight: number;
  /** Schema v10; NULL: none asked. */
  cache_isolation: string | null;
  created_at_ms: number;
  updated_at_ms: number;
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
  /** Schema v6; NULL: not draining, or drained before this was recorded. */
  drained_by: string | null;
}
export interface FaultClearRow {
  gpu_uuid: string;
  fault_key: string;
  last_seen_unix_ms: number;
  cleared_at_ms: number;
}
export interface AvoidedNodeRow {
  deployment: string;
  node_id: string;
  until_ms: number;
  moves: number;
  moved_at_ms: number;
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

/**
 * The statement creating or replacing a whole row of `table`, both engines' dialect: on a
 * conflict over `key` every column of `columns` is overwritten but those in `keep`. `?`
 * placeholders for SQLite, `$1…` for PostgreSQL, in the order of `columns`.
 */
export function upsertSql(
  engine: "sqlite" | "postgres",
  table: string,
  columns: readonly string[],
  key: readonly string[],
  keep: readonly string[] = [],
): string {
  const placeholders = columns.map((_, i) => (engine === "sqlite" ? "?" : `$${i + 1}`));
  const updated = columns.filter((c) => !key.includes(c) && !keep.includes(c));
  return (
    `INSERT INTO ${table} (${columns.join(", ")}) VALUES (${placeholders.join(", ")}) ` +
    `ON CONFLICT (${key.join(", ")}) DO UPDATE SET ${updated.map((c) => `${c} = excluded.${c}`).join(", ")}`
  );
}

/** The columns {@link deploymentValues} gives, in order. */
export const DEPLOYMENT_COLUMNS = [
  "name",
  "spec_json",
  "revision",
  "created_at_ms",
  "updated_at_ms",
  "rollout_json",
] as const;

export const deploymentFromRow = (r: DeploymentRow): DeploymentRecord => {
  const rollout = rolloutFromJson(r.name, r.rollout_json);
  return {
    name: r.name,
    specJson: r.spec_json,
    revision: r.revision,
    createdAtMs: r.created_at_ms,
    updatedAtMs: r.updated_at_ms,
    ...(rollout === undefined ? {} : { rollout }),
  };
};

/** Values of {@link DEPLOYMENT_COLUMNS}. */
export const deploymentValues = (r: DeploymentRecord): unknown[] => [
  r.name,
  r.specJson,
  r.revision,
  r.createdAtMs,
  r.updatedAtMs,
  r.rollout === undefined ? null : rolloutJson(r.rollout),
];

/** The columns {@link deploymentRevisionValues} gives, in order. */
export const DEPLOYMENT_REVISION_COLUMNS = ["name", "revision", "spec_json"] as const;

export const deploymentRevisionFromRow = (r: DeploymentRevisionRow): DeploymentRevisionRecord => ({
  name: r.name,
  revision: r.revision,
  specJson: r.spec_json,
});

/** Values of {@link DEPLOYMENT_REVISION_COLUMNS}. */
export const deploymentRevisionValues = (r: DeploymentRevisionRecord): unknown[] => [
  r.name,
  r.revision,
  r.specJson,
];

/** The columns {@link placementValues} gives, in order. */
export const PLACEMENT_COLUMNS = [
  "replica_id",
  "deployment",
  "revision",
  "ranks_json",
  "fabric_id",
  "rendezvous_port",
  "created_at_ms",
  "retirement_json",
] as const;

export const placementFromRow = (r: PlacementRow): PlacementRecord => {
  const retirement = retirementFromJson(r.replica_id, r.retirement_json);
  return {
    replicaId: r.replica_id,
    deployment: r.deployment,
    revision: r.revision,
    ranks: JSON.parse(r.ranks_json) as PlacementRecord["ranks"],
    fabricId: opt(r.fabric_id),
    rendezvousPort: opt(r.rendezvous_port),
    createdAtMs: r.created_at_ms,
    ...(retirement === undefined ? {} : { retirement }),
  };
};

/** Values of {@link PLACEMENT_COLUMNS}. */
export const placementValues = (r: PlacementRecord): unknown[] => [
  r.replicaId,
  r.deployment,
  r.revision,
  JSON.stringify(r.ranks),
  r.fabricId ?? null,
  r.rendezvousPort ?? null,
  r.createdAtMs,
  r.retirement === undefined ? null : retirementJson(r.retirement),
];

/** The columns {@link apiKeyValues} gives, in order. */
export const API_KEY_COLUMNS = [
  "id",
  "name",
  "prefix",
  "secret_hash",
  "models_json",
  "requests_per_minute",
  "tokens_per_minute",
  "max_concurrency",
  "created_at_ms",
  "revoked_at_ms",
  "tenant",
  "budgets_json",
  "priority",
] as const;

export const apiKeyFromRow = (r: ApiKeyRow): ApiKeyRecord => {
  const row = `API key ${r.id}`;
  const priority = priorityFromColumn(row, "api_keys.priority", r.priority);
  return {
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
    ...(r.tenant === null ? {} : { tenant: r.tenant }),
    budgets:
      r.budgets_json === null ? [] : budgetsFromJson(row, "api_keys.budgets_json", r.budgets_json),
    ...(priority === undefined ? {} : { priority }),
  };
};

/** Values of {@link API_KEY_COLUMNS}. */
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
  r.tenant ?? null,
  budgetsJson(r.budgets),
  r.priority ?? null,
];

/** The columns {@link tenantValues} gives, in order. */
export const TENANT_COLUMNS = [
  "name",
  "requests_per_minute",
  "tokens_per_minute",
  "max_concurrency",
  "budgets_json",
  "priority",
  "weight",
  "cache_isolation",
  "created_at_ms",
  "updated_at_ms",
] as const;

export const tenantFromRow = (r: TenantRow): TenantRecord => {
  const row = `tenant ${r.name}`;
  const priority = priorityFromColumn(row, "tenants.priority", r.priority);
  return {
    name: r.name,
    ...(r.requests_per_minute === null ? {} : { requestsPerMinute: r.requests_per_minute }),
    ...(r.tokens_per_minute === null ? {} : { tokensPerMinute: r.tokens_per_minute }),
    ...(r.max_concurrency === null ? {} : { maxConcurrency: r.max_concurrency }),
    budgets: budgetsFromJson(row, "tenants.budgets_json", r.budgets_json),
    ...(priority === undefined ? {} : { priority }),
    weight: r.weight,
    ...cacheIsolationFromColumn(row, r.cache_isolation),
    createdAtMs: r.created_at_ms,
    updatedAtMs: r.updated_at_ms,
  };
};

/** Values of {@link TENANT_COLUMNS}. */
export const tenantValues = (r: TenantRecord): unknown[] => [
  r.name,
  r.requestsPerMinute ?? null,
  r.tokensPerMinute ?? null,
  r.maxConcurrency ?? null,
  budgetsJson(r.budgets),
  r.priority ?? null,
  r.weight,
  r.cacheIsolation ?? null,
  r.createdAtMs,
  r.updatedAtMs,
];

/** The columns {@link nodeValues} gives, in order. */
export const NODE_COLUMNS = [
  "id",
  "hostname",
  "credential_hash",
  "inventory",
  "advertise_address",
  "cordoned",
  "draining",
  "revoked",
  "registered_at_ms",
  "reset_pending",
  "state",
  "state_since_ms",
  "drained_by",
] as const;

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
  ...(r.drained_by === null ? {} : { drainedBy: drainedByFromColumn(r.id, r.drained_by) }),
});

const isNodeLiveness = (s: string | null): s is NonNullable<NodeRecord["state"]> =>
  s === "ready" || s === "unreachable" || s === "lost";

const DRAINED_BY = ["operator", "agent"] as const;

function drainedByFromColumn(id: string, value: string): NonNullable<NodeRecord["drainedBy"]> {
  const known = DRAINED_BY.find((d) => d === value);
  if (known === undefined)
    throw undecodable(
      `node ${id}`,
      "nodes.drained_by",
      `is ${describe(value)}, not ${DRAINED_BY.map((d) => `"${d}"`).join(" or ")}`,
    );
  return known;
}

/** Values of {@link NODE_COLUMNS}. */
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
  r.drainedBy ?? null,
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

/** The columns {@link avoidedNodeValues} gives, in order. */
export const AVOIDED_NODE_COLUMNS = [
  "deployment",
  "node_id",
  "until_ms",
  "moves",
  "moved_at_ms",
] as const;

export const avoidedNodeFromRow = (r: AvoidedNodeRow): AvoidedNodeRecord => ({
  deployment: r.deployment,
  nodeId: r.node_id,
  untilMs: r.until_ms,
  moves: r.moves,
  movedAtMs: r.moved_at_ms,
});

/** Values of {@link AVOIDED_NODE_COLUMNS}. */
export const avoidedNodeValues = (r: AvoidedNodeRecord): unknown[] => [
  r.deployment,
  r.nodeId,
  r.untilMs,
  r.moves,
  r.movedAtMs,
];

export const eventFromRow = (r: EventRow): EventRecord => ({
  id: r.id,
  atMs: r.at_ms,
  kind: r.kind,
  subject: r.subject,
  message: r.message,
  severity: r.severity as EventSeverity,
});

// ------------------------------------------------------------------ JSON columns

/*
 * Written field by field, so a record carrying anything more (a caller's spread) stores only
 * what the type has; absent optional fields stay absent (JSON drops `undefined`).
 */
const retirementJson = (r: RetirementRecord): string =>
  JSON.stringify({
    code: r.code,
    message: r.message,
    phase: r.phase,
    sinceMs: r.sinceMs,
    drainingSinceMs: r.drainingSinceMs,
    deadlineMs: r.deadlineMs,
  });

const rolloutJson = (r: RolloutRecord): string =>
  JSON.stringify({
    state: r.state,
    fromRevision: r.fromRevision,
    toRevision: r.toRevision,
    message: r.message,
    startedAtMs: r.startedAtMs,
    updatedAtMs: r.updatedAtMs,
  });

/** A budget list as stored: `{period, model, tokens}` each, `model` "" for every model. */
const budgetsJson = (budgets: readonly TokenBudgetRecord[]): string =>
  JSON.stringify(
    budgets.map((b) => ({ period: b.period, model: b.model ?? "", tokens: b.tokens })),
  );

const RETIREMENT_PHASES = ["waiting", "draining"] as const;
const BUDGET_PERIODS = ["day", "month"] as const;
const PRIORITY_CLASSES = ["critical", "standard", "batch"] as const;
const TENANT_CACHE_ISOLATION = ["tenant", "key"] as const;

/** `tenants.cache_isolation`; NULL: none asked. */
function cacheIsolationFromColumn(
  row: string,
  value: string | null | undefined,
): { cacheIsolation?: TenantCacheIsolationName } {
  if (value === null || value === undefined) return {};
  const known = TENANT_CACHE_ISOLATION.find((m) => m === value);
  if (known === undefined)
    throw undecodable(
      row,
      "tenants.cache_isolation",
      `is ${describe(value)}, not ${TENANT_CACHE_ISOLATION.map((m) => `"${m}"`).join(" or ")}`,
    );
  return { cacheIsolation: known };
}

/** A priority column; NULL: inherited. */
function priorityFromColumn(
  row: string,
  column: string,
  value: string | null,
): PriorityClassName | undefined {
  if (value === null) return undefined;
  const known = PRIORITY_CLASSES.find((p) => p === value);
  if (known === undefined)
    throw undecodable(
      row,
      column,
      `is ${describe(value)}, not ${PRIORITY_CLASSES.map((p) => `"${p}"`).join(" or ")}`,
    );
  return known;
}

/** A budgets column: a JSON list of `{period, model, tokens}`. */
function budgetsFromJson(row: string, column: string, text: string): TokenBudgetRecord[] {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (cause) {
    throw undecodable(row, column, `is not JSON (${(cause as Error).message})`);
  }
  if (!Array.isArray(parsed)) throw undecodable(row, column, `is ${describe(parsed)}, not a list`);
  return parsed.map((item, i) => {
    if (typeof item !== "object" || item === null || Array.isArray(item))
      throw undecodable(row, column, `item ${i} is ${describe(item)}, not an object`);
    const f = jsonFields(row, `${column}[${i}]`, JSON.stringify(item));
    const model = f.text("model");
    const tokens = f.nonNegative("tokens");
    if (tokens < 1) throw undecodable(row, `${column}[${i}]`, "field tokens is 0, not at least 1");
    return {
      period: f.oneOf("period", BUDGET_PERIODS),
      ...(model === "" ? {} : { model }),
      tokens,
    };
  });
}
const ROLLOUT_STATES = ["in-progress", "complete", "rolled-back"] as const;

/** `placements.retirement_json` of replica `replicaId`; NULL: serving. */
function retirementFromJson(replicaId: string, text: string | null): RetirementRecord | undefined {
  if (text === null) return undefined;
  const f = jsonFields(`placement ${replicaId}`, "placements.retirement_json", text);
  const drainingSinceMs = f.optionalNonNegative("drainingSinceMs");
  const deadlineMs = f.optionalNonNegative("deadlineMs");
  return {
    code: f.text("code", { nonEmpty: true }),
    message: f.text("message"),
    phase: f.oneOf("phase", RETIREMENT_PHASES),
    sinceMs: f.nonNegative("sinceMs"),
    ...(drainingSinceMs === undefined ? {} : { drainingSinceMs }),
    ...(deadlineMs === undefined ? {} : { deadlineMs }),
  };
}

/** `deployments.rollout_json` of deployment `name`; NULL: no rollout yet. */
function rolloutFromJson(name: string, text: string | null): RolloutRecord | undefined {
  if (text === null) return undefined;
  const f = jsonFields(`deployment ${name}`, "deployments.rollout_json", text);
  return {
    state: f.oneOf("state", ROLLOUT_STATES),
    fromRevision: f.nonNegative("fromRevision"),
    toRevision: f.nonNegative("toRevision"),
    message: f.text("message"),
    startedAtMs: f.nonNegative("startedAtMs"),
    updatedAtMs: f.nonNegative("updatedAtMs"),
  };
}

function undecodable(row: string, column: string, detail: string): ControlPlaneError {
  return new ControlPlaneError(
    "LLMGW_CONTROL_PLANE_STORE_CORRUPT",
    `the stored ${row} does not decode: ${column} ${detail}; refusing to guess what the cluster should do with it. ` +
      "Restore the store from a backup, or correct the column.",
  );
}

/**
 * Typed reads of the fields of the JSON object `text` in `column` of `row`, each throwing
 * {@link undecodable} naming the field. Fields the reads do not ask for are ignored.
 */
function jsonFields(row: string, column: string, text: string) {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (cause) {
    throw undecodable(row, column, `is not JSON (${(cause as Error).message})`);
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed))
    throw undecodable(row, column, `is ${describe(parsed)}, not an object`);
  const o = parsed as Record<string, unknown>;
  const bad = (key: string, want: string): never => {
    throw undecodable(row, column, `field ${key} is ${describe(o[key])}, not ${want}`);
  };
  const nonNegative = (key: string): number => {
    const v = o[key];
    return typeof v === "number" && Number.isSafeInteger(v) && v >= 0
      ? v
      : bad(key, "a non-negative integer");
  };
  return {
    text: (key: string, { nonEmpty = false } = {}): string => {
      const v = o[key];
      return typeof v === "string" && (!nonEmpty || v !== "")
        ? v
        : bad(key, nonEmpty ? "a non-empty string" : "a string");
    },
    nonNegative,
    optionalNonNegative: (key: string): number | undefined =>
      o[key] === undefined ? undefined : nonNegative(key),
    oneOf: <T extends string>(key: string, values: readonly T[]): T =>
      values.find((v) => v === o[key]) ?? bad(key, values.map((v) => `"${v}"`).join(" or ")),
  };
}

/** A value as a message shows it: short, and never a whole document. */
function describe(v: unknown): string {
  if (v === undefined) return "missing";
  const json = JSON.stringify(v);
  return json.length > 40 ? `${json.slice(0, 40)}…` : json;
}
