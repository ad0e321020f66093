import type { ReplicaLoadSample } from "@llmgw/router";
import { describe, expect, it } from "vitest";
import { LATE_SCRAPE_MAX_MS, LOAD_REFRESH_MS, ReplicaLoads } from "./replica-loads.js";

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

  it.each<[string, [node: string, running: number, scrapedAtMs?: number][], number]>([
    [
      "an older scrape of the same node is ignored",
      [
        ["n-1", 1, 2_000],
        ["n-1", 2, 1_999],
      ],
      1,
    ],
    [
      "the same scrape again is taken",
      [
        ["n-1", 1, 2_000],
        ["n-1", 2, 2_000],
      ],
      2,
    ],
    [
      "a newer scrape is taken",
      [
        ["n-1", 1, 2_000],
        ["n-1", 2, 2_001],
      ],
      2,
    ],
    [
      "another node's clock is not compared",
      [
        ["n-1", 1, 2_000],
        ["n-2", 2, 1_000],
      ],
      2,
    ],
    [
      "heartbeat load (no scrape time) is taken",
      [
        ["n-1", 1, 2_000],
        ["n-1", 2],
      ],
      2,
    ],
    [
      "a scrape older by more than LATE_SCRAPE_MAX_MS is the agent's clock stepped back: taken",
      [
        ["n-1", 1, 60_000],
        ["n-1", 2, 60_000 - LATE_SCRAPE_MAX_MS - 1],
        ["n-1", 3, 60_000 - LATE_SCRAPE_MAX_MS - 2],
      ],
      2,
    ],
    [
      "heartbeat load does not move the scrape order",
      [
        ["n-1", 1, 2_000],
        ["n-1", 2],
        ["n-1", 3, 1_999],
      ],
      2,
    ],
  ])("orders load reports by scrape time: %s", (_, reports, running) => {
    const { loads } = setup();
    for (const [i, [node, r, scrapedAtMs]] of reports.entries())
      loads.apply(node, "r-0", { running: r }, 10_000 + i, scrapedAtMs);
    expect(loads.held("r-0").load.running).toBe(running);
  });

  it("forgets a replica: its next load starts from unknown, its bad fields logged again", () => {
    const { loads, lines } = setup();
    loads.apply("n-1", "r-0", { running: 1, kvCacheUsage: 9 }, 1_000);
    loads.forget("r-0");
    expect(loads.reported("r-0")).toBeUndefined();
    loads.apply("n-2", "r-0", { kvCacheUsage: 9 }, 2_000);
    expect(lines).toHaveLength(2);
    expect(lines[1]).toMatch(/^replica r-0: node n-2 reported load out of range/);
    // And its scrape order: an earlier scrape time is taken again.
    loads.apply("n-2", "r-0", { running: 5 }, 3_000, 9_000);
    loads.forget("r-0");
    loads.apply("n-2", "r-0", { running: 4 }, 4_000, 8_000);
    expect(loads.held("r-0").load.running).toBe(4);
  });
});
