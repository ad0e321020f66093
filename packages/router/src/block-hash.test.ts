import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { hashPromptBlocks, hashPromptPieces, promptKeys, quarterTail } from "./block-hash.js";

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
