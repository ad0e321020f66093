import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { simulateInventory } from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import { EngineLoadSchema, ReplicaState, ReplicaStatusSchema } from "@llmgw/proto";
import type { RoutingDelta, RoutingMessage } from "@llmgw/router";
import { schedule } from "@llmgw/scheduler";
import { inventoryToProto } from "@llmgw/wire";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { Cluster } from "../domain/cluster.js";
import { openSqliteStore } from "../store/sqlite-store.js";
import type { ClusterStore } from "../store/types.js";
import { createManualClock, type ManualClock } from "../testing/manual-clock.js";
import { createRoutingPublisher, type RoutingPublisher, streamRoutingFeed } from "./publisher.js";
import { createRouterRegistry } from "./router-registry.js";

let dir: string;
let store: ClusterStore;
let clock: ManualClock;
let cluster: Cluster;
const publishers: RoutingPublisher[] = [];

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "llmgw-publisher-"));
  store = openSqliteStore({ file: join(dir, "state.db") });
  clock = createManualClock();
  cluster = new Cluster({
    store,
    schedule,
    clock,
    heartbeatIntervalMs: 1_000,
    unreachableAfterMs: 3_000,
    nodeLostAfterMs: 10_000,
    rendezvousPortMin: 29_500,
    rendezvousPortMax: 29_999,
  });
});
afterEach(() => {
  for (const p of publishers.splice(0)) p.close();
  store.close();
  rmSync(dir, { recursive: true, force: true });
});

function publish(options: Parameters<typeof createRoutingPublisher>[1] = {}) {
  const publisher = createRoutingPublisher(cluster, { epoch: "epoch-1", ...options });
  publishers.push(publisher);
  const received: RoutingMessage[] = [];
  publisher.subscribe((m) => received.push(m));
  return { publisher, received };
}

const deltas = (ms: readonly RoutingMessage[]) =>
  ms.filter((m): m is RoutingDelta => m.kind === "delta");

function deploy(name = "chat", replicas = 1) {
  cluster.applyDeployment(
    parseDeploymentSpecOrThrow({
      name,
      engine: "vllm",
      model: "org/model",
      servedModelName: `org/${name}`,
      gpuClass: "h100-80g",
      replicas,
    }),
  );
}

function joinNode(hostname = "node-a", address = "10.0.0.1") {
  return cluster.register({
    inventory: inventoryToProto(
      simulateInventory("1xh100-80g", { hostname, addresses: [address], nowMs: clock.now() }),
    ),
    advertiseAddress: address,
    replicas: [],
  }).nodeId;
}

function report(
  nodeId: string,
  state: ReplicaState,
  load?: { running: number; waiting: number },
  replicaId = "chat-0",
) {
  cluster.heartbeat(nodeId, {
    gpus: [],
    replicas: [
      create(ReplicaStatusSchema, {
        replicaId,
        rank: 0,
        state,
        apiPort: 41_000,
        ...(load ? { load: create(EngineLoadSchema, load) } : {}),
      }),
    ],
    problems: [],
  });
}

