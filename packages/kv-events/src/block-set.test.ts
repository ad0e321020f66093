import { describe, expect, it } from "vitest";
import { type BlockSetChange, createReplicaBlockSet, MAX_MEDIA } from "./block-set.js";
import type { BlockStoredEvent, KvEvent } from "./kv-event.js";
import { saltKey, tokenBlockKeys } from "./token-blocks.js";

const BS = 4;
const PROMPT = Array.from({ length: 16 }, (_, i) => 1000 + i); // 4 blocks
const KEYS = [...tokenBlockKeys(PROMPT, BS)];

/** BlockStored of blocks [from, to) of PROMPT, engine hashes 100+i, parent 100+from-1. */
function stored(from: number, to: number, extra: Partial<BlockStoredEvent> = {}): BlockStoredEvent {
  return {
    type: "BlockStored",
    blockHashes: Array.from({ length: to - from }, (_, i) => BigInt(100 + from + i)),
    ...(from > 0 ? { parentBlockHash: BigInt(99 + from) } : {}),
    tokenIds: PROMPT.slice(from * BS, to * BS),
    blockSize: BS,
    medium: "GPU",
    ...extra,
  };
}

const removed = (hashes: number[], medium = "GPU"): KvEvent => ({
  type: "BlockRemoved",
  blockHashes: hashes.map(BigInt),
  medium,
});

function setWithLog(options: Parameters<typeof createReplicaBlockSet>[0] = {}) {
  const changes: BlockSetChange[] = [];
  const set = createReplicaBlockSet({ ...options, onChange: (c) => changes.push(c) });
  const apply = (...events: KvEvent[]) => set.apply({ ts: 0, events });
  return { set, changes, apply };
}

const sorted = (keys: readonly number[]) => [...keys].sort((a, b) => a - b);

