import { describe, expect, it } from "vitest";
import {
  type AdmissionKey,
  type AdmissionOutcome,
  createAdmissionController,
  defaultCriticalPrefillReserve,
} from "./admission.js";
import { createManualClock } from "./clock.js";

const admitted = (o: AdmissionOutcome | Promise<AdmissionOutcome>): AdmissionOutcome => {
  if (o instanceof Promise) throw new Error("expected an immediate outcome");
  return o;
};

describe("admission", () => {
  it("admits up to capacity at once, then queues, then refuses when the queue is full", () => {
    const ctl = createAdmissionController({ maxQueueLength: 1, clock: createManualClock() });
    expect(admitted(ctl.admit("d", { id: "k" }, 1, 2)).admitted).toBe(true);
    expect(admitted(ctl.admit("d", { id: "k" }, 1, 2)).admitted).toBe(true);
    const queued = ctl.admit("d", { id: "k" }, 1, 2);
    expect(queued).toBeInstanceOf(Promise);
    expect(admitted(ctl.admit("d", { id: "k" }, 1, 2))).toEqual({
      admitted: false,
      reason: "queue_full",
      retryAfterSeconds: 1,
    });
    expect(ctl.stats("d")).toEqual({ inFlight: 2, queued: 1 });
  });

  it("hands a released slot to the queue and reports the wait", async () => {
    const clock = createManualClock();
    const ctl = createAdmissionController({ clock });
    const first = admitted(ctl.admit("d", { id: "k" }, 1, 1));
    const second = ctl.admit("d", { id: "k" }, 1, 1) as Promise<AdmissionOutcome>;
    clock.advance(250);
    if (first.admitted) first.release();
    first.admitted && first.release(); // idempotent
    await expect(second).resolves.toMatchObject({ admitted: true, waitedMs: 250 });
    expect(ctl.stats("d")).toEqual({ inFlight: 1, queued: 0 });
  });

  it("expires a wait with queue_timeout and a Retry-After", async () => {
    const clock = createManualClock();
    const ctl = createAdmissionController({ clock, queueTimeoutMs: 2500 });
    admitted(ctl.admit("d", { id: "k" }, 1, 1));
    const waiting = ctl.admit("d", { id: "k" }, 1, 1);
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
    admitted(ctl.admit("d", { id: "k" }, 1, 1));
    const abort = new AbortController();
    const waiting = ctl.admit("d", { id: "k" }, 1, 1, abort.signal);
    abort.abort();
    await expect(waiting).resolves.toMatchObject({ admitted: false, reason: "aborted" });
    expect(ctl.stats("d").queued).toBe(0);
  });

  it("serves queued keys round-robin, not first-come", async () => {
    const ctl = createAdmissionController({ clock: createManualClock() });
    const holder = admitted(ctl.admit("d", { id: "x" }, 1, 1));
    const order: string[] = [];
    const wait = (key: string, tag: string) =>
      (ctl.admit("d", { id: key }, 1, 1) as Promise<AdmissionOutcome>).then((o) => {
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
    admitted(ctl.admit("d", { id: "k" }, 1, 1));
    const waiting = ctl.admit("d", { id: "k" }, 1, 1);
    ctl.setCapacity("d", 2);
    await expect(waiting).resolves.toMatchObject({ admitted: true });
  });
});

/** Lets promise callbacks run. */
const flush = () => new Promise<void>((resolve) => setImmediate(resolve));

interface Entry {
  readonly key: AdmissionKey;
  readonly tokens: number;
  readonly tag: string;
}

/**
 * Queues `entries` behind one request holding the deployment's only slot, then frees the slot
 * `steps` times (each served request releasing for the next): the tags in serving order.
 */
async function servingOrder(entries: readonly Entry[], steps: number): Promise<string[]> {
  // No critical headroom: the queue's order alone is what these tests look at.
  const ctl = createAdmissionController({
    clock: createManualClock(),
    maxQueueLength: 10_000,
    criticalHeadroom: 0,
  });
  const served: { tag: string; outcome: AdmissionOutcome }[] = [];
  let current = admitted(ctl.admit("d", { id: "holder" }, 1, 1));
  for (const e of entries) {
    void (ctl.admit("d", e.key, e.tokens, 1) as Promise<AdmissionOutcome>).then((outcome) =>
      served.push({ tag: e.tag, outcome }),
    );
  }
  for (let i = 0; i < steps; i++) {
    if (current.admitted) current.release();
    await flush();
    current = (served[served.length - 1] as { outcome: AdmissionOutcome }).outcome;
  }
  return served.map((s) => s.tag);
}

const many = (key: AdmissionKey, tokens: number, tag: string, n: number): Entry[] =>
  Array.from({ length: n }, () => ({ key, tokens, tag }));

const count = (tags: readonly string[], tag: string) => tags.filter((t) => t === tag).length;

describe("admission: priorities and fair share", () => {
  it("lets critical requests past a full capacity by its headroom, and no other class", async () => {
    const ctl = createAdmissionController({ clock: createManualClock(), criticalHeadroom: 0.25 });
    const batch = { id: "b", priority: "batch" } as const;
    const critical = { id: "c", priority: "critical" } as const;
    // Capacity 8, all of it held by batch: critical gets ceil(8 × 0.25) = 2 more at once.
    const held = Array.from({ length: 8 }, () => admitted(ctl.admit("d", batch, 1, 8)));
    expect(ctl.admit("d", { id: "s" }, 1, 8)).toBeInstanceOf(Promise);
    expect(admitted(ctl.admit("d", critical, 1, 8)).admitted).toBe(true);
    expect(admitted(ctl.admit("d", critical, 1, 8)).admitted).toBe(true);
    const third = ctl.admit("d", critical, 1, 8);
    expect(third).toBeInstanceOf(Promise);
    expect(ctl.stats("d")).toEqual({ inFlight: 10, queued: 2 });
    // A freed slot goes to the waiting critical request (still within its headroom), not to
    // standard, which waits for the in-flight count to come under the capacity itself.
    const first = held[0] as AdmissionOutcome;
    if (first.admitted) first.release();
    await expect(third).resolves.toMatchObject({ admitted: true });
    expect(ctl.stats("d")).toEqual({ inFlight: 10, queued: 1 });
    for (const h of held.slice(1, 3)) if (h.admitted) h.release();
    await flush();
    expect(ctl.stats("d")).toEqual({ inFlight: 8, queued: 1 });
    const next = held[3] as AdmissionOutcome;
    if (next.admitted) next.release();
    await flush();
    expect(ctl.stats("d")).toEqual({ inFlight: 8, queued: 0 });
  });

  it("gives critical no headroom when told so", () => {
    const ctl = createAdmissionController({ clock: createManualClock(), criticalHeadroom: 0 });
    admitted(ctl.admit("d", { id: "b" }, 1, 1));
    expect(ctl.admit("d", { id: "c", priority: "critical" }, 1, 1)).toBeInstanceOf(Promise);
  });

  it("serves every critical request before standard ones, and those before batch", async () => {
    const order = await servingOrder(
      [
        { key: { id: "b", priority: "batch" }, tokens: 1, tag: "batch1" },
        { key: { id: "s" }, tokens: 1, tag: "standard1" },
        { key: { id: "c", priority: "critical" }, tokens: 1, tag: "critical1" },
        { key: { id: "s", priority: "standard" }, tokens: 1, tag: "standard2" },
        { key: { id: "c", priority: "critical" }, tokens: 1, tag: "critical2" },
      ],
      5,
    );
    expect(order).toEqual(["critical1", "critical2", "standard1", "standard2", "batch1"]);
  });

  it("shares a class 3:1 in tokens between tenants of weights 3 and 1", async () => {
    const heavy = { id: "h", tenant: { name: "heavy", weight: 3 } };
    const light = { id: "l", tenant: { name: "light", weight: 1 } };
    const order = await servingOrder(
      [...many(light, 100, "light", 60), ...many(heavy, 100, "heavy", 60)],
      40,
    );
    expect([count(order, "heavy"), count(order, "light")]).toEqual([30, 10]);
  });

  it("counts tokens, not requests: a tenant of small requests is served more of them", async () => {
    const big = { id: "big", tenant: { name: "big", weight: 1 } };
    const small = { id: "small", tenant: { name: "small", weight: 1 } };
    const order = await servingOrder(
      [...many(big, 1_000, "big", 20), ...many(small, 100, "small", 40)],
      22,
    );
    expect([count(order, "big"), count(order, "small")]).toEqual([2, 20]);
  });

  it("shares by tenant, not by key: a tenant's keys split one share", async () => {
    const team = { name: "team", weight: 1 };
    const order = await servingOrder(
      [
        ...many({ id: "k1", tenant: team }, 10, "team", 10),
        ...many({ id: "k2", tenant: team }, 10, "team", 10),
        ...many({ id: "solo" }, 10, "solo", 20),
      ],
      20,
    );
    expect([count(order, "team"), count(order, "solo")]).toEqual([10, 10]);
  });

  it("sheds the newest queued batch request for a higher class when the queue is full", async () => {
    const clock = createManualClock();
    const ctl = createAdmissionController({
      clock,
      maxQueueLength: 2,
      queueTimeoutMs: 1_000,
      criticalHeadroom: 0,
    });
    const holder = admitted(ctl.admit("d", { id: "x" }, 1, 1));
    const batch = { id: "b", priority: "batch" as const };
    const b1 = ctl.admit("d", batch, 1, 1);
    const b2 = ctl.admit("d", batch, 1, 1);
    // A batch request finds the queue full: refused, never queued.
    expect(admitted(ctl.admit("d", batch, 1, 1))).toMatchObject({ reason: "queue_full" });
    const s1 = ctl.admit("d", { id: "s" }, 1, 1);
    await expect(b2).resolves.toEqual({ admitted: false, reason: "shed", retryAfterSeconds: 1 });
    const c1 = ctl.admit("d", { id: "c", priority: "critical" }, 1, 1);
    await expect(b1).resolves.toMatchObject({ reason: "shed" });
    // Nothing left to shed.
    expect(admitted(ctl.admit("d", { id: "s" }, 1, 1))).toMatchObject({ reason: "queue_full" });
    expect(ctl.stats("d")).toEqual({ inFlight: 1, queued: 2 });
    if (holder.admitted) holder.release();
    const first = await c1;
    expect(first.admitted).toBe(true);
    clock.advance(1_000); // the shed ones' timers were cancelled: only s1 times out
    await expect(s1).resolves.toMatchObject({ reason: "queue_timeout" });
    expect(ctl.stats("d")).toEqual({ inFlight: 1, queued: 0 });
  });

  it("still times out and aborts queued requests of every class", async () => {
    const clock = createManualClock();
    const ctl = createAdmissionController({ clock, queueTimeoutMs: 500, criticalHeadroom: 0 });
    admitted(ctl.admit("d", { id: "x" }, 1, 1));
    const abort = new AbortController();
    const critical = ctl.admit("d", { id: "c", priority: "critical" }, 5, 1, abort.signal);
    const batch = ctl.admit("d", { id: "b", priority: "batch" }, 5, 1);
    abort.abort();
    await expect(critical).resolves.toMatchObject({ reason: "aborted" });
    clock.advance(500);
    await expect(batch).resolves.toMatchObject({ reason: "queue_timeout" });
    expect(ctl.stats("d")).toEqual({ inFlight: 1, queued: 0 });
  });
});

describe("admission: the critical prefill reserve", () => {
  const batch = { id: "b", priority: "batch" } as const;
  const standard = { id: "s" } as const;
  const critical = { id: "c", priority: "critical" } as const;
  const grant = (o: AdmissionOutcome | Promise<AdmissionOutcome>) => {
    const outcome = admitted(o);
    if (!outcome.admitted) throw new Error(`refused: ${outcome.reason}`);
    return outcome;
  };

  it("keeps a replica free of prefills while critical requests arrive", async () => {
    const clock = createManualClock();
    const ctl = createAdmissionController({ clock });
    // 4 replicas, capacity 16: 4 − 1 prefills at once, the critical one counted.
    const c = grant(ctl.admit("d", critical, 1, 16, undefined, 4));
    const b1 = grant(ctl.admit("d", batch, 1, 16, undefined, 4));
    const s1 = grant(ctl.admit("d", standard, 1, 16, undefined, 4));
    const held = ctl.admit("d", batch, 1, 16, undefined, 4);
    expect(held).toBeInstanceOf(Promise);
    expect(ctl.stats("d")).toEqual({ inFlight: 3, queued: 1 });
    // The critical request's first byte frees a prefill: the held one starts.
    c.prefilled();
    c.prefilled(); // idempotent
    await expect(held).resolves.toMatchObject({ admitted: true, waitedMs: 0 });
    // A release counts as the first byte of one that never had it.
    const next = ctl.admit("d", batch, 1, 16, undefined, 4);
    expect(next).toBeInstanceOf(Promise);
    clock.advance(40);
    b1.release();
    await expect(next).resolves.toMatchObject({ admitted: true, waitedMs: 40 });
    // A slot released after its first byte frees no prefill.
    s1.prefilled();
    s1.release();
    expect(ctl.stats("d")).toEqual({ inFlight: 3, queued: 0 });
  });

  it("keeps a quarter of the replicas free by default, at least one", () => {
    const startedBeforeHold = (replicas: number): number => {
      const ctl = createAdmissionController({ clock: createManualClock() });
      grant(ctl.admit("d", critical, 1, 64, undefined, replicas));
      let started = 1;
      while (!(ctl.admit("d", batch, 1, 64, undefined, replicas) instanceof Promise)) started++;
      return started;
    };
    // Prefills in progress, the critical one included, before a batch request is held.
    expect([2, 4, 7, 8, 16].map(startedBeforeHold)).toEqual([1, 3, 6, 6, 12]);
    expect(defaultCriticalPrefillReserve(3)).toBe(1);
    expect(defaultCriticalPrefillReserve(64)).toBe(16);
  });

  it("never holds a critical request for it", () => {
    const ctl = createAdmissionController({ clock: createManualClock() });
    for (let i = 0; i < 3; i++) grant(ctl.admit("d", critical, 1, 16, undefined, 4));
    expect(ctl.admit("d", batch, 1, 16, undefined, 4)).toBeInstanceOf(Promise);
    // Past the reserve and past the capacity (its headroom): critical starts at once.
    for (let i = 0; i < 20; i++) grant(ctl.admit("d", critical, 1, 16, undefined, 4));
    expect(ctl.stats("d")).toEqual({ inFlight: 23, queued: 1 });
  });

  it("holds nothing without critical traffic, and lapses a window after the last one", async () => {
    const clock = createManualClock();
    const ctl = createAdmissionController({ clock, criticalWindowMs: 5_000 });
    // No critical request yet: every slot of the capacity starts at once.
    for (let i = 0; i < 16; i++) grant(ctl.admit("d", batch, 1, 16, undefined, 4));
    const other = createAdmissionController({ clock, criticalWindowMs: 5_000 });
    grant(other.admit("d", critical, 1, 16, undefined, 4)).release();
    for (let i = 0; i < 3; i++) grant(other.admit("d", batch, 1, 16, undefined, 4));
    const held = other.admit("d", batch, 1, 16, undefined, 4);
    expect(held).toBeInstanceOf(Promise);
    clock.advance(5_000);
    // The window lapsed: the next arrival lets the held one start, and starts itself.
    grant(other.admit("d", batch, 1, 16, undefined, 4));
    await expect(held).resolves.toMatchObject({ admitted: true, waitedMs: 5_000 });
  });

  it("is off at reserve 0 and on a deployment with no replica to spare", () => {
    const off = createAdmissionController({
      clock: createManualClock(),
      criticalPrefillReserve: 0,
    });
    grant(off.admit("d", critical, 1, 16, undefined, 4));
    for (let i = 0; i < 15; i++) grant(off.admit("d", batch, 1, 16, undefined, 4));
    const two = createAdmissionController({
      clock: createManualClock(),
      criticalPrefillReserve: 2,
    });
    grant(two.admit("d", critical, 1, 16, undefined, 2));
    for (let i = 0; i < 15; i++) grant(two.admit("d", batch, 1, 16, undefined, 2));
    const three = createAdmissionController({
      clock: createManualClock(),
      criticalPrefillReserve: 2,
    });
    grant(three.admit("d", critical, 1, 16, undefined, 3));
    expect(three.admit("d", batch, 1, 16, undefined, 3)).toBeInstanceOf(Promise);
  });

  it("refuses a reserve or window out of range", () => {
    expect(() => createAdmissionController({ criticalPrefillReserve: 65 })).toThrow(
      /criticalPrefillReserve/,
    );
    expect(() => createAdmissionController({ criticalWindowMs: -1 })).toThrow(/criticalWindowMs/);
  });
});
