/**
 * Precise mode: the blocks each replica's engine really holds, as its agent serves them from the
 * engine's own KV-cache events (`KvCacheService.WatchBlocks`: a snapshot, then deltas). Keys are
 * llmgw's chained keys over token ids (`@llmgw/kv-events` `tokenBlockKeys`), so a request
 * tokenized with the deployment's tokenizer matches exactly what the engine would hit.
 *
 * A replica's set is usable only while it is `fresh`: a snapshot arrived in its current epoch
 * and every delta since applied in order. A delta out of order, an epoch change without a
 * snapshot, or an agent that says `stale` makes it unusable until the next snapshot; the
 * router then routes that deployment on its approximate index (`prefix-index.ts`) and says so
 * in its metrics.
 *
 * The engines' events say what *was* stored, so a prompt sent a moment ago is not there yet:
 * its blocks are stored when the engine has computed them. Every request sent with its keys is
 * therefore *held* on its replica until it ends, plus a grace for the engine's events to arrive
 * ({@link PreciseIndex.hold}). Without holds, a tenant's requests that came while its first was
 * still queued matched nothing at its home, counted as whole prompts queued there and moved:
 * at 640 req/s on `shared-prefix` (bench/routing) precise mode kept 50% of prompt tokens cached
 * with TTFT p90 3.8 s, where the approximate index, which records a prompt when it is sent,
 * kept 89% at 229 ms. A running request's blocks are in its engine's cache while it runs, so a
 * hold is true for as long as it lasts.
 */
import { type Clock, systemClock } from "./clock.js";

/** One message of a replica's block feed (`WatchBlocksResponse`, plain). */
export interface BlockFeedUpdate {
  readonly epoch: string;
  readonly version: number;
  readonly snapshot: boolean;
  readonly added: ArrayLike<number>;
  readonly removed: ArrayLike<number>;
  readonly blockSizeTokens: number;
  readonly stale: boolean;
}

/** What {@link PreciseIndex.apply} made of an update. */
export type BlockFeedResult = "applied" | "stale" | "out_of_order";

/** A replica's standing in the index. */
export interface PreciseReplicaState {
  readonly fresh: boolean;
  readonly blocks: number;
  readonly blockSizeTokens: number | undefined;
}

/** The index. */
export interface PreciseIndex {
  /**
   * Applies one feed message for `replicaId`. `out_of_order`: a delta that does not follow what
   * is held (the caller should reopen the feed for a snapshot); the replica is not fresh.
   */
  apply(replicaId: string, update: BlockFeedUpdate): BlockFeedResult;
  /** Marks a replica's set unusable (its feed broke) without forgetting it. */
  invalidate(replicaId: string): void;
  /** Drops a replica. */
  forget(replicaId: string): void;
  /** Undefined when the replica has no feed. */
  state(replicaId: string): PreciseReplicaState | undefined;
  /**
   * Leading blocks of `keys` each fresh one of `replicaIds` holds, its engine's blocks and its
   * held requests' together (a replica holding none is absent).
   */
  match(replicaIds: readonly string[], keys: ArrayLike<number>): Map<string, number>;
  /** A request with `keys` was sent to `replicaId`: they count as held there until released. */
  hold(replicaId: string, keys: ArrayLike<number>): void;
  /**
   * The request sent with `keys` ended: its hold lasts the grace more if it `succeeded` (its
   * engine's events for it may still be on the way), no longer otherwise.
   */
  release(replicaId: string, keys: ArrayLike<number>, succeeded: boolean): void;
  /** Keys held on `replicaId` by requests (for tests). */
  heldKeys(replicaId: string): number;
}

/** Options of {@link createPreciseIndex}. */
export interface PreciseIndexOptions {
  readonly clock?: Clock;
  /** How long a successful request's hold outlives it (ms, default {@link HOLD_GRACE_MS}). */
  readonly holdGraceMs?: number;
}

/**
 * How long a hold outlives its request: an agent relays each event as it comes, so the engine's
 * own `BlockStored` has arrived well within this unless the feed broke (then the replica is not
 * fresh, and nothing is matched on it at all).
 */
export const HOLD_GRACE_MS = 1_000;

/** A hold that ends at `dueMs`. */
interface Release {
  readonly replicaId: string;
  readonly keys: ArrayLike<number>;
  readonly dueMs: number;
}

interface Held {
  epoch: string;
  version: number;
  /** A snapshot of this epoch arrived and every delta since followed in order. */
  synced: boolean;
  fresh: boolean;
  blockSizeTokens: number | undefined;
  readonly keys: Set<number>;
}

/** Most keys one replica's set may hold (an agent that sends more is cut off here). */
export const MAX_PRECISE_KEYS = 4_000_000;

