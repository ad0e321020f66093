import { describe, expect, it } from "vitest";
import { type AdmissionOutcome, createAdmissionController } from "./admission.js";
import { createManualClock } from "./clock.js";

const admitted = (o: AdmissionOutcome | Promise<AdmissionOutcome>): AdmissionOutcome => {
  if (o instanceof Promise) throw new Error("expected an immediate outcome");
  return o;
};

describe("admission", () => {
  it("admits up to capacity at once, then queues, then refuses when the queue is full", () => {
    const ctl = createAdmissionController({ maxQueueLength: 1, clock: createManualClock() });
    expect(admitted(ctl.admit("d", "k", 2)).admitted).toBe(true);
    expect(admitted(ctl.admit("d", "k", 2)).admitted).toBe(true);
    const queued = ctl.admit("d", "k", 2);
    expect(queued).toBeInstanceOf(Promise);
    expect(admitted(ctl.admit("d", "k", 2))).toEqual({
      admitted: false,
      reason: "queue_full",
      retryAfterSeconds: 1,
    });
    expect(ctl.stats("d")).toEqual({ inFlight: 2, queued: 1 });
  });

  it("hands a released slot to the queue and reports the wait", async () => {
    const clock = createManualClock();
    const ctl = createAdmissionController({ clock });
    const first = admitted(ctl.admit("d", "k", 1));
    const second = ctl.admit("d", "k", 1) as Promise<AdmissionOutcome>;
    clock.advance(250);
    if (first.admitted) first.release();
    first.admitted && first.release(); // idempotent
    await expect(second).resolves.toMatchObject({ admitted: true, waitedMs: 250 });
    expect(ctl.stats("d")).toEqual({ inFlight: 1, queued: 0 });
  });

  it("expires a wait with queue_timeout and a Retry-After", async () => {
    const clock = createManualClock();
    const ctl = createAdmissionController({ clock, queueTimeoutMs: 2500 });
    admitted(ctl.admit("d", "k", 1));
    const waiting = ctl.admit("d", "k", 1);
    clock.advance(2500);
    await expect(waiting).resolves.toEqual({
      admitted: false,
      reason: "queue_timeout",
      retryAfterSeconds: 3,
    });
    expect(ctl.stats("d").queued).toBe(0);
  });

  it("drops an aborted waiter", async () => {
    const ctl = createAdmissionController({ clock: createManualClock() });
    admitted(ctl.admit("d", "k", 1));
    const abort = new AbortController();
    const waiting = ctl.admit("d", "k", 1, abort.signal);
    abort.abort();
    await expect(waiting).resolves.toMatchObject({ admitted: false, reason: "aborted" });
    expect(ctl.stats("d").queued).toBe(0);
  });

  it("serves queued keys round-robin, not first-come", async () => {
    const ctl = createAdmissionController({ clock: createManualClock() });
    const holder = admitted(ctl.admit("d", "x", 1));
    const order: string[] = [];
    const wait = (key: string, tag: string) =>
      (ctl.admit("d", key, 1) as Promise<AdmissionOutcome>).then((o) => {
        order.push(tag);
        return o;
      });
    // Key "busy" queues three before "quiet" queues one.
    const all = [
      wait("busy", "busy1"),
      wait("busy", "busy2"),
      wait("busy", "busy3"),
      wait("quiet", "quiet1"),
    ];
    let current = holder;
    for (let i = 0; i < 4; i++) {
      if (current.admitted) current.release();
      current = await Promise.race(
        all.filter((_, j) => !order.includes(["busy1", "busy2", "busy3", "quiet1"][j] as string)),
      );
    }
    await Promise.all(all);
    expect(order).toEqual(["busy1", "quiet1", "busy2", "busy3"]);
  });

  it("admits queued requests when capacity grows", async () => {
    const ctl = createAdmissionController({ clock: createManualClock() });
    admitted(ctl.admit("d", "k", 1));
    const waiting = ctl.admit("d", "k", 1);
    ctl.setCapacity("d", 2);
    await expect(waiting).resolves.toMatchObject({ admitted: true });
  });
});
