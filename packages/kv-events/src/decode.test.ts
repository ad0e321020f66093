import { encode } from "@msgpack/msgpack";
import { describe, expect, it } from "vitest";
import {
  hexBytes,
  POSITIONAL_SAMPLE_BATCH,
  POSITIONAL_SAMPLE_HEX,
  TAGGED_SAMPLE_BATCH,
  TAGGED_SAMPLE_HEX,
} from "../test/fixtures.js";
import { decodeKvEventBatch, MAX_PAYLOAD_CONTAINERS, normaliseBlockHash } from "./decode.js";

/** A payload built from plain values (ints that need it as bigint), as msgspec would write. */
function payload(value: unknown): Uint8Array {
  return encode(value, { useBigInt64: true });
}

const BIG = 15760518052499183552n;
const tokens = (n: number) => Array.from({ length: n }, (_, i) => i + 1);

describe("decodeKvEventBatch on the reference's samples", () => {
  it("decodes vLLM 0.26.0's tagged capture, a u64 above 2^53 included", () => {
    expect(decodeKvEventBatch(hexBytes(TAGGED_SAMPLE_HEX))).toEqual({
      ...TAGGED_SAMPLE_BATCH,
      rejected: [],
      unknownEvents: 0,
    });
  });

  it("decodes the legacy positional form with fields dropped from the tail", () => {
    expect(decodeKvEventBatch(hexBytes(POSITIONAL_SAMPLE_HEX))).toEqual({
      ...POSITIONAL_SAMPLE_BATCH,
      rejected: [],
      unknownEvents: 0,
    });
  });
});

describe("block hashes", () => {
  it.each([
    ["a small int (msgpack gives a number)", 7, 7n],
    ["a u64 above 2^53", BIG, BIG],
    ["2^64 - 1", (1n << 64n) - 1n, (1n << 64n) - 1n],
    ["a negative i64 (Dynamo saw i64)", -5n, (1n << 64n) - 5n],
    ["a small negative int", -1, (1n << 64n) - 1n],
    [
      "32 bytes: the last 8, big-endian",
      Uint8Array.from({ length: 32 }, (_, i) => (i < 24 ? 0xee : i - 23)),
      0x0102030405060708n,
    ],
    ["8 bytes", Uint8Array.of(0xda, 0xb8, 0x9b, 0xaa, 0x7b, 0x58, 0x57, 0xc0), BIG],
    ["3 bytes", Uint8Array.of(1, 2, 3), 0x010203n],
  ])("%s", (_name, raw, expected) => {
    expect(normaliseBlockHash(raw)).toBe(expected);
    const batch = decodeKvEventBatch(
      payload([1.5, [{ type: "BlockRemoved", block_hashes: [raw] }]]),
    );
    expect(batch.events).toEqual([{ type: "BlockRemoved", blockHashes: [expected] }]);
  });

  it.each([
    ["a float", 1.5, "block_hashes[0] 1.5 is not an integer"],
    ["a string", "ab", "block_hashes[0] must be an integer or bytes, got string"],
    ["null", null, "block_hashes[0] must be an integer or bytes, got null"],
    ["empty bytes", new Uint8Array(0), "block_hashes[0] is empty bytes"],
  ])("refuses %s", (_name, raw, message) => {
    const batch = decodeKvEventBatch(
      payload([1.5, [{ type: "BlockRemoved", block_hashes: [raw] }]]),
    );
    expect(batch.events).toEqual([]);
    expect(batch.rejected.map((r) => [r.index, r.error.code, r.error.message])).toEqual([
      [0, "LLMGW_KV_EVENTS_INVALID_HASH", message],
    ]);
  });

  it("takes a bytes parent hash and an i64 parent the same way", () => {
    const batch = decodeKvEventBatch(
      payload([
        0,
        [
          ["BlockStored", [1], Uint8Array.of(0, 0, 0, 0, 0, 0, 0, 9), tokens(4), 4],
          ["BlockStored", [2], -2n, tokens(4), 4],
        ],
      ]),
    );
    expect(batch.events.map((e) => e.type === "BlockStored" && e.parentBlockHash)).toEqual([
      9n,
      (1n << 64n) - 2n,
    ]);
  });
});

