/**
 * The OpenAI-compatible HTTP front of the router: auth, body limits, one analysis per body
 * (inline or in the worker pool), admission, replica choice, and byte-for-byte proxying through
 * one undici `Pool` per replica. Every request gets an answer: a proxied response, an OpenAI
 * error body, or, after the first streamed byte, an SSE error event / a closed socket.
 *
 * This file is the entry: it builds the {@link RouterCore} and reads the request line and
 * headers; {@link readBody} reads the body, an {@link Exchange} takes it from there.
 */
import { randomUUID } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import type {
  ApiKeyInfo,
  ApiKeyStore,
  RouterMetricsSink,
  RouteTable,
  UsageAnswer,
  UsageLedger,
} from "@llmgw/router";
import { readBody } from "./body-reader.js";
import { answerError, ClientGone, Exchange, type RequestContext } from "./exchange.js";
import { FAILURE_HTTP, sendError } from "./http-errors.js";
import {
  type ResolvedRouterServiceOptions,
  type RouterServiceOptions,
  resolveRouterServiceOptions,
} from "./options.js";
import type { PeerEvent, PeerSink } from "./peer-exchange.js";
import { RejectedError } from "./rejection.js";
import { createRouterCore, type RouterCore } from "./router-core.js";

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
  /** Where answered requests' usage is summed (see `RouterCoreOptions.usage`). */
  readonly usage?: UsageLedger;
  readonly onUsageFull?: () => void;
  /** See `RouterCoreOptions.peers`. */
  readonly peers?: PeerSink;
  /** See `RouterCoreOptions.routers`. */
  readonly routers?: () => number;
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
  /**
   * Requests this handler has on `replicaId` now: from dispatch until the answer's last byte
   * (a stream until it ends), what in-flight reports tell the control plane.
   */
  inFlight(replicaId: string): number;
  /**
   * Budget standings from a usage report's answer, for the limiter; `includedUpToMs`: when the
   * newest batch they include was sealed (see `Limiter.applyStandings`).
   */
  applyStandings(answer: UsageAnswer, includedUpToMs: number): void;
  /**
   * Books what another router sent (peer-exchange.ts): a dispatch on a model this router does
   * not know, or to a replica its deployment does not have, is ignored.
   */
  applyPeerEvent(peer: string, event: PeerEvent): void;
  /** `peer`'s stream ended: the prefills it booked stop counting. */
  peerGone(peer: string): void;
  readonly options: ResolvedRouterServiceOptions;
}

