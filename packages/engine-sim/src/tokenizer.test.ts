import { describe, expect, it } from "vitest";
import { blockHashes, countTokens, createPrng } from "./tokenizer.js";

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

  it("has a deterministic PRNG per seed", () => {
    const draw = (seed: number) => {
      const next = createPrng(seed);
      return [next(), next(), next()];
    };
    expect(draw(42)).toEqual(draw(42));
    expect(draw(42)).not.toEqual(draw(43));
  });
});
