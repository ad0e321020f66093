/**
 * Usage as the control plane keeps it: rollups, one row per bucket (minute, hour, UTC day),
 * tenant, key and model, added to by each stored batch of the routers' usage records — never
 * a row per request, never a row update per request. A batch's id is stored in the same
 * transaction as its sums, so a batch sent again (the router did not hear the answer, or
 * restarted, or the control plane did) counts once.
 *
 * Apart from {@link ClusterStore}: rollups grow with time and keys, and the PostgreSQL
 * cluster store holds every table in memory; usage is read from the database when asked for.
 */

/** A rollup's granularity; a day is a UTC calendar day. */
export type UsageBucket = "minute" | "hour" | "day";

/** What one rollup row (or one usage record) counts. Whole numbers, at most 2⁵³−1 each. */
export interface UsageCounts {
  readonly requests: number;
  readonly promptTokens: number;
  /**
   * Prompt tokens served from the engine's cache (included in `promptTokens`), of the
   * {@link cachedReported} requests.
   */
  readonly cachedTokens: number;
  /** Requests whose engine reported its cached tokens; 0: {@link cachedTokens} is unknown. */
  readonly cachedReported: number;
  readonly completionTokens: number;
  /** Each request's share of its replica's GPUs over its duration, GPU-milliseconds. */
  readonly gpuMs: number;
  /** Requests charged an estimate (cut short, or no usage reported by the engine). */
  readonly estimatedRequests: number;
  /** Answers whose reported usage was refused as implausible. */
  readonly refusedUsage: number;
}

/** One router's sums over one UTC minute for one key and model (`llmgw.v1.UsageRecord`). */
export interface UsageRecordData extends UsageCounts {
  /** Start of the UTC minute, epoch ms (a whole minute). */
  readonly minuteMs: number;
  readonly keyId: string;
  /** The key's tenant when the requests ran; "" for none. */
  readonly tenant: string;
  readonly model: string;
}

/** A batch of records as one router sent it, under an id unique to that router. */
export interface UsageBatch {
  readonly routerId: string;
  readonly batchId: string;
  readonly records: readonly UsageRecordData[];
}

/** One row of a rollup (or of a query over one): dimensions not grouped by are "". */
export interface UsageRollupRow extends UsageCounts {
  readonly startMs: number;
  readonly tenant: string;
  readonly keyId: string;
  readonly model: string;
}

/** A row to add into a bucket: what a batch contributes to it. */
export interface UsageRollupDelta extends UsageRollupRow {
  readonly bucket: UsageBucket;
}

/** What {@link UsageStore.query} reads. */
export interface UsageQuery {
  readonly bucket: UsageBucket;
  /** Bucket starts in [sinceMs, untilMs). */
  readonly sinceMs: number;
  readonly untilMs: number;
  /** Filters; absent: all. `keyIds` matches any of them (a name may cover several keys). */
  readonly tenant?: string;
  readonly keyIds?: readonly string[];
  readonly model?: string;
  /** Dimensions kept apart; the others are summed over (and "" in the rows). */
  readonly groupBy: { readonly tenant: boolean; readonly key: boolean; readonly model: boolean };
  /** Most rows returned. */
  readonly limit: number;
}

/** Tokens (prompt + completion) one day rollup holds, for budget standings. */
export interface UsageDayTokens {
  readonly dayMs: number;
  readonly tenant: string;
  readonly keyId: string;
  readonly model: string;
  readonly tokens: number;
}

/** How long rows are kept, ms. Day rollups are kept for good (a row per day, key and model). */
export interface UsageRetention {
  readonly minuteRowsMs: number;
  readonly hourRowsMs: number;
  /**
   * Batch ids. Longer than the oldest record a batch may carry plus the future skew allowed
   * (see `REPORT_USAGE_LIMITS`): a batch resent once its id is gone is refused as too old
   * instead of counted twice.
   */
  readonly batchIdsMs: number;
}

const HOUR_MS = 3_600_000;
const DAY_MS = 24 * HOUR_MS;

/** Default {@link UsageRetention}: minutes 48 h, hours 90 days, batch ids 8 days. */
export const DEFAULT_USAGE_RETENTION: UsageRetention = {
  minuteRowsMs: 48 * HOUR_MS,
  hourRowsMs: 90 * DAY_MS,
  batchIdsMs: 8 * DAY_MS,
};

