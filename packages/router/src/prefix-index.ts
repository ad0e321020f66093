/**
 * A bounded prefix index: block key → replicas that recently received a prompt with that prefix.
 *
 * One index per router process, on the main thread: workers return the hash chain and the main
 * thread matches and records it, so every request sees every other request's history (a
 * per-worker map would split affinity). Matching is O(blocks) `Map` lookups (~5 µs for a
 * 200-block prompt), small next to parsing and hashing, which run in the workers.
 * Memory is bounded by `maxEntries` (LRU by last record) and `maxReplicasPerBlock`.
 */
import { checkRange } from "./errors.js";

/** Options of {@link createPrefixIndex}. */
export interface PrefixIndexOptions {
  /** Most block keys kept (default 100 000; ~10 MB). */
  readonly maxEntries?: number;
  /** Most replicas remembered per block, most recent first (default 4). */
  readonly maxReplicasPerBlock?: number;
}

/** The index. */
export interface PrefixIndex {
  /**
   * For each replica holding a prefix of `chain`: the number of leading blocks it holds
   * (the longest prefix it recently received). Does not refresh LRU order.
   */
  match(chain: ArrayLike<number>): Map<string, number>;
  /** Records that `replicaId` received the prefixes in `chain` (refreshes their LRU order). */
  record(chain: ArrayLike<number>, replicaId: string): void;
  /** Forgets a replica everywhere it is remembered (e.g. it was removed or restarted). */
  forget(replicaId: string): void;
  /** Number of block keys held. */
  readonly size: number;
}

/** Creates a {@link PrefixIndex}. */
export function createPrefixIndex(options: PrefixIndexOptions = {}): PrefixIndex {
  const maxEntries = checkRange("maxEntries", options.maxEntries ?? 100_000, 1, 1e8);
  const perBlock = checkRange("maxReplicasPerBlock", options.maxReplicasPerBlock ?? 4, 1, 64);
  const map = new Map<number, string[]>();
  return {
    match(chain) {
      const out = new Map<string, number>();
      for (let i = 0; i < chain.length; i++) {
        const ids = map.get(chain[i] as number);
        if (ids === undefined) continue;
        for (const id of ids) out.set(id, i + 1);
      }
      return out;
    },
    record(chain, replicaId) {
      for (let i = 0; i < chain.length; i++) {
        const key = chain[i] as number;
        const ids = map.get(key);
        if (ids === undefined) {
          map.set(key, [replicaId]);
        } else {
          map.delete(key);
          const at = ids.indexOf(replicaId);
          if (at !== 0) {
            if (at > 0) ids.splice(at, 1);
            ids.unshift(replicaId);
            if (ids.length > perBlock) ids.length = perBlock;
          }
          map.set(key, ids);
        }
      }
      while (map.size > maxEntries) {
        const oldest = map.keys().next().value as number;
        map.delete(oldest);
      }
    },
    forget(replicaId) {
      for (const [key, ids] of map) {
        const at = ids.indexOf(replicaId);
        if (at < 0) continue;
        ids.splice(at, 1);
        if (ids.length === 0) map.delete(key);
      }
    },
    get size() {
      return map.size;
    },
  };
}
