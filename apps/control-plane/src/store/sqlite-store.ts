import { chmodSync, closeSync, existsSync, openSync, rmSync, statSync } from "node:fs";
import Database from "better-sqlite3";
import { ControlPlaneError } from "../errors.js";
import { FIRST_TABLES, LATER_TABLES, MIGRATIONS } from "./migrations.js";
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
import { createSqliteUsageStore } from "./sqlite-usage-store.js";
import type {
  ApiKeyRecord,
  AvoidedNodeRecord,
  ClusterStore,
  DeploymentRecord,
  DeploymentRevisionRecord,
  FaultClearRecord,
  NodeRecord,
  PlacementRecord,
  ReplicaStatusRecord,
  TenantRecord,
} from "./types.js";
import type { UsageStore } from "./usage-store.js";

/** Options of {@link openSqliteStore}. */
export interface SqliteStoreOptions {
  /** The database file; created with mode 0600. */
  readonly file: string;
  /** Events kept; older ones are dropped on append. Default 1000. */
  readonly eventsKept?: number;
  /**
   * Set when the data dir was initialised before (its tokens exist): an empty database then
   * means lost state, not a first start, and is refused.
   */
  readonly expectExisting?: boolean;
  /**
   * Told where the copy of the file went before a migration changed it (see
   * {@link backupBeforeMigrating}); not called when nothing needed migrating.
   */
  readonly onBackup?: (backup: string, fromVersion: number, toVersion: number) => void;
  /** The time a backup is named after; default the wall clock. */
  readonly now?: () => Date;
}

const SQLITE_CORRUPT_CODES = new Set(["SQLITE_NOTADB", "SQLITE_CORRUPT", "SQLITE_CORRUPT_VTAB"]);

function corrupt(file: string, detail: string, cause?: unknown): ControlPlaneError {
  return new ControlPlaneError(
    "LLMGW_CONTROL_PLANE_STORE_CORRUPT",
    `the state store ${file} is corrupt or incomplete (${detail}); refusing to start with an empty cluster. ` +
      "Stop the control plane, restore the file from a backup (or move it aside to start an empty cluster on purpose), then start again.",
    { cause },
  );
}

/** The SQLite state store, with the usage tables on the same connection. */
export interface SqliteStore extends ClusterStore {
  /** Usage rollups and batch ids (see `usage-store.ts`); closed with the store. */
  readonly usage: UsageStore;
}

/**
 * Opens (creating when absent) the SQLite store: WAL journal, versioned migrations, owner-only
 * file. A file that is not a database, fails `PRAGMA quick_check`, or lacks the tables its
 * version promises throws `LLMGW_CONTROL_PLANE_STORE_CORRUPT`; a schema newer than this
 * build throws `LLMGW_CONTROL_PLANE_STORE_TOO_NEW`.
 */
export function openSqliteStore(options: SqliteStoreOptions): SqliteStore {
  const file = options.file;
  const eventsKept = options.eventsKept ?? 1000;
  const existed = existsSync(file) && statSync(file).size > 0;
  try {
    closeSync(openSync(file, "a", 0o600));
    chmodSync(file, 0o600);
  } catch (cause) {
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_STORE_FAILED",
      `cannot create the state store ${file}: ${(cause as Error).message}`,
      { cause },
    );
  }
  let db: Database.Database;
  try {
    db = new Database(file);
  } catch (cause) {
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_STORE_FAILED",
      `cannot open the state store ${file}: ${(cause as Error).message}`,
      { cause },
    );
  }
  try {
    prepare(db, file, existed || options.expectExisting === true, options);
  } catch (error) {
    db.close();
    if (error instanceof ControlPlaneError) throw error;
    const code = (error as { code?: string }).code ?? "";
    if (SQLITE_CORRUPT_CODES.has(code)) throw corrupt(file, (error as Error).message, error);
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_STORE_FAILED",
      `cannot open the state store ${file}: ${(error as Error).message}`,
      { cause: error },
    );
  }
  return {
    ...withStoreErrors(file, createSqliteStore(db, file, eventsKept)),
    usage: createSqliteUsageStore(db, file),
  };
}

