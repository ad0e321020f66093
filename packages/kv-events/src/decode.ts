/**
 * Decoding of vLLM's KV-event payloads (msgpack, written by msgspec). Both event forms are
 * accepted: maps tagged by `"type"` (vllm#42892, vLLM ≥ 0.26; `omit_defaults`, so a missing key
 * means null) and the older positional arrays `["BlockStored", f1, f2, …]` (declaration order,
 * trailing default fields dropped). Reference: /work/shared/reference/kv-events.md.
 */
import { DecodeError, Decoder } from "@msgpack/msgpack";
import { KvEventsError, type KvEventsErrorCode } from "./errors.js";
import type { BlockRemovedEvent, BlockStoredEvent, KvEvent, KvEventBatch } from "./kv-event.js";

/** Bounds of {@link decodeKvEventBatch}; every one refuses with its own error code. */
export interface KvEventDecodeLimits {
  /** Largest payload in bytes (default 64 MiB). */
  readonly maxPayloadBytes?: number;
  /** Most events in one batch (default 65,536). */
  readonly maxEventsPerBatch?: number;
  /** Most block hashes in one event (default 65,536: 1M tokens at block size 16). */
  readonly maxHashesPerEvent?: number;
  /** Most token ids in one event (default 1,048,576). */
  readonly maxTokenIdsPerEvent?: number;
}

/** {@link KvEventDecodeLimits} with every default filled in. */
export interface ResolvedKvEventDecodeLimits {
  readonly maxPayloadBytes: number;
  readonly maxEventsPerBatch: number;
  readonly maxHashesPerEvent: number;
  readonly maxTokenIdsPerEvent: number;
}

/** An event of a batch that was refused; the batch's other events still count. */
export interface RejectedKvEvent {
  /** Position in the batch's event list. */
  readonly index: number;
  readonly error: KvEventsError;
}

/** What {@link decodeKvEventBatch} returns: the good events plus an account of the rest. */
export interface DecodedKvEventBatch extends KvEventBatch {
  /** Events refused (malformed, over a bound); in batch order. */
  readonly rejected: readonly RejectedKvEvent[];
  /** Events of a type this decoder does not know (a newer engine), skipped. */
  readonly unknownEvents: number;
}

const DEFAULT_LIMITS: ResolvedKvEventDecodeLimits = {
  maxPayloadBytes: 64 * 1024 * 1024,
  maxEventsPerBatch: 65_536,
  maxHashesPerEvent: 65_536,
  maxTokenIdsPerEvent: 1_048_576,
};

/** Fills in the defaults of `limits`; a limit that is not a positive integer is refused. */
export function resolveKvEventDecodeLimits(
  limits: KvEventDecodeLimits = {},
): ResolvedKvEventDecodeLimits {
  const out = { ...DEFAULT_LIMITS };
  for (const name of Object.keys(DEFAULT_LIMITS) as (keyof ResolvedKvEventDecodeLimits)[]) {
    const value = limits[name];
    if (value === undefined) continue;
    if (!Number.isSafeInteger(value) || value <= 0) {
      throw new KvEventsError(
        "LLMGW_KV_EVENTS_INVALID_OPTIONS",
        `${name} must be a positive integer, got ${String(value)}`,
      );
    }
    out[name] = value;
  }
  return out;
}

const decoders = new Map<string, Decoder>();

function decoderFor(limits: ResolvedKvEventDecodeLimits): Decoder {
  const key = `${limits.maxEventsPerBatch}/${limits.maxHashesPerEvent}/${limits.maxTokenIdsPerEvent}`;
  let decoder = decoders.get(key);
  if (!decoder) {
    // msgpack's own bounds stop a huge declared length before anything is allocated; ours,
    // checked per field below, give the specific error.
    const maxArray = Math.max(
      limits.maxEventsPerBatch,
      limits.maxHashesPerEvent,
      limits.maxTokenIdsPerEvent,
    );
    decoder = new Decoder({
      useBigInt64: true,
      maxArrayLength: maxArray,
      maxMapLength: 256,
      maxStrLength: 64 * 1024,
      maxBinLength: 1024,
      maxExtLength: 0,
    });
    if (decoders.size > 8) decoders.clear();
    decoders.set(key, decoder);
  }
  return decoder;
}