describe("createReplicaBlockSet", () => {
  it("keys stored blocks as tokenBlockKeys does, across events chained by parent hash", () => {
    const { set, changes, apply } = setWithLog();
    apply(stored(0, 2));
    apply(stored(2, 4));
    expect(sorted(set.snapshot())).toEqual(sorted(KEYS));
    expect(changes).toEqual([
      { removed: [], cleared: false, added: KEYS.slice(0, 2) },
      { removed: [], cleared: false, added: KEYS.slice(2, 4) },
    ]);
    expect(set.blockSize).toBe(BS);
    expect(set.has(KEYS[3] as number)).toBe(true);
  });

  it("does not guess: a block whose parent is unknown is orphaned, not keyed", () => {
    const { set, changes, apply } = setWithLog();
    apply(stored(2, 4));
    expect(set.snapshot()).toEqual([]);
    expect(changes).toEqual([]);
    expect(set.stats()).toMatchObject({ orphaned: 2, stored: 0, entries: 0 });
  });

  it("removes by engine hash and reports only keys that left", () => {
    const { set, changes, apply } = setWithLog();
    apply(stored(0, 4));
    const change = apply(removed([103, 102]), removed([555]));
    expect(change).toEqual({ removed: [KEYS[3], KEYS[2]], cleared: false, added: [] });
    expect(changes).toHaveLength(2);
    expect(sorted(set.snapshot())).toEqual(sorted(KEYS.slice(0, 2)));
    expect(set.stats()).toMatchObject({ removed: 2, unknownRemoved: 1, entries: 2, keys: 2 });
  });

  it("refcounts a key held by several engine hashes or media", () => {
    const { set, changes, apply } = setWithLog();
    apply(stored(0, 1));
    // Another engine hash for the same tokens (e.g. a second request before dedup) and a CPU copy.
    apply(stored(0, 1, { blockHashes: [7n] }), stored(0, 1, { medium: "CPU" }));
    expect(changes).toHaveLength(1);
    expect(set.stats()).toMatchObject({ entries: 3, keys: 1 });
    apply(removed([100]));
    apply(removed([7]));
    expect(set.snapshot()).toEqual([KEYS[0]]);
    expect(changes).toHaveLength(1);
    apply(removed([100], "CPU"));
    expect(set.snapshot()).toEqual([]);
    expect(changes.at(-1)).toEqual({ removed: [KEYS[0]], cleared: false, added: [] });
  });

  it("counts a repeated store of the same hash and medium once", () => {
    const { set, apply } = setWithLog();
    apply(stored(0, 2));
    apply(stored(0, 2));
    apply(removed([100, 101]));
    expect(set.snapshot()).toEqual([]);
    expect(set.stats()).toMatchObject({ duplicateStored: 2, entries: 0 });
  });

  it("reports a batch's net change: stored and removed in one batch is no change", () => {
    const { changes, apply } = setWithLog();
    apply(stored(0, 2));
    const change = apply(stored(2, 3), removed([102]), removed([101]), stored(1, 2));
    // Block 1 left and came back, block 2 came and left: nothing changed.
    expect(change).toEqual({ removed: [], cleared: false, added: [] });
    expect(changes).toHaveLength(1);
  });

  it("AllBlocksCleared empties the set; the change says cleared, then what was added after", () => {
    const { set, changes, apply } = setWithLog();
    apply(stored(0, 4));
    apply(removed([103]), { type: "AllBlocksCleared" }, stored(0, 1));
    expect(set.snapshot()).toEqual([KEYS[0]]);
    expect(changes.at(-1)).toEqual({ removed: [], cleared: true, added: [KEYS[0]] });
    expect(set.stats()).toMatchObject({ clears: 1, entries: 1 });
  });

  it("clear() empties the set and emits a cleared change", () => {
    const { set, changes, apply } = setWithLog();
    apply(stored(0, 2));
    expect(set.clear()).toEqual({ removed: [], cleared: true, added: [] });
    expect(changes.at(-1)).toEqual({ removed: [], cleared: true, added: [] });
    expect(set.snapshot()).toEqual([]);
    expect(set.blockSize).toBeUndefined();
  });

  it.each([
    ["group_idx 1", { groupIdx: 1 }],
    ["a sliding-window group", { groupIdx: 0, kvCacheSpecKind: "sliding_window" }],
  ])("skips blocks of %s", (_name, extra) => {
    const { set, apply } = setWithLog();
    apply(stored(0, 2, extra));
    expect(set.snapshot()).toEqual([]);
    expect(set.stats().skippedGroup).toBe(2);
  });

  it("keeps group 0 marked full_attention", () => {
    const { set, apply } = setWithLog();
    apply(stored(0, 2, { groupIdx: 0, kvCacheSpecKind: "full_attention" }));
    expect(set.snapshot()).toHaveLength(2);
  });

  it.each([
    ["a LoRA", { loraName: "ada" }, 2],
    ["a LoRA named only by lora_id (positional events before vllm#42892)", { loraId: 7 }, 2],
    ["a multimodal hash on the second block", { extraKeys: [null, ["mm", 0]] }, 1],
    ["a cache salt and a LoRA", { extraKeys: [["salt"], null], loraName: "ada" }, 2],
    ["a cache salt beside another extra key", { extraKeys: [["ada", "salt"], null] }, 2],
    ["an empty cache salt", { extraKeys: [[""], null] }, 2],
    ["a salt longer than a router keys", { extraKeys: [["s".repeat(1025)], null] }, 2],
    ["a non-string first extra key", { extraKeys: [[7], null] }, 2],
  ])("does not key blocks with %s (token ids alone do not name them)", (_name, extra, skipped) => {
    const { set, apply } = setWithLog();
    apply(stored(0, 2, extra));
    expect(set.stats().skippedExtraKeys).toBe(skipped);
    expect(set.snapshot()).toEqual(KEYS.slice(0, 2 - skipped));
  });

  it("keys a salted prompt from its salt's key, as a router keys the salted request", () => {
    const { set, apply } = setWithLog();
    // vLLM: the salt is the first block's only extra key; later blocks chain from it.
    apply(stored(0, 2, { extraKeys: [["tenant-a"], null] }));
    apply(stored(2, 4));
    const salted = [...tokenBlockKeys(PROMPT, BS, saltKey("tenant-a"))];
    expect(sorted(set.snapshot())).toEqual(sorted(salted));
    expect(salted.some((k) => KEYS.includes(k))).toBe(false);
    expect(set.stats().skippedExtraKeys).toBe(0);
    // The same tokens under another salt are other keys again.
    expect(tokenBlockKeys(PROMPT, BS, saltKey("tenant-b"))[0]).not.toBe(salted[0]);
    expect(saltKey("s".repeat(1025))).toBeUndefined();
  });

  it("refuses blocks of another block size than the configured one", () => {
    const { set, apply } = setWithLog({ blockSize: 8 });
    apply(stored(0, 2));
    expect(set.snapshot()).toEqual([]);
    expect(set.stats().blockSizeMismatch).toBe(2);
  });

  it("refuses new blocks past maxBlocks, and takes them again after removals", () => {
    const { set, apply } = setWithLog({ maxBlocks: 3 });
    apply(stored(0, 4));
    expect(set.stats()).toMatchObject({ entries: 3, refusedFull: 1 });
    apply(removed([102]));
    apply(stored(2, 4)); // block 2 fits again, block 3 still does not
    expect(sorted(set.snapshot())).toEqual(sorted(KEYS.slice(0, 3)));
    expect(set.stats()).toMatchObject({ entries: 3, refusedFull: 2 });
  });

  it("takes the block size from a BlockStored with blocks, not from an empty one", () => {
    // An engine that sent `block_hashes: []` with a nonsense size used to fix the set's size:
    // every real block then mismatched, and a size past 2^32 broke every watch's encoding.
    const { set, apply } = setWithLog();
    apply(stored(0, 0, { blockSize: 2 ** 40, tokenIds: [] }));
    expect(set.blockSize).toBeUndefined();
    apply(stored(0, 2));
    expect(set.blockSize).toBe(BS);
    expect(set.snapshot()).toEqual(KEYS.slice(0, 2));
    expect(set.stats().blockSizeMismatch).toBe(0);
  });

  it(`holds at most ${MAX_MEDIA} distinct media; stores in more are refused and counted`, () => {
    // Each medium a hash is held in is an entry of its list, searched on every store and
    // removal: one hash in 100,000 media made that quadratic, and each entry kept its own
    // copy of a medium string of up to 64 KiB.
    const { set, apply } = setWithLog();
    const media = Array.from({ length: MAX_MEDIA + 5 }, (_, i) => `m${i}`.padEnd(1000, "x"));
    for (const medium of media) apply(stored(0, 1, { medium }));
    expect(set.stats()).toMatchObject({ entries: MAX_MEDIA, refusedMedium: 5 });
    // A medium no entry holds any more makes room for another.
    apply(removed([100], media[0]));
    apply(stored(0, 1, { medium: "late" }));
    expect(set.stats()).toMatchObject({ entries: MAX_MEDIA, refusedMedium: 5 });
    apply({ type: "AllBlocksCleared" });
    apply(stored(0, 1, { medium: "after-clear" }));
    expect(set.stats()).toMatchObject({ entries: 1, refusedMedium: 5 });
  });

  it.each([
    [{ maxBlocks: 0 }, "maxBlocks must be a positive integer, got 0"],
    [{ blockSize: 1.5 }, "blockSize must be a positive integer, got 1.5"],
  ])("refuses options %j", (options, message) => {
    expect(() => createReplicaBlockSet(options)).toThrow(
      expect.objectContaining({ code: "LLMGW_KV_EVENTS_INVALID_OPTIONS", message }),
    );
  });
});