/**
 * `store` with every SQLite error (a full disk, an I/O error, a lock) turned into
 * `LLMGW_CONTROL_PLANE_STORE_FAILED` naming the file and the operation, so that it reaches
 * clients with its `llmgw-error-code` and callers can tell a store failure from a bug.
 * Anything else thrown (a domain error inside `transaction`) passes through unchanged.
 */
function withStoreErrors(file: string, store: ClusterStore): ClusterStore {
  const guard =
    <A extends unknown[], R>(operation: string, fn: (...args: A) => R) =>
    (...args: A): R => {
      try {
        return fn(...args);
      } catch (error) {
        if (!(error instanceof Database.SqliteError)) throw error;
        throw new ControlPlaneError(
          "LLMGW_CONTROL_PLANE_STORE_FAILED",
          `the state store ${file} failed (${operation}): ${error.message} (${error.code})`,
          { cause: error },
        );
      }
    };
  return {
    location: store.location,
    listDeployments: guard("listDeployments", store.listDeployments),
    putDeployment: guard("putDeployment", store.putDeployment),
    deleteDeployment: guard("deleteDeployment", store.deleteDeployment),
    listDeploymentRevisions: guard("listDeploymentRevisions", store.listDeploymentRevisions),
    putDeploymentRevision: guard("putDeploymentRevision", store.putDeploymentRevision),
    deleteDeploymentRevision: guard("deleteDeploymentRevision", store.deleteDeploymentRevision),
    listPlacements: guard("listPlacements", store.listPlacements),
    putPlacement: guard("putPlacement", store.putPlacement),
    deletePlacement: guard("deletePlacement", store.deletePlacement),
    listApiKeys: guard("listApiKeys", store.listApiKeys),
    putApiKey: guard("putApiKey", store.putApiKey),
    listTenants: guard("listTenants", store.listTenants),
    putTenant: guard("putTenant", store.putTenant),
    deleteTenant: guard("deleteTenant", store.deleteTenant),
    listNodes: guard("listNodes", store.listNodes),
    putNode: guard("putNode", store.putNode),
    deleteNode: guard("deleteNode", store.deleteNode),
    putNodeState: guard("putNodeState", store.putNodeState),
    listFaultClears: guard("listFaultClears", store.listFaultClears),
    replaceFaultClears: guard("replaceFaultClears", store.replaceFaultClears),
    listReplicaStatuses: guard("listReplicaStatuses", store.listReplicaStatuses),
    putReplicaStatus: guard("putReplicaStatus", store.putReplicaStatus),
    deleteReplicaStatuses: guard("deleteReplicaStatuses", store.deleteReplicaStatuses),
    listAvoidedNodes: guard("listAvoidedNodes", store.listAvoidedNodes),
    putAvoidedNode: guard("putAvoidedNode", store.putAvoidedNode),
    deleteAvoidedNode: guard("deleteAvoidedNode", store.deleteAvoidedNode),
    appendEvent: guard("appendEvent", store.appendEvent),
    listEvents: guard("listEvents", store.listEvents),
    transaction: <T>(fn: () => T): T => guard("transaction", () => store.transaction(fn))(),
    flush: store.flush,
    close: guard("close", store.close),
  };
}

/**
 * Copies the store, consistent and compacted (`VACUUM INTO`), to
 * `<file>.schema-<version>-<UTC time>.bak` (0600), before a migration changes it: going back to
 * the release that wrote it is then stopping, putting the copy back and starting that release.
 * A copy that cannot be made (a full disk, an unwritable directory) stops the start with the
 * store untouched, and leaves no partial copy behind.
 */
