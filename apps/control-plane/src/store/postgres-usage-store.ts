import type pg from "pg";
import { ControlPlaneError, isControlPlaneError } from "../errors.js";
import {
  isTransientPgError,
  type PostgresDatabase,
  type WriterIdentity,
} from "./postgres-store.js";
import {
  buildUsageDeltas,
  compareUsageRows,
  type UsageExport,
  type UsageRollupDelta,
  type UsageSqlRow,
  type UsageStore,
  usageQuerySql,
  usageRowFromSql,
} from "./usage-store.js";

/*
 * Usage in PostgreSQL. Not part of the leader's in-memory copy (postgres-store.ts): rollups
 * grow with time and keys. Each batch is its own transaction on this store's connection,
 * committed before `storeBatch` resolves, and fenced like every leader write: it first locks
 * the lease row (FOR SHARE: the lease cannot change hands while it holds it) and checks this
 * instance still holds it at its epoch. A batch committed while the answer was lost is sent
 * again by its router and found by its id.
 */

/** Adds a batch's rows: one statement, one array per column, whatever the rows. */
const UPSERT_ROLLUPS = `INSERT INTO usage_rollups (bucket, start_ms, tenant, key_id, model, requests,
    prompt_tokens, cached_tokens, completion_tokens, gpu_ms, estimated_requests, refused_usage,
    cached_reported)
  SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::bigint[],
    $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[], $12::bigint[],
    $13::bigint[])
  ON CONFLICT (bucket, start_ms, tenant, key_id, model) DO UPDATE SET
    requests = usage_rollups.requests + excluded.requests,
    prompt_tokens = usage_rollups.prompt_tokens + excluded.prompt_tokens,
    cached_tokens = usage_rollups.cached_tokens + excluded.cached_tokens,
    completion_tokens = usage_rollups.completion_tokens + excluded.completion_tokens,
    gpu_ms = usage_rollups.gpu_ms + excluded.gpu_ms,
    estimated_requests = usage_rollups.estimated_requests + excluded.estimated_requests,
    refused_usage = usage_rollups.refused_usage + excluded.refused_usage,
    cached_reported = usage_rollups.cached_reported + excluded.cached_reported`;

/** Rows per statement: bounds one statement's arrays on import (a batch has ≤ 30,000). */
const ROWS_PER_STATEMENT = 20_000;

/** Adds `deltas` into their rows on `client`, inside the caller's transaction. */
export async function upsertUsageRollups(
  client: pg.ClientBase,
  deltas: readonly UsageRollupDelta[],
): Promise<void> {
  for (let i = 0; i < deltas.length; i += ROWS_PER_STATEMENT) {
    const slice = deltas.slice(i, i + ROWS_PER_STATEMENT);
    await client.query(UPSERT_ROLLUPS, [
      slice.map((d) => d.bucket),
      slice.map((d) => d.startMs),
      slice.map((d) => d.tenant),
      slice.map((d) => d.keyId),
      slice.map((d) => d.model),
      slice.map((d) => d.requests),
      slice.map((d) => d.promptTokens),
      slice.map((d) => d.cachedTokens),
      slice.map((d) => d.completionTokens),
      slice.map((d) => d.gpuMs),
      slice.map((d) => d.estimatedRequests),
      slice.map((d) => d.refusedUsage),
      slice.map((d) => d.cachedReported),
    ]);
  }
}

/** Every usage row and batch id on `client` (inside the caller's transaction, if any). */
export async function exportUsage(client: pg.ClientBase): Promise<UsageExport> {
  const rollups = (
    await client.query<UsageSqlRow>(
      "SELECT * FROM usage_rollups ORDER BY bucket, start_ms, tenant, key_id, model",
    )
  ).rows.map((r) => ({ bucket: r.bucket as UsageRollupDelta["bucket"], ...usageRowFromSql(r) }));
  const batches = (
    await client.query<{ router_id: string; batch_id: string; stored_at_ms: number }>(
      "SELECT * FROM usage_batches ORDER BY router_id, batch_id",
    )
  ).rows.map((b) => ({
    routerId: b.router_id,
    batchId: b.batch_id,
    storedAtMs: Number(b.stored_at_ms),
  }));
  return { rollups, batches };
}

/** Writes `data` on `client`, inside the caller's transaction. */
export async function importUsage(client: pg.ClientBase, data: UsageExport): Promise<void> {
  await upsertUsageRollups(client, data.rollups);
  for (let i = 0; i < data.batches.length; i += ROWS_PER_STATEMENT) {
    const slice = data.batches.slice(i, i + ROWS_PER_STATEMENT);
    await client.query(
      `INSERT INTO usage_batches (router_id, batch_id, stored_at_ms)
       SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])`,
      [slice.map((b) => b.routerId), slice.map((b) => b.batchId), slice.map((b) => b.storedAtMs)],
    );
  }
}

/** Options of {@link openPostgresUsageStore}. */
export interface PostgresUsageStoreOptions {
  readonly database: PostgresDatabase;
  /** The lease writes are fenced by; absent: a reader, whose writes reject `…_NOT_LEADER`. */
  readonly writer?: WriterIdentity;
  /** Called once when a write found the lease held by another epoch: stop leading. */
  readonly onFenced?: (error: ControlPlaneError) => void;
  /** Per statement; default 10 000. */
  readonly queryTimeoutMs?: number;
}

/**
 * A {@link UsageStore} on `database`: one connection, opened on first use and again after a
 * failure, running one operation at a time. A database that cannot be reached rejects
 * `LLMGW_CONTROL_PLANE_STORE_UNAVAILABLE` (the router keeps the batch and sends it again);
 * a lost lease rejects `…_NOT_LEADER` and calls `onFenced`; any other database error
 * `…_STORE_FAILED`.
 */
