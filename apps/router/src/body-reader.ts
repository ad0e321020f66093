/** Reads a request body whole, within the router's size limit, into a pooled buffer when large. */
import { type BufferPool, POOLED_MIN_BYTES } from "@llmgw/router";
import { bodyTooLarge, type RejectedError } from "./rejection.js";

/** The part of an `IncomingMessage` {@link readBody} uses. */
export interface BodySource {
  readonly headers: { readonly "content-length"?: string | undefined };
  on(event: "data", listener: (chunk: Buffer) => void): unknown;
  on(event: "end", listener: () => void): unknown;
  on(event: "error", listener: (error: Error) => void): unknown;
  off(event: "data", listener: (chunk: Buffer) => void): unknown;
}

/** Bounds of {@link readBody} (the router's resolved options are one). */
export interface BodyLimits {
  /** Largest body accepted, bytes; a larger one (declared or sent) is refused. */
  readonly maxBodyBytes: number;
}

/**
 * Reads the whole body of `req`, then calls `onBody` or `onError`, one of them once.
 *
 * - A declared `Content-Length` over the limit is refused at once, before any byte is read; a
 *   body that grows past the limit (or past its declared length) is refused as that chunk
 *   arrives, and reading stops: the caller answers 413 and drains the rest.
 * - From {@link POOLED_MIN_BYTES} on, the body lands in a buffer from `buffers` (straight
 *   there when the length is declared, copied there at the end otherwise) and `onBody` gets
 *   `pooled` = true: the caller owns the buffer and gives it back. A declared body that ends
 *   short arrives as an unpooled view (its buffer is left to the collector).
 * - Smaller bodies arrive as the one chunk received, or the chunks concatenated.
 * - A stream error calls `onError` with it (after giving back the pooled buffer).
 */
export function readBody(
  req: BodySource,
  limits: BodyLimits,
  buffers: BufferPool,
  onBody: (body: Uint8Array, pooled: boolean) => void,
  onError: (error: RejectedError | Error) => void,
): void {
  const max = limits.maxBodyBytes;
  const declared = Number(req.headers["content-length"] ?? Number.NaN);
  if (declared > max) {
    onError(bodyTooLarge(max));
    return;
  }
  // Node's parser delivers exactly Content-Length bytes (and refuses it with chunked).
  const into =
    Number.isSafeInteger(declared) && declared >= POOLED_MIN_BYTES
      ? buffers.take(declared)
      : undefined;
  const chunks: Buffer[] = [];
  let size = 0;
  let ended = false;
  const fail = (error: RejectedError | Error): void => {
    if (ended) return;
    ended = true;
    if (into !== undefined) buffers.give(into);
    onError(error);
  };
  const onData = (chunk: Buffer): void => {
    if (ended) return;
    if (size + chunk.length > max || (into && size + chunk.length > into.length)) {
      req.off("data", onData);
      fail(bodyTooLarge(max));
      return;
    }
    if (into === undefined) chunks.push(chunk);
    else into.set(chunk, size);
    size += chunk.length;
  };
  req.on("data", onData);
  // `on`, not `once`: each `once` costs a wrapper; both events come at most once here.
  req.on("end", () => {
    if (ended) return;
    ended = true;
    if (into !== undefined) {
      onBody(into.subarray(0, size), size === into.length);
    } else if (size >= POOLED_MIN_BYTES) {
      const body = buffers.take(size);
      let at = 0;
      for (const chunk of chunks) {
        body.set(chunk, at);
        at += chunk.length;
      }
      onBody(body, true);
    } else {
      onBody(chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks, size), false);
    }
  });
  req.on("error", fail);
}