describe("event forms", () => {
  it("ignores unknown keys and counts unknown event types without failing the batch", () => {
    const batch = decodeKvEventBatch(
      payload([
        2,
        [
          {
            type: "BlockStored",
            block_hashes: [1],
            token_ids: tokens(2),
            block_size: 2,
            shiny: [1],
          },
          { type: "KvCacheSnapshot", blocks: [] },
          ["SomethingNew", 1, 2],
          { type: "AllBlocksCleared", reason: "reset" },
        ],
        3,
        "publisher-id",
      ]),
    );
    expect(batch).toEqual({
      ts: 2,
      events: [
        { type: "BlockStored", blockHashes: [1n], tokenIds: [1, 2], blockSize: 2 },
        { type: "AllBlocksCleared" },
      ],
      dataParallelRank: 3,
      rejected: [],
      unknownEvents: 2,
    });
  });

  it("treats missing optional keys and nulls alike (omit_defaults)", () => {
    const full = {
      type: "BlockStored",
      block_hashes: [5],
      parent_block_hash: 4,
      token_ids: tokens(2),
      block_size: 2,
      lora_id: 3,
      medium: "CPU",
      lora_name: "ada",
      extra_keys: [["ada"]],
      group_idx: 1,
      kv_cache_spec_kind: "sliding_window",
      kv_cache_spec_sliding_window: 128,
      locality: "node",
    };
    expect(decodeKvEventBatch(payload([0, [full]])).events).toEqual([
      {
        type: "BlockStored",
        blockHashes: [5n],
        parentBlockHash: 4n,
        tokenIds: [1, 2],
        blockSize: 2,
        loraId: 3,
        medium: "CPU",
        loraName: "ada",
        extraKeys: [["ada"]],
        groupIdx: 1,
        kvCacheSpecKind: "sliding_window",
        kvCacheSpecSlidingWindow: 128,
        locality: "node",
      },
    ]);
    const nulls = Object.fromEntries(
      Object.entries(full).map(([k, v]) =>
        ["type", "block_hashes", "token_ids", "block_size"].includes(k) ? [k, v] : [k, null],
      ),
    );
    const bare = { type: "BlockStored", block_hashes: [5], token_ids: tokens(2), block_size: 2 };
    const expected = [{ type: "BlockStored", blockHashes: [5n], tokenIds: [1, 2], blockSize: 2 }];
    expect(decodeKvEventBatch(payload([0, [nulls]])).events).toEqual(expected);
    expect(decodeKvEventBatch(payload([0, [bare]])).events).toEqual(expected);
  });

  it.each([
    ["BlockStored up to block_size", ["BlockStored", [1], null, [7, 8], 2], {}],
    ["BlockStored with lora_id", ["BlockStored", [1], null, [7, 8], 2, 4], { loraId: 4 }],
    [
      "BlockStored through kv_cache_spec_kind",
      ["BlockStored", [1], null, [7, 8], 2, null, "GPU", null, [null], 0, "full_attention"],
      { medium: "GPU", extraKeys: [null], groupIdx: 0, kvCacheSpecKind: "full_attention" },
    ],
  ])("positional %s", (_name, raw, extra) => {
    expect(decodeKvEventBatch(payload([0, [raw]])).events).toEqual([
      { type: "BlockStored", blockHashes: [1n], tokenIds: [7, 8], blockSize: 2, ...extra },
    ]);
  });

  it("positional BlockRemoved with and without its tail", () => {
    expect(
      decodeKvEventBatch(
        payload([
          0,
          [
            ["BlockRemoved", [1, 2]],
            ["BlockRemoved", [3], "GPU", 0, "dc"],
          ],
        ]),
      ).events,
    ).toEqual([
      { type: "BlockRemoved", blockHashes: [1n, 2n] },
      { type: "BlockRemoved", blockHashes: [3n], medium: "GPU", groupIdx: 0, locality: "dc" },
    ]);
  });
});

