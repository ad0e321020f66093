/**
 * One inference request from its read body to its answer, over an explicit {@link RouterCore}:
 * analysis, key limits, admission, replica choice and at most two upstream {@link Attempt}s.
 */
import { randomBytes } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import { saltKey, tokenBlockKeys } from "@llmgw/kv-events/token-blocks";
import {
  type AbortSignalLike,
  type AdmissionOutcome,
  type ApiKeyInfo,
  appendMembers,
  DEFAULT_COMPLETION_TOKEN_ESTIMATE,
  isolationMembers,
  isolationScope,
  type LimitLease,
  type LimitNever,
  type LimitReason,
  type LimitRefusal,
  MAX_HINT_LENGTH,
  type PickDecision,
  type PreciseFallbackReason,
  type PriorityClass,
  type ReplicaRoute,
  type RequestAnalysis,
  type RequestHint,
  type RequestUsage,
  type RouteResolution,
  readAnswerUsage,
} from "@llmgw/router";
import { Attempt, type AttemptResult } from "./attempt.js";
import { errorCode } from "./error-code.js";
import { FAILURE_HTTP, REJECTION_HTTP, sendError, sendErrorThenDrain } from "./http-errors.js";
import { RejectedError } from "./rejection.js";
import type { RouterCore } from "./router-core.js";
import { type TokenizeResult, tokenizerFor } from "./tokenizer.js";

type OkAnalysis = Extract<RequestAnalysis, { ok: true }>;

/** {@link Exchange.hint} of a request. */
function hintOf(
  analysis: OkAnalysis,
  req: IncomingMessage,
  sessionHeader: string | undefined,
): RequestHint | undefined {
  const body = analysis.hint;
  if (body?.source === "prompt_cache_key" || sessionHeader === undefined) return body;
  const header = req.headers[sessionHeader];
  const value = Array.isArray(header) ? header[0] : header;
  if (value === undefined || value.length === 0) return body;
  return {
    source: "header",
    value: value.length > MAX_HINT_LENGTH ? value.slice(0, MAX_HINT_LENGTH) : value,
  };
}
const NONE_TRIED: ReadonlySet<string> = new Set();

/**
 * A class as vLLM's `priority` field (`--scheduling-policy priority`: lower values are
 * scheduled first, and may preempt higher ones).
 */
const ENGINE_PRIORITY: Readonly<Record<PriorityClass, number>> = {
  critical: 0,
  standard: 1,
  batch: 2,
};

const LIMIT_NAMES: Readonly<Record<LimitReason, string>> = {
  "key-rpm": "rpm",
  "key-tpm": "tpm",
  "key-concurrency": "max-concurrency",
  "key-budget": "token budget",
  "tenant-rpm": "rpm",
  "tenant-tpm": "tpm",
  "tenant-concurrency": "max-concurrency",
  "tenant-budget": "token budget",
};

/** The message of a 429 for a key's or its tenant's limit. */
function limitMessage(key: ApiKeyInfo, limit: LimitRefusal | LimitNever): string {
  const who = limit.reason.startsWith("key-")
    ? `API key ${key.name}`
    : `tenant ${key.tenant?.name ?? ""}`;
  const b = limit.budget;
  const what =
    b === undefined
      ? LIMIT_NAMES[limit.reason]
      : `${b.period === "day" ? "daily" : "monthly"} token budget${b.model === undefined ? "" : ` for model ${b.model}`}`;
  if (limit.retryAfterSeconds === undefined) {
    // No Retry-After: no wait would ever admit it.
    return `request reserves ${limit.reserved} tokens, more than ${who}'s ${what} of ${limit.limit}; lower max_tokens / max_completion_tokens (or n / best_of)`;
  }
  return b === undefined
    ? `${who} exceeded its ${what} limit`
    : `${who} used up its ${what} of ${b.tokens} tokens; it renews at the next UTC ${b.period === "day" ? "midnight" : "month"}`;
}

/**
 * Fires once when the client goes away. Stands in for a per-request `AbortController`, whose
 * `AbortSignal` is an `EventTarget` costing several µs to create, listen on and unlisten from
 * (~5% of the router's CPU per small request in a profile). undici accepts any signal with
 * `aborted` + `addEventListener`, and so does admission ({@link AbortSignalLike}).
 */