export function backupBeforeMigrating(
  db: Database.Database,
  file: string,
  version: number,
  now = new Date(),
): string {
  const stamp = now
    .toISOString()
    .replace(/[-:]/g, "")
    .replace(/\.\d+Z$/, "Z");
  let backup = `${file}.schema-${version}-${stamp}.bak`;
  let created = false;
  try {
    // VACUUM INTO writes into an empty file, so it keeps the mode this one is created with.
    // A start retried within the second gets its own copy next to the first.
    for (let n = 1; !created; n++) {
      try {
        closeSync(openSync(backup, "wx", 0o600));
        created = true;
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== "EEXIST" || n > 99) throw error;
        backup = `${file}.schema-${version}-${stamp}-${n}.bak`;
      }
    }
    db.prepare("VACUUM INTO ?").run(backup);
  } catch (cause) {
    if (created) rmSync(backup, { force: true });
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_STORE_FAILED",
      `cannot back up the state store ${file} to ${backup} before migrating it from schema ${version} to ${MIGRATIONS.length}: ${(cause as Error).message}; nothing was migrated. Free space or fix the directory's permissions, then start again`,
      { cause },
    );
  }
  return backup;
}

function prepare(
  db: Database.Database,
  file: string,
  mustHaveState: boolean,
  options: Pick<SqliteStoreOptions, "onBackup" | "now">,
): void {
  const check = db.pragma("quick_check", { simple: true });
  if (check !== "ok") throw corrupt(file, `quick_check: ${String(check)}`);
  const version = db.pragma("user_version", { simple: true }) as number;
  if (version > MIGRATIONS.length) {
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_STORE_TOO_NEW",
      `the state store ${file} has schema version ${version}, newer than this build understands (${MIGRATIONS.length}); run the newer llmgw or restore a backup`,
    );
  }
  if (version === 0 && mustHaveState) {
    throw corrupt(file, "it has no schema although the data dir was initialised before");
  }
  if (version > 0) {
    const tables = new Set(
      (
        db.prepare("SELECT name FROM sqlite_master WHERE type = 'table'").all() as {
          name: string;
        }[]
      ).map((t) => t.name),
    );
    for (const table of FIRST_TABLES) {
      if (!tables.has(table))
        throw corrupt(file, `table ${table} is missing at schema version ${version}`);
    }
    for (const [table, since] of LATER_TABLES) {
      if (version >= since && !tables.has(table))
        throw corrupt(file, `table ${table} is missing at schema version ${version}`);
    }
  }
  // Before anything writes (even the switch to WAL), so a store that cannot be copied is
  // left exactly as it was.
  if (version > 0 && version < MIGRATIONS.length) {
    const backup = backupBeforeMigrating(db, file, version, options.now?.() ?? new Date());
    options.onBackup?.(backup, version, MIGRATIONS.length);
  }
  db.pragma("journal_mode = WAL");
  db.pragma("synchronous = NORMAL");
  db.pragma("foreign_keys = ON");
  for (let v = version; v < MIGRATIONS.length; v++) {
    db.transaction(() => {
      db.exec(MIGRATIONS[v] as string);
      db.pragma(`user_version = ${v + 1}`);
    })();
  }
}

