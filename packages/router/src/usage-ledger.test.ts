import { describe, expect, it } from "vitest";
import { GpuShares, type RequestUsage, UsageLedger } from "./usage-ledger.js";

const use = (p: number, c: number, extra: Partial<RequestUsage> = {}): RequestUsage => ({
  promptTokens: p,
  completionTokens: c,
  gpuMs: 0,
  estimated: false,
  refused: false,
  ...extra,
});

describe("UsageLedger", () => {
  it("sums requests per UTC minute, key, tenant and model, and starts over when sealed", () => {
    const l = new UsageLedger();
    const t = Date.UTC(2026, 11, 31, 23, 59, 10);
    l.add(t, "k1", "team", "m", use(10, 2, { cachedTokens: 4, gpuMs: 1.4 }));
    l.add(t + 40_000, "k1", "team", "m", use(5, 1, { gpuMs: 1.4, estimated: true }));
    l.add(t + 55_000, "k1", "team", "m", use(1, 1, { refused: true, estimated: true }));
    l.add(t, "k2", "", "m", use(7, 7));
    const batch = l.seal();
    expect(batch).toEqual([
      {
        minuteMs: Date.UTC(2026, 11, 31, 23, 59),
        keyId: "k1",
        tenant: "team",
        model: "m",
        requests: 2,
        promptTokens: 15,
        // Of the one request whose engine reported them: the estimate's are unknown.
        cachedTokens: 4,
        cachedReported: 1,
        completionTokens: 3,
        gpuMs: 3,
        estimatedRequests: 1,
        refusedUsage: 0,
      },
      expect.objectContaining({ minuteMs: Date.UTC(2027, 0, 1), requests: 1, refusedUsage: 1 }),
      expect.objectContaining({ keyId: "k2", promptTokens: 7, cachedTokens: 0, cachedReported: 0 }),
    ]);
    expect(l.size).toBe(0);
    expect(l.seal()).toEqual([]);
  });

  it("counts a reported 0 cached tokens as reported, and an unreported count as unknown", () => {
    const l = new UsageLedger();
    l.add(0, "k", "", "m", use(10, 1, { cachedTokens: 0 }));
    l.add(0, "k", "", "m", use(10, 1));
    l.add(0, "k", "", "m", use(10, 1, { cachedTokens: 6 }));
    expect(l.seal()).toEqual([
      expect.objectContaining({ requests: 3, cachedTokens: 6, cachedReported: 2 }),
    ]);
  });

  it("says when it is full instead of dropping anything", () => {
    const l = new UsageLedger({ maxEntries: 2 });
    l.add(0, "a", "", "m", use(1, 1));
    expect(l.full).toBe(false);
    l.add(0, "b", "", "m", use(1, 1));
    expect(l.full).toBe(true);
    l.add(0, "c", "", "m", use(1, 1));
    expect(l.seal()).toHaveLength(3);
  });
});

describe("GpuShares (each request's share of its replica's GPUs)", () => {
  it("charges g GPUs for a request alone, and splits them between concurrent ones", () => {
    const g = new GpuShares();
    // 8 GPUs. A alone for 1 s, then A and B together for 2 s, then B alone for 1 s.
    const a = g.start("r", 8, 0);
    const b = g.start("r", 8, 1000);
    expect(g.end("r", a, 3000)).toBeCloseTo(8 * 1000 + 4 * 2000);
    expect(g.end("r", b, 4000)).toBeCloseTo(4 * 2000 + 8 * 1000);
    expect(g.size).toBe(0);
  });

  it("divides by the engine's running count when other routers fill the replica", () => {
    const g = new GpuShares();
    const a = g.start("r", 2, 0, 4);
    expect(g.end("r", a, 1000)).toBeCloseTo(500);
  });

  it("charges nothing for an unknown GPU count or a replica it never saw start", () => {
    const g = new GpuShares();
    expect(g.end("r", g.start("r", 0, 0), 5000)).toBe(0);
    expect(g.end("x", 0, 5000)).toBe(0);
  });
});
