/**
 * The routing publisher: the one place the control plane turns cluster state into the routing
 * feed every router watches (the in-process one directly, remote ones behind `WatchRouting`).
 * Membership is diffed and versioned; load is coalesced and never versioned.
 */
import { randomBytes } from "node:crypto";
import {
  type KeyGrant,
  type LoadUpdate,
  type ReplicaLoad,
  type ReplicaLoadSample,
  type RoutedModel,
  type RoutedReplica,
  type RoutingDelta,
  type RoutingFeed,
  type RoutingKeepalive,
  type RoutingMessage,
  type RoutingSnapshot,
  type TenantGrant,
  type TokenBudget,
  validateRoutingMessage,
} from "@llmgw/router";
import { ControlPlaneError } from "../errors.js";

/** What the publisher reads: the routing side of `Cluster`. */
export interface RoutingSource {
  /** Bumped only when the membership may have changed; never by load alone. */
  readonly routingVersion: number;
  onRoutingChange(listener: () => void): () => void;
  routingMembership(): {
    models: readonly RoutedModel[];
    replicas: readonly RoutedReplica[];
    keys: readonly KeyGrant[];
    /** Absent: none. */
    tenants?: readonly TenantGrant[];
  };
  /**
   * Bumped with {@link routingVersion} whenever more than the key grants may have changed;
   * while it stays, {@link routingKeys} is all there is to read again.
   */
  readonly routingTopologyVersion: number;
  /** The key grants of {@link routingMembership} alone. */
  routingKeys(): readonly KeyGrant[];
  /**
   * The tenant grants of {@link routingMembership} alone, read with {@link routingKeys} (they
   * change on the same path). Absent: none.
   */
  routingTenants?(): readonly TenantGrant[];
  onLoad(listener: (sample: ReplicaLoadSample) => void): () => void;
}

/** The connected-router count (the router registry). */
export interface RouterCount {
  readonly connected: number;
  onConnectedChange(listener: (connected: number) => void): () => void;
}

/** Options of {@link createRoutingPublisher}. */
export interface RoutingPublisherOptions {
  /** Membership changes within this window make one delta. Default 25 ms. */
  readonly coalesceMs?: number;
  /** Load samples are flushed as one LoadUpdate this often. Default 100 ms. */
  readonly loadFlushMs?: number;
  /** A keepalive goes out when nothing else did for this long. Default 2 000 ms. */
  readonly keepaliveMs?: number;
  /** Routers sharing the cluster; absent: 1. */
  readonly routers?: RouterCount;
  /** Default: 16 random bytes, hex (a new epoch per start). */
  readonly epoch?: string;
  /** Wall clock for `sentAtMs`, epoch ms. Default `Date.now`. */
  readonly now?: () => number;
  readonly log?: (line: string) => void;
}

/** Counters of a publisher, for tests and benchmarks. */
export interface RoutingPublisherStats {
  readonly epoch: string;
  readonly version: number;
  readonly routers: number;
  readonly subscribers: number;
  readonly snapshots: number;
  readonly deltas: number;
  readonly loadUpdates: number;
  readonly keepalives: number;
  /** Times `routingMembership()` was read (at most once per coalescing window). */
  readonly membershipReads: number;
  /** Times only `routingKeys()` was read (nothing but key grants had changed). */
  readonly keyReads: number;
  /** Messages handed to every subscriber, and the time that took (ms, total and worst). */
  readonly fanouts: number;
  readonly fanoutMsTotal: number;
  readonly fanoutMsMax: number;
  /** Models, replicas and keys left out now, because routers would refuse them. */
  readonly leftOut: number;
  /** Load samples left out so far, because routers would refuse them. */
  readonly loadSamplesLeftOut: number;
}

/** A routing feed over the cluster, with its lifecycle. */
export interface RoutingPublisher extends RoutingFeed {
  readonly epoch: string;
  /** The version of the last snapshot or delta. */
  readonly version: number;
  stats(): RoutingPublisherStats;
  /**
   * Publishes a pending membership change now instead of at the end of its window, so that
   * an admin call (a new API key) has reached the in-process router, synchronously, when it
   * returns. Remote routers get it as fast as their streams carry it.
   */
  flush(): void;
  /** Stops the timers and detaches from the cluster and from every subscriber. */
  close(): void;
}

interface HeldLoad {
  readonly load: ReplicaLoad;
  readonly reportedAtMs: number;
}

