import { create, fromBinary, toBinary, toJson } from "@bufbuild/protobuf";
import {
  RoutedReplicaState,
  RoutingPolicy,
  type WatchRoutingResponse,
  WatchRoutingResponseSchema,
} from "@llmgw/proto";
import {
  isRouterError,
  type KeyGrant,
  type ReplicaLoad,
  ROUTING_LIMITS,
  type RoutedModel,
  type RoutedReplica,
  type RoutingMessage,
} from "@llmgw/router";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { routingMessageFromProto, routingMessageToProto } from "./index.js";

const T0 = 1_800_000_000_000;
const HASH = "ab".repeat(32);

/** Through the bytes a stream carries, so the round trip is the wire's, not the object's. */
const overTheWire = (m: RoutingMessage): RoutingMessage =>
  routingMessageFromProto(
    fromBinary(
      WatchRoutingResponseSchema,
      toBinary(WatchRoutingResponseSchema, routingMessageToProto(m)),
    ),
  );

const errorOf = (fn: () => unknown) => {
  try {
    fn();
  } catch (error) {
    if (isRouterError(error)) return { code: error.code, message: error.message };
    throw error;
  }
  throw new Error("expected a RouterError");
};

const replica: RoutedReplica = {
  id: "r1",
  model: "alpha",
  deployment: "alpha-dep",
  baseUrl: "http://10.0.0.5:8000",
  state: "draining",
  capacity: 16,
  apiKey: "engine-key",
  load: { running: 2, kvCacheUsage: 0.5 },
  loadReportedAtMs: T0 - 5,
};