/**
 * Deepest nesting of msgpack containers a batch may have: batch → events → event →
 * `extra_keys` → one block's tuple → a multimodal `(hash, offset)` pair is 6; two to spare.
 */
const MAX_PAYLOAD_DEPTH = 8;

/**
 * Most msgpack containers (arrays and maps, empty ones too) a batch may hold. An empty array
 * is one byte on the wire and a JS array of ~40 bytes once decoded: 8 MB of them measured 305
 * MB of heap and 1.3 s of event loop, so the byte bound alone let a 64 MiB payload cost ~2.4 GB.
 * An engine's batch is one scheduler step: an event per request at most, a few containers each,
 * and `extra_keys` tuples for the blocks newly full in that step (a step's tokens ÷ the block
 * size, thousands). A million leaves that two orders of magnitude and bounds the decoded
 * containers to tens of MB.
 */
export const MAX_PAYLOAD_CONTAINERS = 1_048_576;

/** Items still to read in each open container of {@link checkPayloadShape}'s walk. */
const openItems = new Float64Array(MAX_PAYLOAD_DEPTH + 1);

/**
 * Walks `payload`'s msgpack headers without allocating and returns why it must not be decoded,
 * or `undefined`. @msgpack/msgpack runs `new Array(declared)` for each array header before it
 * reads an element, so 2,000 nested 5-byte `array32(1M)` headers — 10 KB — would ask for ~16 GB.
 * Every item takes at least one byte, so the items all open containers still declare must fit
 * in the bytes left; that bounds what the decoder allocates by the payload's size. Nesting
 * deeper than {@link MAX_PAYLOAD_DEPTH} is refused too. Bytes that are not msgpack, or end too
 * early, stop the walk: everything before them was checked, and the decoder reports them.
 */
function checkPayloadShape(payload: Uint8Array): string | undefined {
  const end = payload.length;
  let pos = 0;
  let depth = 0;
  /** Items declared and not read yet, across all open containers. */
  let pending = 1;
  let containers = 0;
  openItems[0] = 1;
  while (depth >= 0) {
    if (openItems[depth] === 0) {
      depth--;
      continue;
    }
    (openItems[depth] as number)--;
    pending--;
    if (pos >= end) return undefined;
    const at = pos;
    const b = payload[pos++] as number;
    let items = -1; // a container's items (a map's pairs count twice), or -1 for a scalar
    let skip = 0;
    if (b <= 0x7f || b >= 0xe0 || b === 0xc0 || b === 0xc2 || b === 0xc3) {
      // fixint, nil, bool
    } else if (b <= 0x8f) items = (b & 0x0f) * 2;
    else if (b <= 0x9f) items = b & 0x0f;
    else if (b <= 0xbf) skip = b & 0x1f;
    else {
      // Width of the length field (or the fixed size) of the remaining types, 0xc4…0xdf.
      let lenBytes = 0;
      switch (b) {
        case 0xc4:
        case 0xd9:
          lenBytes = 1;
          break;
        case 0xc5:
        case 0xda:
        case 0xdc:
        case 0xde:
          lenBytes = 2;
          break;
        case 0xc6:
        case 0xdb:
        case 0xdd:
        case 0xdf:
          lenBytes = 4;
          break;
        case 0xc7:
          lenBytes = 1;
          skip = 1; // ext type byte
          break;
        case 0xc8:
          lenBytes = 2;
          skip = 1;
          break;
        case 0xc9:
          lenBytes = 4;
          skip = 1;
          break;
        case 0xca:
          skip = 4;
          break;
        case 0xcb:
          skip = 8;
          break;
        case 0xcc:
        case 0xd0:
          skip = 1;
          break;
        case 0xcd:
        case 0xd1:
          skip = 2;
          break;
        case 0xce:
        case 0xd2:
          skip = 4;
          break;
        case 0xcf:
        case 0xd3:
          skip = 8;
          break;
        case 0xd4:
          skip = 2;
          break;
        case 0xd5:
          skip = 3;
          break;
        case 0xd6:
          skip = 5;
          break;
        case 0xd7:
          skip = 9;
          break;
        case 0xd8:
          skip = 17;
          break;
        default:
          return undefined; // 0xc1, never used: the decoder says so
      }
      if (lenBytes > 0) {
        if (pos + lenBytes > end) return undefined;
        let len = 0;
        for (let i = 0; i < lenBytes; i++) len = len * 256 + (payload[pos++] as number);
        if (b >= 0xdc) items = b >= 0xde ? len * 2 : len;
        else skip += len;
      }
    }
    if (items < 0) {
      pos += skip;
      continue;
    }
    if (++containers > MAX_PAYLOAD_CONTAINERS) {
      return `more than ${MAX_PAYLOAD_CONTAINERS} arrays and maps (at byte ${at})`;
    }
    if (items === 0) continue;
    pending += items;
    if (pending > end - pos) {
      const kind = b <= 0x8f || b >= 0xde ? "map" : "array";
      const count = kind === "map" ? items / 2 : items;
      return `${kind} at byte ${at} declares ${count} ${kind === "map" ? "entries" : "elements"}, more than the ${end - pos} bytes left can hold`;
    }
    if (depth === MAX_PAYLOAD_DEPTH) {
      return `containers nested deeper than ${MAX_PAYLOAD_DEPTH} at byte ${at}`;
    }
    openItems[++depth] = items;
  }
  return undefined;
}