export class ClientGone implements AbortSignalLike {
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
export interface RequestContext {
  model: string;
  stream: boolean;
  /**
   * Aborted when the client goes away before its answer ended, whenever that is: while its body
   * is read or analysed, queued, or streaming. Admission and the upstream listen to it.
   */
  readonly clientGone: ClientGone;
}

/**
 * Answers a request that failed before its first upstream byte (or destroys it after): a
 * {@link RejectedError} as its OpenAI error, a failed request stream (the client left, or was
 * too slow) by destroying the response, anything else as a 500 that names no detail.
 */
export function answerError(
  core: RouterCore,
  req: IncomingMessage,
  res: ServerResponse,
  ctx: RequestContext,
  requestId: string,
  error: unknown,
): void {
  const { metrics, log, options } = core;
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
      ...(spec.status === 429 ? { limit: error.reason } : {}),
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
}

/**
 * One inference request from its read body to its answer. Each stage calls the next directly,
 * through a promise only where it really waits (a worker's analysis, a queued admission): a
 * chain of async functions here cost ~8 KB of allocation per request (suspended frames,
 * promises, closures), the largest share of the router's own. One object per request, one
 * {@link Attempt} per try.
 *
 * Every path ends in {@link Exchange.finish}, once: it frees the admission slot, the key's
 * concurrency and the pooled body.
 */
export class Exchange {
  model = "";
  analysisStart = 0;
  #engineRequestId: string | undefined;
  /**
   * The request's cache-isolation scope (`isolationScope`), when the router isolates: it then
   * goes to its engine salted, embeddings too (vLLM's pooling requests take `cache_salt`, and
   * it caches prefixes of causal last-token-pooling embedding models by default).
   */
  #scope: string | undefined;
  // Set by `#admit`, before any later stage runs:
  analysis!: OkAnalysis;
  resolution!: RouteResolution;
  /**
   * The request's affinity hint: the body's `prompt_cache_key`, else the session header, else
   * the body's `safety_identifier` or `user` (undefined: none).
   */
  hint: RequestHint | undefined;
  /** Prefix blocks the router expected the chosen replica to hold (the last pick's). */
  predictedBlocks = 0;
  /** Where {@link predictedBlocks} came from. */
  prefixSource: "precise" | "approximate" = "approximate";
  /** The prompt's token-block keys, when precise mode matched it (kept for a retry). */
  precise: Float64Array | undefined;
  /** Routable replicas when the request was admitted (the first pick's candidates). */
  routable: readonly ReplicaRoute[] = [];
  /** Aborted when the client goes away; that must reach the upstream. */
  signal!: ClientGone;
  /** Set when an upstream answered ≥ 400: it may not have read the body (see `finish`). */
  upstreamMayBeReading = false;
  /**
   * The status of the answer relayed to the client, once an attempt got one (a 401 to the
   * router's engine key is no answer: it is tried elsewhere); 0 while none did. A request that
   * ends with none ran on no engine and is charged nothing, unless an engine held it without
   * answering (see {@link engineHeld}).
   */
  upstreamStatus = 0;
  /**
   * Whether attempts count a stream's events: only where they can settle the key (a tpm key
   * and no output limit, so the reservation is the flat default). Otherwise the reservation
   * already bounds the answer, and counting would be one more pass over every byte.
   */
  countEvents = false;
  /**
   * The body sent upstream: {@link body}, or a copy with members the router added (see
   * {@link upstreamBodyOf}). Set before the first attempt.
   */
  upstreamBody!: Uint8Array;
  /**
   * Whether the router asked the engine for a stream's usage the client did not ask for: the
   * attempt takes that event out of what the client receives.
   */
  hideUsage = false;
  /** GPU-ms this request held, over its attempts (see `GpuShares`). */
  gpuMs = 0;
  /**
   * Whether an engine had the request on a try that got no answer (its headers timeout, a crash
   * or the client leaving after the request was written: see `Attempt.onRequestSent`). That
   * try's GPU time is in {@link gpuMs}; a request no try answered is charged as a stream cut
   * before its first chunk (see {@link finish}).
   */
  engineHeld = false;
  /** What the answer used, once settled (see {@link settleUsage}). */
  #used: RequestUsage | undefined;
  /** Whether every attempt so far was refused for the router's engine key. */
  #keyRefusedOnly = true;
  /** Attempts that failed in a way worth retrying; after the first, none is. */
  #attempts = 0;
  /** Replicas that failed before answering. */
  #tried: Set<string> | undefined;
  /** The key's hold: its concurrency slot and tpm reservation, settled by the answer. */
  #lease: LimitLease | undefined;
  #slotRelease: (() => void) | undefined;
  /** Tells admission the first byte came (its prefill no longer holds others back). */
  slotPrefilled: (() => void) | undefined;
  #finished = false;

