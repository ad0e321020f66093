import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import { createManualClock } from "./clock.js";
import { isRouterError } from "./errors.js";
import type {
  KeyGrant,
  RoutedModel,
  RoutedReplica,
  RoutingDelta,
  RoutingMessage,
  RoutingSnapshot,
} from "./routing-messages.js";
import {
  CLOCK_OFFSET_WINDOW,
  createRoutingState,
  DEFAULT_LOAD_STALE_MS,
  ROUTING_LIMITS,
  type RoutingState,
  validateRoutingMessage,
} from "./routing-state.js";

const sha256 = (secret: string): string => createHash("sha256").update(secret).digest("hex");
const T0 = 1_800_000_000_000;

const model = (name: string, over: Partial<RoutedModel> = {}): RoutedModel => ({
  name,
  deployment: `${name}-dep`,
  policy: "llmgw",
  loading: false,
  ...over,
});
const replica = (
  id: string,
  modelName: string,
  over: Partial<RoutedReplica> = {},
): RoutedReplica => ({
  id,
  model: modelName,
  deployment: `${modelName}-dep`,
  baseUrl: `http://10.0.0.1:${8000 + id.length}`,
  state: "ready",
  capacity: 8,
  ...over,
});
const grant = (id: string, secret: string, over: Partial<KeyGrant> = {}): KeyGrant => ({
  id,
  name: `${id}-name`,
  secretSha256: sha256(secret),
  ...over,
});
const snapshot = (over: Partial<RoutingSnapshot> = {}): RoutingSnapshot => ({
  kind: "snapshot",
  epoch: "e1",
  version: 10,
  models: [model("alpha"), model("beta", { policy: "round-robin", loading: true })],
  replicas: [
    replica("a-2", "alpha", { apiKey: "engine-secret-2" }),
    replica("a-1", "alpha", { apiKey: "engine-secret-1", capacity: 4 }),
    replica("b-1", "beta", { state: "draining" }),
  ],
  keys: [
    grant("k1", "sk-one", { rpm: 60, models: ["alpha"] }),
    grant("k2", "sk-two", { models: [] }),
  ],
  routers: 1,
  sentAtMs: T0,
  ...over,
});
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

const setup = (first: RoutingSnapshot = snapshot(), loadStaleMs?: number) => {
  const clock = createManualClock(T0);
  const state = createRoutingState({
    hashSecret: sha256,
    now: clock.now,
    ...(loadStaleMs === undefined ? {} : { loadStaleMs }),
  });
  expect(state.apply(first)).toBe("applied");
  return { clock, state };
};

const ids = (state: RoutingState, name: string) =>
  state.routeTable.resolve(name)?.replicas.map((r) => r.id);

/** Runs `fn` and returns the RouterError it throws (fails when it throws nothing or else). */
const routerErrorOf = (fn: () => unknown) => {
  try {
    fn();
  } catch (error) {
    if (isRouterError(error)) return { code: error.code, message: error.message };
    throw error;
  }
  throw new Error("expected a RouterError");
};

describe("createRoutingState: snapshot → projection", () => {
  it("resolves each served model to its deployment, policy and replicas in id order", () => {
    const { state } = setup();
    expect(state.routeTable.resolve("alpha")).toEqual({
      deployment: "alpha-dep",
      policy: "llmgw",
      loading: false,
      replicas: [
        {
          id: "a-1",
          baseUrl: "http://10.0.0.1:8003",
          state: "ready",
          capacity: 4,
          load: undefined,
          apiKey: "engine-secret-1",
          authorization: "Bearer engine-secret-1",
        },
        {
          id: "a-2",
          baseUrl: "http://10.0.0.1:8003",
          state: "ready",
          capacity: 8,
          load: undefined,
          apiKey: "engine-secret-2",
          authorization: "Bearer engine-secret-2",
        },
      ],
    });
    expect(state.routeTable.resolve("beta")).toMatchObject({
      policy: "round-robin",
      loading: true,
      replicas: [{ id: "b-1", state: "draining", apiKey: undefined, authorization: undefined }],
    });
    expect(state.routeTable.resolve("gamma")).toBeUndefined();
    expect([state.epoch, state.version, state.routers, state.routeTable.version]).toEqual([
      "e1",
      10,
      1,
      1,
    ]);
  });

  it("lists only models with a ready replica, sorted; a model without replicas still resolves", () => {
    const { state } = setup(
      snapshot({
        models: [model("zeta"), model("alpha"), model("beta"), model("empty", { loading: true })],
        replicas: [
          replica("z", "zeta"),
          replica("a", "alpha"),
          replica("b", "beta", { state: "draining" }),
        ],
      }),
    );
    expect(state.routeTable.models()).toEqual(["alpha", "zeta"]);
    expect(state.routeTable.resolve("empty")).toEqual({
      deployment: "empty-dep",
      policy: "llmgw",
      loading: true,
      replicas: [],
    });
  });

  it("answers resolve from what it built: the same object until membership changes", () => {
    const { state } = setup();
    const first = state.routeTable.resolve("alpha");
    expect(state.routeTable.resolve("alpha")).toBe(first);
    state.apply(delta(11, { upsertedReplicas: [replica("b-2", "beta")] }));
    expect(state.routeTable.resolve("alpha")).toBe(first); // untouched model: not rebuilt
    expect(state.routeTable.resolve("beta")?.replicas.map((r) => r.id)).toEqual(["b-1", "b-2"]);
  });

  it("is empty and unversioned before the first snapshot", () => {
    const state = createRoutingState({ hashSecret: sha256 });
    expect(state.routeTable.resolve("alpha")).toBeUndefined();
    expect(state.routeTable.models()).toEqual([]);
    expect(state.apiKeys.verify("sk-one")).toBeUndefined();
    expect(state.snapshot()).toBeUndefined();
    expect([state.epoch, state.version, state.routers, state.lastHeardAtMs]).toEqual([
      undefined,
      0,
      1,
      undefined,
    ]);
  });

  it("verifies secrets by hash: key models (empty = all) and limits as granted", () => {
    const { state } = setup();
    expect(state.apiKeys.verify("sk-one")).toEqual({
      id: "k1",
      name: "k1-name",
      models: ["alpha"],
      rpm: 60,
    });
    expect(state.apiKeys.verify("sk-two")).toEqual({ id: "k2", name: "k2-name" });
    expect(state.apiKeys.verify("sk-nope")).toBeUndefined();
    expect(state.apiKeys.verify(sha256("sk-one"))).toBeUndefined(); // the hash is no secret
  });
});

