import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { hashPromptBlocks, hashPromptPieces } from "./block-hash.js";

// Strings without lone surrogates: the one case where piece boundaries may hash differently.
const text = fc.string({ unit: "grapheme-ascii", maxLength: 300 });

describe("hashPromptPieces", () => {
  it.each([
    { name: "one piece", pieces: ["a".repeat(100)], blockChars: 16 },
    {
      name: "block edge inside a piece",
      pieces: ["x".repeat(20), "\n", "y".repeat(30)],
      blockChars: 16,
    },
    { name: "pieces on block edges", pieces: ["a".repeat(16), "b".repeat(16), ""], blockChars: 16 },
    { name: "shorter than a block", pieces: ["abc", "\n"], blockChars: 16 },
    { name: "no pieces", pieces: [], blockChars: 16 },
    { name: "non-ASCII", pieces: ["é".repeat(17), "日本".repeat(9)], blockChars: 16 },
  ])("equals hashPromptBlocks of the joined text: $name", ({ pieces, blockChars }) => {
    expect(hashPromptPieces(pieces, { blockChars })).toEqual(
      hashPromptBlocks(pieces.join(""), { blockChars }),
    );
  });

  it("stops at maxBlocks", () => {
    const keys = hashPromptPieces(["a".repeat(100), "b".repeat(100)], {
      blockChars: 16,
      maxBlocks: 3,
    });
    expect(keys).toEqual(hashPromptBlocks("a".repeat(48), { blockChars: 16 }));
  });

  it("equals hashPromptBlocks of the joined text for any split", () => {
    fc.assert(
      fc.property(
        fc.array(text, { maxLength: 12 }),
        fc.integer({ min: 16, max: 64 }),
        (pieces, blockChars) => {
          expect(hashPromptPieces(pieces, { blockChars })).toEqual(
            hashPromptBlocks(pieces.join(""), { blockChars }),
          );
        },
      ),
      { numRuns: 200 },
    );
  });
});
