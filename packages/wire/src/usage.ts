/*
 * Usage batches and budget standings between `@llmgw/router`'s plain records (numbers) and the
 * wire `ReportUsage` messages (bigint): the router's side of `RouterService.ReportUsage`, and
 * the in-process router's, which skips the wire.
 */
import { create } from "@bufbuild/protobuf";
import {
  BudgetPeriod as BudgetPeriodProto,
  type ReportUsageRequest,
  ReportUsageRequestSchema,
  type ReportUsageResponse,
  ReportUsageResponseSchema,
} from "@llmgw/proto";
import type { BudgetStanding, UsageAnswer, UsageBatch, UsageEntry } from "@llmgw/router";

/** A sealed batch as `RouterService.ReportUsage` takes it. */
export function usageBatchToProto(routerId: string, batch: UsageBatch): ReportUsageRequest {
  return create(ReportUsageRequestSchema, {
    routerId,
    batchId: batch.batchId,
    records: batch.records.map((r: UsageEntry) => ({
      minuteUnixMs: BigInt(r.minuteMs),
      keyId: r.keyId,
      tenant: r.tenant,
      model: r.model,
      requests: BigInt(r.requests),
      promptTokens: BigInt(r.promptTokens),
      cachedTokens: BigInt(r.cachedTokens),
      cachedReportedRequests: BigInt(r.cachedReported),
      completionTokens: BigInt(r.completionTokens),
      gpuMilliseconds: BigInt(Math.max(0, Math.round(r.gpuMs))),
      estimatedRequests: BigInt(r.estimatedRequests),
      refusedUsage: BigInt(r.refusedUsage),
    })),
  });
}

/** Most standings one answer may carry; more is a control plane gone wrong. */
const MAX_STANDINGS = 100_000;

/**
 * A `ReportUsage` answer as the router's limiter takes it. Standings that make no sense
 * (no owner, an unknown period, counts beyond 2^53) are left out, never trusted.
 */
export function usageAnswerFromProto(res: ReportUsageResponse): UsageAnswer {
  const standings: BudgetStanding[] = [];
  for (const s of res.standings.slice(0, MAX_STANDINGS)) {
    const period =
      s.period === BudgetPeriodProto.DAY
        ? "day"
        : s.period === BudgetPeriodProto.MONTH
          ? "month"
          : undefined;
    const used = Number(s.usedTokens);
    const start = Number(s.periodStartUnixMs);
    if (period === undefined || (s.tenant === "") === (s.keyId === "")) continue;
    if (!Number.isSafeInteger(used) || !Number.isSafeInteger(start) || used < 0) continue;
    standings.push({
      ...(s.tenant === "" ? {} : { tenant: s.tenant }),
      ...(s.keyId === "" ? {} : { keyId: s.keyId }),
      period,
      model: s.model,
      periodStartMs: start,
      usedTokens: used,
    });
  }
  return { duplicate: res.duplicate, standings, asOfMs: Number(res.asOfUnixMs) };
}

/** The control plane's side: an answer in wire form. */
export function usageAnswerToProto(answer: UsageAnswer): ReportUsageResponse {
  return create(ReportUsageResponseSchema, {
    duplicate: answer.duplicate,
    asOfUnixMs: BigInt(answer.asOfMs),
    standings: answer.standings.map((s) => ({
      tenant: s.tenant ?? "",
      keyId: s.keyId ?? "",
      period: s.period === "day" ? BudgetPeriodProto.DAY : BudgetPeriodProto.MONTH,
      model: s.model,
      periodStartUnixMs: BigInt(s.periodStartMs),
      usedTokens: BigInt(s.usedTokens),
    })),
  });
}