describe("routing messages on the wire", () => {
  it.each<[string, RoutingMessage]>([
    [
      "a snapshot",
      {
        kind: "snapshot",
        epoch: "e1",
        version: 0,
        models: [{ name: "alpha", deployment: "alpha-dep", policy: "least-loaded", loading: true }],
        replicas: [
          replica,
          {
            ...replica,
            id: "r2",
            state: "ready",
            apiKey: undefined,
            load: undefined,
            loadReportedAtMs: undefined,
          },
        ].map((r) => JSON.parse(JSON.stringify(r)) as RoutedReplica),
        keys: [
          {
            id: "k1",
            name: "one",
            secretSha256: HASH,
            models: ["alpha"],
            rpm: 60,
            tpm: 1000,
            maxConcurrency: 2,
          },
          { id: "k2", name: "", secretSha256: HASH },
        ],
        routers: 3,
        sentAtMs: T0,
      },
    ],
    [
      "a delta with a router count",
      {
        kind: "delta",
        epoch: "e1",
        version: Number.MAX_SAFE_INTEGER,
        upsertedModels: [
          { name: "beta", deployment: "beta-dep", policy: "round-robin", loading: false },
        ],
        removedModels: ["gamma"],
        upsertedReplicas: [replica],
        removedReplicas: ["r0"],
        upsertedKeys: [{ id: "k3", name: "three", secretSha256: HASH, tpm: 5 }],
        removedKeys: ["k1"],
        routers: 2,
        sentAtMs: T0,
      },
    ],
    [
      "a delta without one",
      {
        kind: "delta",
        epoch: "e1",
        version: 1,
        upsertedModels: [],
        removedModels: [],
        upsertedReplicas: [],
        removedReplicas: [],
        upsertedKeys: [],
        removedKeys: [],
        sentAtMs: 0,
      },
    ],
    [
      "load (an empty sample included)",
      {
        kind: "load",
        epoch: "e1",
        samples: [
          {
            replicaId: "r1",
            load: { running: 0, waiting: 3.5, kvCacheUsage: 1, prefixCacheHitRate: 0 },
            reportedAtMs: T0,
          },
          { replicaId: "r2", load: {}, reportedAtMs: T0 },
        ],
      },
    ],
    ["a keepalive", { kind: "keepalive", epoch: "e1", version: 7, sentAtMs: T0, intervalMs: 5000 }],
  ])("round-trips %s unchanged", (_, message) => {
    expect(overTheWire(message)).toStrictEqual(message);
  });

  it("keeps unreported load absent on the wire, never 0", () => {
    const proto = routingMessageToProto({
      kind: "load",
      epoch: "e1",
      samples: [{ replicaId: "r1", load: { waiting: 4 }, reportedAtMs: T0 }],
    });
    expect(toJson(WatchRoutingResponseSchema, proto)).toEqual({
      load: {
        epoch: "e1",
        samples: [{ replicaId: "r1", load: { waiting: 4 }, reportedAtUnixMs: String(T0) }],
      },
    });
    const bare = routingMessageToProto({
      kind: "snapshot",
      epoch: "e1",
      version: 1,
      models: [],
      replicas: [{ ...replica, apiKey: undefined, load: undefined, loadReportedAtMs: undefined }],
      keys: [],
      routers: 1,
      sentAtMs: T0,
    });
    const json = toJson(WatchRoutingResponseSchema, bare) as {
      snapshot: { replicas: Record<string, unknown>[] };
    };
    expect(Object.keys(json.snapshot.replicas[0] ?? {}).sort()).toEqual([
      "baseUrl",
      "capacity",
      "deployment",
      "id",
      "model",
      "state",
    ]);
  });

  it("brings a key's empty model list back absent (both mean all models)", () => {
    const key: KeyGrant = { id: "k", name: "n", secretSha256: HASH, models: [] };
    const back = overTheWire({
      kind: "delta",
      epoch: "e",
      version: 1,
      upsertedModels: [],
      removedModels: [],
      upsertedReplicas: [],
      removedReplicas: [],
      upsertedKeys: [key],
      removedKeys: [],
      sentAtMs: 0,
    });
    expect(back.kind === "delta" && back.upsertedKeys[0]).toStrictEqual({
      id: "k",
      name: "n",
      secretSha256: HASH,
    });
  });

  it("carries tenants, the keys' tenant, budgets and priority, GPUs and engine priority", () => {
    const snapshot: RoutingMessage = {
      kind: "snapshot",
      epoch: "e",
      version: 3,
      models: [
        { name: "alpha", deployment: "d", policy: "llmgw", loading: false, enginePriority: true },
      ],
      replicas: [{ ...replica, gpus: 8 }],
      keys: [
        {
          id: "k",
          name: "n",
          secretSha256: HASH,
          tenant: "search",
          budgets: [{ period: "month", model: "alpha", tokens: Number.MAX_SAFE_INTEGER }],
          priority: "batch",
        },
      ],
      tenants: [
        {
          name: "search",
          rpm: 5,
          budgets: [{ period: "day", tokens: 9 }],
          priority: "critical",
          weight: 1000,
          createdAtMs: T0 - 5_000,
          cacheIsolation: "tenant",
        },
        // No creation time (an older control plane): it stays absent, never 0.
        { name: "other", weight: 1 },
      ],
      routers: 1,
      sentAtMs: T0,
    };
    expect(overTheWire(snapshot)).toStrictEqual(snapshot);
    const delta: RoutingMessage = {
      kind: "delta",
      epoch: "e",
      version: 4,
      upsertedModels: [],
      removedModels: [],
      upsertedReplicas: [],
      removedReplicas: [],
      upsertedKeys: [],
      removedKeys: [],
      upsertedTenants: [{ name: "search", weight: 2 }],
      removedTenants: ["other"],
      sentAtMs: T0,
    };
    expect(overTheWire(delta)).toStrictEqual(delta);
  });

  it("carries how each model's engines isolate caches, and reads one it does not know as unknown", () => {
    const snapshot: RoutingMessage = {
      kind: "snapshot",
      epoch: "e",
      version: 1,
      models: [
        { name: "a", deployment: "a", policy: "llmgw", loading: false, cacheIsolation: "salt" },
        { name: "b", deployment: "b", policy: "llmgw", loading: false, cacheIsolation: "no-reuse" },
        { name: "c", deployment: "c", policy: "llmgw", loading: false },
      ],
      replicas: [],
      keys: [],
      routers: 1,
      sentAtMs: T0,
    };
    expect(overTheWire(snapshot)).toStrictEqual(snapshot);
    const newer = routingMessageToProto(snapshot);
    if (newer.message.case !== "snapshot") throw new Error("not a snapshot");
    (newer.message.value.models[0] as { cacheIsolation: string }).cacheIsolation = "enclave";
    const read = routingMessageFromProto(newer);
    expect(read.kind === "snapshot" && read.models[0]).toStrictEqual({
      name: "a",
      deployment: "a",
      policy: "llmgw",
      loading: false,
    });
  });

  it("reads a tenant's cache isolation it does not know as the strictest it has", () => {
    const snapshot: RoutingMessage = {
      kind: "snapshot",
      epoch: "e",
      version: 1,
      models: [],
      replicas: [],
      keys: [],
      tenants: [{ name: "search", weight: 1, cacheIsolation: "key" }],
      routers: 1,
      sentAtMs: T0,
    };
    const newer = routingMessageToProto(snapshot);
    if (newer.message.case !== "snapshot") throw new Error("not a snapshot");
    (newer.message.value.tenants[0] as { cacheIsolation: string }).cacheIsolation = "enclave";
    const read = routingMessageFromProto(newer);
    expect(read.kind === "snapshot" && read.tenants?.[0]).toStrictEqual({
      name: "search",
      weight: 1,
      cacheIsolation: "key",
    });
  });
});

