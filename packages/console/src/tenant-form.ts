/**
 * The tenants page's form as data: what an operator typed, checked into a tenant's settings,
 * and the `CreateTenant` or `UpdateTenant` request those settings make. Pure, so it is tested
 * without a browser.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import {
  BudgetPeriod,
  PriorityClass,
  type Tenant,
  type TenantSchema,
  type TokenBudget,
  type TokenBudgetSchema,
} from "@llmgw/proto";
import { optionalLimit } from "./optional-limit.js";
import { optionalTokens, priorityText, weightOf } from "./usage-model.js";

export type TenantInit = MessageInitShape<typeof TenantSchema>;
export type TokenBudgetInit = MessageInitShape<typeof TokenBudgetSchema>;

/** The classes the form offers, by the name it shows. */
export const PRIORITY_CLASSES = [
  ["standard", PriorityClass.STANDARD],
  ["critical", PriorityClass.CRITICAL],
  ["batch", PriorityClass.BATCH],
] as const;

/**
 * The cache isolation the form offers, by the name it shows: "" asks nothing (each router's own
 * `--cache-isolation`), else the `Tenant.cache_isolation` word.
 */
export const CACHE_ISOLATION_CHOICES = [
  ["", "as each router is set"],
  ["tenant", "apart from other tenants"],
  ["key", "each key apart"],
] as const;

/** A tenant's `cache_isolation` as the console shows it; an unknown word as it is. */
export function isolationText(word: string): string {
  return CACHE_ISOLATION_CHOICES.find(([w]) => w === word)?.[1] ?? word;
}

/** The form's inputs as typed; "" is unset: no limit, no budget, weight 1. */
export interface TenantFormValues {
  readonly name: string;
  /** A name of {@link PRIORITY_CLASSES}. */
  readonly priority: string;
  readonly weight: string;
  /** A word of {@link CACHE_ISOLATION_CHOICES}. */
  readonly isolation: string;
  readonly rpm: string;
  readonly tpm: string;
  readonly concurrency: string;
  /** The daily budget of every model together, in tokens. */
  readonly day: string;
  /** The monthly budget of every model together, in tokens. */
  readonly month: string;
}

/** The form of a new tenant: a standard one with no limits. */
export const EMPTY_TENANT_FORM: TenantFormValues = {
  name: "",
  priority: "standard",
  weight: "",
  isolation: "",
  rpm: "",
  tpm: "",
  concurrency: "",
  day: "",
  month: "",
};

/** The settings the form sets, checked; undefined is unset (no limit, no budget). */
export interface TenantSettings {
  /** Never unspecified: a tenant with no class is standard. */
  readonly priority: PriorityClass;
  /** 1–1000. */
  readonly weight: number;
  /** `Tenant.cache_isolation`: "" (each router's own), "tenant" or "key". */
  readonly cacheIsolation: string;
  readonly requestsPerMinute: number | undefined;
  readonly tokensPerMinute: number | undefined;
  readonly maxConcurrency: number | undefined;
  /** The daily budget of every model together. */
  readonly dayTokens: bigint | undefined;
  /** The monthly budget of every model together. */
  readonly monthTokens: bigint | undefined;
}

/** The budget of every model together for `period` among `budgets`, or undefined. */
function overallBudget(budgets: readonly TokenBudget[], period: BudgetPeriod): bigint | undefined {
  return budgets.find((b) => b.model === "" && b.period === period)?.tokens;
}

/** `t`'s settings as the form has them: no class reads as standard, weight 0 as 1. */
export function tenantSettings(t: Tenant): TenantSettings {
  return {
    priority: t.priority === PriorityClass.UNSPECIFIED ? PriorityClass.STANDARD : t.priority,
    weight: t.weight || 1,
    cacheIsolation: t.cacheIsolation,
    requestsPerMinute: t.requestsPerMinute,
    tokensPerMinute: t.tokensPerMinute,
    maxConcurrency: t.maxConcurrency,
    dayTokens: overallBudget(t.budgets, BudgetPeriod.DAY),
    monthTokens: overallBudget(t.budgets, BudgetPeriod.MONTH),
  };
}

/** The form filled with `t`'s settings; an unset limit or budget is an empty field. */
export function tenantFormValues(t: Tenant): TenantFormValues {
  const s = tenantSettings(t);
  const text = (v: number | bigint | undefined) => (v === undefined ? "" : String(v));
  return {
    name: t.name,
    priority: priorityText(s.priority),
    weight: String(s.weight),
    isolation: s.cacheIsolation,
    rpm: text(s.requestsPerMinute),
    tpm: text(s.tokensPerMinute),
    concurrency: text(s.maxConcurrency),
    day: text(s.dayTokens),
    month: text(s.monthTokens),
  };
}

/** The form's settings (not its name), or an error naming the first bad field. */
export function parseTenantForm(v: TenantFormValues): TenantSettings {
  const priority = PRIORITY_CLASSES.find(([n]) => n === v.priority)?.[1];
  if (priority === undefined)
    throw new Error(`class: one of ${PRIORITY_CLASSES.map(([n]) => n).join(", ")}`);
  if (!CACHE_ISOLATION_CHOICES.some(([w]) => w === v.isolation))
    throw new Error(
      `cache isolation: one of ${CACHE_ISOLATION_CHOICES.map(([, label]) => label).join(", ")}`,
    );
  return {
    priority,
    weight: weightOf(v.weight),
    cacheIsolation: v.isolation,
    requestsPerMinute: optionalLimit(v.rpm, "requests per minute"),
    tokensPerMinute: optionalLimit(v.tpm, "tokens per minute"),
    maxConcurrency: optionalLimit(v.concurrency, "concurrency"),
    dayTokens: optionalTokens(v.day, "daily tokens"),
    monthTokens: optionalTokens(v.month, "monthly tokens"),
  };
}

