/**
 * Per-API-key limits: requests per minute and tokens per minute as token buckets (capacity =
 * the per-minute limit, refilled continuously), plus a cap on requests in flight. A request
 * reserves its estimated tokens at admission and is settled to its real count once the answer
 * reports it, so a key pays for what the engine generated, not for what the request claimed.
 * State per key is bounded (`maxKeys`, least recently used dropped; a dropped key starts with a
 * full bucket, which errs towards admitting).
 */
import type { ApiKeyInfo } from "./api-keys.js";
import { type Clock, systemClock } from "./clock.js";
import { checkRange } from "./errors.js";

/** Which limit refused a request. */
export type KeyLimitReason = "rpm" | "tpm" | "concurrency";

/** An admitted request's hold on its key: its concurrency slot and its token reservation. */
export interface KeyLease {
  readonly ok: true;
  /** Frees the concurrency slot; idempotent. */
  release(): void;
  /**
   * Replaces the reserved token estimate with the request's real count (prompt + completion),
   * refunding or charging the difference; once per lease, later calls are ignored. A count that
   * is not a safe integer in [0, {@link MAX_SETTLED_TOKENS}] is ignored too (the estimate
   * stands): it comes from the engine's answer, which this process does not vouch for. The
   * bucket may go into debt, as deep as the request ran over its estimate: the key is held back
   * until the debt is refilled, so over time it pays its tpm for every token it used.
   */
  settle(tokens: number): void;
}

/** Outcome of {@link KeyLimiter.acquire}. */
export type KeyLimitOutcome =
  | KeyLease
  | { readonly ok: false; readonly reason: KeyLimitReason; readonly retryAfterSeconds: number }
  | {
      /**
       * The request alone reserves more than the key's whole tpm: no wait would admit it, so
       * there is no retry time either.
       */
      readonly ok: false;
      readonly reason: "tpm";
      readonly retryAfterSeconds?: undefined;
      readonly reserved: number;
      readonly tpm: number;
    };

/**
 * Largest real token count a lease accepts when settling (2^24, above any context window):
 * more is taken for a corrupt answer, not for usage.
 */
export const MAX_SETTLED_TOKENS = 2 ** 24;

/** Options of {@link createKeyLimiter}. */
export interface KeyLimiterOptions {
  /** Most keys with state kept (default 10 000). */
  readonly maxKeys?: number;
  readonly clock?: Clock;
}

/** Per-key limit state. */
export interface KeyLimiter {
  /**
   * Checks and, when allowed, consumes one request and reserves `estimatedTokens` for `key`
   * (settle the lease to the real count once known).
   */
  acquire(key: ApiKeyInfo, estimatedTokens: number): KeyLimitOutcome;
}

interface KeyState {
  requests: number;
  tokens: number;
  at: number;
  inFlight: number;
}

const MINUTE_MS = 60_000;

/** Refills `s` up to `now` at the key's per-minute rates. */
function refill(s: KeyState, key: ApiKeyInfo, now: number): void {
  const elapsed = Math.max(0, now - s.at);
  if (key.rpm !== undefined)
    s.requests = Math.min(key.rpm, s.requests + (elapsed * key.rpm) / MINUTE_MS);
  if (key.tpm !== undefined)
    s.tokens = Math.min(key.tpm, s.tokens + (elapsed * key.tpm) / MINUTE_MS);
  s.at = now;
}

/** One object per admitted request: no closures per request on the router's hot path. */
class Lease implements KeyLease {
  readonly ok = true;
  #released = false;
  #settled = false;

  constructor(
    private readonly state: KeyState,
    private readonly key: ApiKeyInfo,
    /** Tokens reserved at admission. */
    private readonly charged: number,
    private readonly clock: Clock,
  ) {}

  release(): void {
    if (this.#released) return;
    this.#released = true;
    this.state.inFlight -= 1;
  }

  settle(tokens: number): void {
    const tpm = this.key.tpm;
    if (this.#settled || tpm === undefined) return;
    if (!Number.isSafeInteger(tokens) || tokens < 0 || tokens > MAX_SETTLED_TOKENS) return;
    this.#settled = true;
    const s = this.state;
    refill(s, this.key, this.clock.now());
    // No floor: a request far over its estimate (a stream without an output limit) leaves the
    // key as deep in debt as it ran over; MAX_SETTLED_TOKENS bounds what one answer can claim.
    s.tokens = Math.min(tpm, s.tokens + this.charged - tokens);
  }
}

const NO_LIMIT: KeyLease = { ok: true, release: () => {}, settle: () => {} };

/** Creates a {@link KeyLimiter}. */
export function createKeyLimiter(options: KeyLimiterOptions = {}): KeyLimiter {
  const maxKeys = checkRange("maxKeys", options.maxKeys ?? 10_000, 1, 1e7);
  const clock = options.clock ?? systemClock;
  const states = new Map<string, KeyState>();
  return {
    acquire(key, estimatedTokens) {
      if (key.rpm === undefined && key.tpm === undefined && key.maxConcurrency === undefined) {
        return NO_LIMIT;
      }
      const now = clock.now();
      let s = states.get(key.id);
      if (s === undefined) {
        s = { requests: key.rpm ?? 0, tokens: key.tpm ?? 0, at: now, inFlight: 0 };
      } else {
        states.delete(key.id);
        refill(s, key, now);
      }
      states.set(key.id, s);
      if (states.size > maxKeys) {
        for (const [id, st] of states) {
          if (states.size <= maxKeys) break;
          if (st.inFlight === 0) states.delete(id);
        }
      }
      if (key.maxConcurrency !== undefined && s.inFlight >= key.maxConcurrency) {
        return { ok: false, reason: "concurrency", retryAfterSeconds: 1 };
      }
      if (key.rpm !== undefined && s.requests < 1) {
        const waitMs = ((1 - s.requests) * MINUTE_MS) / Math.max(key.rpm, 1e-9);
        return {
          ok: false,
          reason: "rpm",
          retryAfterSeconds: Math.max(1, Math.ceil(waitMs / 1000)),
        };
      }
      // A request bigger than the whole per-minute budget could never be paid for within the
      // limit; admitting it on a full bucket would let one request spend many minutes' worth.
      if (key.tpm !== undefined && estimatedTokens > key.tpm) {
        return { ok: false, reason: "tpm", reserved: estimatedTokens, tpm: key.tpm };
      }
      const cost = key.tpm === undefined ? 0 : estimatedTokens;
      if (key.tpm !== undefined && s.tokens < cost) {
        const waitMs = ((cost - s.tokens) * MINUTE_MS) / Math.max(key.tpm, 1e-9);
        return {
          ok: false,
          reason: "tpm",
          retryAfterSeconds: Math.max(1, Math.ceil(waitMs / 1000)),
        };
      }
      if (key.rpm !== undefined) s.requests -= 1;
      if (key.tpm !== undefined) s.tokens -= cost;
      s.inFlight += 1;
      return new Lease(s, key, cost, clock);
    },
  };
}