describe("routingMessageFromProto refuses", () => {
  const snapshotWith = (value: Record<string, unknown>): WatchRoutingResponse =>
    create(WatchRoutingResponseSchema, {
      message: {
        case: "snapshot",
        value: { epoch: "e1", version: 1n, routers: 1, sentAtUnixMs: BigInt(T0), ...value },
      },
    });
  const wireReplica = (over: Record<string, unknown>) => ({
    id: "r1",
    model: "alpha",
    deployment: "alpha-dep",
    baseUrl: "http://10.0.0.5:8000",
    state: RoutedReplicaState.READY,
    capacity: 4,
    ...over,
  });
  it.each<[string, WatchRoutingResponse, string]>([
    [
      "an empty response",
      create(WatchRoutingResponseSchema, {}),
      "routing message: message must be one of snapshot, delta, load, keepalive, got none",
    ],
    [
      "an unset policy",
      snapshotWith({
        models: [{ name: "alpha", deployment: "d", routingPolicy: RoutingPolicy.UNSPECIFIED }],
      }),
      "routing snapshot: models[0].policy must be one of llmgw, round-robin, least-loaded, got 0",
    ],
    [
      "an unknown priority class on a key",
      snapshotWith({ keys: [{ id: "k", name: "n", secretSha256: HASH, priority: 9 }] }),
      "routing snapshot: keys[0].priority must be one of critical, standard, batch or unset, got 9",
    ],
    [
      "a budget without a period",
      snapshotWith({ tenants: [{ name: "t", weight: 1, budgets: [{ tokens: 5n }] }] }),
      "routing snapshot: tenants[0].budgets[0].period must be one of day, month, got 0",
    ],
    [
      "a tenant weight of 0",
      snapshotWith({ tenants: [{ name: "t", weight: 0 }] }),
      "routing snapshot: tenants[0].weight must be an integer in [1, 1000], got 0",
    ],
    [
      "a budget of 0 tokens",
      snapshotWith({ tenants: [{ name: "t", weight: 1, budgets: [{ period: 1, tokens: 0n }] }] }),
      "routing snapshot: tenants[0].budgets[0].tokens must be an integer in [1, 9007199254740991], got 0",
    ],
    [
      "two budgets of one period and model",
      snapshotWith({
        tenants: [
          {
            name: "t",
            weight: 1,
            budgets: [
              { period: 1, tokens: 5n },
              { period: 1, tokens: 6n },
            ],
          },
        ],
      }),
      'routing snapshot: tenants[0].budgets[1].period and model repeats "day"',
    ],
    [
      "an unknown replica state",
      snapshotWith({ replicas: [wireReplica({ state: 7 })] }),
      "routing snapshot: replicas[0].state must be one of ready, draining, got 7",
    ],
    [
      "a version past 2^53 - 1",
      snapshotWith({ version: 2n ** 53n }),
      "routing snapshot: version must be an integer in [0, 9007199254740991], got 9007199254740992",
    ],
    [
      "a negative load time",
      snapshotWith({
        replicas: [wireReplica({ load: { running: 1 }, loadReportedAtUnixMs: -1n })],
      }),
      "routing snapshot: replicas[0].loadReportedAtMs must be an integer in [0, 9007199254740991], got -1",
    ],
    [
      "capacity 0",
      snapshotWith({ replicas: [wireReplica({ capacity: 0 })] }),
      "routing snapshot: replicas[0].capacity must be an integer in [1, 1000000], got 0",
    ],
    [
      "an infinite running count",
      snapshotWith({
        replicas: [
          wireReplica({ load: { running: Number.POSITIVE_INFINITY }, loadReportedAtUnixMs: 1n }),
        ],
      }),
      "routing snapshot: replicas[0].load.running must be a finite number in [0, 1000000000], got Infinity",
    ],
    [
      "a hit rate above 1",
      snapshotWith({
        replicas: [wireReplica({ load: { prefixCacheHitRate: 2 }, loadReportedAtUnixMs: 1n })],
      }),
      "routing snapshot: replicas[0].load.prefixCacheHitRate must be a finite number in [0, 1], got 2",
    ],
    [
      "a load sample without load",
      create(WatchRoutingResponseSchema, {
        message: {
          case: "load",
          value: { epoch: "e1", samples: [{ replicaId: "r1", reportedAtUnixMs: 1n }] },
        },
      }),
      "routing load: samples[0].load must be set",
    ],
    [
      "too many removed replicas",
      create(WatchRoutingResponseSchema, {
        message: {
          case: "delta",
          value: {
            epoch: "e1",
            version: 2n,
            removedReplicas: Array.from(
              { length: ROUTING_LIMITS.maxReplicas + 1 },
              (_, i) => `r${i}`,
            ),
          },
        },
      }),
      "routing delta: removedReplicas holds 100001 entries, more than 100000",
    ],
    [
      "an overlong epoch",
      create(WatchRoutingResponseSchema, {
        message: {
          case: "keepalive",
          value: { epoch: "e".repeat(129), version: 1n, intervalMs: 1 },
        },
      }),
      `routing keepalive: epoch must be a string of 1..128 characters, got "${"e".repeat(64)}"… (129 chars)`,
    ],
  ])("%s, naming the field", (_, res, message) => {
    expect(errorOf(() => routingMessageFromProto(res))).toEqual({
      code: "LLMGW_ROUTER_ROUTING_INVALID",
      message,
    });
  });
});

