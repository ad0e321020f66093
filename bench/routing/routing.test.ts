import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { lastJson, runQuick } from "../lib/smoke.js";
import type { RequestSample } from "./client.js";

describe("bench/routing/run.ts --quick", () => {
  it("answers every request of every workload, target and sweep rung, and prints the tables", async () => {
    const samplesDir = mkdtempSync(join(tmpdir(), "llmgw-routing-samples-"));
    const { code, stdout, stderr } = await runQuick(new URL("./run.ts", import.meta.url), 240_000, [
      "--samples",
      samplesDir,
    ]);
    expect(code, stderr.slice(-2000)).toBe(0);
    expect(stdout).toMatch(/workload\s+target\s+ok\/sent\s+TTFT/);
    expect(stdout).toMatch(/workload\s+target\s+goodput req\/s/);
    type Row = { workload: string; target: string; requests: number; ok: number; errors: string[] };
    const result = lastJson<{
      rows: Row[];
      sweepRows: Row[];
      skipped: string[];
      children: string;
    }>(stdout);
    // The router and engines ran bundled, as `llmgw router` ships, not from source.
    expect(result.children).toBe("bundled as shipped (tsup)");
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
    // --samples: every measurement's requests, one file each (the warm-up's too).
    const files = readdirSync(samplesDir);
    const rows = [...result.rows, ...result.sweepRows];
    expect(files.length).toBeGreaterThanOrEqual(rows.length);
    let written = 0;
    for (const file of files) {
      const samples = JSON.parse(readFileSync(join(samplesDir, file), "utf8")) as RequestSample[];
      expect(samples.length, file).toBeGreaterThan(0);
      for (const s of samples) expect(typeof s.session === "string" && s.ok, file).toBe(true);
      written += samples.length;
    }
    expect(written).toBeGreaterThanOrEqual(rows.reduce((n, r) => n + r.requests, 0));
    rmSync(samplesDir, { recursive: true, force: true });
  }, 300_000);
});
