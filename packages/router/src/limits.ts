/**
 * Request limits at two levels, the API key and its tenant: requests per minute and tokens per
 * minute as token buckets (capacity = the per-minute limit, refilled continuously), a cap on
 * requests in flight, and token budgets per UTC day or month (per model or over all models).
 * A request needs room at every level; one refused anywhere takes nothing anywhere (every
 * limit is checked before any is charged).
 *
 * Tokens: a request reserves its estimate at admission and is settled to its real count once
 * the answer reports it, so a key pays for what the engine generated, not for what the request
 * claimed.
 *
 * Budgets are cluster-wide: what a budget has used is the standing the control plane last
 * answered a usage report with (`applyStandings`), plus what this router charged since, plus
 * the estimates of its requests still in flight. Local charges are kept by the wall-clock
 * second they were made in; a standing drops those made before the reports it answers were
 * sealed (they are in it) and keeps the later ones (sealed into reports not yet answered, or
 * not sealed yet), so nothing is counted twice or missed for longer than a second.
 *
 * State is bounded: key, tenant and budget states are each kept for at most a fixed number of
 * owners, least recently used dropped first (never one with a request in flight; the order is
 * an {@link LruMap}'s). A dropped rate state starts again with a full bucket and a dropped budget counter with no usage until
 * the next standing: both err towards admitting. So does a limit a routing update changes: an
 * rpm or tpm added to a state starts with a full bucket, a raised one keeps what was used of
 * it (the bucket gains the raise), a lowered one is capped at its new size.
 */
import type { ApiKeyInfo, TenantInfo } from "./api-keys.js";
import { type Clock, systemClock } from "./clock.js";
import { checkRange } from "./errors.js";
import { LruMap } from "./lru-map.js";
import type { BudgetPeriod, TokenBudget } from "./routing-messages.js";
import type { BudgetStanding } from "./usage-ledger.js";

/**
 * Which limit refused a request, `<level>-<limit>`: also the `x-llmgw-limit` header of the 429
 * and a bounded metric label.
 */
export type LimitReason =
  | "key-rpm"
  | "key-tpm"
  | "key-concurrency"
  | "tenant-rpm"
  | "tenant-tpm"
  | "tenant-concurrency"
  | "key-budget"
  | "tenant-budget";

/** An admitted request's hold on its key and tenant: concurrency slots and token reservations. */
export interface LimitLease {
  readonly ok: true;
  /**
   * Whether settling changes anything (a tpm or a budget applies): worth counting a stream's
   * events for when the answer may report no usage.
   */
  readonly metered: boolean;
  /**
   * Frees the concurrency slots; idempotent. A lease released unsettled keeps its estimate
   * charged (to the buckets and the budgets).
   */
  release(): void;
  /**
   * Replaces the reserved token estimate with the request's real count (prompt + completion),
   * refunding or charging the difference at both levels and in every budget; once per lease,
   * later calls are ignored. A count that is not a safe integer in [0, {@link
   * MAX_SETTLED_TOKENS}] is ignored too (the estimate stands): it comes from the engine's answer,
   * which this process does not vouch for. A bucket may go into debt, as deep as the request ran
   * over its estimate: the key (or tenant) is held back until the debt is refilled, so over time
   * it pays its tpm for every token it used.
   */
  settle(tokens: number): void;
}

/** A refusal that a wait would lift: retry after `retryAfterSeconds` (≥ 1). */
export interface LimitRefusal {
  readonly ok: false;
  readonly reason: LimitReason;
  readonly retryAfterSeconds: number;
  /** The budget that refused, for `key-budget` and `tenant-budget`. */
  readonly budget?: TokenBudget;
}

/**
 * The request alone reserves more than a whole tpm or budget: no wait would admit it, so there
 * is no retry time either.
 */
export interface LimitNever {
  readonly ok: false;
  readonly reason: "key-tpm" | "tenant-tpm" | "key-budget" | "tenant-budget";
  readonly retryAfterSeconds?: undefined;
  readonly reserved: number;
  /** The tpm or the budget's tokens. */
  readonly limit: number;
  readonly budget?: TokenBudget;
}