/** A replica's membership part (what a delta is about): everything but its load. */
type Membership = Omit<RoutedReplica, "load" | "loadReportedAtMs">;

function membershipOf(r: RoutedReplica): Membership {
  const { load: _load, loadReportedAtMs: _at, ...rest } = r;
  return rest;
}

function sameModel(a: RoutedModel, b: RoutedModel): boolean {
  return (
    a.name === b.name &&
    a.deployment === b.deployment &&
    a.policy === b.policy &&
    a.loading === b.loading &&
    a.tokenizer === b.tokenizer &&
    (a.enginePriority ?? false) === (b.enginePriority ?? false) &&
    a.cacheIsolation === b.cacheIsolation
  );
}

function sameReplica(a: Membership, b: Membership): boolean {
  return (
    a.id === b.id &&
    a.model === b.model &&
    a.deployment === b.deployment &&
    a.baseUrl === b.baseUrl &&
    a.state === b.state &&
    a.capacity === b.capacity &&
    a.apiKey === b.apiKey &&
    a.kvEventsUrl === b.kvEventsUrl &&
    a.gpus === b.gpus
  );
}

function sameList(a: readonly string[] | undefined, b: readonly string[] | undefined): boolean {
  const x = a ?? [];
  const y = b ?? [];
  return x.length === y.length && x.every((v, i) => v === y[i]);
}

function sameKey(a: KeyGrant, b: KeyGrant): boolean {
  return (
    a.id === b.id &&
    a.name === b.name &&
    a.secretSha256 === b.secretSha256 &&
    sameList(a.models, b.models) &&
    a.rpm === b.rpm &&
    a.tpm === b.tpm &&
    a.maxConcurrency === b.maxConcurrency &&
    a.tenant === b.tenant &&
    sameBudgets(a.budgets, b.budgets) &&
    a.priority === b.priority
  );
}

function sameBudgets(
  a: readonly TokenBudget[] | undefined,
  b: readonly TokenBudget[] | undefined,
): boolean {
  const x = a ?? [];
  const y = b ?? [];
  return (
    x.length === y.length &&
    x.every((v, i) => {
      const w = y[i] as TokenBudget;
      return v.period === w.period && v.model === w.model && v.tokens === w.tokens;
    })
  );
}

function sameTenant(a: TenantGrant, b: TenantGrant): boolean {
  return (
    a.name === b.name &&
    a.rpm === b.rpm &&
    a.tpm === b.tpm &&
    a.maxConcurrency === b.maxConcurrency &&
    sameBudgets(a.budgets, b.budgets) &&
    a.priority === b.priority &&
    a.weight === b.weight &&
    a.createdAtMs === b.createdAtMs &&
    a.cacheIsolation === b.cacheIsolation
  );
}

/**
 * Why routers would refuse a message carrying `message`'s one entity, or undefined: the
 * router's own rules (`validateRoutingMessage`), with the message-level prefix cut off
 * (`upsertedKeys[0].rpm must be …` → `rpm must be …`).
 */
function problemOf(message: RoutingMessage): string | undefined {
  try {
    validateRoutingMessage(message);
    return undefined;
  } catch (error) {
    return (error as Error).message.replace(/^routing \w+: (upserted\w+|samples)\[0\]\.?/, "");
  }
}

/** An id as a log line shows it: quoted, cut at 64 characters. */
const shownId = (id: string) =>
  id.length > 64 ? `${JSON.stringify(id.slice(0, 64))}… (${id.length} chars)` : JSON.stringify(id);

/**
 * Upserts (new or changed by `same`) and removals from `held` to `next`; updates `held`.
 * A new or changed entity that `check` finds a problem with is not taken: it counts as absent
 * (removed when held before), and `onInvalid` hears of it.
 */
function diffInto<T>(
  held: Map<string, T>,
  next: readonly T[],
  idOf: (v: T) => string,
  same: (a: T, b: T) => boolean,
  check: (v: T) => string | undefined,
  onInvalid: (id: string, problem: string) => void,
): { upserted: T[]; removed: string[] } {
  const upserted: T[] = [];
  const seen = new Set<string>();
  for (const v of next) {
    const id = idOf(v);
    if (seen.has(id)) {
      onInvalid(id, "is listed twice; the first is kept");
      continue;
    }
    const was = held.get(id);
    if (was === undefined || !same(was, v)) {
      const problem = check(v);
      if (problem !== undefined) {
        onInvalid(id, problem);
        continue;
      }
      upserted.push(v);
      held.set(id, v);
    }
    seen.add(id);
  }
  const removed: string[] = [];
  for (const id of held.keys()) {
    if (!seen.has(id)) removed.push(id);
  }
  for (const id of removed) held.delete(id);
  return { upserted, removed };
}

