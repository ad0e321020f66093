import { create } from "@bufbuild/protobuf";
import { BudgetPeriod, PriorityClass, UsageGranularity, UsageRowSchema } from "@llmgw/proto";
import { describe, expect, it } from "vitest";
import {
  budgetText,
  cachedText,
  gpuTime,
  optionalTokens,
  periodStartMs,
  priorityText,
  thousands,
  USAGE_PERIODS,
  type UsageTotal,
  usageTotals,
  weightOf,
} from "./usage-model.js";

const row = (tenant: string, model: string, start: number, n: number) =>
  create(UsageRowSchema, {
    startUnixMs: BigInt(start),
    tenant,
    model,
    requests: BigInt(n),
    promptTokens: BigInt(100 * n),
    cachedTokens: BigInt(10 * n),
    cachedReportedRequests: BigInt(n - 1),
    completionTokens: BigInt(20 * n),
    gpuSeconds: 0.5 * n,
    estimatedRequests: n === 3 ? 1n : 0n,
    refusedUsage: n === 2 ? 1n : 0n,
  });

describe("usageTotals", () => {
  it("sums each tenant's buckets per model, tenants by name and keys of no tenant last", () => {
    const totals = usageTotals([
      row("", "chat", 0, 1),
      row("search", "embed", 0, 2),
      row("beta", "chat", 0, 1),
      row("search", "chat", 0, 1),
      row("search", "embed", 3_600_000, 3),
    ]);
    expect(totals.map((t) => `${t.tenant}/${t.model}`)).toEqual([
      "beta/chat",
      "search/chat",
      "search/embed",
      "/chat",
    ]);
    expect(totals[2]).toEqual({
      tenant: "search",
      model: "embed",
      requests: 5n,
      promptTokens: 500n,
      cachedTokens: 50n,
      cachedReportedRequests: 3n,
      completionTokens: 100n,
      gpuSeconds: 2.5,
      estimatedRequests: 1n,
      refusedUsage: 1n,
    });
  });

  it("is empty for no rows", () => {
    expect(usageTotals([])).toEqual([]);
  });

  it("writes cached tokens no engine reported as unknown, not 0", () => {
    const [none, some] = usageTotals([row("a", "chat", 0, 1), row("b", "chat", 0, 2)]);
    expect(cachedText(none as UsageTotal)).toBe("—");
    expect(cachedText(some as UsageTotal)).toBe("20");
    expect(cachedText({ cachedTokens: 0n, cachedReportedRequests: 4n })).toBe("0");
  });
});

describe("the page's numbers", () => {
  it("starts a period at its first bucket's start", () => {
    const now = Date.UTC(2026, 11, 6, 17, 42, 10);
    const [day, week] = USAGE_PERIODS;
    expect(periodStartMs(day, now)).toBe(Date.UTC(2026, 11, 5, 17));
    expect(week.granularity).toBe(UsageGranularity.DAY);
    expect(periodStartMs(week, now)).toBe(Date.UTC(2026, 10, 29));
  });

  it("writes counts, GPU time, budgets and classes", () => {
    expect(thousands(0n)).toBe("0");
    expect(thousands(1234567n)).toBe("1,234,567");
    expect(thousands(18_446_744_073_709_551_615n)).toBe("18,446,744,073,709,551,615");
    expect([
      gpuTime(0.25),
      gpuTime(42.4),
      gpuTime(210),
      gpuTime(7_560),
      gpuTime(Number.NaN),
    ]).toEqual(["0.3 s", "42 s", "3.5 min", "2.1 h", "—"]);
    expect(budgetText({ period: BudgetPeriod.DAY, model: "", tokens: 1_000_000n })).toBe(
      "day: 1,000,000",
    );
    expect(budgetText({ period: BudgetPeriod.MONTH, model: "llama-8b", tokens: 5n })).toBe(
      "month (llama-8b): 5",
    );
    expect(priorityText(PriorityClass.UNSPECIFIED)).toBe("standard");
    expect(priorityText(PriorityClass.CRITICAL)).toBe("critical");
    expect(priorityText(PriorityClass.BATCH)).toBe("batch");
  });
});

describe("the create-tenant form's fields", () => {
  it("takes a budget up to 2^53 − 1 tokens, empty as none, and refuses the rest by name", () => {
    expect(optionalTokens("", "daily tokens")).toBeUndefined();
    expect(optionalTokens(" 5000000000 ", "daily tokens")).toBe(5_000_000_000n);
    expect(optionalTokens("9007199254740991", "daily tokens")).toBe(9_007_199_254_740_991n);
    for (const bad of ["0", "-1", "1.5", "1e6", "9007199254740992", "many"]) {
      expect(() => optionalTokens(bad, "daily tokens")).toThrow(
        "daily tokens: a whole number of tokens of at least 1, or empty for none",
      );
    }
  });

  it("takes a weight in 1–1000, empty as 1", () => {
    expect(weightOf("")).toBe(1);
    expect(weightOf("1000")).toBe(1000);
    for (const bad of ["0", "1001", "2.5", "x"]) {
      expect(() => weightOf(bad)).toThrow("weight: a whole number in 1–1000");
    }
  });
});
