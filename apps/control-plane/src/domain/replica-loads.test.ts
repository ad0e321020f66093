import type { ReplicaLoadSample } from "@llmgw/router";
import { describe, expect, it } from "vitest";
import { LOAD_REFRESH_MS, ReplicaLoads } from "./replica-loads.js";

describe("ReplicaLoads", () => {
  const setup = () => {
    const lines: string[] = [];
    const loads = new ReplicaLoads((line) => lines.push(line));
    const samples: ReplicaLoadSample[] = [];
    loads.onLoad((s) => samples.push(s));
    return { loads, lines, samples };
  };

  it("writes load in place into the object routes hold, and announces only news", () => {
    const { loads, samples } = setup();
    const held = loads.held("r-0");
    expect(held.load).toEqual({});
    expect(loads.reported("r-0")).toBeUndefined();
    // Unknown load that stays unknown is not news.
    loads.apply("n-1", "r-0", {}, 1_000);
    expect(samples).toEqual([]);
    loads.apply("n-1", "r-0", { running: 2, waiting: 1 }, 1_000);
    expect(held.load).toEqual({ running: 2, waiting: 1 });
    expect(loads.reported("r-0")?.reportedAtMs).toBe(1_000);
    // The same load again: not news until it is LOAD_REFRESH_MS old.
    loads.apply("n-1", "r-0", { running: 2, waiting: 1 }, 1_000 + LOAD_REFRESH_MS - 1);
    loads.apply("n-1", "r-0", { running: 2, waiting: 1 }, 1_000 + LOAD_REFRESH_MS);
    expect(samples.map((s) => [s.load, s.reportedAtMs])).toEqual([
      [{ running: 2, waiting: 1 }, 1_000],
      [{ running: 2, waiting: 1 }, 1_000 + LOAD_REFRESH_MS],
    ]);
    // Samples are copies: the held load goes on changing, an announced sample does not.
    loads.apply("n-1", "r-0", { running: 3 }, 7_000);
    expect(held.load).toEqual({ running: 3, waiting: undefined });
    expect(samples[0]?.load).toEqual({ running: 2, waiting: 1 });
    expect(samples.at(-1)?.load).toEqual({ running: 3 });
  });

  it("leaves an out-of-range field out as unreported, logging it once while it stays bad", () => {
    const { loads, lines, samples } = setup();
    loads.apply("n-1", "r-0", { running: 1, kvCacheUsage: 1.5 }, 1_000);
    loads.apply("n-1", "r-0", { running: 2, kvCacheUsage: 1.5 }, 2_000);
    expect(samples.map((s) => s.load)).toEqual([{ running: 1 }, { running: 2 }]);
    expect(lines).toEqual([
      "replica r-0: node n-1 reported load out of range, left out as unreported: kvCacheUsage=1.5",
    ]);
    loads.apply("n-1", "r-0", { running: 2, kvCacheUsage: 0.5 }, 3_000);
    loads.apply("n-1", "r-0", { running: 2, kvCacheUsage: 2 }, 4_000);
    expect(lines).toHaveLength(2);
  });

  it("forgets a replica: its next load starts from unknown, its bad fields logged again", () => {
    const { loads, lines } = setup();
    loads.apply("n-1", "r-0", { running: 1, kvCacheUsage: 9 }, 1_000);
    loads.forget("r-0");
    expect(loads.reported("r-0")).toBeUndefined();
    loads.apply("n-2", "r-0", { kvCacheUsage: 9 }, 2_000);
    expect(lines).toHaveLength(2);
    expect(lines[1]).toMatch(/^replica r-0: node n-2 reported load out of range/);
  });
});
