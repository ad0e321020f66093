import { describe, expect, it } from "vitest";
import type { ApiKeyInfo, TenantInfo } from "./api-keys.js";
import { createManualClock } from "./clock.js";
import { createLimiter, type LimitOutcome } from "./limits.js";

const verdict = (o: LimitOutcome) =>
  o.ok ? "ok" : `${o.reason}:${o.retryAfterSeconds ?? `never(${o.reserved}>${o.limit})`}`;

const MODEL = "m";

describe("limiter: one key", () => {
  it.each([
    {
      name: "no limits",
      key: { id: "k", name: "k" },
      tokens: [10, 10, 10],
      expected: ["ok", "ok", "ok"],
    },
    {
      name: "rpm 2",
      key: { id: "k", name: "k", rpm: 2 },
      tokens: [1, 1, 1],
      expected: ["ok", "ok", "key-rpm:30"],
    },
    {
      name: "tpm 100",
      key: { id: "k", name: "k", tpm: 100 },
      tokens: [60, 30, 20],
      expected: ["ok", "ok", "key-tpm:6"],
    },
    {
      name: "max concurrency 2 (nothing released)",
      key: { id: "k", name: "k", maxConcurrency: 2 },
      tokens: [1, 1, 1],
      expected: ["ok", "ok", "key-concurrency:1"],
    },
  ])("$name", ({ key, tokens, expected }) => {
    const limiter = createLimiter({ clock: createManualClock() });
    expect(tokens.map((t) => verdict(limiter.acquire(key, MODEL, t)))).toEqual(expected);
  });

  it("refuses, with no retry time, a request that reserves more than the whole tpm", () => {
    const limiter = createLimiter({ clock: createManualClock() });
    const key = { id: "k", name: "k", tpm: 100 };
    // Even on a full bucket: admitting it would let one request spend many minutes' budget.
    expect(verdict(limiter.acquire(key, MODEL, 101))).toBe("key-tpm:never(101>100)");
    expect(verdict(limiter.acquire(key, MODEL, 100))).toBe("ok");
  });

  it("refills rpm over time and frees concurrency on release", () => {
    const clock = createManualClock();
    const limiter = createLimiter({ clock });
    const key = { id: "k", name: "k", rpm: 1, maxConcurrency: 1 };
    const first = limiter.acquire(key, MODEL, 1);
    expect(verdict(limiter.acquire(key, MODEL, 1))).toBe("key-concurrency:1");
    if (first.ok) first.release();
    expect(verdict(limiter.acquire(key, MODEL, 1))).toBe("key-rpm:60");
    clock.advance(60_000);
    expect(verdict(limiter.acquire(key, MODEL, 1))).toBe("ok");
  });

  it("is unmetered without a tpm or budget, metered with one", () => {
    const limiter = createLimiter({ clock: createManualClock() });
    const plain = limiter.acquire({ id: "a", name: "a", rpm: 5 }, MODEL, 1);
    const metered = limiter.acquire({ id: "b", name: "b", tpm: 5 }, MODEL, 1);
    expect([plain.ok && plain.metered, metered.ok && metered.metered]).toEqual([false, true]);
  });
});

