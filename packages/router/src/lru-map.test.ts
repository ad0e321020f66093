import { describe, expect, it } from "vitest";
import { LruMap } from "./lru-map.js";

const order = (m: LruMap<string, number>) => [...m.keys()];

describe("LruMap", () => {
  it("keeps keys least recently used first; setting one again makes it the newest", () => {
    const m = new LruMap<string, number>();
    for (const [i, k] of ["a", "b", "c", "d"].entries()) m.set(k, i);
    expect([order(m), m.oldest(), m.size]).toEqual([["a", "b", "c", "d"], ["a", 0], 4]);
    m.set("b", 10); // middle
    m.set("a", 11); // oldest
    m.set("a", 12); // already newest: the value changes, the order does not
    expect([order(m), m.get("b"), m.get("a"), m.oldest()]).toEqual([
      ["c", "d", "b", "a"],
      10,
      12,
      ["c", 2],
    ]);
  });

  it("deletes the oldest, the newest and one between, and refills from empty", () => {
    const m = new LruMap<string, number>();
    for (const [i, k] of ["a", "b", "c", "d"].entries()) m.set(k, i);
    expect([m.delete("a"), m.delete("d"), m.delete("x")]).toEqual([true, true, false]);
    expect(order(m)).toEqual(["b", "c"]);
    m.set("e", 4);
    expect(m.delete("c")).toBe(true);
    expect([order(m), m.oldest(), m.get("c")]).toEqual([["b", "e"], ["b", 1], undefined]);
    m.delete("b");
    m.delete("e");
    expect([order(m), m.oldest(), m.size]).toEqual([[], undefined, 0]);
    m.set("f", 5);
    m.set("g", 6);
    m.set("f", 7);
    expect([order(m), m.oldest()]).toEqual([
      ["g", "f"],
      ["g", 6],
    ]);
  });

  it("use reads a value and makes it the newest; entries survive deleting what they yield", () => {
    const m = new LruMap<string, number>();
    for (const [i, k] of ["a", "b", "c", "d"].entries()) m.set(k, i);
    expect([m.use("b"), m.use("x"), order(m)]).toEqual([1, undefined, ["a", "c", "d", "b"]]);
    const seen: [string, number][] = [];
    for (const entry of m.entries()) {
      seen.push(entry);
      if (entry[1] % 2 === 0) m.delete(entry[0]);
    }
    expect([seen, order(m)]).toEqual([
      [
        ["a", 0],
        ["c", 2],
        ["d", 3],
        ["b", 1],
      ],
      ["d", "b"],
    ]);
  });
});