  constructor(
    readonly core: RouterCore,
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

  /**
   * The `X-Request-Id` the engine gets. vLLM takes it as its own request id, and ids that meet
   * in one engine collide (before vllm#27987 a second request with a running id failed, and
   * aborting one could abort the other). An id the router made is unique already; one the
   * client chose gets a random suffix, so no client can meet another's id, and logs still
   * match it by prefix. Random, not counted: vLLM answers with the id (`chatcmpl-<id>`), and
   * a counter would tell a client how many requests others sent between two of its own.
   */
  get engineRequestId(): string {
    if (this.#engineRequestId === undefined) {
      this.#engineRequestId =
        this.req.headers["x-request-id"] === this.requestId
          ? `${this.requestId}.${randomBytes(8).toString("hex")}`
          : this.requestId;
    }
    return this.#engineRequestId;
  }

  /** Starts the request: every later stage follows from here. */
  analyse(): void {
    try {
      this.analysisStart = performance.now();
      this.#scope = isolationScope(this.core.options.cacheIsolation, this.key);
      const analysis = this.core.analyzer.analyze(this.body, this.pooled, this.#scope);
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
      const { ctx, key, endpoint, core } = this;
      const { metrics, picker } = core;
      if (ctx.clientGone.aborted) {
        // Gone while its body was analysed (off the event loop for a large one): nothing is
        // admitted, queued or dispatched for nobody.
        metrics.clientDisconnect(ctx.model, "before_first_byte");
        core.log({ event: "client_closed", requestId: this.requestId, phase: "analysis" });
        this.finish();
        return;
      }
      if (analysis.mode === "pool") {
        const load = core.analyzer.poolLoad();
        metrics.poolUtilization(load.slots === 0 ? 0 : load.active / load.slots);
      }
      if (!analysis.ok) {
        throw new RejectedError("invalid_request", analysis.message, undefined, analysis.param);
      }
      this.analysis = analysis;
      const hint = hintOf(analysis, this.req, core.options.sessionHeader);
      // Under isolation a hint is the principal's own: another tenant sending the same `user`
      // or session value neither lands where it lands nor moves it.
      this.hint =
        hint === undefined || this.#scope === undefined
          ? hint
          : { source: hint.source, value: `${this.#scope}\0${hint.value}` };
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
      const resolution = core.routeTable.resolve(model);
      if (resolution === undefined) {
        throw new RejectedError(
          "unknown_model",
          `The model \`${model}\` does not exist or you do not have access to it.`,
          undefined,
          "model",
        );
      }
      core.seenModels.add(model);
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
      // Requests still running on draining replicas (or on ones that left the table) hold
      // admission slots: they count on top, or a drain would shut new requests out of ready
      // replicas with room.
      if (routable.length < resolution.replicas.length || core.draining.size > 0) {
        capacity += picker.drainingInFlight(resolution);
      }
      const limit = core.limiter.acquire(key, model, analysis.estimatedTokens);
      if (!limit.ok) {
        throw new RejectedError(
          limit.reason,
          limitMessage(key, limit),
          limit.retryAfterSeconds,
          undefined,
          key.name,
        );
      }
      this.#lease = limit;
      this.countEvents = limit.metered && analysis.maxTokens === undefined;
      metrics.inFlight(model, 1);
      const signal = ctx.clientGone; // aborted by the request's one "close" listener (handler.ts)
      this.signal = signal;
      const outcome = core.admission.admit(
        resolution.deployment,
        key,
        analysis.estimatedTokens,
        capacity,
        signal,
        routable.length,
      );
      if (outcome instanceof Promise) {
        const queuedAt = performance.now();
        metrics.queueDepth(model, core.admission.stats(resolution.deployment).queued);
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
      const { model, resolution, core } = this;
      const metrics = core.metrics;
      if (queuedAt !== undefined) {
        // The wait may have changed who is routable (a replica turned draining is in a new
        // resolution; the one held since admission still says it is ready).
        const current = core.routeTable.resolve(model);
        if (current !== undefined) this.resolution = current;
        this.routable = current === undefined ? [] : core.picker.routable(current);
        metrics.queueDepth(model, core.admission.stats(resolution.deployment).queued);
        metrics.queueWait(
          model,
          (performance.now() - queuedAt) / 1000,
          outcome.admitted
            ? "admitted"
            : outcome.reason === "aborted"
              ? "cancelled"
              : outcome.reason === "shed"
                ? "shed"
                : "timed_out",
        );
      }
      if (!outcome.admitted) {
        // Refused or abandoned in the queue: nothing ran, so nothing is charged.
        this.#lease?.settle(0);
        if (outcome.reason === "aborted") {
          metrics.clientDisconnect(model, "queued");
          this.finish();
          return;
        }
        throw new RejectedError(
          outcome.reason,
          outcome.reason === "queue_full"
            ? `model ${model} is at capacity and its queue is full`
            : outcome.reason === "shed"
              ? `model ${model} is at capacity; the queued batch request made room for one of a higher priority`
              : `model ${model} is at capacity; the request waited too long in the queue`,
          outcome.retryAfterSeconds,
        );
      }
      this.#slotRelease = outcome.release;
      // A whole answer's first byte is its last: the router cannot see when its prefill ends,
      // so it does not count as prefilling (see `AdmissionOptions.criticalPrefillReserve`).
      if (this.analysis.stream) this.slotPrefilled = outcome.prefilled;
      else outcome.prefilled();
      this.#route();
    } catch (error) {
      this.fail(error);
    }
  }

  /**
   * Picks and starts the first attempt. A deployment whose replicas feed their KV-cache blocks
   * (precise mode) and that the router can tokenize for is matched on the prompt's token
   * blocks; anything that stands in the way (a feed not synced, a request it cannot tokenize or
   * that gives a `cache_salt`, a tokenizer that failed) routes on the approximate index instead,
   * counted by reason.
   */
  #route(): void {
    const { resolution, routable, core } = this;
    this.upstreamBody = this.#upstreamBodyOf();
    // A stream cut short is charged what it streamed: count its events.
    if (core.usage !== undefined && this.analysis.stream) this.countEvents = true;
    const kind = resolution.tokenizer;
    if (
      kind === undefined ||
      resolution.policy !== "llmgw" ||
      !routable.some((r) => r.kvEventsUrl !== undefined)
    ) {
      this.#start(this.#pick());
      return;
    }
    // vLLM makes a salted prompt's salt its first block's extra key, and the feeds chain such
    // blocks from the salt's key: the prompt's token blocks are keyed from it too.
    const salt = this.analysis.salt;
    const parentKey = salt === undefined ? undefined : saltKey(salt);
    if (salt !== undefined && parentKey === undefined) {
      this.#start(this.#pick(undefined, "unsupported_request"));
      return;
    }
    const blockSize = core.picker.preciseBlockSize(routable);
    if (blockSize === undefined || blockSize === "empty") {
      // Empty: no engine holds any block yet, so no prefix to match anywhere.
      this.#start(
        this.#pick(undefined, blockSize === undefined ? "kv_events_not_synced" : undefined),
      );
      return;
    }
    const tokenized = tokenizerFor(kind)(this.body, this.endpoint, routable);
    const go = (t: TokenizeResult): void => {
      try {
        this.#start(
          t.ok
            ? this.#pick(tokenBlockKeys(t.tokens, blockSize, parentKey))
            : this.#pick(undefined, t.reason),
        );
      } catch (error) {
        this.fail(error);
      }
    };
    if (tokenized instanceof Promise) tokenized.then(go, (error: unknown) => this.fail(error));
    else go(tokenized);
  }