/** Rows a {@link UsageStore.prune} removed. */
export interface UsagePruneReport {
  readonly minuteRows: number;
  readonly hourRows: number;
  readonly batchIds: number;
}

/**
 * Where usage lives: SQLite (`createSqliteUsageStore`) or PostgreSQL (`openPostgresUsageStore`).
 * Every method resolves once the database answered; a write resolves once it is durable.
 * Failures reject with `ControlPlaneError`: `…_STORE_FAILED` (SQLite, or a PostgreSQL error
 * that retrying cannot fix), `…_STORE_UNAVAILABLE` (PostgreSQL unreachable: retry later),
 * `…_NOT_LEADER` (PostgreSQL: this instance lost the lease; nothing was written).
 */
export interface UsageStore {
  /** Where the usage lives, for messages. */
  readonly location: string;
  /**
   * In one transaction: when (`routerId`, `batchId`) was stored before, changes nothing and
   * resolves `{ duplicate: true }`; else records the id (at `nowMs`) and adds every record
   * into its minute, hour and day rollups.
   */
  storeBatch(batch: UsageBatch, nowMs: number): Promise<{ duplicate: boolean }>;
  /** Sums of the rollup `query.bucket`, by start then tenant, key and model; at most `limit`. */
  query(query: UsageQuery): Promise<UsageRollupRow[]>;
  /** Tokens of every day rollup starting at or after `sinceMs` (budget standings on start). */
  dayTokens(sinceMs: number): Promise<UsageDayTokens[]>;
  /** Deletes rows older than `retention` allows at `nowMs`. */
  prune(nowMs: number, retention: UsageRetention): Promise<UsagePruneReport>;
  /** Every stored row and batch id, for copying between stores (`migrate-store`). */
  exportAll(): Promise<UsageExport>;
  /** Writes an export into an empty store (`migrate-store`), in one transaction. */
  importAll(data: UsageExport): Promise<void>;
  close(): Promise<void>;
}

/** Every row of the two usage tables. */
export interface UsageExport {
  readonly rollups: readonly UsageRollupDelta[];
  readonly batches: readonly { routerId: string; batchId: string; storedAtMs: number }[];
}

/** Start of the bucket holding `ms`: the minute, the hour, or the UTC day. */
export function bucketStart(bucket: UsageBucket, ms: number): number {
  const size = bucket === "minute" ? 60_000 : bucket === "hour" ? HOUR_MS : DAY_MS;
  return Math.floor(ms / size) * size;
}

/** Start of the UTC calendar month holding `ms`. */
export function monthStart(ms: number): number {
  const d = new Date(ms);
  return Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1);
}

const BUCKETS: readonly UsageBucket[] = ["minute", "hour", "day"];

/**
 * What a batch adds to each rollup: its records summed per bucket, tenant, key and model,
 * one delta per row touched (a row is written once per batch, whatever the records).
 */
export function buildUsageDeltas(records: readonly UsageRecordData[]): UsageRollupDelta[] {
  const sums = new Map<string, UsageRollupDelta>();
  for (const r of records) {
    for (const bucket of BUCKETS) {
      const startMs = bucketStart(bucket, r.minuteMs);
      const id = `${bucket}\u0000${startMs}\u0000${r.tenant}\u0000${r.keyId}\u0000${r.model}`;
      const before = sums.get(id);
      sums.set(id, {
        bucket,
        startMs,
        tenant: r.tenant,
        keyId: r.keyId,
        model: r.model,
        ...addCounts(before, r),
      });
    }
  }
  return [...sums.values()];
}

/** `a + b`, field by field (`a` absent: `b`'s counts). */
export function addCounts(a: UsageCounts | undefined, b: UsageCounts): UsageCounts {
  return {
    requests: (a?.requests ?? 0) + b.requests,
    promptTokens: (a?.promptTokens ?? 0) + b.promptTokens,
    cachedTokens: (a?.cachedTokens ?? 0) + b.cachedTokens,
    cachedReported: (a?.cachedReported ?? 0) + b.cachedReported,
    completionTokens: (a?.completionTokens ?? 0) + b.completionTokens,
    gpuMs: (a?.gpuMs ?? 0) + b.gpuMs,
    estimatedRequests: (a?.estimatedRequests ?? 0) + b.estimatedRequests,
    refusedUsage: (a?.refusedUsage ?? 0) + b.refusedUsage,
  };
}

