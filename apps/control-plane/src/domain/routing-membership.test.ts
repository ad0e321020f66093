// What routers route by (Cluster.routingMembership), when its version moves, and how load
// travels apart from it (heartbeats, ReportLoad, onLoad).
import { simulateInventory } from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import type { ReplicaLoadSample } from "@llmgw/router";
import { schedule } from "@llmgw/scheduler";
import { describe, expect, it } from "vitest";
import type { ClusterStore } from "../store/types.js";
import type { ManualClock } from "../testing/manual-clock.js";
import { gpuReading, rankStatus } from "../testing/reports.js";
import { sqliteStoreEachTest } from "../testing/sqlite-fixture.js";
import { Cluster, type EngineCredentialInput, LOAD_REFRESH_MS } from "./cluster.js";
import type { ReplicaStateName } from "./replica-state.js";
import { hashSecret } from "./tokens.js";

let store: ClusterStore;
let clock: ManualClock;

sqliteStoreEachTest("llmgw-routing-", (f) => {
  ({ store, clock } = f);
});

const spec = (input: Record<string, unknown>) =>
  parseDeploymentSpecOrThrow({ engine: "sim", model: "org/model", gpuClass: "h100-80g", ...input });

type Load = {
  running?: number;
  waiting?: number;
  kvCacheUsage?: number;
  prefixCacheHitRate?: number;
};

/** A cluster with nodes a (10.0.0.1) and b (10.0.0.2), one H100 each, and recorders. */
function setup() {
  const logs: string[] = [];
  const cluster = new Cluster({
    store,
    schedule,
    clock,
    log: (line) => logs.push(line),
    heartbeatIntervalMs: 1000,
    unreachableAfterMs: 3000,
    nodeLostAfterMs: 10_000,
    rendezvousPortMin: 29_500,
    rendezvousPortMax: 29_999,
  });
  const join_ = (hostname: string, address: string) =>
    cluster.register({
      inventory: simulateInventory("1xh100-80g@ib-a", {
        hostname,
        addresses: [address],
        nowMs: clock.now(),
      }),
      advertiseAddress: address,
      replicas: [],
    }).nodeId;
  const a = join_("node-a", "10.0.0.1");
  const b = join_("node-b", "10.0.0.2");
  /** Node `nodeId` reports every rank it runs in `state` on port 8000, with `load` on each. */
  const beat = (
    nodeId: string,
    opts: {
      state?: ReplicaStateName;
      load?: Load;
      port?: number;
      credentials?: EngineCredentialInput[];
      gpuHealthy?: boolean;
    } = {},
  ) =>
    cluster.heartbeat(nodeId, {
      gpus:
        opts.gpuHealthy === false
          ? [
              gpuReading({
                index: 0,
                uuid: "",
                healthy: false,
                healthProblems: [{ code: "X", message: "ECC", source: "" }],
              }),
            ]
          : [],
      problems: [],
      replicas: cluster.desiredSet(nodeId).assignments.map((x) =>
        rankStatus({
          replicaId: x.replicaId,
          rank: x.rank,
          state: opts.state ?? "ready",
          apiPort: opts.port ?? 8000,
          ...(opts.load ? { load: opts.load } : {}),
        }),
      ),
      engineCredentials: opts.credentials ?? [],
    });
  const servedBy = (nodeId: string) =>
    cluster.placements().find((p) => p.ranks[0]?.nodeId === nodeId)?.replicaId as string;
  const samples: ReplicaLoadSample[] = [];
  cluster.onLoad((s) => samples.push(s));
  let bumps = 0;
  cluster.onRoutingChange(() => bumps++);
  /** Routing bumps during `fn`, checked against routingVersion. */
  const bumpsDuring = (fn: () => void) => {
    const before = bumps;
    const version = cluster.routingVersion;
    fn();
    expect(cluster.routingVersion - version).toBe(bumps - before);
    return bumps - before;
  };
  const ids = () => cluster.routingMembership().replicas.map((r) => r.id);
  return { cluster, a, b, beat, servedBy, samples, bumpsDuring, ids, logs };
}

