import { Registry } from "prom-client";
import { describe, expect, it } from "vitest";
import { createClusterCollector } from "./cluster-collector.js";
import { LabelCache, walkClusterSeriesYielding } from "./cluster-series.js";
import { renderClusterBytes } from "./cluster-text.js";
import { createMetricsEndpoint } from "./metrics-endpoint.js";
import { buildSyntheticCluster } from "./testing/index.js";

const countingSink = () => {
  const seen = { samples: 0 };
  return {
    seen,
    sink: {
      plain: () => {
        seen.samples++;
      },
      shared: () => {
        seen.samples++;
      },
    },
  };
};

describe("yielding cluster render", () => {
  it.each([
    // sliceMs, clock step per node (ms) → pauses for 10 nodes
    [5, 1, 2],
    [1, 1, 10],
    [100, 1, 0],
  ])(
    "slices of %d ms at %d ms per node pause %d times over 10 nodes",
    async (sliceMs, step, pauses) => {
      const view = buildSyntheticCluster({ nodes: 10, gpusPerNode: 2, replicas: 2 });
      let t = 0;
      let paused = 0;
      const { sink, seen } = countingSink();
      const walking = walkClusterSeriesYielding(view, 128, new LabelCache(), sink, {
        sliceMs,
        // Each node's step reads the clock once; advance it as if the node took `step` ms.
        now: () => {
          t += step;
          return t;
        },
        pause: async () => {
          paused++;
        },
      });
      await walking;
      expect(paused).toBe(pauses);
      expect(seen.samples).toBeGreaterThan(0);
    },
  );

  it("renders the same bytes as the synchronous path, with the event loop turning in between", async () => {
    const view = buildSyntheticCluster({ nodes: 1_000, gpusPerNode: 8, replicas: 500 });
    const collector = createClusterCollector(new Registry(), view, { exposition: "text" });
    let turns = 0;
    let spinning = true;
    const spin = () => {
      turns++;
      if (spinning) setImmediate(spin);
    };
    setImmediate(spin);
    const [a, b] = await Promise.all([
      collector.renderClusterMetricsBytesYielding(),
      collector.renderClusterMetricsBytesYielding(),
    ]);
    spinning = false;
    // Scrapes during a render share it.
    expect(b).toBe(a);
    expect(a.equals(renderClusterBytes(view, 128))).toBe(true);
    // 76k samples take well over one 5 ms slice on any machine.
    expect(turns).toBeGreaterThan(1);
    const endpoint = createMetricsEndpoint({ registry: new Registry(), cluster: collector });
    expect((await endpoint.body()).equals(Buffer.from(await endpoint.metrics(), "utf8"))).toBe(
      true,
    );
  });
});