describe("limiter: settling to the real token count", () => {
  const key = { id: "k", name: "k", tpm: 100 };

  it("charges what the engine reported, not what was reserved", () => {
    const limiter = createLimiter({ clock: createManualClock() });
    const first = limiter.acquire(key, MODEL, 10);
    expect(first.ok).toBe(true);
    if (first.ok) first.settle(90); // used 90, reserved 10: 10 tokens left
    expect(verdict(limiter.acquire(key, MODEL, 20))).toBe("key-tpm:6");
    expect(verdict(limiter.acquire(key, MODEL, 10))).toBe("ok");
  });

  it("refunds a reservation the answer did not use", () => {
    const limiter = createLimiter({ clock: createManualClock() });
    const first = limiter.acquire(key, MODEL, 100);
    expect(verdict(limiter.acquire(key, MODEL, 50))).toBe("key-tpm:30");
    if (first.ok) first.settle(40);
    expect(verdict(limiter.acquire(key, MODEL, 60))).toBe("ok");
  });

  it("holds a key that ran far over back until its whole debt is refilled", () => {
    const clock = createManualClock();
    const limiter = createLimiter({ clock });
    const first = limiter.acquire(key, MODEL, 100);
    if (first.ok) first.settle(1_300); // 1,200 over: twelve minutes' budget of debt
    expect(verdict(limiter.acquire(key, MODEL, 10))).toBe("key-tpm:726");
    clock.advance(12 * 60_000);
    expect(verdict(limiter.acquire(key, MODEL, 10))).toBe("key-tpm:6");
    clock.advance(6_000);
    expect(verdict(limiter.acquire(key, MODEL, 10))).toBe("ok");
  });

  it("settles against the bucket as refilled by then", () => {
    const clock = createManualClock();
    const limiter = createLimiter({ clock });
    const first = limiter.acquire(key, MODEL, 100);
    clock.advance(60_000); // full again by the time the answer ends
    if (first.ok) first.settle(150); // 50 more than reserved
    expect(verdict(limiter.acquire(key, MODEL, 60))).toBe("key-tpm:6");
    expect(verdict(limiter.acquire(key, MODEL, 50))).toBe("ok");
  });

  it.each([
    ["negative", -5],
    ["NaN", Number.NaN],
    ["fractional", 12.5],
    ["infinite", Number.POSITIVE_INFINITY],
    ["huge", 2 ** 40],
  ])("keeps the estimate for a %s count", (_name, count) => {
    const limiter = createLimiter({ clock: createManualClock() });
    const first = limiter.acquire(key, MODEL, 60);
    if (first.ok) first.settle(count);
    expect(verdict(limiter.acquire(key, MODEL, 41))).toBe("key-tpm:1");
    expect(verdict(limiter.acquire(key, MODEL, 40))).toBe("ok");
  });

  it("settles once", () => {
    const limiter = createLimiter({ clock: createManualClock() });
    const first = limiter.acquire(key, MODEL, 10);
    if (first.ok) {
      first.settle(50);
      first.settle(0);
    }
    expect(verdict(limiter.acquire(key, MODEL, 51))).toBe("key-tpm:1");
  });
});

