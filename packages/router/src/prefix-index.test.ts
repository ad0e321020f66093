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

  it("stays within maxEntries, dropping the least recently recorded", () => {
    const index = createPrefixIndex({ maxEntries: 3 });
    index.record([1, 2], "a");
    index.record([3, 4], "b");
    expect(index.size).toBe(3);
    expect(Object.fromEntries(index.match([1]))).toEqual({});
    // A chain key stands for its whole prefix, so block 2 alone still proves "a" saw [1, 2].
    expect(Object.fromEntries(index.match([1, 2]))).toEqual({ a: 2 });
    expect(Object.fromEntries(index.match([3, 4]))).toEqual({ b: 2 });
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
