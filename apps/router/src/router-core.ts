/**
 * What every request of one router handler shares: the routing state, the picker, admission,
 * the key limiter, the analyzer, the metrics sink, the log and the upstream pools. One object,
 * made once per handler and handed to each {@link Exchange} explicitly, so the request path is
 * module-scope code a test can drive with its own upstream dispatcher.
 */

import {
  type AdmissionController,
  type ApiKeyStore,
  CriticalPrefills,
  createAdmissionController,
  createLimiter,
  createReplicaPicker,
  createRequestAnalyzer,
  GpuShares,
  type Limiter,
  noopRouterMetrics,
  type ReplicaPicker,
  type RequestAnalyzer,
  type RouteResolution,
  type RouterMetricsSink,
  type RouteTable,
  systemClock,
  type UsageLedger,
} from "@llmgw/router";
import { Pool } from "undici";
import { startKvWatch } from "./kv-watch.js";
import type { ResolvedRouterServiceOptions } from "./options.js";
import type { PeerSink } from "./peer-exchange.js";

/**
 * Longest a request of another class waits to be sent to a replica with a critical prefill
 * queued (see `CriticalPrefills`): a few engine steps; past it, a long or hung critical prompt
 * no longer holds the replica.
 */
const CRITICAL_PREFILL_MAX_WAIT_MS = 1_000;

/** One upstream request, as an {@link Attempt} hands it to {@link UpstreamDispatcher.dispatch}. */
export interface UpstreamRequest {
  /** The replica's base-URL path prefix plus the client's request URL. */
  readonly path: string;
  readonly method: "POST";
  readonly headers: Record<string, string>;
  /** The client's body, unchanged (perhaps a pooled buffer). */
  readonly body: Uint8Array;
}

/**
 * The callbacks of undici's raw dispatch handler that an {@link Attempt} implements, in the
 * order undici calls them: `onConnect` once, then `onHeaders`, `onData`…, and `onComplete`,
 * or `onError` at any point after `onConnect` (also after `abort` was called).
 */
export interface UpstreamHandler {
  /** `abort(reason)` cancels the request; undici then reports it through `onError(reason)`. */
  onConnect(abort: (reason: Error) => void): void;
  /** The request's last byte was written to the connection: the engine has it from here. */
  onRequestSent?(): void;
  /** Returns false to pause the upstream until `resume()` is called. */
  onHeaders(status: number, rawHeaders: Buffer[], resume: () => void): boolean;
  /** Returns false to pause the upstream until `resume()` is called. */
  onData(chunk: Buffer): boolean;
  onComplete(): void;
  onError(error: Error): void;
}

/** The shape of undici's `Dispatcher.dispatch` that the router uses (a `Pool` is one). */
export interface UpstreamDispatcher {
  dispatch(request: UpstreamRequest, handler: UpstreamHandler): unknown;
}

/** Dispatchers per replica base URL. */
export interface UpstreamPools {
  /** The dispatcher for `baseUrl`, made on first use. Throws on a malformed URL. */
  poolFor(baseUrl: string): UpstreamDispatcher;
  /** Closes the dispatchers of base URLs not in `live` (replicas that left the table). */
  retain(live: ReadonlySet<string>): void;
  /** Destroys every dispatcher. */
  close(): Promise<void>;
}

/** One undici `Pool` per replica origin, with the router's upstream timeouts. */
export function createUndiciPools(options: ResolvedRouterServiceOptions): UpstreamPools {
  const pools = new Map<string, Pool>();
  return {
    poolFor(baseUrl) {
      let pool = pools.get(baseUrl);
      if (pool === undefined) {
        pool = new Pool(new URL(baseUrl).origin, {
          connections: options.upstreamConnections,
          connectTimeout: options.upstreamConnectTimeoutMs,
          headersTimeout: options.upstreamHeadersTimeoutMs,
          bodyTimeout: options.upstreamBodyTimeoutMs,
          keepAliveTimeout: 30_000,
        });
        pools.set(baseUrl, pool);
      }
      return pool;
    },
    retain(live) {
      for (const [baseUrl, pool] of pools) {
        if (live.has(baseUrl)) continue;
        pools.delete(baseUrl);
        void pool.close().catch(() => {});
      }
    },
    async close() {
      await Promise.all([...pools.values()].map((p) => p.destroy().catch(() => {})));
      pools.clear();
    },
  };
}

