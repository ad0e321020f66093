import { describe, expect, it } from "vitest";
import { lastJson, runQuick } from "../lib/smoke.js";

describe("bench/faults/run.ts --quick", () => {
  it("measures three faults end to end, prints the table and exits 0", async () => {
    const { code, stdout, stderr } = await runQuick(new URL("./run.ts", import.meta.url), 110_000);
    expect(code, `${stderr.slice(-3000)}\n${stdout.slice(-2000)}`).toBe(0);
    expect(stdout).toMatch(/hb\s+#\s+Xid\s+action\s+node\s+gpu\s+repeat\s+routed ms\s+admin ms/);
    expect(stdout).toMatch(/\(a\) routing stop/);
    const result = lastJson<{
      faults: { code: number; routingStopMs?: number; replacementReadyMs?: number }[];
    }>(stdout);
    expect(result.faults.map((f) => f.code)).toEqual([48, 95, 119]);
    // Measured, not judged: numbers on a shared 2-core box are the report's business.
    for (const f of result.faults) {
      expect(f.routingStopMs).toBeTypeOf("number");
      expect(f.replacementReadyMs).toBeTypeOf("number");
    }
  }, 120_000);
});