/** A delta of nothing, to check one entity at a time with the router's rules. */
const EMPTY_DELTA: RoutingDelta = {
  kind: "delta",
  epoch: "check",
  version: 1,
  upsertedModels: [],
  removedModels: [],
  upsertedReplicas: [],
  removedReplicas: [],
  upsertedKeys: [],
  removedKeys: [],
  sentAtMs: 0,
};

const modelProblem = (m: RoutedModel) => problemOf({ ...EMPTY_DELTA, upsertedModels: [m] });
const replicaProblem = (r: Membership) => problemOf({ ...EMPTY_DELTA, upsertedReplicas: [r] });
const keyProblem = (k: KeyGrant) => problemOf({ ...EMPTY_DELTA, upsertedKeys: [k] });
const tenantProblem = (t: TenantGrant) => problemOf({ ...EMPTY_DELTA, upsertedTenants: [t] });
const sampleProblem = (s: ReplicaLoadSample) =>
  problemOf({ kind: "load", epoch: "check", samples: [s] });

/**
 * Creates the routing publisher over `source` (the Cluster). Reads the membership once now
 * (version 1), then:
 * - on `onRoutingChange` (and on a change of the router count) re-reads it at most once per
 *   `coalesceMs`, diffs it by id against what it last published (value equality per entity,
 *   load left out) and sends one delta (version + 1) when anything differs, nothing otherwise;
 * - collects `onLoad` samples per replica (the newest wins) and sends them as one LoadUpdate
 *   every `loadFlushMs`, for published replicas only;
 * - sends a keepalive when nothing went out for `keepaliveMs`.
 *
 * Every new or changed model, replica and key, and every load sample, is checked with the
 * routers' own rules (`validateRoutingMessage`) before it is published: one that routers would
 * refuse is left out (a replica's bad load alone leaves only the load out) and logged once
 * while it stays the same, so one bad entity never makes every router refuse the stream.
 *
 * A new subscriber gets, synchronously, the current snapshot (load included, with the router
 * count as it is now) and a keepalive (so it learns `keepaliveMs` at once, not one to two
 * intervals later), then every later message in order. Listeners are called synchronously: one
 * that throws is dropped and logged.
 * @throws ControlPlaneError `LLMGW_CONTROL_PLANE_CONFIG_INVALID` for an option out of range.
 */
