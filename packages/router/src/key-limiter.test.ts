import { describe, expect, it } from "vitest";
import { createManualClock } from "./clock.js";
import { createKeyLimiter, type KeyLimitOutcome } from "./key-limiter.js";

const verdict = (o: KeyLimitOutcome) => (o.ok ? "ok" : `${o.reason}:${o.retryAfterSeconds}`);

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
      name: "tpm: oversize request charged the whole budget",
      key: { id: "k", name: "k", tpm: 100 },
      tokens: [500, 1],
      expected: ["ok", "tpm:1"],
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
