/**
 * The routing view the control plane hands the router. It is read locally on every request;
 * the hot path never calls a control API (a per-request control call cut a peer's gateway
 * throughput by 75%).
 */
import type { EngineCacheIsolation } from "./cache-isolation.js";

/** Routing policy of one deployment. `llmgw` scores affinity + load; the others are baselines. */
export type RoutingPolicy = "llmgw" | "round-robin" | "least-loaded";

/**
 * Replica lifecycle as the router cares about it; only `ready` replicas receive new requests.
 * A `draining` one is leaving on purpose: the requests already on it run to their last byte,
 * nothing new goes there (no pick, no retry, no admission capacity).
 */
export type ReplicaRouteState =
  | "starting"
  | "loading"
  | "ready"
  | "draining"
  | "unhealthy"
  | "stopping";

/** Engine load signals as last reported (absent = nobody reported it, never 0). */
export interface ReplicaLoad {
  /** Requests the engine is running. */
  readonly running?: number;
  /** Requests waiting in the engine's own queue. */
  readonly waiting?: number;
  /** KV-cache usage, 0..1. */
  readonly kvCacheUsage?: number;
  /** Engine prefix-cache hit rate, 0..1. */
  readonly prefixCacheHitRate?: number;
  /** The engine's KV-cache capacity in tokens (sizes the router's model of its prefix cache). */
  readonly kvCacheTokens?: number;
}

/** One replica the router may send requests to. */
export interface ReplicaRoute {
  /** Stable replica id (also the `x-llmgw-replica` header value and a metric label). */
  readonly id: string;
  /** Base URL of the engine's OpenAI server, e.g. `http://10.0.0.5:8000` (no `/v1`). */
  readonly baseUrl: string;
  readonly state: ReplicaRouteState;
  /** Most requests the router keeps in flight on this replica at once (≥ 1). */
  readonly capacity: number;
  readonly load?: ReplicaLoad;
  /**
   * The key the replica's engine demands, sent upstream as `Authorization: Bearer` (never
   * the client's own key, which the router checks and keeps). Undefined: the engine takes none.
   */
  readonly apiKey?: string;
  /**
   * `Bearer ${apiKey}`, precomputed where routes are projected (once per table version) so the
   * hot path builds no header string per request. When absent the router derives it.
   */
  readonly authorization?: string;
  /** Where its agent serves its KV-cache blocks (precise mode); absent: no KV events. */
  readonly kvEventsUrl?: string;
  /** GPUs the replica holds, all ranks together (a request's GPU-seconds are a share). */
  readonly gpus?: number;
}

/** How a deployment's requests are tokenized for precise routing (see `tokenizer.ts`). */
export type PromptTokenizerKind = "sim" | "vllm";

/** What {@link RouteTable.resolve} returns for a served model name. */
export interface RouteResolution {
  /** Deployment name (metric label, admission queue key). */
  readonly deployment: string;
  readonly policy: RoutingPolicy;
  readonly replicas: readonly ReplicaRoute[];
  /** True while at least one replica of the deployment is starting or loading. */
  readonly loading: boolean;
  /** How its requests may be tokenized for precise routing; absent: they may not. */
  readonly tokenizer?: PromptTokenizerKind;
  /**
   * Its engines schedule by a request's `priority` field (vLLM's `--scheduling-policy
   * priority`): the router sets it from the request's class. Absent: false.
   */
  readonly enginePriority?: boolean;
  /**
   * How its engines keep a request's prefix cache apart, for a router that isolates caches
   * (`CacheIsolation`). Absent: not known (a control plane before it), so both ways.
   */
  readonly cacheIsolation?: EngineCacheIsolation;
}

/**
 * The control plane's routing state, read in the hot path. Implementations must answer from
 * memory; `version` grows on every change so caches (worker pools, pools of connections) can
 * refresh, and `subscribe` notifies about such changes.
 */
export interface RouteTable {
  /** The deployment serving `modelName`, or `undefined` for an unknown model. */
  resolve(modelName: string): RouteResolution | undefined;
  /** Served model names with at least one ready replica, sorted. */
  models(): string[];
  /** Monotonic version; grows on every change. */
  readonly version: number;
  /** Calls `listener(version)` after each change; returns an unsubscribe function. */
  subscribe(listener: (version: number) => void): () => void;
}

/** A route table whose content is replaced wholesale; for tests, benchmarks and the demo. */
export interface StaticRouteTable extends RouteTable {
  /** Replaces the whole table (model name → resolution) and bumps the version. */
  set(routes: Readonly<Record<string, RouteResolution>>): void;
  /** Replaces one model's resolution (or removes it with `undefined`) and bumps the version. */
  update(modelName: string, route: RouteResolution | undefined): void;
}

/** Creates a {@link StaticRouteTable} holding `routes` (model name → resolution). */
export function createStaticRouteTable(
  routes: Readonly<Record<string, RouteResolution>> = {},
): StaticRouteTable {
  let table = new Map<string, RouteResolution>(Object.entries(routes));
  let version = 1;
  const listeners = new Set<(version: number) => void>();
  const bump = (): void => {
    version += 1;
    for (const listener of listeners) listener(version);
  };
  return {
    resolve: (modelName) => table.get(modelName),
    models: () =>
      [...table.entries()]
        .filter(([, r]) => r.replicas.some((replica) => replica.state === "ready"))
        .map(([name]) => name)
        .sort(),
    get version() {
      return version;
    },
    subscribe(listener) {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
    set(next) {
      table = new Map(Object.entries(next));
      bump();
    },
    update(modelName, route) {
      if (route === undefined) table.delete(modelName);
      else table.set(modelName, route);
      bump();
    },
  };
}