describe("createRoutingState: draining replicas", () => {
  it("holds a draining replica whose model is not listed (its deployment was deleted), in no resolution", () => {
    const { state } = setup(
      snapshot({
        models: [model("alpha")],
        replicas: [replica("a-1", "alpha"), replica("gone-1", "gone", { state: "draining" })],
      }),
    );
    expect(state.drainingReplicaIds).toEqual(["gone-1"]);
    expect(state.routeTable.resolve("gone")).toBeUndefined();
    expect(state.routeTable.models()).toEqual(["alpha"]);
    // Saved and reloaded as it came: the state file holds the same replica.
    const saved = state.snapshot() as RoutingSnapshot;
    expect(saved.replicas.map((r) => [r.id, r.model, r.state])).toEqual([
      ["a-1", "alpha", "ready"],
      ["gone-1", "gone", "draining"],
    ]);
    const reloaded = createRoutingState({ hashSecret: sha256 });
    expect(reloaded.apply(saved)).toBe("applied");
    expect(reloaded.drainingReplicaIds).toEqual(["gone-1"]);
  });

  it("applies a delta that removes a model and turns its replicas draining in one step", () => {
    const { state } = setup();
    const seen: (readonly string[])[] = [];
    state.onMembershipChange(() => seen.push(state.drainingReplicaIds));
    expect(state.drainingReplicaIds).toEqual(["b-1"]);
    expect(
      state.apply(
        delta(11, {
          removedModels: ["alpha"],
          upsertedReplicas: [
            replica("a-1", "alpha", { state: "draining" }),
            replica("a-2", "alpha", { state: "draining" }),
          ],
        }),
      ),
    ).toBe("applied");
    expect(state.routeTable.resolve("alpha")).toBeUndefined();
    expect(seen).toEqual([["a-1", "a-2", "b-1"]]);
    // Drained: the control plane removes them; what is left is the beta one.
    state.apply(delta(12, { removedReplicas: ["a-1", "a-2"] }));
    expect(state.drainingReplicaIds).toEqual(["b-1"]);
  });

  it("keeps the same list between membership changes, and none before the first snapshot", () => {
    expect(createRoutingState({ hashSecret: sha256 }).drainingReplicaIds).toEqual([]);
    const { state } = setup();
    const first = state.drainingReplicaIds;
    state.apply({
      kind: "load",
      epoch: "e1",
      samples: [{ replicaId: "b-1", load: { running: 1 }, reportedAtMs: T0 }],
    });
    expect(state.drainingReplicaIds).toBe(first);
    state.apply(delta(11, { upsertedReplicas: [replica("b-1", "beta")] }));
    expect(state.drainingReplicaIds).toEqual([]);
  });

  it("still refuses a replica state it does not know", () => {
    expect(
      routerErrorOf(() =>
        validateRoutingMessage(
          delta(11, {
            upsertedReplicas: [
              replica("a-1", "alpha", { state: "stopping" as unknown as "draining" }),
            ],
          }),
        ),
      ),
    ).toEqual({
      code: "LLMGW_ROUTER_ROUTING_INVALID",
      message:
        'routing delta: upsertedReplicas[0].state must be one of ready, draining, got "stopping"',
    });
  });
});