describe("Cluster.routingMembership", () => {
  it("says how a model's engines keep caches apart only while all its ready replicas agree", () => {
    const { cluster, a, b, beat } = setup();
    cluster.applyDeployment(spec({ name: "chat-sim", servedModelName: "chat", replicas: 1 }));
    beat(a);
    beat(b);
    const mode = () => cluster.routingMembership().models.find((m) => m.name === "chat");
    expect(mode()?.cacheIsolation).toBe("salt");
    // A second deployment of the same model on llama.cpp: while replicas of both serve, the
    // model's engines isolate two ways, and routers are told neither (they then send both).
    cluster.applyDeployment(
      parseDeploymentSpecOrThrow({
        name: "chat-llama",
        engine: "llamacpp",
        model: "/models/chat.gguf",
        servedModelName: "chat",
        gpuClass: "h100-80g",
        replicas: 1,
      }),
    );
    beat(a);
    beat(b);
    expect(
      cluster
        .readyReplicas("chat")
        .map((r) => r.deployment)
        .sort(),
    ).toEqual(["chat-llama", "chat-sim"]);
    expect(mode()).toBeDefined();
    expect(mode()).not.toHaveProperty("cacheIsolation");
    // The simulator's deployment gone, llama.cpp's way alone.
    cluster.deleteDeployment("chat-sim");
    beat(a);
    beat(b);
    expect(cluster.readyReplicas("chat").map((r) => r.deployment)).toEqual(["chat-llama"]);
    expect(mode()?.cacheIsolation).toBe("no-reuse");
  });

  it("lists every served model, the replicas that take traffic and the live key grants", () => {
    const { cluster, a, b, beat, servedBy } = setup();
    cluster.applyDeployment(
      spec({ name: "chat", servedModelName: "org/chat", replicas: 2, maxConcurrencyPerReplica: 8 }),
    );
    cluster.applyDeployment(spec({ name: "idle", replicas: 0, routingPolicy: "round-robin" }));
    const { secret } = cluster.apiKeys.create({
      name: "app",
      models: ["org/chat"],
      requestsPerMinute: 60,
      maxConcurrency: 4,
    });
    cluster.apiKeys.create({ name: "open", models: [] });
    cluster.apiKeys.revoke("open");
    const onA = servedBy(a);
    beat(a, {
      load: { running: 2, kvCacheUsage: 0.25 },
      credentials: [{ replicaId: onA, apiKey: "engine-a" }],
    });
    beat(b, { state: "loading" });

    const m = cluster.routingMembership();
    expect(m.models).toEqual([
      {
        name: "idle",
        deployment: "idle",
        policy: "round-robin",
        loading: false,
        cacheIsolation: "salt",
      },
      {
        name: "org/chat",
        deployment: "chat",
        policy: "llmgw",
        loading: true,
        cacheIsolation: "salt",
      },
    ]);
    expect(m.replicas).toEqual([
      {
        id: onA,
        model: "org/chat",
        deployment: "chat",
        baseUrl: "http://10.0.0.1:8000",
        state: "ready",
        capacity: 8,
        apiKey: "engine-a",
        gpus: 1,
        load: { running: 2, kvCacheUsage: 0.25 },
        loadReportedAtMs: clock.now(),
      },
    ]);
    expect(m.keys).toEqual([
      {
        id: expect.stringMatching(/^key_/),
        name: "app",
        secretSha256: hashSecret(secret),
        models: ["org/chat"],
        rpm: 60,
        maxConcurrency: 4,
      },
    ]);
    expect(JSON.stringify(m)).not.toContain(secret);
  });

  it("leaves out a stored key routers would refuse (from an older version), naming it once", () => {
    const stored = (id: string, name: string, extra: Record<string, unknown>) =>
      store.putApiKey({
        id,
        name,
        prefix: "sk-llmgw-old",
        secretHash: hashSecret(`sk-llmgw-${id}`),
        models: [],
        budgets: [],
        createdAtMs: 1,
        ...extra,
      });
    stored("key_rpm0", "zero-rpm", { requestsPerMinute: 0 });
    stored("key_empty", "empty-model", { models: ["org/chat", ""] });
    stored("key_good", "good", { tokensPerMinute: 1_000 });
    const { cluster, logs } = setup();
    expect(cluster.routingMembership().keys.map((k) => k.id)).toEqual(["key_good"]);
    const said = logs.filter((l) => l.includes("left out of routing"));
    expect(said).toEqual([
      'API key empty-model (key_empty) is left out of routing, routers would refuse it: models[1] must be a served model name of 1–256 characters (got ""); revoke it and create a new one',
      "API key zero-rpm (key_rpm0) is left out of routing, routers would refuse it: requestsPerMinute must be a whole number in 1–4294967295, or unset for no limit (got 0); revoke it and create a new one",
    ]);
    for (const l of said) expect(l).not.toContain("sk-llmgw-key_");
    // The membership is rebuilt on the next change: the keys stay out, named no more.
    cluster.apiKeys.create({ name: "new", models: [] });
    expect(cluster.routingMembership().keys.map((k) => k.name)).toEqual(["good", "new"]);
    expect(logs.filter((l) => l.includes("left out of routing"))).toHaveLength(2);
    // Revoking one still works (and it stays out).
    cluster.apiKeys.revoke("zero-rpm");
    expect(cluster.apiKeys.list().map((k) => k.name)).toEqual(["empty-model", "good", "new"]);
  });

  it("leaves out a replica without an endpoint or with a rank on a lost node, and load nobody reported", () => {
    const { cluster, a, b, beat, servedBy, ids } = setup();
    cluster.applyDeployment(spec({ name: "chat", replicas: 2 }));
    cluster.heartbeat(a, {
      gpus: [],
      problems: [],
      replicas: [rankStatus({ replicaId: servedBy(a), rank: 0, state: "ready" })],
    });
    beat(b);
    expect(ids()).toEqual([servedBy(b)]);
    const [onB] = cluster.routingMembership().replicas;
    expect(onB).not.toHaveProperty("load");
    expect(onB).not.toHaveProperty("loadReportedAtMs");
    expect(onB).not.toHaveProperty("apiKey");

    // b falls silent: unreachable keeps its replica, lost takes it out.
    clock.advance(3_000);
    beat(a);
    cluster.tick();
    expect(cluster.nodeState(b)).toBe("unreachable");
    expect(ids()).toEqual([servedBy(a), servedBy(b)].sort());
    const onBefore = servedBy(b);
    clock.advance(10_000);
    beat(a);
    cluster.tick();
    expect(cluster.nodeState(b)).toBe("lost");
    expect(ids()).not.toContain(onBefore);
  });
});

