import { describe, expect, it } from "vitest";
import { lastJson, runQuick } from "../lib/smoke.js";

describe("bench/soak/run.ts --quick", () => {
  it("answers every request through every fault and planned change of the three phases, prints the tables and exits 0", async () => {
    const { code, stdout, stderr } = await runQuick(new URL("./run.ts", import.meta.url), 400_000);
    expect(code, `${stderr.slice(-3000)}\n${stdout.slice(-2000)}`).toBe(0);
    expect(stdout).toMatch(/fault\s+at s\s+requests\s+ok\s+error\s+cp-down\s+BAD/);
    expect(stdout).toMatch(/sent\s+classified\s+ok\s+error/);
    expect(stdout).toMatch(/event\s+at s\s+took s\s+healed \+s\s+requests\s+ok\s+by leaving/);
    const result = lastJson<{
      phases: {
        phase: string;
        faults: { kind: string; planned?: { minCapacity?: number } }[];
        totals: { sent: number; classified: number; byClass: Record<string, number> };
      }[];
    }>(stdout);
    expect(result.phases.map((p) => [p.phase, p.faults.map((f) => f.kind)])).toEqual([
      [
        "single",
        [
          "engine-kill",
          "agent-restart",
          "control-plane-restart",
          "control-plane-kill",
          "slow-replica",
        ],
      ],
      ["routers", ["control-plane-kill", "control-plane-down", "router-kill"]],
      [
        "lifecycle",
        ["scale-down", "scale-up", "rolling-update", "node-drain", "agent-leave", "undeploy"],
      ],
    ]);
    // Every planned change was observed (its capacity polled), the faults carry no such figures.
    const planned = result.phases.flatMap((p) => p.faults.filter((f) => f.planned));
    expect(planned.map((f) => f.kind)).toEqual(result.phases[2]?.faults.map((f) => f.kind));
    for (const f of planned) expect(f.planned?.minCapacity).toBeGreaterThan(0);
    for (const { totals } of result.phases) {
      expect(totals.sent).toBeGreaterThan(0);
      // A soak where nothing succeeded measured nothing (e.g. a stale CLI build without the router).
      expect(totals.byClass.ok).toBeGreaterThan(0);
      // Nothing lost, nothing hung: the only things asserted, because they cannot flake.
      expect(totals.classified).toBe(totals.sent);
      expect(totals.byClass.hang).toBe(0);
    }
    expect(stderr).not.toMatch(/engines still alive/);
  }, 410_000);

  it("refuses an unknown phase before starting anything", async () => {
    const { code, stderr } = await runQuick(new URL("./run.ts", import.meta.url), 60_000, [
      "--phases",
      "single,nope",
    ]);
    expect(code).not.toBe(0);
    expect(stderr).toContain("--phases: no such phase nope");
  }, 90_000);
});
