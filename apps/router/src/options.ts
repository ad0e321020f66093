/** Options of the router's HTTP layer; resolved and validated once. */
import {
  type AdmissionOptions,
  CACHE_ISOLATION_MODES,
  type CacheIsolation,
  type Clock,
  type ReplicaPickerOptions,
  type RequestAnalyzerOptions,
} from "@llmgw/router";
import { RouterServiceError } from "./errors.js";
import { optionInt } from "./option-int.js";

/** User-facing router options (all optional). */
export interface RouterServiceOptions {
  /** Serve without API keys (the control plane's explicit `--no-auth`). Default false. */
  readonly noAuth?: boolean;
  /** Largest request body in bytes; larger answers 413. Default 8 MiB. */
  readonly maxBodyBytes?: number;
  /**
   * After a 413, how long the rest of the body is drained before the connection closes, ms
   * (closing on unread bytes resets it, and a reset can lose the 413). Default 5 000.
   */
  readonly tooLargeDrainMs?: number;
  /** After a 413, most bytes drained before the connection closes. Default 64 MiB. */
  readonly tooLargeDrainBytes?: number;
  /** Per-deployment admission queue length. Default 256. */
  readonly maxQueueLength?: number;
  /** Longest admission wait in ms. Default 30 000. */
  readonly queueTimeoutMs?: number;
  /**
   * How far `critical` requests may go past a deployment's capacity, as a fraction of it.
   * Default 1 (as much again); 0 turns it off (see `AdmissionOptions.criticalHeadroom`).
   */
  readonly criticalHeadroom?: number;
  /**
   * Replicas kept free of the other classes' prefills while critical requests arrive. Default
   * a quarter of each deployment's replicas, at least 1; 0 turns it off (see
   * `AdmissionOptions.criticalPrefillReserve`).
   */
  readonly criticalPrefillReserve?: number;
  /** Upstream TCP connect timeout in ms. Default 5 000. */
  readonly upstreamConnectTimeoutMs?: number;
  /** Upstream time to response headers in ms. Default 300 000 (long prefills). */
  readonly upstreamHeadersTimeoutMs?: number;
  /** Upstream idle time between body chunks in ms. Default 300 000. */
  readonly upstreamBodyTimeoutMs?: number;
  /**
   * How long a client may read nothing of its answer while the router has bytes for it, ms;
   * then the connection is closed and the request ends as the client's leaving (the engine's
   * request is aborted and its slot freed). Default 60 000.
   */
  readonly clientStallTimeoutMs?: number;
  /** Max connections per replica pool. Default 256. */
  readonly upstreamConnections?: number;
  /**
   * A request header whose value is an affinity hint (e.g. `x-session-id`): requests with the
   * same value go to the same replica while it has room. A body's `prompt_cache_key` wins over
   * it; it wins over `safety_identifier` and `user`. Default: none.
   */
  readonly sessionHeader?: string;
  /**
   * Whose requests share an engine's prefix cache (`CacheIsolation`): with `tenant` or `key`
   * the router salts every chat, completion and embedding request for its principal, so that
   * no one can learn from cache hits what another tenant (key) sent. Needs API keys. Default
   * `none`.
   */
  readonly cacheIsolation?: CacheIsolation;
  readonly analyzer?: RequestAnalyzerOptions;
  readonly picker?: ReplicaPickerOptions;
  readonly clock?: Clock;
}

/** {@link RouterServiceOptions} with defaults applied. */
export interface ResolvedRouterServiceOptions {
  readonly noAuth: boolean;
  readonly maxBodyBytes: number;
  readonly tooLargeDrainMs: number;
  readonly tooLargeDrainBytes: number;
  readonly admission: AdmissionOptions;
  readonly upstreamConnectTimeoutMs: number;
  readonly upstreamHeadersTimeoutMs: number;
  readonly upstreamBodyTimeoutMs: number;
  readonly clientStallTimeoutMs: number;
  readonly upstreamConnections: number;
  /** Lower-case header name, or undefined. */
  readonly sessionHeader: string | undefined;
  readonly cacheIsolation: CacheIsolation;
  readonly analyzer: RequestAnalyzerOptions;
  readonly picker: ReplicaPickerOptions;
  readonly clock: Clock | undefined;
}

/**
 * Bounds of each integer option, inclusive: the resolver checks them, and `llmgw router`'s
 * flags (config.ts) check the same ones, naming the flag.
 */
