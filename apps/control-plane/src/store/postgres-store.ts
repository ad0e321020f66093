import { createHash } from "node:crypto";
import pg from "pg";
import { ControlPlaneError, isControlPlaneError } from "../errors.js";
import { FIRST_TABLES, LATER_TABLES, MIGRATIONS, postgresDdl } from "./migrations.js";
import {
  API_KEY_COLUMNS,
  type ApiKeyRow,
  AVOIDED_NODE_COLUMNS,
  type AvoidedNodeRow,
  apiKeyFromRow,
  apiKeyValues,
  avoidedNodeFromRow,
  avoidedNodeValues,
  DEPLOYMENT_COLUMNS,
  DEPLOYMENT_REVISION_COLUMNS,
  type DeploymentRevisionRow,
  type DeploymentRow,
  deploymentFromRow,
  deploymentRevisionFromRow,
  deploymentRevisionValues,
  deploymentValues,
  type EventRow,
  eventFromRow,
  type FaultClearRow,
  faultClearFromRow,
  NODE_COLUMNS,
  type NodeRow,
  nodeFromRow,
  nodeValues,
  PLACEMENT_COLUMNS,
  type PlacementRow,
  placementFromRow,
  placementValues,
  type ReplicaStatusRow,
  replicaStatusFromRow,
  replicaStatusValues,
  TENANT_COLUMNS,
  type TenantRow,
  tenantFromRow,
  tenantValues,
  upsertSql,
} from "./rows.js";
import type {
  ApiKeyRecord,
  AvoidedNodeRecord,
  ClusterStore,
  DeploymentRecord,
  DeploymentRevisionRecord,
  EventRecord,
  FaultClearRecord,
  NodeRecord,
  PlacementRecord,
  ReplicaStatusRecord,
  TenantRecord,
} from "./types.js";

/*
 * The PostgreSQL engine of the state store, for several control-plane instances of which one
 * leads (see postgres-lease.ts). The leader holds the whole store in memory, as the embedded
 * engine's caller does anyway, and writes through: each write lands in the copy at once (the
 * cluster's state changes stay synchronous) and is committed in the background, in order,
 * many writes to a transaction. Every such transaction first locks the lease row and checks
 * that this instance still holds it at its epoch: a leader that lost the lease can never
 * write again, whatever its clock or its network believe. Answers to clients wait for
 * `flush()`, so nothing acknowledged is lost when the leader dies.
 */

/** Coordination tables, PostgreSQL only: the lease, the instances, the cluster's identity. */
const COORDINATION_DDL = `
  CREATE TABLE IF NOT EXISTS llmgw_schema (version INT NOT NULL);
  CREATE TABLE IF NOT EXISTS llmgw_leader (
    id INT PRIMARY KEY CHECK (id = 1),
    holder TEXT NOT NULL,
    holder_url TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL
  );
  CREATE TABLE IF NOT EXISTS llmgw_instances (
    id TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    version TEXT NOT NULL,
    started_at_ms BIGINT NOT NULL,
    seen_at TIMESTAMPTZ NOT NULL
  );
  CREATE TABLE IF NOT EXISTS llmgw_cluster (
    id INT PRIMARY KEY CHECK (id = 1),
    tokens_sha256 TEXT NOT NULL
  );
  INSERT INTO llmgw_schema (version) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM llmgw_schema);
  INSERT INTO llmgw_leader (id, holder, holder_url, epoch, expires_at)
    VALUES (1, '', '', 0, '-infinity') ON CONFLICT (id) DO NOTHING;`;

/** Advisory lock key serialising migrations between instances starting together. */
const MIGRATION_LOCK = 7_070_001;

/** `url` without its password, for messages and logs. */
export function redactStoreUrl(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = "***";
    u.searchParams.delete("password");
    return u.toString();
  } catch {
    return "postgres://(unparsable URL)";
  }
}

/** 64-bit integers as numbers: every one we store is an epoch ms, an id or a port. */
const TYPES = {
  getTypeParser: ((oid: number, format?: string) =>
    oid === 20 ? (v: string) => Number(v) : pg.types.getTypeParser(oid, format as "text")) as never,
};

