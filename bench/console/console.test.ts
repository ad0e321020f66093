import { existsSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { lastJson, runQuick } from "../lib/smoke.js";

const haveChromium = existsSync(process.env.LLMGW_CHROMIUM ?? "/usr/bin/chromium");

// Smoke only: quick mode (40 nodes, one round, 5 s live windows) runs to the end and prints
// its tables and JSON. The numbers are for people reading the benchmark, not for assertions
// on a shared box; what is asserted here does not depend on the box's speed.
describe.skipIf(!haveChromium)("bench/console/run.ts --quick (needs Debian's chromium)", () => {
  it("renders the fleet, keeps it live, and prints both tables", async () => {
    const { code, stdout, stderr } = await runQuick(new URL("./run.ts", import.meta.url), 170_000);
    expect(code, stderr.slice(-2000)).toBe(0);
    expect(stdout).toMatch(/measure\s+static HTML \/ events page\s+console fleet page\s+ratio/);
    expect(stdout).toMatch(/fleet page renders in ≤ 1000 ms/);
    const result = lastJson<{
      bench: string;
      quick: boolean;
      render: { rounds: { console: number; static: number }[] };
      heartbeats: { ok: number; errors: number };
      live: {
        fleet: { secondsWithUpdates: number; seconds: number };
        events: { seconds: number };
      };
    }>(stdout);
    expect(result).toMatchObject({ bench: "console", quick: true });
    expect(result.render.rounds).toHaveLength(1);
    expect(result.render.rounds[0]?.console).toBeGreaterThan(0);
    // Heartbeats went on through the run (a few may time out on a box busy with other tests).
    expect(result.heartbeats.ok).toBeGreaterThan(result.heartbeats.errors);
    // The fleet page changed its DOM while the nodes heartbeat (every 2 s): it is live.
    expect(result.live.fleet.secondsWithUpdates).toBeGreaterThan(0);
    expect(result.live.events.seconds).toBe(5);
  }, 180_000);
});
