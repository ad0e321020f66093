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
  type ApiKeyInfo,
  type ApiKeyStore,
  createAdmissionController,
  createKeyLimiter,
  createReplicaPicker,
  createRequestAnalyzer,
  noopRouterMetrics,
  type PickDecision,
  POOLED_MIN_BYTES,
  type RejectionReason,
  type ReplicaRoute,
  type RequestAnalysis,
  type RouteResolution,
  type RouterMetricsSink,
  type RouteTable,
  type UpstreamErrorKind,
} from "@llmgw/router";
import { Pool } from "undici";
import { errorBody, FAILURE_HTTP, REJECTION_HTTP, sendError } from "./http-errors.js";
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

  // New replicas (or capacity changes) must reach queued requests, and pools of replicas that
  // left the table are closed.
  const unsubscribe = routeTable.subscribe(() => {
    const live = new Set<string>();
    for (const model of seenModels) {
      const resolution = routeTable.resolve(model);
      if (resolution === undefined) continue;
      for (const r of resolution.replicas) live.add(r.baseUrl);
      admission.setCapacity(resolution.deployment, picker.capacity(resolution));
    }
    for (const [baseUrl, pool] of pools) {
      if (!live.has(baseUrl)) {
        pools.delete(baseUrl);
        void pool.close().catch(() => {});
      }
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

  const handleModels = (req: IncomingMessage, res: ServerResponse): void => {
    const key = authenticate(req);
    const data = routeTable
      .models()
      .filter((id) => key.models === undefined || key.models.includes(id))
      .map((id) => ({ id, object: "model", created: createdAt, owned_by: "llmgw" }));
    const body = JSON.stringify({ object: "list", data });
    res.writeHead(200, {
      "content-type": "application/json",
      "content-length": Buffer.byteLength(body),
    });
    res.end(body);
  };

  /**
   * Reads the whole body. From {@link POOLED_MIN_BYTES} on it lands in a pooled buffer (straight
   * there when the length is declared), which the analyzer may move to its worker and back.
   */
  const readBody = (req: IncomingMessage): Promise<{ body: Uint8Array; pooled: boolean }> => {
    const declared = Number(req.headers["content-length"] ?? Number.NaN);
    if (declared > options.maxBodyBytes) {
      return Promise.reject(tooLarge(options.maxBodyBytes));
    }
    // Node's parser delivers exactly Content-Length bytes (and refuses it with chunked).
    const into =
      Number.isSafeInteger(declared) && declared >= POOLED_MIN_BYTES
        ? analyzer.buffers.take(declared)
        : undefined;
    return new Promise((resolve, reject) => {
      const chunks: Buffer[] = [];
      let size = 0;
      const fail = (error: unknown): void => {
        if (into !== undefined) analyzer.buffers.give(into);
        reject(error);
      };
      const onData = (chunk: Buffer): void => {
        if (
          size + chunk.length > options.maxBodyBytes ||
          (into && size + chunk.length > into.length)
        ) {
          req.off("data", onData);
          req.pause();
          fail(tooLarge(options.maxBodyBytes));
          return;
        }
        if (into === undefined) chunks.push(chunk);
        else into.set(chunk, size);
        size += chunk.length;
      };
      req.on("data", onData);
      req.once("end", () => {
        if (into !== undefined) {
          resolve({ body: into.subarray(0, size), pooled: size === into.length });
        } else if (size >= POOLED_MIN_BYTES) {
          const body = analyzer.buffers.take(size);
          let at = 0;
          for (const chunk of chunks) {
            body.set(chunk, at);
            at += chunk.length;
          }
          resolve({ body, pooled: true });
        } else {
          resolve({
            body: chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks, size),
            pooled: false,
          });
        }
      });
      req.once("error", fail);
    });
  };

  const handleInference = async (
    req: IncomingMessage,
    res: ServerResponse,
    endpoint: string,
    requestId: string,
    started: number,
    ctx: RequestContext,
  ): Promise<void> => {
    const key = authenticate(req);
    const read = await readBody(req);
    const analysisStart = performance.now();
    const analysis: RequestAnalysis = await analyzer.analyze(read.body, read.pooled);
    const request: AnalysedRequest = {
      req,
      res,
      endpoint,
      requestId,
      started,
      ctx,
      key,
      body: read.body,
      analysis,
      analysisStart,
      upstreamWrites: { mayBePending: false },
    };
    try {
      await admitAndProxy(request);
    } finally {
      // Recycled unless an upstream answered an error, perhaps before reading the whole body:
      // its socket could still be writing from this buffer. A 2xx means the engine read it.
      if (read.pooled && !request.upstreamWrites.mayBePending) {
        analyzer.buffers.give(read.body);
      }
    }
  };

  /** A request whose body has been read and analysed. */
  interface AnalysedRequest {
    readonly req: IncomingMessage;
    readonly res: ServerResponse;
    readonly endpoint: string;
    readonly requestId: string;
    readonly started: number;
    readonly ctx: RequestContext;
    readonly key: ApiKeyInfo;
    /** The request body, read (pooled from 16 KiB on) and not changed since. */
    readonly body: Uint8Array;
    readonly analysis: RequestAnalysis;
    readonly analysisStart: number;
    readonly upstreamWrites: { mayBePending: boolean };
  }

  const admitAndProxy = async (request: AnalysedRequest): Promise<void> => {
    const { req, res, endpoint, requestId, started, ctx, key, analysis, analysisStart } = request;
    const upstreamWrites = request.upstreamWrites;
    const body = request.body;
    if (analysis.mode === "pool") {
      const load = analyzer.poolLoad();
      metrics.poolUtilization(load.slots === 0 ? 0 : load.active / load.slots);
    }
    if (!analysis.ok) {
      throw new RejectedError("invalid_request", analysis.message, undefined, analysis.param);
    }
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
    ctx.model = model;
    metrics.bytes(model, endpoint, "in", body.length);
    const routable = picker.routable(resolution);
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
    if (!limit.ok) {
      throw new RejectedError(
        limit.reason,
        `API key ${key.name} exceeded its ${limit.reason === "concurrency" ? "max-concurrency" : limit.reason} limit`,
        limit.retryAfterSeconds,
        undefined,
        key.name,
      );
    }
    const clientGone = new ClientGone();
    ctx.clientGone = clientGone; // aborted by the request's one "close" listener (handle)
    let release: (() => void) | undefined;
    metrics.inFlight(model, 1);
    try {
      let outcome = admission.admit(resolution.deployment, key.id, capacity, clientGone);
      let candidates: readonly ReplicaRoute[] = routable;
      if (outcome instanceof Promise) {
        const queuedAt = performance.now();
        metrics.queueDepth(model, admission.stats(resolution.deployment).queued);
        outcome = await outcome;
        candidates = picker.routable(resolution); // the wait may have changed who is routable
        metrics.queueDepth(model, admission.stats(resolution.deployment).queued);
        metrics.queueWait(
          model,
          (performance.now() - queuedAt) / 1000,
          outcome.admitted ? "admitted" : outcome.reason === "aborted" ? "cancelled" : "timed_out",
        );
      }
      if (!outcome.admitted) {
        if (outcome.reason === "aborted") {
          metrics.clientDisconnect(model, "queued");
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
      release = outcome.release;
      await proxy(req, res, {
        endpoint,
        requestId,
        body,
        upstreamWrites,
        analysis,
        model,
        resolution,
        routable: candidates,
        started,
        analysisStart,
        signal: clientGone,
      });
    } finally {
      release?.();
      limit.release();
      metrics.inFlight(model, -1);
    }
  };

  interface ProxyInput {
    readonly endpoint: string;
    readonly requestId: string;
    readonly body: Uint8Array;
    /** Set when an upstream answered ≥ 400: it may not have read the body (see readBody). */
    readonly upstreamWrites: { mayBePending: boolean };
    readonly analysis: RequestAnalysis & { ok: true };
    readonly model: string;
    readonly resolution: RouteResolution;
    /** Routable replicas when the request was admitted (the first pick's candidates). */
    readonly routable: readonly ReplicaRoute[];
    readonly started: number;
    readonly analysisStart: number;
    readonly signal: ClientGone;
  }

  const proxy = async (req: IncomingMessage, res: ServerResponse, p: ProxyInput): Promise<void> => {
    const tried = new Set<string>();
    let lastError = "";
    for (let attempt = 0; attempt < 2; attempt++) {
      const decision =
        attempt === 0 ? pickOrThrow(p, tried) : picker.pick(p.resolution, p.analysis.chain, tried);
      if (decision === undefined) break;
      if (attempt > 0) metrics.retry(p.model);
      const result = await forward(req, res, p, decision);
      if (result.kind === "done") return;
      tried.add(decision.replica.id);
      lastError = result.message;
      if (!result.retryable) {
        sendError(
          res,
          result.timeout ? FAILURE_HTTP.upstreamTimeout : FAILURE_HTTP.upstreamUnavailable,
          result.message,
        );
        return;
      }
    }
    sendError(
      res,
      FAILURE_HTTP.upstreamUnavailable,
      `no replica of model ${p.model} could be reached${lastError === "" ? "" : `: ${lastError}`}`,
    );
  };

  const pickOrThrow = (p: ProxyInput, tried: ReadonlySet<string>): PickDecision => {
    const decision = picker.pick(p.resolution, p.analysis.chain, tried, p.routable);
    metrics.decision({
      model: p.model,
      policy: p.resolution.policy,
      replicaId: decision?.replica.id ?? "",
      seconds: (performance.now() - p.analysisStart) / 1000,
      score: decision?.score ?? 0,
      prefixBlocks: decision?.prefixBlocks ?? 0,
      chainLength: p.analysis.chain.length,
      affinityVoided: decision?.affinityVoided ?? false,
      missingLoadSignals: decision?.missingLoadSignals ?? false,
      mode: p.analysis.mode,
    });
    if (decision === undefined) {
      throw new RejectedError("no_ready_replica", `no replica of model ${p.model} has room`, 1);
    }
    return decision;
  };

  type ForwardResult =
    | { readonly kind: "done" }
    | {
        readonly kind: "failed";
        readonly retryable: boolean;
        readonly timeout: boolean;
        readonly message: string;
      };

  /**
   * One attempt on one replica, through undici's `dispatch` with a raw handler: each upstream
   * chunk is written to the client as it arrives, with no Readable stream, async iterator or
   * promise per chunk in between (a third of undici's cost per small request here). Backpressure
   * pauses the upstream until the client drains; a client that goes away aborts it.
   */
  const forward = (
    req: IncomingMessage,
    res: ServerResponse,
    p: ProxyInput,
    decision: PickDecision,
  ): Promise<ForwardResult> =>
    new Promise<ForwardResult>((resolve) => {
      const replica = decision.replica;
      replicaModel.set(replica.id, p.model);
      metrics.replicaInFlight(p.model, replica.id, picker.dispatched(replica.id, p.analysis.chain));
      const sentAt = performance.now();
      let verdict: "success" | "failure" | "abandoned" = "abandoned";
      let firstByteMs: number | undefined;
      let abortUpstream: ((reason: Error) => void) | undefined;
      let resume: (() => void) | undefined;
      let paused = false;
      let responding = false;
      let sse = false;
      let sent = 0;
      let last = 0;
      // The last two chunks, decoded only once at the end (usage sits at the end of both JSON
      // answers and streams); nothing is copied per chunk.
      let previous: Buffer | undefined;
      let latest: Buffer | undefined;
      let settled = false;

      const settle = (result: ForwardResult): void => {
        if (settled) return;
        settled = true;
        p.signal.removeEventListener("abort", onClientGone);
        res.off("drain", onDrain);
        metrics.replicaInFlight(
          p.model,
          replica.id,
          picker.finished(replica.id, verdict, firstByteMs),
        );
        resolve(result);
      };
      const clientGone = (): void => {
        metrics.clientDisconnect(p.model, sent === 0 ? "before_first_byte" : "streaming");
        verdict = "abandoned";
        settle({ kind: "done" });
      };
      const onClientGone = (): void => {
        abortUpstream?.(new ClientGoneError());
        // Not connected yet: `onConnect` aborts. Either way undici reports back through onError.
      };
      const onDrain = (): void => {
        if (!paused) return;
        paused = false;
        resume?.();
      };
      if (p.signal.aborted) {
        clientGone();
        return;
      }
      p.signal.addEventListener("abort", onClientGone);
      res.on("drain", onDrain);

      const headers: Record<string, string> = {
        "content-type": "application/json",
        "x-request-id": p.requestId,
      };
      const accept = req.headers.accept;
      if (accept !== undefined) headers.accept = accept;
      poolFor(replica.baseUrl).dispatch(
        {
          path: upstreamPath(replica.baseUrl, req.url ?? p.endpoint),
          method: "POST",
          headers,
          body: p.body,
        },
        {
          onConnect(abort: (reason: Error) => void) {
            abortUpstream = abort;
            if (p.signal.aborted) abort(new ClientGoneError());
          },
          onHeaders(status: number, rawHeaders: Buffer[], resumeUpstream: () => void): boolean {
            resume = resumeUpstream;
            responding = true;
            firstByteMs = performance.now() - sentAt;
            verdict = status >= 500 ? "failure" : "success";
            if (status >= 500) metrics.upstreamError(p.model, replica.id, "status_5xx");
            if (status >= 400) p.upstreamWrites.mayBePending = true;
            const contentType = rawHeader(rawHeaders, "content-type");
            sse = contentType?.startsWith("text/event-stream") ?? false;
            const outHeaders: Record<string, string> = {
              "x-request-id": p.requestId,
              "x-llmgw-replica": replica.id,
            };
            if (contentType !== undefined) outHeaders["content-type"] = contentType;
            const length = rawHeader(rawHeaders, "content-length");
            if (length !== undefined && !sse) outHeaders["content-length"] = length;
            if (sse) {
              outHeaders["cache-control"] = "no-cache";
              outHeaders["x-accel-buffering"] = "no";
            }
            res.writeHead(status, outHeaders);
            if (sse) res.flushHeaders();
            return true;
          },
          onData(chunk: Buffer): boolean {
            if (p.signal.aborted) return true;
            const now = performance.now();
            if (last === 0) metrics.firstByte(p.model, (now - p.started) / 1000);
            else metrics.interChunk(p.model, (now - last) / 1000);
            last = now;
            sent += chunk.length;
            previous = latest;
            latest = chunk;
            if (res.write(chunk)) return true;
            paused = true;
            return false;
          },
          onComplete() {
            if (p.signal.aborted) {
              clientGone();
              return;
            }
            metrics.bytes(p.model, p.endpoint, "out", sent);
            res.end();
            countTokens(p.model, tailText(previous, latest));
            settle({ kind: "done" });
          },
          onError(error: Error) {
            if (p.signal.aborted) {
              clientGone();
              return;
            }
            verdict = "failure";
            const code = errorCode(error);
            if (!responding) {
              const timeout = code === "UND_ERR_HEADERS_TIMEOUT";
              const kind: UpstreamErrorKind =
                code === "UND_ERR_CONNECT_TIMEOUT" || timeout
                  ? "timeout"
                  : code === "ECONNREFUSED" || code === "ENOTFOUND" || code === "EHOSTUNREACH"
                    ? "connect"
                    : "reset_before_response";
              metrics.upstreamError(p.model, replica.id, kind);
              log({
                event: "upstream_error",
                replica: replica.id,
                kind,
                code,
                requestId: p.requestId,
              });
              settle({
                kind: "failed",
                retryable: code !== undefined && RETRYABLE_CONNECT.has(code),
                timeout,
                message: `replica ${replica.id} failed before responding (${code ?? String(error)})`,
              });
              return;
            }
            metrics.upstreamError(p.model, replica.id, "reset_mid_body");
            log({
              event: "upstream_error",
              replica: replica.id,
              kind: "reset_mid_body",
              code: code ?? String(error),
              requestId: p.requestId,
            });
            if (sse) {
              const event = errorBody(
                FAILURE_HTTP.upstreamUnavailable,
                `replica ${replica.id} failed mid-stream (${code ?? String(error)}); the response is incomplete`,
              );
              res.end(`data: ${event}\n\n`);
            } else {
              res.destroy();
            }
            settle({ kind: "done" });
          },
        },
      );
    });

  const countTokens = (model: string, tail: string): void => {
    const prompt = lastNumber(tail, '"prompt_tokens"');
    const completion = lastNumber(tail, '"completion_tokens"');
    if (prompt !== undefined) metrics.tokens(model, "prompt", prompt);
    if (completion !== undefined) metrics.tokens(model, "completion", completion);
  };

  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const started = performance.now();
    const given = headerText(req.headers["x-request-id"]);
    const requestId = given !== undefined && REQUEST_ID.test(given) ? given : randomUUID();
    res.setHeader("x-request-id", requestId);
    const url = req.url ?? "/";
    const q = url.indexOf("?");
    const path = q < 0 ? url : url.slice(0, q);
    const ctx: RequestContext = { model: "", stream: false, clientGone: undefined };
    res.once("close", () => {
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
          sendError(res, FAILURE_HTTP.methodNotAllowed, `Use GET ${path}.`);
          return;
        }
        handleModels(req, res);
        return;
      }
      if (ENDPOINTS.has(path)) {
        if (req.method !== "POST") {
          sendError(res, FAILURE_HTTP.methodNotAllowed, `Use POST ${path}.`);
          return;
        }
        await handleInference(req, res, path, requestId, started, ctx);
        return;
      }
      sendError(res, FAILURE_HTTP.notFound, `Unknown request URL: ${req.method ?? "?"} ${path}.`);
    } catch (error) {
      if (error instanceof RejectedError) {
        metrics.rejected(ctx.model, error.reason, error.keyName);
        const spec = REJECTION_HTTP[error.reason];
        sendError(res, spec, error.message, {
          ...(error.param === undefined ? {} : { param: error.param }),
          ...(error.retryAfterSeconds === undefined
            ? {}
            : { retryAfterSeconds: error.retryAfterSeconds }),
          close: error.reason === "body_too_large",
        });
        if (error.reason === "body_too_large") res.once("finish", () => req.destroy());
        return;
      }
      log({ event: "internal_error", requestId, error: String(error) });
      sendError(res, FAILURE_HTTP.internal, "internal router error");
    }
  };

  const handler = ((req: IncomingMessage, res: ServerResponse): void => {
    handle(req, res).catch((error: unknown) => {
      log({ event: "internal_error", error: String(error) });
      if (!res.headersSent) sendError(res, FAILURE_HTTP.internal, "internal router error");
      else res.destroy();
    });
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

function tailText(previous: Buffer | undefined, latest: Buffer | undefined): string {
  const last =
    latest === undefined ? "" : latest.toString("latin1", Math.max(0, latest.length - 4096));
  if (previous === undefined || last.length >= 4096) return last;
  return previous.toString("latin1", Math.max(0, previous.length - (4096 - last.length))) + last;
}

/**
 * The integer after the last `"key"` and its colon in `text` (JSON whitespace allowed), e.g.
 * the usage counts at the end of an answer. A scan from the end, no regex: this runs once per
 * proxied request.
 */
export function lastNumber(text: string, key: string): number | undefined {
  for (
    let at = text.lastIndexOf(key);
    at >= 0;
    at = at === 0 ? -1 : text.lastIndexOf(key, at - 1)
  ) {
    let i = skipJsonSpace(text, at + key.length);
    if (text.charCodeAt(i) !== 0x3a) continue;
    i = skipJsonSpace(text, i + 1);
    let value = 0;
    let digits = 0;
    for (let c = text.charCodeAt(i); c >= 0x30 && c <= 0x39; c = text.charCodeAt(++i)) {
      value = value * 10 + (c - 0x30);
      digits++;
    }
    if (digits > 0) return value;
  }
  return undefined;
}

function skipJsonSpace(text: string, i: number): number {
  for (let c = text.charCodeAt(i); c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09; ) {
    c = text.charCodeAt(++i);
  }
  return i;
}