describe("createRoutingState: deltas", () => {
  it.each<[string, Partial<RoutingDelta>, (s: RoutingState) => unknown, unknown]>([
    [
      "upserts a model",
      { upsertedModels: [model("gamma")] },
      (s) => s.routeTable.resolve("gamma")?.deployment,
      "gamma-dep",
    ],
    [
      "changes a model's policy",
      { upsertedModels: [model("alpha", { policy: "least-loaded" })] },
      (s) => s.routeTable.resolve("alpha")?.policy,
      "least-loaded",
    ],
    [
      "removes a model",
      { removedModels: ["alpha"] },
      (s) => s.routeTable.resolve("alpha"),
      undefined,
    ],
    [
      "adds a replica",
      { upsertedReplicas: [replica("a-0", "alpha")] },
      (s) => ids(s, "alpha"),
      ["a-0", "a-1", "a-2"],
    ],
    [
      "changes a replica (draining)",
      { upsertedReplicas: [replica("a-1", "alpha", { state: "draining" })] },
      (s) => s.routeTable.resolve("alpha")?.replicas.map((r) => r.state),
      ["draining", "ready"],
    ],
    [
      "moves a replica to another model",
      { upsertedReplicas: [replica("a-1", "beta")] },
      (s) => [ids(s, "alpha"), ids(s, "beta")],
      [["a-2"], ["a-1", "b-1"]],
    ],
    [
      "removes a replica",
      { removedReplicas: ["a-2", "never-held"] },
      (s) => ids(s, "alpha"),
      ["a-1"],
    ],
    [
      "adds a key",
      { upsertedKeys: [grant("k3", "sk-three", { tpm: 1000 })] },
      (s) => s.apiKeys.verify("sk-three"),
      { id: "k3", name: "k3-name", tpm: 1000 },
    ],
    [
      "changes a key's limits",
      { upsertedKeys: [grant("k1", "sk-one", { maxConcurrency: 2 })] },
      (s) => s.apiKeys.verify("sk-one"),
      { id: "k1", name: "k1-name", maxConcurrency: 2 },
    ],
    [
      "revokes a key: its secret stops verifying",
      { removedKeys: ["k1"] },
      (s) => s.apiKeys.verify("sk-one"),
      undefined,
    ],
  ])("%s", (_, change, read, expected) => {
    const { state } = setup();
    const versions: number[] = [];
    let memberships = 0;
    state.routeTable.subscribe((v) => versions.push(v));
    state.onMembershipChange(() => memberships++);
    expect(state.apply(delta(11, change))).toBe("applied");
    expect(read(state)).toEqual(expected);
    expect([state.version, state.routeTable.version, versions, memberships]).toEqual([
      11,
      2,
      [2],
      1,
    ]);
  });

  it("lists a model whose last ready replica drained no more", () => {
    const { state } = setup();
    expect(state.routeTable.models()).toEqual(["alpha"]);
    state.apply(delta(11, { upsertedReplicas: [replica("b-1", "beta")] }));
    expect(state.routeTable.models()).toEqual(["alpha", "beta"]);
    state.apply(delta(12, { removedReplicas: ["a-1", "a-2"] }));
    expect(state.routeTable.models()).toEqual(["beta"]);
  });

  it("keeps the engine key it holds when an upsert (or a new epoch's snapshot) carries none", () => {
    const { state } = setup();
    state.apply(delta(11, { upsertedReplicas: [replica("a-1", "alpha", { capacity: 6 })] }));
    const a1 = () => state.routeTable.resolve("alpha")?.replicas[0];
    expect(a1()).toMatchObject({
      capacity: 6,
      apiKey: "engine-secret-1",
      authorization: "Bearer engine-secret-1",
    });
    // A restarted control plane has not learnt the keys yet.
    state.apply(
      snapshot({
        epoch: "e2",
        version: 1,
        replicas: [replica("a-1", "alpha"), replica("a-2", "alpha")],
      }),
    );
    expect(state.routeTable.resolve("alpha")?.replicas.map((r) => r.apiKey)).toEqual([
      "engine-secret-1",
      "engine-secret-2",
    ]);
    // A new key replaces the held one; a replica gone and back has nothing to keep.
    expect(
      state.apply(
        delta(2, {
          epoch: "e2",
          upsertedReplicas: [replica("a-1", "alpha", { apiKey: "rotated" })],
          removedReplicas: ["a-2"],
        }),
      ),
    ).toBe("applied");
    expect(
      state.apply(delta(3, { epoch: "e2", upsertedReplicas: [replica("a-2", "alpha")] })),
    ).toBe("applied");
    expect(state.routeTable.resolve("alpha")?.replicas.map((r) => r.authorization)).toEqual([
      "Bearer rotated",
      undefined,
    ]);
    expect(state.snapshot()?.replicas.map((r) => r.apiKey)).toEqual(["rotated", undefined]);
  });
});

describe("createRoutingState: versions and epochs", () => {
  it.each<[string, RoutingMessage, "applied" | "ignored" | "resync"]>([
    ["the next delta", delta(11), "applied"],
    ["a duplicate delta", delta(10), "ignored"],
    ["an old delta", delta(3), "ignored"],
    ["a gap", delta(12), "resync"],
    ["a delta of another epoch", delta(11, { epoch: "e2" }), "resync"],
    ["load of another epoch", { kind: "load", epoch: "e2", samples: [] }, "resync"],
    [
      "a keepalive",
      { kind: "keepalive", epoch: "e1", version: 10, sentAtMs: T0, intervalMs: 5000 },
      "applied",
    ],
    [
      "an old keepalive",
      { kind: "keepalive", epoch: "e1", version: 9, sentAtMs: T0, intervalMs: 5000 },
      "ignored",
    ],
    [
      "a keepalive ahead (a delta lost)",
      { kind: "keepalive", epoch: "e1", version: 11, sentAtMs: T0, intervalMs: 5000 },
      "resync",
    ],
    [
      "a keepalive of another epoch",
      { kind: "keepalive", epoch: "e0", version: 10, sentAtMs: T0, intervalMs: 5000 },
      "resync",
    ],
    ["an older snapshot", snapshot({ version: 2 }), "applied"],
    ["another epoch's snapshot", snapshot({ epoch: "e0", version: 99 }), "applied"],
  ])("%s → %s", (_, message, result) => {
    const { state, clock } = setup();
    const before = {
      version: state.version,
      table: state.routeTable.version,
      heard: state.lastHeardAtMs,
    };
    clock.advance(1000);
    expect(state.apply(message)).toBe(result);
    const membership =
      message.kind === "snapshot" || (message.kind === "delta" && result === "applied");
    expect(state.routeTable.version).toBe(before.table + (membership ? 1 : 0));
    if (message.kind !== "snapshot" && result !== "applied")
      expect(state.version).toBe(before.version);
    // Heard: anything applied or ignored; a resync confirms nothing.
    expect(state.lastHeardAtMs).toBe(result === "resync" ? before.heard : T0 + 1000);
  });

  it("asks for a snapshot for anything before the first one", () => {
    const state = createRoutingState({ hashSecret: sha256 });
    expect(state.apply(delta(1))).toBe("resync");
    expect(state.apply({ kind: "load", epoch: "e1", samples: [] })).toBe("resync");
    expect(
      state.apply({ kind: "keepalive", epoch: "e1", version: 0, sentAtMs: T0, intervalMs: 1 }),
    ).toBe("resync");
    expect(state.lastHeardAtMs).toBeUndefined();
  });

  it("a snapshot replaces everything, even an older version", () => {
    const { state } = setup();
    expect(
      state.apply(snapshot({ version: 3, models: [model("beta")], replicas: [], keys: [] })),
    ).toBe("applied");
    expect([
      state.version,
      state.routeTable.resolve("alpha"),
      state.apiKeys.verify("sk-one"),
    ]).toEqual([3, undefined, undefined]);
    expect(state.apply(delta(4, { upsertedReplicas: [replica("b-9", "beta")] }))).toBe("applied");
    expect(ids(state, "beta")).toEqual(["b-9"]);
  });

  it("takes the time a message was heard from the caller (a state file's age)", () => {
    const { state } = setup();
    state.apply(snapshot(), T0 - 60_000);
    expect(state.lastHeardAtMs).toBe(T0 - 60_000);
  });
});