export function openPostgresUsageStore(options: PostgresUsageStoreOptions): UsageStore {
  const { database, writer } = options;
  const location = database.location;
  let client: pg.Client | undefined;
  let closed = false;
  let tail: Promise<unknown> = Promise.resolve();

  const notLeader = () =>
    new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_NOT_LEADER",
      writer === undefined
        ? `this control plane does not lead on ${location}; usage is written by the leader`
        : `this control plane no longer holds the leader lease of ${location} (epoch ${writer.epoch}); the usage batch was not stored`,
    );

  /** Runs `fn` on the connection after every operation queued before it. */
  const run = <T>(what: string, fn: (c: pg.Client) => Promise<T>): Promise<T> => {
    if (closed)
      return Promise.reject(
        new ControlPlaneError(
          "LLMGW_CONTROL_PLANE_SHUTTING_DOWN",
          "the control plane is shutting down",
        ),
      );
    const result = tail.then(async () => {
      try {
        client ??= await database.connect({ queryTimeoutMs: options.queryTimeoutMs ?? 10_000 });
        return await fn(client);
      } catch (error) {
        if (isControlPlaneError(error)) throw error;
        const c = client;
        client = undefined;
        void c?.end().catch(() => {});
        if (isTransientPgError(error))
          throw new ControlPlaneError(
            "LLMGW_CONTROL_PLANE_STORE_UNAVAILABLE",
            `the state store ${location} is unreachable (${what}): ${(error as Error).message}; nothing was stored, send it again`,
            { cause: error },
          );
        throw new ControlPlaneError(
          "LLMGW_CONTROL_PLANE_STORE_FAILED",
          `the state store ${location} failed (${what}): ${(error as Error).message}`,
          { cause: error },
        );
      }
    });
    tail = result.catch(() => {});
    return result;
  };

  /** `fn` in a transaction; with `fenced`, only while this instance holds the lease. */
  const transaction = <T>(
    what: string,
    fenced: boolean,
    fn: (c: pg.Client) => Promise<T>,
  ): Promise<T> =>
    run(what, async (c) => {
      await c.query("BEGIN");
      try {
        if (fenced) {
          const fence =
            writer === undefined
              ? { rowCount: 0 }
              : await c.query(
                  "SELECT 1 FROM llmgw_leader WHERE id = 1 AND holder = $1 AND epoch = $2 AND expires_at > clock_timestamp() FOR SHARE",
                  [writer.holder, writer.epoch],
                );
          if (fence.rowCount !== 1) {
            const error = notLeader();
            if (writer !== undefined) options.onFenced?.(error);
            throw error;
          }
        }
        const value = await fn(c);
        await c.query("COMMIT");
        return value;
      } catch (error) {
        await c.query("ROLLBACK").catch(() => {});
        throw error;
      }
    });

  return {
    location,
    storeBatch: (batch, nowMs) => {
      const deltas = buildUsageDeltas(batch.records);
      return transaction("storeUsageBatch", true, async (c) => {
        const inserted = await c.query(
          `INSERT INTO usage_batches (router_id, batch_id, stored_at_ms) VALUES ($1, $2, $3)
           ON CONFLICT (router_id, batch_id) DO NOTHING`,
          [batch.routerId, batch.batchId, nowMs],
        );
        if (inserted.rowCount === 0) return { duplicate: true };
        await upsertUsageRollups(c, deltas);
        return { duplicate: false };
      });
    },
    query: (query) =>
      run("queryUsage", async (c) => {
        const { text, values } = usageQuerySql(query, (n) => `$${n}`);
        return (await c.query<UsageSqlRow>(text, values)).rows
          .map(usageRowFromSql)
          .sort(compareUsageRows);
      }),
    dayTokens: (sinceMs) =>
      run("usageDayTokens", async (c) =>
        (
          await c.query<{
            start_ms: number;
            tenant: string;
            key_id: string;
            model: string;
            tokens: number;
          }>(
            `SELECT start_ms, tenant, key_id, model, prompt_tokens + completion_tokens AS tokens
             FROM usage_rollups WHERE bucket = 'day' AND start_ms >= $1`,
            [sinceMs],
          )
        ).rows.map((r) => ({
          dayMs: Number(r.start_ms),
          tenant: r.tenant,
          keyId: r.key_id,
          model: r.model,
          tokens: Number(r.tokens),
        })),
      ),
    prune: (nowMs, retention) =>
      transaction("pruneUsage", true, async (c) => {
        const rows = (bucket: string, beforeMs: number) =>
          c.query("DELETE FROM usage_rollups WHERE bucket = $1 AND start_ms < $2", [
            bucket,
            beforeMs,
          ]);
        const minute = await rows("minute", nowMs - retention.minuteRowsMs);
        const hour = await rows("hour", nowMs - retention.hourRowsMs);
        const batches = await c.query("DELETE FROM usage_batches WHERE stored_at_ms < $1", [
          nowMs - retention.batchIdsMs,
        ]);
        return {
          minuteRows: minute.rowCount ?? 0,
          hourRows: hour.rowCount ?? 0,
          batchIds: batches.rowCount ?? 0,
        };
      }),
    exportAll: () => transaction("exportUsage", false, exportUsage),
    importAll: (data) => transaction("importUsage", true, (c) => importUsage(c, data)),
    close: async () => {
      if (closed) return;
      // What was queued before finishes; anything later is refused.
      closed = true;
      await tail;
      const c = client;
      client = undefined;
      await c?.end().catch(() => {});
    },
  };
}
