import { spawnSync } from "node:child_process";
import {
  type ClusterExposition,
  createClusterCollector,
  createMetricsEndpoint,
  createMetricsRegistry,
  createRouterMetrics,
} from "@llmgw/metrics-collector";
import { buildSyntheticCluster, exerciseRouterMetrics } from "@llmgw/metrics-collector/testing";
import { describe, expect, it } from "vitest";

const promtool = spawnSync("promtool", ["--version"], { encoding: "utf8" });
const hasPromtool = promtool.status === 0;
if (!hasPromtool) {
  console.warn(
    "promtool not on PATH: skipping `promtool check metrics` (Debian: apt-get install -y prometheus)",
  );
}

async function exposition(mode: ClusterExposition = "registry"): Promise<string> {
  const registry = createMetricsRegistry();
  const view = buildSyntheticCluster({ nodes: 40, gpusPerNode: 8, replicas: 30 });
  view.updateNode("node-0001", (n) => ({
    ...n,
    hostname: `evil"\\\n\r\u0000\u2028${"h".repeat(5000)}`,
  }));
  const cluster = createClusterCollector(registry, view, { exposition: mode });
  exerciseRouterMetrics(
    createRouterMetrics(registry, { workerPool: () => ({ utilizationRatio: 0.5, queueSize: 2 }) }),
  );
  return createMetricsEndpoint({ registry, cluster }).metrics();
}

describe.skipIf(!hasPromtool)("promtool check metrics (promtool present)", () => {
  it.each(["registry", "text"] as const)(
    "accepts the whole exposition (cluster + router, %s path) without lint problems",
    async (mode) => {
      const text = await exposition(mode);
      const result = spawnSync("promtool", ["check", "metrics"], { input: text, encoding: "utf8" });
      expect(`${result.stdout}${result.stderr}`.trim()).toBe("");
      expect(result.status).toBe(0);
    },
  );

  it("is a test that can fail: promtool flags a counter without _total", () => {
    const bad = "# HELP llmgw_bad A counter.\n# TYPE llmgw_bad counter\nllmgw_bad 1\n";
    const result = spawnSync("promtool", ["check", "metrics"], { input: bad, encoding: "utf8" });
    expect(result.status).not.toBe(0);
    expect(result.stdout + result.stderr).toContain('counter metrics should have "_total" suffix');
  });
});