  /**
   * Starts the first attempt; one of a class below critical picked for a replica where a
   * critical request's prefill is queued waits for it first (see `CriticalPrefills`).
   */
  #start(decision: PickDecision): void {
    const held = this.core.criticalPrefills;
    if (
      held === undefined ||
      this.key.priority === "critical" ||
      held.pending(decision.replica.id) === 0
    ) {
      new Attempt(this, decision).start();
      return;
    }
    held.after(decision.replica.id, () => {
      try {
        new Attempt(this, decision).start();
      } catch (error) {
        this.fail(error);
      }
    });
  }

  /** The first pick, recorded as the request's routing decision. */
  #pick(precise?: Float64Array, preciseFallback?: PreciseFallbackReason): PickDecision {
    const { analysis, resolution, core } = this;
    this.precise = precise;
    const decision = core.picker.pick(resolution, analysis.chain, NONE_TRIED, this.routable, {
      quarters: analysis.quarters,
      ...(this.hint === undefined ? {} : { hint: this.hint.value }),
      ...(precise === undefined ? {} : { precise }),
      promptTokens: this.promptTokens(),
      ...(this.hint !== undefined && core.timedPlacement() ? { timedPlacement: true } : {}),
      ...this.#criticalPick(),
    });
    if (decision !== undefined) {
      this.predictedBlocks = decision.prefixBlocks;
      this.prefixSource = decision.prefixSource;
    }
    if (this.hint !== undefined && decision?.rendezvousPreferred === true) {
      core.metrics.hint(this.model, this.hint.source);
    }
    core.metrics.decision({
      model: this.model,
      policy: resolution.policy,
      replicaId: decision?.replica.id ?? "",
      seconds: (performance.now() - this.analysisStart) / 1000,
      score: decision?.score ?? 0,
      prefixBlocks: decision?.prefixBlocks ?? 0,
      chainLength: decision?.chainLength ?? analysis.chain.length,
      affinityVoided: decision?.affinityVoided ?? false,
      missingLoadSignals: decision?.missingLoadSignals ?? false,
      mode: analysis.mode,
      ...(preciseFallback === undefined ? {} : { preciseFallback }),
    });
    if (decision === undefined) {
      throw new RejectedError("no_ready_replica", `no replica of model ${this.model} has room`, 1);
    }
    return decision;
  }

  /**
   * Called once per attempt. A connect failure or refusal before any byte is tried once more
   * on the next-best replica not tried yet; a connection the engine closed under the request
   * (`closedUnderUs`) with no other replica to try, once more on the same replica.
   */
  attemptEnded(result: AttemptResult, replicaId: string, failed?: PickDecision): void {
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
      this.#attempts += 1;
      // The resolution as it is now: one that turned draining since the first pick is not tried.
      const current = this.#attempts < 2 ? this.core.routeTable.resolve(this.model) : undefined;
      const decision =
        current === undefined
          ? undefined
          : (this.core.picker.pick(current, this.analysis.chain, tried, undefined, {
              quarters: this.analysis.quarters,
              ...(this.hint === undefined ? {} : { hint: this.hint.value }),
              ...(this.precise === undefined ? {} : { precise: this.precise }),
              promptTokens: this.promptTokens(),
              ...this.#criticalPick(),
            }) ??
            (result.closedUnderUs === true &&
            failed !== undefined &&
            current.replicas.some((r) => r.id === replicaId && r.state === "ready")
              ? failed
              : undefined));
      if (decision !== undefined) {
        this.predictedBlocks = decision.prefixBlocks;
        this.prefixSource = decision.prefixSource;
        this.core.metrics.retry(this.model);
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
   * The body to send upstream. A stream whose client left `stream_options` out is asked for
   * its usage (`"stream_options":{"include_usage":true}` appended) when the router records
   * usage, so that it is charged the engine's exact counts; the attempt then takes the usage
   * event out of the stream, and the client receives the bytes it asked for. A deployment whose
   * engines schedule by priority gets the request's class as `"priority"` (vLLM: lower runs
   * first), appended last so that it overrides one the client wrote: the key's class decides,
   * not the request. Under cache isolation the router's salt goes last the same way (or
   * llama.cpp's `"cache_prompt":false`), overriding the client's own salt.
   */
  #upstreamBodyOf(): Uint8Array {
    const { analysis, core, resolution } = this;
    const askUsage =
      core.usage !== undefined && analysis.stream && analysis.streamUsage === "absent";
    const priority = resolution.enginePriority === true;
    const salt = analysis.isolatedSalt;
    if (this.#scope !== undefined && salt === undefined) {
      // An analysis that ignored the scope (a stale worker bundle): never send it unsalted.
      throw new Error("an isolated request's analysis carries no salt");
    }
    if (!askUsage && !priority && salt === undefined) return this.body;
    const members = [
      ...(askUsage ? ['"stream_options":{"include_usage":true}'] : []),
      ...(priority ? [`"priority":${ENGINE_PRIORITY[this.key.priority ?? "standard"]}`] : []),
      ...(salt === undefined ? [] : [isolationMembers(salt, resolution.cacheIsolation)]),
    ];
    const rewritten = appendMembers(this.body, members.join(","));
    if (rewritten === undefined) {
      // Never for a body analysed as an object; an isolated request is never sent unsalted.
      if (salt !== undefined) throw new Error("an isolated request's body could not be salted");
      return this.body;
    }
    this.hideUsage = askUsage;
    return rewritten;
  }

  /**
   * Records the answer's `usage` and settles the key's tpm reservation with it (prompt +
   * completion; an embedding has prompt tokens only). A stream that reports no usage is
   * settled with its events as a lower bound of what it generated (less the role-only first
   * event and `[DONE]`), when that exceeds the reservation: a request without an output limit
   * may not run on the 256 tokens reserved for it. Anything else keeps the reservation.
   * Called on every way an answer ends, cut short too: a client that leaves mid-stream pays
   * for what it was sent, and a request an engine held but never answered (see
   * {@link engineHeld}) is one cut before its first byte (`tail` "", no events). Usage the engine
   * reported with impossible values (negative, fractional, absurd) is refused whole: counted as
   * refused, charged the estimate. An error answer (≥ 400) that reports no usage is recorded
   * and charged as zero tokens.
   */
  settleUsage(tail: string, sseEvents: number, replica?: ReplicaRoute): void {
    const metrics = this.core.metrics;
    const usage = readAnswerUsage(tail);
    const { prompt, completion, cached } = usage;
    if (prompt !== undefined) metrics.tokens(this.model, "prompt", prompt);
    if (completion !== undefined) metrics.tokens(this.model, "completion", completion);
    if (cached !== undefined) metrics.tokens(this.model, "cached", cached);
    // Cached tokens are known as reported, and as 0 where a chat or completion answer of an
    // engine seen to report them leaves them out (vLLM and the simulator omit a 0); unknown
    // (absent, not 0) for an estimate, an engine not seen to report them (llmgw launches vLLM
    // with --enable-prompt-tokens-details, but an adopted or hand-started one may lack it), and
    // an embedding (no engine omits them there for being 0). Only a known count scores the
    // prediction: an engine that never reports them would otherwise read as all misses.
    const { reportsCached, replicaModel } = this.core;
    if (cached !== undefined && replica !== undefined && replicaModel.has(replica.id))
      reportsCached.set(replica.id, replica.baseUrl);
    const noneCached =
      cached === undefined &&
      prompt !== undefined &&
      !usage.refused &&
      this.endpoint !== "/v1/embeddings" &&
      replica !== undefined &&
      reportsCached.get(replica.id) === replica.baseUrl;
    const cachedTokens = cached ?? (noneCached ? 0 : undefined);
    if (cachedTokens !== undefined) {
      // A hit is at least one block of what the router matched on: it cannot see less.
      const source = this.prefixSource;
      const preciseSize =
        source === "precise" ? this.core.picker.preciseBlockSize(this.routable) : undefined;
      const blockTokens =
        typeof preciseSize === "number" ? preciseSize : this.core.picker.blockTokens;
      const expected = this.predictedBlocks > 0;
      const found = cachedTokens >= blockTokens;
      metrics.prefixPrediction(
        this.model,
        source,
        expected === found ? (found ? "hit" : "miss") : expected ? "false_hit" : "missed_hit",
      );
    }
    const exact =
      prompt !== undefined && (completion !== undefined || this.endpoint === "/v1/embeddings");
    if (!exact && !usage.refused && this.upstreamStatus >= 400) {
      // An error answer without usage (a 400 for a prompt too long, a 503 from an overloaded
      // engine): the engine refused the request before generating, and counted nothing.
      this.#used = {
        promptTokens: 0,
        cachedTokens: 0,
        completionTokens: 0,
        gpuMs: 0,
        estimated: false,
        refused: false,
      };
      this.#lease?.settle(0);
      return;
    }
    // Cut short or unreported: the prompt as estimated, and what was streamed (one token per
    // content event, less the role-only first event and `[DONE]`).
    const streamed = Math.max(0, sseEvents - 2);
    this.#used = exact
      ? {
          promptTokens: prompt,
          ...(cachedTokens === undefined ? {} : { cachedTokens }),
          completionTokens: completion ?? 0,
          gpuMs: 0,
          estimated: false,
          refused: false,
        }
      : {
          promptTokens: this.promptTokens(),
          completionTokens: streamed,
          gpuMs: 0,
          estimated: true,
          refused: usage.refused,
        };
    const lease = this.#lease;
    if (lease === undefined) return;
    if (exact) {
      lease.settle(prompt + (completion ?? 0));
      return;
    }
    const { estimatedTokens, maxTokens, choices } = this.analysis;
    const floor =
      estimatedTokens -
      (maxTokens ?? DEFAULT_COMPLETION_TOKEN_ESTIMATE) * (choices ?? 1) +
      streamed;
    if (floor > estimatedTokens) lease.settle(floor);
  }

  /**
   * A critical request's room past each replica's capacity (its admission headroom), and its
   * first token before load balance (the replica whose engine step ends soonest).
   */
  #criticalPick(): { headroom?: number; latencyFirst?: boolean } {
    return this.key.priority === "critical"
      ? { headroom: this.core.options.admission.criticalHeadroom ?? 0, latencyFirst: true }
      : {};
  }

  /** The prompt's estimated tokens: the reservation less its output part (bytes ÷ 4). */
  promptTokens(): number {
    const { estimatedTokens, maxTokens, choices } = this.analysis;
    return Math.max(
      1,
      estimatedTokens - (maxTokens ?? DEFAULT_COMPLETION_TOKEN_ESTIMATE) * (choices ?? 1),
    );
  }

  /** Ends the request with `error`'s answer (see {@link answerError}). */
  fail(error: unknown): void {
    this.finish();
    try {
      answerError(this.core, this.req, this.res, this.ctx, this.requestId, error);
    } catch (unexpected) {
      // Called from promise callbacks too: nothing may escape into an unhandled rejection.
      this.core.log({
        event: "internal_error",
        requestId: this.requestId,
        error: String(unexpected),
      });
      this.res.destroy();
    }
  }

  /** Frees what the request holds; idempotent. */
  finish(): void {
    if (this.#finished) return;
    this.#finished = true;
    this.#slotRelease?.();
    // No try answered, and an engine had the request all the same (queued or prefilling until
    // its headers timeout, a crash or the client's leaving): charged as a stream cut before its
    // first chunk, with the GPU time its tries held.
    if (this.#used === undefined && this.engineHeld) this.settleUsage("", 0);
    const used = this.#used;
    const ledger = this.core.usage;
    if (used !== undefined && ledger !== undefined) {
      ledger.add(Date.now(), this.key.id, this.key.tenant?.name ?? "", this.model, {
        ...used,
        gpuMs: this.gpuMs,
      });
      if (ledger.full) this.core.onUsageFull();
    }
    if (this.#lease !== undefined) {
      // No attempt reached an engine (every replica refused the connection, none was left to
      // pick, an attempt failed to start, the client left before the request was sent): nothing
      // ran, so nothing is charged. One an engine held unanswered was settled as cut short.
      if (this.#used === undefined) this.#lease.settle(0);
      this.#lease.release();
      this.core.metrics.inFlight(this.model, -1);
    }
    // Recycled unless an upstream answered an error, perhaps before reading the whole body:
    // its socket could still be writing from this buffer. A 2xx means the engine read it.
    if (this.pooled && !this.upstreamMayBeReading) this.core.analyzer.buffers.give(this.body);
  }
}
