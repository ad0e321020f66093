import { describe, expect, it } from "vitest";
import {
  hexBytes,
  POSITIONAL_SAMPLE_BATCH,
  POSITIONAL_SAMPLE_HEX,
  TAGGED_SAMPLE_BATCH,
  TAGGED_SAMPLE_HEX,
} from "../test/fixtures.js";
import { decodeKvEventBatch } from "./decode.js";
import { encodeKvEventBatch } from "./encode.js";
import type { KvEventBatch } from "./kv-event.js";

const BIG = 15760518052499183552n;

describe("encodeKvEventBatch", () => {
  it.each([
    ["vLLM 0.26.0's tagged capture", TAGGED_SAMPLE_BATCH, "tagged", TAGGED_SAMPLE_HEX],
    ["the legacy positional form", POSITIONAL_SAMPLE_BATCH, "positional", POSITIONAL_SAMPLE_HEX],
  ] as const)("writes %s byte for byte", (_name, batch, encoding, hex) => {
    expect(Buffer.from(encodeKvEventBatch(batch, { encoding })).toString("hex")).toBe(
      Buffer.from(hexBytes(hex)).toString("hex"),
    );
  });

  it("writes a whole ts as float64, as msgspec does", () => {
    const bytes = encodeKvEventBatch({ ts: 5, events: [] }, { encoding: "tagged" });
    expect(Buffer.from(bytes).toString("hex")).toBe("92cb4014000000000000" + "90");
  });

  it.each(["tagged", "positional"] as const)("round-trips every field (%s)", (encoding) => {
    const batch: KvEventBatch = {
      ts: 12.25,
      events: [
        {
          type: "BlockStored",
          blockHashes: [1n, (1n << 64n) - 1n, 1n << 53n],
          parentBlockHash: BIG,
          tokenIds: [0, 1, 2, 0xffffffff, 5, 6],
          blockSize: 2,
          loraId: 9,
          medium: "CPU",
          loraName: "ada",
          extraKeys: [["ada"], null, null],
          groupIdx: 1,
          kvCacheSpecKind: "sliding_window",
          kvCacheSpecSlidingWindow: 64,
          locality: "rack",
        },
        { type: "BlockStored", blockHashes: [3n], tokenIds: [1, 2], blockSize: 2 },
        { type: "BlockRemoved", blockHashes: [BIG], medium: "GPU", groupIdx: 0, locality: "x" },
        { type: "BlockRemoved", blockHashes: [] },
        { type: "AllBlocksCleared" },
      ],
      dataParallelRank: 2,
    };
    const decoded = decodeKvEventBatch(encodeKvEventBatch(batch, { encoding }));
    // The tagged form writes extra_keys as one null per block when there are none (as vLLM).
    const expected =
      encoding === "tagged"
        ? batch.events.map((e, i) => (i === 1 ? { ...e, extraKeys: [null] } : e))
        : batch.events;
    expect(decoded).toEqual({ ...batch, events: expected, rejected: [], unknownEvents: 0 });
  });

  it("refuses an unknown encoding, echoing it", () => {
    expect(() =>
      encodeKvEventBatch({ ts: 0, events: [] }, { encoding: "json" as "tagged" }),
    ).toThrow(
      expect.objectContaining({
        code: "LLMGW_KV_EVENTS_INVALID_OPTIONS",
        message: 'encoding must be "tagged" or "positional", got "json"',
      }),
    );
  });
});