describe("createRoutingState: load", () => {
  const load = { running: 3, waiting: 1, kvCacheUsage: 0.5, prefixCacheHitRate: 0.25 };

  it("writes load into the existing route: same object, no version bump, no listener", () => {
    const { state } = setup();
    const route = state.routeTable.resolve("alpha")?.replicas[1];
    let calls = 0;
    state.routeTable.subscribe(() => calls++);
    state.onMembershipChange(() => calls++);
    const result = state.apply({
      kind: "load",
      epoch: "e1",
      samples: [
        { replicaId: "a-2", load, reportedAtMs: T0 },
        { replicaId: "unknown", load, reportedAtMs: T0 },
      ],
    });
    expect(result).toBe("applied");
    const after = state.routeTable.resolve("alpha")?.replicas[1];
    expect(after).toBe(route);
    expect(after?.load).toEqual(load);
    expect([state.version, state.routeTable.version, calls]).toEqual([10, 1, 0]);
  });

  it("keeps the newest sample: a late one never rolls load back", () => {
    const { state } = setup();
    const at = (running: number, reportedAtMs: number) =>
      state.apply({
        kind: "load",
        epoch: "e1",
        samples: [{ replicaId: "a-1", load: { running }, reportedAtMs }],
      });
    at(5, T0);
    at(2, T0 - 1);
    expect(state.routeTable.resolve("alpha")?.replicas[0]?.load).toEqual({ running: 5 });
    at(7, T0);
    expect(state.routeTable.resolve("alpha")?.replicas[0]?.load).toEqual({ running: 7 });
  });

  it("leaves load older than loadStaleMs out (absent, not 0), but saves it with its time", () => {
    const { state, clock } = setup(snapshot(), 1000);
    state.apply({
      kind: "load",
      epoch: "e1",
      samples: [
        { replicaId: "a-1", load, reportedAtMs: T0 },
        { replicaId: "a-2", load, reportedAtMs: T0 - 1000 }, // stale on arrival
      ],
    });
    const loads = () => state.routeTable.resolve("alpha")?.replicas.map((r) => r.load);
    expect(loads()).toEqual([load, undefined]);
    clock.advance(999);
    expect(loads()).toEqual([load, undefined]);
    // Sweeps are spaced loadStaleMs / 20 apart: gone by loadStaleMs + 5% at the latest.
    clock.advance(1 + 1000 / 20);
    expect(loads()).toEqual([undefined, undefined]);
    expect(state.snapshot()?.replicas.find((r) => r.id === "a-1")).toMatchObject({
      load,
      loadReportedAtMs: T0,
    });
    state.apply({
      kind: "load",
      epoch: "e1",
      samples: [{ replicaId: "a-1", load: { running: 1 }, reportedAtMs: clock.now() }],
    });
    expect(loads()).toEqual([{ running: 1 }, undefined]);
  });

  it("projects load a snapshot carries, and keeps the newer held one over an older snapshot's", () => {
    const { state } = setup(
      snapshot({
        replicas: [replica("a-1", "alpha", { load: { running: 4 }, loadReportedAtMs: T0 - 10 })],
      }),
    );
    expect(state.routeTable.resolve("alpha")?.replicas[0]?.load).toEqual({ running: 4 });
    state.apply({
      kind: "load",
      epoch: "e1",
      samples: [{ replicaId: "a-1", load: { running: 9 }, reportedAtMs: T0 }],
    });
    state.apply(
      snapshot({
        epoch: "e2",
        replicas: [replica("a-1", "alpha", { load: { running: 4 }, loadReportedAtMs: T0 - 10 })],
      }),
    );
    expect(state.routeTable.resolve("alpha")?.replicas[0]?.load).toEqual({ running: 9 });
  });
});

