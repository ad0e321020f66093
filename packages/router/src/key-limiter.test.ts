import { describe, expect, it } from "vitest";
import { createManualClock } from "./clock.js";
import { createKeyLimiter, type KeyLimitOutcome } from "./key-limiter.js";

const verdict = (o: KeyLimitOutcome) =>
  o.ok ? "ok" : `${o.reason}:${o.retryAfterSeconds ?? `never(${o.reserved}>${o.tpm})`}`;

describe("key limiter", () => {
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
      expected: ["ok", "ok", "rpm:30"],
    },
    {
      name: "tpm 100",
      key: { id: "k", name: "k", tpm: 100 },
      tokens: [60, 30, 20],
      expected: ["ok", "ok", "tpm:6"],
    },
    {
      name: "max concurrency 2 (nothing released)",
      key: { id: "k", name: "k", maxConcurrency: 2 },
      tokens: [1, 1, 1],
      expected: ["ok", "ok", "concurrency:1"],
    },
  ])("$name", ({ key, tokens, expected }) => {
    const limiter = createKeyLimiter({ clock: createManualClock() });
    expect(tokens.map((t) => verdict(limiter.acquire(key, t)))).toEqual(expected);
  });

  it("refuses, with no retry time, a request that reserves more than the whole tpm", () => {
    const limiter = createKeyLimiter({ clock: createManualClock() });
    const key = { id: "k", name: "k", tpm: 100 };
    // Even on a full bucket: admitting it would let one request spend many minutes' budget.
    expect(verdict(limiter.acquire(key, 101))).toBe("tpm:never(101>100)");
    expect(verdict(limiter.acquire(key, 100))).toBe("ok");
  });

  it("refills rpm over time and frees concurrency on release", () => {
    const clock = createManualClock();
    const limiter = createKeyLimiter({ clock });
    const key = { id: "k", name: "k", rpm: 1, maxConcurrency: 1 };
    const first = limiter.acquire(key, 1);
    expect(verdict(limiter.acquire(key, 1))).toBe("concurrency:1");
    if (first.ok) first.release();
    expect(verdict(limiter.acquire(key, 1))).toBe("rpm:60");
    clock.advance(60_000);
    expect(verdict(limiter.acquire(key, 1))).toBe("ok");
  });
});

describe("key limiter: settling to the real token count", () => {
  const key = { id: "k", name: "k", tpm: 100 };

  it("charges what the engine reported, not what was reserved", () => {
    const limiter = createKeyLimiter({ clock: createManualClock() });
    const first = limiter.acquire(key, 10);
    expect(first.ok).toBe(true);
    if (first.ok) first.settle(90); // used 90, reserved 10: 10 tokens left
    expect(verdict(limiter.acquire(key, 20))).toBe("tpm:6");
    expect(verdict(limiter.acquire(key, 10))).toBe("ok");
  });

  it("refunds a reservation the answer did not use", () => {
    const limiter = createKeyLimiter({ clock: createManualClock() });
    const first = limiter.acquire(key, 100);
    expect(verdict(limiter.acquire(key, 50))).toBe("tpm:30");
    if (first.ok) first.settle(40);
    expect(verdict(limiter.acquire(key, 60))).toBe("ok");
  });

  it("holds a key that ran far over back until its whole debt is refilled", () => {
    const clock = createManualClock();
    const limiter = createKeyLimiter({ clock });
    const first = limiter.acquire(key, 100);
    if (first.ok) first.settle(1_300); // 1,200 over: twelve minutes' budget of debt
    expect(verdict(limiter.acquire(key, 10))).toBe("tpm:726");
    clock.advance(12 * 60_000);
    expect(verdict(limiter.acquire(key, 10))).toBe("tpm:6");
    clock.advance(6_000);
    expect(verdict(limiter.acquire(key, 10))).toBe("ok");
  });

  it("settles against the bucket as refilled by then", () => {
    const clock = createManualClock();
    const limiter = createKeyLimiter({ clock });
    const first = limiter.acquire(key, 100);
    clock.advance(60_000); // full again by the time the answer ends
    if (first.ok) first.settle(150); // 50 more than reserved
    expect(verdict(limiter.acquire(key, 60))).toBe("tpm:6");
    expect(verdict(limiter.acquire(key, 50))).toBe("ok");
  });

  it.each([
    ["negative", -5],
    ["NaN", Number.NaN],
    ["fractional", 12.5],
    ["infinite", Number.POSITIVE_INFINITY],
    ["huge", 2 ** 40],
  ])("keeps the estimate for a %s count", (_name, count) => {
    const limiter = createKeyLimiter({ clock: createManualClock() });
    const first = limiter.acquire(key, 60);
    if (first.ok) first.settle(count);
    expect(verdict(limiter.acquire(key, 41))).toBe("tpm:1");
    expect(verdict(limiter.acquire(key, 40))).toBe("ok");
  });

  it("settles once", () => {
    const limiter = createKeyLimiter({ clock: createManualClock() });
    const first = limiter.acquire(key, 10);
    if (first.ok) {
      first.settle(50);
      first.settle(0);
    }
    expect(verdict(limiter.acquire(key, 51))).toBe("tpm:1");
  });
});
