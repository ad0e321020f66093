import { create } from "@bufbuild/protobuf";
import {
  BudgetPeriod,
  PriorityClass,
  TenantSchema,
  type TokenBudget,
  TokenBudgetSchema,
} from "@llmgw/proto";
import { describe, expect, it } from "vitest";
import {
  buildTenantUpdate,
  EMPTY_TENANT_FORM,
  newTenant,
  parseTenantForm,
  type TenantFormValues,
  type TenantUpdate,
  tenantFormValues,
  tenantNow,
  withOverallBudgets,
} from "./tenant-form.js";

const { DAY, MONTH } = BudgetPeriod;
const budget = (period: BudgetPeriod, tokens: bigint, model = "") =>
  create(TokenBudgetSchema, { period, model, tokens });

/** search: critical, weight 2, 600 rpm, 1M a day overall and 5k a day of llama. */
const search = create(TenantSchema, {
  name: "search",
  createdAtUnixMs: 1_765_000_000_000n,
  priority: PriorityClass.CRITICAL,
  weight: 2,
  requestsPerMinute: 600,
  budgets: [budget(DAY, 5_000n, "llama"), budget(DAY, 1_000_000n)],
  activeKeys: 1,
});
const shown = tenantFormValues(search);
/** The update of search's budgets to `budgets` (period, model, tokens). */
const budgetsSent = (...budgets: [BudgetPeriod, string, bigint][]): TenantUpdate => ({
  tenant: {
    name: "search",
    budgets: budgets.map(([period, model, tokens]) => ({ period, model, tokens })),
  },
  fields: ["budgets"],
});
/** `shown` with `change` typed over it, as the update it makes. */
const edit = (change: Partial<TenantFormValues>, current = search.budgets) =>
  buildTenantUpdate(search, parseTenantForm({ ...shown, ...change }), current);

describe("tenantFormValues", () => {
  it("fills the form with the tenant's settings; unset is empty, never 0", () => {
    expect(shown).toEqual({
      name: "search",
      priority: "critical",
      weight: "2",
      isolation: "",
      rpm: "600",
      tpm: "",
      concurrency: "",
      day: "1000000",
      month: "",
    });
  });

  it("reads no class as standard and weight 0 as 1", () => {
    const bare = create(TenantSchema, { name: "bare" });
    expect(tenantFormValues(bare)).toEqual({ ...EMPTY_TENANT_FORM, name: "bare", weight: "1" });
  });
});

describe("parseTenantForm", () => {
  it.each([
    [{ weight: "0" }, "weight: a whole number in 1–1000"],
    [{ weight: "1001" }, "weight: a whole number in 1–1000"],
    [{ rpm: "-5" }, "requests per minute: a whole number of at least 1, or empty for no limit"],
    [{ tpm: "1.5" }, "tokens per minute: a whole number of at least 1, or empty for no limit"],
    [{ concurrency: "0" }, "concurrency: a whole number of at least 1, or empty for no limit"],
    [{ day: "0" }, "daily tokens: a whole number of tokens of at least 1, or empty for none"],
    [
      { month: "lots" },
      "monthly tokens: a whole number of tokens of at least 1, or empty for none",
    ],
    [{ priority: "urgent" }, "class: one of standard, critical, batch"],
    [
      { isolation: "none" },
      "cache isolation: one of as each router is set, apart from other tenants, each key apart",
    ],
  ])("refuses %j: %s", (change, message) => {
    expect(() => parseTenantForm({ ...shown, ...change })).toThrow(message);
  });
});