describe("createRoutingState: clocks", () => {
  const STALE = DEFAULT_LOAD_STALE_MS;
  /** Sweeps are spaced loadStaleMs / 20 apart: load may outlive its expiry by that much. */
  const SPACING = STALE / 20;
  const withLoad = (at: number) =>
    snapshot({
      replicas: [
        replica("a-1", "alpha", { load: { running: 1 }, loadReportedAtMs: at }),
        replica("a-2", "alpha", { load: { running: 2 }, loadReportedAtMs: at - STALE }),
      ],
    });
  const keepalive = (sentAtMs: number, version = 10): RoutingMessage => ({
    kind: "keepalive",
    epoch: "e1",
    version,
    sentAtMs,
    intervalMs: 2000,
  });
  const loadAt = (running: number, reportedAtMs: number): RoutingMessage => ({
    kind: "load",
    epoch: "e1",
    samples: [{ replicaId: "a-1", load: { running }, reportedAtMs }],
  });
  /** A router whose clock is `skewMs` off the control plane's (which reads T0 when it starts). */
  const skewed = (skewMs: number) => {
    let t = T0 + skewMs;
    const state = createRoutingState({ hashSecret: sha256, now: () => t });
    const loads = () => state.routeTable.resolve("alpha")?.replicas.map((r) => r.load);
    return {
      state,
      loads,
      advance: (ms: number) => {
        t += ms;
      },
      at: (ms: number) => {
        t = ms;
      },
    };
  };

  it.each([
    ["60 s ahead of", 60_000],
    ["60 s behind", -60_000],
    ["in step with", 0],
  ])("a router %s the control plane: fresh load is fresh, 10 s-old load stale", (_, skewMs) => {
    const { state, loads, advance } = skewed(skewMs);
    expect(state.apply(withLoad(T0))).toBe("applied");
    expect(state.clockOffsetMs).toBe(skewMs);
    expect(loads()).toEqual([{ running: 1 }, undefined]);
    // A LoadUpdate has no send time: it is aged with the offset learnt from the snapshot.
    advance(1000);
    expect(state.apply(loadAt(3, T0 + 1000))).toBe("applied");
    expect(loads()).toEqual([{ running: 3 }, undefined]);
    advance(STALE - 1);
    expect(loads()).toEqual([{ running: 3 }, undefined]);
    advance(1 + SPACING);
    expect(loads()).toEqual([undefined, undefined]);
    // Held with the control plane's time, as it came.
    expect(state.snapshot()?.replicas.map((r) => r.loadReportedAtMs)).toEqual([
      T0 + 1000,
      T0 - STALE,
    ]);
  });

  it("learns the offset from snapshots, deltas and keepalives, never from load or a resync", () => {
    const { state, advance } = skewed(5000);
    state.apply(snapshot());
    advance(1000);
    state.apply({ kind: "load", epoch: "e1", samples: [] });
    state.apply(delta(12, { sentAtMs: T0 - 60_000 })); // a gap: resync
    state.apply(keepalive(T0 - 60_000, 11)); // ahead: resync
    expect(state.clockOffsetMs).toBe(5000);
    state.apply(delta(11, { sentAtMs: T0 + 3000 })); // heard at T0 + 6000: offset 3000
    expect(state.clockOffsetMs).toBe(3000);
    state.apply(delta(5, { sentAtMs: T0 + 4000 })); // old, ignored, but sent now
    expect(state.clockOffsetMs).toBe(2000);
    state.apply(keepalive(T0 + 5000, 11));
    expect(state.clockOffsetMs).toBe(1000);
  });

  it("takes the least of the last few: a late message never makes load look younger", () => {
    const { state, loads, at } = skewed(0);
    state.apply(snapshot());
    // Keepalives every 2 s, each heard 10 ms after it was sent; the third held 3 s in a backlog.
    const offsets = [10, 10, 3010, 10, 10, 10, 10].map((delayMs, i) => {
      const sentAtMs = T0 + 2000 * (i + 1);
      at(sentAtMs + delayMs);
      state.apply(keepalive(sentAtMs));
      return state.clockOffsetMs;
    });
    expect(offsets).toEqual([0, 0, 0, 10, 10, 10, 10]);
    // Now T0 + 14 000 on the control plane's clock, as the router sees it.
    state.apply({
      kind: "load",
      epoch: "e1",
      samples: [
        { replicaId: "a-1", load: { running: 1 }, reportedAtMs: T0 + 14_000 - STALE + 1 },
        { replicaId: "a-2", load: { running: 2 }, reportedAtMs: T0 + 14_000 - STALE },
      ],
    });
    expect(loads()).toEqual([{ running: 1 }, undefined]);
  });

  it("follows a clock step: back at once, forward within the window", () => {
    const { state, advance } = skewed(0);
    state.apply(snapshot());
    let cp = T0;
    const tick = (routerStepMs = 0) => {
      cp += 2000;
      advance(2000 + routerStepMs);
      state.apply(keepalive(cp));
      return state.clockOffsetMs;
    };
    expect(tick(-60_000)).toBe(-60_000);
    const forward = [tick(60_000)];
    for (let i = 1; i < CLOCK_OFFSET_WINDOW; i++) forward.push(tick());
    expect(forward).toEqual([-60_000, -60_000, -60_000, 0]);
  });

  it("re-stamps held load onto another epoch's clock (another control plane)", () => {
    const { state, loads, advance } = skewed(0);
    state.apply(snapshot({ replicas: [replica("a-1", "alpha")] }));
    state.apply(loadAt(7, T0));
    advance(1000);
    // The new control plane's clock is 30 s ahead; its snapshot has no load for a-1 yet.
    state.apply(
      snapshot({
        epoch: "e2",
        version: 1,
        replicas: [replica("a-1", "alpha")],
        sentAtMs: T0 + 31_000,
      }),
    );
    expect(state.clockOffsetMs).toBe(-30_000);
    expect(state.snapshot()?.replicas[0]).toMatchObject({
      load: { running: 7 },
      loadReportedAtMs: T0 + 30_000,
    });
    // It still expires when it would have: STALE after it was read, on the router's clock.
    advance(STALE - 1001);
    expect(loads()).toEqual([{ running: 7 }]);
    advance(1 + SPACING);
    expect(loads()).toEqual([undefined]);
  });

  it("keeps ages across a save and a reload: apply(snapshot(), lastHeardAtMs)", () => {
    const { state, loads, advance } = skewed(60_000);
    state.apply(withLoad(T0));
    advance(3000);
    state.apply(loadAt(8, T0 + 3000));
    advance(1000);
    state.apply(keepalive(T0 + 4000));
    const saved = JSON.parse(JSON.stringify(state.snapshot())) as RoutingSnapshot;
    const heard = state.lastHeardAtMs as number;
    // The time last heard, on the control plane's clock.
    expect([heard, saved.sentAtMs]).toEqual([T0 + 60_000 + 4000, T0 + 4000]);

    advance(2000); // the router was down a while
    let t = T0 + 60_000 + 6000;
    const copy = createRoutingState({ hashSecret: sha256, now: () => t });
    expect(copy.apply(saved, heard)).toBe("applied");
    expect(copy.clockOffsetMs).toBe(60_000);
    expect(copy.snapshot()).toEqual(saved);
    const copyLoads = () => copy.routeTable.resolve("alpha")?.replicas.map((r) => r.load);
    expect(copyLoads()).toEqual([{ running: 8 }, undefined]);
    // a-1 was read at T0 + 3000 on the control plane's clock: stale STALE later, in both.
    const toExpiry = 3000 + STALE - 6000;
    advance(toExpiry - 1);
    t += toExpiry - 1;
    expect([loads(), copyLoads()]).toEqual([
      [{ running: 8 }, undefined],
      [{ running: 8 }, undefined],
    ]);
    advance(1 + SPACING);
    t += 1 + SPACING;
    expect([loads(), copyLoads()]).toEqual([
      [undefined, undefined],
      [undefined, undefined],
    ]);
  });
});

