import { create } from "@bufbuild/protobuf";
import {
  type BudgetStanding,
  BudgetStandingSchema,
  type GetUsageRequest,
  type ReportUsageRequest,
  type ReportUsageResponse,
  ReportUsageResponseSchema,
  UsageDimension,
  UsageGranularity,
  type UsageRow,
  UsageRowSchema,
} from "@llmgw/proto";
import { MAX_USAGE_BATCH_RECORDS } from "@llmgw/router";
import { budgetPeriodToProto } from "@llmgw/wire";
import { TENANT_NAME } from "../domain/tenants.js";
import type { BudgetStandingData, UsageReport } from "../domain/usage.js";
import { ControlPlaneError } from "../errors.js";
import {
  bucketStart,
  type UsageBatch,
  type UsageBucket,
  type UsageQuery,
  type UsageRecordData,
  type UsageRollupRow,
} from "../store/usage-store.js";

const MINUTE_MS = 60_000;
const DAY_MS = 86_400_000;

/** What one `ReportUsageRequest` may carry. */
export const REPORT_USAGE_LIMITS = {
  /** As `llmgw router --router-id` accepts it (`WATCH_ROUTING_LIMITS.routerId`). */
  routerId: /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/,
  /** Printable ASCII, no spaces: the router's id and a sequence number, or a random id. */
  batchId: /^[\x21-\x7e]{1,128}$/,
  maxRecords: MAX_USAGE_BATCH_RECORDS,
  /** A record older than this is refused: its batch id may be pruned (see `UsageRetention`). */
  maxRecordAgeMs: 7 * DAY_MS,
  /** A router's clock ahead of the control plane's by more than this is refused. */
  maxFutureMs: 5 * MINUTE_MS,
  /** Key ids and model names (`ROUTING_LIMITS.maxNameChars` in `@llmgw/router`). */
  maxNameChars: 256,
  /** Tenant names: lower-case letters, digits and '-', 1–63. */
  tenant: TENANT_NAME,
  /** Any count: what a number holds exactly. */
  maxCount: BigInt(Number.MAX_SAFE_INTEGER),
  /** Prompt + completion tokens per request, at most (a 16M-token context and answer). */
  maxTokensPerRequest: 2n ** 24n,
  /** GPU-milliseconds per request, at most (about 99 GPU-days). */
  maxGpuMsPerRequest: 2n ** 33n,
} as const;

function invalid(message: string): ControlPlaneError {
  return new ControlPlaneError("LLMGW_CONTROL_PLANE_INVALID_ARGUMENT", message);
}

/** Echoes a bad value, bounded. */
const shown = (value: string) =>
  JSON.stringify(value.length > 80 ? `${value.slice(0, 80)}…` : value);

const COUNT_FIELDS = [
  ["requests", "requests"],
  ["promptTokens", "prompt_tokens"],
  ["cachedTokens", "cached_tokens"],
  ["completionTokens", "completion_tokens"],
  ["gpuMilliseconds", "gpu_milliseconds"],
  ["estimatedRequests", "estimated_requests"],
  ["refusedUsage", "refused_usage"],
] as const;

/**
 * Checks a `ReportUsageRequest` against {@link REPORT_USAGE_LIMITS} at `nowMs` and returns it
 * as plain data: a router id as for WatchRouting, a batch id of 1–128 printable characters,
 * at most 10,000 records, each of a whole UTC minute within the last 7 days (or 5 minutes
 * ahead), a key id and model of 1–256 characters, a tenant name or "", counts a number holds,
 * and counts that fit each other (cached ≤ prompt, estimated and refused ≤ requests, tokens
 * and GPU time within a bound per request). One bad record refuses the whole batch.
 * @throws ControlPlaneError `LLMGW_CONTROL_PLANE_INVALID_ARGUMENT` naming the field.
 */
