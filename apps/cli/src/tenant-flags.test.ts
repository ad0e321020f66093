import { BudgetPeriod, PriorityClass } from "@llmgw/proto";
import { describe, expect, it } from "vitest";
import {
  formatBudget,
  parseBudgetFlag,
  parseLimitFlag,
  parsePriorityFlag,
  parseWeightFlag,
} from "./tenant-flags.js";

describe("parseBudgetFlag", () => {
  it.each([
    ["day=1000000", { period: BudgetPeriod.DAY, model: "", tokens: 1_000_000n }],
    [
      "month:llama-3-8b=50000000",
      { period: BudgetPeriod.MONTH, model: "llama-3-8b", tokens: 50_000_000n },
    ],
    ["DAY:org/m:v2=5", { period: BudgetPeriod.DAY, model: "org/m:v2", tokens: 5n }],
    ["day=9007199254740991", { period: BudgetPeriod.DAY, model: "", tokens: 2n ** 53n - 1n }],
  ])("%s", (flag, budget) => {
    expect(parseBudgetFlag(flag)).toEqual(budget);
    expect(formatBudget(parseBudgetFlag(flag))).toBe(flag.replace(/^DAY/, "day"));
  });

  it.each([
    ["week=5", "the period is day or month"],
    ["day", "TOKENS is a whole number in 1–9007199254740991"],
    ["day=0", "TOKENS is a whole number in 1–9007199254740991"],
    ["day=9007199254740992", "TOKENS is a whole number in 1–9007199254740991"],
    ["day=1e6", "TOKENS is a whole number in 1–9007199254740991"],
    ["month:=5", "a ':' must be followed by a model name"],
  ])("refuses %s", (flag, why) => {
    expect(() => parseBudgetFlag(flag)).toThrow(
      `--budget must look like day=TOKENS or month:MODEL=TOKENS (${why}), got "${flag}"`,
    );
  });
});

describe("the other tenant flags", () => {
  it("parse priority classes, limits and weights, and refuse what is not one", () => {
    expect(parsePriorityFlag(undefined)).toBe(PriorityClass.UNSPECIFIED);
    expect(parsePriorityFlag("Batch")).toBe(PriorityClass.BATCH);
    expect(() => parsePriorityFlag("urgent")).toThrow(
      '--priority must be critical, standard or batch, got "urgent"',
    );
    expect(parseLimitFlag("4294967295", "--rpm")).toBe(4_294_967_295);
    expect(() => parseLimitFlag("0", "--tpm")).toThrow(
      '--tpm must be a whole number in 1–4294967295, got "0"',
    );
    expect(parseWeightFlag("1000")).toBe(1000);
    expect(() => parseWeightFlag("1001")).toThrow(
      '--weight must be a whole number in 1–1000, got "1001"',
    );
  });
});
