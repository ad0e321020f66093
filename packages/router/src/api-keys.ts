/** API keys as the router sees them: a verified identity plus its optional limits. */
import type { TenantCacheIsolation } from "./cache-isolation.js";
import type { PriorityClass, TokenBudget } from "./routing-messages.js";

/**
 * A tenant (team) as the router enforces it: its limits bound all its keys together. Rates and
 * concurrency are this router's share; budgets are cluster-wide (see `Limiter.applyStandings`).
 * Absent limits mean "no limit".
 */
export interface TenantInfo {
  readonly name: string;
  readonly rpm?: number;
  readonly tpm?: number;
  readonly maxConcurrency?: number;
  /** Absent or empty: none. */
  readonly budgets?: readonly TokenBudget[];
  /** Share of its priority class under contention, relative to other tenants' (1–1000). */
  readonly weight: number;
  /** When it was created (ms), which tells it from a deleted tenant of its name; absent: not told. */
  readonly createdAtMs?: number;
  /** The least isolation of its prefix caches (see `TenantGrant.cacheIsolation`); absent: none. */
  readonly cacheIsolation?: TenantCacheIsolation;
  /**
   * True for a stand-in: a key names this tenant, but the routing state holds no grant for it
   * (yet). Which tenant it is cannot be told, so cache isolation keeps such keys alone.
   */
  readonly ungranted?: true;
}

/** A verified API key. Absent limits mean "no limit". */
export interface ApiKeyInfo {
  /** Stable key id (never the secret); fairness and rate-limit state are keyed by it. */
  readonly id: string;
  readonly name: string;
  /** Served model names this key may use; absent = all. */
  readonly models?: readonly string[];
  /** Requests per minute. */
  readonly rpm?: number;
  /**
   * Tokens (prompt + completion) per minute: the estimate is reserved at admission, then
   * settled to the engine's reported usage.
   */
  readonly tpm?: number;
  /** Requests in flight at once. */
  readonly maxConcurrency?: number;
  /** The owning tenant, whose limits must have room too; absent: none. */
  readonly tenant?: TenantInfo;
  /** Token budgets of the key itself (cluster-wide); absent or empty: none. */
  readonly budgets?: readonly TokenBudget[];
  /** The class its requests queue in, already resolved (key's, else tenant's); absent: standard. */
  readonly priority?: PriorityClass;
}

/**
 * Verifies bearer secrets. Synchronous on purpose: the hot path reads local state only (the
 * control plane keeps hashed keys in memory and hashes the presented secret).
 */
export interface ApiKeyStore {
  /** The key's identity and limits, or `undefined` for an unknown or revoked secret. */
  verify(secret: string): ApiKeyInfo | undefined;
}

/** An {@link ApiKeyStore} over a plain secret → key map; for tests, benchmarks and the demo. */
export interface InMemoryApiKeyStore extends ApiKeyStore {
  /** Adds or replaces a key. */
  add(secret: string, info: ApiKeyInfo): void;
  /** Removes the key with this secret; true when it existed. */
  revoke(secret: string): boolean;
}

/** Creates an {@link InMemoryApiKeyStore} seeded with `keys` (secret → info). */
export function createInMemoryApiKeyStore(
  keys: Readonly<Record<string, ApiKeyInfo>> = {},
): InMemoryApiKeyStore {
  const map = new Map<string, ApiKeyInfo>(Object.entries(keys));
  return {
    verify: (secret) => map.get(secret),
    add: (secret, info) => {
      map.set(secret, info);
    },
    revoke: (secret) => map.delete(secret),
  };
}