export function validateReportUsageRequest(req: ReportUsageRequest, nowMs: number): UsageBatch {
  const L = REPORT_USAGE_LIMITS;
  if (!L.routerId.test(req.routerId))
    throw invalid(
      `ReportUsageRequest.router_id must be 1–63 letters, digits, '.', '_' or '-', starting alphanumeric (got ${shown(req.routerId)})`,
    );
  if (!L.batchId.test(req.batchId))
    throw invalid(
      `ReportUsageRequest.batch_id must be 1–128 printable characters without spaces (got ${shown(req.batchId)})`,
    );
  if (req.records.length > L.maxRecords)
    throw invalid(
      `ReportUsageRequest.records holds ${req.records.length} records, more than ${L.maxRecords}; send them in several batches`,
    );
  const oldest = nowMs - L.maxRecordAgeMs;
  const newest = nowMs + L.maxFutureMs;
  const records = req.records.map((r, i): UsageRecordData => {
    const at = `ReportUsageRequest.records[${i}]`;
    const minute = r.minuteUnixMs;
    if (minute % BigInt(MINUTE_MS) !== 0n)
      throw invalid(`${at}.minute_unix_ms must be the start of a minute (got ${minute})`);
    if (minute < BigInt(oldest) || minute > BigInt(newest))
      throw invalid(
        `${at}.minute_unix_ms ${new Date(Number(minute)).toISOString()} is outside the last 7 days or more than 5 minutes ahead of the control plane's clock (${new Date(nowMs).toISOString()}); older usage cannot be counted once for sure`,
      );
    if (r.keyId.length < 1 || r.keyId.length > L.maxNameChars)
      throw invalid(`${at}.key_id must be 1–${L.maxNameChars} characters (got ${shown(r.keyId)})`);
    if (r.model.length < 1 || r.model.length > L.maxNameChars)
      throw invalid(`${at}.model must be 1–${L.maxNameChars} characters (got ${shown(r.model)})`);
    if (r.tenant !== "" && !L.tenant.test(r.tenant))
      throw invalid(
        `${at}.tenant must be a tenant name (1–63 lower-case letters, digits or '-') or empty (got ${shown(r.tenant)})`,
      );
    for (const [field, name] of COUNT_FIELDS) {
      if (r[field] > L.maxCount)
        throw invalid(`${at}.${name} must be at most ${L.maxCount} (got ${r[field]})`);
    }
    if (r.cachedTokens > r.promptTokens)
      throw invalid(
        `${at}.cached_tokens (${r.cachedTokens}) is more than prompt_tokens (${r.promptTokens})`,
      );
    if (r.estimatedRequests > r.requests)
      throw invalid(
        `${at}.estimated_requests (${r.estimatedRequests}) is more than requests (${r.requests})`,
      );
    if (r.refusedUsage > r.requests)
      throw invalid(
        `${at}.refused_usage (${r.refusedUsage}) is more than requests (${r.requests})`,
      );
    // A router before cached_reported_requests counted every answer but an estimate's.
    const cachedReported = r.cachedReportedRequests ?? r.requests - r.estimatedRequests;
    if (cachedReported > r.requests - r.estimatedRequests)
      throw invalid(
        `${at}.cached_reported_requests (${cachedReported}) is more than requests less estimated_requests (${r.requests - r.estimatedRequests}): an estimate's cached tokens are unknown`,
      );
    if (cachedReported === 0n && r.cachedTokens > 0n)
      throw invalid(
        `${at}.cached_tokens (${r.cachedTokens}) with no request whose cached tokens were reported`,
      );
    if (r.promptTokens + r.completionTokens > r.requests * L.maxTokensPerRequest)
      throw invalid(
        `${at}: ${r.promptTokens + r.completionTokens} prompt + completion tokens for ${r.requests} requests is more than ${L.maxTokensPerRequest} per request`,
      );
    if (r.gpuMilliseconds > r.requests * L.maxGpuMsPerRequest)
      throw invalid(
        `${at}.gpu_milliseconds (${r.gpuMilliseconds}) for ${r.requests} requests is more than ${L.maxGpuMsPerRequest} per request`,
      );
    return {
      minuteMs: Number(minute),
      keyId: r.keyId,
      tenant: r.tenant,
      model: r.model,
      requests: Number(r.requests),
      promptTokens: Number(r.promptTokens),
      cachedTokens: Number(r.cachedTokens),
      cachedReported: Number(cachedReported),
      completionTokens: Number(r.completionTokens),
      gpuMs: Number(r.gpuMilliseconds),
      estimatedRequests: Number(r.estimatedRequests),
      refusedUsage: Number(r.refusedUsage),
    };
  });
  return { routerId: req.routerId, batchId: req.batchId, records };
}

/** A standing as `llmgw.v1.BudgetStanding`. */
export function budgetStandingToProto(s: BudgetStandingData): BudgetStanding {
  return create(BudgetStandingSchema, {
    tenant: s.tenant ?? "",
    keyId: s.keyId ?? "",
    period: budgetPeriodToProto(s.period),
    model: s.model,
    periodStartUnixMs: BigInt(s.periodStartMs),
    usedTokens: BigInt(s.usedTokens),
  });
}

