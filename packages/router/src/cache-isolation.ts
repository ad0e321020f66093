/**
 * Prefix-cache isolation between API principals. An engine's prefix cache is shared by every
 * request it serves, and a shared cache answers a question across tenants: a prompt served
 * fast, or with `usage.prompt_tokens_details.cached_tokens` > 0, is one that someone else sent
 * recently. vLLM and SGLang key their cache with a request's `cache_salt`; with isolation on,
 * the router sets that salt itself, from who is asking, so that the cache is shared only within
 * a tenant (or a key) and a client cannot choose another principal's salt.
 *
 * The salt is a hash of the principal and of the client's own salt: a client keeps its own
 * isolation inside its principal's, and two principals never meet. It needs no secret: every
 * request of an isolated router is salted this way, and a SHA-256 preimage of another
 * principal's salt is out of reach. Its fixed length also keeps SGLang's concatenation of
 * `cache_salt` and `extra_key` from colliding across principals.
 */
import { createHash } from "node:crypto";
import type { ApiKeyInfo } from "./api-keys.js";

/**
 * Whose requests share an engine's prefix cache: `none` (everyone, the engines' default),
 * `tenant` (a tenant's keys together; a key without a tenant alone), `key` (each key alone).
 */
export type CacheIsolation = "none" | "tenant" | "key";

export const CACHE_ISOLATION_MODES: readonly CacheIsolation[] = ["none", "tenant", "key"];

/**
 * The least isolation a tenant asks of every router for its requests (`TenantGrant`): a router
 * whose own mode is less strict applies this one to them.
 */
export type TenantCacheIsolation = Exclude<CacheIsolation, "none">;

export const TENANT_CACHE_ISOLATION: readonly TenantCacheIsolation[] = ["tenant", "key"];

/**
 * How much a mode word keeps apart, for comparing two: `none` (or "", not said) 0, `tenant` 1,
 * `key` 2; a word this release does not know (a later one's) counts as stricter than any.
 */
export function cacheIsolationStrictness(mode: string): number {
  const i = CACHE_ISOLATION_MODES.indexOf((mode === "" ? "none" : mode) as CacheIsolation);
  return i < 0 ? CACHE_ISOLATION_MODES.length : i;
}

/**
 * How an engine can keep a request's prefix cache apart: `salt` (it honours `cache_salt`:
 * vLLM, SGLang, the simulator), `no-reuse` (it can only skip reuse for the request:
 * llama.cpp's `cache_prompt: false`).
 */
export type EngineCacheIsolation = "salt" | "no-reuse";

export const ENGINE_CACHE_ISOLATION: readonly EngineCacheIsolation[] = ["salt", "no-reuse"];

/** Prefix of every salt the router sets (a hex SHA-256 follows). */
export const ISOLATED_SALT_PREFIX = "llmgw-";

/**
 * The principal a request's cache belongs to, as a string no two principals share, under the
 * stricter of the router's own mode and the one the key's tenant asks for; `undefined` when
 * both are `none`. A tenant is its name and creation time, so that a tenant created again
 * under a deleted one's name does not inherit its cache (where the control plane tells the
 * time: one before that field gives the name alone). A key whose tenant the routing state
 * does not hold is scoped alone, whatever the router's mode: which tenant it is, and so
 * whether that tenant asks for isolation, cannot be told.
 */
export function isolationScope(routerMode: CacheIsolation, key: ApiKeyInfo): string | undefined {
  const tenant = key.tenant;
  if (tenant?.ungranted === true) return `key\0${key.id}`;
  // A word not among the modes is stricter than any, and scopes by key below.
  const asked = tenant?.cacheIsolation ?? "none";
  const mode =
    cacheIsolationStrictness(asked) > cacheIsolationStrictness(routerMode) ? asked : routerMode;
  if (mode === "none") return undefined;
  if (mode === "tenant" && tenant !== undefined) {
    return tenant.createdAtMs === undefined
      ? `tenant\0${tenant.name}`
      : `tenant\0${tenant.name}\0${tenant.createdAtMs}`;
  }
  return `key\0${key.id}`;
}

/**
 * The `cache_salt` the router sends for a request of `scope` that gave `clientSalt` (absent:
 * none): 70 ASCII characters, never one a client of another scope can produce.
 */
export function isolatedSalt(scope: string, clientSalt: string | undefined): string {
  const hash = createHash("sha256");
  // Length-prefixed: no choice of client salt moves the boundary after the scope.
  hash.update(`${scope.length}:${scope}`);
  hash.update(clientSalt === undefined ? "-" : `+${clientSalt}`);
  return ISOLATED_SALT_PREFIX + hash.digest("hex");
}

/**
 * The JSON members (no braces, comma-separated) that keep a request salted with `salt` apart
 * on an engine that isolates as `engine` (absent: not known, so both ways; each engine ignores
 * the member it does not know).
 */
export function isolationMembers(salt: string, engine: EngineCacheIsolation | undefined): string {
  const salted = `"cache_salt":"${salt}"`;
  if (engine === "salt") return salted;
  if (engine === "no-reuse") return '"cache_prompt":false';
  return `${salted},"cache_prompt":false`;
}
