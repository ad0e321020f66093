import { describe, expect, it } from "vitest";
import { createManualClock } from "./clock.js";
import { type BlockFeedUpdate, createPreciseIndex } from "./precise-index.js";

const snap = (epoch: string, version: number, added: number[]): BlockFeedUpdate => ({
  epoch,
  version,
  snapshot: true,
  added,
  removed: [],
  blockSizeTokens: 16,
  stale: false,
});
const delta = (
  epoch: string,
  version: number,
  added: number[],
  removed: number[] = [],
  stale = false,
): BlockFeedUpdate => ({
  epoch,
  version,
  snapshot: false,
  added,
  removed,
  blockSizeTokens: 16,
  stale,
});

describe("precise index", () => {
  it("matches leading blocks from a snapshot and the deltas after it", () => {
    const index = createPreciseIndex();
    expect(index.apply("a", snap("e1", 4, [1, 2, 3]))).toBe("applied");
    expect(index.match(["a"], [1, 2, 9, 3])).toEqual(new Map([["a", 2]]));
    expect(index.apply("a", delta("e1", 5, [9], [2]))).toBe("applied");
    // Block 2 went: the engine's hit stops there, whatever it holds after.
    expect(index.match(["a"], [1, 2, 9, 3])).toEqual(new Map([["a", 1]]));
    expect(index.state("a")).toEqual({ fresh: true, blocks: 3, blockSizeTokens: 16 });
  });

  it("takes a keepalive at the held version, and refuses a delta out of order until a snapshot", () => {
    const index = createPreciseIndex();
    index.apply("a", snap("e1", 4, [1]));
    expect(index.apply("a", delta("e1", 4, []))).toBe("applied");
    expect(index.apply("a", delta("e1", 6, [2]))).toBe("out_of_order");
    expect(index.state("a")?.fresh).toBe(false);
    expect(index.match(["a"], [1])).toEqual(new Map());
    // Even the next version in line is no good once a delta was missed.
    expect(index.apply("a", delta("e1", 7, [3]))).toBe("out_of_order");
    expect(index.apply("a", snap("e1", 7, [1, 2, 3]))).toBe("applied");
    expect(index.match(["a"], [1, 2, 3])).toEqual(new Map([["a", 3]]));
  });

  it("drops another epoch's blocks: a delta of a new epoch needs its snapshot first", () => {
    const index = createPreciseIndex();
    index.apply("a", snap("e1", 1, [1, 2]));
    expect(index.apply("a", delta("e2", 1, [5]))).toBe("out_of_order");
    expect(index.apply("a", snap("e2", 0, []))).toBe("applied");
    expect(index.match(["a"], [1, 2])).toEqual(new Map());
  });

  it("is not fresh while the agent says its view is stale", () => {
    const index = createPreciseIndex();
    expect(index.apply("a", { ...snap("e1", 0, []), stale: true })).toBe("stale");
    expect(index.state("a")?.fresh).toBe(false);
    expect(index.apply("a", delta("e1", 1, [1]))).toBe("applied");
    expect(index.state("a")?.fresh).toBe(true);
    // No block stored yet: fresh, no block size, nothing held.
    expect(index.apply("b", { ...snap("e1", 0, []), blockSizeTokens: 0 })).toBe("applied");
    expect(index.state("b")).toEqual({ fresh: true, blocks: 0, blockSizeTokens: undefined });
    index.invalidate("a");
    expect(index.match(["a", "b"], [1])).toEqual(new Map());
    index.forget("a");
    expect(index.state("a")).toBeUndefined();
  });

  it("holds a sent request's keys on its replica until it ends, and a grace after success", () => {
    const clock = createManualClock(0);
    const index = createPreciseIndex({ clock, holdGraceMs: 1_000 });
    index.apply("a", snap("e1", 1, [1]));
    index.apply("b", snap("e1", 1, [1]));
    // Sent to a, not computed yet: the engine has stored block 1 only.
    index.hold("a", [1, 2, 3]);
    index.hold("a", [1, 2]);
    expect(index.match(["a", "b"], [1, 2, 3, 4])).toEqual(
      new Map([
        ["a", 3],
        ["b", 1],
      ]),
    );
    // The longer request failed: its blocks may never be stored; the other still holds 1–2.
    index.release("a", [1, 2, 3], false);
    expect(index.match(["a"], [1, 2, 3])).toEqual(new Map([["a", 2]]));
    // The other succeeded: held for the grace, while the engine's events come.
    index.release("a", [1, 2], true);
    clock.advance(999);
    expect(index.match(["a"], [1, 2, 3])).toEqual(new Map([["a", 2]]));
    clock.advance(1);
    expect(index.match(["a"], [1, 2, 3])).toEqual(new Map([["a", 1]]));
    expect(index.heldKeys("a")).toBe(0);
  });

  it("matches no hold on a replica that is not fresh, and forgets a replica's holds with it", () => {
    const index = createPreciseIndex();
    index.hold("a", [1, 2]);
    // No feed yet: the deployment is routed approximately, and a hold changes nothing.
    expect(index.match(["a"], [1, 2])).toEqual(new Map());
    index.apply("a", snap("e1", 1, []));
    expect(index.match(["a"], [1, 2])).toEqual(new Map([["a", 2]]));
    index.invalidate("a");
    expect(index.match(["a"], [1, 2])).toEqual(new Map());
    index.forget("a");
    expect(index.heldKeys("a")).toBe(0);
    // A release after the replica was forgotten is harmless.
    index.release("a", [1, 2], false);
    expect(index.heldKeys("a")).toBe(0);
  });
});
