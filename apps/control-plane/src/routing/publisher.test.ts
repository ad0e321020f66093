import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { simulateInventory } from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import type {
  KeyGrant,
  ReplicaLoadSample,
  RoutedModel,
  RoutedReplica,
  RoutingDelta,
  RoutingMessage,
  RoutingSnapshot,
} from "@llmgw/router";
import { schedule } from "@llmgw/scheduler";
import { routingMessageToProto } from "@llmgw/wire";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { Cluster } from "../domain/cluster.js";
import type { ReplicaStateName } from "../domain/replica-state.js";
import { openSqliteStore } from "../store/sqlite-store.js";
import type { ClusterStore } from "../store/types.js";
import { createManualClock, type ManualClock } from "../testing/manual-clock.js";
import { rankStatus } from "../testing/reports.js";
import {
  createRoutingPublisher,
  type RoutingPublisher,
  type RoutingSource,
  streamRoutingFeed,
} from "./publisher.js";
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

/**
 * The real cluster as a routing source, plus entities an older or buggy control plane could
 * hold, added to what it lists; `emitLoad` hands every load listener a sample directly.
 */
function withExtras(extra: {
  models?: RoutedModel[];
  replicas?: RoutedReplica[];
  keys?: KeyGrant[];
}): RoutingSource & { emitLoad(sample: ReplicaLoadSample): void } {
  const loadListeners = new Set<(sample: ReplicaLoadSample) => void>();
  return {
    get routingVersion() {
      return cluster.routingVersion;
    },
    onRoutingChange: (listener) => cluster.onRoutingChange(listener),
    // Extras count as topology: the publisher reads the whole membership whenever they could.
    get routingTopologyVersion() {
      return cluster.routingVersion;
    },
    routingKeys() {
      return [...cluster.routingKeys(), ...(extra.keys ?? [])];
    },
    routingMembership() {
      const m = cluster.routingMembership();
      return {
        models: [...m.models, ...(extra.models ?? [])],
        replicas: [...m.replicas, ...(extra.replicas ?? [])],
        keys: [...m.keys, ...(extra.keys ?? [])],
      };
    },
    onLoad(listener) {
      loadListeners.add(listener);
      const off = cluster.onLoad(listener);
      return () => {
        loadListeners.delete(listener);
        off();
      };
    },
    emitLoad(sample) {
      for (const l of loadListeners) l(sample);
    },
  };
}

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
    inventory: simulateInventory("1xh100-80g", {
      hostname,
      addresses: [address],
      nowMs: clock.now(),
    }),
    advertiseAddress: address,
    replicas: [],
  }).nodeId;
}

function report(
  nodeId: string,
  state: ReplicaStateName,
  load?: { running: number; waiting: number },
  replicaId = "chat-0",
) {
  cluster.heartbeat(nodeId, {
    gpus: [],
    replicas: [
      rankStatus({
        replicaId,
        rank: 0,
        state,
        apiPort: 41_000,
        ...(load ? { load } : {}),
      }),
    ],
    problems: [],
  });
}