const ENDPOINTS = new Set(["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]);
const REQUEST_ID = /^[A-Za-z0-9._:-]{1,128}$/;
const ANONYMOUS: ApiKeyInfo = { id: "anonymous", name: "anonymous" };

/**
 * Creates the router's request handler. Throws `LLMGW_ROUTER_CONFIG_INVALID` for a bad option
 * and a `TypeError` without `apiKeys` unless `options.noAuth`.
 */
export function createRouterHandler(input: RouterHandlerOptions): RouterHandler {
  const options = resolveRouterServiceOptions(input.options);
  return createRouterHandlerFromCore(
    createRouterCore({
      routeTable: input.routeTable,
      options,
      ...(input.apiKeys === undefined ? {} : { apiKeys: input.apiKeys }),
      ...(input.metrics === undefined ? {} : { metrics: input.metrics }),
      ...(input.log === undefined ? {} : { log: input.log }),
      ...(input.usage === undefined ? {} : { usage: input.usage }),
      ...(input.onUsageFull === undefined ? {} : { onUsageFull: input.onUsageFull }),
      ...(input.peers === undefined ? {} : { peers: input.peers }),
      ...(input.routers === undefined ? {} : { routers: input.routers }),
    }),
  );
}

/**
 * The handler over a core built by the caller (a test's, with its own upstream dispatchers);
 * its `close` closes the core.
 */
export function createRouterHandlerFromCore(core: RouterCore): RouterHandler {
  const handler = ((req: IncomingMessage, res: ServerResponse): void =>
    handleRequest(core, req, res)) as RouterHandler;
  Object.defineProperty(handler, "options", { value: core.options });
  handler.workerPool = () => {
    const load = core.analyzer.poolLoad();
    return load.slots === 0
      ? undefined
      : { utilizationRatio: Math.min(1, load.active / load.slots), queueSize: load.queued };
  };
  handler.inFlight = (replicaId) => core.picker.inFlight.get(replicaId);
  handler.applyStandings = (answer, includedUpToMs) =>
    core.limiter.applyStandings(answer.standings, answer.asOfMs, includedUpToMs);
  handler.applyPeerEvent = (peer, event) => {
    if (event.t === "first") {
      core.picker.peerPrefillDone(peer, event.replicaId, event.prefillTokens);
      return;
    }
    if (event.t === "end") {
      core.picker.peerFinished(peer, event.replicaId);
      return;
    }
    if (event.t === "inflight") {
      core.picker.peerInFlightReset(peer, event.replicas);
      return;
    }
    const resolution = core.routeTable.resolve(event.model);
    if (resolution !== undefined) core.picker.peerDispatched(peer, resolution, event);
  };
  handler.peerGone = (peer) => core.picker.peerGone(peer);
  handler.close = () => core.close();
  return handler;
}

function handleRequest(core: RouterCore, req: IncomingMessage, res: ServerResponse): void {
  const started = performance.now();
  const given = headerText(req.headers["x-request-id"]);
  const requestId = given !== undefined && REQUEST_ID.test(given) ? given : randomUUID();
  const url = req.url ?? "/";
  const q = url.indexOf("?");
  const path = q < 0 ? url : url.slice(0, q);
  const ctx: RequestContext = { model: "", stream: false, clientGone: new ClientGone() };
  const metrics = core.metrics;
  res.on("close", () => {
    if (!res.writableFinished) ctx.clientGone.abort();
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
      handleModels(core, req, res, requestId);
      return;
    }
    if (ENDPOINTS.has(path)) {
      if (req.method !== "POST") {
        sendError(res, FAILURE_HTTP.methodNotAllowed, `Use POST ${path}.`, { requestId });
        return;
      }
      const key = authenticate(core, req);
      readBody(
        req,
        core.options,
        core.analyzer.buffers,
        (body, pooled) => {
          new Exchange(core, req, res, path, requestId, started, ctx, key, body, pooled).analyse();
        },
        (error) => answerError(core, req, res, ctx, requestId, error),
      );
      return;
    }
    sendError(res, FAILURE_HTTP.notFound, `Unknown request URL: ${req.method ?? "?"} ${path}.`, {
      requestId,
    });
  } catch (error) {
    answerError(core, req, res, ctx, requestId, error);
  }
}

/** The caller's API key, or {@link ANONYMOUS} under `noAuth`; throws a 401 rejection. */
function authenticate(core: RouterCore, req: IncomingMessage): ApiKeyInfo {
  if (core.options.noAuth) return ANONYMOUS;
  const header = req.headers.authorization;
  const match = header === undefined ? null : /^Bearer\s+(\S+)\s*$/i.exec(header);
  const key = match?.[1] === undefined ? undefined : core.apiKeys?.verify(match[1]);
  if (key === undefined) {
    throw new RejectedError(
      header === undefined ? "missing_key" : "unauthorized",
      header === undefined
        ? "Missing API key: send `Authorization: Bearer <key>`."
        : "Incorrect API key provided.",
    );
  }
  return key;
}

function handleModels(
  core: RouterCore,
  req: IncomingMessage,
  res: ServerResponse,
  requestId: string,
): void {
  const key = authenticate(core, req);
  const data = core.routeTable
    .models()
    .filter((id) => key.models === undefined || key.models.includes(id))
    .map((id) => ({ id, object: "model", created: core.createdAt, owned_by: "llmgw" }));
  const body = JSON.stringify({ object: "list", data });
  res.writeHead(200, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(body),
    "x-request-id": requestId,
  });
  res.end(body);
}

function headerText(value: string | string[] | undefined): string | undefined {
  return Array.isArray(value) ? value[0] : value;
}