/** Inputs of {@link createRouterCore}. */
export interface RouterCoreOptions {
  readonly routeTable: RouteTable;
  /** Required unless `options.noAuth`. */
  readonly apiKeys?: ApiKeyStore;
  /** Default: records nothing. */
  readonly metrics?: RouterMetricsSink;
  readonly options: ResolvedRouterServiceOptions;
  /** Default: drops every event. */
  readonly log?: (event: Readonly<Record<string, unknown>>) => void;
  /** Default: {@link createUndiciPools}. Tests pass their own dispatchers. */
  readonly pools?: UpstreamPools;
  /**
   * Where each answered request's usage is summed until it is reported (see
   * usage-reporter.ts); undefined: usage is not recorded (a router with no control plane).
   */
  readonly usage?: UsageLedger;
  /** Called when {@link usage} is full after an add: seal and send it now. */
  readonly onUsageFull?: () => void;
  /** Where this router tells the other routers what it sent (peer-exchange.ts); none: alone. */
  readonly peers?: PeerSink;
  /** Routers serving the cluster now, this one included (the routing state's count). */
  readonly routers?: () => number;
}

/** The shared state of one router handler (see the top of this file). */
export interface RouterCore {
  readonly options: ResolvedRouterServiceOptions;
  readonly routeTable: RouteTable;
  /** Undefined only with `options.noAuth`. */
  readonly apiKeys: ApiKeyStore | undefined;
  readonly picker: ReplicaPicker;
  readonly admission: AdmissionController;
  /** Critical prefills queued per replica (undefined: the prefill reserve is off). */
  readonly criticalPrefills: CriticalPrefills | undefined;
  readonly limiter: Limiter;
  readonly analyzer: RequestAnalyzer;
  readonly metrics: RouterMetricsSink;
  readonly log: (event: Readonly<Record<string, unknown>>) => void;
  readonly pools: UpstreamPools;
  /** Replica id → served model name, for replica-scoped metric labels (bounded by replicas). */
  readonly replicaModel: Map<string, string>;
  /** Models requests have named, whose replicas the route-table listener keeps books on. */
  readonly seenModels: Set<string>;
  /**
   * Replica id → served model of the replicas of {@link seenModels} that take no new requests
   * (draining), and of those that left the table with requests still running: a request ending
   * there shrinks its deployment's admission capacity.
   */
  readonly draining: ReadonlyMap<string, string>;
  /**
   * Sets the admission capacity of `model`'s deployment to what it is now: its ready capacity
   * plus the requests still running on its draining replicas (see
   * `ReplicaPicker.drainingInFlight`). Nothing for a model no longer listed.
   */
  refreshCapacity(model: string): void;
  /** Unix seconds, the `created` of every `/v1/models` entry. */
  readonly createdAt: number;
  /** See {@link RouterCoreOptions.usage}. */
  readonly usage: UsageLedger | undefined;
  readonly onUsageFull: () => void;
  /** Each request's share of its replica's GPUs (only kept with {@link usage}). */
  readonly gpuShares: GpuShares;
  /**
   * Replica id → base URL of the replicas whose engine was seen to report cached tokens
   * (`prompt_tokens_details`): its answers without them had none (vLLM leaves a 0 out), where
   * another engine's are unknown (one launched without the flag, by an agent before it, or
   * adopted). Keyed by URL too: a replica id may come back on another node, another engine.
   * Only replicas in the table; forgotten when they leave it.
   */
  readonly reportsCached: Map<string, string>;
  /** See {@link RouterCoreOptions.peers}. */
  readonly peers: PeerSink | undefined;
  /**
   * Whether a new hint may be homed by step timing (`PickRequest.timedPlacement`): this router
   * is the only one (an unknown router count: no), or tells its peers its homes.
   */
  timedPlacement(): boolean;
  /** Stops listening to the route table, stops the analyzer's workers, closes the pools. */
  close(): Promise<void>;
}

/**
 * Builds the core and subscribes it to the route table: new replicas (or capacity changes) must
 * reach queued requests, and replicas that left the table lose their pool, their routing state
 * and their metric series (replica ids come and go with deployments, and neither the shared
 * in-flight slots nor the series may pile up). Throws a `TypeError` without `apiKeys` unless
 * `options.noAuth`.
 */