/** Outcome of {@link Limiter.acquire}. */
export type LimitOutcome = LimitLease | LimitRefusal | LimitNever;

/**
 * Largest real token count a lease accepts when settling (2^24, above any context window):
 * more is taken for a corrupt answer, not for usage.
 */
export const MAX_SETTLED_TOKENS = 2 ** 24;

/** Options of {@link createLimiter}. */
export interface LimiterOptions {
  /** Most keys with rate state kept (default 10 000). */
  readonly maxKeys?: number;
  /** Most tenants with rate state kept (default 10 000). */
  readonly maxTenants?: number;
  /** Most budget counters (one per owner, period and model) kept (default 100 000). */
  readonly maxBudgetCounters?: number;
  /** Monotonic time for the buckets. */
  readonly clock?: Clock;
  /** Wall-clock epoch ms, for the UTC days and months budgets cover. Default `Date.now`. */
  readonly wallNow?: () => number;
}

/** Limit state of one router. */
export interface Limiter {
  /**
   * Checks every limit of `key` and its tenant for a request to served model `model` that
   * reserves `estimatedTokens`, and, when all have room, takes one request, a concurrency
   * slot and the estimate at each level and in each budget that applies (settle the lease to
   * the real count once known).
   */
  acquire(key: ApiKeyInfo, model: string, estimatedTokens: number): LimitOutcome;
  /**
   * Takes the cluster-wide standings of a usage report's answer, read at `asOfMs` (epoch ms):
   * each replaces its budget's standing, and the tokens this router charged locally before
   * `includedUpToMs` (epoch ms on this router's clock, default `asOfMs`) are dropped from its
   * local count, since the standing holds them. Pass the time the newest acknowledged report
   * was sealed: what was charged after it (in reports still pending, or not sealed yet) stays
   * counted here. A standing of a period before the current one is ignored, and so is a whole
   * answer older than the newest taken (answers that crossed). Standings of budgets no key or
   * tenant has yet are kept too (bounded), to be there when a grant names them.
   */
  applyStandings(
    standings: readonly BudgetStanding[],
    asOfMs: number,
    includedUpToMs?: number,
  ): void;
  /** States held: what the bounds apply to. */
  stats(): { readonly keys: number; readonly tenants: number; readonly budgetCounters: number };
}

/** A token bucket pair and the requests in flight of one key or tenant. */
interface RateState {
  requests: number;
  tokens: number;
  at: number;
  inFlight: number;
  /** The rpm the requests bucket is of (the last acquire's): its refill rate and size. */
  rpm: number | undefined;
  /** The tpm the tokens bucket is of, likewise. */
  tpm: number | undefined;
}

/** One budget's usage in its current period. */
interface BudgetCounter {
  /** Whether the budget is per UTC day (else per UTC month). */
  readonly day: boolean;
  /** Start of the period the counts are of, epoch ms. */
  periodStart: number;
  /** Cluster-wide use as of the last standing. */
  standing: number;
  /** Charged here and not in that standing: the sum of {@link buckets}. */
  local: number;
  /**
   * The local charges by wall-clock second, oldest first, as flat pairs `[second start ms,
   * tokens, …]`; at most {@link MAX_LOCAL_BUCKETS} pairs (the two oldest merge beyond that,
   * under the later second, so they are dropped only once both are covered).
   */
  readonly buckets: number[];
  /** Estimates of requests in flight here. */
  reserved: number;
}

/**
 * Drops entries of `map` until it holds `max`, least recently used first, never `keep` nor
 * one `busy` says holds a request.
 */
function evictFrom<T>(
  map: LruMap<string, T>,
  max: number,
  keep: T,
  busy: (entry: T) => boolean,
): void {
  if (map.size <= max) return;
  for (const [id, entry] of map.entries()) {
    if (map.size <= max) return;
    if (entry !== keep && !busy(entry)) map.delete(id);
  }
}

/** The rate limits of a key or a tenant, which its {@link RateState}'s buckets follow. */
interface RateLimits {
  readonly rpm?: number;
  readonly tpm?: number;
  readonly maxConcurrency?: number;
}

const MINUTE_MS = 60_000;
const DAY_MS = 86_400_000;
/** Pairs a {@link BudgetCounter} keeps of its local charges. */
const MAX_LOCAL_BUCKETS = 8;

