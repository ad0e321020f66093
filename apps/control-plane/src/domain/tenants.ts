import { ROUTING_LIMITS, TENANT_CACHE_ISOLATION, type TenantGrant } from "@llmgw/router";
import { ControlPlaneError } from "../errors.js";
import type {
  ClusterStore,
  PriorityClassName,
  TenantCacheIsolationName,
  TenantRecord,
  TokenBudgetRecord,
} from "../store/types.js";
import type { EventLog } from "./event-log.js";

/** Tenant names: lower-case letters, digits and '-', 1–63 characters (a DNS label's size). */
export const TENANT_NAME = /^[a-z0-9-]{1,63}$/;

/** Token budgets one tenant or key may have (`ROUTING_LIMITS.maxBudgets`). */
export const MAX_BUDGETS = ROUTING_LIMITS.maxBudgets;

/** Largest budget, in tokens: what a number holds exactly (2⁵³−1). */
export const MAX_BUDGET_TOKENS = Number.MAX_SAFE_INTEGER;

const PRIORITY_CLASSES: readonly PriorityClassName[] = ["critical", "standard", "batch"];

/**
 * A budget as a caller gives it: `period` may be missing or anything (it is checked), and
 * `tokens` may be past what a number holds exactly (a wire uint64, converted).
 */
export interface TokenBudgetInput {
  readonly period?: string;
  /** Absent or empty: every model together. */
  readonly model?: string;
  readonly tokens: number;
}

/** A tenant's settable fields as a caller gives them, checked by {@link Tenants}. */
export interface TenantInput {
  readonly requestsPerMinute?: number;
  readonly tokensPerMinute?: number;
  readonly maxConcurrency?: number;
  readonly budgets?: readonly TokenBudgetInput[];
  readonly priority?: string;
  /** Absent or 0: 1. */
  readonly weight?: number;
  /** "tenant" or "key"; absent or "": as each router's own `--cache-isolation` says. */
  readonly cacheIsolation?: string;
}

/** Fields {@link Tenants.update} may change, by their `llmgw.v1.Tenant` names. */
export const TENANT_FIELDS = [
  "requests_per_minute",
  "tokens_per_minute",
  "max_concurrency",
  "budgets",
  "priority",
  "weight",
  "cache_isolation",
] as const;
export type TenantField = (typeof TENANT_FIELDS)[number];

const INPUT_OF: Readonly<Record<TenantField, keyof TenantInput>> = {
  requests_per_minute: "requestsPerMinute",
  tokens_per_minute: "tokensPerMinute",
  max_concurrency: "maxConcurrency",
  budgets: "budgets",
  priority: "priority",
  weight: "weight",
  cache_isolation: "cacheIsolation",
};

/** A value in a message: short, never a whole document. */
const shown = (v: unknown): string => {
  const text = typeof v === "string" ? JSON.stringify(v) : String(v);
  return text.length > 66 ? `${text.slice(0, 64)}… (${text.length} characters)` : text;
};

/**
 * Checks a tenant name. `LLMGW_CONTROL_PLANE_TENANT_NAME_INVALID` unless it is 1–63 lower-case
 * letters, digits or '-'.
 */
export function validateTenantName(name: string): string {
  if (!TENANT_NAME.test(name))
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_TENANT_NAME_INVALID",
      `tenant name must be 1–63 lower-case letters, digits or '-' (got ${shown(name)})`,
    );
  return name;
}

/**
 * Checks a priority class name; undefined (inherit) passes.
 * `LLMGW_CONTROL_PLANE_PRIORITY_INVALID` for any other name.
 */
export function validatePriority(
  priority: string | undefined,
  owner: string,
): PriorityClassName | undefined {
  if (priority === undefined) return undefined;
  const known = PRIORITY_CLASSES.find((p) => p === priority);
  if (known === undefined)
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_PRIORITY_INVALID",
      `${owner} priority must be one of ${PRIORITY_CLASSES.join(", ")} or unset (got ${shown(priority)})`,
    );
  return known;
}

/**
 * Checks token budgets: at most {@link MAX_BUDGETS} (`…_BUDGET_TOO_MANY`), each with a period
 * of day or month, 1–2⁵³−1 tokens and a model name of at most 256 characters
 * (`…_BUDGET_INVALID`, naming the budget), no two for the same period and model
 * (`…_BUDGET_DUPLICATE`). `owner` starts the messages ("tenant search", "API key app").
 */
