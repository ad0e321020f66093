import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import { DATA_DIR_FILES, readToken } from "../domain/tokens.js";
import { ControlPlaneError } from "../errors.js";
import { openPostgresDatabase, readSnapshot, type StoreSnapshot } from "./postgres-store.js";
import { exportUsage, importUsage } from "./postgres-usage-store.js";
import {
  API_KEY_COLUMNS,
  AVOIDED_NODE_COLUMNS,
  apiKeyValues,
  avoidedNodeValues,
  DEPLOYMENT_COLUMNS,
  DEPLOYMENT_REVISION_COLUMNS,
  deploymentRevisionValues,
  deploymentValues,
  NODE_COLUMNS,
  nodeValues,
  PLACEMENT_COLUMNS,
  placementValues,
  replicaStatusValues,
  TENANT_COLUMNS,
  tenantValues,
} from "./rows.js";
import { openSqliteStore } from "./sqlite-store.js";
import type { UsageExport } from "./usage-store.js";

/*
 * `llmgw control-plane migrate-store`: copies a SQLite store into PostgreSQL in one
 * transaction, then reads the target back and compares it with the source, table by table,
 * by count and by a checksum of every record. The source is read from an online backup, so
 * neither a running control plane nor the copy changes it.
 */

/** The tables copied, in the order reported. */
export const STORE_TABLES = [
  "deployments",
  "deployment_revisions",
  "placements",
  "api_keys",
  "tenants",
  "nodes",
  "gpu_fault_clears",
  "replica_statuses",
  "avoided_nodes",
  "events",
  "usage_rollups",
  "usage_batches",
] as const;
export type StoreTable = (typeof STORE_TABLES)[number];

/** What a migration copied and verified. */
export interface MigrateStoreReport {
  readonly counts: Readonly<Record<StoreTable, number>>;
  /** sha256 over every record of every table, equal on both sides. */
  readonly checksum: string;
  /** The target, without its password. */
  readonly target: string;
  readonly durationMs: number;
}

/** Options of {@link migrateStore}. */
export interface MigrateStoreOptions {
  /** The control plane's data dir: `state.db` and the tokens. */
  readonly fromDataDir: string;
  /** A `postgres://` URL. */
  readonly toUrl: string;
  /** Replace what the target holds instead of refusing a non-empty one. */
  readonly force?: boolean;
}

const EVERY_EVENT = 1_000_000_000;

