import { describe, expect, it } from "vitest";
import type { RoutingPolicy } from "./route-table.js";
import { rankCandidates, resolveScoringOptions, type ScoringCandidate } from "./scoring.js";

const opts = resolveScoringOptions();
const c = (
  id: string,
  inFlight: number,
  extra: Partial<ScoringCandidate> = {},
): ScoringCandidate => ({
  id,
  capacity: 4,
  inFlight,
  prefixBlocks: 0,
  errorRate: 0,
  ...extra,
});

describe("rankCandidates", () => {
  it.each<{
    name: string;
    policy: RoutingPolicy;
    candidates: ScoringCandidate[];
    chain: number;
    turn?: number;
    order: string[];
  }>([
    {
      name: "idle tie: rotation decides (turn 0)",
      policy: "llmgw",
      candidates: [c("a", 0), c("b", 0)],
      chain: 0,
      order: ["a", "b"],
    },
    {
      name: "idle tie: rotation decides (turn 1)",
      policy: "llmgw",
      candidates: [c("a", 0), c("b", 0)],
      chain: 0,
      turn: 1,
      order: ["b", "a"],
    },
    {
      name: "lower load wins",
      policy: "llmgw",
      candidates: [c("a", 2), c("b", 1)],
      chain: 0,
      order: ["b", "a"],
    },
    {
      name: "full replicas are not candidates",
      policy: "llmgw",
      candidates: [c("a", 4), c("b", 3)],
      chain: 0,
      order: ["b"],
    },
    {
      name: "affinity beats a little load",
      policy: "llmgw",
      candidates: [c("a", 1, { prefixBlocks: 8 }), c("b", 0)],
      chain: 8,
      order: ["a", "b"],
    },
    {
      name: "bounded load: a hot prefix at low concurrency loses its claim above 1.25× the mean",
      policy: "llmgw",
      // Capacity 64: the utilisation bounds never trigger at these numbers; the mean bound does.
      candidates: [
        c("hot", 5, { prefixBlocks: 8, capacity: 64 }),
        c("b", 2, { capacity: 64 }),
        c("c", 2, { capacity: 64 }),
        c("d", 2, { capacity: 64 }),
      ],
      chain: 8,
      order: ["b", "c", "d", "hot"],
    },
    {
      name: "bounded load: the same prefix keeps its claim while within the bound",
      policy: "llmgw",
      candidates: [
        c("hot", 3, { prefixBlocks: 8, capacity: 64 }),
        c("b", 2, { capacity: 64 }),
        c("c", 2, { capacity: 64 }),
        c("d", 2, { capacity: 64 }),
      ],
      chain: 8,
      order: ["hot", "b", "c", "d"],
    },
    {
      name: "affinity void at 3/4 busy",
      policy: "llmgw",
      candidates: [c("a", 3, { prefixBlocks: 8 }), c("b", 2)],
      chain: 8,
      order: ["b", "a"],
    },
    {
      name: "affinity void when far busier than the least loaded",
      policy: "llmgw",
      candidates: [c("a", 5, { capacity: 8, prefixBlocks: 8 }), c("b", 0, { capacity: 8 })],
      chain: 8,
      order: ["b", "a"],
    },
    {
      name: "longer prefix wins",
      policy: "llmgw",
      candidates: [c("a", 0, { prefixBlocks: 2 }), c("b", 0, { prefixBlocks: 6 })],
      chain: 8,
      order: ["b", "a"],
    },
    {
      name: "engine queue counts",
      policy: "llmgw",
      candidates: [c("a", 0, { load: { waiting: 8 } }), c("b", 1, { load: { waiting: 0 } })],
      chain: 0,
      order: ["b", "a"],
    },
    {
      name: "kv usage counts",
      policy: "llmgw",
      candidates: [
        c("a", 0, { load: { kvCacheUsage: 0.95 } }),
        c("b", 0, { load: { kvCacheUsage: 0.1 } }),
      ],
      chain: 0,
      order: ["b", "a"],
    },
    {
      name: "recent errors count",
      policy: "llmgw",
      candidates: [c("a", 0, { errorRate: 0.5 }), c("b", 1)],
      chain: 0,
      order: ["b", "a"],
    },
    {
      name: "slow replica penalised",
      policy: "llmgw",
      candidates: [c("a", 0, { latencyMs: 400 }), c("b", 0, { latencyMs: 100 })],
      chain: 0,
      order: ["b", "a"],
    },
    {
      name: "round-robin rotates",
      policy: "round-robin",
      candidates: [c("a", 3), c("b", 0), c("c", 0)],
      chain: 0,
      turn: 2,
      order: ["c", "a", "b"],
    },
    {
      name: "round-robin ignores affinity",
      policy: "round-robin",
      candidates: [c("a", 0, { prefixBlocks: 8 }), c("b", 0)],
      chain: 8,
      turn: 1,
      order: ["b", "a"],
    },
    {
      name: "least-loaded by utilisation",
      policy: "least-loaded",
      candidates: [c("a", 2), c("b", 1, { capacity: 8 })],
      chain: 0,
      order: ["b", "a"],
    },
  ])("$name", ({ policy, candidates, chain, turn, order }) => {
    const ranking = rankCandidates(policy, candidates, chain, turn ?? 0, opts);
    expect(ranking.ranked.map((r) => r.id)).toEqual(order);
  });

  it("reports when engine load signals are missing", () => {
    expect(rankCandidates("llmgw", [c("a", 0)], 0, 0, opts).missingLoadSignals).toBe(true);
    expect(
      rankCandidates("llmgw", [c("a", 0, { load: { waiting: 0 } })], 0, 0, opts).missingLoadSignals,
    ).toBe(false);
  });

  it("marks a voided affinity claim", () => {
    const [a] = rankCandidates("llmgw", [c("a", 3, { prefixBlocks: 4 })], 4, 0, opts).ranked;
    expect(a).toMatchObject({ id: "a", affinity: 1, affinityVoided: true, utilization: 0.75 });
  });

  it("refuses out-of-range options, naming them", () => {
    expect(() => resolveScoringOptions({ affinitySlack: 2 })).toThrow(
      "option affinitySlack must be a number in [0, 1], got 2",
    );
  });
});
