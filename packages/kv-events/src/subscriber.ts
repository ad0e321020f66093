/**
 * A subscriber to one engine's KV events: ZMQ SUB on the engine's publisher, sequence checks,
 * and resync through the engine's replay socket when one is configured. What the batches mean
 * is the owner's business (typically a {@link createReplicaBlockSet} per engine).
 */
import { Dealer, Subscriber } from "zeromq";
import {
  type DecodedKvEventBatch,
  decodeKvEventBatch,
  type KvEventDecodeLimits,
  resolveKvEventDecodeLimits,
} from "./decode.js";
import { isKvEventsError, KvEventsError } from "./errors.js";
import { END_SEQ, seqFrame } from "./publisher.js";

/**
 * Why the owner must forget what it knew of this engine:
 * - `"restart"`: seq went back (it restarts from 0 per engine process), or a replay's batch at
 *   the last applied seq is not the one applied (a new process's);
 * - `"gap"`: messages were lost and could not be replayed;
 * - `"undecodable"`: a message in sequence could not be decoded, so its events are lost.
 */
export type KvEventsResetReason = "restart" | "gap" | "undecodable";

/** Structured log sink (the default drops everything). */
export interface KvEventsLogger {
  info(message: string, fields?: Readonly<Record<string, unknown>>): void;
  warn(message: string, fields?: Readonly<Record<string, unknown>>): void;
}

/** Options of {@link createKvEventSubscriber}. */
export interface KvEventSubscriberOptions {
  /** The engine's PUB endpoint to connect to, e.g. `tcp://10.0.0.5:5557`. */
  readonly endpoint: string;
  /** Topic to subscribe to; messages with another topic are dropped (default `""`: all). */
  readonly topic?: string;
  /** The engine's replay ROUTER endpoint; without it a gap resets. */
  readonly replayEndpoint?: string;
  /** Called with each batch, in sequence order; `rejected` lists its refused events. */
  readonly onBatch: (batch: DecodedKvEventBatch, seq: bigint) => void;
  /** Called before the batch that follows a reset: the owner clears this engine's set. */
  readonly onReset: (reason: KvEventsResetReason) => void;
  readonly logger?: KvEventsLogger;
  /** Bounds of the payload decoder. */
  readonly decodeLimits?: KvEventDecodeLimits;
  /** Longest wait for each replay reply, ms (default 2,000); past it the replay failed. */
  readonly replayTimeoutMs?: number;
  /** Most batches taken from one replay (default 100,000); more fails the replay. */
  readonly maxReplayBatches?: number;
  /**
   * Longest a whole replay may take, ms (default 30,000): past it the replay failed, however
   * fast each reply came. Live messages wait meanwhile.
   */
  readonly replayDeadlineMs?: number;
  /** Most payload bytes taken from one replay (default 256 MiB); more fails the replay. */
  readonly maxReplayBytes?: number;
}

/** Counters of a subscriber, since it was created. */
export interface KvEventSubscriberStats {
  /** Messages received on the SUB socket. */
  readonly received: number;
  /** Batches handed to `onBatch` (live or replayed). */
  readonly applied: number;
  /** Of those, batches that came from a replay. */
  readonly replayed: number;
  /** Gaps seen in the sequence (whether or not replay closed them). */
  readonly gaps: number;
  /** `onReset` calls. */
  readonly resets: number;
  /** Messages dropped: wrong frame count, bad seq frame, other topic, undecodable payload. */
  readonly malformed: number;
  /** Events refused inside otherwise good batches. */
  readonly rejectedEvents: number;
  /** Live messages already applied from a replay, skipped. */
  readonly duplicates: number;
}

/** A running subscription. */
export interface KvEventSubscriber {
  /** Seq of the last batch applied, undefined before the first. */
  readonly lastSeq: bigint | undefined;
  /**
   * The owner knows the engine's process was replaced (the agent relaunched it): forget the
   * sequence, so the next message sets a new baseline. Without this, a new process whose first
   * batches were lost while the socket reconnected, and whose next seq happens to be `last + 1`,
   * would be taken for the old one. The owner clears what it built itself; `onReset` is not
   * called. A replay in progress is abandoned.
   */
  forgetSequence(): void;
  stats(): KvEventSubscriberStats;
  /** Closes the sockets and resolves once the receive loop has stopped. */
  close(): Promise<void>;
}

const silent: KvEventsLogger = { info: () => {}, warn: () => {} };

/** Longest wait before connecting again after a protocol error (doubling from 100 ms). */
const MAX_RECONNECT_DELAY_MS = 5_000;