describe("refusals", () => {
  it("rejects a bad event and keeps the good ones of its batch", () => {
    const batch = decodeKvEventBatch(
      payload([
        0,
        [
          { type: "BlockStored", block_hashes: [1, 2], token_ids: tokens(7), block_size: 4 },
          { type: "BlockRemoved", block_hashes: [9] },
          { type: "BlockStored", block_hashes: [3], token_ids: tokens(4), block_size: 0 },
          { type: "BlockStored", block_hashes: [3], token_ids: [1, -2], block_size: 2 },
          { type: "BlockStored", block_hashes: 3, token_ids: [1, 2], block_size: 2 },
          { type: "BlockStored", block_hashes: [3], token_ids: "ab", block_size: 2 },
          { type: "BlockRemoved", block_hashes: [3], medium: 7 },
          { type: 7 },
          "BlockStored",
          { type: "AllBlocksCleared" },
        ],
      ]),
    );
    expect(batch.events).toEqual([
      { type: "BlockRemoved", blockHashes: [9n] },
      { type: "AllBlocksCleared" },
    ]);
    expect(batch.rejected.map((r) => [r.index, r.error.code, r.error.message])).toEqual([
      [
        0,
        "LLMGW_KV_EVENTS_TOKEN_COUNT_MISMATCH",
        "token_ids has 7 ids, expected 2 blocks × block_size 4 = 8",
      ],
      [2, "LLMGW_KV_EVENTS_MALFORMED_EVENT", "block_size must be a positive integer, got 0"],
      [
        3,
        "LLMGW_KV_EVENTS_MALFORMED_EVENT",
        "token_ids[1] must be an integer in [0, 2^32), got -2",
      ],
      [4, "LLMGW_KV_EVENTS_MALFORMED_EVENT", "block_hashes must be an array, got number"],
      [5, "LLMGW_KV_EVENTS_MALFORMED_EVENT", "token_ids must be an array, got string"],
      [6, "LLMGW_KV_EVENTS_MALFORMED_EVENT", "medium must be a string or null, got number"],
      [7, "LLMGW_KV_EVENTS_MALFORMED_EVENT", "event type tag must be a string, got number"],
      [8, "LLMGW_KV_EVENTS_MALFORMED_EVENT", "event must be a map or an array, got string"],
    ]);
  });

  it.each([
    [
      "too many hashes",
      { maxHashesPerEvent: 2 },
      { type: "BlockRemoved", block_hashes: [1, 2, 3] },
      "LLMGW_KV_EVENTS_TOO_MANY_HASHES",
      "event has 3 block hashes, more than maxHashesPerEvent 2",
    ],
    [
      "too many token ids",
      { maxTokenIdsPerEvent: 4 },
      { type: "BlockStored", block_hashes: [1, 2, 3], token_ids: tokens(6), block_size: 2 },
      "LLMGW_KV_EVENTS_TOO_MANY_TOKENS",
      "event has 6 token ids, more than maxTokenIdsPerEvent 4",
    ],
  ])("per-event bound: %s", (_name, limits, event, code, message) => {
    const batch = decodeKvEventBatch(payload([0, [event, { type: "AllBlocksCleared" }]]), limits);
    expect(batch.events).toEqual([{ type: "AllBlocksCleared" }]);
    expect(batch.rejected.map((r) => [r.error.code, r.error.message])).toEqual([[code, message]]);
  });

  it.each([
    [
      "a payload over maxPayloadBytes",
      payload([0, []]),
      { maxPayloadBytes: 2 },
      "LLMGW_KV_EVENTS_PAYLOAD_TOO_LARGE",
      "payload of 3 bytes is larger than maxPayloadBytes 2",
    ],
    [
      "more events than maxEventsPerBatch",
      payload([0, [["AllBlocksCleared"], ["AllBlocksCleared"], ["AllBlocksCleared"]]]),
      { maxEventsPerBatch: 2 },
      "LLMGW_KV_EVENTS_TOO_MANY_EVENTS",
      "batch has 3 events, more than maxEventsPerBatch 2",
    ],
    [
      "a map instead of a batch",
      payload({ ts: 0 }),
      {},
      "LLMGW_KV_EVENTS_MALFORMED_PAYLOAD",
      "payload must be an array [ts, events, dp_rank?], got object",
    ],
    [
      "a batch without events",
      payload([0]),
      {},
      "LLMGW_KV_EVENTS_MALFORMED_PAYLOAD",
      "payload must be an array [ts, events, dp_rank?], got an array of 1",
    ],
    [
      "a string ts",
      payload(["now", []]),
      {},
      "LLMGW_KV_EVENTS_MALFORMED_PAYLOAD",
      "batch ts must be a number, got string",
    ],
    [
      "events not an array",
      payload([0, {}]),
      {},
      "LLMGW_KV_EVENTS_MALFORMED_PAYLOAD",
      "batch events must be an array, got object",
    ],
    [
      "a string dp rank",
      payload([0, [], "0"]),
      {},
      "LLMGW_KV_EVENTS_MALFORMED_PAYLOAD",
      "batch data_parallel_rank must be an integer or null, got string",
    ],
  ])("refuses %s", (_name, bytes, limits, code, message) => {
    expect(() => decodeKvEventBatch(bytes, limits)).toThrow(
      expect.objectContaining({ code, message }),
    );
  });

  it("refuses bytes that are not msgpack, and a truncated payload", () => {
    for (const bytes of [Uint8Array.of(0xc1), hexBytes(TAGGED_SAMPLE_HEX).subarray(0, 40)]) {
      expect(() => decodeKvEventBatch(bytes)).toThrow(
        expect.objectContaining({
          code: "LLMGW_KV_EVENTS_MALFORMED_PAYLOAD",
          message: expect.stringMatching(/^payload is not valid msgpack: /),
        }),
      );
    }
  });

  it("refuses a declared array length past the bounds before allocating it", () => {
    // array32 claiming 2^31 elements.
    const bytes = hexBytes("92 00 dd 80000000");
    expect(() => decodeKvEventBatch(bytes)).toThrow(
      expect.objectContaining({ code: "LLMGW_KV_EVENTS_MALFORMED_PAYLOAD" }),
    );
  });

  it.each([
    [
      "nested array32 headers each declaring 1,048,576 elements (8 MB apiece to the decoder)",
      "dd00100000".repeat(20),
      "array at byte 0 declares 1048576 elements, more than the 95 bytes left can hold",
    ],
    [
      "a map32 declaring more entries than the bytes left",
      "9200df00001000",
      "map at byte 2 declares 4096 entries, more than the 0 bytes left can hold",
    ],
    [
      "arrays that each fit the bytes left but not together",
      `929393${"00".repeat(5)}`,
      "array at byte 2 declares 3 elements, more than the 5 bytes left can hold",
    ],
    [
      "containers nested 9 deep",
      `${"91".repeat(9)}00`,
      "containers nested deeper than 8 at byte 8",
    ],
  ])("refuses %s before the decoder allocates for it", (_name, hex, detail) => {
    expect(() => decodeKvEventBatch(hexBytes(hex))).toThrow(
      expect.objectContaining({
        code: "LLMGW_KV_EVENTS_MALFORMED_PAYLOAD",
        message: `payload refused: ${detail}`,
      }),
    );
  });

  it("refuses a batch of more arrays and maps than MAX_PAYLOAD_CONTAINERS, counting empty ones", () => {
    // [0, [[], [], … ]]: one byte per empty array, ~40 bytes each once decoded.
    const n = MAX_PAYLOAD_CONTAINERS;
    const bytes = new Uint8Array(2 + 5 + n).fill(0x90);
    bytes.set([0x92, 0x00, 0xdd, (n >>> 24) & 0xff, (n >>> 16) & 0xff, (n >>> 8) & 0xff, n & 0xff]);
    expect(() => decodeKvEventBatch(bytes)).toThrow(
      expect.objectContaining({
        code: "LLMGW_KV_EVENTS_MALFORMED_PAYLOAD",
        message: `payload refused: more than ${n} arrays and maps (at byte ${bytes.length - 2})`,
      }),
    );
    // One fewer (the batch and its events array are two): past the shape check, and refused
    // as an event for what it is.
    const fewer = new Uint8Array(2 + 5 + n - 2).fill(0x90);
    const m = n - 2;
    fewer.set([0x92, 0x00, 0xdd, (m >>> 24) & 0xff, (m >>> 16) & 0xff, (m >>> 8) & 0xff, m & 0xff]);
    expect(() => decodeKvEventBatch(fewer)).not.toThrow(/payload refused/);
  });

  it("takes a batch nested as deep as vLLM writes it: a multimodal pair inside extra_keys", () => {
    const event = {
      type: "BlockStored",
      block_hashes: [1],
      token_ids: tokens(2),
      block_size: 2,
      extra_keys: [[["mm-hash", 0], "salt"]],
    };
    const batch = decodeKvEventBatch(payload([0, [event], 0]));
    expect(batch.events[0]).toMatchObject({ extraKeys: [[["mm-hash", 0], "salt"]] });
  });

  it("refuses limits that are not positive integers, naming them", () => {
    expect(() => decodeKvEventBatch(payload([0, []]), { maxEventsPerBatch: 0 })).toThrow(
      expect.objectContaining({
        code: "LLMGW_KV_EVENTS_INVALID_OPTIONS",
        message: "maxEventsPerBatch must be a positive integer, got 0",
      }),
    );
  });
});
