import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import type {
  RoutedReplica,
  RoutingDelta,
  RoutingMessage,
  RoutingSnapshot,
} from "../routing-messages.js";
import { createRoutingState } from "../routing-state.js";
import { createManualRoutingFeed } from "./routing-feed.js";

const sha256 = (secret: string): string => createHash("sha256").update(secret).digest("hex");
const T0 = 1_800_000_000_000;

const replica = (id: string, over: Partial<RoutedReplica> = {}): RoutedReplica => ({
  id,
  model: "alpha",
  deployment: "alpha-dep",
  baseUrl: "http://127.0.0.1:9000",
  state: "ready",
  capacity: 4,
  ...over,
});
const snapshot: RoutingSnapshot = {
  kind: "snapshot",
  epoch: "e1",
  version: 5,
  models: [{ name: "alpha", deployment: "alpha-dep", policy: "llmgw", loading: false }],
  replicas: [replica("r1", { apiKey: "engine-key" }), replica("r2")],
  keys: [{ id: "k1", name: "one", secretSha256: sha256("sk-one") }],
  routers: 1,
  sentAtMs: T0,
};
const delta = (version: number, over: Partial<RoutingDelta> = {}): RoutingDelta => ({
  kind: "delta",
  epoch: "e1",
  version,
  upsertedModels: [],
  removedModels: [],
  upsertedReplicas: [],
  removedReplicas: [],
  upsertedKeys: [],
  removedKeys: [],
  sentAtMs: T0 + version,
  ...over,
});

describe("createManualRoutingFeed", () => {
  it("delivers each push to every subscriber in order, until it unsubscribes", () => {
    const feed = createManualRoutingFeed();
    const heard: string[] = [];
    const offA = feed.subscribe((m) => heard.push(`a:${m.kind}`));
    feed.subscribe((m) => heard.push(`b:${m.kind}`));
    expect(feed.subscribers).toBe(2);
    feed.push(snapshot);
    offA();
    feed.push({ kind: "keepalive", epoch: "e1", version: 5, sentAtMs: T0, intervalMs: 1000 });
    expect(heard).toEqual(["a:snapshot", "b:snapshot", "b:keepalive"]);
    expect(feed.subscribers).toBe(1);
  });

  it("replays the latest snapshot with later deltas and load folded in, then what follows", () => {
    const feed = createManualRoutingFeed();
    expect(feed.current()).toBeUndefined();
    feed.push(snapshot);
    feed.push(
      delta(6, {
        upsertedReplicas: [replica("r1", { capacity: 8 })],
        removedReplicas: ["r2"],
        routers: 2,
      }),
    );
    feed.push({
      kind: "load",
      epoch: "e1",
      samples: [{ replicaId: "r1", load: { running: 3 }, reportedAtMs: T0 }],
    });
    feed.push(delta(7, { upsertedReplicas: [replica("r3")], removedKeys: ["k1"] }));
    feed.push(delta(9, { removedModels: ["alpha"] })); // a gap: delivered, not folded
    feed.push(delta(7, { removedModels: ["alpha"] })); // old: delivered, not folded
    feed.push({
      kind: "load",
      epoch: "e0",
      samples: [{ replicaId: "r3", load: { running: 1 }, reportedAtMs: T0 }],
    });

    const heard: RoutingMessage[] = [];
    feed.subscribe((m) => heard.push(m));
    expect(heard).toEqual([
      {
        kind: "snapshot",
        epoch: "e1",
        version: 7,
        models: snapshot.models,
        replicas: [
          replica("r1", {
            capacity: 8,
            apiKey: "engine-key",
            load: { running: 3 },
            loadReportedAtMs: T0,
          }),
          replica("r3"),
        ],
        keys: [],
        routers: 2,
        // Aged by the (real) time the feed held it before this subscriber came.
        sentAtMs: expect.any(Number),
      },
    ]);
    const replayedAt = (heard[0] as { sentAtMs: number }).sentAtMs;
    expect(replayedAt).toBeGreaterThanOrEqual(T0 + 7);
    expect(replayedAt).toBeLessThan(T0 + 7 + 5_000);
    feed.push(delta(8));
    expect(heard.map((m) => m.kind)).toEqual(["snapshot", "delta"]);
    expect(feed.current()?.version).toBe(8);
  });

  it("brings a late subscriber's routing state to the same routes as an early one's", () => {
    const feed = createManualRoutingFeed();
    const early = createRoutingState({ hashSecret: sha256, now: () => T0 });
    feed.subscribe((m) => early.apply(m));
    feed.push(snapshot);
    feed.push(delta(6, { upsertedReplicas: [replica("r2", { state: "draining" })] }));
    feed.push({
      kind: "load",
      epoch: "e1",
      samples: [{ replicaId: "r1", load: { waiting: 2 }, reportedAtMs: T0 }],
    });
    const late = createRoutingState({ hashSecret: sha256, now: () => T0 });
    feed.subscribe((m) => late.apply(m));
    expect(late.version).toBe(6);
    expect(late.routeTable.resolve("alpha")).toEqual(early.routeTable.resolve("alpha"));
    expect(late.routeTable.resolve("alpha")?.replicas.map((r) => [r.state, r.load])).toEqual([
      ["ready", { waiting: 2 }],
      ["draining", undefined],
    ]);
  });

  it("calls every listener even when one throws, then rethrows the first error", () => {
    const feed = createManualRoutingFeed();
    const heard: string[] = [];
    feed.subscribe(() => {
      throw new Error("first");
    });
    feed.subscribe(() => {
      throw new Error("second");
    });
    feed.subscribe((m) => heard.push(m.kind));
    expect(() => feed.push(snapshot)).toThrow("first");
    expect(heard).toEqual(["snapshot"]);
  });

  it("waits for subscribers", async () => {
    const feed = createManualRoutingFeed();
    await feed.waitForSubscribers(0);
    const two = feed.waitForSubscribers(2);
    let done = false;
    void two.then(() => {
      done = true;
    });
    feed.subscribe(() => {});
    await Promise.resolve();
    expect(done).toBe(false);
    feed.subscribe(() => {});
    await two;
    expect(feed.subscribers).toBe(2);
  });
});
