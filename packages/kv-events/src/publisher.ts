/**
 * A KV-event publisher that behaves as vLLM's `ZmqEventPublisher` does on the wire
 * (`vllm/distributed/kv_events.py`): a PUB socket sending `[topic, seq u64 BE, payload]` with
 * seq from 0, and an optional ROUTER answering replay requests from a buffer of the last
 * `bufferSteps` batches. For the simulator and tests.
 */
import { Publisher, Router } from "zeromq";
import { encodeKvEventBatch, type KvEventEncoding } from "./encode.js";
import { KvEventsError } from "./errors.js";
import type { KvEvent } from "./kv-event.js";

/** Options of {@link createKvEventPublisher}. */
export interface KvEventPublisherOptions {
  /**
   * Where the PUB socket binds, e.g. `tcp://*:5557` (vLLM's default) or `tcp://127.0.0.1:0`
   * (port 0 or `*` picks a free port; {@link KvEventPublisher.endpoint} reports it).
   */
  readonly endpoint: string;
  /** Where the replay ROUTER binds; none when absent (vLLM's default). */
  readonly replayEndpoint?: string;
  /** First frame of every message (default `""`, as vLLM). */
  readonly topic?: string;
  /** Event encoding (default `"tagged"`, vLLM ≥ 0.26). */
  readonly encoding?: KvEventEncoding;
  /** Batches kept for replay (default 10,000, vLLM's `buffer_steps`). */
  readonly bufferSteps?: number;
  /** The batches' `data_parallel_rank`; omitted when absent. */
  readonly dataParallelRank?: number;
  /** Wall clock for the batches' `ts`, epoch ms (default `Date.now`). */
  readonly nowMs?: () => number;
}

/** A bound publisher. */
export interface KvEventPublisher {
  /** The PUB socket's bound endpoint (the real port when one was picked). */
  readonly endpoint: string;
  /** The replay ROUTER's bound endpoint, if any. */
  readonly replayEndpoint: string | undefined;
  /** Seq the next batch gets (0 before the first). */
  readonly nextSeq: bigint;
  /** Publishes `events` as one batch with the next seq; resolves once queued on the socket. */
  publish(events: readonly KvEvent[]): Promise<bigint>;
  /** Closes both sockets; later `publish` calls fail with `LLMGW_KV_EVENTS_CLOSED`. */
  close(): Promise<void>;
}

/** vLLM's END_SEQ: `(-1).to_bytes(8, "big", signed=True)`. */
export const END_SEQ = new Uint8Array(8).fill(0xff);

/** 8-byte big-endian seq frame. */
export function seqFrame(seq: bigint): Uint8Array {
  const frame = new Uint8Array(8);
  new DataView(frame.buffer).setBigUint64(0, seq, false);
  return frame;
}

/** zmq picks a free port for `*`; accept port 0 as the same request. */
function bindable(endpoint: string): string {
  return endpoint.replace(/^(tcp:\/\/.+):0$/, "$1:*");
}

async function bind(socket: Publisher | Router, endpoint: string, what: string): Promise<string> {
  try {
    await socket.bind(bindable(endpoint));
  } catch (cause) {
    throw new KvEventsError(
      "LLMGW_KV_EVENTS_SOCKET_FAILED",
      `could not bind the ${what} socket to ${endpoint}: ${(cause as Error).message}`,
      { cause },
    );
  }
  return socket.lastEndpoint ?? endpoint;
}

/**
 * Binds a publisher (and its replay socket). Fails with `LLMGW_KV_EVENTS_SOCKET_FAILED` when
 * an endpoint cannot be bound, `LLMGW_KV_EVENTS_INVALID_OPTIONS` for a bad option.
 */
export async function createKvEventPublisher(
  options: KvEventPublisherOptions,
): Promise<KvEventPublisher> {
  const bufferSteps = options.bufferSteps ?? 10_000;
  if (!Number.isSafeInteger(bufferSteps) || bufferSteps < 0) {
    throw new KvEventsError(
      "LLMGW_KV_EVENTS_INVALID_OPTIONS",
      `bufferSteps must be a non-negative integer, got ${String(options.bufferSteps)}`,
    );
  }
  const encoding = options.encoding ?? "tagged";
  const topic = options.topic ?? "";
  const nowMs = options.nowMs ?? Date.now;
  // vLLM: hwm=100000, past which PUB drops; linger 0 so close() never waits on a slow peer.
  const pub = new Publisher({ sendHighWaterMark: 100_000, linger: 0 });
  let router: Router | undefined;
  let endpoint: string;
  let replayEndpoint: string | undefined;
  try {
    endpoint = await bind(pub, options.endpoint, "PUB");
    if (options.replayEndpoint !== undefined) {
      router = new Router({ linger: 0 });
      replayEndpoint = await bind(router, options.replayEndpoint, "replay ROUTER");
    }
  } catch (error) {
    pub.close();
    router?.close();
    throw error;
  }

  /** Ring of the last `bufferSteps` (seq, payload). */
  const buffer: { seq: bigint; payload: Uint8Array }[] = [];
  let seq = 0n;
  let closed = false;
  /** Serialises sends: zeromq allows one pending send per socket. */
  let sending: Promise<unknown> = Promise.resolve();

  const replayLoop = router ? serveReplay(router) : Promise.resolve();

  async function serveReplay(socket: Router): Promise<void> {
    try {
      for await (const frames of socket) {
        // vLLM: `client_id, _, start_seq_bytes = frame` after checking `len(frame) == 3`; a
        // REQ client's envelope (or a DEALER's explicit empty frame) gives the middle frame.
        if (frames.length !== 3) continue;
        const [client, , start] = frames as [Buffer, Buffer, Buffer];
        if (start.length !== 8) continue;
        const from = start.readBigUInt64BE(0);
        for (const item of buffer.filter((b) => b.seq >= from)) {
          await socket.send([client, "", seqFrame(item.seq), item.payload]);
        }
        await socket.send([client, "", END_SEQ, ""]);
      }
    } catch (error) {
      if (!closed) throw error;
    }
  }

  return {
    endpoint,
    replayEndpoint,
    get nextSeq() {
      return seq;
    },
    publish(events) {
      if (closed) {
        return Promise.reject(
          new KvEventsError("LLMGW_KV_EVENTS_CLOSED", "the KV-event publisher is closed"),
        );
      }
      const mine = seq++;
      const payload = encodeKvEventBatch(
        {
          ts: nowMs() / 1000,
          events,
          ...(options.dataParallelRank === undefined
            ? {}
            : { dataParallelRank: options.dataParallelRank }),
        },
        { encoding },
      );
      if (bufferSteps > 0) {
        buffer.push({ seq: mine, payload });
        if (buffer.length > bufferSteps) buffer.shift();
      }
      const sent = sending.then(() => pub.send([topic, seqFrame(mine), payload]));
      sending = sent.catch(() => {});
      return sent.then(() => mine);
    },
    async close() {
      if (closed) return;
      closed = true;
      await sending;
      pub.close();
      router?.close();
      await replayLoop.catch(() => {});
    },
  };
}