/**
 * Moves `c` into the period starting `start` when it is of an earlier one: what that period
 * used no longer counts (requests in flight across the boundary stay reserved, and are charged
 * to the new period).
 */
function rollCounter(c: BudgetCounter, start: number): void {
  if (c.periodStart >= start) return;
  c.periodStart = start;
  c.standing = 0;
  c.local = 0;
  c.buckets.length = 0;
}

/** Start of the UTC day or month (as `c` is per day or per month) holding `t`. */
const periodStartOf = (c: BudgetCounter, t: number): number =>
  c.day ? t - (((t % DAY_MS) + DAY_MS) % DAY_MS) : monthBounds(t)[0];

/**
 * Charges `tokens` (negative: a refund) to `c`'s local use at wall time `now`, in the period
 * holding `now`: a request that ends after midnight, before any other is admitted, is charged
 * to the new day (an acquire would otherwise roll the counter after it, and drop the charge).
 */
function chargeLocal(c: BudgetCounter, tokens: number, now: number): void {
  rollCounter(c, periodStartOf(c, now));
  c.local += tokens;
  const second = now - (now % 1000);
  const b = c.buckets;
  if (b.length > 0 && b[b.length - 2] === second) {
    b[b.length - 1] = (b[b.length - 1] as number) + tokens;
    return;
  }
  b.push(second, tokens);
  if (b.length > 2 * MAX_LOCAL_BUCKETS) {
    // [t0, n0, t1, n1, …] → [t1, n0 + n1, …]
    b[3] = (b[1] as number) + (b[3] as number);
    b.splice(0, 2);
  }
}

/** Drops from `c`'s local use the charges of the seconds that ended by `upTo`. */
function dropLocal(c: BudgetCounter, upTo: number): void {
  const b = c.buckets;
  let n = 0;
  while (n < b.length && (b[n] as number) + 1000 <= upTo) {
    c.local -= b[n + 1] as number;
    n += 2;
  }
  if (n > 0) b.splice(0, n);
}

/** Refills `s` up to `now` at its per-minute rates. */
function refill(s: RateState, now: number): void {
  const elapsed = Math.max(0, now - s.at);
  const { rpm, tpm } = s;
  if (rpm !== undefined) s.requests = Math.min(rpm, s.requests + (elapsed * rpm) / MINUTE_MS);
  if (tpm !== undefined) s.tokens = Math.min(tpm, s.tokens + (elapsed * tpm) / MINUTE_MS);
  s.at = now;
}

/**
 * A bucket of size `from` resized to `to` (a routing update changed the limit), keeping what
 * was used of it: a limit added where there was none starts full, as for a new state; a raised
 * one gains the raise; a lowered one is capped at its new size (all err towards admitting).
 * Undefined `to`: the bucket is unused (0).
 */
function resized(level: number, from: number | undefined, to: number | undefined): number {
  if (to === undefined) return 0;
  if (from === undefined) return to;
  return Math.min(to, level + Math.max(0, to - from));
}

const rateBusy = (s: RateState): boolean => s.inFlight > 0;
const counterBusy = (c: BudgetCounter): boolean => c.reserved > 0;

const rateLimited = (l: RateLimits): boolean =>
  l.rpm !== undefined || l.tpm !== undefined || l.maxConcurrency !== undefined;

const hasBudgets = (b: readonly TokenBudget[] | undefined): b is readonly TokenBudget[] =>
  b !== undefined && b.length > 0;

/** Start of the UTC month holding `t`, and of the next. */
function monthBounds(t: number): [number, number] {
  const d = new Date(t);
  const y = d.getUTCFullYear();
  const m = d.getUTCMonth();
  return [Date.UTC(y, m, 1), Date.UTC(y, m + 1, 1)];
}

/** Seconds from `now` until `at`, at least 1. */
const secondsUntil = (at: number, now: number): number => Math.max(1, Math.ceil((at - now) / 1000));

/** One object per admitted request: no closures per request on the router's hot path. */
class Lease implements LimitLease {
  readonly ok = true;
  #released = false;
  #settled = false;
  /** Wall time the lease was charged to its budgets, epoch ms. */
  #chargedAt = 0;

