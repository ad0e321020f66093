/**
 * The blocks one engine (one publisher) holds, keyed by our own token-block keys
 * ({@link tokenBlockKeys}), kept from its KV events. The engine's hashes are per-process random,
 * so each `BlockStored` is re-keyed from its token ids, chained on the parent's key; a map from
 * engine hash to our key lets `BlockRemoved` (which carries only engine hashes) resolve.
 */
import { KvEventsError } from "./errors.js";
import type { BlockRemovedEvent, BlockStoredEvent, KvEvent, KvEventBatch } from "./kv-event.js";
import { chainKey, saltKey } from "./token-blocks.js";

/** What one applied batch (or a {@link ReplicaBlockSet.clear}) changed, as a delta. */
export interface BlockSetChange {
  /** Keys that were held before this change and are not now (empty when `cleared`). */
  readonly removed: readonly number[];
  /** True when the set was emptied first: drop every key, then add `added`. */
  readonly cleared: boolean;
  /** Keys not held before this change (after the clear, when `cleared`) and held now. */
  readonly added: readonly number[];
}

/** Options of {@link createReplicaBlockSet}. */
export interface ReplicaBlockSetOptions {
  /**
   * Most (engine hash, medium) entries held (default 1,048,576, ~100 MB). Past it new blocks
   * are refused and counted in `refusedFull`; removals make room again.
   */
  readonly maxBlocks?: number;
  /**
   * The block size the consumer keys requests with. When set, a `BlockStored` of another size
   * is refused (`blockSizeMismatch`); when not, the first event's size is adopted.
   */
  readonly blockSize?: number;
  /** Called after every change that added or removed a key, or cleared the set. */
  readonly onChange?: (change: BlockSetChange) => void;
}

/** Counters of a {@link ReplicaBlockSet}, since it was created. */
export interface ReplicaBlockSetStats {
  /** (engine hash, medium) entries held now. */
  readonly entries: number;
  /** Distinct keys held now. */
  readonly keys: number;
  /** Blocks stored (entries added). */
  readonly stored: number;
  /** Entries removed by `BlockRemoved`. */
  readonly removed: number;
  /** Blocks whose parent hash is not held: their prefix is unknown, so they were not keyed. */
  readonly orphaned: number;
  /** Blocks refused because the set held `maxBlocks` entries. */
  readonly refusedFull: number;
  /** Blocks refused because their medium would be the set's {@link MAX_MEDIA}+1st. */
  readonly refusedMedium: number;
  /** Blocks of another KV-cache group or spec kind than full attention (not matched on). */
  readonly skippedGroup: number;
  /**
   * Blocks with a LoRA or extra keys (multimodal, prompt embeddings): token ids alone do not
   * key them. A `cache_salt` alone (a chain's first block with the extra key `[salt]`) is
   * keyed, from `saltKey(salt)`.
   */
  readonly skippedExtraKeys: number;
  /** Blocks of a `BlockStored` whose block size differs from the set's. */
  readonly blockSizeMismatch: number;
  /** `BlockStored` of an entry already held (same hash and medium). */
  readonly duplicateStored: number;
  /** `BlockRemoved` hashes not held (stored before we subscribed, skipped, or orphaned). */
  readonly unknownRemoved: number;
  /** Times the set was emptied (`AllBlocksCleared` or {@link ReplicaBlockSet.clear}). */
  readonly clears: number;
}

/** The block set of one engine; one writer (the subscriber's owner) applies batches. */
export interface ReplicaBlockSet {
  /** Applies a decoded batch in order; returns what changed (also given to `onChange`). */
  apply(batch: KvEventBatch): BlockSetChange;
  /**
   * Empties the set (the engine restarted, or events were lost) and forgets an adopted block
   * size; emits a cleared change.
   */
  clear(): BlockSetChange;
  /** True if some held block has this key. */
  has(key: number): boolean;
  /** The keys held, in no particular order. */
  snapshot(): number[];
  /** The engine's block size: the option, or the first `BlockStored`'s; undefined before. */
  readonly blockSize: number | undefined;
  stats(): ReplicaBlockSetStats;
}

interface Entry {
  readonly key: number;
  /**
   * Media this hash is held in ("GPU", "CPU", "" for none given), usually one; the set's
   * interned strings, at most {@link MAX_MEDIA}.
   */
  media: string[];
}

const DEFAULT_MAX_BLOCKS = 1_048_576;