/** Thrown inside event decoding; becomes a {@link RejectedKvEvent}. */
function refuse(code: KvEventsErrorCode, message: string): never {
  throw new KvEventsError(code, message);
}

const U64_MASK = (1n << 64n) - 1n;

/**
 * A block hash as u64. vLLM sends the low 64 bits of its big-endian hash as an int by default
 * (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`, vllm/envs.py); with that off it sends the hash's
 * bytes, which we read the same way: the low 64 bits of the big-endian value, i.e. its last 8
 * bytes, so both forms of one hash agree. Dynamo saw the int as i64 (dynamo PR #3180): a
 * negative value is taken as its two's-complement u64. msgpack gives a number below 2^32 and a
 * bigint above, so everything is normalised to bigint.
 */
export function normaliseBlockHash(value: unknown, what = "block hash"): bigint {
  if (typeof value === "bigint") {
    if (value < -(1n << 63n) || value > U64_MASK) {
      refuse("LLMGW_KV_EVENTS_INVALID_HASH", `${what} ${value} does not fit in 64 bits`);
    }
    return BigInt.asUintN(64, value);
  }
  if (typeof value === "number") {
    if (!Number.isSafeInteger(value)) {
      refuse("LLMGW_KV_EVENTS_INVALID_HASH", `${what} ${value} is not an integer`);
    }
    return BigInt.asUintN(64, BigInt(value));
  }
  if (value instanceof Uint8Array) {
    if (value.length === 0) refuse("LLMGW_KV_EVENTS_INVALID_HASH", `${what} is empty bytes`);
    let h = 0n;
    for (let i = Math.max(0, value.length - 8); i < value.length; i++) {
      h = (h << 8n) | BigInt(value[i] as number);
    }
    return h;
  }
  return refuse(
    "LLMGW_KV_EVENTS_INVALID_HASH",
    `${what} must be an integer or bytes, got ${describe(value)}`,
  );
}

function describe(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  if (value instanceof Uint8Array) return "bytes";
  return typeof value;
}

