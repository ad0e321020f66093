/**
 * Per-API-key limits: requests per minute and estimated tokens per minute as token buckets
 * (capacity = the per-minute limit, refilled continuously), plus a cap on requests in flight.
 * State per key is bounded (`maxKeys`, least recently used dropped; a dropped key starts with a
 * full bucket, which errs towards admitting).
 */
import type { ApiKeyInfo } from "./api-keys.js";
import { type Clock, systemClock } from "./clock.js";
import { checkRange } from "./errors.js";

/** Which limit refused a request. */
export type KeyLimitReason = "rpm" | "tpm" | "concurrency";

/** Outcome of {@link KeyLimiter.acquire}. */
export type KeyLimitOutcome =
  | {
      readonly ok: true /** Frees the concurrency slot; idempotent. */;
      readonly release: () => void;
    }
  | { readonly ok: false; readonly reason: KeyLimitReason; readonly retryAfterSeconds: number };

/** Options of {@link createKeyLimiter}. */
export interface KeyLimiterOptions {
  /** Most keys with state kept (default 10 000). */
  readonly maxKeys?: number;
  readonly clock?: Clock;
}

/** Per-key limit state. */
export interface KeyLimiter {
  /** Checks and, when allowed, consumes one request and `estimatedTokens` for `key`. */
  acquire(key: ApiKeyInfo, estimatedTokens: number): KeyLimitOutcome;
}

interface KeyState {
  requests: number;
  tokens: number;
  at: number;
  inFlight: number;
}

const MINUTE_MS = 60_000;

/** Creates a {@link KeyLimiter}. */
export function createKeyLimiter(options: KeyLimiterOptions = {}): KeyLimiter {
  const maxKeys = checkRange("maxKeys", options.maxKeys ?? 10_000, 1, 1e7);
  const clock = options.clock ?? systemClock;
  const states = new Map<string, KeyState>();
  const okNoLimit: KeyLimitOutcome = { ok: true, release: () => {} };
  return {
    acquire(key, estimatedTokens) {
      if (key.rpm === undefined && key.tpm === undefined && key.maxConcurrency === undefined) {
        return okNoLimit;
      }
      const now = clock.now();
      let s = states.get(key.id);
      if (s === undefined) {
        s = { requests: key.rpm ?? 0, tokens: key.tpm ?? 0, at: now, inFlight: 0 };
      } else {
        states.delete(key.id);
        const elapsed = Math.max(0, now - s.at);
        if (key.rpm !== undefined)
          s.requests = Math.min(key.rpm, s.requests + (elapsed * key.rpm) / MINUTE_MS);
        if (key.tpm !== undefined)
          s.tokens = Math.min(key.tpm, s.tokens + (elapsed * key.tpm) / MINUTE_MS);
        s.at = now;
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
      // A request bigger than the whole per-minute budget is charged the whole budget, so it
      // can pass once the bucket is full instead of never.
      const cost = key.tpm === undefined ? 0 : Math.min(estimatedTokens, key.tpm);
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
      const state = s;
      let released = false;
      return {
        ok: true,
        release: () => {
          if (released) return;
          released = true;
          state.inFlight -= 1;
        },
      };
    },
  };
}