describe("Cluster.routingVersion", () => {
  it("stays put on a heartbeat that only carries new load, readings or problems", () => {
    const { cluster, a, b, beat, servedBy, samples, bumpsDuring } = setup();
    cluster.applyDeployment(spec({ name: "chat", replicas: 2 }));
    beat(a, { load: { running: 1 } });
    beat(b);
    const version = cluster.version;
    samples.length = 0;
    expect(
      bumpsDuring(() => {
        beat(a, { load: { running: 5, waiting: 2 } });
        cluster.heartbeat(b, {
          gpus: [gpuReading({ index: 0, uuid: "", healthy: true, temperatureCelsius: 71 })],
          problems: [{ code: "disk", message: "slow", source: "" }],
          replicas: [
            rankStatus({
              replicaId: servedBy(b),
              rank: 0,
              state: "ready",
              apiPort: 8000,
              message: "still fine",
            }),
          ],
        });
      }),
    ).toBe(0);
    // The version the admin views and caches follow still moves with every heartbeat.
    expect(cluster.version).toBeGreaterThan(version);
    expect(samples).toEqual([
      { replicaId: servedBy(a), load: { running: 5, waiting: 2 }, reportedAtMs: clock.now() },
    ]);
    expect(cluster.readyReplicas("chat").find((r) => r.replicaId === servedBy(a))?.load).toEqual({
      running: 5,
      waiting: 2,
    });
  });

  it.each<[string, { state?: ReplicaStateName; port?: number; credentials?: "own" }]>([
    ["a rank's state changes", { state: "unhealthy" }],
    ["rank 0's API port changes", { port: 9000 }],
    ["an engine key is learnt", { credentials: "own" }],
  ])("moves once when %s", (_what, change) => {
    const { cluster, a, beat, servedBy, bumpsDuring } = setup();
    cluster.applyDeployment(spec({ name: "chat" }));
    beat(a);
    const credentials =
      change.credentials === "own" ? [{ replicaId: servedBy(a), apiKey: "k1" }] : undefined;
    expect(bumpsDuring(() => beat(a, { ...change, credentials }))).toBe(1);
    expect(bumpsDuring(() => beat(a, { ...change, credentials }))).toBe(0);
  });

  it("moves when an engine key changes or goes, and when a rank stops being reported", () => {
    const { cluster, a, beat, servedBy, bumpsDuring } = setup();
    cluster.applyDeployment(spec({ name: "chat" }));
    const id = servedBy(a);
    beat(a, { credentials: [{ replicaId: id, apiKey: "k1" }] });
    expect(bumpsDuring(() => beat(a, { credentials: [{ replicaId: id, apiKey: "k2" }] }))).toBe(1);
    expect(cluster.routingMembership().replicas[0]?.apiKey).toBe("k2");
    expect(bumpsDuring(() => beat(a))).toBe(1);
    expect(bumpsDuring(() => cluster.heartbeat(a, { gpus: [], problems: [], replicas: [] }))).toBe(
      1,
    );
    expect(cluster.routingMembership().replicas).toEqual([]);
  });

  it("moves on deployment apply, scale and delete, and on API key create and revoke", () => {
    const { cluster, bumpsDuring } = setup();
    expect(bumpsDuring(() => cluster.applyDeployment(spec({ name: "chat" })))).toBe(1);
    expect(bumpsDuring(() => cluster.applyDeployment(spec({ name: "chat" })))).toBe(0);
    expect(bumpsDuring(() => cluster.scaleDeployment("chat", 2))).toBe(1);
    expect(cluster.placements()).toHaveLength(2);
    expect(bumpsDuring(() => cluster.apiKeys.create({ name: "app", models: [] }))).toBe(1);
    expect(cluster.routingMembership().keys.map((k) => k.name)).toEqual(["app"]);
    expect(bumpsDuring(() => cluster.apiKeys.revoke("app"))).toBe(1);
    expect(cluster.routingMembership().keys).toEqual([]);
    expect(bumpsDuring(() => cluster.deleteDeployment("chat"))).toBe(1);
    expect(cluster.routingMembership().models).toEqual([]);
  });

  it("moves when a node is lost and when it is back, not when it is only unreachable", () => {
    const { cluster, a, b, beat, bumpsDuring } = setup();
    cluster.applyDeployment(spec({ name: "chat" }));
    beat(a);
    clock.advance(3_000);
    beat(b);
    expect(bumpsDuring(() => cluster.tick())).toBe(0);
    expect(cluster.nodeState(a)).toBe("unreachable");
    clock.advance(10_000);
    beat(b);
    // Lost: its replica leaves the membership, and the reconcile moves it to b.
    expect(bumpsDuring(() => cluster.tick())).toBeGreaterThan(0);
    expect(cluster.nodeState(a)).toBe("lost");
    expect(bumpsDuring(() => beat(a))).toBe(1);
    expect(cluster.nodeState(a)).toBe("ready");
  });

  it("moves when a GPU turns unhealthy under a replica: the reconcile moves it away", () => {
    const { cluster, a, b, beat, servedBy, bumpsDuring, ids } = setup();
    cluster.applyDeployment(spec({ name: "chat" }));
    const on = servedBy(a) ? a : b;
    beat(on);
    expect(ids()).toHaveLength(1);
    expect(bumpsDuring(() => beat(on, { gpuHealthy: false }))).toBe(1);
    expect(cluster.placements()[0]?.ranks[0]?.nodeId).toBe(on === a ? b : a);
    expect(ids()).toEqual([]);
  });
});