describe("routingMessageToProto refuses", () => {
  it.each<[string, RoutingMessage, string]>([
    [
      "a version past 2^53 - 1",
      { kind: "keepalive", epoch: "e1", version: 2 ** 53, sentAtMs: T0, intervalMs: 1 },
      "routing keepalive: version must be an integer in [0, 9007199254740991], got 9007199254740992",
    ],
    [
      "a fractional timestamp (no RangeError from BigInt)",
      { kind: "load", epoch: "e1", samples: [{ replicaId: "r", load: {}, reportedAtMs: 1.5 }] },
      "routing load: samples[0].reportedAtMs must be an integer in [0, 8640000000000000], got 1.5",
    ],
  ])("%s", (_, m, message) => {
    expect(errorOf(() => routingMessageToProto(m))).toEqual({
      code: "LLMGW_ROUTER_ROUTING_INVALID",
      message,
    });
  });
});

describe("routing messages: toProto → fromProto is identity", () => {
  // Plain objects, as a decoder builds them (toStrictEqual compares prototypes too).
  const record = ((
    model: Record<string, fc.Arbitrary<unknown>>,
    constraints?: { requiredKeys?: string[] },
  ) => fc.record(model, { ...constraints, noNullPrototype: true })) as typeof fc.record;
  const name = fc.string({ minLength: 1, maxLength: 24 });
  const epochMs = fc.integer({ min: 0, max: ROUTING_LIMITS.maxEpochMs });
  const version = fc.integer({ min: 0, max: Number.MAX_SAFE_INTEGER });
  const count = fc.double({
    min: 0,
    max: ROUTING_LIMITS.maxLoadRequests,
    noNaN: true,
    noDefaultInfinity: true,
  });
  const ratio = fc.double({ min: 0, max: 1, noNaN: true });
  const load: fc.Arbitrary<ReplicaLoad> = record(
    { running: count, waiting: count, kvCacheUsage: ratio, prefixCacheHitRate: ratio },
    { requiredKeys: [] },
  );
  const model: fc.Arbitrary<RoutedModel> = record({
    name,
    deployment: name,
    policy: fc.constantFrom("llmgw", "round-robin", "least-loaded"),
    loading: fc.boolean(),
  });
  const replica: fc.Arbitrary<RoutedReplica> = fc
    .tuple(
      record(
        {
          id: name,
          model: name,
          deployment: name,
          baseUrl: fc.webUrl({ size: "small" }),
          state: fc.constantFrom("ready", "draining"),
          capacity: fc.integer({ min: 1, max: ROUTING_LIMITS.maxCapacity }),
          apiKey: fc.string({ minLength: 1, maxLength: 64 }),
        },
        { requiredKeys: ["id", "model", "deployment", "baseUrl", "state", "capacity"] },
      ),
      fc.option(record({ load, loadReportedAtMs: epochMs }), { nil: undefined }),
    )
    .map(([r, l]) => ({ ...r, ...l }));
  const limit = fc.integer({ min: 1, max: ROUTING_LIMITS.maxKeyLimit });
  const key: fc.Arbitrary<KeyGrant> = record(
    {
      id: name,
      name: fc.string({ maxLength: 24 }),
      secretSha256: fc.stringMatching(/^[0-9a-f]{64}$/),
      models: fc.array(name, { minLength: 1, maxLength: 3 }),
      rpm: limit,
      tpm: limit,
      maxConcurrency: limit,
    },
    { requiredKeys: ["id", "name", "secretSha256"] },
  );
  const models = fc.uniqueArray(model, { selector: (m) => m.name, maxLength: 4 });
  const replicas = fc.uniqueArray(replica, { selector: (r) => r.id, maxLength: 4 });
  const keys = fc.uniqueArray(key, { selector: (k) => k.id, maxLength: 4 });
  const routers = fc.integer({ min: 1, max: ROUTING_LIMITS.maxRouters });
  const message: fc.Arbitrary<RoutingMessage> = fc.oneof(
    record({
      kind: fc.constant("snapshot"),
      epoch: name,
      version,
      models,
      replicas,
      keys,
      routers,
      sentAtMs: epochMs,
    }),
    record(
      {
        kind: fc.constant("delta"),
        epoch: name,
        version: fc.integer({ min: 1, max: Number.MAX_SAFE_INTEGER }),
        upsertedModels: models,
        removedModels: fc.array(name, { maxLength: 3 }),
        upsertedReplicas: replicas,
        removedReplicas: fc.array(name, { maxLength: 3 }),
        upsertedKeys: keys,
        removedKeys: fc.array(name, { maxLength: 3 }),
        routers,
        sentAtMs: epochMs,
      },
      {
        requiredKeys: [
          "kind",
          "epoch",
          "version",
          "upsertedModels",
          "removedModels",
          "upsertedReplicas",
          "removedReplicas",
          "upsertedKeys",
          "removedKeys",
          "sentAtMs",
        ],
      },
    ),
    record({
      kind: fc.constant("load"),
      epoch: name,
      samples: fc.array(record({ replicaId: name, load, reportedAtMs: epochMs }), {
        maxLength: 4,
      }),
    }),
    record({
      kind: fc.constant("keepalive"),
      epoch: name,
      version,
      sentAtMs: epochMs,
      intervalMs: fc.integer({ min: 1, max: ROUTING_LIMITS.maxKeepaliveIntervalMs }),
    }),
  );

  it("holds for every valid message, through the bytes", () => {
    fc.assert(
      fc.property(message, (m) => {
        expect(overTheWire(m)).toStrictEqual(m);
      }),
      { numRuns: 300 },
    );
  });
});
