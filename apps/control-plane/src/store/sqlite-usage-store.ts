import Database from "better-sqlite3";
import { ControlPlaneError } from "../errors.js";
import {
  buildUsageDeltas,
  compareUsageRows,
  type UsageDayTokens,
  type UsageExport,
  type UsageRollupDelta,
  type UsageSqlRow,
  type UsageStore,
  usageDeltaValues,
  usageQuerySql,
  usageRowFromSql,
} from "./usage-store.js";

/** Adds a delta into its row: `x = x + excluded.x` for every count. */
const UPSERT_ROLLUP = `INSERT INTO usage_rollups (bucket, start_ms, tenant, key_id, model, requests,
    prompt_tokens, cached_tokens, completion_tokens, gpu_ms, estimated_requests, refused_usage,
    cached_reported)
  VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
  ON CONFLICT (bucket, start_ms, tenant, key_id, model) DO UPDATE SET
    requests = requests + excluded.requests,
    prompt_tokens = prompt_tokens + excluded.prompt_tokens,
    cached_tokens = cached_tokens + excluded.cached_tokens,
    completion_tokens = completion_tokens + excluded.completion_tokens,
    gpu_ms = gpu_ms + excluded.gpu_ms,
    estimated_requests = estimated_requests + excluded.estimated_requests,
    refused_usage = refused_usage + excluded.refused_usage,
    cached_reported = cached_reported + excluded.cached_reported`;

/**
 * The usage tables of an open SQLite state store (`openSqliteStore` runs the migrations that
 * create them), on the store's own connection: each batch is one synchronous transaction, so
 * it is durable (WAL, `synchronous = NORMAL`: durable across a process crash) when this
 * resolves. SQLite errors reject as `LLMGW_CONTROL_PLANE_STORE_FAILED` naming the operation.
 * `close` does nothing: the state store owns the connection.
 */
export function createSqliteUsageStore(db: Database.Database, file: string): UsageStore {
  const q = {
    insertBatch: db.prepare(
      `INSERT INTO usage_batches (router_id, batch_id, stored_at_ms) VALUES (?, ?, ?)
       ON CONFLICT (router_id, batch_id) DO NOTHING`,
    ),
    upsert: db.prepare(UPSERT_ROLLUP),
    dayTokens: db.prepare(
      `SELECT start_ms, tenant, key_id, model, prompt_tokens + completion_tokens AS tokens
       FROM usage_rollups WHERE bucket = 'day' AND start_ms >= ?`,
    ),
    pruneRows: db.prepare("DELETE FROM usage_rollups WHERE bucket = ? AND start_ms < ?"),
    pruneBatches: db.prepare("DELETE FROM usage_batches WHERE stored_at_ms < ?"),
    allRollups: db.prepare(
      "SELECT * FROM usage_rollups ORDER BY bucket, start_ms, tenant, key_id, model",
    ),
    allBatches: db.prepare("SELECT * FROM usage_batches ORDER BY router_id, batch_id"),
    insertBatchRow: db.prepare(
      "INSERT INTO usage_batches (router_id, batch_id, stored_at_ms) VALUES (?, ?, ?)",
    ),
  };
  const guard = <T>(operation: string, fn: () => T): Promise<T> => {
    try {
      return Promise.resolve(fn());
    } catch (error) {
      if (!(error instanceof Database.SqliteError)) return Promise.reject(error);
      return Promise.reject(
        new ControlPlaneError(
          "LLMGW_CONTROL_PLANE_STORE_FAILED",
          `the state store ${file} failed (${operation}): ${error.message} (${error.code})`,
          { cause: error },
        ),
      );
    }
  };
  const storeBatch = db.transaction(
    (routerId: string, batchId: string, deltas: UsageRollupDelta[], nowMs: number) => {
      if (q.insertBatch.run(routerId, batchId, nowMs).changes === 0) return true;
      for (const d of deltas) q.upsert.run(...usageDeltaValues(d));
      return false;
    },
  );
  return {
    location: file,
    storeBatch: (batch, nowMs) =>
      guard("storeUsageBatch", () => ({
        duplicate: storeBatch(
          batch.routerId,
          batch.batchId,
          buildUsageDeltas(batch.records),
          nowMs,
        ),
      })),
    query: (query) =>
      guard("queryUsage", () => {
        const { text, values } = usageQuerySql(query, () => "?");
        return (db.prepare(text).all(...values) as UsageSqlRow[])
          .map(usageRowFromSql)
          .sort(compareUsageRows);
      }),
    dayTokens: (sinceMs) =>
      guard("usageDayTokens", () =>
        (
          q.dayTokens.all(sinceMs) as {
            start_ms: number;
            tenant: string;
            key_id: string;
            model: string;
            tokens: number;
          }[]
        ).map(
          (r): UsageDayTokens => ({
            dayMs: r.start_ms,
            tenant: r.tenant,
            keyId: r.key_id,
            model: r.model,
            tokens: r.tokens,
          }),
        ),
      ),
    prune: (nowMs, retention) =>
      guard("pruneUsage", () =>
        db.transaction(() => ({
          minuteRows: q.pruneRows.run("minute", nowMs - retention.minuteRowsMs).changes,
          hourRows: q.pruneRows.run("hour", nowMs - retention.hourRowsMs).changes,
          batchIds: q.pruneBatches.run(nowMs - retention.batchIdsMs).changes,
        }))(),
      ),
    exportAll: () =>
      guard(
        "exportUsage",
        (): UsageExport =>
          db.transaction(() => ({
            rollups: (q.allRollups.all() as UsageSqlRow[]).map((r) => ({
              bucket: r.bucket as UsageRollupDelta["bucket"],
              ...usageRowFromSql(r),
            })),
            batches: (
              q.allBatches.all() as { router_id: string; batch_id: string; stored_at_ms: number }[]
            ).map((b) => ({
              routerId: b.router_id,
              batchId: b.batch_id,
              storedAtMs: b.stored_at_ms,
            })),
          }))(),
      ),
    importAll: (data) =>
      guard("importUsage", () =>
        db.transaction(() => {
          for (const d of data.rollups) q.upsert.run(...usageDeltaValues(d));
          for (const b of data.batches) q.insertBatchRow.run(b.routerId, b.batchId, b.storedAtMs);
        })(),
      ),
    close: () => Promise.resolve(),
  };
}