function hashes(value: unknown, limits: ResolvedKvEventDecodeLimits): bigint[] {
  if (!Array.isArray(value)) {
    refuse(
      "LLMGW_KV_EVENTS_MALFORMED_EVENT",
      `block_hashes must be an array, got ${describe(value)}`,
    );
  }
  if (value.length > limits.maxHashesPerEvent) {
    refuse(
      "LLMGW_KV_EVENTS_TOO_MANY_HASHES",
      `event has ${value.length} block hashes, more than maxHashesPerEvent ${limits.maxHashesPerEvent}`,
    );
  }
  const out = new Array<bigint>(value.length);
  for (let i = 0; i < value.length; i++)
    out[i] = normaliseBlockHash(value[i], `block_hashes[${i}]`);
  return out;
}

function optionalString(value: unknown, name: string): string | undefined {
  if (value === null || value === undefined) return undefined;
  if (typeof value !== "string") {
    refuse(
      "LLMGW_KV_EVENTS_MALFORMED_EVENT",
      `${name} must be a string or null, got ${describe(value)}`,
    );
  }
  return value;
}

function optionalInt(value: unknown, name: string): number | undefined {
  if (value === null || value === undefined) return undefined;
  if (typeof value !== "number" || !Number.isSafeInteger(value)) {
    refuse(
      "LLMGW_KV_EVENTS_MALFORMED_EVENT",
      `${name} must be an integer or null, got ${typeof value === "number" ? value : describe(value)}`,
    );
  }
  return value;
}

/** Fields of `BlockStored`, in declaration order (the legacy positional form). */
const BLOCK_STORED_FIELDS = [
  "block_hashes",
  "parent_block_hash",
  "token_ids",
  "block_size",
  "lora_id",
  "medium",
  "lora_name",
  "extra_keys",
  "group_idx",
  "kv_cache_spec_kind",
  "kv_cache_spec_sliding_window",
  "locality",
] as const;
const BLOCK_REMOVED_FIELDS = ["block_hashes", "medium", "group_idx", "locality"] as const;

type Fields = Record<string, unknown>;

function blockStored(f: Fields, limits: ResolvedKvEventDecodeLimits): BlockStoredEvent {
  const blockHashes = hashes(f.block_hashes, limits);
  const blockSize = f.block_size;
  if (typeof blockSize !== "number" || !Number.isSafeInteger(blockSize) || blockSize <= 0) {
    refuse(
      "LLMGW_KV_EVENTS_MALFORMED_EVENT",
      `block_size must be a positive integer, got ${typeof blockSize === "number" ? blockSize : describe(blockSize)}`,
    );
  }
  const tokens = f.token_ids;
  if (!Array.isArray(tokens)) {
    refuse(
      "LLMGW_KV_EVENTS_MALFORMED_EVENT",
      `token_ids must be an array, got ${describe(tokens)}`,
    );
  }
  if (tokens.length > limits.maxTokenIdsPerEvent) {
    refuse(
      "LLMGW_KV_EVENTS_TOO_MANY_TOKENS",
      `event has ${tokens.length} token ids, more than maxTokenIdsPerEvent ${limits.maxTokenIdsPerEvent}`,
    );
  }
  if (tokens.length !== blockHashes.length * blockSize) {
    refuse(
      "LLMGW_KV_EVENTS_TOKEN_COUNT_MISMATCH",
      `token_ids has ${tokens.length} ids, expected ${blockHashes.length} blocks × block_size ${blockSize} = ${blockHashes.length * blockSize}`,
    );
  }
  for (let i = 0; i < tokens.length; i++) {
    const t = tokens[i];
    if (typeof t !== "number" || !Number.isInteger(t) || t < 0 || t > 0xffffffff) {
      refuse(
        "LLMGW_KV_EVENTS_MALFORMED_EVENT",
        `token_ids[${i}] must be an integer in [0, 2^32), got ${typeof t === "number" || typeof t === "bigint" ? t : describe(t)}`,
      );
    }
  }
  const extraKeys = f.extra_keys;
  if (extraKeys !== null && extraKeys !== undefined && !Array.isArray(extraKeys)) {
    refuse(
      "LLMGW_KV_EVENTS_MALFORMED_EVENT",
      `extra_keys must be an array or null, got ${describe(extraKeys)}`,
    );
  }
  const event: {
    -readonly [K in keyof BlockStoredEvent]: BlockStoredEvent[K];
  } = { type: "BlockStored", blockHashes, tokenIds: tokens as number[], blockSize };
  if (f.parent_block_hash !== null && f.parent_block_hash !== undefined) {
    event.parentBlockHash = normaliseBlockHash(f.parent_block_hash, "parent_block_hash");
  }
  const loraId = optionalInt(f.lora_id, "lora_id");
  if (loraId !== undefined) event.loraId = loraId;
  const medium = optionalString(f.medium, "medium");
  if (medium !== undefined) event.medium = medium;
  const loraName = optionalString(f.lora_name, "lora_name");
  if (loraName !== undefined) event.loraName = loraName;
  if (Array.isArray(extraKeys)) event.extraKeys = extraKeys;
  const groupIdx = optionalInt(f.group_idx, "group_idx");
  if (groupIdx !== undefined) event.groupIdx = groupIdx;
  const kind = optionalString(f.kv_cache_spec_kind, "kv_cache_spec_kind");
  if (kind !== undefined) event.kvCacheSpecKind = kind;
  const window = optionalInt(f.kv_cache_spec_sliding_window, "kv_cache_spec_sliding_window");
  if (window !== undefined) event.kvCacheSpecSlidingWindow = window;
  const locality = optionalString(f.locality, "locality");
  if (locality !== undefined) event.locality = locality;
  return event;
}