describe("createRoutingState: each router's share", () => {
  it.each([
    [1, [4, 8, 1], { rpm: 100, tpm: 1, maxConcurrency: 3 }],
    [2, [2, 4, 1], { rpm: 50, tpm: 1, maxConcurrency: 1 }],
    [3, [1, 2, 1], { rpm: 33, tpm: 1, maxConcurrency: 1 }],
  ])("routers = %i: capacities %j, limits %j", (routers, capacities, limits) => {
    const { state } = setup(
      snapshot({
        routers,
        replicas: [
          replica("a-1", "alpha", { capacity: 4 }),
          replica("a-2", "alpha", { capacity: 8 }),
          replica("a-3", "alpha", { capacity: 1 }),
        ],
        keys: [grant("k1", "sk-one", { rpm: 100, tpm: 1, maxConcurrency: 3 })],
      }),
    );
    expect(state.routers).toBe(routers);
    expect(state.routeTable.resolve("alpha")?.replicas.map((r) => r.capacity)).toEqual(capacities);
    expect(state.apiKeys.verify("sk-one")).toEqual({ id: "k1", name: "k1-name", ...limits });
  });

  it("re-projects every replica and key when the router count changes", () => {
    const { state } = setup();
    let versions = 0;
    state.routeTable.subscribe(() => versions++);
    state.apply(delta(11, { routers: 2 }));
    expect(state.routeTable.resolve("alpha")?.replicas.map((r) => r.capacity)).toEqual([2, 4]);
    expect(state.routeTable.resolve("beta")?.replicas.map((r) => r.capacity)).toEqual([4]);
    expect(state.apiKeys.verify("sk-one")?.rpm).toBe(30);
    state.apply(
      delta(12, { routers: 2, upsertedReplicas: [replica("a-3", "alpha", { capacity: 3 })] }),
    );
    expect(state.routeTable.resolve("alpha")?.replicas.map((r) => r.capacity)).toEqual([2, 4, 1]);
    expect([state.routers, versions]).toEqual([2, 2]);
  });
});

describe("createRoutingState: snapshot()", () => {
  it("round-trips: a state built from snapshot() routes and verifies the same", () => {
    const { state } = setup(snapshot({ routers: 2 }));
    state.apply(
      delta(11, {
        upsertedReplicas: [replica("a-1", "alpha")],
        upsertedKeys: [grant("k3", "sk-three", { tpm: 9 })],
      }),
    );
    state.apply({
      kind: "load",
      epoch: "e1",
      samples: [{ replicaId: "a-2", load: { waiting: 2 }, reportedAtMs: T0 }],
    });
    const saved = state.snapshot() as RoutingSnapshot;
    expect(saved).toMatchObject({
      kind: "snapshot",
      epoch: "e1",
      version: 11,
      routers: 2,
      sentAtMs: T0 + 11,
    });
    const copy = createRoutingState({ hashSecret: sha256, now: () => T0 });
    expect(copy.apply(JSON.parse(JSON.stringify(saved)) as RoutingSnapshot)).toBe("applied");
    for (const name of ["alpha", "beta", "gamma"]) {
      expect(copy.routeTable.resolve(name)).toEqual(state.routeTable.resolve(name));
    }
    for (const secret of ["sk-one", "sk-two", "sk-three"]) {
      expect(copy.apiKeys.verify(secret)).toEqual(state.apiKeys.verify(secret));
    }
    expect(copy.snapshot()).toEqual(saved);
  });
});

