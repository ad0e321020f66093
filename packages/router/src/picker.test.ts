import { describe, expect, it } from "vitest";
import { createInFlightCounters } from "./in-flight.js";
import { createReplicaPicker } from "./picker.js";

describe("ReplicaPicker.forget", () => {
  it("drops a departed replica's prefix and health at once, its in-flight slot after its last request", () => {
    const inFlight = createInFlightCounters();
    const picker = createReplicaPicker({ inFlight });
    const chain = [11, 22, 33];
    picker.dispatched("gone", chain);
    picker.finished("gone", "failure");
    picker.dispatched("gone", chain); // still in flight when the replica leaves
    const slot = inFlight.slotOf("gone");
    expect(picker.prefixIndex.match(chain).get("gone")).toBe(3);
    expect(picker.health.errorRate("gone")).toBeGreaterThan(0);

    picker.forget("gone");
    expect(picker.prefixIndex.match(chain).has("gone")).toBe(false);
    expect(picker.health.errorRate("gone")).toBe(0);
    expect(inFlight.get("gone")).toBe(1); // the request in flight still counts
    expect(inFlight.slotOf("other")).not.toBe(slot);

    expect(picker.finished("gone", "success", 5)).toBe(0);
    expect(picker.health.errorRate("gone")).toBe(0);
    expect(inFlight.slotOf("next")).toBe(slot);
  });

  it("frees an idle replica's slot at once, and ignores one it never saw", () => {
    const inFlight = createInFlightCounters();
    const picker = createReplicaPicker({ inFlight });
    picker.dispatched("idle", []);
    picker.finished("idle", "success", 1);
    const slot = inFlight.slotOf("idle");
    picker.forget("idle");
    picker.forget("never-seen");
    expect(inFlight.slotOf("fresh")).toBe(slot);
  });
});
