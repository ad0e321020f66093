/**
 * Encoding of KV-event batches as vLLM writes them (msgspec msgpack), for the simulator and
 * tests. Reference: /work/shared/reference/kv-events.md.
 */
import { Encoder } from "@msgpack/msgpack";
import { KvEventsError } from "./errors.js";
import type { KvEvent, KvEventBatch } from "./kv-event.js";

/**
 * `"tagged"`: each event a map with a `"type"` key (vllm#42892, vLLM ≥ 0.26);
 * `"positional"`: `["BlockStored", f1, f2, …]` (earlier vLLM, SGLang's copy).
 */
export type KvEventEncoding = "tagged" | "positional";

/** Options of {@link encodeKvEventBatch}. */
export interface KvEventEncodeOptions {
  readonly encoding: KvEventEncoding;
}

// msgspec writes ints in their shortest form and u64 above 2^63 as uint64; @msgpack/msgpack
// writes every bigint as 8 bytes, so hashes that fit a double exactly are passed as numbers.
const encoder = new Encoder({ useBigInt64: true, ignoreUndefined: true });
const SAFE = BigInt(Number.MAX_SAFE_INTEGER);

function hashValue(h: bigint): number | bigint {
  return h <= SAFE ? Number(h) : h;
}

/**
 * The fields of a positional event after the tag, with trailing nulls dropped as msgspec's
 * `omit_defaults` does for fields whose default is null.
 */
function trimTail(values: unknown[]): unknown[] {
  let end = values.length;
  while (end > 0 && (values[end - 1] === null || values[end - 1] === undefined)) end--;
  return values.slice(0, end);
}

function eventValue(event: KvEvent, encoding: KvEventEncoding): unknown {
  switch (event.type) {
    case "BlockStored": {
      const fields: [string, unknown][] = [
        ["block_hashes", event.blockHashes.map(hashValue)],
        [
          "parent_block_hash",
          event.parentBlockHash === undefined ? null : hashValue(event.parentBlockHash),
        ],
        ["token_ids", event.tokenIds],
        ["block_size", event.blockSize],
        ["lora_id", event.loraId ?? null],
        ["medium", event.medium ?? null],
        ["lora_name", event.loraName ?? null],
        ["extra_keys", event.extraKeys ?? null],
        ["group_idx", event.groupIdx ?? null],
        ["kv_cache_spec_kind", event.kvCacheSpecKind ?? null],
        ["kv_cache_spec_sliding_window", event.kvCacheSpecSlidingWindow ?? null],
        ["locality", event.locality ?? null],
      ];
      if (encoding === "positional") return ["BlockStored", ...trimTail(fields.map((f) => f[1]))];
      // vLLM 0.26.0 as captured in kthena#1535: the fields up to kv_cache_spec_kind are always
      // present (null included); the later ones have null defaults and are omitted when null.
      const map: Record<string, unknown> = { type: "BlockStored" };
      for (const [i, [name, value]] of fields.entries()) {
        if (i < 10 || value !== null) map[name] = value;
      }
      if (map.extra_keys === null) map.extra_keys = event.blockHashes.map(() => null);
      return map;
    }
    case "BlockRemoved": {
      const fields: [string, unknown][] = [
        ["block_hashes", event.blockHashes.map(hashValue)],
        ["medium", event.medium ?? null],
        ["group_idx", event.groupIdx ?? null],
        ["locality", event.locality ?? null],
      ];
      if (encoding === "positional") return ["BlockRemoved", ...trimTail(fields.map((f) => f[1]))];
      const map: Record<string, unknown> = { type: "BlockRemoved" };
      for (const [i, [name, value]] of fields.entries()) {
        if (i < 3 || value !== null) map[name] = value;
      }
      return map;
    }
    case "AllBlocksCleared":
      return encoding === "positional" ? ["AllBlocksCleared"] : { type: "AllBlocksCleared" };
  }
}

/**
 * One batch as vLLM publishes it: `[ts, events]` or `[ts, events, data_parallel_rank]`, with
 * `ts` always a float64 (msgspec writes a Python float as such even when it is whole).
 */
export function encodeKvEventBatch(batch: KvEventBatch, options: KvEventEncodeOptions): Uint8Array {
  if (options.encoding !== "tagged" && options.encoding !== "positional") {
    throw new KvEventsError(
      "LLMGW_KV_EVENTS_INVALID_OPTIONS",
      `encoding must be "tagged" or "positional", got ${JSON.stringify(options.encoding)}`,
    );
  }
  const events = encoder.encode(batch.events.map((e) => eventValue(e, options.encoding)));
  const rank =
    batch.dataParallelRank === undefined ? undefined : encoder.encode(batch.dataParallelRank);
  const out = new Uint8Array(1 + 9 + events.length + (rank?.length ?? 0));
  out[0] = rank === undefined ? 0x92 : 0x93; // fixarray of 2 or 3
  out[1] = 0xcb; // float64
  new DataView(out.buffer).setFloat64(2, batch.ts, false);
  out.set(events, 10);
  if (rank) out.set(rank, 10 + events.length);
  return out;
}
