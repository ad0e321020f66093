import { describe, expect, it } from "vitest";
import {
  blockHashes,
  countTokens,
  createPrng,
  nextTokenText,
  sequenceBlockHashes,
  simTokenIds,
  simTokenTexts,
} from "./tokenizer.js";

describe("token approximation", () => {
  it.each([
    ["", 0],
    ["a", 1],
    ["abcd", 1],
    ["abcde", 2],
    ["x".repeat(4000), 1000],
  ])("counts %j as %i tokens", (text, tokens) => {
    expect(countTokens(text)).toBe(tokens);
  });

  it("hashes only full blocks, chained so a shared prefix shares its leading hashes", () => {
    const a = `${"p".repeat(128)}${"a".repeat(70)}`;
    const b = `${"p".repeat(128)}${"b".repeat(70)}`;
    const [ha, hb] = [blockHashes(a, 16), blockHashes(b, 16)];
    expect(ha).toHaveLength(3); // 198 chars = 49.5 tokens = 3 full blocks of 16
    expect(ha.slice(0, 2)).toEqual(hb.slice(0, 2));
    expect(ha[2]).not.toBe(hb[2]);
    // Chaining: equal block text after a different prefix gives a different hash.
    expect(blockHashes(`${"q".repeat(64)}${"p".repeat(64)}`, 16)[1]).not.toBe(ha[1]);
  });

  it("draws output tokens of one 4-character piece each, so an answer re-tokenizes to them", () => {
    const next = createPrng(7);
    const pieces = Array.from({ length: 200 }, () => nextTokenText(next));
    expect(pieces.every((p) => p.length === 4)).toBe(true);
    const prompt = "p".repeat(100); // 25 tokens, a multiple of 4 characters
    const text = `${prompt}${pieces.join("")}`;
    expect(sequenceBlockHashes([...simTokenTexts(prompt), ...pieces], 16)).toEqual(
      blockHashes(text, 16),
    );
    expect([...simTokenIds(text)].slice(25)).toEqual(pieces.map((p) => simTokenIds(p)[0]));
  });

  it("has a deterministic PRNG per seed", () => {
    const draw = (seed: number) => {
      const next = createPrng(seed);
      return [next(), next(), next()];
    };
    expect(draw(42)).toEqual(draw(42));
    expect(draw(42)).not.toEqual(draw(43));
  });
});

describe("simTokenIds", () => {
  it("gives one id per 4-character piece: FNV-1a 32-bit of the piece, mod 2^31", () => {
    // FNV-1a("abcd") = 0xce3479bd; mod 2^31 drops the top bit.
    expect([...simTokenIds("abcd")]).toEqual([0xce3479bd % 0x80000000]);
    expect(simTokenIds("")).toHaveLength(0);
    const ids = simTokenIds("abcdabcdab");
    expect(ids).toHaveLength(countTokens("abcdabcdab"));
    expect(ids[0]).toBe(ids[1]); // equal pieces, equal ids
    expect(ids[2]).not.toBe(ids[0]); // the short last piece "ab"
  });

  it("is prefix-stable and stays below 2^31", () => {
    const text = "The quick brown fox jumps over the lazy dog, again and again. ".repeat(40);
    const all = simTokenIds(text);
    expect([...simTokenIds(text.slice(0, 400))]).toEqual([...all.subarray(0, 100)]);
    expect(all.every((id) => id < 2 ** 31)).toBe(true);
  });
});
