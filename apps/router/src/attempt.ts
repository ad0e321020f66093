/** One try of one request on one replica: the upstream half of an {@link Exchange}. */
import {
  type DispatchOutcome,
  EventEndCounter,
  type PickDecision,
  quarterTail,
  type StepPhase,
  type UpstreamErrorKind,
  UsageEventFilter,
  UsageReader,
} from "@llmgw/router";
import { errorCode } from "./error-code.js";
import type { Exchange } from "./exchange.js";
import { errorBody, FAILURE_HTTP } from "./http-errors.js";
import type { UpstreamHandler } from "./router-core.js";

/** How an {@link Attempt} ended, for {@link Exchange.attemptEnded}. */
export type AttemptResult =
  | { readonly kind: "done" }
  | {
      readonly kind: "failed";
      /**
       * No engine works on the request: nothing reached the replica's engine, it refused before
       * answering, or its connection closed before an answer (see {@link RETRYABLE_CONNECT}).
       * Try another.
       */
      readonly retryable: boolean;
      readonly timeout: boolean;
      readonly message: string;
      /** The engine answered 401 to the router's engine key (see `Attempt.onHeaders`). */
      readonly keyRefused?: boolean;
      /**
       * The connection was open and the engine closed it before answering (see
       * {@link CLOSED_UNDER_US}): worth one more try on the same replica, over a new one.
       */
      readonly closedUnderUs?: boolean;
    };

/**
 * Failures before any response byte after which no engine works on the request: it never
 * reached an engine's queue, or (written whole: see `Attempt.onRequestSent`) the engine dropped
 * it with its connection, as one that crashed while it was queued or prefilling does.
 */
const RETRYABLE_CONNECT = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EPIPE",
  "UND_ERR_CONNECT_TIMEOUT",
  "UND_ERR_SOCKET",
  "UND_ERR_CLOSED",
]);

/**
 * Of those, the failures of a connection that was open: the engine closed it before it
 * answered. Mostly a pooled keep-alive connection the engine had just closed: llama.cpp's
 * server closes a connection after each streamed answer without saying so (no `Connection:
 * close`), and a request sent on it before the router sees the close gets a reset
 * (`UND_ERR_SOCKET`). Nothing reached the engine's queue, and a new connection works.
 */
const CLOSED_UNDER_US = new Set(["ECONNRESET", "EPIPE", "UND_ERR_SOCKET", "UND_ERR_CLOSED"]);

/** The reason undici gets when the client went away (never shown to anyone). */
export class ClientGoneError extends Error {
  constructor() {
    super("client disconnected");
    this.name = "ClientGoneError";
  }
}

/**
 * One try on one replica, and undici's raw `dispatch` handler for it: each upstream chunk is
 * written to the client as it arrives, with no Readable stream, async iterator or promise per
 * chunk in between (a third of undici's cost per small request here). Backpressure pauses the
 * upstream until the client drains; a client that goes away aborts it. Ends by calling
 * {@link Exchange.attemptEnded} once.
 *
 * The answer relayed: status and `content-type` as the engine sent them (5xx too, counted as a
 * failure for the replica's circuit); a 401 is dropped and the request tried elsewhere. A try
 * that ends before the head though the engine had the request (its headers timeout; a crash, or
 * the client leaving, after the request was written) adds the GPU time it held to the request's
 * (see {@link Attempt.onRequestSent}). After the first byte, an upstream failure ends an SSE
 * answer with an error event and destroys the socket of any other (its length cannot be met).
 */