export function validateBudgets(
  budgets: readonly TokenBudgetInput[],
  owner: string,
): TokenBudgetRecord[] {
  if (budgets.length > MAX_BUDGETS)
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_BUDGET_TOO_MANY",
      `${owner} may have at most ${MAX_BUDGETS} budgets (got ${budgets.length})`,
    );
  const seen = new Set<string>();
  return budgets.map((b, i) => {
    const bad = (rule: string): never => {
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_BUDGET_INVALID",
        `${owner} budgets[${i}]: ${rule}`,
      );
    };
    if (b.period !== "day" && b.period !== "month")
      bad(`period must be day or month (got ${b.period === undefined ? "none" : shown(b.period)})`);
    if (!Number.isSafeInteger(b.tokens) || b.tokens < 1)
      bad(`tokens must be a whole number in 1–${MAX_BUDGET_TOKENS} (got ${b.tokens})`);
    const model = b.model ?? "";
    if (model.length > ROUTING_LIMITS.maxNameChars)
      bad(
        `model must be a served model name of at most ${ROUTING_LIMITS.maxNameChars} characters (got ${shown(model)})`,
      );
    const period = b.period as TokenBudgetRecord["period"];
    const key = `${period} ${model}`;
    if (seen.has(key))
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_BUDGET_DUPLICATE",
        `${owner} has two ${period} budgets for ${model === "" ? "all models" : `model ${shown(model)}`}; keep one`,
      );
    seen.add(key);
    return { period, ...(model === "" ? {} : { model }), tokens: b.tokens };
  });
}

/** Checks a rate or concurrency limit: 1–2³²−1, or unset for none. */
function validateLimit(v: number | undefined, field: string, owner: string): number | undefined {
  if (v === undefined) return undefined;
  if (!Number.isInteger(v) || v < 1 || v > ROUTING_LIMITS.maxKeyLimit)
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_TENANT_LIMIT_INVALID",
      `${owner} ${field} must be a whole number in 1–${ROUTING_LIMITS.maxKeyLimit}, or unset for no limit (got ${v})`,
    );
  return v;
}

/** Checks a weight: 1–1000; absent or 0 reads as 1. */
function validateWeight(v: number | undefined, owner: string): number {
  if (v === undefined || v === 0) return 1;
  if (!Number.isInteger(v) || v < 1 || v > ROUTING_LIMITS.maxTenantWeight)
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_TENANT_WEIGHT_INVALID",
      `${owner} weight must be a whole number in 1–${ROUTING_LIMITS.maxTenantWeight} (0 reads as 1; got ${v})`,
    );
  return v;
}

/**
 * Checks a tenant's cache isolation: "tenant", "key", or absent or "" for none asked.
 * `LLMGW_CONTROL_PLANE_TENANT_CACHE_ISOLATION_INVALID` for any other word.
 */
function validateCacheIsolation(
  v: string | undefined,
  owner: string,
): TenantCacheIsolationName | undefined {
  if (v === undefined || v === "") return undefined;
  const known = TENANT_CACHE_ISOLATION.find((m) => m === v);
  if (known === undefined)
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_TENANT_CACHE_ISOLATION_INVALID",
      `${owner} cache_isolation must be one of ${TENANT_CACHE_ISOLATION.join(", ")}, or empty for each router's own --cache-isolation (got ${shown(v)})`,
    );
  return known;
}

/** The checked settable fields of a tenant (what a record holds but its name and times). */
function validateTenantInput(
  input: TenantInput,
  owner: string,
): Omit<TenantRecord, "name" | "createdAtMs" | "updatedAtMs"> {
  const priority = validatePriority(input.priority, owner);
  const requestsPerMinute = validateLimit(input.requestsPerMinute, "requests_per_minute", owner);
  const tokensPerMinute = validateLimit(input.tokensPerMinute, "tokens_per_minute", owner);
  const maxConcurrency = validateLimit(input.maxConcurrency, "max_concurrency", owner);
  const cacheIsolation = validateCacheIsolation(input.cacheIsolation, owner);
  return {
    ...(requestsPerMinute === undefined ? {} : { requestsPerMinute }),
    ...(tokensPerMinute === undefined ? {} : { tokensPerMinute }),
    ...(maxConcurrency === undefined ? {} : { maxConcurrency }),
    budgets: validateBudgets(input.budgets ?? [], owner),
    ...(priority === undefined ? {} : { priority }),
    weight: validateWeight(input.weight, owner),
    ...(cacheIsolation === undefined ? {} : { cacheIsolation }),
  };
}

