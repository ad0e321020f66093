import { describe, expect, it } from "vitest";
import { lastJson, runQuick } from "../lib/smoke.js";

// Smoke only: quick mode (50 agents, 5 s windows, 4 routers for one round of 4 s windows) runs
// to the end and prints its tables and JSON. The numbers are for people reading the benchmark, not for assertions on a shared box.
describe("bench/control-plane/run.ts --quick", () => {
  it("completes the baselines, steady window, routing and lost-node phases and prints the tables", async () => {
    const { code, stdout, stderr } = await runQuick(new URL("./run.ts", import.meta.url), 175_000);
    expect(code, stderr.slice(-2000)).toBe(0);
    expect(stdout).toMatch(/steady window\s+no-op AgentService\s+control plane \(sqlite\)\s+goal/);
    expect(stdout).toMatch(/heartbeat p99 \(ms, client side\)/);
    expect(stdout).toMatch(/lost → READY elsewhere \(ms\)/);
    expect(stdout).toMatch(/issue 19: 1 \+ 1 \+ 1 steady windows, back to back/);
    expect(stdout).toMatch(
      /CPU per heartbeat \(µs\), each window\s+\d+\s+\d+\s+\d+\s+\d+\.\d\d\s+\d+\.\d\d/,
    );
    expect(stdout).toMatch(/routing goal\s+measured/);
    const result = lastJson<{
      bench: string;
      quick: boolean;
      fastPathBaseline: { steadyWindows: { heartbeats: { count: number; errors: number } }[] };
      controlPlane: {
        lostNode: object;
        routing: {
          windows: {
            churn: boolean;
            loadVia?: string;
            reportLoad: { rpcs: number; errors: number };
            traffic: { requests: number; errors: number; non2xx: number };
          }[];
          summary: { fanOutMissing: number };
        };
      };
    }>(stdout);
    expect(result).toMatchObject({ bench: "control-plane", quick: true });
    expect(result.controlPlane.lostNode).toBeDefined();
    // The do-nothing service through the fast path answered the fleet's heartbeats.
    const fastFloor = result.fastPathBaseline.steadyWindows[0]?.heartbeats;
    expect(fastFloor?.count).toBeGreaterThan(0);
    expect(fastFloor?.errors).toBe(0);
    // Both kinds of window ran, the traffic was answered (by a real router with a real key),
    // and every key change reached every router: none of these depends on the box's speed.
    const windows = result.controlPlane.routing.windows;
    expect(windows.map((w) => w.churn).sort()).toEqual([false, true]);
    // The churn went as StreamLoad messages (what agents do by default), every one taken.
    const churn = windows.find((w) => w.churn);
    expect(churn?.loadVia).toBe("stream");
    expect(churn?.reportLoad.rpcs).toBeGreaterThan(0);
    expect(churn?.reportLoad.errors).toBe(0);
    for (const w of windows) {
      expect(w.traffic.requests).toBeGreaterThan(0);
      expect(w.traffic.errors + w.traffic.non2xx).toBe(0);
    }
    expect(result.controlPlane.routing.summary.fanOutMissing).toBe(0);
  }, 180_000);
});