describe("Cluster load", () => {
  it("takes ReportLoad only for replicas whose rank 0 the reporting node serves", () => {
    const { cluster, a, b, beat, servedBy, samples, bumpsDuring } = setup();
    cluster.applyDeployment(spec({ name: "chat", replicas: 2 }));
    beat(a);
    beat(b);
    const onA = servedBy(a);
    const version = cluster.version;
    samples.length = 0;
    expect(
      bumpsDuring(() => {
        cluster.reportLoad(a, [
          { replicaId: onA, load: { running: 7, prefixCacheHitRate: 0.5 }, scrapedAtMs: 111 },
          { replicaId: "chat-99", load: { running: 1 }, scrapedAtMs: 111 },
        ]);
        // b must never set the load of a's replica.
        cluster.reportLoad(b, [{ replicaId: onA, load: { running: 999 }, scrapedAtMs: 222 }]);
      }),
    ).toBe(0);
    expect(cluster.version).toBe(version);
    // Stamped with the control plane's clock on arrival, not the agent's scrape time.
    expect(samples).toEqual([
      { replicaId: onA, load: { running: 7, prefixCacheHitRate: 0.5 }, reportedAtMs: clock.now() },
    ]);
    const routed = cluster.routingMembership().replicas.find((r) => r.id === onA);
    expect(routed).toMatchObject({
      load: { running: 7, prefixCacheHitRate: 0.5 },
      loadReportedAtMs: clock.now(),
    });
    expect(cluster.readyReplicas("chat").find((r) => r.replicaId === onA)?.load).toEqual({
      running: 7,
      prefixCacheHitRate: 0.5,
    });
  });

  it("refreshes a replica's route in place, without rebuilding readyReplicas", () => {
    const { cluster, a, beat, servedBy } = setup();
    cluster.applyDeployment(spec({ name: "chat" }));
    beat(a, { load: { running: 1 } });
    const routes = cluster.readyReplicas("chat");
    cluster.reportLoad(a, [{ replicaId: servedBy(a), load: { running: 4 }, scrapedAtMs: 5 }]);
    beat(a, { load: { running: 4 } });
    expect(cluster.readyReplicas("chat")).toBe(routes);
    expect(routes[0]?.load).toEqual({ running: 4 });
  });

  it("announces unchanged load again once it is LOAD_REFRESH_MS old, and unknown load once", () => {
    const { cluster, a, beat, servedBy, samples } = setup();
    cluster.applyDeployment(spec({ name: "chat" }));
    beat(a);
    beat(a);
    // Load never known is not news.
    expect(samples).toEqual([]);
    beat(a, { load: { running: 1 } });
    clock.advance(LOAD_REFRESH_MS - 1);
    beat(a, { load: { running: 1 } });
    expect(samples).toHaveLength(1);
    clock.advance(1);
    beat(a, { load: { running: 1 } });
    expect(samples.map((s) => s.reportedAtMs)).toEqual([
      clock.now() - LOAD_REFRESH_MS,
      clock.now(),
    ]);
    // The engine's load became unknown: one sample without fields, and routers see none.
    beat(a);
    beat(a);
    expect(samples.at(-1)).toEqual({ replicaId: servedBy(a), load: {}, reportedAtMs: clock.now() });
    expect(samples).toHaveLength(3);
    expect(cluster.routingMembership().replicas[0]).not.toHaveProperty("load");
  });

  it("orders heartbeat and ReportLoad samples by the control plane's clock, whatever the agent's says", () => {
    const { cluster, a, beat, servedBy, samples } = setup();
    cluster.applyDeployment(spec({ name: "chat" }));
    const agentBehindMs = 1_500;
    beat(a, { load: { running: 1 } });
    const heartbeatAt = clock.now();
    clock.advance(500);
    // Scraped after the heartbeat, but the agent's clock reads 1.5 s behind the control plane.
    cluster.reportLoad(a, [
      { replicaId: servedBy(a), load: { running: 42 }, scrapedAtMs: clock.now() - agentBehindMs },
    ]);
    expect(samples.map((s) => [s.load, s.reportedAtMs])).toEqual([
      [{ running: 1 }, heartbeatAt],
      [{ running: 42 }, heartbeatAt + 500],
    ]);
    expect(cluster.routingMembership().replicas[0]).toMatchObject({
      load: { running: 42 },
      loadReportedAtMs: heartbeatAt + 500,
    });
    // An agent clock an hour ahead does not keep its load fresh: the refresh runs on ours.
    clock.advance(LOAD_REFRESH_MS);
    cluster.reportLoad(a, [
      { replicaId: servedBy(a), load: { running: 42 }, scrapedAtMs: clock.now() + 3_600_000 },
    ]);
    expect(samples.at(-1)?.reportedAtMs).toBe(clock.now());
  });

  it("leaves out heartbeat load out of range as unreported, takes the heartbeat, and logs it once", () => {
    const { cluster, a, beat, servedBy, samples, logs } = setup();
    cluster.applyDeployment(spec({ name: "chat" }));
    const bad: Load = { running: -3, waiting: 2, kvCacheUsage: 7, prefixCacheHitRate: 0.4 };
    beat(a, { load: bad });
    beat(a, { load: bad });
    expect(cluster.nodeState(a)).toBe("ready");
    const id = servedBy(a);
    expect(samples).toEqual([
      { replicaId: id, load: { waiting: 2, prefixCacheHitRate: 0.4 }, reportedAtMs: clock.now() },
    ]);
    expect(cluster.routingMembership().replicas[0]).toMatchObject({
      load: { waiting: 2, prefixCacheHitRate: 0.4 },
    });
    expect(cluster.routingMembership().replicas[0]?.load).not.toHaveProperty("running");
    expect(cluster.readyReplicas("chat")[0]?.load).toEqual({
      waiting: 2,
      prefixCacheHitRate: 0.4,
    });
    const said = (l: string) => l.includes("reported load out of range");
    expect(logs.filter(said)).toEqual([
      `replica ${id}: node ${a} reported load out of range, left out as unreported: running=-3, kvCacheUsage=7`,
    ]);
    // Good again, then bad in another field: named again.
    beat(a, { load: { running: 1 } });
    beat(a, { load: { running: 1, kvCacheUsage: Number.NaN } });
    expect(logs.filter(said)).toHaveLength(2);
    expect(logs.filter(said)[1]).toBe(
      `replica ${id}: node ${a} reported load out of range, left out as unreported: kvCacheUsage=NaN`,
    );
    // ReportLoad past its RPC check (a direct caller) is held to the same range.
    cluster.reportLoad(a, [{ replicaId: id, load: { running: 1e9, waiting: 5 }, scrapedAtMs: 0 }]);
    expect(samples.at(-1)?.load).toEqual({ waiting: 5 });
  });

  it("takes heartbeat load from rank 0 only", () => {
    const { cluster, a, b, beat, samples } = setup();
    cluster.applyDeployment(spec({ name: "big", tensorParallel: 2, nodesPerReplica: 2 }));
    const [p] = cluster.placements();
    const rank0 = p?.ranks[0]?.nodeId as string;
    const rank1 = rank0 === a ? b : a;
    beat(rank1, { load: { running: 50 } });
    beat(rank0, { load: { running: 3 } });
    expect(samples.map((s) => s.load)).toEqual([{ running: 3 }]);
    expect(cluster.routingMembership().replicas[0]?.load).toEqual({ running: 3 });
  });
});