export class Attempt implements UpstreamHandler {
  readonly #x: Exchange;
  readonly #replicaId: string;
  readonly #sentAt: number;
  #verdict: DispatchOutcome = "abandoned";
  #firstByteMs: number | undefined;
  /** Prompt tokens booked as queued prefill on the replica until the first body byte. */
  #prefill = 0;
  /** A critical stream's prefill queued at the replica (`RouterCore.criticalPrefills`). */
  #criticalPrefill = false;
  #abortUpstream: ((reason: Error) => void) | undefined;
  #resume: (() => void) | undefined;
  #onDrain: (() => void) | undefined;
  /** Runs while the client reads nothing of what the router has for it. */
  #stall: NodeJS.Timeout | undefined;
  #onClientGone: (() => void) | undefined;
  #responding = false;
  /** undici wrote the whole request to the connection (see {@link onRequestSent}). */
  #written = false;
  /**
   * The engine had the request though it sent no head: a failure before it that is no refusal
   * to connect (its headers timeout), or any end after the request was written (see
   * {@link onRequestSent}). Its GPU time is the request's.
   */
  #heldUnanswered = false;
  /** The engine answered 401: its body is dropped and the request tried elsewhere. */
  #keyRefused = false;
  #sse = false;
  /** Server-sent events relayed, and whether the last chunk ended in `\n`. */
  readonly #events = new EventEndCounter();
  #sent = 0;
  /**
   * The last (up to) four bytes written to the client, oldest in the high byte: whether they
   * end an event decides if an error event needs a blank line first. Starts as the end of one.
   */
  #outTail = EVENT_END_LF;
  #last = 0;
  /** The answer's `usage`, wherever it comes (see `UsageReader`). */
  readonly #usage = new UsageReader();
  /** The upstream's Content-Length, for a JSON answer (not SSE) that declared one. */
  #length = -1;
  /** A JSON answer that arrived whole in its first chunk, held for `res.end(chunk)`. */
  #whole: Buffer | undefined;
  #settled = false;
  /** Takes the usage event the router asked for out of the stream (`Exchange.hideUsage`). */
  #usageFilter: UsageEventFilter | undefined;
  /** This try's start mark in its replica's GPU shares (see `GpuShares`). */
  #gpuMark = 0;
  /** The replica's step rhythm, fed with every chunk it streams (see `StepPhase`). */
  readonly #phase: StepPhase;

  constructor(
    x: Exchange,
    readonly decision: PickDecision,
  ) {
    this.#x = x;
    this.#replicaId = decision.replica.id;
    this.#sentAt = performance.now();
    this.#phase = x.core.picker.stepPhase(this.#replicaId);
  }

  /** Books the request on the replica and dispatches it. Throws on a malformed base URL. */
  start(): void {
    const x = this.#x;
    const { picker, metrics, pools, replicaModel } = x.core;
    const replica = this.decision.replica;
    const signal = x.signal;
    // Both may throw on a malformed base URL: before the replica counts this request.
    const pool = pools.poolFor(replica.baseUrl);
    const path = upstreamPath(replica.baseUrl, x.req.url ?? x.endpoint);
    replicaModel.set(replica.id, x.model);
    this.#prefill = this.decision.prefillTokens;
    const held = x.core.criticalPrefills;
    if (held !== undefined && x.key.priority === "critical" && x.analysis.stream) {
      held.begin(replica.id);
      this.#criticalPrefill = true;
    }
    const tail = quarterTail(x.analysis);
    metrics.replicaInFlight(
      x.model,
      replica.id,
      picker.dispatched(replica.id, x.analysis.chain, this.#prefill, x.precise, tail),
    );
    const d = this.decision;
    x.core.peers?.sent(x.model, {
      replicaId: replica.id,
      prefillTokens: this.#prefill,
      chain: x.analysis.chain,
      ...(tail === undefined ? {} : { tail }),
      ...(d.hint === undefined ? {} : { hint: d.hint, home: d.home === true }),
    });
    if (signal.aborted) {
      this.#clientGone();
      return;
    }
    const onClientGone = (): void => {
      this.#abortUpstream?.(new ClientGoneError());
      // Not connected yet: `onConnect` aborts. Either way undici reports back through onError.
    };
    this.#onClientGone = onClientGone;
    signal.addEventListener("abort", onClientGone);
    const headers: Record<string, string> = {
      "content-type": "application/json",
      "x-request-id": x.engineRequestId,
    };
    const accept = x.req.headers.accept;
    if (accept !== undefined) headers.accept = accept;
    // The replica's own engine key; the client's Authorization (its llmgw key) never leaves.
    // Projected routes carry the header precomputed; a hand-built route may give the key only.
    const authorization =
      replica.authorization ??
      (replica.apiKey === undefined ? undefined : `Bearer ${replica.apiKey}`);
    if (authorization !== undefined) headers.authorization = authorization;
    if (x.core.usage !== undefined) {
      this.#gpuMark = x.core.gpuShares.start(
        replica.id,
        replica.gpus ?? 0,
        this.#sentAt,
        replica.load?.running,
      );
    }
    pool.dispatch({ path, method: "POST", headers, body: x.upstreamBody }, this);
  }

