/**
 * The OpenAI-compatible HTTP front of the router: auth, body limits, one analysis per body
 * (inline or in the worker pool), admission, replica choice, and byte-for-byte proxying through
 * one undici `Pool` per replica. Every request gets an answer: a proxied response, an OpenAI
 * error body, or, after the first streamed byte, an SSE error event / a closed socket.
 */
import { randomUUID } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import {
  type AbortSignalLike,
  type AdmissionOutcome,
  type ApiKeyInfo,
  type ApiKeyStore,
  countEventEnds,
  createAdmissionController,
  createKeyLimiter,
  createReplicaPicker,
  createRequestAnalyzer,
  DEFAULT_COMPLETION_TOKEN_ESTIMATE,
  type KeyLease,
  noopRouterMetrics,
  type PickDecision,
  POOLED_MIN_BYTES,
  type RejectionReason,
  type ReplicaRoute,
  type RequestAnalysis,
  type RouteResolution,
  type RouterMetricsSink,
  type RouteTable,
  readUsageCount,
  type UpstreamErrorKind,
  usageTail,
} from "@llmgw/router";
import { Pool } from "undici";
import {
  errorBody,
  FAILURE_HTTP,
  REJECTION_HTTP,
  sendError,
  sendErrorThenDrain,
} from "./http-errors.js";
import {
  type ResolvedRouterServiceOptions,
  type RouterServiceOptions,
  resolveRouterServiceOptions,
} from "./options.js";

/** Inputs of {@link createRouterHandler}. */
export interface RouterHandlerOptions {
  /** Routing state, read locally on every request. */
  readonly routeTable: RouteTable;
  /** Required unless `options.noAuth`. */
  readonly apiKeys?: ApiKeyStore;
  readonly metrics?: RouterMetricsSink;
  readonly options?: RouterServiceOptions;
  /** Receives notable events (circuit transitions, upstream failures) as structured records. */
  readonly log?: (event: Readonly<Record<string, unknown>>) => void;
}

/** A request handler to mount on the public listener, plus its shutdown. */
export interface RouterHandler {
  (req: IncomingMessage, res: ServerResponse): void;
  /** Stops the worker pool and closes upstream connections. */
  close(): Promise<void>;
  /**
   * Worker-pool load for scrape-time sampling (pass it as `createRouterMetrics`'s `workerPool`);
   * `undefined` when the pool is disabled.
   */
  workerPool(): { utilizationRatio: number; queueSize: number } | undefined;
  readonly options: ResolvedRouterServiceOptions;
}

