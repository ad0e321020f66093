import { describe, expect, it } from "vitest";
import { hashPromptBlocks } from "./block-hash.js";
import {
  chainAnchor,
  DEFAULT_RENDEZVOUS_ANCHOR_BLOCKS,
  rendezvousOrder,
  rendezvousWeight,
  replicaSeed,
} from "./rendezvous.js";

/** mulberry32: a seeded PRNG in [0, 1). */
function prng(seed: number): () => number {
  let a = seed | 0;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A random 48-bit block key, like block-hash.ts emits. */
const key48 = (rand: () => number): number =>
  Math.floor(rand() * 65536) * 4294967296 + Math.floor(rand() * 4294967296);

/** Similar ids, as a deployment names its replicas: the seeds must still spread. */
const ids = (n: number): string[] => Array.from({ length: n }, (_, i) => `llama-70b-r${i}`);

/** Index of the preferred replica for `anchor` among `seeds`. */
const top = (anchor: number, seeds: readonly number[]): number => {
  let best = 0;
  for (let i = 1; i < seeds.length; i++) {
    if (
      rendezvousWeight(anchor, seeds[i] as number) > rendezvousWeight(anchor, seeds[best] as number)
    )
      best = i;
  }
  return best;
};

describe("chainAnchor", () => {
  const chain = [101, 202, 303, 404];
  it.each([
    { name: "empty chain: no anchor", chain: [], k: 2, same: undefined },
    { name: "chain shorter than k: its last block", chain: [101], k: 2, same: [101] },
    { name: "chain of exactly k blocks: block k", chain: [101, 202], k: 2, same: [101, 202] },
    { name: "longer chain: block k, the tail ignored", chain, k: 2, same: [101, 202, 999] },
    { name: "k = 1: the first block", chain, k: 1, same: [101, 7, 7] },
    { name: "k beyond the chain: the last block", chain, k: 64, same: [0, 0, 0, 404] },
  ])("$name", ({ chain: c, k, same }) => {
    const anchor = chainAnchor(c, k);
    if (same === undefined) expect(anchor).toBeUndefined();
    else expect(anchor).toBe(chainAnchor(same, k));
  });

  it("tells apart blocks that differ only in the high 16 bits of a 48-bit key, and other blocks", () => {
    const low = 0x1234_5678;
    const a = chainAnchor([1 * 4294967296 + low], 2);
    const b = chainAnchor([2 * 4294967296 + low], 2);
    expect(a).not.toBe(b);
    expect(chainAnchor([101, 202], 2)).not.toBe(chainAnchor([101, 203], 2));
  });

  it("is an unsigned 32-bit integer", () => {
    const rand = prng(3);
    for (let i = 0; i < 1000; i++) {
      const anchor = chainAnchor([key48(rand)], 1) as number;
      expect(Number.isInteger(anchor) && anchor >= 0 && anchor < 2 ** 32).toBe(true);
    }
  });
});

describe("rendezvous weights", () => {
  it("pins the order for a known prompt, so every router and release agrees on it", () => {
    // Changing the mix makes routers of two releases disagree during an upgrade; this fails first.
    const chain = hashPromptBlocks("You are a careful assistant. ".repeat(100));
    expect(chain.length).toBe(2);
    const anchor = chainAnchor(chain, 2) as number;
    expect(anchor).toBe(948_370_501);
    expect(replicaSeed("llama-70b-r0")).toBe(2_823_160_413);
    expect(rendezvousWeight(anchor, replicaSeed("llama-70b-r0"))).toBe(43_357_203);
    expect(rendezvousOrder(chain, ids(4))).toEqual([
      "llama-70b-r3",
      "llama-70b-r2",
      "llama-70b-r1",
      "llama-70b-r0",
    ]);
  });

  it("spreads first choices evenly over similar replica ids (8 replicas, 80 000 anchors)", () => {
    const rand = prng(11);
    const seeds = ids(8).map(replicaSeed);
    const firsts = new Array<number>(8).fill(0);
    const pairs = new Map<string, number>();
    const n = 80_000;
    for (let i = 0; i < n; i++) {
      const anchor = chainAnchor([key48(rand)], 1) as number;
      const order = seeds
        .map((s, r) => ({ r, w: rendezvousWeight(anchor, s) }))
        .sort((x, y) => y.w - x.w);
      const first = (order[0] as { r: number }).r;
      const pair = `${first}>${(order[1] as { r: number }).r}`;
      firsts[first] = (firsts[first] ?? 0) + 1;
      pairs.set(pair, (pairs.get(pair) ?? 0) + 1);
    }
    // Each share within ±5 standard deviations of 1/8.
    for (const count of firsts) expect(Math.abs(count / n - 1 / 8)).toBeLessThan(0.006);
    // The second choice is independent of the first: all 56 ordered pairs about equally often.
    expect(pairs.size).toBe(56);
    for (const count of pairs.values()) expect(Math.abs(count / (n / 56) - 1)).toBeLessThan(0.2);
  });

  it("moves only the prefixes of a replica that leaves, and only to one that joins", () => {
    const rand = prng(5);
    const names = ids(8);
    const seeds = names.map(replicaSeed);
    const without = seeds.slice(0, 7);
    let owned = 0;
    let joined = 0;
    for (let i = 0; i < 10_000; i++) {
      const anchor = chainAnchor([key48(rand)], 1) as number;
      const all = top(anchor, seeds);
      const seven = top(anchor, without);
      if (all === 7) {
        owned++;
        joined++;
      } else {
        expect(seven).toBe(all); // nobody else's prefix moves
      }
    }
    expect(owned).toBeGreaterThan(1000);
    expect(joined).toBe(owned);
  });

  it("defaults the anchor to block 2", () => {
    expect(DEFAULT_RENDEZVOUS_ANCHOR_BLOCKS).toBe(2);
    const a = rendezvousOrder([1, 2, 3], ids(6));
    expect(rendezvousOrder([1, 2, 99], ids(6))).toEqual(a);
    expect(rendezvousOrder([1, 2, 3], ids(6), 3)).toEqual(rendezvousOrder([1, 2, 3, 4], ids(6), 3));
  });

  it("keeps the given order for an empty chain", () => {
    expect(rendezvousOrder([], ["b", "a"])).toEqual(["b", "a"]);
  });
});
