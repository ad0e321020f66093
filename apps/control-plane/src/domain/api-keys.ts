import { randomBytes } from "node:crypto";
import { type KeyGrant, ROUTING_LIMITS } from "@llmgw/router";
import { ControlPlaneError } from "../errors.js";
import type { ApiKeyRecord, ClusterStore } from "../store/types.js";
import type { EventLog } from "./event-log.js";
import { escapeOutsideText } from "./outside-text.js";
import { type TokenBudgetInput, validateBudgets, validatePriority } from "./tenants.js";
import { generateSecret, hashSecret } from "./tokens.js";

/** An API key as the router checks it (never the secret). */
export interface ApiKeyGrant {
  readonly id: string;
  readonly name: string;
  readonly models: readonly string[];
  readonly requestsPerMinute?: number;
  readonly tokensPerMinute?: number;
  readonly maxConcurrency?: number;
}

/** What {@link ApiKeys.create} takes: a grant's fields, and the key's tenant, budgets, priority. */
export interface ApiKeyInput extends Omit<ApiKeyGrant, "id"> {
  /** An existing tenant's name; absent or empty: none. */
  readonly tenant?: string;
  readonly budgets?: readonly TokenBudgetInput[];
  /** A priority class name; absent: the tenant's. */
  readonly priority?: string;
}

export interface ApiKeysOptions {
  readonly store: ClusterStore;
  readonly clock: { now(): number };
  readonly events: EventLog;
  readonly log?: (line: string) => void;
  /** Active keys at most; default and most `ROUTING_LIMITS.maxKeys` (every router holds every key). */
  readonly maxApiKeys?: number;
  /** Called after each change every router must hear of. */
  readonly onChange: () => void;
  /** Whether a tenant exists: a key names only an existing one. Absent: none does. */
  readonly tenantExists?: (name: string) => boolean;
}

/**
 * The cluster's API keys: only each secret's sha256 is kept (in the store and here), the
 * secret is returned once at creation. Plain records; the RPC edge converts them.
 */
export class ApiKeys {
  readonly #o: ApiKeysOptions;
  readonly #byId = new Map<string, ApiKeyRecord>();
  readonly #byHash = new Map<string, ApiKeyRecord>();
  /** Ids of stored keys left out of routing (named once in the log). */
  readonly #leftOut = new Set<string>();

  constructor(options: ApiKeysOptions) {
    this.#o = options;
    for (const k of options.store.listApiKeys()) this.#hold(k);
  }