describe("createRoutingPublisher", () => {
  it("gives a subscriber the current snapshot first, load included", () => {
    const nodeId = joinNode();
    deploy();
    report(nodeId, ReplicaState.READY, { running: 3, waiting: 1 });
    const { key } = cluster.createApiKey({ name: "team-a", models: [], requestsPerMinute: 60 });
    const { received } = publish();
    expect(received).toHaveLength(1);
    expect(received[0]).toMatchObject({
      kind: "snapshot",
      epoch: "epoch-1",
      version: 1,
      routers: 1,
      models: [{ name: "org/chat", deployment: "chat", policy: "llmgw", loading: false }],
      replicas: [
        {
          id: "chat-0",
          model: "org/chat",
          deployment: "chat",
          baseUrl: "http://10.0.0.1:41000",
          state: "ready",
          capacity: 64,
          load: { running: 3, waiting: 1 },
        },
      ],
      keys: [{ id: key.id, name: "team-a", rpm: 60 }],
    });
  });

  it("sends one delta for a deploy within the window, and nothing for an unchanged membership", async () => {
    const nodeId = joinNode();
    const { publisher, received } = publish({ coalesceMs: 10 });
    deploy();
    const started = performance.now();
    await vi.waitFor(() => expect(deltas(received)).toHaveLength(1), { interval: 2 });
    expect(performance.now() - started).toBeLessThan(500);
    expect(deltas(received)[0]).toMatchObject({
      version: 2,
      upsertedModels: [{ name: "org/chat", deployment: "chat" }],
      removedModels: [],
      upsertedReplicas: [],
    });
    report(nodeId, ReplicaState.READY);
    await vi.waitFor(() => expect(deltas(received)).toHaveLength(2), { interval: 2 });
    expect(deltas(received)[1]).toMatchObject({
      version: 3,
      upsertedReplicas: [{ id: "chat-0", baseUrl: "http://10.0.0.1:41000", state: "ready" }],
    });
    // A second replica nowhere to place: the deployment changed, what routers see did not.
    const reads = publisher.stats().membershipReads;
    cluster.scaleDeployment("chat", 2);
    await vi.waitFor(() => expect(publisher.stats().membershipReads).toBe(reads + 1), {
      interval: 2,
    });
    expect(deltas(received)).toHaveLength(2);
    expect(publisher.version).toBe(3);
  });

  it("turns a load-only heartbeat into a LoadUpdate, never a delta", async () => {
    const nodeId = joinNode();
    deploy();
    report(nodeId, ReplicaState.READY);
    const { publisher, received } = publish({ coalesceMs: 5, loadFlushMs: 10 });
    const version = cluster.routingVersion;
    clock.advance(500);
    report(nodeId, ReplicaState.READY, { running: 7, waiting: 2 });
    await vi.waitFor(() => expect(received.map((m) => m.kind)).toContain("load"), {
      interval: 2,
    });
    expect(cluster.routingVersion).toBe(version);
    expect(received.find((m) => m.kind === "load")).toMatchObject({
      kind: "load",
      epoch: "epoch-1",
      samples: [{ replicaId: "chat-0", load: { running: 7, waiting: 2 } }],
    });
    await new Promise((resolve) => setTimeout(resolve, 30));
    expect(deltas(received)).toEqual([]);
    expect(publisher.version).toBe(1);
    // A later subscriber's snapshot carries the new load.
    const late: RoutingMessage[] = [];
    publisher.subscribe((m) => late.push(m));
    expect(late[0]).toMatchObject({ replicas: [{ id: "chat-0", load: { running: 7 } }] });
  });

  it("removes a revoked key in a delta", async () => {
    const { key } = cluster.createApiKey({ name: "team-a", models: ["org/chat"] });
    const { received } = publish({ coalesceMs: 5 });
    expect(received[0]).toMatchObject({ keys: [{ id: key.id, models: ["org/chat"] }] });
    cluster.revokeApiKey("team-a");
    await vi.waitFor(() => expect(deltas(received)).toHaveLength(1), { interval: 2 });
    expect(deltas(received)[0]).toMatchObject({
      version: 2,
      removedKeys: [key.id],
      upsertedKeys: [],
    });
  });

  it("publishes a pending change at once on flush (an admin call returns after it)", () => {
    const { publisher, received } = publish({ coalesceMs: 60_000 });
    const { key } = cluster.createApiKey({ name: "team-b", models: [] });
    expect(deltas(received)).toHaveLength(0); // the window is a minute long
    publisher.flush();
    expect(deltas(received)).toHaveLength(1);
    expect(deltas(received)[0]).toMatchObject({ upsertedKeys: [{ id: key.id }] });
    publisher.flush(); // nothing pending: nothing sent
    expect(deltas(received)).toHaveLength(1);
  });

  it("coalesces ten changes within one window into one delta", async () => {
    const { publisher, received } = publish({ coalesceMs: 50 });
    for (let i = 0; i < 10; i++) cluster.createApiKey({ name: `key-${i}`, models: [] });
    await vi.waitFor(() => expect(deltas(received)).toHaveLength(1), { interval: 5 });
    await new Promise((resolve) => setTimeout(resolve, 60));
    expect(deltas(received)).toHaveLength(1);
    expect(deltas(received)[0]?.upsertedKeys.map((k) => k.name)).toEqual(
      Array.from({ length: 10 }, (_, i) => `key-${i}`),
    );
    expect(publisher.stats()).toMatchObject({ deltas: 1, membershipReads: 2 });
  });

  it("sends the router count in a delta when it changes", async () => {
    const registry = createRouterRegistry();
    const { received } = publish({ coalesceMs: 5, routers: registry });
    expect(received[0]).toMatchObject({ routers: 1 });
    const a = registry.connect({ id: "a", address: "", version: "" });
    const b = registry.connect({ id: "b", address: "", version: "" });
    await vi.waitFor(() => expect(deltas(received)).toHaveLength(1), { interval: 2 });
    expect(deltas(received)[0]).toMatchObject({ version: 2, routers: 2, upsertedKeys: [] });
    b.close();
    a.close();
    await vi.waitFor(() => expect(deltas(received)).toHaveLength(2), { interval: 2 });
    // No router left is still one: each router's share divisor never drops below 1.
    expect(deltas(received)[1]).toMatchObject({ version: 3, routers: 1 });
  });

  it("sends keepalives on a quiet feed only", async () => {
    const { publisher, received } = publish({ keepaliveMs: 20 });
    await vi.waitFor(() => expect(received.map((m) => m.kind)).toContain("keepalive"), {
      interval: 5,
    });
    expect(received.find((m) => m.kind === "keepalive")).toMatchObject({
      epoch: "epoch-1",
      version: 1,
      intervalMs: 20,
    });
    expect(publisher.stats().keepalives).toBeGreaterThan(0);
  });

  it("drops a subscriber that throws and keeps serving the others", async () => {
    const logged: string[] = [];
    const { publisher, received } = publish({ coalesceMs: 5, log: (l) => logged.push(l) });
    let calls = 0;
    publisher.subscribe(() => {
      calls++;
      if (calls > 1) throw new Error("boom");
    });
    cluster.createApiKey({ name: "k1", models: [] });
    await vi.waitFor(() => expect(deltas(received)).toHaveLength(1), { interval: 2 });
    cluster.createApiKey({ name: "k2", models: [] });
    await vi.waitFor(() => expect(deltas(received)).toHaveLength(2), { interval: 2 });
    expect(calls).toBe(2);
    expect(logged).toEqual(["routing publisher: dropped a subscriber that threw: boom"]);
  });

  it.each([
    [
      { coalesceMs: 0 },
      "routing publisher: coalesceMs must be a whole number of ms in 1–600000 (got 0)",
    ],
    [
      { loadFlushMs: 1.5 },
      "routing publisher: loadFlushMs must be a whole number of ms in 1–600000 (got 1.5)",
    ],
    [
      { keepaliveMs: 700_000 },
      "routing publisher: keepaliveMs must be a whole number of ms in 1–600000 (got 700000)",
    ],
  ])("refuses %j", (bad, message) => {
    expect(() => createRoutingPublisher(cluster, bad)).toThrow(message);
  });
});

