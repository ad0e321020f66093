import { describe, expect, it } from "vitest";
import { type NodeState, nextNodeState } from "./node-lifecycle.js";

const timing = { unreachableAfterMs: 3_000, lostAfterMs: 10_000 };

describe("nextNodeState", () => {
  it.each<[NodeState, number, NodeState]>([
    ["ready", 0, "ready"],
    ["ready", 2_999, "ready"],
    ["ready", 3_000, "unreachable"],
    ["ready", 12_999, "unreachable"],
    ["ready", 13_000, "lost"],
    ["unreachable", 5_000, "unreachable"],
    ["unreachable", 13_000, "lost"],
    ["lost", 5_000, "lost"],
    // Only a heartbeat (not the passing of time) brings a node back to ready.
    ["unreachable", 100, "unreachable"],
    ["lost", 100, "lost"],
  ])("%s after %i ms of silence → %s", (current, silentMs, expected) => {
    expect(nextNodeState(current, 1_000, 1_000 + silentMs, timing)).toBe(expected);
  });

  it("goes straight to lost when the grace is zero", () => {
    expect(nextNodeState("ready", 0, 3_000, { unreachableAfterMs: 3_000, lostAfterMs: 0 })).toBe(
      "lost",
    );
  });
});