describe("createRoutingState: bounds", () => {
  const url = (over: Partial<RoutedReplica>) =>
    snapshot({ replicas: [replica("r", "alpha", over)] });
  it.each<[string, RoutingMessage, string]>([
    [
      "an empty epoch",
      snapshot({ epoch: "" }),
      'routing snapshot: epoch must be a string of 1..128 characters, got ""',
    ],
    [
      "a long replica id",
      snapshot({ replicas: [replica("x".repeat(257), "alpha")] }),
      `routing snapshot: replicas[0].id must be a string of 1..256 characters, got "${"x".repeat(64)}"… (257 chars)`,
    ],
    [
      "capacity 0",
      url({ capacity: 0 }),
      "routing snapshot: replicas[0].capacity must be an integer in [1, 1000000], got 0",
    ],
    [
      "capacity 1.5",
      url({ capacity: 1.5 }),
      "routing snapshot: replicas[0].capacity must be an integer in [1, 1000000], got 1.5",
    ],
    [
      "a bad base URL",
      url({ baseUrl: "10.0.0.1:8000" }),
      'routing snapshot: replicas[0].baseUrl must be an http(s) URL, got "10.0.0.1:8000"',
    ],
    [
      "an unknown state",
      url({ state: "gone" as "ready" }),
      'routing snapshot: replicas[0].state must be one of ready, draining, got "gone"',
    ],
    [
      "an engine key too long (never echoed)",
      url({ apiKey: "s".repeat(4097) }),
      "routing snapshot: replicas[0].apiKey must be a string of 1..4096 characters, got 4097 chars",
    ],
    [
      "load without its time",
      url({ load: { running: 1 } }),
      "routing snapshot: replicas[0] must carry load and loadReportedAtMs together or neither",
    ],
    [
      "KV usage above 1",
      url({ load: { kvCacheUsage: 1.01 }, loadReportedAtMs: T0 }),
      "routing snapshot: replicas[0].load.kvCacheUsage must be a finite number in [0, 1], got 1.01",
    ],
    [
      "negative waiting",
      {
        kind: "load",
        epoch: "e1",
        samples: [{ replicaId: "a-1", load: { waiting: -1 }, reportedAtMs: T0 }],
      },
      "routing load: samples[0].load.waiting must be a finite number in [0, 1000000000], got -1",
    ],
    [
      "NaN running",
      {
        kind: "load",
        epoch: "e1",
        samples: [{ replicaId: "a-1", load: { running: Number.NaN }, reportedAtMs: T0 }],
      },
      "routing load: samples[0].load.running must be a finite number in [0, 1000000000], got NaN",
    ],
    // The fast path for good load samples must refuse everything the field checks refuse.
    ...(
      [
        [
          "an empty replica id",
          { replicaId: "", load: { running: 1 }, reportedAtMs: T0 },
          'samples[1].replicaId must be a string of 1..256 characters, got ""',
        ],
        [
          "a replica id that is no string",
          { replicaId: 7, load: { running: 1 }, reportedAtMs: T0 },
          "samples[1].replicaId must be a string of 1..256 characters, got 7",
        ],
        [
          "no load object",
          { replicaId: "a-1", load: null, reportedAtMs: T0 },
          "samples[1].load must be an object, got null",
        ],
        [
          "KV usage above 1",
          { replicaId: "a-1", load: { kvCacheUsage: 1.5 }, reportedAtMs: T0 },
          "samples[1].load.kvCacheUsage must be a finite number in [0, 1], got 1.5",
        ],
        [
          "an infinite hit rate",
          { replicaId: "a-1", load: { prefixCacheHitRate: Infinity }, reportedAtMs: T0 },
          "samples[1].load.prefixCacheHitRate must be a finite number in [0, 1], got Infinity",
        ],
        [
          "running past the limit",
          { replicaId: "a-1", load: { running: 1e9 + 1 }, reportedAtMs: T0 },
          "samples[1].load.running must be a finite number in [0, 1000000000], got 1000000001",
        ],
        [
          "a fractional report time",
          { replicaId: "a-1", load: { running: 1 }, reportedAtMs: T0 + 0.5 },
          `samples[1].reportedAtMs must be an integer in [0, 8640000000000000], got ${T0 + 0.5}`,
        ],
        [
          "a negative report time",
          { replicaId: "a-1", load: { running: 1 }, reportedAtMs: -1 },
          "samples[1].reportedAtMs must be an integer in [0, 8640000000000000], got -1",
        ],
        ["a sample that is no object", null, "samples[1] must be an object, got null"],
      ] as const
    ).map(([name, bad, message]): [string, RoutingMessage, string] => [
      `a load sample with ${name}`,
      {
        kind: "load",
        epoch: "e1",
        // A good sample first: the bad one is found after it, and named by its index.
        samples: [{ replicaId: "a-0", load: { running: 1 }, reportedAtMs: T0 }, bad],
      } as unknown as RoutingMessage,
      `routing load: ${message}`,
    ]),
    [
      "a policy it does not know",
      snapshot({ models: [model("alpha", { policy: "random" as "llmgw" })] }),
      'routing snapshot: models[0].policy must be one of llmgw, round-robin, least-loaded, got "random"',
    ],
    [
      "a replica id twice",
      snapshot({ replicas: [replica("r", "alpha"), replica("r", "beta")] }),
      'routing snapshot: replicas[1].id repeats "r"',
    ],
    [
      "a bad secret hash",
      snapshot({ keys: [{ ...grant("k", "s"), secretSha256: "ABC" }] }),
      'routing snapshot: keys[0].secretSha256 must be 64 lower-case hex digits, got "ABC"',
    ],
    [
      "an rpm of 0",
      snapshot({ keys: [grant("k", "s", { rpm: 0 })] }),
      "routing snapshot: keys[0].rpm must be an integer in [1, 4294967295], got 0",
    ],
    [
      "0 routers",
      snapshot({ routers: 0 }),
      "routing snapshot: routers must be an integer in [1, 10000], got 0",
    ],
    [
      "delta version 0",
      delta(0),
      "routing delta: version must be an integer in [1, 9007199254740991], got 0",
    ],
    [
      "an unsafe version",
      snapshot({ version: 2 ** 53 }),
      "routing snapshot: version must be an integer in [0, 9007199254740991], got 9007199254740992",
    ],
    [
      "a bad removed id",
      delta(11, { removedReplicas: [""] }),
      'routing delta: removedReplicas[0] must be a string of 1..256 characters, got ""',
    ],
    [
      "keepalive interval 0",
      { kind: "keepalive", epoch: "e1", version: 10, sentAtMs: T0, intervalMs: 0 },
      "routing keepalive: intervalMs must be an integer in [1, 3600000], got 0",
    ],
    [
      "an unknown kind",
      { kind: "hello" } as unknown as RoutingMessage,
      'routing message: kind must be one of snapshot, delta, load, keepalive, got "hello"',
    ],
    [
      "too many models in one message",
      snapshot({
        models: Array.from({ length: ROUTING_LIMITS.maxModels + 1 }, (_, i) => model(`m${i}`)),
      }),
      "routing snapshot: models holds 100001 entries, more than 100000",
    ],
  ])("refuses %s, naming the field, and keeps its state", (_, message, expected) => {
    const { state } = setup();
    const before = state.snapshot();
    expect(routerErrorOf(() => state.apply(message))).toEqual({
      code: "LLMGW_ROUTER_ROUTING_INVALID",
      message: expected,
    });
    expect(routerErrorOf(() => validateRoutingMessage(message)).message).toBe(expected);
    expect(state.snapshot()).toEqual(before);
    expect(state.routeTable.version).toBe(1);
  });

  it("refuses a delta that would hold more keys than the bound", () => {
    const keys = Array.from({ length: ROUTING_LIMITS.maxKeys }, (_, i) => grant(`k${i}`, `s${i}`));
    const { state } = setup(snapshot({ keys }));
    expect(state.apply(delta(11, { upsertedKeys: [grant("k0", "rotated")] }))).toBe("applied");
    expect(
      routerErrorOf(() => state.apply(delta(12, { upsertedKeys: [grant("one-more", "s")] }))),
    ).toEqual({
      code: "LLMGW_ROUTER_ROUTING_INVALID",
      message: "routing delta: upsertedKeys would hold more than 100000 keys",
    });
    expect(
      state.apply(delta(12, { removedKeys: ["k1"], upsertedKeys: [grant("one-more", "s")] })),
    ).toBe("applied");
    expect(state.apiKeys.verify("s")?.id).toBe("one-more");
  });

  it("refuses a loadStaleMs out of range", () => {
    expect(routerErrorOf(() => createRoutingState({ hashSecret: sha256, loadStaleMs: 0 }))).toEqual(
      {
        code: "LLMGW_ROUTER_INVALID_OPTIONS",
        message: "option loadStaleMs must be a number in [1, 86400000], got 0",
      },
    );
  });
});