describe("buildTenantUpdate", () => {
  it.each<[string, Partial<TenantFormValues>, TenantUpdate]>([
    ["nothing changed", {}, { tenant: { name: "search" }, fields: [] }],
    [
      "spelt otherwise, the same",
      { rpm: " 0600 ", weight: "2" },
      { tenant: { name: "search" }, fields: [] },
    ],
    [
      "a limit set",
      { tpm: "20000" },
      { tenant: { name: "search", tokensPerMinute: 20_000 }, fields: ["tokens_per_minute"] },
    ],
    [
      "a limit emptied: named, left out, which clears it",
      { rpm: "" },
      { tenant: { name: "search" }, fields: ["requests_per_minute"] },
    ],
    [
      "class and weight",
      { priority: "batch", weight: "" },
      {
        tenant: { name: "search", priority: PriorityClass.BATCH, weight: 1 },
        fields: ["priority", "weight"],
      },
    ],
    [
      "its prefix cache kept apart",
      { isolation: "tenant" },
      { tenant: { name: "search", cacheIsolation: "tenant" }, fields: ["cache_isolation"] },
    ],
    [
      "the daily budget: the whole list, the model's budget kept in its place",
      { day: "2000000" },
      budgetsSent([DAY, "llama", 5_000n], [DAY, "", 2_000_000n]),
    ],
    [
      "the daily budget emptied and a monthly one added",
      { day: "", month: "30000000" },
      budgetsSent([DAY, "llama", 5_000n], [MONTH, "", 30_000_000n]),
    ],
  ])("%s", (_, change, update) => {
    expect(edit(change)).toEqual(update);
  });

  it("merges a changed budget into the budgets as they are now, not as they were shown", () => {
    const now = [...search.budgets, budget(MONTH, 9_000n, "qwen")];
    expect(edit({ tpm: "1" }, now).tenant.budgets).toBeUndefined();
    expect(edit({ day: "7" }, now).tenant.budgets).toEqual([
      { period: DAY, model: "llama", tokens: 5_000n },
      { period: DAY, model: "", tokens: 7n },
      { period: MONTH, model: "qwen", tokens: 9_000n },
    ]);
  });

  /** search's budgets now, after the CLI raised its daily budget to 2M. */
  const dayRaised = [budget(DAY, 5_000n, "llama"), budget(DAY, 2_000_000n)];
  it.each<[string, TokenBudget[], Partial<TenantFormValues>, [BudgetPeriod, string, bigint][]]>([
    [
      "the month changed: the day raised since stays raised",
      dayRaised,
      { month: "30000000" },
      [
        [DAY, "llama", 5_000n],
        [DAY, "", 2_000_000n],
        [MONTH, "", 30_000_000n],
      ],
    ],
    [
      "the day changed: the form's day wins over the one raised since",
      dayRaised,
      { day: "3000000" },
      [
        [DAY, "llama", 5_000n],
        [DAY, "", 3_000_000n],
      ],
    ],
    [
      "the day emptied: removed, though raised since",
      dayRaised,
      { day: "" },
      [[DAY, "llama", 5_000n]],
    ],
    [
      "the day emptied and a month added: the day removed",
      dayRaised,
      { day: "", month: "30000000" },
      [
        [DAY, "llama", 5_000n],
        [MONTH, "", 30_000_000n],
      ],
    ],
    [
      "the day changed: a month set since stays in its place",
      [budget(MONTH, 40_000_000n), ...search.budgets],
      { day: "3000000" },
      [
        [MONTH, "", 40_000_000n],
        [DAY, "llama", 5_000n],
        [DAY, "", 3_000_000n],
      ],
    ],
    [
      "the month changed: a day removed since stays removed",
      [budget(DAY, 5_000n, "llama")],
      { month: "30000000" },
      [
        [DAY, "llama", 5_000n],
        [MONTH, "", 30_000_000n],
      ],
    ],
  ])("%s", (_, current, change, sent) => {
    expect(edit(change, current)).toEqual(budgetsSent(...sent));
  });
});

describe("tenantNow", () => {
  const other = create(TenantSchema, { name: "ops", createdAtUnixMs: 1n });
  it("is the tenant of that name as it is now", () => {
    const now = create(TenantSchema, { ...search, weight: 5 });
    expect(tenantNow(search, [other, now])).toBe(now);
  });

  it.each([
    ["gone", [other], "tenant search was deleted since this dialog opened; close it"],
    [
      "deleted and created again",
      [other, create(TenantSchema, { ...search, createdAtUnixMs: search.createdAtUnixMs + 1n })],
      "tenant search was deleted and created again since this dialog opened; close it and edit again",
    ],
  ])("refuses when %s", (_, tenants, message) => {
    expect(() => tenantNow(search, tenants)).toThrow(message);
  });
});

describe("withOverallBudgets", () => {
  it.each([
    ["none to none", [], undefined, undefined, []],
    [
      "adds day then month after the models' budgets",
      [budget(MONTH, 3n, "m")],
      4n,
      5n,
      [
        { period: MONTH, model: "m", tokens: 3n },
        { period: DAY, model: "", tokens: 4n },
        { period: MONTH, model: "", tokens: 5n },
      ],
    ],
    [
      "replaces in place and removes",
      [budget(MONTH, 1n), budget(DAY, 2n, "m"), budget(DAY, 3n)],
      undefined,
      6n,
      [
        { period: MONTH, model: "", tokens: 6n },
        { period: DAY, model: "m", tokens: 2n },
      ],
    ],
  ])("%s", (_, budgets, day, month, expected) => {
    expect(withOverallBudgets(budgets, day, month)).toEqual(expected);
  });
});

describe("newTenant", () => {
  it("sets what was given and leaves unset limits out", () => {
    const form = { ...EMPTY_TENANT_FORM, priority: "batch", tpm: "100", day: "5000000000" };
    expect(newTenant("ops", parseTenantForm(form))).toEqual({
      name: "ops",
      priority: PriorityClass.BATCH,
      weight: 1,
      cacheIsolation: "",
      tokensPerMinute: 100,
      budgets: [{ period: DAY, model: "", tokens: 5_000_000_000n }],
    });
  });
});
