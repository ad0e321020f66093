/**
 * The routing state as plain data: what the control plane streams to routers (`WatchRouting`,
 * converted in `@llmgw/wire`) and hands its in-process router directly. Membership (models,
 * replicas, key grants, the router count) is versioned; load is refreshed in place and never
 * bumps the version, so a heartbeat's load never rebuilds route resolutions.
 */
import type { EngineCacheIsolation, TenantCacheIsolation } from "./cache-isolation.js";
import type { PromptTokenizerKind, ReplicaLoad, RoutingPolicy } from "./route-table.js";
import type { UsageAnswer, UsageBatch } from "./usage-ledger.js";

/** A served model name and the deployment that serves it. */
export interface RoutedModel {
  /** Served model name (what clients put in `model`). */
  readonly name: string;
  readonly deployment: string;
  readonly policy: RoutingPolicy;
  /** True while at least one replica of the deployment is starting or loading. */
  readonly loading: boolean;
  /** How requests may be tokenized for precise routing (absent: they may not). */
  readonly tokenizer?: PromptTokenizerKind;
  /**
   * The engine schedules by a request's `priority` field (vLLM's `--scheduling-policy
   * priority`): a router sets it from the request's priority class. Absent: false.
   */
  readonly enginePriority?: boolean;
  /**
   * How its engines keep a request's prefix cache apart, for a router that isolates caches
   * (`CacheIsolation`). Absent: not known (a control plane before it), so both ways.
   */
  readonly cacheIsolation?: EngineCacheIsolation;
}

/** Routing state of one replica: `ready` takes new requests, `draining` only finishes. */
export type RoutedReplicaState = "ready" | "draining";

/** One replica as the control plane routes it. */
export interface RoutedReplica {
  readonly id: string;
  /** Served model name. */
  readonly model: string;
  readonly deployment: string;
  /** e.g. `http://10.0.0.5:8000` (no `/v1`). */
  readonly baseUrl: string;
  readonly state: RoutedReplicaState;
  /** Most requests the whole cluster keeps in flight on it (≥ 1); each router takes a share. */
  readonly capacity: number;
  /**
   * The key its engine demands. Absent while the control plane has not learnt it (after its
   * restart, until the node's next heartbeat): a router then keeps the key it already holds.
   */
  readonly apiKey?: string;
  /** Where its agent serves its KV-cache blocks (`KvCacheService`); absent: no KV events. */
  readonly kvEventsUrl?: string;
  /**
   * GPUs the replica holds, all ranks together: a request's GPU-seconds are its share of
   * these over its duration. Absent: unknown.
   */
  readonly gpus?: number;
  /** Last reported load, and when it was read from the engine (epoch ms); both or neither. */
  readonly load?: ReplicaLoad;
  readonly loadReportedAtMs?: number;
}

/** An API key as routers check it: a hash and its cluster-wide limits, never the secret. */
export interface KeyGrant {
  readonly id: string;
  readonly name: string;
  /** Lower-case hex sha256 of the secret. */
  readonly secretSha256: string;
  /** Models the key may call; absent or empty means all. */
  readonly models?: readonly string[];
  readonly rpm?: number;
  readonly tpm?: number;
  readonly maxConcurrency?: number;
  /** The tenant that owns the key, whose limits bound it too; absent: none. */
  readonly tenant?: string;
  /** Absent or empty: none. */
  readonly budgets?: readonly TokenBudget[];
  /** Absent: the tenant's class, else `standard`. */
  readonly priority?: PriorityClass;
}

/**
 * How a request is served when its deployment is at capacity: every queued request of a
 * higher class goes first; `batch` is refused first when the queue is full.
 */
export type PriorityClass = "critical" | "standard" | "batch";

/** A UTC calendar period a token budget covers. */
export type BudgetPeriod = "day" | "month";

/** Most tokens (prompt + completion) a tenant or key may use in each UTC day or month. */
export interface TokenBudget {
  readonly period: BudgetPeriod;
  /** Served model name; absent: every model together. */
  readonly model?: string;
  readonly tokens: number;
}

/**
 * A tenant as routers enforce it. Rates and concurrency are cluster-wide (each router takes
 * its share); budgets are cluster-wide too, their standing learnt from usage reports.
 */