  onConnect(abort: (reason: Error) => void): void {
    this.#abortUpstream = abort;
    if (this.#x.signal.aborted) abort(new ClientGoneError());
  }

  /**
   * undici's, once the request's last byte is written to the connection. Before it nothing reached the
   * engine (a refused connection, a request waiting for one); after it, a try that ends without
   * a head (a reset: the engine crashed while the request was queued or prefilling; the client
   * left) held the engine until then, and its GPU time is charged.
   *
   * The request still gets one usage record, not one per try: a try that held the engine adds
   * its GPU time to `Exchange.gpuMs` and sets `Exchange.engineHeld`, and `Exchange.finish`
   * records the tokens of the try that got an answer (a retry's exact counts stand) or, when
   * none did, charges the request as a stream cut before its first chunk. A pooled connection
   * the engine had just closed (see {@link CLOSED_UNDER_US}) is reset after the write too: that
   * try adds the GPU time of about one round trip, and its retry on a new connection answers.
   */
  onRequestSent(): void {
    this.#written = true;
  }

  onHeaders(status: number, rawHeaders: Buffer[], resumeUpstream: () => void): boolean {
    const x = this.#x;
    const { metrics, log } = x.core;
    this.#resume = resumeUpstream;
    if (status === 401) {
      // The router, not the client, authenticates to engines: a 401 means the engine holds a
      // key the router has not learnt yet (it restarted; the key comes with the next
      // heartbeat). Nothing went to the client, so this is a refusal to try elsewhere.
      this.#keyRefused = true;
      this.#verdict = "failure";
      x.upstreamMayBeReading = true;
      metrics.upstreamError(x.model, this.#replicaId, "key_refused");
      log({
        event: "upstream_error",
        replica: this.#replicaId,
        kind: "key_refused",
        requestId: x.requestId,
      });
      return true; // its body is read and dropped, keeping the connection
    }
    this.#responding = true;
    x.upstreamStatus = status;
    this.#firstByteMs = performance.now() - this.#sentAt;
    if (status >= 500) {
      this.#verdict = "failure";
      metrics.upstreamError(x.model, this.#replicaId, "status_5xx");
    } else {
      x.core.picker.answered(this.#replicaId, this.#firstByteMs);
      this.#verdict = "answered";
    }
    if (status >= 400) x.upstreamMayBeReading = true;
    const contentType = rawHeader(rawHeaders, "content-type");
    const sse = contentType?.startsWith("text/event-stream") ?? false;
    this.#sse = sse;
    const outHeaders: Record<string, string> = {
      "x-request-id": x.requestId,
      "x-llmgw-replica": this.#replicaId,
    };
    if (contentType !== undefined) outHeaders["content-type"] = contentType;
    const length = rawHeader(rawHeaders, "content-length");
    if (length !== undefined && !sse) {
      outHeaders["content-length"] = length;
      this.#length = Number(length);
    }
    if (sse) {
      outHeaders["cache-control"] = "no-cache";
      outHeaders["x-accel-buffering"] = "no";
      if (x.hideUsage) this.#usageFilter = new UsageEventFilter();
    }
    x.res.writeHead(status, outHeaders);
    if (sse) x.res.flushHeaders();
    return true;
  }

  onData(chunk: Buffer): boolean {
    const x = this.#x;
    if (x.signal.aborted || this.#keyRefused) return true;
    const metrics = x.core.metrics;
    const now = performance.now();
    this.#phase.observe(now);
    if (this.#last === 0) {
      metrics.firstByte(x.model, (now - x.started) / 1000);
      this.#prefillDone();
      x.slotPrefilled?.();
    } else metrics.interChunk(x.model, (now - this.#last) / 1000);
    this.#last = now;
    this.#sent += chunk.length;
    this.#usage.push(chunk);
    if (this.#sse && x.countEvents) {
      this.#events.push(chunk);
    }
    if (this.#sent === this.#length && this.#sent === chunk.length) {
      // The whole answer in one chunk (most JSON answers): sent by `res.end(chunk)` in
      // onComplete, one write with the head, where `write` + `end` defers it to a corked tick.
      this.#whole = chunk;
      return true;
    }
    const out = this.#usageFilter === undefined ? chunk : this.#usageFilter.push(chunk);
    if (out.length === 0) return true;
    if (this.#sse) this.#outTail = tailOf(this.#outTail, out);
    if (x.res.write(out)) return true;
    if (this.#onDrain === undefined) {
      const onDrain = (): void => {
        clearTimeout(this.#stall);
        this.#stall = undefined;
        this.#resume?.();
      };
      this.#onDrain = onDrain;
      x.res.on("drain", onDrain);
    }
    // Paused until the client reads: undici's body timeout does not run on a paused body, so
    // a client that never reads would hold the engine's request and the slot for good.
    this.#stall ??= setTimeout(() => this.#stalled(), x.core.options.clientStallTimeoutMs);
    return false;
  }

  onComplete(): void {
    const x = this.#x;
    if (x.signal.aborted) {
      this.#clientGone();
      return;
    }
    if (this.#keyRefused) {
      this.#settle(this.#refusal());
      return;
    }
    x.core.metrics.bytes(x.model, x.endpoint, "out", this.#sent);
    const held = this.#usageFilter?.end();
    if (this.#whole !== undefined) x.res.end(this.#whole);
    else if (held !== undefined) x.res.end(held);
    else x.res.end();
    x.settleUsage(this.#usage.text(), this.#events.count, this.decision.replica);
    this.#settle({ kind: "done" });
  }

  onError(error: Error): void {
    const x = this.#x;
    if (x.signal.aborted) {
      this.#clientGone();
      return;
    }
    if (this.#keyRefused) {
      // Failed while its 401 body was dropped: still a refusal, still nothing sent.
      this.#settle(this.#refusal());
      return;
    }
    const { metrics, log } = x.core;
    const replicaId = this.#replicaId;
    this.#verdict = "failure";
    const code = errorCode(error);
    if (!this.#responding) {
      const timeout = code === "UND_ERR_HEADERS_TIMEOUT";
      const retryable = code !== undefined && RETRYABLE_CONNECT.has(code);
      const kind: UpstreamErrorKind =
        code === "UND_ERR_CONNECT_TIMEOUT" || timeout
          ? "timeout"
          : code === "ECONNREFUSED" || code === "ENOTFOUND" || code === "EHOSTUNREACH"
            ? "connect"
            : "reset_before_response";
      metrics.upstreamError(x.model, replicaId, kind);
      log({ event: "upstream_error", replica: replicaId, kind, code, requestId: x.requestId });
      // Not kept from the engine's queue (not retried), or dropped there after it was written
      // (retried: an engine that crashed): the engine held the request, queued or prefilling,
      // until now.
      if (!retryable || this.#written) this.#heldUnanswered = true;
      this.#settle({
        kind: "failed",
        retryable,
        closedUnderUs: code !== undefined && CLOSED_UNDER_US.has(code),
        timeout,
        message: `replica ${replicaId} failed before responding (${code ?? String(error)})`,
      });
      return;
    }
    metrics.upstreamError(x.model, replicaId, "reset_mid_body");
    log({
      event: "upstream_error",
      replica: replicaId,
      kind: "reset_mid_body",
      code: code ?? String(error),
      requestId: x.requestId,
    });
    if (this.#sse) {
      const event = errorBody(
        FAILURE_HTTP.upstreamUnavailable,
        `replica ${replicaId} failed mid-stream (${code ?? String(error)}); the response is incomplete`,
      );
      // What the filter holds is an unfinished event, perhaps the start of the usage event it
      // hides: dropped. One the client has part of already is ended by a blank line, or the
      // error event would run on inside it and neither could be parsed.
      this.#usageFilter?.end();
      const separator = endsEvent(this.#outTail) ? "" : "\n\n";
      x.res.end(`${separator}data: ${event}\n\n`);
    } else {
      x.res.destroy();
    }
    x.settleUsage(this.#usage.text(), this.#events.count, this.decision.replica);
    this.#settle({ kind: "done" });
  }

  #refusal(): AttemptResult {
    return {
      kind: "failed",
      retryable: true,
      timeout: false,
      keyRefused: true,
      message: `replica ${this.#replicaId} refused the router's engine key; it restarted and its new key has not arrived yet`,
    };
  }

  /** The client read nothing for `clientStallTimeoutMs`: it is treated as gone. */
  #stalled(): void {
    const x = this.#x;
    this.#stall = undefined;
    x.core.log({
      event: "client_stalled",
      requestId: x.requestId,
      replica: this.#replicaId,
      afterMs: x.core.options.clientStallTimeoutMs,
    });
    // Its close aborts the request's ClientGone: the upstream is aborted and the attempt ends
    // as any client's leaving does.
    x.res.destroy();
  }

  #clientGone(): void {
    const x = this.#x;
    x.core.metrics.clientDisconnect(x.model, this.#sent === 0 ? "before_first_byte" : "streaming");
    this.#verdict = "abandoned";
    // What was relayed before the client left is paid for (no-op when nothing was). An engine
    // that had the request and answered nothing yet held it until the upstream was aborted; one
    // that refused the router's key held nothing.
    if (this.#responding)
      x.settleUsage(this.#usage.text(), this.#events.count, this.decision.replica);
    else if (this.#written && !this.#keyRefused) this.#heldUnanswered = true;
    this.#settle({ kind: "done" });
  }

  /** Takes this request's prefill off the replica's queue, once. */
  #prefillDone(): void {
    if (this.#criticalPrefill) {
      this.#criticalPrefill = false;
      this.#x.core.criticalPrefills?.end(this.#replicaId);
    }
    if (this.#prefill === 0) return;
    this.#x.core.picker.prefillDone(this.#replicaId, this.#prefill);
    this.#x.core.peers?.firstByte(this.#replicaId, this.#prefill);
    this.#prefill = 0;
  }

  #settle(result: AttemptResult): void {
    if (this.#settled) return;
    this.#settled = true;
    const x = this.#x;
    const { picker, metrics, replicaModel } = x.core;
    if (this.#onClientGone !== undefined) {
      x.signal.removeEventListener("abort", this.#onClientGone);
    }
    if (this.#onDrain !== undefined) x.res.off("drain", this.#onDrain);
    clearTimeout(this.#stall);
    this.#prefillDone();
    if (this.#heldUnanswered) x.engineHeld = true;
    if (x.core.usage !== undefined) {
      const held = x.core.gpuShares.end(this.#replicaId, this.#gpuMark, performance.now());
      // A try that never reached the engine held nothing there.
      if (this.#responding || this.#heldUnanswered) x.gpuMs += held;
    }
    const left = picker.finished(this.#replicaId, this.#verdict, this.#firstByteMs, x.precise);
    x.core.peers?.ended(this.#replicaId);
    // The admission slot this request holds counted as capacity while it ran on a draining
    // replica; that capacity goes now, before `attemptEnded` frees the slot, so nothing queued
    // is admitted into room the ready replicas do not have.
    const { draining } = x.core;
    if (draining.size !== 0 && draining.has(this.#replicaId)) x.core.refreshCapacity(x.model);
    // Not for a replica that left the table meanwhile: its series is gone for good.
    if (replicaModel.has(this.#replicaId)) metrics.replicaInFlight(x.model, this.#replicaId, left);
    x.attemptEnded(result, this.#replicaId, this.decision);
  }
}

/** `\n\n` as an {@link Attempt}'s last bytes written. */
const EVENT_END_LF = 0x0a0a;

/** `tail` (the last four bytes written, see `Attempt.#outTail`) after `out` is written. */
function tailOf(tail: number, out: Buffer): number {
  let t = tail;
  for (let i = Math.max(0, out.length - 4); i < out.length; i++) {
    t = ((t << 8) | (out[i] as number)) >>> 0;
  }
  return t;
}

/** Whether the last four bytes written, `tail`, end a server-sent event (a blank line). */
function endsEvent(tail: number): boolean {
  const two = tail & 0xffff;
  return two === 0x0a0a || two === 0x0d0d || tail === 0x0d0a0d0a;
}

const pathPrefixes = new Map<string, string>();

/** The replica base URL's path (without trailing `/`) + the request URL, cached per base URL. */
function upstreamPath(baseUrl: string, requestUrl: string): string {
  let prefix = pathPrefixes.get(baseUrl);
  if (prefix === undefined) {
    prefix = new URL(baseUrl).pathname.replace(/\/+$/, "");
    if (pathPrefixes.size > 10_000) pathPrefixes.clear();
    pathPrefixes.set(baseUrl, prefix);
  }
  return prefix + requestUrl;
}

/** First value of header `name` (lower-case) in undici's raw `[name, value, …]` list. */
function rawHeader(raw: Buffer[], name: string): string | undefined {
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const key = raw[i] as Buffer;
    if (key.length === name.length && key.toString("latin1").toLowerCase() === name) {
      return (raw[i + 1] as Buffer).toString("latin1");
    }
  }
  return undefined;
}