export function createRoutingPublisher(
  source: RoutingSource,
  options: RoutingPublisherOptions = {},
): RoutingPublisher {
  const coalesceMs = options.coalesceMs ?? 25;
  const loadFlushMs = options.loadFlushMs ?? 100;
  const keepaliveMs = options.keepaliveMs ?? 2_000;
  for (const [name, v] of [
    ["coalesceMs", coalesceMs],
    ["loadFlushMs", loadFlushMs],
    ["keepaliveMs", keepaliveMs],
  ] as const) {
    if (!Number.isInteger(v) || v < 1 || v > 600_000) {
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_CONFIG_INVALID",
        `routing publisher: ${name} must be a whole number of ms in 1–600000 (got ${v})`,
      );
    }
  }
  const epoch = options.epoch ?? randomBytes(16).toString("hex");
  if (epoch.length < 1 || epoch.length > 64) {
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_CONFIG_INVALID",
      `routing publisher: epoch must be 1–64 characters (got ${epoch.length})`,
    );
  }
  const now = options.now ?? Date.now;
  const log = options.log ?? (() => {});
  const routerCount = () => Math.max(1, options.routers?.connected ?? 1);

  const models = new Map<string, RoutedModel>();
  const replicas = new Map<string, Membership>();
  const keys = new Map<string, KeyGrant>();
  const tenants = new Map<string, TenantGrant>();
  const loads = new Map<string, HeldLoad>();
  const pendingLoad = new Map<string, ReplicaLoadSample>();
  const listeners = new Set<(message: RoutingMessage) => void>();
  /** Entity (`replica "r-1"`) → why it is left out, as of the last membership read. */
  let leftOut = new Map<string, string>();
  /** Replica id → why its last load sample was left out, until a good one comes. */
  const loadLeftOut = new Map<string, string>();
  let loadSamplesLeftOut = 0;
  let version = 1;
  /** The router count published last (in a delta; a snapshot may carry a newer one). */
  let routers = routerCount();
  /** A snapshot went out with a count other than `routers`: the next flush publishes it. */
  let routersPending = false;
  let seenRoutingVersion = -1;
  let seenTopologyVersion = -1;
  let closed = false;
  let sentSinceKeepalive = false;
  let membershipTimer: NodeJS.Timeout | undefined;
  let loadTimer: NodeJS.Timeout | undefined;
  const stats = {
    snapshots: 0,
    deltas: 0,
    loadUpdates: 0,
    keepalives: 0,
    membershipReads: 0,
    keyReads: 0,
    fanouts: 0,
    fanoutMsTotal: 0,
    fanoutMsMax: 0,
  };

  /** Takes a load sample unless routers would refuse it (then logs it, once per problem). */
  const takeLoad = (sample: ReplicaLoadSample): boolean => {
    const problem = sampleProblem(sample);
    if (problem === undefined) {
      loadLeftOut.delete(sample.replicaId);
      loads.set(sample.replicaId, { load: sample.load, reportedAtMs: sample.reportedAtMs });
      return true;
    }
    loadSamplesLeftOut++;
    if (loadLeftOut.get(sample.replicaId) !== problem) {
      loadLeftOut.set(sample.replicaId, problem);
      log(
        `routing publisher: left out load of replica ${shownId(sample.replicaId)}, routers would refuse it: ${problem}`,
      );
    }
    return false;
  };

  /** Reads the membership; returns what changed since the last read (and applies it). */
  const readMembership = () => {
    seenRoutingVersion = source.routingVersion;
    const found = new Map<string, string>();
    const invalid = (what: string) => (id: string, problem: string) => {
      const entity = `${what} ${shownId(id)}`;
      found.set(entity, problem);
      if (leftOut.get(entity) !== problem)
        log(`routing publisher: left out ${entity}, routers would refuse it: ${problem}`);
    };
    if (source.routingTopologyVersion === seenTopologyVersion) {
      // Only key grants changed (an admin creating or revoking keys): no walk over replicas.
      stats.keyReads++;
      const keyDiff = diffInto(
        keys,
        source.routingKeys(),
        (v) => v.id,
        sameKey,
        keyProblem,
        invalid("key"),
      );
      const tenantDiff = diffInto(
        tenants,
        source.routingTenants?.() ?? [],
        (v) => v.name,
        sameTenant,
        tenantProblem,
        invalid("tenant"),
      );
      for (const [entity, problem] of leftOut) {
        if (!entity.startsWith("key ") && !entity.startsWith("tenant ")) found.set(entity, problem);
      }
      leftOut = found;
      const empty = { upserted: [], removed: [] };
      return { modelDiff: empty, replicaDiff: empty, keyDiff, tenantDiff };
    }
    seenTopologyVersion = source.routingTopologyVersion;
    const m = source.routingMembership();
    stats.membershipReads++;
    const nextReplicas = m.replicas.map(membershipOf);
    const modelDiff = diffInto(
      models,
      m.models,
      (v) => v.name,
      sameModel,
      modelProblem,
      invalid("model"),
    );
    const replicaDiff = diffInto(
      replicas,
      nextReplicas,
      (v) => v.id,
      sameReplica,
      replicaProblem,
      invalid("replica"),
    );
    const keyDiff = diffInto(keys, m.keys, (v) => v.id, sameKey, keyProblem, invalid("key"));
    const tenantDiff = diffInto(
      tenants,
      m.tenants ?? [],
      (v) => v.name,
      sameTenant,
      tenantProblem,
      invalid("tenant"),
    );
    leftOut = found;
    for (const r of m.replicas) {
      if (r.load === undefined || r.loadReportedAtMs === undefined || !replicas.has(r.id)) continue;
      const held = loads.get(r.id);
      if (held === undefined || held.reportedAtMs < r.loadReportedAtMs)
        takeLoad({ replicaId: r.id, load: r.load, reportedAtMs: r.loadReportedAtMs });
    }
    for (const id of replicaDiff.removed) {
      loads.delete(id);
      pendingLoad.delete(id);
      loadLeftOut.delete(id);
    }
    return { modelDiff, replicaDiff, keyDiff, tenantDiff };
  };

  const withLoad = (r: Membership): RoutedReplica => {
    const held = loads.get(r.id);
    return held === undefined ? r : { ...r, load: held.load, loadReportedAtMs: held.reportedAtMs };
  };

  const broadcast = (message: RoutingMessage) => {
    sentSinceKeepalive = true;
    if (listeners.size === 0) return;
    const started = performance.now();
    for (const listener of listeners) {
      try {
        listener(message);
      } catch (error) {
        listeners.delete(listener);
        log(`routing publisher: dropped a subscriber that threw: ${(error as Error).message}`);
      }
    }
    const took = performance.now() - started;
    stats.fanouts++;
    stats.fanoutMsTotal += took;
    if (took > stats.fanoutMsMax) stats.fanoutMsMax = took;
  };

  const flushMembership = () => {
    membershipTimer = undefined;
    if (closed) return;
    const nextRouters = routerCount();
    const membershipMoved = source.routingVersion !== seenRoutingVersion;
    if (!membershipMoved && nextRouters === routers && !routersPending) return;
    const empty = { upserted: [], removed: [] };
    const { modelDiff, replicaDiff, keyDiff, tenantDiff } = membershipMoved
      ? readMembership()
      : { modelDiff: empty, replicaDiff: empty, keyDiff: empty, tenantDiff: empty };
    const routersChanged = nextRouters !== routers || routersPending;
    const changes =
      modelDiff.upserted.length +
      modelDiff.removed.length +
      replicaDiff.upserted.length +
      replicaDiff.removed.length +
      keyDiff.upserted.length +
      keyDiff.removed.length +
      tenantDiff.upserted.length +
      tenantDiff.removed.length;
    if (changes === 0 && !routersChanged) return;
    routers = nextRouters;
    routersPending = false;
    version++;
    const delta: RoutingDelta = {
      kind: "delta",
      epoch,
      version,
      upsertedModels: modelDiff.upserted,
      removedModels: modelDiff.removed,
      upsertedReplicas: replicaDiff.upserted.map(withLoad),
      removedReplicas: replicaDiff.removed,
      upsertedKeys: keyDiff.upserted,
      removedKeys: keyDiff.removed,
      ...(tenantDiff.upserted.length === 0 ? {} : { upsertedTenants: tenantDiff.upserted }),
      ...(tenantDiff.removed.length === 0 ? {} : { removedTenants: tenantDiff.removed }),
      ...(routersChanged ? { routers } : {}),
      sentAtMs: now(),
    };
    stats.deltas++;
    broadcast(delta);
  };

  const scheduleMembership = () => {
    if (closed || membershipTimer !== undefined) return;
    membershipTimer = setTimeout(flushMembership, coalesceMs);
    membershipTimer.unref();
  };

  const flushLoad = () => {
    loadTimer = undefined;
    if (closed || pendingLoad.size === 0) return;
    const samples: ReplicaLoadSample[] = [];
    for (const s of pendingLoad.values()) {
      if (replicas.has(s.replicaId)) samples.push(s);
    }
    pendingLoad.clear();
    if (samples.length === 0) return;
    const update: LoadUpdate = { kind: "load", epoch, samples };
    stats.loadUpdates++;
    broadcast(update);
  };

  const onLoad = (sample: ReplicaLoadSample) => {
    if (closed || !replicas.has(sample.replicaId)) return;
    const held = loads.get(sample.replicaId);
    if (held !== undefined && held.reportedAtMs > sample.reportedAtMs) return;
    if (!takeLoad(sample)) return;
    pendingLoad.set(sample.replicaId, sample);
    if (loadTimer === undefined) {
      loadTimer = setTimeout(flushLoad, loadFlushMs);
      loadTimer.unref();
    }
  };

  readMembership();
  const offChange = source.onRoutingChange(scheduleMembership);
  const offLoad = source.onLoad(onLoad);
  const offRouters = options.routers?.onConnectedChange(scheduleMembership);
  const keepalive = (): RoutingKeepalive => {
    stats.keepalives++;
    return { kind: "keepalive", epoch, version, sentAtMs: now(), intervalMs: keepaliveMs };
  };
  const keepaliveTimer = setInterval(() => {
    if (!sentSinceKeepalive) broadcast(keepalive());
    sentSinceKeepalive = false;
  }, keepaliveMs);
  keepaliveTimer.unref();

  /**
   * The held state with the router count as the registry has it now: a router connecting
   * (it is registered before it subscribes) takes its share at once rather than after the
   * next delta. When that count is not the one published last, the next flush publishes it,
   * so every router converges on it even if the count moves back before then.
   */
  const snapshot = (): RoutingSnapshot => {
    const current = routerCount();
    if (current !== routers && !routersPending) {
      routersPending = true;
      scheduleMembership();
    }
    return {
      kind: "snapshot",
      epoch,
      version,
      models: [...models.values()],
      replicas: [...replicas.values()].map(withLoad),
      keys: [...keys.values()],
      ...(tenants.size === 0 ? {} : { tenants: [...tenants.values()] }),
      routers: current,
      sentAtMs: now(),
    };
  };

  return {
    epoch,
    get version() {
      return version;
    },
    flush() {
      if (membershipTimer === undefined) return;
      clearTimeout(membershipTimer);
      flushMembership();
    },
    subscribe(listener) {
      if (closed) return () => {};
      stats.snapshots++;
      listener(snapshot());
      listener(keepalive());
      listeners.add(listener);
      return () => {
        listeners.delete(listener);
      };
    },
    stats: () => ({
      epoch,
      version,
      routers,
      subscribers: listeners.size,
      ...stats,
      leftOut: leftOut.size,
      loadSamplesLeftOut,
    }),
    close() {
      if (closed) return;
      closed = true;
      clearTimeout(membershipTimer);
      clearTimeout(loadTimer);
      clearInterval(keepaliveTimer);
      offChange();
      offLoad();
      offRouters?.();
      listeners.clear();
    },
  };
}