/** The limits the form sets: each `UpdateTenantRequest.fields` name and its `Tenant` key. */
const LIMITS = [
  ["requests_per_minute", "requestsPerMinute"],
  ["tokens_per_minute", "tokensPerMinute"],
  ["max_concurrency", "maxConcurrency"],
] as const;

/** Limit `key` of `s` as a `Tenant` field: `{}` when unset, which is no limit. */
const limitOf = (s: TenantSettings, key: (typeof LIMITS)[number][1]): TenantInit => {
  const v = s[key];
  return v === undefined ? {} : { [key]: v };
};

/** The tenant `CreateTenant` makes of `name` and `s`. */
export function newTenant(name: string, s: TenantSettings): TenantInit {
  const tenant: TenantInit = {
    name,
    priority: s.priority,
    weight: s.weight,
    cacheIsolation: s.cacheIsolation,
    budgets: withOverallBudgets([], s.dayTokens, s.monthTokens),
  };
  for (const [, key] of LIMITS) Object.assign(tenant, limitOf(s, key));
  return tenant;
}

/**
 * `budgets` with its budgets of every model together for a day and a month set to `day` and
 * `month` (undefined removes one; a new one goes last). Budgets of one model stay as they
 * are, in their places.
 */
export function withOverallBudgets(
  budgets: readonly TokenBudget[],
  day: bigint | undefined,
  month: bigint | undefined,
): TokenBudgetInit[] {
  const overall = new Map([
    [BudgetPeriod.DAY, day],
    [BudgetPeriod.MONTH, month],
  ]);
  const kept: TokenBudgetInit[] = [];
  for (const b of budgets) {
    const isOverall = b.model === "" && overall.has(b.period);
    const tokens = isOverall ? overall.get(b.period) : b.tokens;
    if (isOverall) overall.delete(b.period);
    if (tokens !== undefined) kept.push({ period: b.period, model: b.model, tokens });
  }
  for (const [period, tokens] of overall)
    if (tokens !== undefined) kept.push({ period, model: "", tokens });
  return kept;
}

/** `UpdateTenantRequest.fields` names the form may change. */
export type TenantField =
  | "priority"
  | "weight"
  | "cache_isolation"
  | "requests_per_minute"
  | "tokens_per_minute"
  | "max_concurrency"
  | "budgets";

/** An `UpdateTenantRequest`. */
export interface TenantUpdate {
  readonly tenant: TenantInit;
  readonly fields: TenantField[];
}

/**
 * The `UpdateTenant` request that takes the tenant the form was filled with, `shown`, to
 * `next`: it names only the fields that differ, with their new values. A limit made unset is
 * named and left out, which the control plane reads as "no limit". Budgets are one field:
 * when the daily or monthly budget differs, the request carries the whole list, `current`
 * (the tenant's budgets now; `shown`'s by default) with the overall budget(s) that differ set
 * (or removed) and every other budget, of one model or of a period the form left alone, as it
 * is in `current`: a budget changed elsewhere since the dialog opened is not put back.
 */
export function buildTenantUpdate(
  shown: Tenant,
  next: TenantSettings,
  current: readonly TokenBudget[] = shown.budgets,
): TenantUpdate {
  const before = tenantSettings(shown);
  const fields: TenantField[] = [];
  const tenant: TenantInit = { name: shown.name };
  const change = (field: TenantField, differs: boolean, value: () => TenantInit) => {
    if (!differs) return;
    fields.push(field);
    Object.assign(tenant, value());
  };
  change("priority", next.priority !== before.priority, () => ({ priority: next.priority }));
  change("weight", next.weight !== before.weight, () => ({ weight: next.weight }));
  change("cache_isolation", next.cacheIsolation !== before.cacheIsolation, () => ({
    cacheIsolation: next.cacheIsolation,
  }));
  for (const [field, key] of LIMITS)
    change(field, next[key] !== before[key], () => limitOf(next, key));
  const dayChanged = next.dayTokens !== before.dayTokens;
  const monthChanged = next.monthTokens !== before.monthTokens;
  change("budgets", dayChanged || monthChanged, () => ({
    budgets: withOverallBudgets(
      current,
      dayChanged ? next.dayTokens : overallBudget(current, BudgetPeriod.DAY),
      monthChanged ? next.monthTokens : overallBudget(current, BudgetPeriod.MONTH),
    ),
  }));
  return { tenant, fields };
}

/**
 * The tenant the edit dialog filled with `shown` is now, among `tenants` (re-read just before
 * sending). Throws, with a message for the dialog, when it is gone or when a tenant of that
 * name has another creation time: it was deleted and created again while the dialog was open,
 * and the edit must not land on the new one.
 */
export function tenantNow(shown: Tenant, tenants: readonly Tenant[]): Tenant {
  const now = tenants.find((t) => t.name === shown.name);
  if (now === undefined)
    throw new Error(`tenant ${shown.name} was deleted since this dialog opened; close it`);
  if (now.createdAtUnixMs !== shown.createdAtUnixMs)
    throw new Error(
      `tenant ${shown.name} was deleted and created again since this dialog opened; close it and edit again`,
    );
  return now;
}