describe("limiter: a key and its tenant", () => {
  const tenantOf = (limits: Omit<TenantInfo, "name" | "weight">): TenantInfo => ({
    name: "team",
    weight: 1,
    ...limits,
  });

  it.each([
    { limits: { rpm: 2 }, tokens: 1, third: "tenant-rpm:30" },
    { limits: { tpm: 100 }, tokens: 40, third: "tenant-tpm:12" },
    { limits: { maxConcurrency: 2 }, tokens: 1, third: "tenant-concurrency:1" },
  ])("shares the tenant's $limits between its keys", ({ limits, tokens, third }) => {
    const limiter = createLimiter({ clock: createManualClock() });
    const tenant = tenantOf(limits);
    const a: ApiKeyInfo = { id: "a", name: "a", tenant };
    const b: ApiKeyInfo = { id: "b", name: "b", tenant };
    const other: ApiKeyInfo = { id: "c", name: "c", tenant: { ...tenant, name: "other" } };
    expect(verdict(limiter.acquire(a, MODEL, tokens))).toBe("ok");
    expect(verdict(limiter.acquire(b, MODEL, tokens))).toBe("ok");
    expect(verdict(limiter.acquire(a, MODEL, tokens))).toBe(third);
    expect(verdict(limiter.acquire(b, MODEL, tokens))).toBe(third);
    expect(verdict(limiter.acquire(other, MODEL, tokens))).toBe("ok");
  });

  it("refuses a request bigger than the tenant's whole tpm with no retry time", () => {
    const limiter = createLimiter({ clock: createManualClock() });
    const key = { id: "a", name: "a", tpm: 1000, tenant: tenantOf({ tpm: 100 }) };
    expect(verdict(limiter.acquire(key, MODEL, 101))).toBe("tenant-tpm:never(101>100)");
  });

  it("takes nothing at the key when the tenant refuses", () => {
    const limiter = createLimiter({ clock: createManualClock() });
    const key = { id: "a", name: "a", rpm: 2, tenant: tenantOf({ maxConcurrency: 1 }) };
    const held = limiter.acquire(key, MODEL, 1);
    expect(verdict(held)).toBe("ok");
    expect(verdict(limiter.acquire(key, MODEL, 1))).toBe("tenant-concurrency:1");
    if (held.ok) held.release();
    // The key's second request of the minute was not spent on the refused one.
    expect(verdict(limiter.acquire(key, MODEL, 1))).toBe("ok");
  });

  it("takes nothing at the tenant when the key refuses", () => {
    const limiter = createLimiter({ clock: createManualClock() });
    const tenant = tenantOf({ rpm: 1, tpm: 100 });
    expect(verdict(limiter.acquire({ id: "a", name: "a", tpm: 10, tenant }, MODEL, 50))).toBe(
      "key-tpm:never(50>10)",
    );
    expect(verdict(limiter.acquire({ id: "b", name: "b", tenant }, MODEL, 100))).toBe("ok");
  });

  it("settles the tenant's tpm too", () => {
    const limiter = createLimiter({ clock: createManualClock() });
    const tenant = tenantOf({ tpm: 100 });
    const key = { id: "a", name: "a", tenant };
    const first = limiter.acquire(key, MODEL, 80);
    expect(verdict(limiter.acquire(key, MODEL, 30))).toBe("tenant-tpm:6");
    if (first.ok) first.settle(10);
    expect(verdict(limiter.acquire(key, MODEL, 90))).toBe("ok");
  });
});

describe("limiter: a limit a routing update changes", () => {
  const k = (limits: Omit<ApiKeyInfo, "id" | "name">): ApiKeyInfo => ({
    id: "k",
    name: "k",
    ...limits,
  });
  const inTeam = (limits: Omit<TenantInfo, "name" | "weight">): ApiKeyInfo =>
    k({ tenant: { name: "team", weight: 1, ...limits } });

  // Each step: the key as the routing state has it then, the tokens of one request, its verdict.
  it.each<{ name: string; steps: [ApiKeyInfo, number, string][] }>([
    {
      name: "an rpm added to a key that had none starts full, as for a key never seen",
      steps: [
        [k({ maxConcurrency: 10 }), 1, "ok"],
        [k({ maxConcurrency: 10 }), 1, "ok"],
        [k({ maxConcurrency: 10, rpm: 2 }), 1, "ok"],
        [k({ maxConcurrency: 10, rpm: 2 }), 1, "ok"],
        [k({ maxConcurrency: 10, rpm: 2 }), 1, "key-rpm:30"],
      ],
    },
    {
      name: "a tpm added to a key that had none starts full",
      steps: [
        [k({ rpm: 1000 }), 50, "ok"],
        [k({ rpm: 1000, tpm: 100 }), 60, "ok"],
        [k({ rpm: 1000, tpm: 100 }), 30, "ok"],
        [k({ rpm: 1000, tpm: 100 }), 20, "key-tpm:6"],
      ],
    },
    {
      name: "an rpm removed and added again starts full",
      steps: [
        [k({ rpm: 1 }), 1, "ok"],
        [k({ rpm: 1 }), 1, "key-rpm:60"],
        [k({ maxConcurrency: 10 }), 1, "ok"],
        [k({ rpm: 1 }), 1, "ok"],
        [k({ rpm: 1 }), 1, "key-rpm:60"],
      ],
    },
    {
      name: "a raised tpm keeps what was used of it",
      steps: [
        [k({ tpm: 100 }), 60, "ok"],
        [k({ tpm: 1000 }), 940, "ok"],
        [k({ tpm: 1000 }), 1, "key-tpm:1"],
      ],
    },
    {
      name: "a lowered rpm caps the bucket at its new size",
      steps: [
        [k({ rpm: 10 }), 1, "ok"],
        [k({ rpm: 2 }), 1, "ok"],
        [k({ rpm: 2 }), 1, "ok"],
        [k({ rpm: 2 }), 1, "key-rpm:30"],
      ],
    },
    {
      name: "a tenant's rpm added where it had none starts full",
      steps: [
        [inTeam({ maxConcurrency: 10 }), 1, "ok"],
        [inTeam({ maxConcurrency: 10, rpm: 2 }), 1, "ok"],
        [inTeam({ maxConcurrency: 10, rpm: 2 }), 1, "ok"],
        [inTeam({ maxConcurrency: 10, rpm: 2 }), 1, "tenant-rpm:30"],
      ],
    },
  ])("$name", ({ steps }) => {
    const limiter = createLimiter({ clock: createManualClock() });
    const verdicts = steps.map(([key, tokens]) => verdict(limiter.acquire(key, MODEL, tokens)));
    expect(verdicts).toEqual(steps.map(([, , expected]) => expected));
  });

  it("settles a request admitted before a raise against the raised bucket", () => {
    const limiter = createLimiter({ clock: createManualClock() });
    const before = limiter.acquire(k({ tpm: 100 }), MODEL, 50);
    expect(verdict(limiter.acquire(k({ tpm: 1000 }), MODEL, 10))).toBe("ok"); // 940 left
    if (before.ok) before.settle(50);
    expect(verdict(limiter.acquire(k({ tpm: 1000 }), MODEL, 941))).toBe("key-tpm:1");
    expect(verdict(limiter.acquire(k({ tpm: 1000 }), MODEL, 940))).toBe("ok");
  });
});

