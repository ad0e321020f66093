import { describe, expect, it } from "vitest";
import { buildNvlinkMatrix, selectGpus } from "./gpu-selection.js";

const pairs = (list: [number, number, number][]) =>
  buildNvlinkMatrix(list.map(([a, b, count]) => ({ a, b, count })));
const allPairs = (n: number, count: number) =>
  pairs(
    Array.from({ length: n }, (_, a) =>
      Array.from(
        { length: n - a - 1 },
        (_, k) => [a, a + k + 1, count] as [number, number, number],
      ),
    ).flat(),
  );

describe("selectGpus", () => {
  it.each([
    ["no topology: lowest indices", [3, 1, 2, 0], 2, pairs([]), undefined, [0, 1]],
    ["all candidates when count ≥ their number", [5, 4], 3, pairs([]), undefined, [4, 5]],
    ["nothing for count 0", [0, 1], 0, pairs([]), undefined, []],
    ["NVLink pairs over adjacent indices", [1, 2, 3], 2, pairs([[2, 3, 4]]), undefined, [2, 3]],
    [
      "more links beat fewer",
      [0, 1, 2, 3],
      2,
      pairs([
        [0, 1, 2],
        [2, 3, 12],
      ]),
      undefined,
      [2, 3],
    ],
    [
      "NIC distance among equally linked sets",
      [0, 1, 2, 3],
      2,
      pairs([]),
      { 0: 4, 1: 4, 2: 0, 3: 1 },
      [2, 3],
    ],
    [
      "NVSwitch (all pairs equal): NIC distance decides",
      [0, 1, 2, 3, 4, 5, 6, 7],
      4,
      allPairs(8, 18),
      { 0: 1, 1: 1, 2: 1, 3: 1, 4: 0, 5: 0, 6: 0, 7: 0 },
      [4, 5, 6, 7],
    ],
    [
      "links outrank NIC distance",
      [0, 1, 2, 3],
      2,
      pairs([[0, 1, 4]]),
      { 0: 4, 1: 4, 2: 0, 3: 0 },
      [0, 1],
    ],
  ] as const)("%s", (_name, candidates, count, nvlink, nic, expected) => {
    expect(selectGpus(candidates, count, nvlink, nic)).toEqual(expected);
  });
});