function blockRemoved(f: Fields, limits: ResolvedKvEventDecodeLimits): BlockRemovedEvent {
  const event: { -readonly [K in keyof BlockRemovedEvent]: BlockRemovedEvent[K] } = {
    type: "BlockRemoved",
    blockHashes: hashes(f.block_hashes, limits),
  };
  const medium = optionalString(f.medium, "medium");
  if (medium !== undefined) event.medium = medium;
  const groupIdx = optionalInt(f.group_idx, "group_idx");
  if (groupIdx !== undefined) event.groupIdx = groupIdx;
  const locality = optionalString(f.locality, "locality");
  if (locality !== undefined) event.locality = locality;
  return event;
}

function positional(raw: readonly unknown[], names: readonly string[]): Fields {
  const f: Fields = {};
  // raw[0] is the tag; fields dropped from the tail stay undefined (= their null default).
  for (let i = 0; i < names.length; i++) f[names[i] as string] = raw[i + 1];
  return f;
}

/** One event, or `undefined` for an unknown type. Throws a {@link KvEventsError} to reject. */
function decodeEvent(raw: unknown, limits: ResolvedKvEventDecodeLimits): KvEvent | undefined {
  let type: unknown;
  let fields: Fields | undefined;
  let tagged: Fields | undefined;
  if (Array.isArray(raw)) {
    type = raw[0];
  } else if (typeof raw === "object" && raw !== null && !(raw instanceof Uint8Array)) {
    tagged = raw as Fields;
    type = tagged.type;
  } else {
    refuse(
      "LLMGW_KV_EVENTS_MALFORMED_EVENT",
      `event must be a map or an array, got ${describe(raw)}`,
    );
  }
  if (typeof type !== "string") {
    refuse(
      "LLMGW_KV_EVENTS_MALFORMED_EVENT",
      `event type tag must be a string, got ${describe(type)}`,
    );
  }
  switch (type) {
    case "BlockStored":
      fields = tagged ?? positional(raw as unknown[], BLOCK_STORED_FIELDS);
      return blockStored(fields, limits);
    case "BlockRemoved":
      fields = tagged ?? positional(raw as unknown[], BLOCK_REMOVED_FIELDS);
      return blockRemoved(fields, limits);
    case "AllBlocksCleared":
      return { type: "AllBlocksCleared" };
    default:
      return undefined;
  }
}

