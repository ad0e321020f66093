import { EventEmitter } from "node:events";
import { type BufferPool, createBufferPool, POOLED_MIN_BYTES } from "@llmgw/router";
import { describe, expect, it } from "vitest";
import { type BodySource, readBody } from "./body-reader.js";
import { RejectedError } from "./rejection.js";

/** A request body as Node's parser delivers it: `data` chunks, then `end` or `error`. */
class FakeBody extends EventEmitter implements BodySource {
  constructor(readonly headers: { readonly "content-length"?: string }) {
    super();
  }
}

/** A real pool that counts what is taken and given back. */
function countingPool(): BufferPool & { taken: number; given: number } {
  const pool = createBufferPool();
  const counts = {
    taken: 0,
    given: 0,
    take(length: number) {
      counts.taken++;
      return pool.take(length);
    },
    give(view: Uint8Array) {
      counts.given++;
      pool.give(view);
    },
    get held() {
      return pool.held;
    },
  };
  return counts;
}

const LIMIT = 2 * POOLED_MIN_BYTES;
const STREAM_ERROR = new Error("aborted");

/** Chunk `i` of `size` bytes, each byte `i + 1`: a concatenation error shows in the bytes. */
const chunk = (i: number, size: number): Buffer => Buffer.alloc(size, i + 1);

interface Row {
  readonly name: string;
  /** Content-Length header; absent = chunked. */
  readonly declared?: number;
  readonly chunks: readonly number[];
  readonly ending: "end" | "error";
  readonly expected:
    | { readonly body: number; readonly pooled: boolean }
    | { readonly error: "body_too_large" | "stream" };
  /** Chunks the reader must have looked at (a refused body stops reading). */
  readonly read?: number;
}

const rows: Row[] = [
  {
    name: "one small chunk, undeclared",
    chunks: [100],
    ending: "end",
    expected: { body: 100, pooled: false },
  },
  {
    name: "several chunks concatenated",
    chunks: [10, 20, 30],
    ending: "end",
    expected: { body: 60, pooled: false },
  },
  {
    name: "an empty body",
    declared: 0,
    chunks: [],
    ending: "end",
    expected: { body: 0, pooled: false },
  },
  {
    name: "declared, just under the pooled size",
    declared: POOLED_MIN_BYTES - 1,
    chunks: [POOLED_MIN_BYTES - 1],
    ending: "end",
    expected: { body: POOLED_MIN_BYTES - 1, pooled: false },
  },
  {
    name: "declared, from the pooled size on, read straight into the pooled buffer",
    declared: POOLED_MIN_BYTES,
    chunks: [1000, POOLED_MIN_BYTES - 1000],
    ending: "end",
    expected: { body: POOLED_MIN_BYTES, pooled: true },
  },
  {
    name: "undeclared, just under the pooled size",
    chunks: [POOLED_MIN_BYTES - 1],
    ending: "end",
    expected: { body: POOLED_MIN_BYTES - 1, pooled: false },
  },
  {
    name: "undeclared, from the pooled size on, copied into a pooled buffer",
    chunks: [POOLED_MIN_BYTES / 2, POOLED_MIN_BYTES / 2],
    ending: "end",
    expected: { body: POOLED_MIN_BYTES, pooled: true },
  },
  {
    name: "declared exactly at the limit",
    declared: LIMIT,
    chunks: [LIMIT / 2, LIMIT / 2],
    ending: "end",
    expected: { body: LIMIT, pooled: true },
  },
  {
    name: "undeclared, exactly at the limit",
    chunks: [LIMIT / 4, LIMIT / 4, LIMIT / 2],
    ending: "end",
    expected: { body: LIMIT, pooled: true },
  },
  {
    name: "declared one over the limit: refused before reading",
    declared: LIMIT + 1,
    chunks: [LIMIT + 1],
    ending: "end",
    expected: { error: "body_too_large" },
    read: 0,
  },
  {
    name: "chunked past the limit: refused at the chunk that crosses it",
    chunks: [LIMIT / 2, LIMIT / 2, 1, 100],
    ending: "end",
    expected: { error: "body_too_large" },
    read: 3,
  },
  {
    name: "more bytes than declared: refused",
    declared: POOLED_MIN_BYTES,
    chunks: [POOLED_MIN_BYTES, 1],
    ending: "end",
    expected: { error: "body_too_large" },
    read: 2,
  },
  {
    name: "a declared body that ends short arrives unpooled, as sent",
    declared: POOLED_MIN_BYTES,
    chunks: [100],
    ending: "end",
    expected: { body: 100, pooled: false },
  },
  {
    name: "a stream error mid-body (small)",
    chunks: [10, 20],
    ending: "error",
    expected: { error: "stream" },
  },
  {
    name: "a stream error mid-body gives back the pooled buffer",
    declared: LIMIT,
    chunks: [LIMIT / 2],
    ending: "error",
    expected: { error: "stream" },
  },
  {
    name: "an error after a refusal is not reported twice",
    chunks: [LIMIT + 1],
    ending: "error",
    expected: { error: "body_too_large" },
  },
];