describe("limiter: budgets", () => {
  // 2026-01-31 23:59:00 UTC: a minute before a new day and a new month.
  const LAST_MINUTE = Date.UTC(2026, 0, 31, 23, 59, 0);

  const setup = (startMs = LAST_MINUTE) => {
    const clock = createManualClock(startMs);
    return { clock, limiter: createLimiter({ clock, wallNow: clock.now }) };
  };

  it.each([
    { period: "day" as const, retry: 60 },
    { period: "month" as const, retry: 60 },
  ])("refuses past a $period budget until the period ends, then admits", ({ period, retry }) => {
    const { clock, limiter } = setup();
    const key = { id: "k", name: "k", budgets: [{ period, tokens: 100 }] };
    const first = limiter.acquire(key, MODEL, 60);
    if (first.ok) first.settle(90);
    expect(verdict(limiter.acquire(key, MODEL, 20))).toBe(`key-budget:${retry}`);
    const second = limiter.acquire(key, MODEL, 10);
    expect(verdict(second)).toBe("ok");
    if (second.ok) second.settle(10);
    clock.advance(60_000); // 2026-02-01 00:00: a new day and a new month
    expect(verdict(limiter.acquire(key, MODEL, 100))).toBe("ok");
  });

  it.each(["settled", "released"] as const)(
    "charges a request %s after midnight, before any other, to the new day",
    (first) => {
      const { clock, limiter } = setup(Date.UTC(2026, 0, 15, 23, 59, 0));
      const key = { id: "k", name: "k", budgets: [{ period: "day" as const, tokens: 1000 }] };
      const lease = limiter.acquire(key, MODEL, 600);
      if (!lease.ok) throw new Error("refused");
      if (first === "released") lease.release(); // the estimate went to the old day
      clock.advance(61_000); // the 16th: the engine's count arrives, 600 tokens of the new day
      lease.settle(600);
      lease.release();
      clock.advance(1000);
      expect(verdict(limiter.acquire(key, MODEL, 500))).toBe(`key-budget:${86_400 - 2}`);
      expect(verdict(limiter.acquire(key, MODEL, 400))).toBe("ok");
    },
  );

  it("keeps a month budget across midnight within the month", () => {
    const { clock, limiter } = setup(Date.UTC(2026, 0, 15, 23, 59, 0));
    const key = { id: "k", name: "k", budgets: [{ period: "month" as const, tokens: 100 }] };
    const first = limiter.acquire(key, MODEL, 100);
    if (first.ok) first.settle(100);
    clock.advance(60_000); // the 16th: same month
    // Retry-After: to 2026-02-01 00:00, 16 days.
    expect(verdict(limiter.acquire(key, MODEL, 1))).toBe(`key-budget:${16 * 86_400}`);
  });

  it("ends February on the 28th and a leap year's on the 29th", () => {
    for (const [year, days] of [
      [2026, 28],
      [2028, 29],
    ] as const) {
      const { clock, limiter } = setup(Date.UTC(year, 1, 1));
      const key = { id: "k", name: "k", budgets: [{ period: "month" as const, tokens: 10 }] };
      const first = limiter.acquire(key, MODEL, 10);
      if (first.ok) first.release(); // unsettled: the estimate is charged
      expect(verdict(limiter.acquire(key, MODEL, 1))).toBe(`key-budget:${days * 86_400}`);
      clock.advance(days * 86_400_000 - 1);
      expect(verdict(limiter.acquire(key, MODEL, 1))).toMatch(/^key-budget:1$/);
      clock.advance(1);
      expect(verdict(limiter.acquire(key, MODEL, 1))).toBe("ok");
    }
  });

  it("counts a per-model budget for its model only, an overall one for every model", () => {
    const { limiter } = setup();
    const key = {
      id: "k",
      name: "k",
      budgets: [
        { period: "day" as const, model: "big", tokens: 50 },
        { period: "day" as const, tokens: 120 },
      ],
    };
    expect(verdict(limiter.acquire(key, "big", 50))).toBe("ok");
    expect(verdict(limiter.acquire(key, "big", 1))).toBe("key-budget:60");
    expect(verdict(limiter.acquire(key, "small", 70))).toBe("ok");
    expect(verdict(limiter.acquire(key, "small", 1))).toBe("key-budget:60");
  });

  it("refuses a request bigger than the whole budget with no retry time", () => {
    const { limiter } = setup();
    const key = { id: "k", name: "k", budgets: [{ period: "day" as const, tokens: 100 }] };
    expect(verdict(limiter.acquire(key, MODEL, 101))).toBe("key-budget:never(101>100)");
  });

  it("shares a tenant's budget between its keys, and names the tenant", () => {
    const { limiter } = setup();
    const tenant: TenantInfo = {
      name: "team",
      weight: 1,
      budgets: [{ period: "day", tokens: 100 }],
    };
    const a = limiter.acquire({ id: "a", name: "a", tenant }, MODEL, 70);
    expect(a.ok).toBe(true);
    expect(verdict(limiter.acquire({ id: "b", name: "b", tenant }, MODEL, 40))).toBe(
      "tenant-budget:60",
    );
    if (a.ok) a.settle(20); // 20 used: 80 left
    expect(verdict(limiter.acquire({ id: "b", name: "b", tenant }, MODEL, 80))).toBe("ok");
  });

  it("adds to a standing what this router charged after the report it answers was sealed", () => {
    const { clock, limiter } = setup(Date.UTC(2026, 0, 31, 12));
    const key = { id: "k", name: "k", budgets: [{ period: "day" as const, tokens: 1000 }] };
    const dayStart = Date.UTC(2026, 0, 31);
    const charge = (tokens: number) => {
      const lease = limiter.acquire(key, MODEL, tokens);
      expect(lease.ok).toBe(true);
      if (lease.ok) lease.settle(tokens);
    };
    charge(100); // in the report sealed below
    clock.advance(1_500);
    const sealedAt = clock.now();
    clock.advance(1_000);
    charge(30); // after the seal: in no report answered yet
    clock.advance(1_000);
    // 850 cluster-wide, this router's 100 included: 850 + 30 used, 120 left.
    limiter.applyStandings(
      [{ keyId: "k", period: "day", model: "", periodStartMs: dayStart, usedTokens: 850 }],
      clock.now(),
      sealedAt,
    );
    expect(verdict(limiter.acquire(key, MODEL, 121))).toMatch(/^key-budget:/);
    expect(verdict(limiter.acquire(key, MODEL, 120))).toBe("ok");
  });

  it("keeps local charges in a bounded list, merging the oldest, never dropping one too early", () => {
    const { clock, limiter } = setup(Date.UTC(2026, 0, 31, 12));
    const key = { id: "k", name: "k", budgets: [{ period: "day" as const, tokens: 30 }] };
    const start = clock.now();
    for (let i = 0; i < 20; i++) {
      const lease = limiter.acquire(key, MODEL, 1);
      if (lease.ok) lease.settle(1);
      clock.advance(1_000);
    }
    const standing = (usedTokens: number, includedUpToMs: number) =>
      limiter.applyStandings(
        [
          {
            keyId: "k",
            period: "day",
            model: "",
            periodStartMs: Date.UTC(2026, 0, 31),
            usedTokens,
          },
        ],
        clock.now(),
        includedUpToMs,
      );
    // The first 6 seconds are in the standing, but merged with later ones: all 20 stay
    // counted (6 + 20 + 5 > 30), where dropping the 6 would admit 5 (6 + 14 + 5 ≤ 30).
    standing(6, start + 6_000);
    expect(verdict(limiter.acquire(key, MODEL, 5))).toMatch(/^key-budget:/);
    // Every second covered: the standing alone counts.
    standing(6, clock.now());
    expect(verdict(limiter.acquire(key, MODEL, 24))).toBe("ok");
  });

  it("drops every local charge up to asOfMs when not told when the report was sealed", () => {
    const { clock, limiter } = setup(Date.UTC(2026, 0, 31, 12));
    const key = { id: "k", name: "k", budgets: [{ period: "day" as const, tokens: 1000 }] };
    const lease = limiter.acquire(key, MODEL, 500);
    if (lease.ok) lease.settle(500);
    clock.advance(1_000);
    limiter.applyStandings(
      [
        {
          keyId: "k",
          period: "day",
          model: "",
          periodStartMs: Date.UTC(2026, 0, 31),
          usedTokens: 500,
        },
      ],
      clock.now(),
    );
    expect(verdict(limiter.acquire(key, MODEL, 500))).toBe("ok");
  });

  it("ignores a standing of an earlier period, and an answer older than the last", () => {
    const { limiter } = setup(Date.UTC(2026, 1, 1, 0, 0, 5));
    const budgets = [
      { period: "day" as const, tokens: 100 },
      { period: "month" as const, tokens: 100 },
    ];
    const key = { id: "k", name: "k", budgets };
    limiter.applyStandings(
      [
        // Yesterday's and last month's: a new period has begun here.
        {
          keyId: "k",
          period: "day",
          model: "",
          periodStartMs: Date.UTC(2026, 0, 31),
          usedTokens: 100,
        },
        {
          keyId: "k",
          period: "month",
          model: "",
          periodStartMs: Date.UTC(2026, 0, 1),
          usedTokens: 100,
        },
      ],
      Date.UTC(2026, 0, 31, 23, 59, 59),
    );
    const fresh = limiter.acquire(key, MODEL, 100);
    expect(verdict(fresh)).toBe("ok");
    if (fresh.ok) fresh.settle(0);
    const today = Date.UTC(2026, 1, 1);
    limiter.applyStandings(
      [{ keyId: "k", period: "day", model: "", periodStartMs: today, usedTokens: 10 }],
      today + 5_000,
    );
    limiter.applyStandings(
      [{ keyId: "k", period: "day", model: "", periodStartMs: today, usedTokens: 100 }],
      today + 4_000, // crossed with the newer answer
    );
    expect(verdict(limiter.acquire({ ...key, budgets: budgets.slice(0, 1) }, MODEL, 90))).toBe(
      "ok",
    );
  });

  it("keeps the estimates of requests in flight on top of a standing", () => {
    const { limiter } = setup();
    const tenant: TenantInfo = { name: "t", weight: 1, budgets: [{ period: "day", tokens: 100 }] };
    const key = { id: "k", name: "k", tenant };
    const running = limiter.acquire(key, MODEL, 50);
    expect(running.ok).toBe(true);
    limiter.applyStandings(
      [
        {
          tenant: "t",
          period: "day",
          model: "",
          periodStartMs: Date.UTC(2026, 0, 31),
          usedTokens: 40,
        },
      ],
      LAST_MINUTE,
    );
    expect(verdict(limiter.acquire(key, MODEL, 11))).toBe("tenant-budget:60");
    expect(verdict(limiter.acquire(key, MODEL, 10))).toBe("ok");
  });
});

