import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  hashPromptBlocks,
  hashPromptPieces,
  type PromptKeys,
  promptKeys,
  quarterTail,
} from "./block-hash.js";

// Strings without lone surrogates: the one case where piece boundaries may hash differently.
const text = fc.string({ unit: "grapheme-ascii", maxLength: 300 });

describe("hashPromptPieces", () => {
  it.each([
    { name: "one piece", pieces: ["a".repeat(100)], blockBytes: 16 },
    {
      name: "block edge inside a piece",
      pieces: ["x".repeat(20), "\n", "y".repeat(30)],
      blockBytes: 16,
    },
    { name: "pieces on block edges", pieces: ["a".repeat(16), "b".repeat(16), ""], blockBytes: 16 },
    { name: "shorter than a block", pieces: ["abc", "\n"], blockBytes: 16 },
    { name: "no pieces", pieces: [], blockBytes: 16 },
    { name: "non-ASCII", pieces: ["é".repeat(17), "日本".repeat(9)], blockBytes: 16 },
  ])("equals hashPromptBlocks of the joined text: $name", ({ pieces, blockBytes }) => {
    expect(hashPromptPieces(pieces, { blockBytes })).toEqual(
      hashPromptBlocks(pieces.join(""), { blockBytes }),
    );
  });

  it("stops at maxBlocks", () => {
    const keys = hashPromptPieces(["a".repeat(100), "b".repeat(100)], {
      blockBytes: 16,
      maxBlocks: 3,
    });
    expect(keys).toEqual(hashPromptBlocks("a".repeat(48), { blockBytes: 16 }));
  });

  it("equals hashPromptBlocks of the joined text for any split", () => {
    fc.assert(
      fc.property(
        fc.array(text, { maxLength: 12 }),
        fc.integer({ min: 16, max: 64 }),
        (pieces, blockBytes) => {
          expect(hashPromptPieces(pieces, { blockBytes })).toEqual(
            hashPromptBlocks(pieces.join(""), { blockBytes }),
          );
        },
      ),
      { numRuns: 200 },
    );
  });
});

describe("promptKeys: quarter blocks", () => {
  const system = "s".repeat(64); // four 16-byte blocks
  it("reads the chain's running hash at every quarter, the trailing partial block's too", () => {
    const keys = promptKeys([system, "first turn"], { blockBytes: 16 }); // 74 bytes
    expect(keys.chain).toEqual(hashPromptBlocks(`${system}first turn`, { blockBytes: 16 }));
    expect(keys.quarters.length).toBe(18); // 72 bytes in complete quarters of 4
    for (let i = 0; i < keys.chain.length; i++)
      expect(keys.quarters[4 * i + 3]).toBe(keys.chain[i]);
    expect(new Set(keys.quarters).size).toBe(18);
  });

  it("gives a later turn the earlier turn's tail: where a conversation is told apart", () => {
    const first = promptKeys([system, "turn one"], { blockBytes: 16 }); // 72 bytes
    const second = promptKeys([system, "turn one", "answer", "turn two"], { blockBytes: 16 });
    const other = promptKeys([system, "turn uno"], { blockBytes: 16 });
    const tail = quarterTail(first);
    expect(tail).toBe(first.quarters[17]);
    expect(second.quarters[17]).toBe(tail);
    // The same complete blocks, another conversation: only the tail differs.
    expect(other.chain).toEqual(first.chain);
    expect(quarterTail(other)).not.toBe(tail);
  });

  it("has no tail on a block edge, below a quarter past it, or past maxBlocks", () => {
    expect(quarterTail(promptKeys([system], { blockBytes: 16 }))).toBeUndefined();
    expect(quarterTail(promptKeys([system, "abc"], { blockBytes: 16 }))).toBeUndefined();
    const capped = promptKeys([system, "more text"], { blockBytes: 16, maxBlocks: 2 });
    expect(capped.chain.length).toBe(2);
    expect(capped.quarters.length).toBe(8);
    expect(quarterTail(capped)).toBeUndefined();
  });

  it("has none for a block size that is not a multiple of 16", () => {
    const keys = promptKeys(["x".repeat(100)], { blockBytes: 24 });
    expect(keys.chain.length).toBe(4);
    expect(keys.quarters.length).toBe(0);
    expect(quarterTail(keys)).toBeUndefined();
  });

  it("agrees for any split of the same text", () => {
    fc.assert(
      fc.property(fc.array(text, { maxLength: 12 }), (pieces) => {
        expect(promptKeys(pieces, { blockBytes: 32 })).toEqual(
          promptKeys([pieces.join("")], { blockBytes: 32 }),
        );
      }),
      { numRuns: 200 },
    );
  });
});

describe("promptKeys under a cache_salt", () => {
  const pieces = ["system\n", "s".repeat(100), "\nuser\nhello there\n"]; // 125 bytes
  const options = { blockBytes: 16 };
  const shared = (a: PromptKeys, b: PromptKeys): number[] => {
    const mine = new Set([...a.chain, ...a.quarters]);
    return [...b.chain, ...b.quarters].filter((k) => mine.has(k));
  };

  it.each([
    ["tenant-a", "tenant-b"],
    ["a", "b"],
    ["ab", "ab\u0000"],
    ["\ud800", "\ud801"], // lone surrogates: one U+FFFD each in UTF-8, apart here
    ["x".repeat(1024), `${"x".repeat(1023)}y`],
  ])("shares no key between the same text under %j and %j", (one, two) => {
    const a = promptKeys(pieces, options, one);
    const b = promptKeys(pieces, options, two);
    expect(a.chain.length).toBe(7);
    expect(b.quarters.length).toBe(31);
    expect(shared(a, b)).toEqual([]);
  });

  it("shares no key with the unsalted text, whose keys stay what they were", () => {
    const plain = promptKeys(pieces, options);
    expect(promptKeys(pieces, options, undefined)).toEqual(plain);
    // Pinned: unsalted keys are what routers and peers already agree on.
    expect(hashPromptBlocks("x".repeat(32), { blockBytes: 16 })).toEqual(
      Float64Array.from([185_769_559_944_373, 91_452_514_507_123]),
    );
    expect(shared(plain, promptKeys(pieces, options, "tenant-a"))).toEqual([]);
  });

  it("gives the same keys for the same salt, for any split of the text", () => {
    const a = promptKeys(pieces, options, "tenant-a");
    expect(promptKeys([pieces.join("")], options, "tenant-a")).toEqual(a);
    expect(a.quarters.length).toBe(31);
    for (let i = 0; i < a.chain.length; i++) expect(a.quarters[4 * i + 3]).toBe(a.chain[i]);
  });
});
