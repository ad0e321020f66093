/**
 * Payloads written byte by byte from the msgpack spec after the samples in
 * /work/shared/reference/kv-events.md, as msgspec emits them (shortest int forms, float64 ts,
 * fields in declaration order with the tag first). Shared by the decode and encode tests.
 */
import type { KvEventBatch } from "../src/kv-event.js";

/** 16 token ids of a Qwen-style chat prompt (the capture's first id is 151644). */
export const SAMPLE_TOKENS = [
  151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198, 9707, 151645,
];

/** The tokens' msgpack: fixints, uint8 (cc), uint16 (cd), uint32 (ce). */
const TOKENS_HEX =
  "dc0010" + // array16 of 16
  "ce0002505c cd22f4 ccc6 cd0a32 cd020d cd0108 cd2ac6 cd45b7 0d ce0002505d ccc6 ce0002505c cd0368 ccc6 cd25eb ce0002505d";

/**
 * vLLM 0.26.0's tagged form, the capture of kthena#1535 with 16 tokens:
 * `[1789095808.84, [{'type':'BlockStored','block_hashes':[15760518052499183552],
 * 'parent_block_hash':None,'token_ids':[…16],'block_size':16,'lora_id':None,'medium':'GPU',
 * 'lora_name':None,'extra_keys':[None],'group_idx':0,'kv_cache_spec_kind':'full_attention'}], 0]`
 */
export const TAGGED_SAMPLE_HEX = [
  "93", // array of 3
  "cb 41daa8dbe035c28f", // float64 1789095808.84
  "91", // events: array of 1
  "8b", // map of 11
  "a4 74797065 ab 426c6f636b53746f726564", // "type": "BlockStored"
  "ac 626c6f636b5f686173686573 91 cf dab89baa7b5857c0", // "block_hashes": [u64 15760518052499183552]
  "b1 706172656e745f626c6f636b5f68617368 c0", // "parent_block_hash": nil
  `a9 746f6b656e5f696473 ${TOKENS_HEX}`, // "token_ids": […]
  "aa 626c6f636b5f73697a65 10", // "block_size": 16
  "a7 6c6f72615f6964 c0", // "lora_id": nil
  "a6 6d656469756d a3 475055", // "medium": "GPU"
  "a9 6c6f72615f6e616d65 c0", // "lora_name": nil
  "aa 65787472615f6b657973 91 c0", // "extra_keys": [nil]
  "a9 67726f75705f696478 00", // "group_idx": 0
  "b2 6b765f63616368655f737065635f6b696e64 ae 66756c6c5f617474656e74696f6e", // "kv_cache_spec_kind": "full_attention"
  "00", // data_parallel_rank 0
].join("");

/**
 * The legacy positional form of the same block (vLLM before #42892: `["BlockStored",
 * block_hashes, parent, token_ids, block_size, lora_id, medium]`, the later fields dropped from
 * the tail), followed by a BlockRemoved of it and an AllBlocksCleared; no dp rank.
 */
export const POSITIONAL_SAMPLE_HEX = [
  "92", // array of 2: [ts, events]
  "cb 41daa8dbe035c28f",
  "93", // 3 events
  "97 ab 426c6f636b53746f726564 91 cf dab89baa7b5857c0 c0", // ["BlockStored", [h], nil,
  `${TOKENS_HEX} 10 c0 a3 475055`, //  tokens, 16, nil, "GPU"]
  "93 ac 426c6f636b52656d6f766564 91 cf dab89baa7b5857c0 a3 475055", // ["BlockRemoved", [h], "GPU"]
  "91 b0 416c6c426c6f636b73436c6561726564", // ["AllBlocksCleared"]
].join("");

/** {@link TAGGED_SAMPLE_HEX} as data (the decoder adds `rejected: [], unknownEvents: 0`). */
export const TAGGED_SAMPLE_BATCH: KvEventBatch = {
  ts: 1789095808.84,
  events: [
    {
      type: "BlockStored",
      blockHashes: [15760518052499183552n],
      tokenIds: SAMPLE_TOKENS,
      blockSize: 16,
      medium: "GPU",
      extraKeys: [null],
      groupIdx: 0,
      kvCacheSpecKind: "full_attention",
    },
  ],
  dataParallelRank: 0,
};

/** {@link POSITIONAL_SAMPLE_HEX} as data. */
export const POSITIONAL_SAMPLE_BATCH: KvEventBatch = {
  ts: 1789095808.84,
  events: [
    {
      type: "BlockStored",
      blockHashes: [15760518052499183552n],
      tokenIds: SAMPLE_TOKENS,
      blockSize: 16,
      medium: "GPU",
    },
    { type: "BlockRemoved", blockHashes: [15760518052499183552n], medium: "GPU" },
    { type: "AllBlocksCleared" },
  ],
};

/** Hex with spaces → bytes. */
export function hexBytes(hex: string): Uint8Array {
  return Uint8Array.from(Buffer.from(hex.replace(/\s+/g, ""), "hex"));
}