describe("createRoutingPublisher", () => {
  it("gives a subscriber the current snapshot first, load included", () => {
    const nodeId = joinNode();
    deploy();
    report(nodeId, "ready", { running: 3, waiting: 1 });
    const { key } = cluster.apiKeys.create({ name: "team-a", models: [], requestsPerMinute: 60 });
    const { received } = publish();
    expect(received).toHaveLength(2);
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
    // Then a keepalive, so a router learns the interval now rather than after one or two.
    expect(received[1]).toMatchObject({
      kind: "keepalive",
      epoch: "epoch-1",
      version: 1,
      intervalMs: 2_000,
    });
  });

  it("gives a new subscriber the router count as the registry has it now", () => {
    const registry = createRouterRegistry();
    const { publisher } = publish({ coalesceMs: 60_000, routers: registry });
    const a = registry.connect({ id: "a", address: "", version: "" });
    const b = registry.connect({ id: "b", address: "", version: "" });
    // The delta saying 2 waits for its window; a router connecting now takes its share at once.
    const late: RoutingMessage[] = [];
    publisher.subscribe((m) => late.push(m));
    expect(late[0]).toMatchObject({ kind: "snapshot", version: 1, routers: 2 });
    // Even when the count goes back before the window ends, every router hears it.
    b.close();
    publisher.flush();
    expect(deltas(late)).toMatchObject([{ version: 2, routers: 1 }]);
    a.close();
  });

  it("leaves out each model, replica, key and load sample routers would refuse, and publishes the rest", async () => {
    const nodeId = joinNode();
    deploy();
    report(nodeId, "ready", { running: 1, waiting: 0 });
    const { key } = cluster.apiKeys.create({ name: "team-a", models: [] });
    const good: RoutedReplica = {
      id: "extra-0",
      model: "org/chat",
      deployment: "chat",
      baseUrl: "http://10.0.0.9:8000",
      state: "ready",
      capacity: 4,
    };
    const source = withExtras({
      models: [{ name: "", deployment: "ghost", policy: "llmgw", loading: false }],
      replicas: [
        { ...good, id: "bad-capacity", capacity: 0 },
        { ...good, id: "bad-url", baseUrl: "ftp://10.0.0.9" },
        { ...good, id: "bad-load", load: { running: -3, kvCacheUsage: 7 }, loadReportedAtMs: 5 },
      ],
      keys: [
        { id: "key_rpm0", name: "old", secretSha256: "a".repeat(64), rpm: 0 },
        { id: "key_model", name: "old2", secretSha256: "b".repeat(64), models: ["m".repeat(300)] },
      ],
    });
    const logs: string[] = [];
    const publisher = createRoutingPublisher(source, {
      epoch: "epoch-1",
      coalesceMs: 5,
      loadFlushMs: 5,
      log: (l) => logs.push(l),
    });
    publishers.push(publisher);
    const received: RoutingMessage[] = [];
    publisher.subscribe((m) => received.push(m));
    const snapshot = received[0] as RoutingSnapshot;
    // What every router would accept: the wire conversion runs the routers' validator.
    expect(() => routingMessageToProto(snapshot)).not.toThrow();
    expect(snapshot.models.map((m) => m.name)).toEqual(["org/chat"]);
    expect(snapshot.replicas.map((r) => r.id)).toEqual(["chat-0", "bad-load"]);
    // A replica's bad load leaves only its load out: it routes without load signals.
    expect(snapshot.replicas[1]).not.toHaveProperty("load");
    expect(snapshot.replicas[0]).toMatchObject({ load: { running: 1, waiting: 0 } });
    expect(snapshot.keys.map((k) => k.id)).toEqual([key.id]);
    expect(publisher.stats()).toMatchObject({ leftOut: 5, loadSamplesLeftOut: 1 });
    expect(logs).toEqual([
      'routing publisher: left out model "", routers would refuse it: name must be a string of 1..256 characters, got ""',
      'routing publisher: left out replica "bad-capacity", routers would refuse it: capacity must be an integer in [1, 1000000], got 0',
      'routing publisher: left out replica "bad-url", routers would refuse it: baseUrl must be an http(s) URL, got "ftp://10.0.0.9"',
      'routing publisher: left out key "key_rpm0", routers would refuse it: rpm must be an integer in [1, 4294967295], got 0',
      `routing publisher: left out key "key_model", routers would refuse it: models[0] must be a string of 1..256 characters, got "${"m".repeat(64)}"… (300 chars)`,
      'routing publisher: left out load of replica "bad-load", routers would refuse it: load.running must be a finite number in [0, 1000000000], got -3',
    ]);

    // Membership moves: the delta carries the change and encodes; the bad ones are not named again.
    cluster.apiKeys.create({ name: "team-b", models: [] });
    await vi.waitFor(() => expect(deltas(received)).toHaveLength(1), { interval: 2 });
    const delta = deltas(received)[0] as RoutingDelta;
    expect(() => routingMessageToProto(delta)).not.toThrow();
    expect(delta.upsertedKeys.map((k) => k.name)).toEqual(["team-b"]);
    expect(logs).toHaveLength(6);

    // A bad load sample is dropped and named; a good one still goes out, in one LoadUpdate.
    const at = clock.now() + 10;
    source.emitLoad({ replicaId: "chat-0", load: { waiting: Number.NaN }, reportedAtMs: at });
    source.emitLoad({ replicaId: "bad-load", load: { running: 2 }, reportedAtMs: at });
    await vi.waitFor(() => expect(received.some((m) => m.kind === "load")).toBe(true), {
      interval: 2,
    });
    const update = received.find((m) => m.kind === "load");
    expect(update).toMatchObject({
      samples: [{ replicaId: "bad-load", load: { running: 2 }, reportedAtMs: at }],
    });
    expect(() => routingMessageToProto(update as RoutingMessage)).not.toThrow();
    expect(logs.slice(6)).toEqual([
      'routing publisher: left out load of replica "chat-0", routers would refuse it: load.waiting must be a finite number in [0, 1000000000], got NaN',
    ]);
    // A later snapshot keeps chat-0's last good load, not the refused one.
    const late: RoutingMessage[] = [];
    publisher.subscribe((m) => late.push(m));
    expect((late[0] as RoutingSnapshot).replicas[0]).toMatchObject({
      id: "chat-0",
      load: { running: 1, waiting: 0 },
    });
    expect(() => routingMessageToProto(late[0] as RoutingMessage)).not.toThrow();
  });

  it("orders load by the control plane's clock: an agent 1.5 s behind still reaches routers", async () => {
    const nodeId = joinNode();
    deploy();
    report(nodeId, "ready");
    const { received } = publish({ coalesceMs: 5, loadFlushMs: 5 });
    report(nodeId, "ready", { running: 1, waiting: 0 });
    await vi.waitFor(() => expect(received.some((m) => m.kind === "load")).toBe(true), {
      interval: 2,
    });
    clock.advance(500);
    // Read from the engine after that heartbeat; the agent's clock says 1.5 s earlier.
    cluster.reportLoad(nodeId, [
      { replicaId: "chat-0", load: { running: 42 }, scrapedAtMs: clock.now() - 1_500 },
    ]);
    await vi.waitFor(() => expect(received.filter((m) => m.kind === "load")).toHaveLength(2), {
      interval: 2,
    });
    expect(received.filter((m) => m.kind === "load").at(-1)).toMatchObject({
      samples: [{ replicaId: "chat-0", load: { running: 42 }, reportedAtMs: clock.now() }],
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
    report(nodeId, "ready");
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
    report(nodeId, "ready");
    const { publisher, received } = publish({ coalesceMs: 5, loadFlushMs: 10 });
    const version = cluster.routingVersion;
    clock.advance(500);
    report(nodeId, "ready", { running: 7, waiting: 2 });
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
    const { key } = cluster.apiKeys.create({ name: "team-a", models: ["org/chat"] });
    const { received } = publish({ coalesceMs: 5 });
    expect(received[0]).toMatchObject({ keys: [{ id: key.id, models: ["org/chat"] }] });
    cluster.apiKeys.revoke("team-a");
    await vi.waitFor(() => expect(deltas(received)).toHaveLength(1), { interval: 2 });
    expect(deltas(received)[0]).toMatchObject({
      version: 2,
      removedKeys: [key.id],
      upsertedKeys: [],
    });
  });

  it("publishes a pending change at once on flush (an admin call returns after it)", () => {
    const { publisher, received } = publish({ coalesceMs: 60_000 });
    const { key } = cluster.apiKeys.create({ name: "team-b", models: [] });
    expect(deltas(received)).toHaveLength(0); // the window is a minute long
    publisher.flush();
    expect(deltas(received)).toHaveLength(1);
    expect(deltas(received)[0]).toMatchObject({ upsertedKeys: [{ id: key.id }] });
    publisher.flush(); // nothing pending: nothing sent
    expect(deltas(received)).toHaveLength(1);
  });

  it("coalesces ten changes within one window into one delta", async () => {
    const { publisher, received } = publish({ coalesceMs: 50 });
    for (let i = 0; i < 10; i++) cluster.apiKeys.create({ name: `key-${i}`, models: [] });
    await vi.waitFor(() => expect(deltas(received)).toHaveLength(1), { interval: 5 });
    await new Promise((resolve) => setTimeout(resolve, 60));
    expect(deltas(received)).toHaveLength(1);
    expect(deltas(received)[0]?.upsertedKeys.map((k) => k.name)).toEqual(
      Array.from({ length: 10 }, (_, i) => `key-${i}`),
    );
    // The first read is the whole membership; ten key changes then read only the keys.
    expect(publisher.stats()).toMatchObject({ deltas: 1, membershipReads: 1, keyReads: 1 });
  });

  it("reads only the key grants for a key change, and the whole membership after a replica change", async () => {
    const nodeId = joinNode();
    deploy();
    report(nodeId, "ready");
    const { publisher, received } = publish({ coalesceMs: 5 });
    const topology = cluster.routingTopologyVersion;
    const { key } = cluster.apiKeys.create({ name: "team-c", models: [] });
    expect(cluster.routingTopologyVersion).toBe(topology);
    await vi.waitFor(() => expect(deltas(received)).toHaveLength(1), { interval: 2 });
    expect(deltas(received)[0]).toMatchObject({
      upsertedKeys: [{ id: key.id }],
      upsertedReplicas: [],
    });
    expect(publisher.stats()).toMatchObject({ membershipReads: 1, keyReads: 1 });
    report(nodeId, "unhealthy");
    await vi.waitFor(() => expect(deltas(received)).toHaveLength(2), { interval: 2 });
    expect(deltas(received)[1]).toMatchObject({ removedReplicas: ["chat-0"], upsertedKeys: [] });
    expect(publisher.stats()).toMatchObject({ membershipReads: 2, keyReads: 1 });
  });

  it("publishes tenants in the snapshot, and their changes in deltas on the keys' path", async () => {
    cluster.tenants.create("search", { tokensPerMinute: 1000, priority: "critical", weight: 5 });
    const { publisher, received } = publish({ coalesceMs: 5 });
    expect(received[0]).toMatchObject({
      kind: "snapshot",
      tenants: [{ name: "search", tpm: 1000, priority: "critical", weight: 5 }],
    });
    cluster.tenants.create("batch", { budgets: [{ period: "month", model: "chat", tokens: 9 }] });
    const { key } = cluster.apiKeys.create({
      name: "app",
      models: [],
      tenant: "batch",
      priority: "batch",
      budgets: [{ period: "day", tokens: 5 }],
    });
    await vi.waitFor(() => expect(deltas(received)).toHaveLength(1), { interval: 2 });
    expect(deltas(received)[0]).toMatchObject({
      upsertedTenants: [
        { name: "batch", budgets: [{ period: "month", model: "chat", tokens: 9 }], weight: 1 },
      ],
      upsertedKeys: [
        { id: key.id, tenant: "batch", priority: "batch", budgets: [{ period: "day", tokens: 5 }] },
      ],
    });
    expect(deltas(received)[0]).not.toHaveProperty("removedTenants");
    cluster.tenants.update("search", { weight: 7 }, ["weight"]);
    await vi.waitFor(() => expect(deltas(received)).toHaveLength(2), { interval: 2 });
    expect(deltas(received)[1]).toMatchObject({
      upsertedTenants: [{ name: "search", tpm: 1000, priority: "critical", weight: 7 }],
      upsertedKeys: [],
    });
    // A change of its cache isolation alone is a change routers must hear of.
    cluster.tenants.update("search", { cacheIsolation: "key" }, ["cache_isolation"]);
    await vi.waitFor(() => expect(deltas(received)).toHaveLength(3), { interval: 2 });
    expect(deltas(received)[2]).toMatchObject({
      upsertedTenants: [{ name: "search", weight: 7, cacheIsolation: "key" }],
    });
    cluster.apiKeys.revoke("app");
    cluster.tenants.delete("batch");
    await vi.waitFor(() => expect(deltas(received)).toHaveLength(4), { interval: 2 });
    expect(deltas(received)[3]).toMatchObject({ removedTenants: ["batch"], removedKeys: [key.id] });
    // Tenants changed with keys: the replicas were never walked again.
    expect(publisher.stats()).toMatchObject({ membershipReads: 1, keyReads: 4 });
    // A new subscriber's snapshot holds what the deltas built.
    const late: RoutingMessage[] = [];
    publisher.subscribe((m) => late.push(m));
    expect(late[0]).toMatchObject({
      tenants: [{ name: "search", weight: 7, cacheIsolation: "key" }],
    });
  });

  it("carries a replica's GPUs and whether its engine schedules by priority", () => {
    const nodeId = joinNode();
    cluster.applyDeployment(
      parseDeploymentSpecOrThrow({
        name: "chat",
        engine: "vllm",
        model: "org/model",
        servedModelName: "org/chat",
        gpuClass: "h100-80g",
        extraArgs: ["--scheduling-policy=priority"],
      }),
    );
    report(nodeId, "ready");
    const { received } = publish();
    expect(received[0]).toMatchObject({
      models: [{ name: "org/chat", enginePriority: true, cacheIsolation: "salt" }],
      replicas: [{ id: "chat-0", gpus: 1 }],
    });
  });

  it("sends a model again when its engine isolates caches another way", async () => {
    const { received } = publish({ coalesceMs: 5 });
    const deploy = (engine: string, model: string) =>
      cluster.applyDeployment(
        parseDeploymentSpecOrThrow({
          name: "chat",
          engine,
          model,
          servedModelName: "chat",
          replicas: 0,
        }),
      );
    deploy("vllm", "org/model");
    await vi.waitFor(() => expect(deltas(received)).toHaveLength(1), { interval: 2 });
    deploy("llamacpp", "/models/chat.gguf");
    await vi.waitFor(() => expect(deltas(received)).toHaveLength(2), { interval: 2 });
    expect(deltas(received)[1]).toMatchObject({
      upsertedModels: [{ name: "chat", cacheIsolation: "no-reuse" }],
    });
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

  it("sends a keepalive after each snapshot, then on a quiet feed", async () => {
    const { publisher, received } = publish({ keepaliveMs: 20 });
    expect(received.map((m) => m.kind)).toEqual(["snapshot", "keepalive"]);
    await vi.waitFor(
      () => expect(received.filter((m) => m.kind === "keepalive").length).toBeGreaterThan(1),
      { interval: 5 },
    );
    expect(received.filter((m) => m.kind === "keepalive").at(-1)).toMatchObject({
      epoch: "epoch-1",
      version: 1,
      intervalMs: 20,
    });
    expect(publisher.stats().keepalives).toBeGreaterThan(1);
  });

  it("drops a subscriber that throws and keeps serving the others", async () => {
    const logged: string[] = [];
    const { publisher, received } = publish({ coalesceMs: 5, log: (l) => logged.push(l) });
    let calls = 0;
    publisher.subscribe(() => {
      calls++;
      // The snapshot and its keepalive pass; the first delta throws.
      if (calls > 2) throw new Error("boom");
    });
    cluster.apiKeys.create({ name: "k1", models: [] });
    await vi.waitFor(() => expect(deltas(received)).toHaveLength(1), { interval: 2 });
    cluster.apiKeys.create({ name: "k2", models: [] });
    await vi.waitFor(() => expect(deltas(received)).toHaveLength(2), { interval: 2 });
    expect(calls).toBe(3);
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
    [{ epoch: "" }, "routing publisher: epoch must be 1–64 characters (got 0)"],
    [{ epoch: "e".repeat(65) }, "routing publisher: epoch must be 1–64 characters (got 65)"],
  ])("refuses %j", (bad, message) => {
    expect(() => createRoutingPublisher(cluster, bad)).toThrow(message);
  });
});

describe("streamRoutingFeed", () => {
  it("yields the snapshot then later messages in order", async () => {
    const { publisher } = publish({ coalesceMs: 5 });
    const stream = streamRoutingFeed(publisher);
    expect((await stream.next()).value).toMatchObject({ kind: "snapshot", version: 1 });
    expect((await stream.next()).value).toMatchObject({ kind: "keepalive", version: 1 });
    cluster.apiKeys.create({ name: "k1", models: [] });
    expect((await stream.next()).value).toMatchObject({ kind: "delta", version: 2 });
    await stream.return();
    expect(publisher.stats().subscribers).toBe(1);
  });

  it("cuts off a reader that stops reading, and frees its queue", async () => {
    const { publisher } = publish({ coalesceMs: 1 });
    const stream = streamRoutingFeed(publisher, { maxQueued: 3 });
    await stream.next();
    for (let i = 0; i < 4; i++) {
      cluster.apiKeys.create({ name: `k${i}`, models: [] });
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
    await stream.next(); // the snapshot
    await stream.next(); // its keepalive
    const pending = stream.next();
    stop.abort(new Error("shutting down"));
    await expect(pending).rejects.toThrow("shutting down");
    expect(publisher.stats().subscribers).toBe(1);
  });
});
