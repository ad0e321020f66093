import { createHash } from "node:crypto";
import {
  createManualClock,
  createRoutingState,
  type InFlightReport,
  type RoutedReplica,
  type RoutingDelta,
  type RoutingSnapshot,
} from "@llmgw/router";
import { afterEach, describe, expect, it } from "vitest";
import { type InFlightReporter, startInFlightReporter } from "./in-flight-reporter.js";

const sha256 = (secret: string): string => createHash("sha256").update(secret).digest("hex");
const T0 = 1_800_000_000_000;

const replica = (id: string, state: RoutedReplica["state"] = "ready"): RoutedReplica => ({
  id,
  model: "m",
  deployment: "m",
  baseUrl: `http://10.0.0.1:800${id.length}`,
  state,
  capacity: 4,
});
const snapshot = (replicas: RoutedReplica[], epoch = "e1"): RoutingSnapshot => ({
  kind: "snapshot",
  epoch,
  version: 1,
  models: [{ name: "m", deployment: "m", policy: "llmgw", loading: false }],
  replicas,
  keys: [],
  routers: 1,
  sentAtMs: T0,
});
const delta = (version: number, over: Partial<RoutingDelta>): RoutingDelta => ({
  kind: "delta",
  epoch: "e1",
  version,
  upsertedModels: [],
  removedModels: [],
  upsertedReplicas: [],
  removedReplicas: [],
  upsertedKeys: [],
  removedKeys: [],
  sentAtMs: T0,
  ...over,
});

const reporters: InFlightReporter[] = [];
afterEach(() => {
  for (const r of reporters.splice(0)) r.close();
});

/** A real routing state, a manual clock, in-flight counts set by hand, the reports sent. */
function setup(first: RoutingSnapshot = snapshot([replica("a"), replica("b")])) {
  const clock = createManualClock(0);
  const state = createRoutingState({ hashSecret: sha256, now: () => T0 });
  state.apply(first);
  const counts = new Map<string, number>();
  const reports: InFlightReport[] = [];
  const reporter = startInFlightReporter({
    state,
    inFlight: (id) => counts.get(id) ?? 0,
    send: (r) => reports.push(r),
    clock,
  });
  reporters.push(reporter);
  const settled = () => Promise.resolve();
  return { clock, state, counts, reports, reporter, settled };
}

const lists = (reports: InFlightReport[]) =>
  reports.map((r) => r.draining.map((d) => `${d.replicaId}=${d.inFlight}`).join(","));

describe("startInFlightReporter", () => {
  it("says nothing while no replica drains", async () => {
    const { clock, state, reports, settled } = setup();
    state.apply(delta(2, { upsertedReplicas: [replica("c")] }));
    await settled();
    clock.advance(10_000);
    expect(reports).toEqual([]);
  });

  it("reports right after a replica turns draining, on a count change within a check, every refresh, and once empty", async () => {
    const { clock, state, counts, reports, settled } = setup();
    counts.set("a", 1);
    state.apply(delta(2, { upsertedReplicas: [replica("a", "draining")] }));
    expect(reports).toEqual([]); // not from inside the feed's delivery
    await settled();
    expect(reports).toEqual([
      { epoch: "e1", stateVersion: 2, draining: [{ replicaId: "a", inFlight: 1 }] },
    ]);

    clock.advance(900); // unchanged: nothing until the refresh
    expect(reports).toHaveLength(1);
    clock.advance(100);
    expect(lists(reports)).toEqual(["a=1", "a=1"]);

    counts.set("a", 0); // the stream ended
    clock.advance(99);
    expect(reports).toHaveLength(2);
    clock.advance(1);
    expect(lists(reports)).toEqual(["a=1", "a=1", "a=0"]);

    // Drained: the control plane removes it; one empty report, then silence.
    state.apply(delta(3, { removedReplicas: ["a"] }));
    await settled();
    expect(reports.at(-1)).toEqual({ epoch: "e1", stateVersion: 3, draining: [] });
    clock.advance(10_000);
    expect(reports).toHaveLength(4);
  });

  it("lists every draining replica held, 0 included, and reports when the set changes", async () => {
    const { state, counts, reports, settled } = setup();
    counts.set("b", 3);
    state.apply(delta(2, { upsertedReplicas: [replica("a", "draining")] }));
    await settled();
    state.apply(delta(3, { upsertedReplicas: [replica("b", "draining")], removedModels: ["m"] }));
    await settled();
    // A membership change that leaves the set as it was is no reason to report.
    state.apply(delta(4, { upsertedReplicas: [replica("c")] }));
    await settled();
    expect(lists(reports)).toEqual(["a=0", "a=0,b=3"]);
    expect(reports.map((r) => r.stateVersion)).toEqual([2, 3]);
  });

  it("reports at once for a state that already holds draining replicas, and on a new epoch", async () => {
    const { state, reports, settled } = setup(snapshot([replica("a", "draining")]));
    await settled();
    expect(lists(reports)).toEqual(["a=0"]);
    state.apply(snapshot([replica("a", "draining")], "e2"));
    await settled();
    expect(reports.map((r) => r.epoch)).toEqual(["e1", "e2"]);
  });

  it("stops on close", async () => {
    const { clock, state, reporter, reports, settled } = setup();
    state.apply(delta(2, { upsertedReplicas: [replica("a", "draining")] }));
    await settled();
    reporter.close();
    clock.advance(5_000);
    state.apply(delta(3, { removedReplicas: ["a"] }));
    await settled();
    expect(reports).toHaveLength(1);
  });

  it.each([
    [
      { checkIntervalMs: 0 },
      "in-flight reporter: checkIntervalMs must be a whole number of ms in 1–60000, got 0",
    ],
    [
      { refreshIntervalMs: 1.5 },
      "in-flight reporter: refreshIntervalMs must be a whole number of ms in 1–60000, got 1.5",
    ],
    [
      { checkIntervalMs: 500, refreshIntervalMs: 200 },
      "in-flight reporter: refreshIntervalMs (200) must be at least checkIntervalMs (500)",
    ],
  ])("refuses bad intervals (case %#)", (bad, message) => {
    const state = createRoutingState({ hashSecret: sha256 });
    expect(() =>
      startInFlightReporter({ state, inFlight: () => 0, send: () => {}, ...bad }),
    ).toThrow(message);
  });
});
