import { BudgetPeriod, PriorityClass, type TokenBudget } from "@llmgw/proto";
import { TENANT_CACHE_ISOLATION } from "@llmgw/router";
import { UsageError } from "./command.js";

/*
 * The flags `llmgw tenants` and `llmgw keys create` share: limits, token budgets and priority
 * classes, parsed into the wire's shapes. Checked here only as far as the flag's spelling goes;
 * the control plane checks the values (and says which) either way.
 */

/** A rate or concurrency limit: 1–2³²−1, or undefined when the flag is absent. */
export function parseLimitFlag(value: string | undefined, flag: string): number | undefined {
  if (value === undefined) return undefined;
  if (!/^\d+$/.test(value) || Number(value) < 1 || Number(value) > 4_294_967_295) {
    throw new UsageError(`${flag} must be a whole number in 1–4294967295, got "${value}"`);
  }
  return Number(value);
}

/** A tenant weight: 1–1000, or undefined when the flag is absent. */
export function parseWeightFlag(value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  if (!/^\d+$/.test(value) || Number(value) < 1 || Number(value) > 1000) {
    throw new UsageError(`--weight must be a whole number in 1–1000, got "${value}"`);
  }
  return Number(value);
}

const PERIODS: Readonly<Record<string, BudgetPeriod>> = {
  day: BudgetPeriod.DAY,
  month: BudgetPeriod.MONTH,
};

/**
 * `--budget PERIOD[:MODEL]=TOKENS`, e.g. `day=1000000` (every model together) or
 * `month:llama-3-8b=50000000`. The model may hold ':' and '=' but the last '=' ends it.
 */
export function parseBudgetFlag(value: string): Pick<TokenBudget, "period" | "model" | "tokens"> {
  const eq = value.lastIndexOf("=");
  const head = eq < 0 ? value : value.slice(0, eq);
  const tokens = eq < 0 ? "" : value.slice(eq + 1);
  const colon = head.indexOf(":");
  const periodName = (colon < 0 ? head : head.slice(0, colon)).toLowerCase();
  const model = colon < 0 ? "" : head.slice(colon + 1);
  const period = PERIODS[periodName];
  const bad = (why: string): never => {
    throw new UsageError(
      `--budget must look like day=TOKENS or month:MODEL=TOKENS (${why}), got "${value}"`,
    );
  };
  if (period === undefined) bad(`the period is day or month`);
  if (colon >= 0 && model === "") bad("a ':' must be followed by a model name");
  if (!/^\d{1,16}$/.test(tokens) || BigInt(tokens) < 1n || BigInt(tokens) > 2n ** 53n - 1n)
    bad("TOKENS is a whole number in 1–9007199254740991");
  return { period: period as BudgetPeriod, model, tokens: BigInt(tokens) };
}

/** Every `--budget` flag, in order. */
export const parseBudgetFlags = (values: readonly string[] | undefined) =>
  (values ?? []).map(parseBudgetFlag);

const CLASSES: Readonly<Record<string, PriorityClass>> = {
  critical: PriorityClass.CRITICAL,
  standard: PriorityClass.STANDARD,
  batch: PriorityClass.BATCH,
};

/** `--priority critical|standard|batch`; absent: unspecified (inherited). */
export function parsePriorityFlag(value: string | undefined): PriorityClass {
  if (value === undefined) return PriorityClass.UNSPECIFIED;
  const p = CLASSES[value.toLowerCase()];
  if (p === undefined)
    throw new UsageError(`--priority must be critical, standard or batch, got "${value}"`);
  return p;
}

/** `--cache-isolation tenant|key`; absent: "" (each router's own `--cache-isolation`). */
export function parseTenantCacheIsolationFlag(value: string | undefined): string {
  if (value === undefined) return "";
  if (!(TENANT_CACHE_ISOLATION as readonly string[]).includes(value))
    throw new UsageError(
      `--cache-isolation must be ${TENANT_CACHE_ISOLATION.join(" or ")}, got "${value.slice(0, 40)}"`,
    );
  return value;
}

/** A budget as the flags spell it: `day=1000000`, `month:llama-3-8b=50000000`. */
export function formatBudget(b: Pick<TokenBudget, "period" | "model" | "tokens">): string {
  const period = b.period === BudgetPeriod.MONTH ? "month" : "day";
  return `${period}${b.model === "" ? "" : `:${b.model}`}=${b.tokens}`;
}

/** A priority class for a table: its name, or `fallback` when unspecified. */
export function formatPriority(p: PriorityClass, fallback = "-"): string {
  switch (p) {
    case PriorityClass.CRITICAL:
      return "critical";
    case PriorityClass.STANDARD:
      return "standard";
    case PriorityClass.BATCH:
      return "batch";
    default:
      return fallback;
  }
}

/** The tenant fields the `tenants create` and `tenants update` flags give, parsed. */
export function tenantFromFlags(
  name: string,
  values: {
    readonly rpm?: string;
    readonly tpm?: string;
    readonly "max-concurrency"?: string;
    readonly budget?: string[];
    readonly priority?: string;
    readonly weight?: string;
    readonly "cache-isolation"?: string;
  },
) {
  return {
    name,
    requestsPerMinute: parseLimitFlag(values.rpm, "--rpm"),
    tokensPerMinute: parseLimitFlag(values.tpm, "--tpm"),
    maxConcurrency: parseLimitFlag(values["max-concurrency"], "--max-concurrency"),
    budgets: parseBudgetFlags(values.budget),
    priority: parsePriorityFlag(values.priority),
    weight: parseWeightFlag(values.weight) ?? 0,
    cacheIsolation: parseTenantCacheIsolationFlag(values["cache-isolation"]),
  };
}
