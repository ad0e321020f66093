/**
 * The one place router outcomes become HTTP answers: status, OpenAI error `type` and `code`.
 * Every body has the OpenAI shape `{"error":{"message","type","code","param"}}`.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { RejectionReason } from "@llmgw/router";
import { bodyNotInvited } from "./http-listener.js";

/** An OpenAI-style error answer. */
export interface HttpErrorSpec {
  readonly status: number;
  readonly type: string;
  readonly code: string;
}

/** Router rejection reason → HTTP answer. */
export const REJECTION_HTTP: Readonly<Record<RejectionReason, HttpErrorSpec>> = {
  missing_key: { status: 401, type: "invalid_request_error", code: "invalid_api_key" },
  unauthorized: { status: 401, type: "invalid_request_error", code: "invalid_api_key" },
  forbidden_model: { status: 404, type: "invalid_request_error", code: "model_not_found" },
  unknown_model: { status: 404, type: "invalid_request_error", code: "model_not_found" },
  no_ready_replica: { status: 503, type: "service_unavailable", code: "no_ready_replica" },
  model_loading: { status: 503, type: "service_unavailable", code: "model_loading" },
  invalid_request: { status: 400, type: "invalid_request_error", code: "invalid_request" },
  body_too_large: { status: 413, type: "invalid_request_error", code: "request_too_large" },
  queue_full: { status: 429, type: "rate_limit_error", code: "queue_full" },
  queue_timeout: { status: 429, type: "rate_limit_error", code: "queue_timeout" },
  // A queued batch request that made room for a higher class: the queue was full for it.
  shed: { status: 429, type: "rate_limit_error", code: "queue_full" },
  aborted: { status: 499, type: "client_closed_request", code: "client_closed_request" },
  "key-rpm": { status: 429, type: "rate_limit_error", code: "rate_limit_exceeded" },
  "key-tpm": { status: 429, type: "rate_limit_error", code: "tokens_rate_limit_exceeded" },
  "key-concurrency": { status: 429, type: "rate_limit_error", code: "concurrency_limit_exceeded" },
  "key-budget": { status: 429, type: "rate_limit_error", code: "token_budget_exceeded" },
  "tenant-rpm": { status: 429, type: "rate_limit_error", code: "rate_limit_exceeded" },
  "tenant-tpm": { status: 429, type: "rate_limit_error", code: "tokens_rate_limit_exceeded" },
  "tenant-concurrency": {
    status: 429,
    type: "rate_limit_error",
    code: "concurrency_limit_exceeded",
  },
  "tenant-budget": { status: 429, type: "rate_limit_error", code: "token_budget_exceeded" },
};

/** Answers for failures that are not admission decisions. */
export const FAILURE_HTTP = {
  notFound: { status: 404, type: "invalid_request_error", code: "unknown_url" },
  methodNotAllowed: { status: 405, type: "invalid_request_error", code: "method_not_allowed" },
  upstreamUnavailable: { status: 502, type: "upstream_error", code: "upstream_unavailable" },
  /** Every replica tried refused the router's engine key (a restart whose key is not here yet). */
  engineKeyRefused: { status: 503, type: "upstream_error", code: "upstream_key_refused" },
  upstreamTimeout: { status: 504, type: "upstream_error", code: "upstream_timeout" },
  internal: { status: 500, type: "internal_error", code: "internal_error" },
  /** The router holds no routing state yet: it knows neither the keys nor the replicas. */
  notReady: { status: 503, type: "service_unavailable", code: "router_not_ready" },
  /** Its routing state is older than `--max-state-age` (no control plane heard since). */
  stateStale: { status: 503, type: "service_unavailable", code: "router_state_stale" },
} as const satisfies Record<string, HttpErrorSpec>;

/** The JSON text of an OpenAI error body. */
export function errorBody(spec: HttpErrorSpec, message: string, param?: string): string {
  return JSON.stringify({
    error: { message, type: spec.type, code: spec.code, param: param ?? null },
  });
}

/**
 * Sends an error answer. When headers already went out (cannot happen before the first upstream
 * byte) the socket is destroyed so the client is never left hanging. `limit` is sent as
 * `x-llmgw-limit`: which limit or queue refused a 429, machine-readable (`tenant-tpm`,
 * `queue_full`, …), where `code` is OpenAI's coarser vocabulary.
 */
export function sendError(
  res: ServerResponse,
  spec: HttpErrorSpec,
  message: string,
  options: { param?: string; retryAfterSeconds?: number; requestId?: string; limit?: string } = {},
): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const body = errorBody(spec, message, options.param);
  const headers: Record<string, string | number> = {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(body),
  };
  if (options.requestId !== undefined) headers["x-request-id"] = options.requestId;
  if (options.retryAfterSeconds !== undefined) headers["retry-after"] = options.retryAfterSeconds;
  if (options.limit !== undefined) headers["x-llmgw-limit"] = options.limit;
  res.writeHead(spec.status, headers);
  res.end(body);
}

/** Bounds of {@link sendErrorThenDrain}. */
export interface DrainLimits {
  /** Longest time the rest of the request body is read and discarded, ms. */
  readonly drainMs: number;
  /** Most bytes discarded. */
  readonly drainBytes: number;
}

/**
 * Answers an error for a request whose body will not be read (413) and closes the connection
 * without resetting it under a client that is still sending. The answer (with
 * `Connection: close`) goes out whole at once, but it is ended, which makes Node close the
 * socket, only once the rest of the body is drained and discarded, or after `drainMs` or
 * `drainBytes`: closing a socket with unread bytes sends a reset, and a reset can discard the
 * answer before the client has read it (Node's `fetch` then reports a connection error, not
 * the 413). A client that stops sending on the answer ends this early.
 */
export function sendErrorThenDrain(
  req: IncomingMessage,
  res: ServerResponse,
  spec: HttpErrorSpec,
  message: string,
  options: { readonly requestId?: string } & DrainLimits,
): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const body = errorBody(spec, message);
  const headers: Record<string, string | number> = {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(body),
    connection: "close",
  };
  if (options.requestId !== undefined) headers["x-request-id"] = options.requestId;
  res.writeHead(spec.status, headers);
  if (req.readableEnded || bodyNotInvited(req)) {
    res.end(body);
    return;
  }
  res.write(body);
  let discarded = 0;
  const done = (): void => {
    clearTimeout(timer);
    req.off("data", onData);
    req.off("end", done);
    if (!res.writableEnded) res.end();
  };
  const onData = (chunk: Buffer): void => {
    discarded += chunk.length;
    if (discarded > options.drainBytes) done();
  };
  const timer = setTimeout(done, options.drainMs);
  req.on("data", onData);
  req.on("end", done);
  res.once("close", done);
  req.resume();
}
