import { describe, expect, it } from "vitest";
import { lastJson, runQuick } from "../lib/smoke.js";

describe("bench/routing/run.ts --quick", () => {
  it("answers every request of every workload and target, and prints the table", async () => {
    const { code, stdout, stderr } = await runQuick(new URL("./run.ts", import.meta.url), 240_000);
    expect(code, stderr.slice(-2000)).toBe(0);
    expect(stdout).toMatch(/workload\s+target\s+ok\/sent\s+TTFT/);
    const result = lastJson<{
      rows: { workload: string; target: string; requests: number; ok: number; errors: string[] }[];
      skipped: string[];
    }>(stdout);
    expect(result.rows.length).toBeGreaterThanOrEqual(3 * 3); // 3 workloads × the llmgw policies
    for (const row of result.rows) {
      expect({ where: `${row.workload} / ${row.target}`, ok: row.ok, errors: row.errors }).toEqual({
        where: `${row.workload} / ${row.target}`,
        ok: row.requests,
        errors: [],
      });
      expect(row.requests).toBeGreaterThan(0);
    }
  }, 300_000);
});
