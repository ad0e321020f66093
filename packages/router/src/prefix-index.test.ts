import { describe, expect, it } from "vitest";
import { createPrefixIndex } from "./prefix-index.js";

describe("prefix index", () => {
  it.each([
    { name: "empty index", records: [], query: [1, 2, 3], expected: {} },
    {
      name: "full match",
      records: [{ chain: [1, 2, 3], replica: "a" }],
      query: [1, 2, 3],
      expected: { a: 3 },
    },
    {
      name: "shared prefix then divergence",
      records: [{ chain: [1, 2, 9], replica: "a" }],
      query: [1, 2, 3],
      expected: { a: 2 },
    },
    {
      name: "two replicas, different depths",
      records: [
        { chain: [1], replica: "a" },
        { chain: [1, 2, 3], replica: "b" },
      ],
      query: [1, 2, 3, 4],
      expected: { a: 1, b: 3 },
    },
  ])("$name", ({ records, query, expected }) => {
    const index = createPrefixIndex();
    for (const r of records) index.record(r.chain, r.replica);
    expect(Object.fromEntries(index.match(query))).toEqual(expected);
  });

  it("matches a recorded tail a quarter at a time past the blocks, for its replica only", () => {
    const index = createPrefixIndex();
    // Both hold blocks [1, 2]; "conv" got a prompt that ended three quarters into block 3.
    index.record([1, 2], "other");
    index.record([1, 2], "conv", 23);
    // A later turn: blocks [1, 2, 3], its quarters 4 a block (quarter 4·2 + 2 = 10 is key 23).
    const quarters = [11, 12, 13, 1, 14, 15, 16, 2, 21, 22, 23, 3];
    expect(Object.fromEntries(index.match([1, 2, 3], quarters))).toEqual({
      other: 2,
      conv: 2.75,
    });
    // Without quarters, or past the tail, blocks alone.
    expect(Object.fromEntries(index.match([1, 2, 3]))).toEqual({ other: 2, conv: 2 });
    index.record([1, 2, 3], "other");
    expect(Object.fromEntries(index.match([1, 2, 3], quarters))).toEqual({
      other: 3,
      conv: 2.75,
    });
    // A forgotten replica takes its tails with it.
    index.forget("conv");
    expect(Object.fromEntries(index.match([1, 2, 3], quarters))).toEqual({ other: 3 });
  });

  it("stays within maxEntries, dropping the least recently used: a chain's tail first", () => {
    const index = createPrefixIndex({ maxEntries: 3 });
    index.record([1, 2], "a");
    index.record([3, 4], "b");
    expect(index.size).toBe(3);
    // [1, 2] was touched tail first, so its block 2 was the oldest key: its prefix [1] stays.
    expect(Object.fromEntries(index.match([1, 2]))).toEqual({ a: 1 });
    expect(Object.fromEntries(index.match([3, 4]))).toEqual({ b: 2 });
  });

  it("holds at most a replica's capacity, evicting that replica's least recently used", () => {
    const index = createPrefixIndex();
    index.setCapacity("a", 3);
    index.record([1, 2], "a");
    index.record([5, 6], "b");
    index.record([3, 4], "a");
    expect(index.blocksOf("a")).toBe(3);
    // Block 2 (the tail of the older chain) went; its head and the newer chain stay.
    expect(Object.fromEntries(index.match([1, 2]))).toEqual({ a: 1 });
    expect(Object.fromEntries(index.match([3, 4]))).toEqual({ a: 2 });
    // Another replica's blocks are not its to evict.
    expect(Object.fromEntries(index.match([5, 6]))).toEqual({ b: 2 });
    // A block two replicas hold leaves only the one that evicted it.
    index.record([5], "a");
    expect([...index.match([5]).keys()].sort()).toEqual(["a", "b"]);
    index.record([7, 8, 9], "a");
    expect([...index.match([5]).keys()]).toEqual(["b"]);
  });

  it("trims at once when a capacity shrinks, and grows again when it is lifted", () => {
    const index = createPrefixIndex();
    index.record([1, 2, 3, 4], "a");
    index.setCapacity("a", 2);
    expect(index.blocksOf("a")).toBe(2);
    expect(Object.fromEntries(index.match([1, 2, 3, 4]))).toEqual({ a: 2 });
    index.setCapacity("a", undefined);
    index.record([1, 2, 3, 4], "a");
    expect(index.blocksOf("a")).toBe(4);
    expect(() => index.setCapacity("a", -1)).toThrow(/capacity/);
  });

  it("keeps at most maxReplicasPerBlock, most recent first", () => {
    const index = createPrefixIndex({ maxReplicasPerBlock: 2 });
    for (const id of ["a", "b", "c"]) index.record([7], id);
    expect([...index.match([7]).keys()].sort()).toEqual(["b", "c"]);
  });

  it("forgets a replica", () => {
    const index = createPrefixIndex();
    index.record([1, 2], "a");
    index.record([1], "b");
    index.forget("a");
    expect(Object.fromEntries(index.match([1, 2]))).toEqual({ b: 1 });
    expect(index.size).toBe(1);
  });
});