const ENDPOINTS = new Set(["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]);
const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;
const NONE_TRIED: ReadonlySet<string> = new Set();
type OkAnalysis = Extract<RequestAnalysis, { ok: true }>;
const ANONYMOUS: ApiKeyInfo = { id: "anonymous", name: "anonymous" };
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
 * Fires once when the client goes away. Stands in for a per-request `AbortController`, whose
 * `AbortSignal` is an `EventTarget` costing several µs to create, listen on and unlisten from
 * (~5% of the router's CPU per small request in a profile). undici accepts any signal with
 * `aborted` + `addEventListener`, and so does admission ({@link AbortSignalLike}).
 */
class ClientGone implements AbortSignalLike {
  aborted = false;
  #listeners: (() => void)[] | undefined;

  addEventListener(_type: "abort", listener: () => void): void {
    if (this.aborted) return;
    if (this.#listeners === undefined) this.#listeners = [listener];
    else this.#listeners.push(listener);
  }

  removeEventListener(_type: "abort", listener: () => void): void {
    const listeners = this.#listeners;
    const at = listeners?.indexOf(listener) ?? -1;
    if (at >= 0) listeners?.splice(at, 1);
  }

  /** Marks the signal aborted and calls each listener once. */
  abort(): void {
    if (this.aborted) return;
    this.aborted = true;
    const listeners = this.#listeners;
    this.#listeners = undefined;
    if (listeners !== undefined) for (const listener of listeners) listener();
  }
}

/** What one request learns as it goes, for the listener that sees it end. */
interface RequestContext {
  model: string;
  stream: boolean;
  /** Set once the request is admitted: the client going away must reach the upstream. */
  clientGone: ClientGone | undefined;
}

class RejectedError {
  constructor(
    readonly reason: RejectionReason,
    readonly message: string,
    readonly retryAfterSeconds?: number,
    readonly param?: string,
    readonly keyName?: string,
  ) {}
}

/** Creates the router's request handler. */
export function createRouterHandler(input: RouterHandlerOptions): RouterHandler {
  const options = resolveRouterServiceOptions(input.options);
  if (!options.noAuth && input.apiKeys === undefined) {
    throw new TypeError("createRouterHandler: apiKeys is required unless options.noAuth is set");
  }
  const { routeTable } = input;
  const apiKeys = input.apiKeys;
  const metrics = input.metrics ?? noopRouterMetrics;
  const log = input.log ?? (() => {});
  const picker = createReplicaPicker({
    ...options.picker,
    health: {
      ...options.picker.health,
      onCircuitChange: (replicaId, from, to) => {
        metrics.circuitState(replicaModel.get(replicaId) ?? "", replicaId, to);
        log({ event: "circuit", replica: replicaId, from, to });
        options.picker.health?.onCircuitChange?.(replicaId, from, to);
      },
    },
  });
  const admission = createAdmissionController(options.admission);
  const limiter = createKeyLimiter(options.clock === undefined ? {} : { clock: options.clock });
  const analyzer = createRequestAnalyzer(options.analyzer);
  const pools = new Map<string, Pool>();
  /** Replica id → served model name, for replica-scoped metric labels (bounded by replicas). */
  const replicaModel = new Map<string, string>();
  const seenModels = new Set<string>();
  const createdAt = Math.floor(Date.now() / 1000);

  const poolFor = (baseUrl: string): Pool => {
    let pool = pools.get(baseUrl);
    if (pool === undefined) {
      pool = new Pool(new URL(baseUrl).origin, {
        connections: options.upstreamConnections,
        connectTimeout: options.upstreamConnectTimeoutMs,
        headersTimeout: options.upstreamHeadersTimeoutMs,
        bodyTimeout: options.upstreamBodyTimeoutMs,
        keepAliveTimeout: 30_000,
      });
      pools.set(baseUrl, pool);
    }
    return pool;
  };

  // New replicas (or capacity changes) must reach queued requests. Replicas that left the
  // table lose their pool, their routing state and their metric series: replica ids come and go
  // with deployments, and neither the shared in-flight slots nor the series may pile up.
  const unsubscribe = routeTable.subscribe(() => {
    const liveUrls = new Set<string>();
    const liveIds = new Set<string>();
    for (const model of seenModels) {
      const resolution = routeTable.resolve(model);
      if (resolution === undefined) continue;
      for (const r of resolution.replicas) {
        liveUrls.add(r.baseUrl);
        liveIds.add(r.id);
      }
      admission.setCapacity(resolution.deployment, picker.capacity(resolution));
    }
    for (const [baseUrl, pool] of pools) {
      if (!liveUrls.has(baseUrl)) {
        pools.delete(baseUrl);
        void pool.close().catch(() => {});
      }
    }
    for (const [id, model] of replicaModel) {
      if (liveIds.has(id)) continue;
      replicaModel.delete(id);
      picker.forget(id);
      metrics.replicaGone(model, id);
    }
  });

  const authenticate = (req: IncomingMessage): ApiKeyInfo => {
    if (options.noAuth) return ANONYMOUS;
    const header = req.headers.authorization;
    const match = header === undefined ? null : /^Bearer\s+(\S+)\s*$/i.exec(header);
    const key = match?.[1] === undefined ? undefined : apiKeys?.verify(match[1]);
    if (key === undefined) {
      throw new RejectedError(
        header === undefined ? "missing_key" : "unauthorized",
        header === undefined
          ? "Missing API key: send `Authorization: Bearer <key>`."
          : "Incorrect API key provided.",
      );
    }
    return key;
  };

  const handleModels = (req: IncomingMessage, res: ServerResponse, requestId: string): void => {
    const key = authenticate(req);
    const data = routeTable
      .models()
      .filter((id) => key.models === undefined || key.models.includes(id))
      .map((id) => ({ id, object: "model", created: createdAt, owned_by: "llmgw" }));
    const body = JSON.stringify({ object: "list", data });
    res.writeHead(200, {
      "content-type": "application/json",
      "content-length": Buffer.byteLength(body),
      "x-request-id": requestId,
    });
    res.end(body);
  };

  /**
   * Reads the whole body, then calls `onBody` or `onError`, one of them once. From
   * {@link POOLED_MIN_BYTES} on the body lands in a pooled buffer (straight there when the length
   * is declared), which the analyzer's worker reads in place.
   */
  const readBody = (
    req: IncomingMessage,
    onBody: (body: Uint8Array, pooled: boolean) => void,
    onError: (error: unknown) => void,
  ): void => {
    const declared = Number(req.headers["content-length"] ?? Number.NaN);
    if (declared > options.maxBodyBytes) {
      onError(tooLarge(options.maxBodyBytes));
      return;
    }
    // Node's parser delivers exactly Content-Length bytes (and refuses it with chunked).
    const into =
      Number.isSafeInteger(declared) && declared >= POOLED_MIN_BYTES
        ? analyzer.buffers.take(declared)
        : undefined;
    const chunks: Buffer[] = [];
    let size = 0;
    let ended = false;
    const fail = (error: unknown): void => {
      if (ended) return;
      ended = true;
      if (into !== undefined) analyzer.buffers.give(into);
      onError(error);
    };
    const onData = (chunk: Buffer): void => {
      if (
        size + chunk.length > options.maxBodyBytes ||
        (into && size + chunk.length > into.length)
      ) {
        // The answer drains the rest (`sendErrorThenDrain`).
        req.off("data", onData);
        fail(tooLarge(options.maxBodyBytes));
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
        const body = analyzer.buffers.take(size);
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
  };

  /** Answers a request that failed before its first upstream byte (or destroys it after). */
  const answerError = (
    req: IncomingMessage,
    res: ServerResponse,
    ctx: RequestContext,
    requestId: string,
    error: unknown,
  ): void => {
    if (error instanceof RejectedError) {
      metrics.rejected(ctx.model, error.reason, error.keyName);
      const spec = REJECTION_HTTP[error.reason];
      if (error.reason === "body_too_large") {
        sendErrorThenDrain(req, res, spec, error.message, {
          requestId,
          drainMs: options.tooLargeDrainMs,
          drainBytes: options.tooLargeDrainBytes,
        });
        return;
      }
      sendError(res, spec, error.message, {
        requestId,
        ...(error.param === undefined ? {} : { param: error.param }),
        ...(error.retryAfterSeconds === undefined
          ? {}
          : { retryAfterSeconds: error.retryAfterSeconds }),
      });
      return;
    }
    if (error !== undefined && error === req.errored) {
      // The request stream failed: the client went away, or the listener's deadline closed a
      // client too slow to send its request. The client's doing, and nobody is left to answer.
      metrics.clientDisconnect(ctx.model, "before_first_byte");
      log({ event: "client_closed", requestId, phase: "request", code: errorCode(error) });
      res.destroy();
      return;
    }
    log({ event: "internal_error", requestId, error: String(error) });
    sendError(res, FAILURE_HTTP.internal, "internal router error", { requestId });
  };

  /**
   * One inference request from its read body to its answer: analysis, admission, replica choice
   * and at most two upstream {@link Attempt}s. Each stage calls the next directly, through a
   * promise only where it really waits (a worker's analysis, a queued admission): a chain of
   * async functions here cost ~8 KB of allocation per request (suspended frames, promises,
   * closures), the largest share of the router's own.
   *
   * Every path ends in {@link Exchange.finish}, once: it frees the admission slot, the key's
   * concurrency and the pooled body.
   */
  class Exchange {
    model = "";
    analysisStart = 0;
    // Set by `#admit`, before any later stage runs:
    analysis!: OkAnalysis;
    resolution!: RouteResolution;
    /** Routable replicas when the request was admitted (the first pick's candidates). */
    routable: readonly ReplicaRoute[] = [];
    /** Aborted when the client goes away; that must reach the upstream. */
    signal!: ClientGone;
    /** Set when an upstream answered ≥ 400: it may not have read the body (see `finish`). */
    upstreamMayBeReading = false;
    /**
     * Whether attempts count a stream's events: only where they can settle the key (a tpm key
     * and no output limit, so the reservation is the flat default). Otherwise the reservation
     * already bounds the answer, and counting would be one more pass over every byte.
     */
    countEvents = false;
    /** Whether every attempt so far was refused for the router's engine key. */
    #keyRefusedOnly = true;
    /** Replicas that failed before answering. */
    #tried: Set<string> | undefined;
    /** The key's hold: its concurrency slot and tpm reservation, settled by the answer. */
    #lease: KeyLease | undefined;
    #slotRelease: (() => void) | undefined;
    #finished = false;

    constructor(
      readonly req: IncomingMessage,
      readonly res: ServerResponse,
      readonly endpoint: string,
      readonly requestId: string,
      readonly started: number,
      readonly ctx: RequestContext,
      readonly key: ApiKeyInfo,
      /** The request body, read (pooled from 16 KiB on) and not changed since. */
      readonly body: Uint8Array,
      readonly pooled: boolean,
    ) {}

    analyse(): void {
      try {
        this.analysisStart = performance.now();
        const analysis = analyzer.analyze(this.body, this.pooled);
        if (analysis instanceof Promise) {
          analysis.then(
            (a) => this.#admit(a),
            (error: unknown) => this.fail(error),
          );
        } else {
          this.#admit(analysis);
        }
      } catch (error) {
        this.fail(error);
      }
    }

    #admit(analysis: RequestAnalysis): void {
      try {
        const { ctx, key, endpoint } = this;
        if (analysis.mode === "pool") {
          const load = analyzer.poolLoad();
          metrics.poolUtilization(load.slots === 0 ? 0 : load.active / load.slots);
        }
        if (!analysis.ok) {
          throw new RejectedError("invalid_request", analysis.message, undefined, analysis.param);
        }
        this.analysis = analysis;
        const model = analysis.model;
        ctx.stream = analysis.stream;
        if (key.models !== undefined && !key.models.includes(model)) {
          throw new RejectedError(
            "forbidden_model",
            `The model \`${model}\` does not exist or you do not have access to it.`,
            undefined,
            "model",
          );
        }
        const resolution = routeTable.resolve(model);
        if (resolution === undefined) {
          throw new RejectedError(
            "unknown_model",
            `The model \`${model}\` does not exist or you do not have access to it.`,
            undefined,
            "model",
          );
        }
        seenModels.add(model);
        this.model = model;
        this.resolution = resolution;
        ctx.model = model;
        metrics.bytes(model, endpoint, "in", this.body.length);
        const routable = picker.routable(resolution);
        this.routable = routable;
        metrics.replicasAvailable(model, routable.length);
        let capacity = 0;
        for (const r of routable) capacity += Math.max(1, r.capacity);
        if (capacity === 0) {
          if (resolution.loading) {
            throw new RejectedError("model_loading", `model ${model} is loading; retry shortly`, 5);
          }
          throw new RejectedError("no_ready_replica", `no ready replica for model ${model}`, 5);
        }
        const limit = limiter.acquire(key, analysis.estimatedTokens);
        if (!limit.ok && limit.retryAfterSeconds === undefined) {
          // No Retry-After: no wait would ever admit it.
          throw new RejectedError(
            "tpm",
            `request reserves ${limit.reserved} tokens, more than API key ${key.name}'s tpm of ${limit.tpm}; lower max_tokens / max_completion_tokens (or n / best_of)`,
            undefined,
            undefined,
            key.name,
          );
        }
        if (!limit.ok) {
          throw new RejectedError(
            limit.reason,
            `API key ${key.name} exceeded its ${limit.reason === "concurrency" ? "max-concurrency" : limit.reason} limit`,
            limit.retryAfterSeconds,
            undefined,
            key.name,
          );
        }
        this.#lease = limit;
        this.countEvents = key.tpm !== undefined && analysis.maxTokens === undefined;
        metrics.inFlight(model, 1);
        const signal = new ClientGone();
        this.signal = signal;
        ctx.clientGone = signal; // aborted by the request's one "close" listener (handle)
        const outcome = admission.admit(resolution.deployment, key.id, capacity, signal);
        if (outcome instanceof Promise) {
          const queuedAt = performance.now();
          metrics.queueDepth(model, admission.stats(resolution.deployment).queued);
          outcome.then(
            (o) => this.#admitted(o, queuedAt),
            (error: unknown) => this.fail(error),
          );
        } else {
          this.#admitted(outcome, undefined);
        }
      } catch (error) {
        this.fail(error);
      }
    }

    #admitted(outcome: AdmissionOutcome, queuedAt: number | undefined): void {
      try {
        const model = this.model;
        const resolution = this.resolution;
        if (queuedAt !== undefined) {
          this.routable = picker.routable(resolution); // the wait may have changed who is routable
          metrics.queueDepth(model, admission.stats(resolution.deployment).queued);
          metrics.queueWait(
            model,
            (performance.now() - queuedAt) / 1000,
            outcome.admitted
              ? "admitted"
              : outcome.reason === "aborted"
                ? "cancelled"
                : "timed_out",
          );
        }
        if (!outcome.admitted) {
          if (outcome.reason === "aborted") {
            metrics.clientDisconnect(model, "queued");
            this.finish();
            return;
          }
          throw new RejectedError(
            outcome.reason,
            outcome.reason === "queue_full"
              ? `model ${model} is at capacity and its queue is full`
              : `model ${model} is at capacity; the request waited too long in the queue`,
            outcome.retryAfterSeconds,
          );
        }
        this.#slotRelease = outcome.release;
        const decision = pickOrThrow(this);
        new Attempt(this, decision).start();
      } catch (error) {
        this.fail(error);
      }
    }

    /**
     * Called once per attempt. A connect failure or refusal before any byte is tried once more
     * on the next-best replica not tried yet.
     */
    attemptEnded(result: AttemptResult, replicaId: string): void {
      try {
        if (result.kind === "done") {
          this.finish();
          return;
        }
        const tried = this.#tried ?? new Set<string>();
        this.#tried = tried;
        tried.add(replicaId);
        if (!result.keyRefused) this.#keyRefusedOnly = false;
        if (!result.retryable) {
          sendError(
            this.res,
            result.timeout ? FAILURE_HTTP.upstreamTimeout : FAILURE_HTTP.upstreamUnavailable,
            result.message,
            { requestId: this.requestId },
          );
          this.finish();
          return;
        }
        const decision =
          tried.size < 2 ? picker.pick(this.resolution, this.analysis.chain, tried) : undefined;
        if (decision !== undefined) {
          metrics.retry(this.model);
          // Not from inside the failed dispatch's own callback.
          queueMicrotask(() => {
            try {
              new Attempt(this, decision).start();
            } catch (error) {
              this.fail(error);
            }
          });
          return;
        }
        if (this.#keyRefusedOnly) {
          // The key arrives with the replica's next heartbeat: worth retrying shortly.
          sendError(
            this.res,
            FAILURE_HTTP.engineKeyRefused,
            tried.size === 1 ? result.message : `every replica tried: ${result.message}`,
            { requestId: this.requestId, retryAfterSeconds: 1 },
          );
        } else {
          sendError(
            this.res,
            FAILURE_HTTP.upstreamUnavailable,
            `no replica of model ${this.model} could be reached: ${result.message}`,
            { requestId: this.requestId },
          );
        }
        this.finish();
      } catch (error) {
        this.fail(error);
      }
    }

    /**
     * Records the answer's `usage` and settles the key's tpm reservation with it (prompt +
     * completion; an embedding has prompt tokens only). A stream that reports no usage is
     * settled with its events as a lower bound of what it generated (less the role-only first
     * event and `[DONE]`), when that exceeds the reservation: a request without an output limit
     * may not run on the 256 tokens reserved for it. Anything else keeps the reservation.
     * Called on every way an answer ends, cut short too: a client that leaves mid-stream pays
     * for what it was sent.
     */
    settleUsage(tail: string, sseEvents: number): void {
      const prompt = readUsageCount(tail, "prompt_tokens");
      const completion = readUsageCount(tail, "completion_tokens");
      if (prompt !== undefined) metrics.tokens(this.model, "prompt", prompt);
      if (completion !== undefined) metrics.tokens(this.model, "completion", completion);
      const lease = this.#lease;
      if (lease === undefined) return;
      if (
        prompt !== undefined &&
        (completion !== undefined || this.endpoint === "/v1/embeddings")
      ) {
        lease.settle(prompt + (completion ?? 0));
        return;
      }
      const { estimatedTokens, maxTokens, choices } = this.analysis;
      const floor =
        estimatedTokens -
        (maxTokens ?? DEFAULT_COMPLETION_TOKEN_ESTIMATE) * (choices ?? 1) +
        sseEvents -
        2;
      if (floor > estimatedTokens) lease.settle(floor);
    }

    fail(error: unknown): void {
      this.finish();
      try {
        answerError(this.req, this.res, this.ctx, this.requestId, error);
      } catch (unexpected) {
        // Called from promise callbacks too: nothing may escape into an unhandled rejection.
        log({ event: "internal_error", requestId: this.requestId, error: String(unexpected) });
        this.res.destroy();
      }
    }

    finish(): void {
      if (this.#finished) return;
      this.#finished = true;
      this.#slotRelease?.();
      if (this.#lease !== undefined) {
        this.#lease.release();
        metrics.inFlight(this.model, -1);
      }
      // Recycled unless an upstream answered an error, perhaps before reading the whole body:
      // its socket could still be writing from this buffer. A 2xx means the engine read it.
      if (this.pooled && !this.upstreamMayBeReading) analyzer.buffers.give(this.body);
    }
  }

  const pickOrThrow = (x: Exchange): PickDecision => {
    const { analysis, resolution } = x;
    const decision = picker.pick(resolution, analysis.chain, NONE_TRIED, x.routable);
    metrics.decision({
      model: x.model,
      policy: resolution.policy,
      replicaId: decision?.replica.id ?? "",
      seconds: (performance.now() - x.analysisStart) / 1000,
      score: decision?.score ?? 0,
      prefixBlocks: decision?.prefixBlocks ?? 0,
      chainLength: analysis.chain.length,
      affinityVoided: decision?.affinityVoided ?? false,
      missingLoadSignals: decision?.missingLoadSignals ?? false,
      mode: analysis.mode,
    });
    if (decision === undefined) {
      throw new RejectedError("no_ready_replica", `no replica of model ${x.model} has room`, 1);
    }
    return decision;
  };

  type AttemptResult =
    | { readonly kind: "done" }
    | {
        readonly kind: "failed";
        readonly retryable: boolean;
        readonly timeout: boolean;
        readonly message: string;
        /** The engine answered 401 to the router's engine key (see `Attempt.onHeaders`). */
        readonly keyRefused?: boolean;
      };

  /**
   * One try on one replica, and undici's raw `dispatch` handler for it: each upstream chunk is
   * written to the client as it arrives, with no Readable stream, async iterator or promise per
   * chunk in between (a third of undici's cost per small request here). Backpressure pauses the
   * upstream until the client drains; a client that goes away aborts it. Ends by calling
   * {@link Exchange.attemptEnded} once.
   */
  class Attempt {
    readonly #x: Exchange;
    readonly #replicaId: string;
    readonly #sentAt: number;
    #verdict: "success" | "failure" | "abandoned" = "abandoned";
    #firstByteMs: number | undefined;
    #abortUpstream: ((reason: Error) => void) | undefined;
    #resume: (() => void) | undefined;
    #onDrain: (() => void) | undefined;
    #onClientGone: (() => void) | undefined;
    #responding = false;
    /** The engine answered 401: its body is dropped and the request tried elsewhere. */
    #keyRefused = false;
    #sse = false;
    /** Server-sent events relayed, and whether the last chunk ended in `\n`. */
    #events = 0;
    #endedInNewline = false;
    #sent = 0;
    #last = 0;
    // The last two chunks, decoded only once at the end (usage sits at the end of both JSON
    // answers and streams); nothing is copied per chunk.
    #previous: Buffer | undefined;
    #latest: Buffer | undefined;
    /** The upstream's Content-Length, for a JSON answer (not SSE) that declared one. */
    #length = -1;
    /** A JSON answer that arrived whole in its first chunk, held for `res.end(chunk)`. */
    #whole: Buffer | undefined;
    #settled = false;

    constructor(
      x: Exchange,
      readonly decision: PickDecision,
    ) {
      this.#x = x;
      this.#replicaId = decision.replica.id;
      this.#sentAt = performance.now();
    }

    start(): void {
      const x = this.#x;
      const replica = this.decision.replica;
      const signal = x.signal;
      // Both may throw on a malformed base URL: before the replica counts this request.
      const pool = poolFor(replica.baseUrl);
      const path = upstreamPath(replica.baseUrl, x.req.url ?? x.endpoint);
      replicaModel.set(replica.id, x.model);
      metrics.replicaInFlight(x.model, replica.id, picker.dispatched(replica.id, x.analysis.chain));
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
        "x-request-id": x.requestId,
      };
      const accept = x.req.headers.accept;
      if (accept !== undefined) headers.accept = accept;
      // The replica's own engine key; the client's Authorization (its llmgw key) never leaves.
      // Projected routes carry the header precomputed; a hand-built route may give the key only.
      const authorization =
        replica.authorization ??
        (replica.apiKey === undefined ? undefined : `Bearer ${replica.apiKey}`);
      if (authorization !== undefined) headers.authorization = authorization;
      pool.dispatch(
        {
          path,
          method: "POST",
          headers,
          body: x.body,
        },
        this,
      );
    }

    onConnect(abort: (reason: Error) => void): void {
      this.#abortUpstream = abort;
      if (this.#x.signal.aborted) abort(new ClientGoneError());
    }

    onHeaders(status: number, rawHeaders: Buffer[], resumeUpstream: () => void): boolean {
      const x = this.#x;
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
      this.#firstByteMs = performance.now() - this.#sentAt;
      this.#verdict = status >= 500 ? "failure" : "success";
      if (status >= 500) metrics.upstreamError(x.model, this.#replicaId, "status_5xx");
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
      }
      x.res.writeHead(status, outHeaders);
      if (sse) x.res.flushHeaders();
      return true;
    }

    onData(chunk: Buffer): boolean {
      const x = this.#x;
      if (x.signal.aborted || this.#keyRefused) return true;
      const now = performance.now();
      if (this.#last === 0) metrics.firstByte(x.model, (now - x.started) / 1000);
      else metrics.interChunk(x.model, (now - this.#last) / 1000);
      this.#last = now;
      this.#sent += chunk.length;
      this.#previous = this.#latest;
      this.#latest = chunk;
      if (this.#sse && x.countEvents) {
        this.#events += countEventEnds(chunk, this.#endedInNewline);
        this.#endedInNewline = chunk[chunk.length - 1] === 0x0a;
      }
      if (this.#sent === this.#length && this.#sent === chunk.length) {
        // The whole answer in one chunk (most JSON answers): sent by `res.end(chunk)` in
        // onComplete, one write with the head, where `write` + `end` defers it to a corked tick.
        this.#whole = chunk;
        return true;
      }
      if (x.res.write(chunk)) return true;
      if (this.#onDrain === undefined) {
        const onDrain = (): void => this.#resume?.();
        this.#onDrain = onDrain;
        x.res.on("drain", onDrain);
      }
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
      metrics.bytes(x.model, x.endpoint, "out", this.#sent);
      if (this.#whole === undefined) x.res.end();
      else x.res.end(this.#whole);
      x.settleUsage(usageTail(this.#previous, this.#latest), this.#events);
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
      const replicaId = this.#replicaId;
      this.#verdict = "failure";
      const code = errorCode(error);
      if (!this.#responding) {
        const timeout = code === "UND_ERR_HEADERS_TIMEOUT";
        const kind: UpstreamErrorKind =
          code === "UND_ERR_CONNECT_TIMEOUT" || timeout
            ? "timeout"
            : code === "ECONNREFUSED" || code === "ENOTFOUND" || code === "EHOSTUNREACH"
              ? "connect"
              : "reset_before_response";
        metrics.upstreamError(x.model, replicaId, kind);
        log({ event: "upstream_error", replica: replicaId, kind, code, requestId: x.requestId });
        this.#settle({
          kind: "failed",
          retryable: code !== undefined && RETRYABLE_CONNECT.has(code),
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
        x.res.end(`data: ${event}\n\n`);
      } else {
        x.res.destroy();
      }
      x.settleUsage(usageTail(this.#previous, this.#latest), this.#events);
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

    #clientGone(): void {
      metrics.clientDisconnect(this.#x.model, this.#sent === 0 ? "before_first_byte" : "streaming");
      this.#verdict = "abandoned";
      // What was relayed before the client left is paid for (no-op when nothing was).
      if (this.#responding)
        this.#x.settleUsage(usageTail(this.#previous, this.#latest), this.#events);
      this.#settle({ kind: "done" });
    }

    #settle(result: AttemptResult): void {
      if (this.#settled) return;
      this.#settled = true;
      const x = this.#x;
      if (this.#onClientGone !== undefined) {
        x.signal.removeEventListener("abort", this.#onClientGone);
      }
      if (this.#onDrain !== undefined) x.res.off("drain", this.#onDrain);
      const left = picker.finished(this.#replicaId, this.#verdict, this.#firstByteMs);
      // Not for a replica that left the table meanwhile: its series is gone for good.
      if (replicaModel.has(this.#replicaId))
        metrics.replicaInFlight(x.model, this.#replicaId, left);
      x.attemptEnded(result, this.#replicaId);
    }
  }

  const handler = ((req: IncomingMessage, res: ServerResponse): void => {
    const started = performance.now();
    const given = headerText(req.headers["x-request-id"]);
    const requestId = given !== undefined && REQUEST_ID.test(given) ? given : randomUUID();
    const url = req.url ?? "/";
    const q = url.indexOf("?");
    const path = q < 0 ? url : url.slice(0, q);
    const ctx: RequestContext = { model: "", stream: false, clientGone: undefined };
    res.on("close", () => {
      if (!res.writableFinished) ctx.clientGone?.abort();
      metrics.requestFinished({
        model: ctx.model,
        endpoint: path,
        status: res.writableFinished ? res.statusCode : 499,
        stream: ctx.stream,
        seconds: (performance.now() - started) / 1000,
      });
    });
    try {
      if (path === "/v1/models") {
        if (req.method !== "GET") {
          sendError(res, FAILURE_HTTP.methodNotAllowed, `Use GET ${path}.`, { requestId });
          return;
        }
        handleModels(req, res, requestId);
        return;
      }
      if (ENDPOINTS.has(path)) {
        if (req.method !== "POST") {
          sendError(res, FAILURE_HTTP.methodNotAllowed, `Use POST ${path}.`, { requestId });
          return;
        }
        const key = authenticate(req);
        readBody(
          req,
          (body, pooled) => {
            new Exchange(req, res, path, requestId, started, ctx, key, body, pooled).analyse();
          },
          (error) => answerError(req, res, ctx, requestId, error),
        );
        return;
      }
      sendError(res, FAILURE_HTTP.notFound, `Unknown request URL: ${req.method ?? "?"} ${path}.`, {
        requestId,
      });
    } catch (error) {
      answerError(req, res, ctx, requestId, error);
    }
  }) as RouterHandler;
  Object.defineProperty(handler, "options", { value: options });
  handler.workerPool = () => {
    const load = analyzer.poolLoad();
    return load.slots === 0
      ? undefined
      : { utilizationRatio: Math.min(1, load.active / load.slots), queueSize: load.queued };
  };
  handler.close = async () => {
    unsubscribe();
    await analyzer.close();
    await Promise.all([...pools.values()].map((p) => p.destroy().catch(() => {})));
    pools.clear();
  };
  return handler;
}

function tooLarge(max: number): RejectedError {
  return new RejectedError("body_too_large", `request body exceeds the limit of ${max} bytes`);
}

const pathPrefixes = new Map<string, string>();

function upstreamPath(baseUrl: string, requestUrl: string): string {
  let prefix = pathPrefixes.get(baseUrl);
  if (prefix === undefined) {
    prefix = new URL(baseUrl).pathname.replace(/\/+$/, "");
    if (pathPrefixes.size > 10_000) pathPrefixes.clear();
    pathPrefixes.set(baseUrl, prefix);
  }
  return prefix + requestUrl;
}

/** The reason undici gets when the client went away (never shown to anyone). */
class ClientGoneError extends Error {
  constructor() {
    super("client disconnected");
    this.name = "ClientGoneError";
  }
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

function headerText(value: string | string[] | undefined): string | undefined {
  return Array.isArray(value) ? value[0] : value;
}

function errorCode(error: unknown): string | undefined {
  let e: unknown = error;
  for (let depth = 0; depth < 4 && typeof e === "object" && e !== null; depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string") return code;
    e = (e as { cause?: unknown }).cause;
  }
  return undefined;
}
