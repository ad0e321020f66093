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

  describe("rendezvous preference", () => {
    // `rendezvous` is the prompt's weight per replica; "p" is the preferred one unless bounds say no.
    const rv = (
      id: string,
      inFlight: number,
      weight: number,
      extra: Partial<ScoringCandidate> = {},
    ) => c(id, inFlight, { rendezvous: weight, ...extra });
    it.each<{
      name: string;
      candidates: ScoringCandidate[];
      chain?: number;
      turn?: number;
      first: string;
    }>([
      {
        name: "decides an idle tie instead of the rotation",
        candidates: [rv("a", 0, 10), rv("b", 0, 99), rv("c", 0, 50)],
        turn: 0,
        first: "b",
      },
      {
        name: "equal weights: the smaller id, whatever the rotation",
        candidates: [rv("b", 0, 7), rv("a", 0, 7)],
        turn: 0,
        first: "a",
      },
      {
        name: "outweighs a utilisation lead of 0.2",
        candidates: [rv("p", 2, 99, { capacity: 10 }), rv("b", 3, 1, { capacity: 100 })],
        first: "p",
      },
      {
        name: "yields to a utilisation lead of 0.27 (over its weight 0.25)",
        candidates: [rv("p", 3, 99, { capacity: 10 }), rv("b", 3, 1, { capacity: 100 })],
        first: "b",
      },
      {
        name: "passes to the next weight when the preferred replica breaks the load bound",
        // 2 in flight on p, none elsewhere: p's third would exceed ceil(1.25 × 3 ÷ 3) = 2.
        candidates: [
          rv("p", 2, 99, { capacity: 64 }),
          rv("q", 0, 50, { capacity: 64 }),
          rv("r", 0, 10, { capacity: 64 }),
        ],
        turn: 2,
        first: "q",
      },
      {
        name: "passes on at 3/4 busy",
        candidates: [rv("p", 3, 99), rv("q", 2, 50), rv("r", 2, 10), rv("s", 3, 5)],
        turn: 2, // the rotation alone would put r first
        first: "q",
      },
      {
        name: "keeps its claim against a 2× slower latency (at most 0.2)",
        candidates: [rv("p", 0, 99, { latencyMs: 400 }), rv("b", 0, 1, { latencyMs: 100 })],
        first: "p",
      },
      {
        name: "yields to an engine queue over half the capacity",
        candidates: [
          rv("p", 0, 99, { load: { waiting: 3 } }),
          rv("b", 0, 1, { load: { waiting: 0 } }),
        ],
        first: "b",
      },
      {
        name: "keeps its claim against an engine queue of a quarter",
        candidates: [
          rv("p", 0, 99, { load: { waiting: 1 } }),
          rv("b", 0, 1, { load: { waiting: 0 } }),
        ],
        first: "p",
      },
      {
        name: "yields to KV usage 0.9 above another's",
        candidates: [
          rv("p", 0, 99, { load: { kvCacheUsage: 0.95 } }),
          rv("b", 0, 1, { load: { kvCacheUsage: 0.05 } }),
        ],
        first: "b",
      },
      {
        name: "yields to an error rate of 20%",
        candidates: [rv("p", 0, 99, { errorRate: 0.2 }), rv("b", 0, 1)],
        first: "b",
      },
      {
        name: "steps aside once this router sent the anchor's prefix somewhere: affinity decides",
        candidates: [rv("p", 0, 99), rv("b", 0, 1, { prefixBlocks: 2 })], // 2 of 40 blocks
        chain: 40,
        first: "b",
      },
      {
        name: "a claim shorter than the anchor (2 blocks) leaves the prefix new",
        candidates: [rv("p", 0, 99), rv("b", 0, 1, { prefixBlocks: 1 })],
        chain: 8,
        first: "p",
      },
      {
        name: "a one-block chain is anchored at block 1, so a one-block claim holds it",
        candidates: [rv("p", 0, 99), rv("b", 0, 1, { prefixBlocks: 1 })],
        chain: 1,
        first: "b",
      },
      {
        name: "a voided claim on the anchor leaves the prefix new: passed to the next choice",
        // b holds the prefix but is at 3/4; p is preferred over q.
        candidates: [rv("b", 3, 1, { prefixBlocks: 8 }), rv("p", 2, 99), rv("q", 2, 50)],
        chain: 8,
        turn: 2,
        first: "p",
      },
    ])("$name", ({ candidates, chain, turn, first }) => {
      const ranking = rankCandidates("llmgw", candidates, chain ?? 4, turn ?? 1, opts);
      expect(ranking.ranked[0]?.id).toBe(first);
    });

    it.each<{ name: string; hinted: boolean; queued: number; first: string }>([
      // Prompts of 100 tokens; p is the rendezvous (or hint) choice.
      { name: "new prompt, half a prompt queued on p", hinted: false, queued: 50, first: "b" },
      { name: "hinted, half a prompt queued on p", hinted: true, queued: 50, first: "b" },
      { name: "hinted, a quarter queued on p: still p's", hinted: true, queued: 25, first: "p" },
    ])("passes on when prefill is queued ahead of it: $name", ({ hinted, queued, first }) => {
      // The aged half prompt queued on p plus the hint's bonus tied with the free b before.
      const candidates = [
        rv("p", 1, 99, { capacity: 64, pendingPrefillTokens: queued }),
        rv("b", 1, 1, { capacity: 64 }),
      ];
      const ranked = rankCandidates("llmgw", candidates, 4, 0, opts, hinted, 100).ranked;
      expect(ranked[0]?.id).toBe(first);
      expect(ranked.find((r) => r.rendezvousPreferred)?.id).toBe(first);
    });

    describe("a hot hint's conversation", () => {
      // A hot hint (no home) on 4 replicas, 16 picks in the window: fair share ceil(17 ÷ 4) = 5,
      // the ordinary bound ceil(1.25 × 17 ÷ 4) = 6. Every replica holds the hint's 4-block
      // system prompt; "conv" also holds this conversation's earlier turn (5 of 6 blocks).
      const hot = (recentOnConv: number, convBlocks = 5) => [
        rv("p", 1, 99, { capacity: 64, prefixBlocks: 4, recent: 4 }),
        rv("q", 1, 50, { capacity: 64, prefixBlocks: 4, recent: 4 }),
        rv("conv", 1, 10, { capacity: 64, prefixBlocks: convBlocks, recent: recentOnConv }),
        rv("r", 1, 5, { capacity: 64, prefixBlocks: 4, recent: 3 }),
      ];
      const first = (candidates: ScoringCandidate[]) =>
        rankCandidates("llmgw", candidates, 6, 0, opts, true, 100, 16, true).ranked[0];
      it("stays where its earlier turns are, past the hint's fair share", () => {
        const top = first(hot(5)); // its sixth would pass the fair share, not the bound
        expect(top?.id).toBe("conv");
        expect(top?.rendezvousPreferred).toBe(true);
      });
      it("moves past the ordinary bound, to the hint's order", () => {
        expect(first(hot(6))?.id).toBe("p");
      });
      it("is not told apart when two replicas hold the most: the hint's order", () => {
        const tie = hot(3).map((x) => (x.id === "q" ? { ...x, prefixBlocks: 5 } : x));
        expect(first(tie)?.id).toBe("p");
      });
      it("by time where the router may: a holder whose step ends soonest, then anyone's", () => {
        // A first turn: every replica but "new" holds the system prompt (4 of 6 blocks); p, the
        // hint's first choice, is over its fair share, and q's step has the most left to run.
        const firstTurn = (waits: Record<string, number>) =>
          first([
            rv("p", 1, 99, { capacity: 64, prefixBlocks: 4, recent: 5, placementWait: waits.p }),
            rv("q", 1, 50, { capacity: 64, prefixBlocks: 4, recent: 3, placementWait: waits.q }),
            rv("r", 1, 10, { capacity: 64, prefixBlocks: 4, recent: 3, placementWait: waits.r }),
            rv("new", 1, 5, { capacity: 64, recent: 2, placementWait: waits.new }),
          ]);
        expect(firstTurn({ p: 0, q: 0.9, r: 0.2, new: 0 })?.id).toBe("r");
        // Both holders past their fair share: the replica it spills to is the soonest step's.
        const spill = [
          rv("p", 1, 99, { capacity: 64, prefixBlocks: 4, recent: 5 }),
          rv("p2", 1, 98, { capacity: 64, prefixBlocks: 4, recent: 5 }),
          rv("a", 1, 50, { capacity: 64, recent: 3, placementWait: 0.8 }),
          rv("b", 1, 10, { capacity: 64, recent: 3, placementWait: 0.1 }),
          rv("c", 1, 5, { capacity: 64, recent: 3 }),
        ];
        const top = rankCandidates("llmgw", spill, 6, 0, opts, true, 100, 16, true).ranked[0];
        expect(top?.id).toBe("b");
        // Without waits (routers that share nothing): the hint's order, a before b.
        const untimed = spill.map(({ placementWait: _, ...x }) => x);
        expect(
          rankCandidates("llmgw", untimed, 6, 0, opts, true, 100, 16, true).ranked[0]?.id,
        ).toBe("a");
      });
    });

    it("marks the one candidate that got it, and nobody when it is off", () => {
      const candidates = [rv("a", 0, 10), rv("b", 0, 99)];
      const on = rankCandidates("llmgw", candidates, 4, 0, opts).ranked;
      expect(on.map((r) => [r.id, r.rendezvousPreferred, r.score])).toEqual([
        ["b", true, 0.25],
        ["a", false, 0],
      ]);
      const off = resolveScoringOptions({ weights: { rendezvous: 0 } });
      const ranked = rankCandidates("llmgw", candidates, 4, 0, off).ranked;
      expect(ranked.map((r) => [r.id, r.rendezvousPreferred])).toEqual([
        ["a", false],
        ["b", false],
      ]);
    });

    it.each<RoutingPolicy>(["round-robin", "least-loaded"])("is ignored by %s", (policy) => {
      const candidates = [rv("a", 0, 1), rv("b", 0, 99)];
      const ranked = rankCandidates(policy, candidates, 4, 0, opts).ranked;
      expect(ranked.map((r) => [r.id, r.rendezvousPreferred])).toEqual([
        ["a", false],
        ["b", false],
      ]);
    });

    it.each([0, 1.5, 513, Number.NaN])("refuses rendezvousAnchorBlocks %s", (value) => {
      expect(() => resolveScoringOptions({ rendezvousAnchorBlocks: value })).toThrow(
        `option rendezvousAnchorBlocks must be an integer in [1, 512], got ${String(value)}`,
      );
    });

    it("defaults to weight 0.25 anchored at block 2", () => {
      expect(opts.weights.rendezvous).toBe(0.25);
      expect(opts.rendezvousAnchorBlocks).toBe(2);
      expect(resolveScoringOptions({ rendezvousAnchorBlocks: 8 }).rendezvousAnchorBlocks).toBe(8);
    });
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
    expect(() => resolveScoringOptions({ homeLoadFactor: 0.5 })).toThrow(
      "option homeLoadFactor must be a number in [1, 100], got 0.5",
    );
  });
});