/** A report as `llmgw.v1.ReportUsageResponse`. */
export function usageReportToProto(report: UsageReport): ReportUsageResponse {
  return create(ReportUsageResponseSchema, {
    duplicate: report.duplicate,
    standings: report.standings.map(budgetStandingToProto),
    asOfUnixMs: BigInt(report.asOfMs),
  });
}

/** What `GetUsage` may ask for. */
export const GET_USAGE_LIMITS = {
  maxNameChars: 256,
  /** Periods beyond what a `Date` holds are refused. */
  maxEpochMs: 8_640_000_000_000_000,
} as const;

/** A `GetUsageRequest`, checked: the key filter still as given (an id or a name). */
export interface UsageRequestData extends Omit<UsageQuery, "limit" | "keyIds"> {
  /** A key id or name; absent: every key. */
  readonly key?: string;
}

const BUCKET_OF: Readonly<Record<number, UsageBucket>> = {
  [UsageGranularity.UNSPECIFIED]: "day",
  [UsageGranularity.MINUTE]: "minute",
  [UsageGranularity.HOUR]: "hour",
  [UsageGranularity.DAY]: "day",
};

/**
 * Checks a `GetUsageRequest` at `nowMs`: filters of at most 256 characters, a period with
 * `since` ≥ 0 and `until` (default now) after it, a known granularity (default day) and known
 * dimensions (default tenant and model). The period is widened to whole buckets: a row
 * covers its bucket.
 * @throws ControlPlaneError `LLMGW_CONTROL_PLANE_INVALID_ARGUMENT` naming the field.
 */
export function validateGetUsageRequest(req: GetUsageRequest, nowMs: number): UsageRequestData {
  const L = GET_USAGE_LIMITS;
  for (const [name, value] of [
    ["tenant", req.tenant],
    ["key", req.key],
    ["model", req.model],
  ] as const) {
    if (value.length > L.maxNameChars)
      throw invalid(
        `GetUsageRequest.${name} must be at most ${L.maxNameChars} characters (got ${value.length})`,
      );
  }
  const bucket = BUCKET_OF[req.granularity];
  if (bucket === undefined)
    throw invalid(`GetUsageRequest.granularity ${req.granularity} is not a known granularity`);
  const since = req.sinceUnixMs;
  const until = req.untilUnixMs ?? BigInt(nowMs);
  if (since < 0n || since > BigInt(L.maxEpochMs))
    throw invalid(`GetUsageRequest.since_unix_ms must be 0–${L.maxEpochMs} (got ${since})`);
  if (until <= since || until > BigInt(L.maxEpochMs))
    throw invalid(
      `GetUsageRequest.until_unix_ms must be after since_unix_ms (${since}) and at most ${L.maxEpochMs} (got ${until})`,
    );
  const groupBy = { tenant: false, key: false, model: false };
  for (const d of req.groupBy) {
    if (d === UsageDimension.TENANT) groupBy.tenant = true;
    else if (d === UsageDimension.KEY) groupBy.key = true;
    else if (d === UsageDimension.MODEL) groupBy.model = true;
    else throw invalid(`GetUsageRequest.group_by holds ${d}, not a known dimension`);
  }
  if (req.groupBy.length === 0) {
    groupBy.tenant = true;
    groupBy.model = true;
  }
  return {
    bucket,
    // A bucket that starts before `since` but covers it is included: rows are whole buckets.
    sinceMs: bucketStart(bucket, Number(since)),
    untilMs: Number(until),
    ...(req.tenant === "" ? {} : { tenant: req.tenant }),
    ...(req.key === "" ? {} : { key: req.key }),
    ...(req.model === "" ? {} : { model: req.model }),
    groupBy,
  };
}

/** A rollup row as `llmgw.v1.UsageRow`, with its key's name (or "" when unknown). */
export function usageRowToProto(row: UsageRollupRow, keyName: string): UsageRow {
  return create(UsageRowSchema, {
    startUnixMs: BigInt(row.startMs),
    tenant: row.tenant,
    keyId: row.keyId,
    keyName,
    model: row.model,
    requests: BigInt(row.requests),
    promptTokens: BigInt(row.promptTokens),
    cachedTokens: BigInt(row.cachedTokens),
    cachedReportedRequests: BigInt(row.cachedReported),
    completionTokens: BigInt(row.completionTokens),
    gpuSeconds: row.gpuMs / 1000,
    estimatedRequests: BigInt(row.estimatedRequests),
    refusedUsage: BigInt(row.refusedUsage),
  });
}
