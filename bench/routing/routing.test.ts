import { describe, expect, it } from "vitest";
import { lastJson, runQuick } from "../lib/smoke.js";

describe("bench/routing/run.ts --quick", () => {
  it("answers every request of every workload, target and sweep rung, and prints the tables", async () => {
    const { code, stdout, stderr } = await runQuick(new URL("./run.ts", import.meta.url), 240_000);
    expect(code, stderr.slice(-2000)).toBe(0);
    expect(stdout).toMatch(/workload\s+target\s+ok\/sent\s+TTFT/);
    expect(stdout).toMatch(/workload\s+target\s+goodput req\/s/);
    type Row = { workload: string; target: string; requests: number; ok: number; errors: string[] };
    const result = lastJson<{ rows: Row[]; sweepRows: Row[]; skipped: string[] }>(stdout);
    expect(result.rows.length).toBeGreaterThanOrEqual(3 * 3); // 3 workloads × the llmgw policies
    expect(result.sweepRows.length).toBeGreaterThanOrEqual(2 * 2); // 2 rungs × the llmgw policies
    for (const row of [...result.rows, ...result.sweepRows]) {
      expect({ where: `${row.workload} / ${row.target}`, ok: row.ok, errors: row.errors }).toEqual({
        where: `${row.workload} / ${row.target}`,
        ok: row.requests,
        errors: [],
      });
      expect(row.requests).toBeGreaterThan(0);
    }
  }, 300_000);
});
