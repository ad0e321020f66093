/**
 * The router's model of each replica's prefix cache: block key → replicas that recently received
 * a prompt with that prefix.
 *
 * It is meant to say "this replica still has this prefix" as often as the engine would, so it
 * keeps what the engine keeps:
 * - **Capacity**: each replica holds at most as many blocks as its engine's KV cache
 *   ({@link PrefixIndex.setCapacity}, from the engine's reported KV size); without one, only the
 *   index-wide `maxEntries` bound applies.
 * - **Eviction**: least recently used first, per replica, as vLLM's and the simulator's free
 *   queues do. A chain is touched from its last block to its first, as vLLM frees a finished
 *   request's blocks (tail first, `reversed(blocks)` in its block pool), so a prompt's first
 *   blocks are the last to go: a shared system prompt outlives the turns after it.
 * - **Where a prompt ends**: a prompt's tail (its key at its last quarter block past the chain,
 *   `quarterTail`) is held like a block, and matched against the quarters of a later prompt's
 *   block after each holder's last, so the replica a conversation's earlier turn went to
 *   holds more of its next turn than the others holding only their shared system prompt.
 *
 * One index per router process, on the main thread: workers return the hash chain and the main
 * thread matches and records it, so every request sees every other request's history (a
 * per-worker map would split affinity). Matching is O(blocks) `Map` lookups (~5 µs for a
 * 200-block prompt), small next to parsing and hashing, which run in the workers; recording it
 * moves nodes of two {@link LruMap}s (match + record of 200 blocks: ~26 µs, against ~112 µs
 * when each touch deleted and set a `Map` key again).
 */
import { checkRange } from "./errors.js";
import { LruMap } from "./lru-map.js";

/** Options of {@link createPrefixIndex}. */
export interface PrefixIndexOptions {
  /** Most block keys kept across all replicas (default 100 000; ~10 MB). */
  readonly maxEntries?: number;
  /** Most replicas remembered per block, most recent first (default 64). */
  readonly maxReplicasPerBlock?: number;
}

/** The index. */
export interface PrefixIndex {
  /**
   * For each replica holding a prefix of `chain`: the number of leading blocks it holds
   * (the deepest key of the chain it holds: a key stands for its whole prefix), plus a quarter
   * for each quarter of the next block it holds when `quarters` (the prompt's
   * `PromptKeys.quarters`) are given and a prompt that ended there was recorded with its
   * tail. Does not refresh LRU order.
   */
  match(chain: ArrayLike<number>, quarters?: ArrayLike<number>): Map<string, number>;
  /**
   * Records that `replicaId` received the prefixes in `chain` (refreshes their LRU order), and
   * `tail`, the prompt's key at its last quarter past the chain (`quarterTail`), when it has
   * one: a later turn of its conversation matches there, where others sharing its blocks do not.
   */
  record(chain: ArrayLike<number>, replicaId: string, tail?: number): void;
  /**
   * Sets how many blocks `replicaId`'s cache holds (its engine's KV cache in index blocks);
   * undefined: unknown, no per-replica bound. A smaller capacity evicts at once.
   */
  setCapacity(replicaId: string, blocks: number | undefined): void;
  /** Blocks held for `replicaId`. */
  blocksOf(replicaId: string): number;
  /** Forgets a replica everywhere it is remembered (e.g. it was removed or restarted). */
  forget(replicaId: string): void;
  /** Number of block keys held. */
  readonly size: number;
}

/** One replica's blocks, least recently used first, and its capacity. */
interface ReplicaCache {
  readonly blocks: LruMap<number, true>;
  capacity: number;
}