/** The count columns of `usage_rollups`, in the order the SQL below names them. */
export const USAGE_COUNT_COLUMNS = [
  "requests",
  "prompt_tokens",
  "cached_tokens",
  "completion_tokens",
  "gpu_ms",
  "estimated_requests",
  "refused_usage",
  "cached_reported",
] as const;

/** A row of `usage_rollups` (or of a query over it) as the drivers return it. */
export interface UsageSqlRow {
  bucket?: string;
  start_ms: number;
  tenant: string;
  key_id: string;
  model: string;
  requests: number;
  prompt_tokens: number;
  cached_tokens: number;
  completion_tokens: number;
  gpu_ms: number;
  estimated_requests: number;
  refused_usage: number;
  cached_reported: number;
}

export function usageRowFromSql(r: UsageSqlRow): UsageRollupRow {
  return {
    startMs: Number(r.start_ms),
    tenant: r.tenant,
    keyId: r.key_id,
    model: r.model,
    requests: Number(r.requests),
    promptTokens: Number(r.prompt_tokens),
    cachedTokens: Number(r.cached_tokens),
    completionTokens: Number(r.completion_tokens),
    gpuMs: Number(r.gpu_ms),
    estimatedRequests: Number(r.estimated_requests),
    refusedUsage: Number(r.refused_usage),
    cachedReported: Number(r.cached_reported),
  };
}

/** The values of one delta in `bucket, start_ms, tenant, key_id, model, <counts>` order. */
export function usageDeltaValues(d: UsageRollupDelta): (string | number)[] {
  return [
    d.bucket,
    d.startMs,
    d.tenant,
    d.keyId,
    d.model,
    d.requests,
    d.promptTokens,
    d.cachedTokens,
    d.completionTokens,
    d.gpuMs,
    d.estimatedRequests,
    d.refusedUsage,
    d.cachedReported,
  ];
}

/**
 * The SELECT of {@link UsageStore.query}, for either engine (`placeholder(n)` numbers from 1):
 * sums in SQL over the one rollup asked for, grouped by start and the dimensions kept apart.
 * `CAST(SUM(…) AS BIGINT)`: PostgreSQL's SUM of a bigint is a numeric (a string in `pg`).
 */
export function usageQuerySql(
  query: UsageQuery,
  placeholder: (n: number) => string,
): { text: string; values: unknown[] } {
  const values: unknown[] = [query.bucket, query.sinceMs, query.untilMs];
  const where = [
    `bucket = ${placeholder(1)}`,
    `start_ms >= ${placeholder(2)}`,
    `start_ms < ${placeholder(3)}`,
  ];
  if (query.tenant !== undefined) {
    values.push(query.tenant);
    where.push(`tenant = ${placeholder(values.length)}`);
  }
  if (query.keyIds !== undefined) {
    const list = query.keyIds.map((id) => {
      values.push(id);
      return placeholder(values.length);
    });
    where.push(list.length === 0 ? "1 = 0" : `key_id IN (${list.join(", ")})`);
  }
  if (query.model !== undefined) {
    values.push(query.model);
    where.push(`model = ${placeholder(values.length)}`);
  }
  const dims = [
    query.groupBy.tenant ? "tenant" : "'' AS tenant",
    query.groupBy.key ? "key_id" : "'' AS key_id",
    query.groupBy.model ? "model" : "'' AS model",
  ];
  const groups = [
    "start_ms",
    ...(query.groupBy.tenant ? ["tenant"] : []),
    ...(query.groupBy.key ? ["key_id"] : []),
    ...(query.groupBy.model ? ["model"] : []),
  ];
  values.push(query.limit);
  const sums = USAGE_COUNT_COLUMNS.map((c) => `CAST(SUM(${c}) AS BIGINT) AS ${c}`);
  return {
    text: `SELECT start_ms, ${dims.join(", ")}, ${sums.join(", ")} FROM usage_rollups
           WHERE ${where.join(" AND ")} GROUP BY ${groups.join(", ")}
           ORDER BY ${groups.join(", ")} LIMIT ${placeholder(values.length)}`,
    values,
  };
}

const cmp = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);

/**
 * The order of query rows: start, then tenant, key and model by code unit (not by either
 * engine's collation, so both stores answer the same).
 */
export function compareUsageRows(a: UsageRollupRow, b: UsageRollupRow): number {
  return (
    a.startMs - b.startMs ||
    cmp(a.tenant, b.tenant) ||
    cmp(a.keyId, b.keyId) ||
    cmp(a.model, b.model)
  );
}