describe("createRoutingState: tenants", () => {
  const team = {
    name: "team",
    rpm: 100,
    tpm: 10_000,
    maxConcurrency: 9,
    budgets: [{ period: "day" as const, tokens: 1_000_000 }],
    priority: "batch" as const,
    weight: 3,
  };
  const withTenants = (routers = 1) =>
    snapshot({
      routers,
      tenants: [team],
      keys: [
        grant("k1", "sk-one", {
          tenant: "team",
          budgets: [{ period: "month", model: "alpha", tokens: 500 }],
        }),
        grant("k2", "sk-two", { tenant: "team", priority: "critical" }),
        grant("k3", "sk-three", { tenant: "ghost" }),
      ],
    });

  it("projects a key's tenant (its share of rates, budgets whole), budgets and class", () => {
    const { state } = setup(withTenants(2));
    const tenant = {
      name: "team",
      rpm: 50,
      tpm: 5_000,
      maxConcurrency: 4,
      budgets: team.budgets,
      weight: 3,
    };
    expect(state.apiKeys.verify("sk-one")).toEqual({
      id: "k1",
      name: "k1-name",
      tenant,
      budgets: [{ period: "month", model: "alpha", tokens: 500 }],
      priority: "batch",
    });
    expect(state.apiKeys.verify("sk-two")).toMatchObject({ priority: "critical", tenant });
    // One object per tenant: every key's limits are the same tenant's state.
    expect(state.apiKeys.verify("sk-one")?.tenant).toBe(state.apiKeys.verify("sk-two")?.tenant);
    // A tenant not granted: the key is still its tenant's, without limits.
    expect(state.apiKeys.verify("sk-three")).toEqual({
      id: "k3",
      name: "k3-name",
      tenant: { name: "ghost", weight: 1, ungranted: true },
    });
  });

  it("applies upserted and removed tenants from a delta to the keys that name them", () => {
    const { state } = setup(withTenants());
    state.apply(delta(11, { upsertedTenants: [{ ...team, tpm: 20, priority: undefined }] }));
    expect(state.apiKeys.verify("sk-one")?.tenant?.tpm).toBe(20);
    expect(state.apiKeys.verify("sk-one")?.priority).toBeUndefined();
    state.apply(delta(12, { upsertedTenants: [{ name: "ghost", weight: 7 }] }));
    expect(state.apiKeys.verify("sk-three")?.tenant).toEqual({ name: "ghost", weight: 7 });
    state.apply(delta(13, { removedTenants: ["team"] }));
    expect(state.apiKeys.verify("sk-one")?.tenant).toEqual({
      name: "team",
      weight: 1,
      ungranted: true,
    });
  });

  it("re-divides a tenant's rates when the router count changes", () => {
    const { state } = setup(withTenants());
    state.apply(delta(11, { routers: 4 }));
    expect(state.apiKeys.verify("sk-one")?.tenant).toMatchObject({
      rpm: 25,
      tpm: 2_500,
      maxConcurrency: 2,
    });
  });

  it("saves tenants in snapshot() and restores them", () => {
    const { state } = setup(withTenants());
    const saved = state.snapshot() as RoutingSnapshot;
    expect(saved.tenants).toEqual([team]);
    const copy = createRoutingState({ hashSecret: sha256, now: () => T0 });
    copy.apply(JSON.parse(JSON.stringify(saved)) as RoutingSnapshot);
    expect(copy.apiKeys.verify("sk-one")).toEqual(state.apiKeys.verify("sk-one"));
  });

  it.each<[string, RoutingMessage, string]>([
    [
      "a weight of 0",
      snapshot({ tenants: [{ ...team, weight: 0 }] }),
      "routing snapshot: tenants[0].weight must be an integer in [1, 1000], got 0",
    ],
    [
      "a budget period it does not know",
      snapshot({ tenants: [{ ...team, budgets: [{ period: "week" as "day", tokens: 1 }] }] }),
      'routing snapshot: tenants[0].budgets[0].period must be one of day, month, got "week"',
    ],
    [
      "a cache isolation it does not know",
      snapshot({ tenants: [{ ...team, cacheIsolation: "none" as "tenant" }] }),
      'routing snapshot: tenants[0].cacheIsolation must be one of tenant, key, got "none"',
    ],
    [
      "a key's unknown class",
      snapshot({ keys: [grant("k1", "sk-one", { priority: "urgent" as "critical" })] }),
      'routing snapshot: keys[0].priority must be one of critical, standard, batch, got "urgent"',
    ],
    [
      "a tenant twice",
      snapshot({ tenants: [team, team] }),
      'routing snapshot: tenants[1].name repeats "team"',
    ],
  ])("refuses %s", (_name, message, error) => {
    const state = createRoutingState({ hashSecret: sha256, now: () => T0 });
    expect(() => state.apply(message)).toThrow(error);
    expect(state.epoch).toBeUndefined();
  });
});