export interface TenantsOptions {
  readonly store: ClusterStore;
  readonly clock: { now(): number };
  readonly events: EventLog;
  /** Non-revoked keys of a tenant: a tenant that has any is not deleted. */
  readonly activeKeys: (tenant: string) => number;
  /** Called after each change every router must hear of. */
  readonly onChange: () => void;
}

/**
 * The cluster's tenants: teams that own API keys, whose limits, budgets, priority and weight
 * bound all their keys together. Plain records; the RPC edge converts them.
 */
export class Tenants {
  readonly #o: TenantsOptions;
  readonly #byName = new Map<string, TenantRecord>();
  /**
   * The latest creation time handed out. Creation times never repeat: routers scope a
   * tenant's prefix cache by name and creation time, so a tenant deleted and created again
   * within one clock tick (a script) must still be another tenant.
   */
  #lastCreatedAtMs = 0;

  constructor(options: TenantsOptions) {
    this.#o = options;
    for (const t of options.store.listTenants()) {
      this.#byName.set(t.name, t);
      this.#lastCreatedAtMs = Math.max(this.#lastCreatedAtMs, t.createdAtMs);
    }
  }

  /**
   * Creates a tenant. Refused with the code of the first bad field (see
   * {@link validateTenantName}, {@link validateBudgets}, {@link validatePriority}; limits
   * outside 1–2³²−1 `…_TENANT_LIMIT_INVALID`, a weight outside 1–1000
   * `…_TENANT_WEIGHT_INVALID`, a cache isolation other than tenant or key
   * `…_TENANT_CACHE_ISOLATION_INVALID`), `LLMGW_CONTROL_PLANE_ALREADY_EXISTS` when the name is taken,
   * and beyond `ROUTING_LIMITS.maxTenants` tenants (`…_INVALID_ARGUMENT`).
   */
  create(name: string, input: TenantInput): TenantRecord {
    validateTenantName(name);
    const fields = validateTenantInput(input, `tenant ${name}`);
    if (this.#byName.has(name))
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_ALREADY_EXISTS",
        `a tenant named ${name} already exists`,
      );
    if (this.#byName.size >= ROUTING_LIMITS.maxTenants)
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
        `${this.#byName.size} tenants exist, the most routers hold (${ROUTING_LIMITS.maxTenants}); delete one first`,
      );
    const now = Math.max(this.#o.clock.now(), this.#lastCreatedAtMs + 1);
    this.#lastCreatedAtMs = now;
    const record: TenantRecord = { name, ...fields, createdAtMs: now, updatedAtMs: now };
    this.#o.store.putTenant(record);
    this.#byName.set(name, record);
    this.#o.events.record("tenant.created", name, `tenant ${name} created`, "info");
    this.#o.onChange();
    return record;
  }

  /** Tenants by name. */
  list(): TenantRecord[] {
    return [...this.#byName.values()].sort((a, b) =>
      a.name < b.name ? -1 : a.name > b.name ? 1 : 0,
    );
  }

  /** The tenant named `name`, or undefined. */
  get(name: string): TenantRecord | undefined {
    return this.#byName.get(name);
  }

  /**
   * Sets the fields named in `fields` (`llmgw.v1.Tenant` names, e.g. "tokens_per_minute") to
   * their values in `input`; a named field absent from `input` is cleared (a limit to none,
   * budgets to none, priority to inherited, weight to 1, cache isolation to none asked). Unnamed fields keep their values.
   * `LLMGW_CONTROL_PLANE_TENANT_FIELD_UNKNOWN` names a field that cannot be changed,
   * `…_NOT_FOUND` when there is no such tenant, and the same checks as {@link create}. No
   * fields: the tenant as it is, nothing written. With `ifUpdatedAtMs`, only a tenant last
   * changed then (as its reader saw it): `…_TENANT_CHANGED` otherwise.
   */
  update(
    name: string,
    input: TenantInput,
    fields: readonly string[],
    ifUpdatedAtMs?: number,
  ): TenantRecord {
    for (const f of fields) {
      if (!(TENANT_FIELDS as readonly string[]).includes(f))
        throw new ControlPlaneError(
          "LLMGW_CONTROL_PLANE_TENANT_FIELD_UNKNOWN",
          `UpdateTenantRequest.fields: ${shown(f)} is not a field that can be changed; use ${TENANT_FIELDS.join(", ")}`,
        );
    }
    const before = this.#require(name);
    if (ifUpdatedAtMs !== undefined && before.updatedAtMs !== ifUpdatedAtMs)
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_TENANT_CHANGED",
        `tenant ${name} changed since it was read (last changed ${new Date(before.updatedAtMs).toISOString()}, not ${new Date(ifUpdatedAtMs).toISOString()}); read it again`,
      );
    if (fields.length === 0) return before;
    const merged: Record<string, unknown> = {
      requestsPerMinute: before.requestsPerMinute,
      tokensPerMinute: before.tokensPerMinute,
      maxConcurrency: before.maxConcurrency,
      budgets: before.budgets,
      priority: before.priority,
      weight: before.weight,
      cacheIsolation: before.cacheIsolation,
    };
    for (const f of fields as readonly TenantField[]) merged[INPUT_OF[f]] = input[INPUT_OF[f]];
    const record: TenantRecord = {
      name,
      ...validateTenantInput(merged as TenantInput, `tenant ${name}`),
      createdAtMs: before.createdAtMs,
      // Later than the last change, whatever the clock: a change is told by this time.
      updatedAtMs: Math.max(this.#o.clock.now(), before.updatedAtMs + 1),
    };
    this.#o.store.putTenant(record);
    this.#byName.set(name, record);
    const changed = [...new Set(fields)].join(", ");
    this.#o.events.record("tenant.updated", name, `tenant ${name} updated (${changed})`, "info");
    this.#o.onChange();
    return record;
  }

  /**
   * Deletes a tenant. `LLMGW_CONTROL_PLANE_TENANT_HAS_KEYS` while it has keys that are not
   * revoked (a key's tenant must exist for routers to apply its limits), `…_NOT_FOUND` when
   * there is no such tenant. Revoked keys keep the name, for their history.
   */
  delete(name: string): void {
    this.#require(name);
    const keys = this.#o.activeKeys(name);
    if (keys > 0)
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_TENANT_HAS_KEYS",
        `tenant ${name} has ${keys} active API key${keys === 1 ? "" : "s"}; revoke ${keys === 1 ? "it" : "them"} first (llmgw keys list, llmgw keys revoke)`,
      );
    this.#o.store.deleteTenant(name);
    this.#byName.delete(name);
    this.#o.events.record("tenant.deleted", name, `tenant ${name} deleted`, "info");
    this.#o.onChange();
  }

  /** The tenants as routers enforce them, by name. */
  grants(): TenantGrant[] {
    return this.list().map((t) => ({
      name: t.name,
      ...(t.requestsPerMinute === undefined ? {} : { rpm: t.requestsPerMinute }),
      ...(t.tokensPerMinute === undefined ? {} : { tpm: t.tokensPerMinute }),
      ...(t.maxConcurrency === undefined ? {} : { maxConcurrency: t.maxConcurrency }),
      ...(t.budgets.length === 0 ? {} : { budgets: t.budgets.map((b) => ({ ...b })) }),
      ...(t.priority === undefined ? {} : { priority: t.priority }),
      weight: t.weight,
      createdAtMs: t.createdAtMs,
      ...(t.cacheIsolation === undefined ? {} : { cacheIsolation: t.cacheIsolation }),
    }));
  }

  #require(name: string): TenantRecord {
    const t = this.#byName.get(name);
    if (t === undefined)
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_NOT_FOUND",
        `no tenant named ${shown(name)}${this.#byName.size > 0 ? `; known: ${[...this.#byName.keys()].sort().slice(0, 20).join(", ")}` : ""}`,
      );
    return t;
  }
}
