/**
 * The KV-cache events vLLM (and SGLang, TensorRT-LLM, which took the same schema) publish, as
 * plain data. Field names are vLLM's in camelCase; a field the engine sent as null or left out
 * (msgspec `omit_defaults`) is absent here. Source: `vllm/distributed/kv_events.py`; see
 * /work/shared/reference/kv-events.md and the package README.
 */

/** Blocks entered the engine's prefix cache (one event may carry several chained blocks). */
export interface BlockStoredEvent {
  readonly type: "BlockStored";
  /** Engine hashes of the blocks, in chain order, as u64. */
  readonly blockHashes: readonly bigint[];
  /** Engine hash of the block before the first one; absent for a prompt's first block. */
  readonly parentBlockHash?: bigint;
  /** Every token of these blocks: `blockHashes.length × blockSize` ids. */
  readonly tokenIds: readonly number[];
  /** Tokens per block, as the engine was configured. */
  readonly blockSize: number;
  /** Deprecated in vLLM in favour of `loraName`. */
  readonly loraId?: number;
  /** `"GPU"`, `"CPU"` (offloaded) or whatever a connector reports. */
  readonly medium?: string;
  readonly loraName?: string;
  /** One entry per block (LoRA name, multimodal hashes, cache salt …), passed through as is. */
  readonly extraKeys?: readonly unknown[];
  /** KV-cache group (hybrid models have several); 0 or absent for plain full attention. */
  readonly groupIdx?: number;
  /** e.g. `"full_attention"`, `"sliding_window"`. */
  readonly kvCacheSpecKind?: string;
  readonly kvCacheSpecSlidingWindow?: number;
  readonly locality?: string;
}

/** Blocks left the engine's cache (evicted or freed). */
export interface BlockRemovedEvent {
  readonly type: "BlockRemoved";
  readonly blockHashes: readonly bigint[];
  readonly medium?: string;
  readonly groupIdx?: number;
  readonly locality?: string;
}

/** The engine dropped its whole prefix cache (reset, or a sleep/wake). */
export interface AllBlocksClearedEvent {
  readonly type: "AllBlocksCleared";
}

/** One KV-cache event. */
export type KvEvent = BlockStoredEvent | BlockRemovedEvent | AllBlocksClearedEvent;

/** The payload of one published message: `[ts, events, data_parallel_rank?]`. */
export interface KvEventBatch {
  /** Engine wall-clock time, epoch seconds (float). */
  readonly ts: number;
  readonly events: readonly KvEvent[];
  /** The publisher's data-parallel rank; absent when the engine sent none. */
  readonly dataParallelRank?: number;
}