describe("streamRoutingFeed", () => {
  it("yields the snapshot then later messages in order", async () => {
    const { publisher } = publish({ coalesceMs: 5 });
    const stream = streamRoutingFeed(publisher);
    expect((await stream.next()).value).toMatchObject({ kind: "snapshot", version: 1 });
    cluster.createApiKey({ name: "k1", models: [] });
    expect((await stream.next()).value).toMatchObject({ kind: "delta", version: 2 });
    await stream.return();
    expect(publisher.stats().subscribers).toBe(1);
  });

  it("cuts off a reader that stops reading, and frees its queue", async () => {
    const { publisher } = publish({ coalesceMs: 1 });
    const stream = streamRoutingFeed(publisher, { maxQueued: 3 });
    await stream.next();
    for (let i = 0; i < 4; i++) {
      cluster.createApiKey({ name: `k${i}`, models: [] });
      await vi.waitFor(() => expect(publisher.version).toBe(i + 2), { interval: 1 });
    }
    await expect(stream.next()).rejects.toMatchObject({
      code: "LLMGW_CONTROL_PLANE_ROUTER_TOO_SLOW",
      message:
        "the router read too slowly: 3 routing messages were waiting for it; reconnect for a fresh snapshot",
    });
    expect(publisher.stats().subscribers).toBe(1);
  });

  it("ends with the signal's reason", async () => {
    const { publisher } = publish();
    const stop = new AbortController();
    const stream = streamRoutingFeed(publisher, { signal: stop.signal });
    await stream.next();
    const pending = stream.next();
    stop.abort(new Error("shutting down"));
    await expect(pending).rejects.toThrow("shutting down");
    expect(publisher.stats().subscribers).toBe(1);
  });
});