/** Network and server-going-away failures: worth retrying once the database is back. */
export function isTransientPgError(error: unknown): boolean {
  const code = (error as { code?: unknown }).code;
  if (typeof code !== "string") {
    const message = (error as Error | undefined)?.message ?? "";
    return /Connection terminated|timeout|not queryable|Client has encountered a connection error/i.test(
      message,
    );
  }
  return (
    code.startsWith("08") ||
    code.startsWith("57P") ||
    code.startsWith("53") ||
    ["ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "EPIPE", "EHOSTUNREACH", "ENOTFOUND"].includes(code)
  );
}

/** The channel the leader notifies in every transaction it commits: followers re-read. */
export const STATE_CHANGED_CHANNEL = "llmgw_state_changed";

/**
 * The most statements one commit carries (whole change batches, at least one): 500 round
 * trips take ~25 ms on loopback and ~250 ms at 0.5 ms per round trip, far inside the lease
 * renewal's wait for the row the commit holds locked (half a ttl).
 */
export const MAX_STATEMENTS_PER_COMMIT = 500;

/** A PostgreSQL database holding (or about to hold) a cluster's state. */
export interface PostgresDatabase {
  /** The URL without its password. */
  readonly location: string;
  /** A new connected client; the caller ends it. */
  connect(options?: { queryTimeoutMs?: number }): Promise<pg.Client>;
}

function failed(location: string, what: string, cause: unknown): ControlPlaneError {
  return new ControlPlaneError(
    "LLMGW_CONTROL_PLANE_STORE_FAILED",
    `the state store ${location} failed (${what}): ${(cause as Error).message}`,
    { cause },
  );
}

/**
 * Connects to the database, creates the coordination tables and runs the state migrations
 * this build has and the database lacks, one transaction each, under an advisory lock (so
 * instances starting together migrate once). `tokens` (the data dir's join, admin and
 * router tokens) are compared by hash with those the first instance recorded: instances of
 * one cluster must share them. Throws `LLMGW_CONTROL_PLANE_STORE_TOO_NEW` for a schema newer
 * than this build, `…_STORE_CORRUPT` for missing tables, `…_CONFIG_INVALID` for other
 * tokens, `…_STORE_FAILED` when the database cannot be reached.
 */
export async function openPostgresDatabase(options: {
  readonly url: string;
  readonly tokens: readonly string[];
  /** Test seam: the migrations to run (default {@link MIGRATIONS}). */
  readonly migrations?: readonly string[];
}): Promise<PostgresDatabase> {
  const location = redactStoreUrl(options.url);
  const migrations = options.migrations ?? MIGRATIONS;
  const database: PostgresDatabase = {
    location,
    async connect({ queryTimeoutMs } = {}) {
      const client = new pg.Client({
        connectionString: options.url,
        types: TYPES,
        connectionTimeoutMillis: 5_000,
        ...(queryTimeoutMs === undefined ? {} : { query_timeout: queryTimeoutMs }),
        application_name: "llmgw-control-plane",
      });
      // An idle client whose server went away emits "error"; its next query fails anyway.
      client.on("error", () => {});
      try {
        await client.connect();
      } catch (cause) {
        await client.end().catch(() => {});
        throw cause;
      }
      return client;
    },
  };
  let client: pg.Client;
  try {
    client = await database.connect();
  } catch (cause) {
    throw failed(location, "connect", cause);
  }
  try {
    await client.query("SELECT pg_advisory_lock($1)", [MIGRATION_LOCK]);
    await client.query(COORDINATION_DDL);
    const version = Number(
      (await client.query<{ version: number }>("SELECT version FROM llmgw_schema")).rows[0]
        ?.version ?? 0,
    );
    if (version > migrations.length) {
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_STORE_TOO_NEW",
        `the state store ${location} has schema version ${version}, newer than this build understands (${migrations.length}); run the newer llmgw or restore a backup`,
      );
    }
    if (version > 0) {
      const tables = new Set(
        (
          await client.query<{ table_name: string }>(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()",
          )
        ).rows.map((r) => r.table_name),
      );
      const expected = [
        ...FIRST_TABLES,
        ...LATER_TABLES.filter(([, since]) => version >= since).map(([t]) => t),
      ];
      for (const table of expected) {
        if (!tables.has(table))
          throw new ControlPlaneError(
            "LLMGW_CONTROL_PLANE_STORE_CORRUPT",
            `the state store ${location} lacks table ${table} at schema version ${version}; refusing to start with an empty cluster. Restore the database from a backup.`,
          );
      }
    }
    for (let v = version; v < migrations.length; v++) {
      await client.query("BEGIN");
      try {
        await client.query(postgresDdl(migrations[v] as string));
        await client.query("UPDATE llmgw_schema SET version = $1", [v + 1]);
        await client.query("COMMIT");
      } catch (cause) {
        await client.query("ROLLBACK").catch(() => {});
        throw failed(location, `migration to schema version ${v + 1}`, cause);
      }
    }
    const tokensSha256 = createHash("sha256").update(options.tokens.join("\n")).digest("hex");
    await client.query(
      "INSERT INTO llmgw_cluster (id, tokens_sha256) VALUES (1, $1) ON CONFLICT (id) DO NOTHING",
      [tokensSha256],
    );
    const recorded = (
      await client.query<{ tokens_sha256: string }>("SELECT tokens_sha256 FROM llmgw_cluster")
    ).rows[0]?.tokens_sha256;
    if (recorded !== tokensSha256) {
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_CONFIG_INVALID",
        `the state store ${location} belongs to a cluster with other tokens than this data dir's: every control-plane instance of a cluster needs the same join, admin and router tokens (copy the token files of the first instance's --data-dir)`,
      );
    }
  } catch (error) {
    if (error instanceof ControlPlaneError) throw error;
    throw failed(location, "prepare", error);
  } finally {
    await client.end().catch(() => {});
  }
  return database;
}