function cmp(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** Every list in one order, whichever engine and collation produced it. */
function canonical(s: StoreSnapshot, usage: UsageExport): Record<StoreTable, readonly unknown[]> {
  const inventory = (n: StoreSnapshot["nodes"][number]) => ({
    ...n,
    inventory: Buffer.from(n.inventory).toString("base64"),
  });
  return {
    deployments: [...s.deployments].sort((a, b) => cmp(a.name, b.name)),
    deployment_revisions: [...s.deploymentRevisions].sort(
      (a, b) => cmp(a.name, b.name) || a.revision - b.revision,
    ),
    placements: [...s.placements].sort((a, b) => cmp(a.replicaId, b.replicaId)),
    api_keys: [...s.apiKeys].sort((a, b) => cmp(a.id, b.id)),
    tenants: [...s.tenants].sort((a, b) => cmp(a.name, b.name)),
    nodes: [...s.nodes].sort((a, b) => cmp(a.id, b.id)).map(inventory),
    gpu_fault_clears: [...s.faultClears].sort(
      (a, b) => cmp(a.gpuUuid, b.gpuUuid) || cmp(a.faultKey, b.faultKey),
    ),
    replica_statuses: [...s.replicaStatuses].sort(
      (a, b) => cmp(a.replicaId, b.replicaId) || a.rank - b.rank,
    ),
    avoided_nodes: [...s.avoidedNodes].sort(
      (a, b) => cmp(a.deployment, b.deployment) || cmp(a.nodeId, b.nodeId),
    ),
    events: [...s.events].sort((a, b) => a.id - b.id),
    usage_rollups: [...usage.rollups].sort(
      (a, b) =>
        cmp(a.bucket, b.bucket) ||
        a.startMs - b.startMs ||
        cmp(a.tenant, b.tenant) ||
        cmp(a.keyId, b.keyId) ||
        cmp(a.model, b.model),
    ),
    usage_batches: [...usage.batches].sort(
      (a, b) => cmp(a.routerId, b.routerId) || cmp(a.batchId, b.batchId),
    ),
  };
}

/**
 * Per table, the row count and the sha256 of the records as JSON with the keys of every
 * object sorted, nested ones too (absent fields left out).
 */
function summarize(
  s: StoreSnapshot,
  usage: UsageExport,
): Record<StoreTable, { rows: number; sha256: string }> {
  const lists = canonical(s, usage);
  const out = {} as Record<StoreTable, { rows: number; sha256: string }>;
  for (const table of STORE_TABLES) {
    const hash = createHash("sha256");
    for (const record of lists[table]) hash.update(`${JSON.stringify(sortedKeys(record))}\n`);
    out[table] = { rows: lists[table].length, sha256: hash.digest("hex") };
  }
  return out;
}

/**
 * `value` with every object's keys in order. (A key list passed to `JSON.stringify` would
 * filter nested objects by the outer keys, leaving a retirement or a rank out of the sum.)
 */
function sortedKeys(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(sortedKeys);
  if (typeof value !== "object" || value === null) return value;
  const o = value as Record<string, unknown>;
  return Object.fromEntries(
    Object.keys(o)
      .sort()
      .map((k) => [k, sortedKeys(o[k])]),
  );
}

/** Reads the SQLite store of `dataDir` from an online backup (the file itself is not opened for writing). */
async function readSqlite(dataDir: string): Promise<StoreSnapshot & { usage: UsageExport }> {
  const file = join(dataDir, DATA_DIR_FILES.database);
  if (!existsSync(file))
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_NOT_FOUND",
      `no SQLite store in ${dataDir} (${file} does not exist)`,
    );
  const tmp = mkdtempSync(join(tmpdir(), "llmgw-migrate-"));
  try {
    const copy = join(tmp, "state.db");
    const source = new Database(file, { readonly: true, fileMustExist: true });
    try {
      await source.backup(copy);
    } finally {
      source.close();
    }
    const store = openSqliteStore({ file: copy, expectExisting: true });
    try {
      const events = store.listEvents({ limit: EVERY_EVENT });
      return {
        deployments: store.listDeployments(),
        deploymentRevisions: store.listDeploymentRevisions(),
        placements: store.listPlacements(),
        apiKeys: store.listApiKeys(),
        tenants: store.listTenants(),
        nodes: store.listNodes(),
        faultClears: store.listFaultClears(),
        replicaStatuses: store.listReplicaStatuses(),
        avoidedNodes: store.listAvoidedNodes(),
        events,
        lastEventId: events[events.length - 1]?.id ?? 0,
        usage: await store.usage.exportAll(),
      };
    } finally {
      store.close();
    }
  } catch (error) {
    if (error instanceof ControlPlaneError) throw error;
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_STORE_FAILED",
      `cannot read the SQLite store in ${dataDir}: ${(error as Error).message}`,
      { cause: error },
    );
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}

/**
 * Copies the SQLite store of `fromDataDir` into the PostgreSQL database `toUrl` and checks the
 * copy. Refuses (`LLMGW_CONTROL_PLANE_ALREADY_EXISTS`) a target that holds state unless
 * `force`, and always one a control plane leads; the target then belongs to the source's
 * tokens. Throws `…_STORE_FAILED` when the copy does not match (nothing is committed then).
 */
