/**
 * The schema of the state store, shared by both engines: one list of versions, applied in
 * order, written in the SQL both SQLite and PostgreSQL take once {@link postgresDdl} has
 * mapped the three type names that differ. SQLite counts what ran in `PRAGMA user_version`,
 * PostgreSQL in `llmgw_schema`. Each version runs in one transaction on either engine (both
 * have transactional DDL), so an interrupted migration leaves the previous version intact.
 */

/**
 * Schema versions, applied in order; `PRAGMA user_version` holds how many ran. Never edit a
 * shipped entry: append a new one.
 */
export const MIGRATIONS: readonly string[] = [
  `CREATE TABLE deployments (
     name TEXT PRIMARY KEY,
     spec_json TEXT NOT NULL,
     revision INTEGER NOT NULL,
     created_at_ms INTEGER NOT NULL,
     updated_at_ms INTEGER NOT NULL
   );
   CREATE TABLE placements (
     replica_id TEXT PRIMARY KEY,
     deployment TEXT NOT NULL,
     revision INTEGER NOT NULL,
     ranks_json TEXT NOT NULL,
     fabric_id TEXT,
     rendezvous_port INTEGER,
     created_at_ms INTEGER NOT NULL
   );
   CREATE TABLE api_keys (
     id TEXT PRIMARY KEY,
     name TEXT NOT NULL,
     prefix TEXT NOT NULL,
     secret_hash TEXT NOT NULL UNIQUE,
     models_json TEXT NOT NULL,
     requests_per_minute INTEGER,
     tokens_per_minute INTEGER,
     max_concurrency INTEGER,
     created_at_ms INTEGER NOT NULL,
     revoked_at_ms INTEGER
   );
   CREATE TABLE nodes (
     id TEXT PRIMARY KEY,
     hostname TEXT NOT NULL,
     credential_hash TEXT NOT NULL,
     inventory BLOB NOT NULL,
     advertise_address TEXT NOT NULL,
     cordoned INTEGER NOT NULL,
     draining INTEGER NOT NULL,
     revoked INTEGER NOT NULL,
     registered_at_ms INTEGER NOT NULL
   );
   CREATE TABLE events (
     id INTEGER PRIMARY KEY AUTOINCREMENT,
     at_ms INTEGER NOT NULL,
     kind TEXT NOT NULL,
     subject TEXT NOT NULL,
     message TEXT NOT NULL,
     severity TEXT NOT NULL
   );`,
  "ALTER TABLE nodes ADD COLUMN reset_pending INTEGER NOT NULL DEFAULT 0;",
  `CREATE TABLE gpu_fault_clears (
     gpu_uuid TEXT NOT NULL,
     fault_key TEXT NOT NULL,
     last_seen_unix_ms INTEGER NOT NULL,
     cleared_at_ms INTEGER NOT NULL,
     PRIMARY KEY (gpu_uuid, fault_key)
   );`,
  `CREATE TABLE replica_statuses (
     replica_id TEXT NOT NULL,
     rank INTEGER NOT NULL,
     node_id TEXT NOT NULL,
     state TEXT NOT NULL,
     api_port INTEGER,
     state_since_ms INTEGER NOT NULL,
     spec_hash TEXT NOT NULL,
     revision INTEGER NOT NULL,
     pid INTEGER,
     started_at_ms INTEGER,
     PRIMARY KEY (replica_id, rank)
   );`,
  // The leader's last word on each node's liveness, written when it changes (never per
  // heartbeat): what followers show. A leader starting ignores it: a node is unreachable
  // until it heartbeats to that leader.
  `ALTER TABLE nodes ADD COLUMN state TEXT;
   ALTER TABLE nodes ADD COLUMN state_since_ms INTEGER;`,
  // Zero-loss lifecycle: the spec of every revision replicas still run (a rolling update keeps
  // the old one until its last replica drained), each placement's retirement (NULL: serving),
  // each deployment's latest rollout (NULL: none yet), and who drained a node (NULL: not
  // draining, or drained before this was recorded, which counts as the operator's).
  `CREATE TABLE deployment_revisions (
     name TEXT NOT NULL,
     revision INTEGER NOT NULL,
     spec_json TEXT NOT NULL,
     PRIMARY KEY (name, revision)
   );
   ALTER TABLE placements ADD COLUMN retirement_json TEXT;
   ALTER TABLE deployments ADD COLUMN rollout_json TEXT;
   ALTER TABLE nodes ADD COLUMN drained_by TEXT;`,
  // Tenants, usage and priorities. A tenant's and a key's budgets are JSON lists of
  // {period, model, tokens}; a priority is its lower-case class name (NULL: inherited). Usage
  // is kept as rollups, one row per bucket ('minute' | 'hour' | 'day'), start, tenant ('' for
  // none), key id and model, added to by each stored batch, never a row per request; the ids
  // of stored batches make a batch sent twice count once.
  `CREATE TABLE tenants (
     name TEXT PRIMARY KEY,
     requests_per_minute INTEGER,
     tokens_per_minute INTEGER,
     max_concurrency INTEGER,
     budgets_json TEXT NOT NULL,
     priority TEXT,
     weight INTEGER NOT NULL,
     created_at_ms INTEGER NOT NULL,
     updated_at_ms INTEGER NOT NULL
   );
   ALTER TABLE api_keys ADD COLUMN tenant TEXT;
   ALTER TABLE api_keys ADD COLUMN budgets_json TEXT;
   ALTER TABLE api_keys ADD COLUMN priority TEXT;
   CREATE TABLE usage_rollups (
     bucket TEXT NOT NULL,
     start_ms INTEGER NOT NULL,
     tenant TEXT NOT NULL,
     key_id TEXT NOT NULL,
     model TEXT NOT NULL,
     requests INTEGER NOT NULL,
     prompt_tokens INTEGER NOT NULL,
     cached_tokens INTEGER NOT NULL,
     completion_tokens INTEGER NOT NULL,
     gpu_ms INTEGER NOT NULL,
     estimated_requests INTEGER NOT NULL,
     refused_usage INTEGER NOT NULL,
     PRIMARY KEY (bucket, start_ms, tenant, key_id, model)
   );
   CREATE TABLE usage_batches (
     router_id TEXT NOT NULL,
     batch_id TEXT NOT NULL,
     stored_at_ms INTEGER NOT NULL,
     PRIMARY KEY (router_id, batch_id)
   );
   CREATE INDEX usage_batches_stored ON usage_batches (stored_at_ms);`,
  // Nodes a deployment avoids after a replica kept failing there and moved: a new leader
  // keeps avoiding them, and a repeated move is avoided for longer.
  `CREATE TABLE avoided_nodes (
     deployment TEXT NOT NULL,
     node_id TEXT NOT NULL,
     until_ms INTEGER NOT NULL,
     moves INTEGER NOT NULL,
     moved_at_ms INTEGER NOT NULL,
     PRIMARY KEY (deployment, node_id)
   );`,
  // Usage rollups count the requests whose engine reported its cached tokens, so a row none
  // reported reads "unknown", not 0. Rows written before counted an estimate's cached tokens
  // as 0 and every other answer's as reported (engines llmgw launches leave a zero count
  // out): all but their estimated requests.
  `ALTER TABLE usage_rollups ADD COLUMN cached_reported INTEGER NOT NULL DEFAULT 0;
   UPDATE usage_rollups SET cached_reported = requests - estimated_requests;`,
  // A tenant may ask every router to keep its prefix caches apart ('tenant' | 'key'); NULL: as
  // each router's own --cache-isolation says.
  "ALTER TABLE tenants ADD COLUMN cache_isolation TEXT;",
];

/** Tables added by later migrations: the table and the schema version that has it. */
export const LATER_TABLES: readonly [string, number][] = [
  ["gpu_fault_clears", 3],
  ["replica_statuses", 4],
  ["deployment_revisions", 6],
  ["tenants", 7],
  ["usage_rollups", 7],
  ["usage_batches", 7],
  ["avoided_nodes", 8],
];

/** Tables every schema version has. */
export const FIRST_TABLES: readonly string[] = [
  "deployments",
  "placements",
  "api_keys",
  "nodes",
  "events",
];

/**
 * A migration in PostgreSQL's types: 64-bit integers (epoch ms do not fit in 32 bits), `BYTEA`
 * for blobs, and event ids the leader assigns itself (it is the one writer, fenced), so no
 * sequence to keep in step when a store is copied.
 */
export function postgresDdl(sql: string): string {
  return sql
    .replace(/\bINTEGER PRIMARY KEY AUTOINCREMENT\b/g, "BIGINT PRIMARY KEY")
    .replace(/\bINTEGER\b/g, "BIGINT")
    .replace(/\bBLOB\b/g, "BYTEA");
}