/**
 * Decodes one KV-event payload, `[ts, events, data_parallel_rank?]` (later elements, such as
 * the proposed publisher id, are ignored). A payload that is not such a batch, or breaks a
 * batch-level bound, throws a {@link KvEventsError}
 * (`…_PAYLOAD_TOO_LARGE`, `…_MALFORMED_PAYLOAD`, `…_TOO_MANY_EVENTS`). A bad event does not
 * spoil the batch: it is returned in `rejected` with its reason, and events of unknown types
 * are counted in `unknownEvents`. Unknown keys of known events are ignored.
 */
export function decodeKvEventBatch(
  payload: Uint8Array,
  limits?: KvEventDecodeLimits,
): DecodedKvEventBatch {
  const resolved = limits === undefined ? DEFAULT_LIMITS : resolveKvEventDecodeLimits(limits);
  if (payload.byteLength > resolved.maxPayloadBytes) {
    throw new KvEventsError(
      "LLMGW_KV_EVENTS_PAYLOAD_TOO_LARGE",
      `payload of ${payload.byteLength} bytes is larger than maxPayloadBytes ${resolved.maxPayloadBytes}`,
    );
  }
  const shape = checkPayloadShape(payload);
  if (shape !== undefined) {
    throw new KvEventsError("LLMGW_KV_EVENTS_MALFORMED_PAYLOAD", `payload refused: ${shape}`);
  }
  let raw: unknown;
  try {
    raw = decoderFor(resolved).decode(payload);
  } catch (cause) {
    const detail =
      cause instanceof DecodeError || cause instanceof RangeError ? cause.message : String(cause);
    throw new KvEventsError(
      "LLMGW_KV_EVENTS_MALFORMED_PAYLOAD",
      `payload is not valid msgpack: ${detail}`,
      {
        cause,
      },
    );
  }
  if (!Array.isArray(raw) || raw.length < 2) {
    throw new KvEventsError(
      "LLMGW_KV_EVENTS_MALFORMED_PAYLOAD",
      `payload must be an array [ts, events, dp_rank?], got ${Array.isArray(raw) ? `an array of ${raw.length}` : describe(raw)}`,
    );
  }
  const [ts, events, rank] = raw as [unknown, unknown, unknown];
  if (typeof ts !== "number") {
    throw new KvEventsError(
      "LLMGW_KV_EVENTS_MALFORMED_PAYLOAD",
      `batch ts must be a number, got ${describe(ts)}`,
    );
  }
  if (!Array.isArray(events)) {
    throw new KvEventsError(
      "LLMGW_KV_EVENTS_MALFORMED_PAYLOAD",
      `batch events must be an array, got ${describe(events)}`,
    );
  }
  if (events.length > resolved.maxEventsPerBatch) {
    throw new KvEventsError(
      "LLMGW_KV_EVENTS_TOO_MANY_EVENTS",
      `batch has ${events.length} events, more than maxEventsPerBatch ${resolved.maxEventsPerBatch}`,
    );
  }
  if (
    rank !== undefined &&
    rank !== null &&
    (typeof rank !== "number" || !Number.isSafeInteger(rank))
  ) {
    throw new KvEventsError(
      "LLMGW_KV_EVENTS_MALFORMED_PAYLOAD",
      `batch data_parallel_rank must be an integer or null, got ${describe(rank)}`,
    );
  }
  const good: KvEvent[] = [];
  const rejected: RejectedKvEvent[] = [];
  let unknownEvents = 0;
  for (let i = 0; i < events.length; i++) {
    try {
      const event = decodeEvent(events[i], resolved);
      if (event) good.push(event);
      else unknownEvents++;
    } catch (error) {
      if (!(error instanceof KvEventsError)) throw error;
      rejected.push({ index: i, error });
    }
  }
  const batch: DecodedKvEventBatch = { ts, events: good, rejected, unknownEvents };
  return typeof rank === "number" ? { ...batch, dataParallelRank: rank } : batch;
}