  /**
   * Creates an API key. Refused (`LLMGW_CONTROL_PLANE_INVALID_ARGUMENT`, naming the field) is
   * a key every router would refuse in its routing stream: a limit outside [1, 2³²−1] (unset
   * is no limit), a model name outside 1–256 characters, more than `ROUTING_LIMITS.maxModels`
   * models, or a key beyond `maxApiKeys` active ones; `LLMGW_CONTROL_PLANE_ALREADY_EXISTS`
   * when an active key has the name; `…_TENANT_UNKNOWN` when `tenant` names no tenant; and
   * the budget and priority refusals of `validateBudgets` and `validatePriority`.
   */
  create(input: ApiKeyInput): { key: ApiKeyRecord; secret: string } {
    if (!/^[A-Za-z0-9._-]{1,64}$/.test(input.name)) {
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
        `API key name must be 1–64 letters, digits, '.', '_' or '-' (got ${JSON.stringify(input.name)})`,
      );
    }
    const problem = apiKeyGrantProblem(input);
    if (problem !== undefined) {
      throw new ControlPlaneError("LLMGW_CONTROL_PLANE_INVALID_ARGUMENT", `API key ${problem}`);
    }
    const owner = `API key ${input.name}`;
    const budgets = validateBudgets(input.budgets ?? [], owner);
    const priority = validatePriority(input.priority, owner);
    const tenant = input.tenant === undefined || input.tenant === "" ? undefined : input.tenant;
    if (tenant !== undefined && !(this.#o.tenantExists?.(tenant) ?? false)) {
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_TENANT_UNKNOWN",
        `${owner}: no tenant named ${JSON.stringify(tenant.slice(0, 64))}; create it first (llmgw tenants create)`,
      );
    }
    let live = 0;
    for (const k of this.#byId.values()) {
      if (k.revokedAtMs !== undefined) continue;
      live++;
      if (k.name === input.name) {
        throw new ControlPlaneError(
          "LLMGW_CONTROL_PLANE_ALREADY_EXISTS",
          `an API key named ${input.name} already exists`,
        );
      }
    }
    const maxKeys = Math.min(this.#o.maxApiKeys ?? ROUTING_LIMITS.maxKeys, ROUTING_LIMITS.maxKeys);
    if (live >= maxKeys) {
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
        `${live} API keys are active, the most this control plane holds (${maxKeys}); revoke one first`,
      );
    }
    const secret = generateSecret("sk-llmgw-");
    const record: ApiKeyRecord = {
      id: `key_${randomBytes(6).toString("hex")}`,
      name: input.name,
      prefix: secret.slice(0, 14),
      secretHash: hashSecret(secret),
      models: [...input.models],
      requestsPerMinute: input.requestsPerMinute,
      tokensPerMinute: input.tokensPerMinute,
      maxConcurrency: input.maxConcurrency,
      createdAtMs: this.#o.clock.now(),
      ...(tenant === undefined ? {} : { tenant }),
      budgets,
      ...(priority === undefined ? {} : { priority }),
    };
    this.#o.store.putApiKey(record);
    this.#hold(record);
    this.#o.events.record(
      "apikey.created",
      record.id,
      `API key ${record.name} (${record.prefix}…) created`,
      "info",
    );
    this.#o.onChange();
    return { key: record, secret };
  }

  /** API keys, oldest first. */
  list(includeRevoked = false): ApiKeyRecord[] {
    return [...this.#byId.values()].filter((k) => includeRevoked || k.revokedAtMs === undefined);
  }

  /** Keys of `tenant` that are not revoked. */
  activeKeysOf(tenant: string): number {
    let n = 0;
    for (const k of this.#byId.values())
      if (k.tenant === tenant && k.revokedAtMs === undefined) n++;
    return n;
  }

  /** Revokes a key by id or name (`LLMGW_CONTROL_PLANE_NOT_FOUND` when none); idempotent. */
  revoke(idOrName: string): ApiKeyRecord {
    const record =
      this.#byId.get(idOrName) ??
      [...this.#byId.values()].find((k) => k.name === idOrName && k.revokedAtMs === undefined);
    if (!record) {
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_NOT_FOUND",
        `no API key with id or name ${JSON.stringify(idOrName)}`,
      );
    }
    if (record.revokedAtMs !== undefined) return record;
    const revoked = { ...record, revokedAtMs: this.#o.clock.now() };
    this.#o.store.putApiKey(revoked);
    this.#hold(revoked);
    this.#o.events.record("apikey.revoked", revoked.id, `API key ${revoked.name} revoked`, "info");
    this.#o.onChange();
    return revoked;
  }

  /** The grant of a presented secret, or undefined when unknown or revoked. */
  authenticate(secret: string): ApiKeyGrant | undefined {
    const record = this.#byHash.get(hashSecret(secret));
    if (!record || record.revokedAtMs !== undefined) return undefined;
    return {
      id: record.id,
      name: record.name,
      models: record.models,
      requestsPerMinute: record.requestsPerMinute,
      tokensPerMinute: record.tokensPerMinute,
      maxConcurrency: record.maxConcurrency,
    };
  }

  /** The active keys as routers check them. */
  grants(): KeyGrant[] {
    const keys: KeyGrant[] = [];
    for (const k of this.#byId.values()) {
      if (k.revokedAtMs !== undefined) continue;
      // A key stored by an older version that checked less: routers would refuse the whole
      // stream over it, so it is left out (it authenticates nowhere) and named once.
      const problem = apiKeyGrantProblem(k);
      if (problem !== undefined) {
        if (!this.#leftOut.has(k.id)) {
          this.#leftOut.add(k.id);
          this.#o.log?.(
            escapeOutsideText(
              `API key ${k.name} (${k.id}) is left out of routing, routers would refuse it: ${problem}; revoke it and create a new one`,
            ),
          );
        }
        continue;
      }
      keys.push({
        id: k.id,
        name: k.name,
        secretSha256: k.secretHash,
        ...(k.models.length > 0 ? { models: [...k.models] } : {}),
        ...(k.requestsPerMinute === undefined ? {} : { rpm: k.requestsPerMinute }),
        ...(k.tokensPerMinute === undefined ? {} : { tpm: k.tokensPerMinute }),
        ...(k.maxConcurrency === undefined ? {} : { maxConcurrency: k.maxConcurrency }),
        ...(k.tenant === undefined ? {} : { tenant: k.tenant }),
        ...(k.budgets.length === 0 ? {} : { budgets: k.budgets.map((b) => ({ ...b })) }),
        ...(k.priority === undefined ? {} : { priority: k.priority }),
      });
    }
    return keys;
  }

  #hold(k: ApiKeyRecord): void {
    this.#byId.set(k.id, k);
    this.#byHash.set(k.secretHash, k);
  }
}

/**
 * Why routers would refuse a key with these limits and models (see `ROUTING_LIMITS` and
 * `validateRoutingMessage` in `@llmgw/router`), as "field must …, got …", or undefined.
 */
function apiKeyGrantProblem(k: {
  readonly models: readonly string[];
  readonly requestsPerMinute?: number;
  readonly tokensPerMinute?: number;
  readonly maxConcurrency?: number;
}): string | undefined {
  for (const field of ["requestsPerMinute", "tokensPerMinute", "maxConcurrency"] as const) {
    const v = k[field];
    if (v !== undefined && (!Number.isInteger(v) || v < 1 || v > ROUTING_LIMITS.maxKeyLimit))
      return `${field} must be a whole number in 1–${ROUTING_LIMITS.maxKeyLimit}, or unset for no limit (got ${v})`;
  }
  if (k.models.length > ROUTING_LIMITS.maxModels)
    return `models must list at most ${ROUTING_LIMITS.maxModels} names (got ${k.models.length})`;
  for (let i = 0; i < k.models.length; i++) {
    const m = k.models[i] as string;
    if (m.length < 1 || m.length > ROUTING_LIMITS.maxNameChars) {
      const shown =
        m.length > 64
          ? `${JSON.stringify(m.slice(0, 64))}… (${m.length} characters)`
          : JSON.stringify(m);
      return `models[${i}] must be a served model name of 1–${ROUTING_LIMITS.maxNameChars} characters (got ${shown})`;
    }
  }
  return undefined;
}