/** Default bound of {@link streamRoutingFeed}'s queue, in messages. */
export const DEFAULT_MAX_QUEUED_MESSAGES = 512;

/** Options of {@link streamRoutingFeed}. */
export interface RoutingStreamOptions {
  /**
   * Messages waiting for the reader at most; one more and the stream ends with
   * `LLMGW_CONTROL_PLANE_ROUTER_TOO_SLOW`. Default {@link DEFAULT_MAX_QUEUED_MESSAGES}
   * (about 50 s of load updates at 100 ms on an otherwise quiet cluster).
   */
  readonly maxQueued?: number;
  /** Ends the stream: by throwing its reason when that is an Error, else quietly. */
  readonly signal?: AbortSignal;
}

/**
 * A feed as an async stream for one reader (an RPC stream): the feed delivers synchronously
 * into a bounded queue that the reader drains at its own pace. Memory per reader is bounded
 * by `maxQueued` (messages are shared between readers, not copied): a reader that stops
 * reading is cut off, never buffered without end.
 */
export async function* streamRoutingFeed(
  feed: RoutingFeed,
  options: RoutingStreamOptions = {},
): AsyncGenerator<RoutingMessage, void, undefined> {
  const maxQueued = options.maxQueued ?? DEFAULT_MAX_QUEUED_MESSAGES;
  const signal = options.signal;
  let queue: RoutingMessage[] = [];
  let head = 0;
  let failure: ControlPlaneError | undefined;
  let wake: (() => void) | undefined;
  const unsubscribe = feed.subscribe((message) => {
    if (failure !== undefined) return;
    if (queue.length - head >= maxQueued) {
      failure = new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_ROUTER_TOO_SLOW",
        `the router read too slowly: ${maxQueued} routing messages were waiting for it; reconnect for a fresh snapshot`,
      );
      queue = [];
      head = 0;
    } else {
      queue.push(message);
    }
    wake?.();
  });
  const onAbort = () => wake?.();
  signal?.addEventListener("abort", onAbort, { once: true });
  try {
    for (;;) {
      if (signal?.aborted) {
        if (signal.reason instanceof Error) throw signal.reason;
        return;
      }
      if (failure !== undefined) {
        unsubscribe();
        throw failure;
      }
      if (head < queue.length) {
        const message = queue[head] as RoutingMessage;
        head++;
        if (head === queue.length) {
          queue = [];
          head = 0;
        } else if (head > 1_024) {
          queue = queue.slice(head);
          head = 0;
        }
        yield message;
        continue;
      }
      await new Promise<void>((resolve) => {
        wake = resolve;
      });
      wake = undefined;
    }
  } finally {
    signal?.removeEventListener("abort", onAbort);
    unsubscribe();
  }
}
