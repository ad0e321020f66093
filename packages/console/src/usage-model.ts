/**
 * What the tenants page shows of `GetUsage`: the rows of a period summed by tenant and model,
 * and how tenants' limits read. Pure, so it is tested without a browser.
 */
import {
  BudgetPeriod,
  PriorityClass,
  type TokenBudget,
  UsageGranularity,
  type UsageRow,
} from "@llmgw/proto";
import { ABSENT } from "./format.js";

/** The periods the page offers: how far back, and the buckets `GetUsage` sums. */
export const USAGE_PERIODS = [
  { id: "24h", label: "last 24 hours", ms: 24 * 3_600_000, granularity: UsageGranularity.HOUR },
  { id: "7d", label: "last 7 days", ms: 7 * 86_400_000, granularity: UsageGranularity.DAY },
  { id: "30d", label: "last 30 days", ms: 30 * 86_400_000, granularity: UsageGranularity.DAY },
] as const;

export type UsagePeriodId = (typeof USAGE_PERIODS)[number]["id"];

/**
 * Where a period starts: `ms` before `nowMs`, moved back to the start of its first bucket, so
 * that the first bucket is counted whole rather than from somewhere inside it.
 */
export function periodStartMs(period: (typeof USAGE_PERIODS)[number], nowMs: number): number {
  const bucketMs = period.granularity === UsageGranularity.HOUR ? 3_600_000 : 86_400_000;
  const start = nowMs - period.ms;
  return start - (start % bucketMs);
}

/** One tenant's use of one model over the period. */
export interface UsageTotal {
  /** "" for keys of no tenant. */
  readonly tenant: string;
  readonly model: string;
  readonly requests: bigint;
  readonly promptTokens: bigint;
  /** Cached prompt tokens of the {@link cachedReportedRequests}. */
  readonly cachedTokens: bigint;
  /** Requests whose engine reported its cached tokens; 0: {@link cachedTokens} unknown. */
  readonly cachedReportedRequests: bigint;
  readonly completionTokens: bigint;
  readonly gpuSeconds: number;
  /** Requests charged an estimate (cut short, or no usage reported). */
  readonly estimatedRequests: bigint;
  /** Answers whose reported usage was refused (negative, fractional, absurd), charged an estimate. */
  readonly refusedUsage: bigint;
}

/** `rows` (any buckets, grouped by tenant and model) summed per tenant and model, sorted. */
export function usageTotals(rows: readonly UsageRow[]): UsageTotal[] {
  const totals = new Map<string, UsageTotal>();
  for (const r of rows) {
    const id = `${r.tenant}\0${r.model}`;
    const t = totals.get(id);
    totals.set(id, {
      tenant: r.tenant,
      model: r.model,
      requests: (t?.requests ?? 0n) + r.requests,
      promptTokens: (t?.promptTokens ?? 0n) + r.promptTokens,
      cachedTokens: (t?.cachedTokens ?? 0n) + r.cachedTokens,
      cachedReportedRequests: (t?.cachedReportedRequests ?? 0n) + r.cachedReportedRequests,
      completionTokens: (t?.completionTokens ?? 0n) + r.completionTokens,
      gpuSeconds: (t?.gpuSeconds ?? 0) + r.gpuSeconds,
      estimatedRequests: (t?.estimatedRequests ?? 0n) + r.estimatedRequests,
      refusedUsage: (t?.refusedUsage ?? 0n) + r.refusedUsage,
    });
  }
  // Tenants by name, keys of no tenant last; models by name within each.
  return [...totals.values()].sort(
    (a, b) =>
      Number(a.tenant === "") - Number(b.tenant === "") ||
      a.tenant.localeCompare(b.tenant) ||
      a.model.localeCompare(b.model),
  );
}

/** A total's cached tokens: "—" where no engine reported them (unknown, not 0). */
export function cachedText(t: Pick<UsageTotal, "cachedTokens" | "cachedReportedRequests">): string {
  return t.cachedReportedRequests === 0n ? ABSENT : thousands(t.cachedTokens);
}

/** 1234567 → "1,234,567" (exact for any bigint). */
export function thousands(v: bigint): string {
  return v.toString().replace(/\B(?=(\d{3})+(?!\d))/g, ",");
}

/** GPU time as it reads best: "42 s", "3.5 min", "2.1 h". */
export function gpuTime(seconds: number): string {
  if (!Number.isFinite(seconds) || seconds < 0) return "—";
  if (seconds < 60) return `${seconds < 10 ? seconds.toFixed(1) : Math.round(seconds)} s`;
  if (seconds < 3_600) return `${(seconds / 60).toFixed(1)} min`;
  return `${(seconds / 3_600).toFixed(1)} h`;
}

/** A budget as the CLI's flags spell it: "day: 1,000,000", "month (llama-8b): 50,000,000". */
export function budgetText(b: Pick<TokenBudget, "period" | "model" | "tokens">): string {
  const period = b.period === BudgetPeriod.MONTH ? "month" : "day";
  return `${period}${b.model === "" ? "" : ` (${b.model})`}: ${thousands(b.tokens)}`;
}

/** A tenant's priority class; unspecified reads as standard, which it is. */
export function priorityText(p: PriorityClass): string {
  switch (p) {
    case PriorityClass.CRITICAL:
      return "critical";
    case PriorityClass.BATCH:
      return "batch";
    default:
      return "standard";
  }
}

/**
 * "" → undefined; otherwise a whole number of tokens in 1–2^53−1, or an error naming `field`
 * (a budget may exceed a rate limit's 32 bits).
 */
export function optionalTokens(value: string, field: string): bigint | undefined {
  const v = value.trim();
  if (v === "") return undefined;
  if (!/^\d{1,16}$/.test(v) || BigInt(v) < 1n || BigInt(v) > BigInt(Number.MAX_SAFE_INTEGER))
    throw new Error(`${field}: a whole number of tokens of at least 1, or empty for none`);
  return BigInt(v);
}

/** A tenant's weight: empty is 1; else a whole number in 1–1000. */
export function weightOf(value: string): number {
  const v = value.trim();
  if (v === "") return 1;
  if (!/^\d{1,4}$/.test(v) || Number(v) < 1 || Number(v) > 1000)
    throw new Error("weight: a whole number in 1–1000");
  return Number(v);
}