/** Creates a {@link PrefixIndex}. */
export function createPrefixIndex(options: PrefixIndexOptions = {}): PrefixIndex {
  const maxEntries = checkRange("maxEntries", options.maxEntries ?? 100_000, 1, 1e8);
  const perBlock = checkRange("maxReplicasPerBlock", options.maxReplicasPerBlock ?? 64, 1, 1024);
  /** Key → replicas holding it, most recent first; in global LRU order. */
  const map = new LruMap<number, string[]>();
  const replicas = new Map<string, ReplicaCache>();

  const cacheOf = (id: string): ReplicaCache => {
    let c = replicas.get(id);
    if (c === undefined) {
      c = { blocks: new LruMap(), capacity: Number.POSITIVE_INFINITY };
      replicas.set(id, c);
    }
    return c;
  };
  /** Removes `id` from `key`'s holders (and the key once nobody holds it). */
  const release = (key: number, id: string): void => {
    const ids = map.get(key);
    if (ids === undefined) return;
    const at = ids.indexOf(id);
    if (at < 0) return;
    ids.splice(at, 1);
    if (ids.length === 0) map.delete(key);
  };
  /** Records that `id` holds `key`, most recently. */
  const touch = (key: number, id: string, c: ReplicaCache): void => {
    c.blocks.set(key, true);
    const ids = map.get(key);
    if (ids === undefined) {
      map.set(key, [id]);
      return;
    }
    const at = ids.indexOf(id);
    if (at !== 0) {
      if (at > 0) ids.splice(at, 1);
      ids.unshift(id);
      if (ids.length > perBlock) {
        for (const dropped of ids.splice(perBlock)) replicas.get(dropped)?.blocks.delete(key);
      }
    }
    map.set(key, ids);
  };
  const trim = (id: string, c: ReplicaCache): void => {
    while (c.blocks.size > c.capacity) {
      const oldest = (c.blocks.oldest() as [number, true])[0];
      c.blocks.delete(oldest);
      release(oldest, id);
    }
  };

  return {
    match(chain, quarters) {
      const out = new Map<string, number>();
      for (let i = 0; i < chain.length; i++) {
        const ids = map.get(chain[i] as number);
        if (ids === undefined) continue;
        for (const id of ids) out.set(id, i + 1);
      }
      if (quarters === undefined || quarters.length === 0) return out;
      // Tails end inside the block after a holder's last: only those blocks' quarters are
      // looked up (the prompt's first block among them, for holders of none).
      const depths = new Set<number>(out.values()).add(0);
      for (const depth of depths) {
        for (let q = 2; q >= 0; q--) {
          const key = quarters[4 * depth + q];
          if (key === undefined) continue;
          const ids = map.get(key);
          if (ids === undefined) continue;
          const held = depth + (q + 1) / 4;
          for (const id of ids) if ((out.get(id) ?? 0) < held) out.set(id, held);
        }
      }
      return out;
    },
    record(chain, replicaId, tail) {
      const c = cacheOf(replicaId);
      if (tail !== undefined) touch(tail, replicaId, c);
      // Last block first: the chain's first blocks end up the most recently used.
      for (let i = chain.length - 1; i >= 0; i--) touch(chain[i] as number, replicaId, c);
      trim(replicaId, c);
      while (map.size > maxEntries) {
        const [oldest, ids] = map.oldest() as [number, string[]];
        map.delete(oldest);
        for (const id of ids) replicas.get(id)?.blocks.delete(oldest);
      }
    },
    setCapacity(replicaId, blocks) {
      const c = cacheOf(replicaId);
      const capacity =
        blocks === undefined
          ? Number.POSITIVE_INFINITY
          : Math.max(0, Math.floor(checkRange("capacity", blocks, 0, 1e9)));
      if (capacity === c.capacity) return;
      c.capacity = capacity;
      trim(replicaId, c);
    },
    blocksOf(replicaId) {
      return replicas.get(replicaId)?.blocks.size ?? 0;
    },
    forget(replicaId) {
      const c = replicas.get(replicaId);
      if (c === undefined) return;
      replicas.delete(replicaId);
      for (const key of c.blocks.keys()) release(key, replicaId);
    },
    get size() {
      return map.size;
    },
  };
}
