import { Registry } from "prom-client";
import { describe, expect, it } from "vitest";
import { createClusterCollector } from "./cluster-collector.js";
import { LabelCache, walkClusterSeriesYielding } from "./cluster-series.js";
import { type LentExposition, renderClusterBytes } from "./cluster-text.js";
import type { ClusterView } from "./cluster-view.js";
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
      collector.renderClusterMetricsChunksYielding(),
      collector.renderClusterMetricsChunksYielding(),
    ]);
    spinning = false;
    // Scrapes during a render share it: the very same chunks.
    expect(b.chunks).toEqual(a.chunks);
    expect(b.chunks.every((chunk, i) => chunk === a.chunks[i])).toBe(true);
    const joined = Buffer.concat(a.chunks);
    expect(joined.length).toBe(a.byteLength);
    expect(joined.equals(renderClusterBytes(view, 128))).toBe(true);
    a.release();
    b.release();
    expect((await collector.renderClusterMetricsBytesYielding()).equals(joined)).toBe(true);
    // 76k samples take well over one 5 ms slice on any machine.
    expect(turns).toBeGreaterThan(1);
    const endpoint = createMetricsEndpoint({ registry: new Registry(), cluster: collector });
    expect((await endpoint.body()).equals(Buffer.from(await endpoint.metrics(), "utf8"))).toBe(
      true,
    );
  });

  it("never writes over chunks a scrape still holds, and reuses their memory once released", async () => {
    const base = buildSyntheticCluster({ nodes: 20, gpusPerNode: 8, replicas: 10 });
    let temperature = 40;
    // Every render sees new readings, as after a round of heartbeats.
    const view: ClusterView = {
      deployments: () => base.deployments(),
      replicas: () => base.replicas(),
      nodes: () =>
        base.nodes().map((n) => ({
          ...n,
          gpus: n.gpus.map((g) => ({ ...g, temperatureCelsius: temperature })),
        })),
    };
    const collector = createClusterCollector(new Registry(), view, { exposition: "text" });
    const text = (lent: LentExposition) => Buffer.concat(lent.chunks).toString("utf8");
    const first = await collector.renderClusterMetricsChunksYielding();
    const firstText = text(first);
    expect(firstText).toContain("} 40\n");
    // Two scrapes share the second render; one lets go of it early.
    temperature = 41;
    const [second, sharer] = await Promise.all([
      collector.renderClusterMetricsChunksYielding(),
      collector.renderClusterMetricsChunksYielding(),
    ]);
    const secondText = text(second);
    second.release();
    second.release(); // idempotent: it does not count for the sharer
    temperature = 42;
    const third = await collector.renderClusterMetricsChunksYielding();
    // Still being sent: neither the first render nor the shared second moved.
    expect(text(first)).toBe(firstText);
    expect(text(sharer)).toBe(secondText);
    expect(secondText).toContain("} 41\n");
    expect(text(third)).toContain("} 42\n");
    // The family headers are the same constant chunks in every render; the samples are lent.
    const headers = new Set(first.chunks.filter((c) => third.chunks.includes(c)));
    const memoryOf = (lent: LentExposition) =>
      new Set(lent.chunks.filter((c) => !headers.has(c)).map((c) => c.buffer));
    const inUse = new Set([...memoryOf(first), ...memoryOf(sharer)]);
    expect(memoryOf(third).size).toBeGreaterThan(0);
    expect([...memoryOf(third)].some((m) => inUse.has(m))).toBe(false);
    // Once released, renders take turns in the memory released: no new buffers.
    first.release();
    sharer.release();
    third.release();
    const seen = new Set([...memoryOf(first), ...memoryOf(sharer), ...memoryOf(third)]);
    for (const t of [43, 44, 45]) {
      temperature = t;
      const next = await collector.renderClusterMetricsChunksYielding();
      expect(text(next)).toContain(`} ${t}\n`);
      if (t > 43) expect([...memoryOf(next)].every((m) => seen.has(m))).toBe(true);
      for (const m of memoryOf(next)) seen.add(m);
      next.release();
    }
  });
});