function positiveInt(value: number | undefined, fallback: number, name: string): number {
  const v = value ?? fallback;
  if (!Number.isSafeInteger(v) || v <= 0) {
    throw new KvEventsError(
      "LLMGW_KV_EVENTS_INVALID_OPTIONS",
      `${name} must be a positive integer, got ${String(value)}`,
    );
  }
  return v;
}

/**
 * Connects a SUB socket to `endpoint` and starts receiving. Sequence rules: the first message
 * sets the baseline; `last + 1` is applied; a seq ≤ last means the engine restarted
 * (`onReset("restart")`, then apply); a gap is closed by a replay of `last` onwards when
 * `replayEndpoint` is set (live messages wait in the SUB socket's queue meanwhile, up to its
 * high-water mark of 100,000 like vLLM's PUB side): the replayed batch at `last` must equal the
 * applied one byte for byte, else a restarted engine answered (`onReset("restart")`). Without
 * a replay endpoint, or when the replay fails or no longer holds `last`, `onReset("gap")`; after
 * either reset the message becomes the new baseline. A malformed message is counted
 * and logged; nothing a peer sends can throw out of the loop. Exceptions thrown by `onBatch` or
 * `onReset` are logged and do not stop it.
 */
export function createKvEventSubscriber(options: KvEventSubscriberOptions): KvEventSubscriber {
  const limits = resolveKvEventDecodeLimits(options.decodeLimits);
  const replayTimeoutMs = positiveInt(options.replayTimeoutMs, 2000, "replayTimeoutMs");
  const maxReplayBatches = positiveInt(options.maxReplayBatches, 100_000, "maxReplayBatches");
  const replayDeadlineMs = positiveInt(options.replayDeadlineMs, 30_000, "replayDeadlineMs");
  const maxReplayBytes = positiveInt(options.maxReplayBytes, 256 * 1024 * 1024, "maxReplayBytes");
  const topic = options.topic ?? "";
  const log = options.logger ?? silent;
  const fields = { endpoint: options.endpoint, topic };

  // A peer's frame over the payload bound is refused by ZMQ as it arrives, never buffered
  // whole to be refused by the decoder: ZMQ_MAXMSGSIZE bounds each frame, and the payload is
  // the largest. ZMQ then drops the connection as a protocol error and, unlike after a lost
  // peer, never connects again: the `disconnect` handler below does, and the message lost is
  // a gap like any other.
  const maxMessageSize = limits.maxPayloadBytes;
  const sub = new Subscriber({ receiveHighWaterMark: 100_000, linger: 0, maxMessageSize });
  try {
    sub.connect(options.endpoint);
  } catch (cause) {
    sub.close();
    throw new KvEventsError(
      "LLMGW_KV_EVENTS_SOCKET_FAILED",
      `could not connect the SUB socket to ${options.endpoint}: ${(cause as Error).message}`,
      { cause },
    );
  }
  sub.subscribe(topic);
  // After a lost peer ZMQ connects again by itself, and says so (`connect:retry`) at once.
  // After a protocol error (a frame over maxMessageSize) it never does: then, and only then,
  // connect anew ourselves, backing off while each new connection ends the same way (a peer
  // that is not a ZMQ publisher, or one that keeps sending oversized frames).
  let reconnectCheck: NodeJS.Timeout | undefined;
  let manualReconnects = 0;
  sub.events.on("connect:retry", () => {
    clearTimeout(reconnectCheck);
    reconnectCheck = undefined;
  });
  sub.events.on("disconnect", () => {
    clearTimeout(reconnectCheck);
    const delayMs = Math.min(MAX_RECONNECT_DELAY_MS, 100 * 2 ** manualReconnects);
    reconnectCheck = setTimeout(() => {
      reconnectCheck = undefined;
      if (closed) return;
      manualReconnects++;
      log.info("kv-events: connecting again after a protocol error", fields);
      try {
        // The dead session still holds the endpoint: connect() alone would do nothing.
        sub.disconnect(options.endpoint);
      } catch {
        // Gone already.
      }
      try {
        sub.connect(options.endpoint);
      } catch (error) {
        log.warn("kv-events: could not connect again", { ...fields, error: String(error) });
      }
    }, delayMs);
  });

  const stats = {
    received: 0,
    applied: 0,
    replayed: 0,
    gaps: 0,
    resets: 0,
    malformed: 0,
    rejectedEvents: 0,
    duplicates: 0,
  };
  let last: bigint | undefined;
  /** The payload at `last`: a replay must give it back byte for byte to be the same engine. */
  let lastPayload: Uint8Array | undefined;
  /** After a replay: live messages in (replayFrom - 1, skipThrough] were applied already. */
  let skipFrom: bigint | undefined;
  let skipThrough: bigint | undefined;
  let closed = false;
  let replaySocket: Dealer | undefined;
  /** Bumped by forgetSequence: a replay begun before it must not apply the old engine's batches. */
  let generation = 0;

  function malformed(message: string, extra: Record<string, unknown> = {}): void {
    stats.malformed++;
    log.warn(`kv-events: ${message}`, { ...fields, ...extra });
  }

  function reset(reason: KvEventsResetReason, extra: Record<string, unknown>): void {
    stats.resets++;
    log.info(`kv-events: reset (${reason})`, { ...fields, ...extra });
    try {
      options.onReset(reason);
    } catch (error) {
      log.warn("kv-events: onReset threw", { ...fields, error: String(error) });
    }
  }

  /** Decodes and hands on one batch at `seq`, which becomes `last`. */
  function apply(seq: bigint, payload: Uint8Array, replayed: boolean): void {
    last = seq;
    lastPayload = payload;
    let batch: DecodedKvEventBatch;
    try {
      batch = decodeKvEventBatch(payload, limits);
    } catch (error) {
      if (!isKvEventsError(error)) throw error;
      malformed(`undecodable payload at seq ${seq}: ${error.message}`, { code: error.code });
      reset("undecodable", { seq: String(seq) });
      return;
    }
    stats.applied++;
    if (replayed) stats.replayed++;
    if (batch.rejected.length > 0) {
      stats.rejectedEvents += batch.rejected.length;
      log.warn(`kv-events: ${batch.rejected.length} events refused at seq ${seq}`, {
        ...fields,
        first: batch.rejected[0]?.error.message,
      });
    }
    try {
      options.onBatch(batch, seq);
    } catch (error) {
      log.warn("kv-events: onBatch threw", { ...fields, error: String(error) });
    }
  }

  /**
   * Asks the replay socket for `from` onwards. Returns the batches in order, or a reason the
   * replay cannot close the gap. A fresh DEALER per replay, so a late reply to a timed-out
   * request can never be taken for the next one's.
   */
  async function replay(from: bigint): Promise<{ seq: bigint; payload: Uint8Array }[] | string> {
    const dealer = new Dealer({ receiveTimeout: replayTimeoutMs, linger: 0, maxMessageSize });
    replaySocket = dealer;
    try {
      dealer.connect(options.replayEndpoint as string);
      // The empty frame stands in for the envelope a REQ socket would add: vLLM's ROUTER
      // unpacks `client_id, _, start_seq_bytes`.
      await dealer.send(["", seqFrame(from)]);
      const out: { seq: bigint; payload: Uint8Array }[] = [];
      const deadline = Date.now() + replayDeadlineMs;
      let bytes = 0;
      for (;;) {
        // Each reply within replayTimeoutMs, and all of them within the deadline: an engine
        // that drips replies must not hold this replica's events back for long.
        const left = deadline - Date.now();
        if (left <= 0) return `replay took longer than ${replayDeadlineMs} ms`;
        // When the deadline comes before the reply's own timeout, a timeout is the deadline's.
        const byDeadline = left < replayTimeoutMs;
        dealer.receiveTimeout = byDeadline ? left : replayTimeoutMs;
        const frames = await dealer.receive().catch((error: unknown) => {
          if (byDeadline) return undefined;
          throw error;
        });
        if (frames === undefined) return `replay took longer than ${replayDeadlineMs} ms`;
        if (frames.length !== 3 || (frames[1] as Buffer).length !== 8) {
          return `replay reply of ${frames.length} frames is not ["", seq, payload]`;
        }
        const seqBytes = frames[1] as Buffer;
        if (seqBytes.equals(END_SEQ)) return out;
        if (out.length >= maxReplayBatches) return `replay exceeded ${maxReplayBatches} batches`;
        bytes += (frames[2] as Buffer).length;
        if (bytes > maxReplayBytes) return `replay exceeded ${maxReplayBytes} bytes`;
        out.push({ seq: seqBytes.readBigUInt64BE(0), payload: frames[2] as Buffer });
      }
    } catch (error) {
      return `replay failed: ${(error as Error).message}`;
    } finally {
      replaySocket = undefined;
      dealer.close();
    }
  }

  async function onGap(seq: bigint, payload: Uint8Array, prev: bigint): Promise<void> {
    stats.gaps++;
    const from = prev + 1n;
    const known = lastPayload;
    let reason: KvEventsResetReason = "gap";
    if (options.replayEndpoint !== undefined) {
      // Ask from `prev`, not `prev + 1`: a restarted engine's seq starts again at 0, and if its
      // first batches went out before our SUB socket reconnected, its seq looks like a gap and
      // its replay socket would "close" it. Only the same process can give back the batch at
      // `prev` byte for byte (each payload carries its wall-clock ts).
      const asked = generation;
      const got = await replay(prev);
      if (closed) return;
      if (generation !== asked) {
        // The owner replaced the engine meanwhile and cleared its set. This message came
        // before that, from the engine that was replaced: drop it; the next sets the baseline.
        return;
      }
      if (typeof got !== "string") {
        const atPrev = got.find((b) => b.seq === prev);
        const sameEngine =
          atPrev !== undefined && known !== undefined && Buffer.from(atPrev.payload).equals(known);
        const usable = got.filter((b) => b.seq >= from);
        // The replay closes the gap only if it comes from the same engine, starts right after
        // `prev`, runs without holes and reaches the live message.
        const contiguous = usable.every((b, i) => b.seq === from + BigInt(i));
        const through = usable.length > 0 ? from + BigInt(usable.length) - 1n : prev;
        if (atPrev !== undefined && !sameEngine) {
          reason = "restart";
          log.info("kv-events: replay differs at the last applied seq: the engine restarted", {
            ...fields,
            seq: String(prev),
          });
        } else if (sameEngine && usable.length > 0 && contiguous && through >= seq) {
          for (const b of usable) apply(b.seq, b.payload, true);
          skipFrom = prev + 1n;
          skipThrough = through;
          log.info(`kv-events: gap ${from}..${seq - 1n} closed by replay`, {
            ...fields,
            batches: usable.length,
          });
          return;
        } else {
          log.warn("kv-events: replay does not cover the gap", {
            ...fields,
            from: String(from),
            live: String(seq),
            replayedThrough: String(through),
            first: got[0] === undefined ? undefined : String(got[0].seq),
          });
        }
      } else {
        log.warn(`kv-events: ${got}`, { ...fields, from: String(from) });
      }
    }
    reset(reason, { from: String(from), live: String(seq) });
    apply(seq, payload, false);
  }

  async function handle(frames: Buffer[]): Promise<void> {
    stats.received++;
    manualReconnects = 0;
    if (frames.length !== 3) {
      malformed(`message of ${frames.length} frames, expected [topic, seq, payload]`);
      return;
    }
    const [topicFrame, seqBytes, payload] = frames as [Buffer, Buffer, Buffer];
    if (seqBytes.length !== 8) {
      malformed(`seq frame of ${seqBytes.length} bytes, expected 8`);
      return;
    }
    if (topic !== "" && topicFrame.toString("utf8") !== topic) {
      // SUB filters by prefix: `kv@a` also receives `kv@ab`.
      malformed(`message for topic ${JSON.stringify(topicFrame.toString("utf8"))}`);
      return;
    }
    const seq = seqBytes.readBigUInt64BE(0);
    if (skipThrough !== undefined && skipFrom !== undefined) {
      if (seq >= skipFrom && seq <= skipThrough) {
        stats.duplicates++;
        return;
      }
      skipFrom = skipThrough = undefined;
    }
    if (last === undefined || seq === last + 1n) {
      apply(seq, payload, false);
    } else if (seq <= last) {
      reset("restart", { seq: String(seq), last: String(last) });
      apply(seq, payload, false);
    } else {
      await onGap(seq, payload, last);
    }
  }

  const loop = (async () => {
    try {
      for await (const frames of sub) {
        if (closed) break;
        await handle(frames);
      }
    } catch (error) {
      // Closing the socket ends the iteration with an error; anything else is logged.
      if (!closed) log.warn("kv-events: receive loop stopped", { ...fields, error: String(error) });
    }
  })();

  return {
    get lastSeq() {
      return last;
    },
    stats: () => ({ ...stats }),
    forgetSequence() {
      generation++;
      last = lastPayload = undefined;
      skipFrom = skipThrough = undefined;
      replaySocket?.close();
      log.info("kv-events: sequence forgotten (the engine was replaced)", fields);
    },
    async close() {
      if (closed) return;
      closed = true;
      clearTimeout(reconnectCheck);
      sub.close();
      replaySocket?.close();
      await loop;
    },
  };
}