  constructor(
    private readonly keyState: RateState | undefined,
    private readonly key: ApiKeyInfo,
    private readonly tenantState: RateState | undefined,
    private readonly tenant: TenantInfo | undefined,
    /** Tokens reserved at admission. */
    private readonly charged: number,
    private readonly counters: BudgetCounter[] | undefined,
    private readonly clock: Clock,
    private readonly wallNow: () => number,
    readonly metered: boolean,
  ) {}

  release(): void {
    if (this.#released) return;
    this.#released = true;
    if (this.keyState !== undefined) this.keyState.inFlight -= 1;
    if (this.tenantState !== undefined) this.tenantState.inFlight -= 1;
    // Never settled: the estimate is what the request used, as far as anyone knows.
    if (!this.#settled) this.#charge(this.charged);
  }

  settle(tokens: number): void {
    if (this.#settled || !this.metered) return;
    if (!Number.isSafeInteger(tokens) || tokens < 0 || tokens > MAX_SETTLED_TOKENS) return;
    const now = this.clock.now();
    // No floor: a request far over its estimate (a stream without an output limit) leaves the
    // bucket as deep in debt as it ran over; MAX_SETTLED_TOKENS bounds what one answer claims.
    // Against the buckets as they are now (a routing update may have changed their limits
    // since the request was admitted), where the request reserved its estimate.
    const ks = this.keyState;
    if (ks !== undefined && ks.tpm !== undefined && this.key.tpm !== undefined) {
      refill(ks, now);
      ks.tokens = Math.min(ks.tpm, ks.tokens + this.charged - tokens);
    }
    const ts = this.tenantState;
    if (ts !== undefined && ts.tpm !== undefined && this.tenant?.tpm !== undefined) {
      refill(ts, now);
      ts.tokens = Math.min(ts.tpm, ts.tokens + this.charged - tokens);
    }
    if (!this.#released) this.#charge(tokens);
    else if (this.counters !== undefined) {
      // Released first: the estimate went into the budgets then; correct it, or charge the
      // whole count where the period it went into has ended since.
      const wall = this.wallNow();
      for (const c of this.counters) {
        rollCounter(c, periodStartOf(c, wall));
        chargeLocal(c, c.periodStart > this.#chargedAt ? tokens : tokens - this.charged, wall);
      }
    }
    this.#settled = true;
  }

  /** Moves the reservation into the budgets' local use as `tokens`; once. */
  #charge(tokens: number): void {
    const counters = this.counters;
    if (counters === undefined) return;
    const wall = this.wallNow();
    this.#chargedAt = wall;
    for (const c of counters) {
      c.reserved -= this.charged;
      chargeLocal(c, tokens, wall);
    }
  }
}

const NO_LIMIT: LimitLease = { ok: true, metered: false, release: () => {}, settle: () => {} };

/**
 * Creates a {@link Limiter}.
 * @throws RouterError `LLMGW_ROUTER_INVALID_OPTIONS` for a bound out of [1, 10 000 000].
 */
export function createLimiter(options: LimiterOptions = {}): Limiter {
  const maxKeys = checkRange("maxKeys", options.maxKeys ?? 10_000, 1, 1e7);
  const maxTenants = checkRange("maxTenants", options.maxTenants ?? 10_000, 1, 1e7);
  const maxCounters = checkRange("maxBudgetCounters", options.maxBudgetCounters ?? 100_000, 1, 1e7);
  const clock = options.clock ?? systemClock;
  const wallNow = options.wallNow ?? Date.now;
  // Least recently used first: a hit moves a list node (deleting and setting a `Map` key
  // instead made V8 rebuild these small tables over and over, 3 µs of a request's 4 µs here).
  const keyStates = new LruMap<string, RateState>();
  const tenantStates = new LruMap<string, RateState>();
  const counters = new LruMap<string, BudgetCounter>();
  let newestStandingsAt = Number.NEGATIVE_INFINITY;

  // The current UTC day and month, recomputed only when the wall clock leaves them.
  let dayStart = 0;
  let dayEnd = 0;
  let monthStart = 0;
  let monthEnd = 0;
  const periodsAt = (t: number): void => {
    if (t >= dayStart && t < dayEnd) return;
    dayStart = t - (((t % DAY_MS) + DAY_MS) % DAY_MS);
    dayEnd = dayStart + DAY_MS;
    [monthStart, monthEnd] = monthBounds(t);
  };

  /** The rate state of `id` in `states`, refilled to `now` and made most recently used. */
  const rateState = (
    states: LruMap<string, RateState>,
    max: number,
    id: string,
    l: RateLimits,
    now: number,
  ): RateState => {
    let s = states.use(id);
    if (s === undefined) {
      s = {
        requests: l.rpm ?? 0,
        tokens: l.tpm ?? 0,
        at: now,
        inFlight: 0,
        rpm: l.rpm,
        tpm: l.tpm,
      };
      states.set(id, s);
      evictFrom(states, max, s, rateBusy);
    } else {
      refill(s, now);
      if (s.rpm !== l.rpm) {
        s.requests = resized(s.requests, s.rpm, l.rpm);
        s.rpm = l.rpm;
      }
      if (s.tpm !== l.tpm) {
        s.tokens = resized(s.tokens, s.tpm, l.tpm);
        s.tpm = l.tpm;
      }
    }
    return s;
  };

  /** Why `l` has no room for one more request of `tokens` now, or undefined when it has. */
  const rateRefusal = (
    s: RateState,
    l: RateLimits,
    tokens: number,
    level: "key" | "tenant",
  ): LimitRefusal | LimitNever | undefined => {
    if (l.maxConcurrency !== undefined && s.inFlight >= l.maxConcurrency) {
      return { ok: false, reason: `${level}-concurrency`, retryAfterSeconds: 1 };
    }
    if (l.rpm !== undefined && s.requests < 1) {
      const waitMs = ((1 - s.requests) * MINUTE_MS) / Math.max(l.rpm, 1e-9);
      return { ok: false, reason: `${level}-rpm`, retryAfterSeconds: secondsUntil(waitMs, 0) };
    }
    if (l.tpm === undefined) return undefined;
    // A request bigger than the whole per-minute budget could never be paid for within the
    // limit; admitting it on a full bucket would let one request spend many minutes' worth.
    if (tokens > l.tpm)
      return { ok: false, reason: `${level}-tpm`, reserved: tokens, limit: l.tpm };
    if (s.tokens < tokens) {
      const waitMs = ((tokens - s.tokens) * MINUTE_MS) / Math.max(l.tpm, 1e-9);
      return { ok: false, reason: `${level}-tpm`, retryAfterSeconds: secondsUntil(waitMs, 0) };
    }
    return undefined;
  };

  /** The counter of `id` (made most recently used), rolled into the period starting `start`. */
  const counterOf = (id: string, day: boolean, start: number): BudgetCounter => {
    let c = counters.use(id);
    if (c === undefined) {
      c = { day, periodStart: start, standing: 0, local: 0, buckets: [], reserved: 0 };
      counters.set(id, c);
      evictFrom(counters, maxCounters, c, counterBusy);
    } else {
      rollCounter(c, start);
    }
    return c;
  };

  const counterId = (owner: string, period: BudgetPeriod, model: string | undefined): string =>
    `${owner}\u0000${period}\u0000${model ?? ""}`;

  /**
   * Checks each budget in `budgets` that applies to `model`, pushing its counter onto `out`;
   * the refusal of the first without room, or undefined.
   */
  const budgetRefusal = (
    owner: string,
    budgets: readonly TokenBudget[],
    model: string,
    tokens: number,
    level: "key" | "tenant",
    now: number,
    out: BudgetCounter[],
  ): LimitRefusal | LimitNever | undefined => {
    periodsAt(now);
    for (const b of budgets) {
      if (b.model !== undefined && b.model !== model) continue;
      const reason = level === "key" ? "key-budget" : "tenant-budget";
      if (tokens > b.tokens) {
        return { ok: false, reason, reserved: tokens, limit: b.tokens, budget: b };
      }
      const day = b.period === "day";
      const c = counterOf(counterId(owner, b.period, b.model), day, day ? dayStart : monthStart);
      if (c.standing + c.local + c.reserved + tokens > b.tokens) {
        return {
          ok: false,
          reason,
          retryAfterSeconds: secondsUntil(day ? dayEnd : monthEnd, now),
          budget: b,
        };
      }
      out.push(c);
    }
    return undefined;
  };

  return {
    acquire(key, model, estimatedTokens) {
      const tenant = key.tenant;
      const keyRates = rateLimited(key);
      const tenantRates = tenant !== undefined && rateLimited(tenant);
      const keyBudgets = hasBudgets(key.budgets);
      const tenantBudgets = tenant !== undefined && hasBudgets(tenant.budgets);
      if (!keyRates && !tenantRates && !keyBudgets && !tenantBudgets) return NO_LIMIT;
      const now = clock.now();
      let ks: RateState | undefined;
      let ts: RateState | undefined;
      let refusal: LimitRefusal | LimitNever | undefined;
      if (keyRates) {
        ks = rateState(keyStates, maxKeys, key.id, key, now);
        refusal = rateRefusal(ks, key, estimatedTokens, "key");
        if (refusal !== undefined) return refusal;
      }
      if (tenantRates) {
        ts = rateState(tenantStates, maxTenants, (tenant as TenantInfo).name, tenant, now);
        refusal = rateRefusal(ts, tenant as TenantInfo, estimatedTokens, "tenant");
        if (refusal !== undefined) return refusal;
      }
      let held: BudgetCounter[] | undefined;
      if (keyBudgets || tenantBudgets) {
        const wall = wallNow();
        held = [];
        if (keyBudgets) {
          const b = key.budgets as readonly TokenBudget[];
          refusal = budgetRefusal(`k\u0000${key.id}`, b, model, estimatedTokens, "key", wall, held);
          if (refusal !== undefined) return refusal;
        }
        if (tenantBudgets) {
          const t = tenant as TenantInfo;
          const b = t.budgets as readonly TokenBudget[];
          refusal = budgetRefusal(
            `t\u0000${t.name}`,
            b,
            model,
            estimatedTokens,
            "tenant",
            wall,
            held,
          );
          if (refusal !== undefined) return refusal;
        }
        if (held.length === 0) held = undefined;
        else for (const c of held) c.reserved += estimatedTokens;
      }
      if (ks !== undefined) {
        if (key.rpm !== undefined) ks.requests -= 1;
        if (key.tpm !== undefined) ks.tokens -= estimatedTokens;
        ks.inFlight += 1;
      }
      if (ts !== undefined) {
        const t = tenant as TenantInfo;
        if (t.rpm !== undefined) ts.requests -= 1;
        if (t.tpm !== undefined) ts.tokens -= estimatedTokens;
        ts.inFlight += 1;
      }
      const metered = key.tpm !== undefined || tenant?.tpm !== undefined || held !== undefined;
      return new Lease(ks, key, ts, tenant, estimatedTokens, held, clock, wallNow, metered);
    },

    applyStandings(standings, asOfMs, includedUpToMs = asOfMs) {
      if (asOfMs < newestStandingsAt) return;
      newestStandingsAt = asOfMs;
      periodsAt(wallNow());
      for (const s of standings) {
        const owner =
          s.keyId !== undefined && s.keyId !== ""
            ? `k\u0000${s.keyId}`
            : s.tenant !== undefined && s.tenant !== ""
              ? `t\u0000${s.tenant}`
              : undefined;
        if (owner === undefined) continue;
        if (!Number.isSafeInteger(s.usedTokens) || s.usedTokens < 0) continue;
        const current = s.period === "day" ? dayStart : monthStart;
        if (s.periodStartMs < current) continue;
        const id = counterId(owner, s.period, s.model === "" ? undefined : s.model);
        const c = counterOf(id, s.period === "day", s.periodStartMs);
        if (c.periodStart > s.periodStartMs) continue;
        c.periodStart = s.periodStartMs;
        c.standing = s.usedTokens;
        dropLocal(c, includedUpToMs);
      }
    },

    stats() {
      return { keys: keyStates.size, tenants: tenantStates.size, budgetCounters: counters.size };
    },
  };
}
