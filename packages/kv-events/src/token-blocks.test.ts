import { describe, expect, it } from "vitest";
import { chainKey, tokenBlockKeys } from "./token-blocks.js";

const seq = (n: number, from = 0) => Array.from({ length: n }, (_, i) => from + i);

describe("tokenBlockKeys", () => {
  it("gives one key per full block and none for a trailing partial block", () => {
    expect(tokenBlockKeys(seq(10), 4)).toHaveLength(2);
    expect(tokenBlockKeys(seq(3), 4)).toHaveLength(0);
    expect(tokenBlockKeys([], 4)).toHaveLength(0);
  });

  it("keys a prefix: equal prefixes give equal keys, a changed token changes its block and all later ones", () => {
    const a = seq(64);
    const b = [...a];
    b[37] = 999;
    const ka = tokenBlockKeys(a, 16);
    const kb = tokenBlockKeys(b, 16);
    expect(kb[0]).toBe(ka[0]);
    expect(kb[1]).toBe(ka[1]);
    expect(kb[2]).not.toBe(ka[2]);
    expect(kb[3]).not.toBe(ka[3]);
  });

  it("chains: key i is chainKey(key i-1, block i), and a parentKey continues the chain", () => {
    const tokens = Uint32Array.from(seq(48, 100));
    const keys = tokenBlockKeys(tokens, 16);
    expect(keys[0]).toBe(chainKey(undefined, tokens, 0, 16));
    expect(keys[1]).toBe(chainKey(keys[0], tokens, 16, 32));
    expect(keys[2]).toBe(chainKey(keys[1], tokens, 32, 48));
    expect([...tokenBlockKeys(tokens.subarray(16), 16, keys[0])]).toEqual([...keys.subarray(1)]);
  });

  it("depends on position in the chain, not only the block's tokens", () => {
    const block = seq(16);
    const first = chainKey(undefined, block, 0, 16);
    expect(chainKey(first, block, 0, 16)).not.toBe(first);
    expect(chainKey(0, block, 0, 16)).not.toBe(first); // a parent key 0 is not "no parent"
  });

  it("gives 48-bit integers and no collisions over 100k random blocks", () => {
    let state = 12345;
    const rand = () => {
      state = (Math.imul(state, 1103515245) + 12345) >>> 0;
      return state;
    };
    const seen = new Set<number>();
    const block = new Uint32Array(16);
    let bad = 0;
    for (let i = 0; i < 100_000; i++) {
      for (let t = 0; t < 16; t++) block[t] = rand() % 150_000;
      const key = chainKey(undefined, block, 0, 16);
      if (!Number.isInteger(key) || key < 0 || key >= 2 ** 48) bad++;
      seen.add(key);
    }
    expect(bad).toBe(0);
    expect(seen.size).toBe(100_000);
  });

  it("takes the same ids from a number array and a Uint32Array", () => {
    const ids = [151644, 0xffffffff, 0, 7];
    expect([...tokenBlockKeys(ids, 2)]).toEqual([...tokenBlockKeys(Uint32Array.from(ids), 2)]);
  });

  it.each([0, -1, 1.5, Number.NaN])("refuses block size %s", (size) => {
    expect(() => tokenBlockKeys(seq(4), size)).toThrow(
      expect.objectContaining({
        code: "LLMGW_KV_EVENTS_INVALID_OPTIONS",
        message: `blockSize must be a positive integer, got ${size}`,
      }),
    );
  });
});
