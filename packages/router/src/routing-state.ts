/**
 * A router's copy of the routing state, fed by {@link RoutingMessage}s: it answers the hot path
 * as a {@link RouteTable} and an {@link ApiKeyStore}, and hands back a snapshot to persist.
 *
 * Contract (the implementation and its tests live here):
 * - a snapshot replaces everything; a delta applies only on exactly `version - 1` of the same
 *   epoch (older or equal: `ignored`; a gap or another epoch: `resync`); load and keepalives
 *   never bump `version` nor rebuild resolutions: load is written into the projected replica
 *   routes in place;
 * - an upserted replica without `apiKey` keeps the key already held for that replica id;
 * - each router's share: a replica's `capacity` and a key's `rpm`/`tpm`/`maxConcurrency` are
 *   divided by `routers` (at least 1 each);
 * - load older than `loadStaleMs` is left out of the projection (absent, never 0).
 */
import type { ApiKeyStore } from "./api-keys.js";
import type { RouteTable } from "./route-table.js";
import type { RoutingMessage, RoutingSnapshot } from "./routing-messages.js";

/** Inputs of `createRoutingState`. */
export interface RoutingStateOptions {
  /** Lower-case hex sha256 of a secret (this package does no I/O and has no crypto). */
  readonly hashSecret: (secret: string) => string;
  /** Load read longer ago than this (ms) counts as unreported. Default 10 000. */
  readonly loadStaleMs?: number;
  /** Wall clock, epoch ms (load timestamps are epoch ms). Default `Date.now`. */
  readonly now?: () => number;
}

/** What applying one message did. */
export type ApplyResult = "applied" | "ignored" | "resync";

/** A router's routing state. */
export interface RoutingState {
  /**
   * Applies one message heard at `heardAtMs` (default now; a state file passes the time it
   * was last heard). `resync`: drop the feed and reconnect for a snapshot.
   */
  apply(message: RoutingMessage, heardAtMs?: number): ApplyResult;
  /** The route table the handler reads; `version` bumps on membership changes only. */
  readonly routeTable: RouteTable;
  /** Key grants by hash, limits already divided by the router count. */
  readonly apiKeys: ApiKeyStore;
  /** The held state as a snapshot (current load included), or undefined before the first. */
  snapshot(): RoutingSnapshot | undefined;
  /** Undefined before the first snapshot. */
  readonly epoch: string | undefined;
  /** 0 before the first snapshot. */
  readonly version: number;
  /** Routers sharing the cluster (≥ 1). */
  readonly routers: number;
  /** When a message was last applied or ignored (epoch ms); undefined before any. */
  readonly lastHeardAtMs: number | undefined;
  /** Called after each membership change (snapshot or delta applied), not after load. */
  onMembershipChange(listener: () => void): () => void;
}
