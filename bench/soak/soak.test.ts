import { describe, expect, it } from "vitest";
import { lastJson, runQuick } from "../lib/smoke.js";

describe("bench/soak/run.ts --quick", () => {
  it("answers every request through every fault, prints the table and exits 0", async () => {
    const { code, stdout, stderr } = await runQuick(new URL("./run.ts", import.meta.url), 170_000);
    expect(code, `${stderr.slice(-3000)}\n${stdout.slice(-2000)}`).toBe(0);
    expect(stdout).toMatch(/fault\s+at s\s+requests\s+ok\s+error\s+cp-down\s+BAD/);
    expect(stdout).toMatch(/sent\s+classified\s+ok\s+error/);
    const result = lastJson<{
      faults: { kind: string }[];
      totals: { sent: number; classified: number; byClass: Record<string, number> };
    }>(stdout);
    expect(result.faults.map((f) => f.kind)).toEqual([
      "engine-kill",
      "agent-restart",
      "control-plane-restart",
      "slow-replica",
    ]);
    expect(result.totals.sent).toBeGreaterThan(0);
    // A soak where nothing succeeded measured nothing (e.g. a stale CLI build without the router).
    expect(result.totals.byClass.ok).toBeGreaterThan(0);
    // Nothing lost, nothing hung: the only things asserted, because they cannot flake.
    expect(result.totals.classified).toBe(result.totals.sent);
    expect(result.totals.byClass.hang).toBe(0);
    expect(stderr).not.toMatch(/engines still alive/);
  }, 180_000);
});
