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
 */

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
  /** Leading blocks of `keys` each of `replicaIds` holds (a replica holding none is absent). */
  match(replicaIds: readonly string[], keys: ArrayLike<number>): Map<string, number>;
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
export function createPreciseIndex(): PreciseIndex {
  const held = new Map<string, Held>();
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
    },
    state(replicaId) {
      const h = held.get(replicaId);
      return h === undefined
        ? undefined
        : { fresh: h.fresh, blocks: h.keys.size, blockSizeTokens: h.blockSizeTokens };
    },
    match(replicaIds, keys) {
      const out = new Map<string, number>();
      for (const id of replicaIds) {
        const h = held.get(id);
        if (h === undefined || !h.fresh) continue;
        // Leading blocks only: the engine's hit stops at its first missing block.
        let n = 0;
        while (n < keys.length && h.keys.has(keys[n] as number)) n++;
        if (n > 0) out.set(id, n);
      }
      return out;
    },
  };
}