/**
 * Most distinct media the entries of one set hold at a time. vLLM names two ("GPU", "CPU");
 * a connector may add a few. The medium is an engine-chosen string of up to 64 KiB (the
 * decoder's string bound), and each entry lists its media and searches that list on every
 * store and removal: without a bound, a hash stored in n media cost O(n²) and every entry kept
 * its own copy of its medium string. Media are interned and counted, so the set holds each
 * once; one that no entry holds any more makes room for another.
 */
export const MAX_MEDIA = 16;

/** Tracks a batch's net change, relative to the set before it (or to empty, after a clear). */
class Delta {
  cleared = false;
  readonly #present = new Map<number, boolean>();

  added(key: number): void {
    if (this.#present.get(key) === false) this.#present.delete(key);
    else this.#present.set(key, true);
  }

  removed(key: number): void {
    if (this.#present.get(key) === true) this.#present.delete(key);
    else this.#present.set(key, false);
  }

  clear(): void {
    this.cleared = true;
    this.#present.clear();
  }

  result(): BlockSetChange {
    const added: number[] = [];
    const removed: number[] = [];
    for (const [key, present] of this.#present) (present ? added : removed).push(key);
    return { removed, cleared: this.cleared, added };
  }
}

function isFullAttention(event: BlockStoredEvent): boolean {
  return (
    (event.groupIdx ?? 0) === 0 && (event.kvCacheSpecKind ?? "full_attention") === "full_attention"
  );
}

/**
 * Creates the block set of one engine. Only KV-cache group 0 with spec kind absent or
 * `"full_attention"` counts (hybrid and sliding-window matching is work in progress in every
 * consumer, per the reference). A block is keyed only when its parent is known: a `BlockStored`
 * whose parent hash is not held counts its blocks as `orphaned` rather than guessing a prefix.
 */
export function createReplicaBlockSet(options: ReplicaBlockSetOptions = {}): ReplicaBlockSet {
  const maxBlocks = options.maxBlocks ?? DEFAULT_MAX_BLOCKS;
  if (!Number.isSafeInteger(maxBlocks) || maxBlocks <= 0) {
    throw new KvEventsError(
      "LLMGW_KV_EVENTS_INVALID_OPTIONS",
      `maxBlocks must be a positive integer, got ${String(options.maxBlocks)}`,
    );
  }
  if (
    options.blockSize !== undefined &&
    (!Number.isSafeInteger(options.blockSize) || options.blockSize <= 0)
  ) {
    throw new KvEventsError(
      "LLMGW_KV_EVENTS_INVALID_OPTIONS",
      `blockSize must be a positive integer, got ${String(options.blockSize)}`,
    );
  }
  let blockSize = options.blockSize;
  const byHash = new Map<bigint, Entry>();
  /** Our key → how many (engine hash, medium) entries map to it. */
  const refs = new Map<number, number>();
  let entries = 0;
  /** Interned medium → entries held in it. */
  const media = new Map<string, { readonly name: string; entries: number }>();
  const counts = {
    stored: 0,
    removed: 0,
    orphaned: 0,
    refusedFull: 0,
    refusedMedium: 0,
    skippedGroup: 0,
    skippedExtraKeys: 0,
    blockSizeMismatch: 0,
    duplicateStored: 0,
    unknownRemoved: 0,
    clears: 0,
  };

  function addRef(key: number, delta: Delta): void {
    const n = refs.get(key) ?? 0;
    refs.set(key, n + 1);
    if (n === 0) delta.added(key);
  }

  function dropRef(key: number, delta: Delta): void {
    const n = refs.get(key) ?? 0;
    if (n <= 1) {
      refs.delete(key);
      delta.removed(key);
    } else {
      refs.set(key, n - 1);
    }
  }

  function stored(event: BlockStoredEvent, delta: Delta): void {
    const n = event.blockHashes.length;
    // Nothing to key; and its block size, which no token ids back, must not become the set's.
    if (n === 0) return;
    if (!isFullAttention(event)) {
      counts.skippedGroup += n;
      return;
    }
    if (blockSize === undefined) blockSize = event.blockSize;
    if (event.blockSize !== blockSize) {
      counts.blockSizeMismatch += n;
      return;
    }
    let parentKey: number | undefined;
    if (event.parentBlockHash !== undefined) {
      const parent = byHash.get(event.parentBlockHash);
      if (!parent) {
        counts.orphaned += n;
        return;
      }
      parentKey = parent.key;
    }
    let medium = event.medium ?? "";
    const size = event.blockSize;
    for (let i = 0; i < n; i++) {
      const hash = event.blockHashes[i] as bigint;
      const extra = event.extraKeys?.[i] ?? null;
      // vLLM's `cache_salt` is the only extra key of a chain's first block: its chain starts
      // from the salt's key, as a router keys the salted prompt.
      const salted = i === 0 && parentKey === undefined ? saltOf(extra) : undefined;
      if (salted !== undefined) parentKey = salted;
      if (
        event.loraName !== undefined ||
        event.loraId !== undefined ||
        (extra !== null && salted === undefined)
      ) {
        // This block and every later one of the chain depend on more than token ids. Engines
        // before vllm#42892 name the adapter only by `lora_id` (nil for the base model).
        counts.skippedExtraKeys += n - i;
        return;
      }
      const existing = byHash.get(hash);
      if (existing?.media.includes(medium)) {
        counts.duplicateStored++;
        parentKey = existing.key;
        continue;
      }
      if (entries >= maxBlocks) {
        counts.refusedFull += n - i;
        return;
      }
      let interned = media.get(medium);
      if (interned === undefined) {
        if (media.size >= MAX_MEDIA) {
          counts.refusedMedium += n - i;
          return;
        }
        interned = { name: medium, entries: 0 };
        media.set(medium, interned);
      }
      interned.entries++;
      medium = interned.name;
      // The same engine hash in another medium (offloaded copy) keeps the key it had.
      const key = existing?.key ?? chainKey(parentKey, event.tokenIds, i * size, (i + 1) * size);
      if (existing) existing.media.push(medium);
      else byHash.set(hash, { key, media: [medium] });
      entries++;
      counts.stored++;
      addRef(key, delta);
      parentKey = key;
    }
  }

  function removedEvent(event: BlockRemovedEvent, delta: Delta): void {
    if ((event.groupIdx ?? 0) !== 0) {
      counts.skippedGroup += event.blockHashes.length;
      return;
    }
    const medium = event.medium ?? "";
    for (const hash of event.blockHashes) {
      const entry = byHash.get(hash);
      const at = entry ? entry.media.indexOf(medium) : -1;
      if (!entry || at < 0) {
        counts.unknownRemoved++;
        continue;
      }
      entry.media.splice(at, 1);
      if (entry.media.length === 0) byHash.delete(hash);
      const interned = media.get(medium) as { entries: number };
      if (--interned.entries === 0) media.delete(medium);
      entries--;
      counts.removed++;
      dropRef(entry.key, delta);
    }
  }

  function clearAll(delta: Delta): void {
    byHash.clear();
    refs.clear();
    media.clear();
    entries = 0;
    counts.clears++;
    delta.clear();
  }

  function emit(delta: Delta): BlockSetChange {
    const change = delta.result();
    if (change.cleared || change.added.length > 0 || change.removed.length > 0) {
      options.onChange?.(change);
    }
    return change;
  }

  function applyEvent(event: KvEvent, delta: Delta): void {
    switch (event.type) {
      case "BlockStored":
        stored(event, delta);
        return;
      case "BlockRemoved":
        removedEvent(event, delta);
        return;
      case "AllBlocksCleared":
        clearAll(delta);
        return;
    }
  }

  return {
    apply(batch) {
      const delta = new Delta();
      for (const event of batch.events) applyEvent(event, delta);
      return emit(delta);
    },
    clear() {
      const delta = new Delta();
      clearAll(delta);
      // A restarted engine may come back with another block size.
      blockSize = options.blockSize;
      return emit(delta);
    },
    has: (key) => refs.has(key),
    snapshot: () => [...refs.keys()],
    get blockSize() {
      return blockSize;
    },
    stats: () => ({ entries, keys: refs.size, ...counts }),
  };
}

/**
 * The chain key a first block's extra key `[salt]` (vLLM: `(cache_salt,)`, the only extra key
 * of a plain-text prompt's first block) starts from; `undefined` for any other extra key.
 */
function saltOf(extra: unknown): number | undefined {
  if (!Array.isArray(extra) || extra.length !== 1) return undefined;
  const salt = extra[0];
  return typeof salt === "string" && salt !== "" ? saltKey(salt) : undefined;
}
