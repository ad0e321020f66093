import { describe, expect, it } from "vitest";
import { lastJson, runQuick } from "../lib/smoke.js";

// Smoke only: quick mode (50 agents, 5 s windows) runs to the end and prints its tables and
// JSON. The numbers are for people reading the benchmark, not for assertions on a shared box.
describe("bench/control-plane/run.ts --quick", () => {
  it("completes the baseline, steady window and lost-node phases and prints the tables", async () => {
    const { code, stdout, stderr } = await runQuick(new URL("./run.ts", import.meta.url), 115_000);
    expect(code, stderr.slice(-2000)).toBe(0);
    expect(stdout).toMatch(/steady window\s+no-op AgentService\s+control plane\s+goal/);
    expect(stdout).toMatch(/heartbeat p99 \(ms, client side\)/);
    expect(stdout).toMatch(/lost → READY elsewhere \(ms\)/);
    const result = lastJson<{ bench: string; quick: boolean; controlPlane: { lostNode: object } }>(
      stdout,
    );
    expect(result).toMatchObject({ bench: "control-plane", quick: true });
    expect(result.controlPlane.lostNode).toBeDefined();
  }, 120_000);
});