export const ROUTER_OPTION_LIMITS = {
  maxBodyBytes: { min: 1, max: 2 ** 31 - 1 },
  tooLargeDrainMs: { min: 0, max: 600_000 },
  tooLargeDrainBytes: { min: 0, max: 2 ** 40 },
  maxQueueLength: { min: 0, max: 1_000_000 },
  queueTimeoutMs: { min: 1, max: 3_600_000 },
  /** `--critical-headroom`, in percent of the capacity. */
  criticalHeadroomPercent: { min: 0, max: 400 },
  criticalPrefillReserve: { min: 0, max: 64 },
  upstreamConnectTimeoutMs: { min: 1, max: 600_000 },
  upstreamHeadersTimeoutMs: { min: 1, max: 3_600_000 },
  upstreamBodyTimeoutMs: { min: 1, max: 3_600_000 },
  clientStallTimeoutMs: { min: 1, max: 3_600_000 },
  upstreamConnections: { min: 1, max: 65_536 },
} as const;

const int = (name: keyof typeof ROUTER_OPTION_LIMITS, value: number): number =>
  optionInt("router", name, value, ROUTER_OPTION_LIMITS[name].min, ROUTER_OPTION_LIMITS[name].max);

/** Applies defaults; throws `LLMGW_ROUTER_CONFIG_INVALID` naming the bad option. */
export function resolveRouterServiceOptions(
  options: RouterServiceOptions = {},
): ResolvedRouterServiceOptions {
  const clock = options.clock;
  return {
    noAuth: options.noAuth ?? false,
    maxBodyBytes: int("maxBodyBytes", options.maxBodyBytes ?? 8 * 1024 * 1024),
    tooLargeDrainMs: int("tooLargeDrainMs", options.tooLargeDrainMs ?? 5_000),
    tooLargeDrainBytes: int("tooLargeDrainBytes", options.tooLargeDrainBytes ?? 64 * 1024 * 1024),
    admission: {
      maxQueueLength: int("maxQueueLength", options.maxQueueLength ?? 256),
      queueTimeoutMs: int("queueTimeoutMs", options.queueTimeoutMs ?? 30_000),
      criticalHeadroom: options.criticalHeadroom ?? 1,
      ...(options.criticalPrefillReserve === undefined
        ? {}
        : {
            criticalPrefillReserve: int("criticalPrefillReserve", options.criticalPrefillReserve),
          }),
      ...(clock === undefined ? {} : { clock }),
    },
    upstreamConnectTimeoutMs: int(
      "upstreamConnectTimeoutMs",
      options.upstreamConnectTimeoutMs ?? 5000,
    ),
    upstreamHeadersTimeoutMs: int(
      "upstreamHeadersTimeoutMs",
      options.upstreamHeadersTimeoutMs ?? 300_000,
    ),
    upstreamBodyTimeoutMs: int("upstreamBodyTimeoutMs", options.upstreamBodyTimeoutMs ?? 300_000),
    clientStallTimeoutMs: int("clientStallTimeoutMs", options.clientStallTimeoutMs ?? 60_000),
    upstreamConnections: int("upstreamConnections", options.upstreamConnections ?? 256),
    sessionHeader: sessionHeader(options.sessionHeader),
    cacheIsolation: cacheIsolation(options),
    analyzer: options.analyzer ?? {},
    picker:
      clock === undefined || options.picker?.health?.clock !== undefined
        ? (options.picker ?? {})
        : { ...options.picker, health: { ...options.picker?.health, clock } },
    clock,
  };
}

function cacheIsolation(options: RouterServiceOptions): CacheIsolation {
  const mode = options.cacheIsolation ?? "none";
  if (!CACHE_ISOLATION_MODES.includes(mode)) {
    throw new RouterServiceError(
      "LLMGW_ROUTER_CONFIG_INVALID",
      `invalid router option cacheIsolation: must be one of ${CACHE_ISOLATION_MODES.join(", ")}, got ${JSON.stringify(String(mode).slice(0, 80))}`,
    );
  }
  if (mode !== "none" && options.noAuth === true) {
    throw new RouterServiceError(
      "LLMGW_ROUTER_CONFIG_INVALID",
      `invalid router option cacheIsolation: ${mode} needs API keys (noAuth is set)`,
    );
  }
  return mode;
}

/** An HTTP header name (RFC 9110 token), at most 64 characters. */
export const SESSION_HEADER_PATTERN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}$/;

function sessionHeader(name: string | undefined): string | undefined {
  if (name === undefined) return undefined;
  if (!SESSION_HEADER_PATTERN.test(name)) {
    throw new RouterServiceError(
      "LLMGW_ROUTER_CONFIG_INVALID",
      `invalid router option sessionHeader: must be an HTTP header name of 1–64 characters, got ${JSON.stringify(name.slice(0, 80))}`,
    );
  }
  return name.toLowerCase();
}