/** Creates a {@link PreciseIndex}. */
export function createPreciseIndex(options: PreciseIndexOptions = {}): PreciseIndex {
  const clock = options.clock ?? systemClock;
  const graceMs = options.holdGraceMs ?? HOLD_GRACE_MS;
  const held = new Map<string, Held>();
  /** Replica id → key → requests holding it. */
  const holds = new Map<string, Map<number, number>>();
  /** Holds ending after their grace, in due order (the grace is one constant). */
  const releases: Release[] = [];
  let releasesHead = 0;
  const unhold = (replicaId: string, keys: ArrayLike<number>): void => {
    const counts = holds.get(replicaId);
    if (counts === undefined) return;
    for (let i = 0; i < keys.length; i++) {
      const k = keys[i] as number;
      const n = (counts.get(k) ?? 0) - 1;
      if (n > 0) counts.set(k, n);
      else counts.delete(k);
    }
    if (counts.size === 0) holds.delete(replicaId);
  };
  const releaseDue = (): void => {
    if (releasesHead === releases.length) return;
    const now = clock.now();
    while (releasesHead < releases.length) {
      const r = releases[releasesHead] as Release;
      if (r.dueMs > now) break;
      releasesHead++;
      unhold(r.replicaId, r.keys);
    }
    if (releasesHead === releases.length) {
      releases.length = 0;
      releasesHead = 0;
    } else if (releasesHead > 1024) {
      releases.splice(0, releasesHead);
      releasesHead = 0;
    }
  };
  return {
    apply(replicaId, u) {
      let h = held.get(replicaId);
      if (h === undefined) {
        h = {
          epoch: u.epoch,
          version: 0,
          synced: false,
          fresh: false,
          blockSizeTokens: undefined,
          keys: new Set(),
        };
        held.set(replicaId, h);
      }
      if (u.snapshot) {
        h.keys.clear();
        h.epoch = u.epoch;
        h.synced = true;
      } else if (!h.synced || u.epoch !== h.epoch || u.version !== h.version + 1) {
        // A keepalive repeats the version it follows: nothing to apply, nothing missed.
        const keepalive =
          h.synced &&
          u.epoch === h.epoch &&
          u.version === h.version &&
          u.added.length + u.removed.length === 0;
        if (!keepalive) {
          h.synced = false;
          h.fresh = false;
          return "out_of_order";
        }
      }
      for (let i = 0; i < u.removed.length; i++) h.keys.delete(u.removed[i] as number);
      for (let i = 0; i < u.added.length && h.keys.size < MAX_PRECISE_KEYS; i++) {
        h.keys.add(u.added[i] as number);
      }
      h.version = u.version;
      h.blockSizeTokens = u.blockSizeTokens > 0 ? u.blockSizeTokens : h.blockSizeTokens;
      // An engine that stored nothing yet has no block size to tell, and nothing to match.
      h.fresh = !u.stale;
      return h.fresh ? "applied" : "stale";
    },
    invalidate(replicaId) {
      const h = held.get(replicaId);
      if (h === undefined) return;
      h.synced = false;
      h.fresh = false;
    },
    forget(replicaId) {
      held.delete(replicaId);
      holds.delete(replicaId);
    },
    state(replicaId) {
      const h = held.get(replicaId);
      return h === undefined
        ? undefined
        : { fresh: h.fresh, blocks: h.keys.size, blockSizeTokens: h.blockSizeTokens };
    },
    match(replicaIds, keys) {
      releaseDue();
      const out = new Map<string, number>();
      for (const id of replicaIds) {
        const h = held.get(id);
        if (h === undefined || !h.fresh) continue;
        const sent = holds.get(id);
        // Leading blocks only: the engine's hit stops at its first missing block.
        let n = 0;
        while (n < keys.length) {
          const k = keys[n] as number;
          if (!h.keys.has(k) && sent?.has(k) !== true) break;
          n++;
        }
        if (n > 0) out.set(id, n);
      }
      return out;
    },
    hold(replicaId, keys) {
      releaseDue();
      if (keys.length === 0) return;
      let counts = holds.get(replicaId);
      if (counts === undefined) {
        counts = new Map();
        holds.set(replicaId, counts);
      }
      for (let i = 0; i < keys.length; i++) {
        const k = keys[i] as number;
        counts.set(k, (counts.get(k) ?? 0) + 1);
      }
    },
    release(replicaId, keys, succeeded) {
      releaseDue();
      if (keys.length === 0) return;
      if (succeeded && graceMs > 0) {
        releases.push({ replicaId, keys, dueMs: clock.now() + graceMs });
      } else {
        unhold(replicaId, keys);
      }
    },
    heldKeys(replicaId) {
      releaseDue();
      return holds.get(replicaId)?.size ?? 0;
    },
  };
}
