/**
 * The routing state as plain data: what the control plane streams to routers (`WatchRouting`,
 * converted in `@llmgw/wire`) and hands its in-process router directly. Membership (models,
 * replicas, key grants, the router count) is versioned; load is refreshed in place and never
 * bumps the version, so a heartbeat's load never rebuilds route resolutions.
 */
import type { PromptTokenizerKind, ReplicaLoad, RoutingPolicy } from "./route-table.js";

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
}