/** Every record of a store, each list in the order the `list…` methods return it. */
export interface StoreSnapshot {
  readonly deployments: readonly DeploymentRecord[];
  /** By name, then revision. */
  readonly deploymentRevisions: readonly DeploymentRevisionRecord[];
  readonly placements: readonly PlacementRecord[];
  readonly apiKeys: readonly ApiKeyRecord[];
  /** By name. */
  readonly tenants: readonly TenantRecord[];
  readonly nodes: readonly NodeRecord[];
  readonly faultClears: readonly FaultClearRecord[];
  readonly replicaStatuses: readonly ReplicaStatusRecord[];
  /** By deployment, then node id. */
  readonly avoidedNodes: readonly AvoidedNodeRecord[];
  /** The newest events, oldest first. */
  readonly events: readonly EventRecord[];
  /** The highest event id ever stored (0 for none). */
  readonly lastEventId: number;
}

/**
 * Reads every table in one read-only snapshot; at most `eventsKept` newest events. With
 * `inTransaction`, inside the caller's open transaction instead (it sees its own writes).
 */
export async function readSnapshot(
  client: pg.Client,
  eventsKept: number,
  inTransaction = false,
): Promise<StoreSnapshot> {
  if (!inTransaction) await client.query("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
  try {
    const rows = async <R extends pg.QueryResultRow>(sql: string, values: unknown[] = []) =>
      (await client.query<R>(sql, values)).rows;
    const lastEventId =
      (await rows<{ id: number }>("SELECT COALESCE(MAX(id), 0) AS id FROM events"))[0]?.id ?? 0;
    const snapshot: StoreSnapshot = {
      deployments: (await rows<DeploymentRow>("SELECT * FROM deployments ORDER BY name")).map(
        deploymentFromRow,
      ),
      deploymentRevisions: (
        await rows<DeploymentRevisionRow>(
          "SELECT * FROM deployment_revisions ORDER BY name, revision",
        )
      ).map(deploymentRevisionFromRow),
      placements: (await rows<PlacementRow>("SELECT * FROM placements ORDER BY replica_id")).map(
        placementFromRow,
      ),
      apiKeys: (await rows<ApiKeyRow>("SELECT * FROM api_keys ORDER BY created_at_ms, id")).map(
        apiKeyFromRow,
      ),
      tenants: (await rows<TenantRow>("SELECT * FROM tenants ORDER BY name")).map(tenantFromRow),
      nodes: (await rows<NodeRow>("SELECT * FROM nodes ORDER BY registered_at_ms, id")).map(
        nodeFromRow,
      ),
      faultClears: (
        await rows<FaultClearRow>("SELECT * FROM gpu_fault_clears ORDER BY gpu_uuid, fault_key")
      ).map(faultClearFromRow),
      replicaStatuses: (
        await rows<ReplicaStatusRow>("SELECT * FROM replica_statuses ORDER BY replica_id, rank")
      ).map(replicaStatusFromRow),
      avoidedNodes: (
        await rows<AvoidedNodeRow>("SELECT * FROM avoided_nodes ORDER BY deployment, node_id")
      ).map(avoidedNodeFromRow),
      events: (
        await rows<EventRow>("SELECT * FROM events WHERE id > $1 ORDER BY id", [
          lastEventId - eventsKept,
        ])
      ).map(eventFromRow),
      lastEventId,
    };
    if (!inTransaction) await client.query("COMMIT");
    return snapshot;
  } catch (error) {
    if (!inTransaction) await client.query("ROLLBACK").catch(() => {});
    throw error;
  }
}

/** Who writes: the lease holder and the epoch it won. */
export interface WriterIdentity {
  readonly holder: string;
  readonly epoch: number;
}

/** Options of {@link openPostgresStore}. */
export interface PostgresStoreOptions {
  readonly database: PostgresDatabase;
  readonly writer: WriterIdentity;
  /** Events kept; older ones are dropped on append. Default 1000. */
  readonly eventsKept?: number;
  /** Called once when a commit found the lease held by another epoch: stop leading. */
  readonly onFenced?: (error: ControlPlaneError) => void;
  readonly log?: (line: string) => void;
}

interface Statement {
  readonly text: string;
  readonly values: readonly unknown[];
}

/** The store as a leader uses it: a {@link ClusterStore} plus what a fenced writer needs. */
export interface PostgresStore extends ClusterStore {
  /** Writes queued and not yet committed. */
  readonly pending: number;
}

const keyOf = (replicaId: string, rank: number) => `${replicaId}\u0000${rank}`;
const revisionKey = (name: string, revision: number) => `${name}\u0000${revision}`;
const avoidedKey = (deployment: string, nodeId: string) => `${deployment}\u0000${nodeId}`;

/** Whole-row writes, each naming every column of its table (rows.ts). */
const UPSERT = {
  // A deployment keeps the creation time it was first stored with.
  deployment: upsertSql("postgres", "deployments", DEPLOYMENT_COLUMNS, ["name"], ["created_at_ms"]),
  deploymentRevision: upsertSql("postgres", "deployment_revisions", DEPLOYMENT_REVISION_COLUMNS, [
    "name",
    "revision",
  ]),
  placement: upsertSql("postgres", "placements", PLACEMENT_COLUMNS, ["replica_id"]),
  node: upsertSql("postgres", "nodes", NODE_COLUMNS, ["id"]),
  apiKey: upsertSql("postgres", "api_keys", API_KEY_COLUMNS, ["id"]),
  // A tenant keeps the creation time it was first stored with.
  tenant: upsertSql("postgres", "tenants", TENANT_COLUMNS, ["name"], ["created_at_ms"]),
  avoidedNode: upsertSql("postgres", "avoided_nodes", AVOIDED_NODE_COLUMNS, [
    "deployment",
    "node_id",
  ]),
};

/**
 * Loads the whole store into memory and returns it as a {@link ClusterStore} whose writes
 * commit in the background under the lease `writer` holds. Throws `…_STORE_FAILED` when the
 * database cannot be read, `…_STORE_CORRUPT` naming the row when a stored record does not
 * decode.
 */
export async function openPostgresStore(options: PostgresStoreOptions): Promise<PostgresStore> {
  const { database, writer } = options;
  const location = database.location;
  const eventsKept = options.eventsKept ?? 1000;
  const log = options.log ?? (() => {});
  const deployments = new Map<string, DeploymentRecord>();
  const revisions = new Map<string, DeploymentRevisionRecord>();
  const placements = new Map<string, PlacementRecord>();
  const apiKeys = new Map<string, ApiKeyRecord>();
  const tenants = new Map<string, TenantRecord>();
  const nodes = new Map<string, NodeRecord>();
  const faultClears = new Map<string, FaultClearRecord[]>();
  const statuses = new Map<string, ReplicaStatusRecord>();
  const avoided = new Map<string, AvoidedNodeRecord>();
  let events: EventRecord[] = [];
  let nextEventId = 1;

  let snapshot: StoreSnapshot;
  let client: pg.Client | undefined;
  try {
    client = await database.connect();
    snapshot = await readSnapshot(client, eventsKept);
  } catch (cause) {
    // A stored record that does not decode: STORE_CORRUPT naming the row, not a database failure.
    if (isControlPlaneError(cause)) throw cause;
    throw failed(location, "load", cause);
  } finally {
    await client?.end().catch(() => {});
  }
  for (const r of snapshot.deployments) deployments.set(r.name, r);
  for (const r of snapshot.deploymentRevisions) revisions.set(revisionKey(r.name, r.revision), r);
  for (const r of snapshot.placements) placements.set(r.replicaId, r);
  for (const r of snapshot.apiKeys) apiKeys.set(r.id, r);
  for (const r of snapshot.tenants) tenants.set(r.name, r);
  for (const r of snapshot.nodes) nodes.set(r.id, r);
  for (const r of snapshot.faultClears) {
    const list = faultClears.get(r.gpuUuid) ?? [];
    list.push(r);
    faultClears.set(r.gpuUuid, list);
  }
  for (const r of snapshot.replicaStatuses) statuses.set(keyOf(r.replicaId, r.rank), r);
  for (const r of snapshot.avoidedNodes) avoided.set(avoidedKey(r.deployment, r.nodeId), r);
  events = [...snapshot.events];
  nextEventId = snapshot.lastEventId + 1;

  // ------------------------------------------------------------------ the writer
  /** Statements of the open `transaction`, and how to undo its changes to the copy. */
  let tx: { statements: Statement[]; undo: (() => void)[] } | undefined;
  /** Committed batches are numbered; `flush` waits for the number queued when it was called. */
  const queue: { seq: number; statements: Statement[] }[] = [];
  let queuedSeq = 0;
  let committedSeq = 0;
  const waiters: {
    seq: number;
    resolve: () => void;
    reject: (e: Error) => void;
    timer: NodeJS.Timeout;
  }[] = [];
  let ended: ControlPlaneError | undefined;
  let writerClient: pg.Client | undefined;
  let draining = false;
  let retryTimer: NodeJS.Timeout | undefined;
  let backoffMs = 100;
  let unavailableSince: number | undefined;

  const enqueue = (statements: Statement[]) => {
    if (ended || statements.length === 0) return;
    queue.push({ seq: ++queuedSeq, statements });
    if (!draining && retryTimer === undefined) setImmediate(drain);
  };
  const write = (statement: Statement, undo?: () => void) => {
    if (tx) {
      tx.statements.push(statement);
      if (undo) tx.undo.push(undo);
    } else enqueue([statement]);
  };
  const settle = () => {
    for (let i = waiters.length - 1; i >= 0; i--) {
      const w = waiters[i];
      if (w && w.seq <= committedSeq) {
        clearTimeout(w.timer);
        waiters.splice(i, 1);
        w.resolve();
      }
    }
  };
  /** Ends the store with `error`; false when it had ended already (closed, or failed before). */
  const fail = (error: ControlPlaneError): boolean => {
    if (ended) return false;
    ended = error;
    queue.length = 0;
    clearTimeout(retryTimer);
    for (const w of waiters.splice(0)) {
      clearTimeout(w.timer);
      w.reject(error);
    }
    const c = writerClient;
    writerClient = undefined;
    void c?.end().catch(() => {});
    return true;
  };
  /** Ends a client the writer no longer uses. */
  const drop = (c: pg.Client | undefined) => {
    if (c === writerClient) writerClient = undefined;
    void c?.end().catch(() => {});
  };
  async function drain(): Promise<void> {
    retryTimer = undefined;
    if (draining || ended || queue.length === 0) return;
    draining = true;
    // Whole change batches up to MAX_STATEMENTS_PER_COMMIT (at least one): the commit holds
    // the lease row locked, and a backlog merged into one transaction (after an outage, a wave
    // of re-registrations) kept the holder's own renewal waiting past its ttl, so the leader
    // deposed itself mid-commit and lost the batch.
    let count = 0;
    let take = 0;
    while (take < queue.length && (take === 0 || count < MAX_STATEMENTS_PER_COMMIT))
      count += queue[take++]?.statements.length ?? 0;
    const batch = queue.slice(0, take);
    const lastSeq = batch[batch.length - 1]?.seq ?? committedSeq;
    try {
      writerClient ??= await database.connect({ queryTimeoutMs: 10_000 });
      const c = writerClient;
      // Closed (or failed) while connecting: nothing more may commit.
      if (ended) return drop(c);
      await c.query("BEGIN");
      const fence = await c.query(
        "SELECT 1 FROM llmgw_leader WHERE id = 1 AND holder = $1 AND epoch = $2 AND expires_at > clock_timestamp() FOR UPDATE",
        [writer.holder, writer.epoch],
      );
      if (fence.rowCount !== 1) {
        await c.query("ROLLBACK").catch(() => {});
        drop(c);
        const error = new ControlPlaneError(
          "LLMGW_CONTROL_PLANE_NOT_LEADER",
          `this control plane no longer holds the leader lease of ${location} (epoch ${writer.epoch}); its unwritten changes are dropped`,
        );
        // A store closed meanwhile (its term is over) says nothing: resigning now would
        // resign whatever term this instance holds by then.
        if (fail(error)) options.onFenced?.(error);
        return;
      }
      for (const { statements } of batch)
        for (const s of statements) await c.query(s.text, s.values as unknown[]);
      // Delivered at COMMIT, to followers' warm copies (store/warm-copy.ts).
      await c.query(`NOTIFY ${STATE_CHANGED_CHANNEL}`);
      if (ended) {
        await c.query("ROLLBACK").catch(() => {});
        return drop(c);
      }
      await c.query("COMMIT");
      queue.splice(0, batch.length);
      committedSeq = lastSeq;
      backoffMs = 100;
      if (unavailableSince !== undefined) {
        log(
          `the state store ${location} takes writes again after ${Date.now() - unavailableSince} ms`,
        );
        unavailableSince = undefined;
      }
      settle();
    } catch (error) {
      const c = writerClient;
      writerClient = undefined;
      void c?.end().catch(() => {});
      if (ended) return;
      if (!isTransientPgError(error)) {
        // Not the network: a bug or a schema someone changed. Retrying cannot help, and
        // writing later batches without this one would corrupt the state.
        const e = failed(location, "commit", error);
        log(e.message);
        if (fail(e)) options.onFenced?.(e);
        return;
      }
      if (unavailableSince === undefined) {
        unavailableSince = Date.now();
        log(
          `the state store ${location} is unreachable (${(error as Error).message}); ${queue.length} change batches held in memory, retrying`,
        );
      }
      retryTimer = setTimeout(drain, backoffMs);
      retryTimer.unref?.();
      backoffMs = Math.min(backoffMs * 2, 1_000);
    } finally {
      draining = false;
    }
    if (!ended && queue.length > 0 && retryTimer === undefined) setImmediate(drain);
  }

  const store: PostgresStore = {
    location,
    get pending() {
      return queue.reduce((n, b) => n + b.statements.length, 0);
    },
    listDeployments: () => [...deployments.values()].sort((a, b) => cmp(a.name, b.name)),
    putDeployment: (r) => {
      const before = deployments.get(r.name);
      const kept: DeploymentRecord =
        before === undefined ? r : { ...r, createdAtMs: before.createdAtMs };
      deployments.set(r.name, kept);
      write({ text: UPSERT.deployment, values: deploymentValues(r) }, () =>
        restore(deployments, r.name, before),
      );
    },
    deleteDeployment: (name) => {
      const before = deployments.get(name);
      deployments.delete(name);
      write({ text: "DELETE FROM deployments WHERE name = $1", values: [name] }, () =>
        restore(deployments, name, before),
      );
    },
    listDeploymentRevisions: () =>
      [...revisions.values()].sort((a, b) => cmp(a.name, b.name) || a.revision - b.revision),
    putDeploymentRevision: (r) => {
      const key = revisionKey(r.name, r.revision);
      const before = revisions.get(key);
      revisions.set(key, r);
      write({ text: UPSERT.deploymentRevision, values: deploymentRevisionValues(r) }, () =>
        restore(revisions, key, before),
      );
    },
    deleteDeploymentRevision: (name, revision) => {
      const key = revisionKey(name, revision);
      const before = revisions.get(key);
      revisions.delete(key);
      write(
        {
          text: "DELETE FROM deployment_revisions WHERE name = $1 AND revision = $2",
          values: [name, revision],
        },
        () => restore(revisions, key, before),
      );
    },
    listPlacements: () => [...placements.values()].sort((a, b) => cmp(a.replicaId, b.replicaId)),
    putPlacement: (r) => {
      const before = placements.get(r.replicaId);
      placements.set(r.replicaId, r);
      write({ text: UPSERT.placement, values: placementValues(r) }, () =>
        restore(placements, r.replicaId, before),
      );
    },
    deletePlacement: (id) => {
      const before = placements.get(id);
      placements.delete(id);
      write({ text: "DELETE FROM placements WHERE replica_id = $1", values: [id] }, () =>
        restore(placements, id, before),
      );
    },
    listApiKeys: () =>
      [...apiKeys.values()].sort((a, b) => a.createdAtMs - b.createdAtMs || cmp(a.id, b.id)),
    putApiKey: (r) => {
      const before = apiKeys.get(r.id);
      for (const k of apiKeys.values()) {
        if (k.id !== r.id && k.secretHash === r.secretHash)
          throw failed(location, "putApiKey", new Error("a key with this secret exists"));
      }
      apiKeys.set(r.id, r);
      write({ text: UPSERT.apiKey, values: apiKeyValues(r) }, () => restore(apiKeys, r.id, before));
    },
    listTenants: () => [...tenants.values()].sort((a, b) => cmp(a.name, b.name)),
    putTenant: (r) => {
      const before = tenants.get(r.name);
      const kept: TenantRecord =
        before === undefined ? r : { ...r, createdAtMs: before.createdAtMs };
      tenants.set(r.name, kept);
      write({ text: UPSERT.tenant, values: tenantValues(r) }, () =>
        restore(tenants, r.name, before),
      );
    },
    deleteTenant: (name) => {
      const before = tenants.get(name);
      tenants.delete(name);
      write({ text: "DELETE FROM tenants WHERE name = $1", values: [name] }, () =>
        restore(tenants, name, before),
      );
    },
    listNodes: () =>
      [...nodes.values()].sort((a, b) => a.registeredAtMs - b.registeredAtMs || cmp(a.id, b.id)),
    putNode: (r) => {
      const before = nodes.get(r.id);
      nodes.set(r.id, r);
      write({ text: UPSERT.node, values: nodeValues(r) }, () => restore(nodes, r.id, before));
    },
    putNodeState: (id, state, sinceMs) => {
      const before = nodes.get(id);
      if (before === undefined) return;
      nodes.set(id, { ...before, state, stateSinceMs: sinceMs });
      write(
        {
          text: "UPDATE nodes SET state = $1, state_since_ms = $2 WHERE id = $3",
          values: [state, sinceMs, id],
        },
        () => restore(nodes, id, before),
      );
    },
    deleteNode: (id) => {
      const before = nodes.get(id);
      nodes.delete(id);
      write({ text: "DELETE FROM nodes WHERE id = $1", values: [id] }, () =>
        restore(nodes, id, before),
      );
    },
    listFaultClears: () =>
      [...faultClears.keys()]
        .sort(cmp)
        .flatMap((uuid) =>
          [...(faultClears.get(uuid) ?? [])].sort((a, b) => cmp(a.faultKey, b.faultKey)),
        ),
    replaceFaultClears: (gpuUuid, records) => {
      const before = faultClears.get(gpuUuid);
      const next = records.map((r) => ({ ...r, gpuUuid }));
      if (next.length === 0) faultClears.delete(gpuUuid);
      else faultClears.set(gpuUuid, next);
      store.transaction(() => {
        write({ text: "DELETE FROM gpu_fault_clears WHERE gpu_uuid = $1", values: [gpuUuid] }, () =>
          restore(faultClears, gpuUuid, before),
        );
        for (const r of next)
          write({
            text: `INSERT INTO gpu_fault_clears (gpu_uuid, fault_key, last_seen_unix_ms,
                     cleared_at_ms) VALUES ($1, $2, $3, $4)`,
            values: [gpuUuid, r.faultKey, r.lastSeenUnixMs, r.clearedAtMs],
          });
      });
    },
    listReplicaStatuses: () =>
      [...statuses.values()].sort((a, b) => cmp(a.replicaId, b.replicaId) || a.rank - b.rank),
    putReplicaStatus: (r) => {
      const key = keyOf(r.replicaId, r.rank);
      const before = statuses.get(key);
      statuses.set(key, r);
      write(
        {
          text: `INSERT INTO replica_statuses (replica_id, rank, node_id, state, api_port,
                   state_since_ms, spec_hash, revision, pid, started_at_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                 ON CONFLICT (replica_id, rank) DO UPDATE SET node_id = excluded.node_id,
                   state = excluded.state, api_port = excluded.api_port,
                   state_since_ms = excluded.state_since_ms, spec_hash = excluded.spec_hash,
                   revision = excluded.revision, pid = excluded.pid,
                   started_at_ms = excluded.started_at_ms`,
          values: replicaStatusValues(r),
        },
        () => restore(statuses, key, before),
      );
    },
    deleteReplicaStatuses: (replicaId, rank) => {
      const removed = [...statuses.entries()].filter(
        ([, s]) => s.replicaId === replicaId && (rank === undefined || s.rank === rank),
      );
      for (const [key] of removed) statuses.delete(key);
      write(
        rank === undefined
          ? { text: "DELETE FROM replica_statuses WHERE replica_id = $1", values: [replicaId] }
          : {
              text: "DELETE FROM replica_statuses WHERE replica_id = $1 AND rank = $2",
              values: [replicaId, rank],
            },
        () => {
          for (const [key, s] of removed) statuses.set(key, s);
        },
      );
    },
    listAvoidedNodes: () =>
      [...avoided.values()].sort(
        (a, b) => cmp(a.deployment, b.deployment) || cmp(a.nodeId, b.nodeId),
      ),
    putAvoidedNode: (r) => {
      const key = avoidedKey(r.deployment, r.nodeId);
      const before = avoided.get(key);
      avoided.set(key, r);
      write({ text: UPSERT.avoidedNode, values: avoidedNodeValues(r) }, () =>
        restore(avoided, key, before),
      );
    },
    deleteAvoidedNode: (deployment, nodeId) => {
      const key = avoidedKey(deployment, nodeId);
      const before = avoided.get(key);
      avoided.delete(key);
      write(
        {
          text: "DELETE FROM avoided_nodes WHERE deployment = $1 AND node_id = $2",
          values: [deployment, nodeId],
        },
        () => restore(avoided, key, before),
      );
    },
    appendEvent: (e) => {
      const event: EventRecord = { id: nextEventId++, ...e };
      const before = events;
      events = [...events.slice(Math.max(0, events.length + 1 - eventsKept)), event];
      store.transaction(() => {
        write(
          {
            // A batch whose COMMIT was answered by a dropped connection is sent again; if it
            // had committed, its events are there already (the other writes are upserts and
            // deletes, the same when repeated).
            text: "INSERT INTO events (id, at_ms, kind, subject, message, severity) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING",
            values: [event.id, e.atMs, e.kind, e.subject, e.message, e.severity],
          },
          () => {
            events = before;
            nextEventId = event.id;
          },
        );
        if (event.id > eventsKept)
          write({ text: "DELETE FROM events WHERE id <= $1", values: [event.id - eventsKept] });
      });
      return event;
    },
    listEvents: ({ afterId = 0, limit }) => {
      // Paging: the oldest after `afterId`; without it, the newest.
      if (afterId > 0) return events.filter((e) => e.id > afterId).slice(0, limit);
      return events.slice(Math.max(0, events.length - limit));
    },
    transaction: <T>(fn: () => T): T => {
      if (tx) return fn();
      const open = { statements: [] as Statement[], undo: [] as (() => void)[] };
      tx = open;
      let result: T;
      try {
        result = fn();
      } catch (error) {
        tx = undefined;
        for (const undo of open.undo.reverse()) undo();
        throw error;
      }
      tx = undefined;
      enqueue(open.statements);
      return result;
    },
    flush: (timeoutMs = 5_000) => {
      if (ended) return Promise.reject(ended);
      const seq = queuedSeq;
      if (seq <= committedSeq) return Promise.resolve();
      return new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => {
          const i = waiters.findIndex((w) => w.timer === timer);
          if (i >= 0) waiters.splice(i, 1);
          reject(
            new ControlPlaneError(
              "LLMGW_CONTROL_PLANE_STORE_UNAVAILABLE",
              `the state store ${location} did not confirm the change within ${timeoutMs} ms; it is kept in memory and written when the database answers, unless this control plane loses the lead first`,
            ),
          );
        }, timeoutMs);
        timer.unref?.();
        waiters.push({ seq, resolve, reject, timer });
      });
    },
    close: () => {
      fail(
        new ControlPlaneError(
          "LLMGW_CONTROL_PLANE_SHUTTING_DOWN",
          "the control plane is shutting down",
        ),
      );
    },
  };
  return store;
}

function cmp(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

function restore<K, V>(map: Map<K, V>, key: K, before: V | undefined): void {
  if (before === undefined) map.delete(key);
  else map.set(key, before);
}
