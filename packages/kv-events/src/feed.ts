/**
 * One engine's blocks as a feed for routers: a subscriber to the engine's KV events, the block
 * set they build, and the versioned snapshot + deltas that `KvCacheService.WatchBlocks` streams
 * (`service.ts`). An agent runs one per replica that publishes events; the routing benchmark
 * runs the same code beside its simulators.
 *
 * Each reset of the set (the engine restarted, a gap no replay could close) starts a new
 * **epoch** (a random id): a router holding the old epoch's blocks drops them and takes the
 * snapshot that follows. Within an epoch every change bumps the **version** by one.
 */
import { randomUUID } from "node:crypto";
import { type BlockSetChange, createReplicaBlockSet, type ReplicaBlockSet } from "./block-set.js";
import {
  createKvEventSubscriber,
  type KvEventSubscriber,
  type KvEventsLogger,
  type KvEventsResetReason,
} from "./subscriber.js";

/** One message of a feed, as `WatchBlocksResponse` carries it. */
export interface KvFeedUpdate {
  readonly epoch: string;
  readonly version: number;
  readonly snapshot: boolean;
  readonly added: readonly number[];
  readonly removed: readonly number[];
  readonly blockSizeTokens: number;
  readonly stale: boolean;
}

/** A feed: what a watcher needs to start (a snapshot) and to follow (each change). */
export interface KvBlockFeed {
  /** The whole set now, as a snapshot message. */
  snapshot(): KvFeedUpdate;
  /**
   * Calls `listener` with each change from now on (a delta of the current epoch, or — after a
   * reset — a new epoch's snapshot). Returns the unsubscribe function.
   */
  subscribe(listener: (update: KvFeedUpdate) => void): () => void;
  /** The block set (for stats and tests). */
  readonly blocks: ReplicaBlockSet;
  /** Its epoch and version, resets, and the batches its subscriber received. */
  readonly stats: () => {
    readonly epoch: string;
    readonly version: number;
    readonly resets: number;
    readonly received: number;
  };
  /**
   * Aborted once {@link close} has been called. A watcher of a closed feed must end its
   * stream: the replica was retired or relaunched, and a relaunch serves a new feed under the
   * same replica id. (A signal rather than a promise, so a watch that ends first can remove
   * its listener.)
   */
  readonly closedSignal: AbortSignal;
  /**
   * The engine's process was replaced (the agent restarts it): its cache died with it. Empties
   * the set and starts a new epoch now, before the new process has published anything (an idle
   * one publishes nothing, and routers would go on trusting the dead cache), and the
   * subscriber takes the new process's next batch as its baseline, whatever its seq.
   * Does nothing while no batch has come since the feed started (or was last replaced).
   */
  engineReplaced(): void;
  /** Stops the subscriber, drops the listeners and aborts {@link closedSignal}. Idempotent. */
  close(): Promise<void>;
}

/** Options of {@link createKvBlockFeed}. */
export interface KvBlockFeedOptions {
  /** The engine's PUB endpoint, e.g. `tcp://127.0.0.1:5557`. */
  readonly endpoint: string;
  readonly replayEndpoint?: string;
  readonly topic?: string;
  readonly logger?: KvEventsLogger;
  /** Most blocks held (see `ReplicaBlockSetOptions.maxBlocks`). */
  readonly maxBlocks?: number;
}

/**
 * Subscribes to one engine and keeps its feed. A set that missed events only ever claims too
 * little (a missed store is a block it does not know; a removal it missed was of such a block),
 * except across a gap, where it may miss the removal of a block it holds: the subscriber resets
 * it then (replay first, when the engine offers it), and a new epoch starts empty. So the feed
 * is never `stale` here: an empty set is the truth as far as anyone can tell.
 */
export function createKvBlockFeed(options: KvBlockFeedOptions): KvBlockFeed {
  const listeners = new Set<(update: KvFeedUpdate) => void>();
  const closing = new AbortController();
  let epoch = randomUUID();
  let version = 0;
  let resets = 0;
  /** Kept for a resync that could answer from a replay; never set today (see above). */
  const stale = false;
  const emit = (u: KvFeedUpdate): void => {
    for (const listener of listeners) listener(u);
  };
  const blocks = createReplicaBlockSet({
    ...(options.maxBlocks === undefined ? {} : { maxBlocks: options.maxBlocks }),
    onChange: (change: BlockSetChange) => {
      if (change.cleared) return; // a reset is announced as a new epoch's snapshot below
      version += 1;
      emit({
        epoch,
        version,
        snapshot: false,
        added: change.added,
        removed: change.removed,
        blockSizeTokens: blocks.blockSize ?? 0,
        stale,
      });
    },
  });
  const snapshot = (): KvFeedUpdate => ({
    epoch,
    version,
    snapshot: true,
    added: blocks.snapshot(),
    removed: [],
    blockSizeTokens: blocks.blockSize ?? 0,
    stale,
  });
  const reset = (reason: KvEventsResetReason | "cleared"): void => {
    resets += 1;
    epoch = randomUUID();
    version = 0;
    options.logger?.info("kv feed reset", { endpoint: options.endpoint, reason });
    emit(snapshot());
  };
  const subscriber: KvEventSubscriber = createKvEventSubscriber({
    endpoint: options.endpoint,
    ...(options.topic === undefined ? {} : { topic: options.topic }),
    ...(options.replayEndpoint === undefined ? {} : { replayEndpoint: options.replayEndpoint }),
    ...(options.logger === undefined ? {} : { logger: options.logger }),
    onReset: (reason) => {
      blocks.clear();
      reset(reason);
    },
    onBatch: (batch) => {
      const cleared = batch.events.some((e) => e.type === "AllBlocksCleared");
      blocks.apply(batch);
      // AllBlocksCleared empties the set: a new epoch, so routers drop what they held.
      if (cleared) reset("cleared");
    },
  });
  return {
    snapshot,
    subscribe(listener) {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
    blocks,
    stats: () => ({ epoch, version, resets, received: subscriber.stats().received }),
    closedSignal: closing.signal,
    engineReplaced() {
      // Blocks come only from batches: no batch since the start (or the last replacement), none.
      if (subscriber.lastSeq === undefined) return;
      subscriber.forgetSequence();
      blocks.clear();
      reset("restart");
    },
    async close() {
      listeners.clear();
      closing.abort();
      await subscriber.close();
    },
  };
}