function createSqliteStore(db: Database.Database, file: string, eventsKept: number): ClusterStore {
  const q = {
    listDeployments: db.prepare("SELECT * FROM deployments ORDER BY name"),
    // A deployment keeps the creation time it was first stored with.
    putDeployment: db.prepare(
      upsertSql("sqlite", "deployments", DEPLOYMENT_COLUMNS, ["name"], ["created_at_ms"]),
    ),
    deleteDeployment: db.prepare("DELETE FROM deployments WHERE name = ?"),
    listDeploymentRevisions: db.prepare(
      "SELECT * FROM deployment_revisions ORDER BY name, revision",
    ),
    putDeploymentRevision: db.prepare(
      upsertSql("sqlite", "deployment_revisions", DEPLOYMENT_REVISION_COLUMNS, [
        "name",
        "revision",
      ]),
    ),
    deleteDeploymentRevision: db.prepare(
      "DELETE FROM deployment_revisions WHERE name = ? AND revision = ?",
    ),
    listPlacements: db.prepare("SELECT * FROM placements ORDER BY replica_id"),
    putPlacement: db.prepare(upsertSql("sqlite", "placements", PLACEMENT_COLUMNS, ["replica_id"])),
    deletePlacement: db.prepare("DELETE FROM placements WHERE replica_id = ?"),
    listApiKeys: db.prepare("SELECT * FROM api_keys ORDER BY created_at_ms, id"),
    putApiKey: db.prepare(upsertSql("sqlite", "api_keys", API_KEY_COLUMNS, ["id"])),
    listTenants: db.prepare("SELECT * FROM tenants ORDER BY name"),
    // A tenant keeps the creation time it was first stored with.
    putTenant: db.prepare(
      upsertSql("sqlite", "tenants", TENANT_COLUMNS, ["name"], ["created_at_ms"]),
    ),
    deleteTenant: db.prepare("DELETE FROM tenants WHERE name = ?"),
    listNodes: db.prepare("SELECT * FROM nodes ORDER BY registered_at_ms, id"),
    putNode: db.prepare(upsertSql("sqlite", "nodes", NODE_COLUMNS, ["id"])),
    putNodeState: db.prepare("UPDATE nodes SET state = ?, state_since_ms = ? WHERE id = ?"),
    deleteNode: db.prepare("DELETE FROM nodes WHERE id = ?"),
    listFaultClears: db.prepare("SELECT * FROM gpu_fault_clears ORDER BY gpu_uuid, fault_key"),
    deleteFaultClears: db.prepare("DELETE FROM gpu_fault_clears WHERE gpu_uuid = ?"),
    putFaultClear: db.prepare(
      `INSERT INTO gpu_fault_clears (gpu_uuid, fault_key, last_seen_unix_ms, cleared_at_ms)
       VALUES (?, ?, ?, ?)`,
    ),
    listReplicaStatuses: db.prepare("SELECT * FROM replica_statuses ORDER BY replica_id, rank"),
    putReplicaStatus: db.prepare(
      `INSERT OR REPLACE INTO replica_statuses (replica_id, rank, node_id, state, api_port,
       state_since_ms, spec_hash, revision, pid, started_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
    ),
    deleteReplicaStatus: db.prepare(
      "DELETE FROM replica_statuses WHERE replica_id = ? AND rank = ?",
    ),
    deleteReplicaStatuses: db.prepare("DELETE FROM replica_statuses WHERE replica_id = ?"),
    listAvoidedNodes: db.prepare("SELECT * FROM avoided_nodes ORDER BY deployment, node_id"),
    putAvoidedNode: db.prepare(
      upsertSql("sqlite", "avoided_nodes", AVOIDED_NODE_COLUMNS, ["deployment", "node_id"]),
    ),
    deleteAvoidedNode: db.prepare("DELETE FROM avoided_nodes WHERE deployment = ? AND node_id = ?"),
    appendEvent: db.prepare(
      "INSERT INTO events (at_ms, kind, subject, message, severity) VALUES (?, ?, ?, ?, ?)",
    ),
    trimEvents: db.prepare("DELETE FROM events WHERE id <= ?"),
    listNewestEvents: db.prepare(
      "SELECT * FROM (SELECT * FROM events ORDER BY id DESC LIMIT ?) ORDER BY id",
    ),
    listEventsAfter: db.prepare("SELECT * FROM events WHERE id > ? ORDER BY id LIMIT ?"),
  };
  let open = true;
  return {
    location: file,
    listDeployments: () => (q.listDeployments.all() as DeploymentRow[]).map(deploymentFromRow),
    putDeployment: (r: DeploymentRecord) => {
      q.putDeployment.run(...deploymentValues(r));
    },
    deleteDeployment: (name) => {
      q.deleteDeployment.run(name);
    },
    listDeploymentRevisions: () =>
      (q.listDeploymentRevisions.all() as DeploymentRevisionRow[]).map(deploymentRevisionFromRow),
    putDeploymentRevision: (r: DeploymentRevisionRecord) => {
      q.putDeploymentRevision.run(...deploymentRevisionValues(r));
    },
    deleteDeploymentRevision: (name, revision) => {
      q.deleteDeploymentRevision.run(name, revision);
    },
    listPlacements: () => (q.listPlacements.all() as PlacementRow[]).map(placementFromRow),
    putPlacement: (r: PlacementRecord) => {
      q.putPlacement.run(...placementValues(r));
    },
    deletePlacement: (id) => {
      q.deletePlacement.run(id);
    },
    listApiKeys: () => (q.listApiKeys.all() as ApiKeyRow[]).map(apiKeyFromRow),
    putApiKey: (r: ApiKeyRecord) => {
      q.putApiKey.run(...apiKeyValues(r));
    },
    listTenants: () => (q.listTenants.all() as TenantRow[]).map(tenantFromRow),
    putTenant: (r: TenantRecord) => {
      q.putTenant.run(...tenantValues(r));
    },
    deleteTenant: (name) => {
      q.deleteTenant.run(name);
    },
    listNodes: () => (q.listNodes.all() as NodeRow[]).map(nodeFromRow),
    putNode: (r: NodeRecord) => {
      q.putNode.run(...nodeValues(r));
    },
    putNodeState: (id, state, sinceMs) => {
      q.putNodeState.run(state, sinceMs, id);
    },
    deleteNode: (id) => {
      q.deleteNode.run(id);
    },
    listFaultClears: () => (q.listFaultClears.all() as FaultClearRow[]).map(faultClearFromRow),
    replaceFaultClears: (gpuUuid, records: readonly FaultClearRecord[]) => {
      db.transaction(() => {
        q.deleteFaultClears.run(gpuUuid);
        for (const r of records)
          q.putFaultClear.run(gpuUuid, r.faultKey, r.lastSeenUnixMs, r.clearedAtMs);
      })();
    },
    listReplicaStatuses: () =>
      (q.listReplicaStatuses.all() as ReplicaStatusRow[]).map(replicaStatusFromRow),
    putReplicaStatus: (r: ReplicaStatusRecord) => {
      q.putReplicaStatus.run(...replicaStatusValues(r));
    },
    deleteReplicaStatuses: (replicaId, rank) => {
      if (rank === undefined) q.deleteReplicaStatuses.run(replicaId);
      else q.deleteReplicaStatus.run(replicaId, rank);
    },
    listAvoidedNodes: () => (q.listAvoidedNodes.all() as AvoidedNodeRow[]).map(avoidedNodeFromRow),
    putAvoidedNode: (r: AvoidedNodeRecord) => {
      q.putAvoidedNode.run(...avoidedNodeValues(r));
    },
    deleteAvoidedNode: (deployment, nodeId) => {
      q.deleteAvoidedNode.run(deployment, nodeId);
    },
    appendEvent: (e) => {
      const id = Number(
        q.appendEvent.run(e.atMs, e.kind, e.subject, e.message, e.severity).lastInsertRowid,
      );
      if (id > eventsKept) q.trimEvents.run(id - eventsKept);
      return { id, ...e };
    },
    listEvents: ({ afterId = 0, limit }) =>
      (
        (afterId > 0
          ? q.listEventsAfter.all(afterId, limit)
          : q.listNewestEvents.all(limit)) as EventRow[]
      ).map(eventFromRow),
    transaction: <T>(fn: () => T): T => db.transaction(fn)(),
    flush: () => Promise.resolve(),
    close: () => {
      if (!open) return;
      open = false;
      db.close();
    },
  };
}