describe("readBody", () => {
  it.each(rows)("$name", (row) => {
    const source = new FakeBody(
      row.declared === undefined ? {} : { "content-length": String(row.declared) },
    );
    const buffers = countingPool();
    const outcomes: ({ body: Uint8Array; pooled: boolean } | { error: unknown })[] = [];
    readBody(
      source,
      { maxBodyBytes: LIMIT },
      buffers,
      (body, pooled) => outcomes.push({ body, pooled }),
      (error) => outcomes.push({ error }),
    );
    let read = 0;
    const sent = row.chunks.map((size, i) => chunk(i, size));
    for (const c of sent) {
      if (source.listenerCount("data") > 0) read++;
      source.emit("data", c);
    }
    const takenBeforeEnd = buffers.taken;
    if (row.ending === "end") source.emit("end");
    else source.emit("error", STREAM_ERROR);

    expect(outcomes).toHaveLength(1);
    const outcome = outcomes[0];
    if ("body" in row.expected) {
      expect(outcome).toMatchObject({ pooled: row.expected.pooled });
      const body = (outcome as { body: Uint8Array }).body;
      expect(Buffer.from(body)).toEqual(Buffer.concat(sent));
      expect(body.length).toBe(row.expected.body);
      // A pooled body is the caller's to give back.
      expect(buffers.given).toBe(0);
      if (row.expected.pooled) {
        expect(buffers.taken).toBe(1);
        // A declared length is read straight into the pooled buffer; otherwise copied at the end.
        expect(takenBeforeEnd).toBe(row.declared === undefined ? 0 : 1);
        expect(body.buffer).toBeInstanceOf(SharedArrayBuffer);
      }
    } else if (row.expected.error === "stream") {
      expect(outcome).toEqual({ error: STREAM_ERROR });
      expect(buffers.given).toBe(buffers.taken);
    } else {
      const error = (outcome as { error: unknown }).error;
      expect(error).toBeInstanceOf(RejectedError);
      expect(error).toMatchObject({
        reason: "body_too_large",
        message: `request body exceeds the limit of ${LIMIT} bytes`,
      });
      expect(buffers.given).toBe(buffers.taken);
      // Reading stopped: the answer drains the rest.
      expect(source.listenerCount("data")).toBe(0);
    }
    if (row.read !== undefined) expect(read).toBe(row.read);
  });

  it("returns the one chunk received as is, without a copy", () => {
    const source = new FakeBody({});
    const one = chunk(0, 50);
    let got: Uint8Array | undefined;
    readBody(
      source,
      { maxBodyBytes: LIMIT },
      createBufferPool(),
      (body) => {
        got = body;
      },
      () => {},
    );
    source.emit("data", one);
    source.emit("end");
    expect(got).toBe(one);
  });
});
