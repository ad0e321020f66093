import { describe, expect, it } from "vitest";
import { ManualClock } from "./index.js";

describe("ManualClock", () => {
  it("fires due timers in order and skips cancelled ones", () => {
    const clock = new ManualClock(0);
    const fired: string[] = [];
    clock.setTimer(() => fired.push("b@20"), 20);
    clock.setTimer(() => fired.push("a@10"), 10);
    const cancelled = clock.setTimer(() => fired.push("never"), 15);
    cancelled.cancel();
    clock.setTimer(() => clock.setTimer(() => fired.push("nested@25"), 15), 10);
    clock.advance(30);
    expect(fired).toEqual(["a@10", "b@20", "nested@25"]);
    expect(clock.now()).toBe(30);
    expect(clock.pending()).toBe(0);
  });
});
