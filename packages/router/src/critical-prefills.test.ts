import { describe, expect, it } from "vitest";
import { createManualClock } from "./clock.js";
import { CriticalPrefills } from "./critical-prefills.js";

describe("CriticalPrefills", () => {
  it("runs a waiter at once when nothing critical is queued at the replica", () => {
    const held = new CriticalPrefills(createManualClock(), 1_000);
    held.begin("b");
    const ran: string[] = [];
    held.after("a", () => ran.push("a"));
    expect(ran).toEqual(["a"]);
  });

  it("holds a waiter until the replica's last critical prefill ends", () => {
    const held = new CriticalPrefills(createManualClock(), 1_000);
    held.begin("a");
    held.begin("a");
    const ran: string[] = [];
    held.after("a", () => ran.push("first"));
    held.after("a", () => ran.push("second"));
    held.end("a");
    expect([ran, held.pending("a")]).toEqual([[], 1]);
    held.end("a");
    expect([ran, held.pending("a")]).toEqual([["first", "second"], 0]);
    // A later end (of nothing) wakes no one twice.
    held.end("a");
    expect(ran).toHaveLength(2);
  });

  it("gives up waiting after maxWaitMs, exactly once", () => {
    const clock = createManualClock();
    const held = new CriticalPrefills(clock, 1_000);
    held.begin("a");
    const ran: number[] = [];
    held.after("a", () => ran.push(clock.now()));
    clock.advance(999);
    expect(ran).toEqual([]);
    clock.advance(1);
    expect(ran).toEqual([1_000]);
    held.end("a"); // the prefill ends later: the waiter already ran
    expect(ran).toEqual([1_000]);
    // An end before the deadline cancels its timer.
    held.begin("a");
    held.after("a", () => ran.push(clock.now()));
    held.end("a");
    clock.advance(5_000);
    expect(ran).toEqual([1_000, 1_000]);
  });
});