export interface TenantGrant {
  readonly name: string;
  readonly rpm?: number;
  readonly tpm?: number;
  readonly maxConcurrency?: number;
  /** Absent or empty: none. */
  readonly budgets?: readonly TokenBudget[];
  /** Absent: `standard`. */
  readonly priority?: PriorityClass;
  /** Share of its priority class under contention, relative to other tenants' (1–1000). */
  readonly weight: number;
  /**
   * When the tenant was created (ms): a tenant created again under a deleted one's name is
   * another tenant. Absent: not told (an older control plane).
   */
  readonly createdAtMs?: number;
  /**
   * The least isolation of the tenant's prefix caches on every router (`tenant` or `key`), which
   * a router applies when its own `--cache-isolation` is less strict. Absent: the router's own.
   */
  readonly cacheIsolation?: TenantCacheIsolation;
}

/** The whole routing state at `version` of `epoch`; replaces whatever a router held. */
export interface RoutingSnapshot {
  readonly kind: "snapshot";
  /** Changes whenever a control plane starts: versions of two epochs do not compare. */
  readonly epoch: string;
  readonly version: number;
  readonly models: readonly RoutedModel[];
  readonly replicas: readonly RoutedReplica[];
  readonly keys: readonly KeyGrant[];
  /** Absent: none. */
  readonly tenants?: readonly TenantGrant[];
  /** Routers connected to the control plane, the receiver included (≥ 1). */
  readonly routers: number;
  readonly sentAtMs: number;
}

/** The changes from `version - 1` to `version`: applied only on exactly `version - 1`. */
export interface RoutingDelta {
  readonly kind: "delta";
  readonly epoch: string;
  readonly version: number;
  readonly upsertedModels: readonly RoutedModel[];
  readonly removedModels: readonly string[];
  readonly upsertedReplicas: readonly RoutedReplica[];
  readonly removedReplicas: readonly string[];
  readonly upsertedKeys: readonly KeyGrant[];
  readonly removedKeys: readonly string[];
  /** Absent: none. */
  readonly upsertedTenants?: readonly TenantGrant[];
  /** Names of tenants deleted; absent: none. */
  readonly removedTenants?: readonly string[];
  /** Set when the number of connected routers changed. */
  readonly routers?: number;
  readonly sentAtMs: number;
}

/** Fresh engine load of one replica. */
export interface ReplicaLoadSample {
  readonly replicaId: string;
  readonly load: ReplicaLoad;
  /** When the agent read it from the engine (epoch ms). */
  readonly reportedAtMs: number;
}

/** Load for some replicas, refreshed in place; unknown replica ids are ignored. */
export interface LoadUpdate {
  readonly kind: "load";
  readonly epoch: string;
  readonly samples: readonly ReplicaLoadSample[];
}

/** Sent on a quiet stream; three missed intervals mean the stream is dead. */
export interface RoutingKeepalive {
  readonly kind: "keepalive";
  readonly epoch: string;
  readonly version: number;
  readonly sentAtMs: number;
  readonly intervalMs: number;
}

/** Anything a routing feed delivers. */
export type RoutingMessage = RoutingSnapshot | RoutingDelta | LoadUpdate | RoutingKeepalive;

/**
 * What one router still has in flight on each replica it holds as `draining`: the control
 * plane stops a draining replica once every connected router reports 0 for it (or its drain
 * times out). It lists every draining replica held, 0 included (absent is not 0: a replica
 * missing from a report is one this router does not hold as draining); an empty list says the
 * router holds none any more.
 */
export interface InFlightReport {
  /** Epoch and version of the routing state the router holds (the last message it applied). */
  readonly epoch: string;
  readonly stateVersion: number;
  readonly draining: readonly { readonly replicaId: string; readonly inFlight: number }[];
}

/**
 * A source of routing messages: the control plane's publisher (in-process, and behind
 * `WatchRouting`). A new subscriber's first message is a snapshot; later ones follow in order.
 */
export interface RoutingFeed {
  /** Returns an unsubscribe function. */
  subscribe(listener: (message: RoutingMessage) => void): () => void;
  /**
   * Takes a subscriber's {@link InFlightReport} (the in-process router's; remote routers send
   * theirs with `RouterService.ReportInFlight`). Called off the feed's delivery, at most every
   * ~100 ms while the router holds draining replicas. Absent: reports are dropped.
   */
  reportInFlight?(report: InFlightReport): void;
  /**
   * Stores a subscriber's usage batch (the in-process router's; remote routers send theirs
   * with `RouterService.ReportUsage`) and answers with every budget's standing. Absent: usage
   * is kept by the router until a control plane takes it.
   */
  reportUsage?(routerId: string, batch: UsageBatch): Promise<UsageAnswer>;
}
