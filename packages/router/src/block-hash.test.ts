import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { hashPromptBlocks, hashPromptPieces } from "./block-hash.js";

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