export async function migrateStore(options: MigrateStoreOptions): Promise<MigrateStoreReport> {
  const started = performance.now();
  const tokens = (["join", "admin", "router"] as const).map((kind) =>
    readToken(options.fromDataDir, kind),
  );
  const source = await readSqlite(options.fromDataDir);
  const database = await openPostgresDatabase({ url: options.toUrl, tokens });
  const want = summarize(source, source.usage);
  const client = await database.connect();
  try {
    await client.query("BEGIN");
    const lease = await client.query<{ live: boolean; holder_url: string }>(
      "SELECT expires_at > clock_timestamp() AS live, holder_url FROM llmgw_leader WHERE id = 1 FOR UPDATE",
    );
    if (lease.rows[0]?.live)
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_ALREADY_EXISTS",
        `a control plane (${lease.rows[0].holder_url}) leads on ${database.location}: stop every instance on it before migrating into it`,
      );
    const held: string[] = [];
    for (const table of STORE_TABLES) {
      const n = Number(
        (await client.query<{ n: string }>(`SELECT count(*) AS n FROM ${table}`)).rows[0]?.n,
      );
      if (n > 0) held.push(`${n} ${table}`);
    }
    if (held.length > 0) {
      if (!options.force)
        throw new ControlPlaneError(
          "LLMGW_CONTROL_PLANE_ALREADY_EXISTS",
          `${database.location} already holds state (${held.join(", ")}); pass --force to replace it`,
        );
      for (const table of STORE_TABLES) await client.query(`DELETE FROM ${table}`);
    }
    const insert = (table: string, columns: string, values: readonly unknown[]) =>
      client.query(
        `INSERT INTO ${table} (${columns}) VALUES (${values.map((_, i) => `$${i + 1}`).join(", ")})`,
        values as unknown[],
      );
    for (const r of source.deployments)
      await insert("deployments", DEPLOYMENT_COLUMNS.join(", "), deploymentValues(r));
    for (const r of source.deploymentRevisions)
      await insert(
        "deployment_revisions",
        DEPLOYMENT_REVISION_COLUMNS.join(", "),
        deploymentRevisionValues(r),
      );
    for (const r of source.placements)
      await insert("placements", PLACEMENT_COLUMNS.join(", "), placementValues(r));
    for (const r of source.apiKeys)
      await insert("api_keys", API_KEY_COLUMNS.join(", "), apiKeyValues(r));
    for (const r of source.tenants)
      await insert("tenants", TENANT_COLUMNS.join(", "), tenantValues(r));
    for (const r of source.nodes) await insert("nodes", NODE_COLUMNS.join(", "), nodeValues(r));
    for (const r of source.faultClears)
      await insert("gpu_fault_clears", "gpu_uuid, fault_key, last_seen_unix_ms, cleared_at_ms", [
        r.gpuUuid,
        r.faultKey,
        r.lastSeenUnixMs,
        r.clearedAtMs,
      ]);
    for (const r of source.replicaStatuses)
      await insert(
        "replica_statuses",
        "replica_id, rank, node_id, state, api_port, state_since_ms, spec_hash, revision, pid, started_at_ms",
        replicaStatusValues(r),
      );
    for (const r of source.avoidedNodes)
      await insert("avoided_nodes", AVOIDED_NODE_COLUMNS.join(", "), avoidedNodeValues(r));
    for (const e of source.events)
      await insert("events", "id, at_ms, kind, subject, message, severity", [
        e.id,
        e.atMs,
        e.kind,
        e.subject,
        e.message,
        e.severity,
      ]);
    await importUsage(client, source.usage);
    // Checked before it commits: a copy that differs is never left behind.
    const got = summarize(await readSnapshot(client, EVERY_EVENT, true), await exportUsage(client));
    const wrong = STORE_TABLES.filter(
      (t) => got[t].sha256 !== want[t].sha256 || got[t].rows !== want[t].rows,
    );
    if (wrong.length > 0)
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_STORE_FAILED",
        `the copy in ${database.location} differs from the source in ${wrong
          .map((t) => `${t} (${got[t].rows} rows, ${want[t].rows} expected)`)
          .join(", ")}; nothing was committed`,
      );
    await client.query("COMMIT");
  } catch (error) {
    await client.query("ROLLBACK").catch(() => {});
    if (error instanceof ControlPlaneError) throw error;
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_STORE_FAILED",
      `copying into ${database.location} failed, nothing was committed: ${(error as Error).message}`,
      { cause: error },
    );
  } finally {
    await client.end().catch(() => {});
  }
  const checksum = createHash("sha256")
    .update(STORE_TABLES.map((t) => want[t].sha256).join("\n"))
    .digest("hex");
  return {
    counts: Object.fromEntries(STORE_TABLES.map((t) => [t, want[t].rows])) as Record<
      StoreTable,
      number
    >,
    checksum,
    target: database.location,
    durationMs: Math.round(performance.now() - started),
  };
}