describe("limiter: bounded state", () => {
  it("keeps at most its bounds over 10,000 keys of 100 tenants", () => {
    const clock = createManualClock(Date.UTC(2026, 0, 1));
    const limiter = createLimiter({
      clock,
      wallNow: clock.now,
      maxKeys: 1_000,
      maxTenants: 50,
      maxBudgetCounters: 2_000,
    });
    const tenants: TenantInfo[] = Array.from({ length: 100 }, (_, i) => ({
      name: `t${i}`,
      weight: 1,
      tpm: 1_000_000,
      budgets: [{ period: "day", tokens: 1e9 }],
    }));
    for (let round = 0; round < 2; round++) {
      for (let i = 0; i < 10_000; i++) {
        const key: ApiKeyInfo = {
          id: `k${i}`,
          name: `k${i}`,
          rpm: 100,
          tenant: tenants[i % 100] as TenantInfo,
          budgets: [{ period: "month", tokens: 1e9 }],
        };
        const lease = limiter.acquire(key, MODEL, 10);
        expect(lease.ok).toBe(true);
        if (lease.ok) {
          lease.settle(12);
          lease.release();
        }
      }
    }
    expect(limiter.stats()).toEqual({ keys: 1_000, tenants: 50, budgetCounters: 2_000 });
  });

  it("drops the key not used since, not the oldest one used again", () => {
    const limiter = createLimiter({ clock: createManualClock(), maxKeys: 2 });
    // One request a minute, ended at once: a state kept refuses the key's next request.
    const use = (id: string): string => {
      const lease = limiter.acquire({ id, name: id, rpm: 1 }, MODEL, 1);
      if (lease.ok) lease.release();
      return verdict(lease);
    };
    expect([use("a"), use("b"), use("a")]).toEqual(["ok", "ok", "key-rpm:60"]);
    // A third key: "b" goes (unused since it came), "a" stays (used again after "b").
    expect([use("c"), use("a"), use("b")]).toEqual(["ok", "key-rpm:60", "ok"]);
    expect(limiter.stats().keys).toBe(2);
  });

  it("never drops the state of a key with a request in flight", () => {
    const limiter = createLimiter({ clock: createManualClock(), maxKeys: 1 });
    const held = limiter.acquire({ id: "a", name: "a", maxConcurrency: 1 }, MODEL, 1);
    expect(held.ok).toBe(true);
    limiter.acquire({ id: "b", name: "b", maxConcurrency: 1 }, MODEL, 1);
    expect(verdict(limiter.acquire({ id: "a", name: "a", maxConcurrency: 1 }, MODEL, 1))).toBe(
      "key-concurrency:1",
    );
  });
});
