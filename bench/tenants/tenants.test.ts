import { describe, expect, it } from "vitest";
import { lastJson, runQuick } from "../lib/smoke.js";

// Smoke only: quick mode (2 engines, one round of the three scenarios, 5 s windows) runs to
// the end and prints its tables and JSON. The goals are for people reading the benchmark, not
// for assertions on a shared box; what is asserted here does not depend on the box's speed.
describe("bench/tenants/run.ts --quick", () => {
  it("runs every scenario, answers critical, refuses part of the burst, prints both tables", async () => {
    const { code, stdout, stderr } = await runQuick(new URL("./run.ts", import.meta.url), 120_000);
    expect(code, stderr.slice(-2000)).toBe(0);
    expect(stdout).toMatch(/scenario\s+critical ok\/sent\s+429\s+TTFT p50 \/ p90 \/ p99 ms/);
    expect(stdout).toMatch(/goal\s+measured\s+met/);
    const result = lastJson<{
      bench: string;
      mode: string;
      children: string;
      rows: {
        scenario: string;
        criticalSent: number;
        criticalOk: number;
        criticalFailed: number;
        batchSent: number;
        batchRefused: Record<string, number>;
        batchFailed: number;
      }[];
      goals: { goal: string }[];
    }>(stdout);
    expect(result).toMatchObject({ bench: "tenants", mode: "quick" });
    // The router and engines ran bundled, as `llmgw router` ships, not from source.
    expect(result.children).toBe("bundled as shipped (tsup)");
    expect(result.rows.map((r) => r.scenario)).toEqual([
      "critical alone",
      "burst, priorities",
      "burst, no priorities",
    ]);
    for (const r of result.rows) {
      expect(r.criticalSent).toBeGreaterThan(0);
      expect(r.criticalOk).toBeGreaterThan(0);
      // Refused (429) or abandoned at the window's end is expected; an error is not.
      expect(r.criticalFailed + r.batchFailed, r.scenario).toBe(0);
    }
    // A burst of 10× the capacity outruns the router's queue: part of it is refused as 429s
    // naming the queue (`x-llmgw-limit`).
    const burst = result.rows.filter((r) => r.batchSent > 0);
    expect(burst).toHaveLength(2);
    for (const r of burst) expect(r.batchRefused.queue_full ?? 0).toBeGreaterThan(0);
    expect(result.goals).toHaveLength(3);
  }, 150_000);

  it("refuses a bad flag before starting anything", async () => {
    const { code, stderr } = await runQuick(new URL("./run.ts", import.meta.url), 60_000, [
      "--burst",
      "0",
    ]);
    expect(code).not.toBe(0);
    expect(stderr).toContain("--burst 0: expected a positive number");
  }, 90_000);
});