export function createRouterCore(input: RouterCoreOptions): RouterCore {
  const { options, routeTable } = input;
  if (!options.noAuth && input.apiKeys === undefined) {
    throw new TypeError("createRouterHandler: apiKeys is required unless options.noAuth is set");
  }
  const metrics = input.metrics ?? noopRouterMetrics;
  const log = input.log ?? (() => {});
  const replicaModel = new Map<string, string>();
  const seenModels = new Set<string>();
  const draining = new Map<string, string>();
  /** Replicas that left the table with requests in flight (→ model), until those end. */
  const retiring = new Map<string, string>();
  const reportsCached = new Map<string, string>();
  const picker = createReplicaPicker({
    ...options.picker,
    ...(input.peers?.instance === undefined ? {} : { routerId: input.peers.instance }),
    health: {
      ...options.picker.health,
      onCircuitChange: (replicaId, from, to) => {
        metrics.circuitState(replicaModel.get(replicaId) ?? "", replicaId, to);
        log({ event: "circuit", replica: replicaId, from, to });
        options.picker.health?.onCircuitChange?.(replicaId, from, to);
      },
    },
  });
  const admission = createAdmissionController(options.admission);
  const analyzer = createRequestAnalyzer(options.analyzer);
  const pools = input.pools ?? createUndiciPools(options);
  const admissionCapacity = (resolution: RouteResolution): number =>
    picker.capacity(resolution) + picker.drainingInFlight(resolution);
  const refreshCapacity = (model: string): void => {
    // A replica that left the table is done holding slots once its last request ended.
    for (const [id, m] of retiring) {
      if (m === model && picker.inFlight.get(id) === 0) {
        retiring.delete(id);
        draining.delete(id);
      }
    }
    const resolution = routeTable.resolve(model);
    if (resolution !== undefined) {
      admission.setCapacity(resolution.deployment, admissionCapacity(resolution));
    }
  };
  // Precise mode: the KV-event feeds of every replica that has one, into the picker.
  const kvWatch = startKvWatch({ routeTable, index: picker.preciseIndex, log });
  const unsubscribe = routeTable.subscribe(() => {
    const liveUrls = new Set<string>();
    const liveIds = new Set<string>();
    draining.clear();
    for (const model of seenModels) {
      const resolution = routeTable.resolve(model);
      if (resolution === undefined) continue;
      for (const r of resolution.replicas) {
        liveUrls.add(r.baseUrl);
        liveIds.add(r.id);
        if (r.state !== "ready") draining.set(r.id, model);
        // Back while requests it had before it left still run: kept on the books, so that it
        // is forgotten when it leaves again.
        if (picker.relisted(r.id)) replicaModel.set(r.id, model);
      }
      admission.setCapacity(resolution.deployment, admissionCapacity(resolution));
    }
    pools.retain(liveUrls);
    const retired = new Set<string>();
    for (const [id, model] of replicaModel) {
      if (liveIds.has(id)) continue;
      replicaModel.delete(id);
      reportsCached.delete(id);
      // Its requests still running hold admission slots, as a draining replica's do.
      picker.forget(id, routeTable.resolve(model)?.deployment);
      if (picker.inFlight.get(id) > 0) {
        retiring.set(id, model);
        retired.add(model);
      }
      metrics.replicaGone(model, id);
    }
    for (const [id, model] of retiring) {
      if (!liveIds.has(id) && picker.inFlight.get(id) > 0) draining.set(id, model);
      else retiring.delete(id);
    }
    for (const model of retired) refreshCapacity(model);
  });
  return {
    options,
    routeTable,
    apiKeys: input.apiKeys,
    picker,
    admission,
    criticalPrefills:
      options.admission.criticalPrefillReserve !== 0
        ? new CriticalPrefills(options.admission.clock ?? systemClock, CRITICAL_PREFILL_MAX_WAIT_MS)
        : undefined,
    limiter: createLimiter(options.clock === undefined ? {} : { clock: options.clock }),
    analyzer,
    metrics,
    log,
    pools,
    replicaModel,
    seenModels,
    draining,
    refreshCapacity,
    createdAt: Math.floor(Date.now() / 1000),
    usage: input.usage,
    onUsageFull: input.onUsageFull ?? (() => {}),
    gpuShares: new GpuShares(),
    reportsCached,
    peers: input.peers,
    timedPlacement: () =>
      input.peers !== undefined || (input.routers !== undefined && input.routers() <= 1),
    async close() {
      unsubscribe();
      kvWatch.close();
      await analyzer.close();
      await pools.close();
    },
  };
}
