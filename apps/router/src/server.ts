/**
 * THE router server: production's `llmgw router`, the control plane's in-process `/v1`, the
 * tests and `bench/router` all start it here, so the listener, limits and timeouts that are
 * measured are the ones that ship. One listener: `/healthz`, `/readyz` (status only: the
 * detail is on the metrics listener), `/v1/*`.
 */
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  createRouterMetrics,
  type FamilySpec,
  ROUTER_PEER_FAMILIES,
} from "@llmgw/metrics-collector";
import { type RouterMetricsSink, UsageLedger } from "@llmgw/router";
import { Counter, Gauge, Registry } from "prom-client";
import { RouterServiceError } from "./errors.js";
import { createRouterHandler, type RouterHandler } from "./handler.js";
import { FAILURE_HTTP, sendError } from "./http-errors.js";
import { createHttpListener, type HttpListenerOptions } from "./http-listener.js";
import { type InFlightReporter, startInFlightReporter } from "./in-flight-reporter.js";
import { createPrometheusRouterMetricsSink, registerRoutingStateMetrics } from "./metrics.js";
import type { RouterServiceOptions } from "./options.js";
import { PEER_EVENTS_PATH, type PeerExchange, startPeerExchange } from "./peer-exchange.js";
import {
  type RoutingReadiness,
  type RoutingRuntime,
  type RoutingRuntimeOptions,
  startRoutingRuntime,
} from "./runtime.js";
import { startUsageReporter, type UsageReporter } from "./usage-reporter.js";

/** Inputs of {@link startRouter}. */
export interface StartRouterOptions {
  readonly routing: RoutingRuntimeOptions;
  /** Handler options: noAuth, body/queue limits, upstream timeouts… */
  readonly router?: RouterServiceOptions;
  /** Listener limits and TLS (createHttpListener's options). */
  readonly listener?: HttpListenerOptions;
  /** "HOST:PORT" or ":PORT"; default "127.0.0.1:0". */
  readonly listen?: string;
  /** Router metric families (and llmgw_router_state_* gauges) go here. Default: a fresh Registry. */
  readonly registry?: Registry;
  /**
   * Replaces the Prometheus sink on `registry` (tests record calls with
   * `createRecordingRouterMetrics`); the state gauges stay on `registry`.
   */
  readonly metrics?: RouterMetricsSink;
  readonly log?: (event: Readonly<Record<string, unknown>>) => void;
  /** How often usage is sealed and reported, ms (default 5 000; tests shorten it). */
  readonly usageReportIntervalMs?: number;
  /**
   * Record each answered request's usage and report it (default true). False: no ledger and
   * no usage reports, so no budget standings are learnt either; `bench/router` turns it off
   * for the baseline of what accounting costs. Not an operator's option.
   */
  readonly recordUsage?: boolean;
  /**
   * The other routers of the cluster and the key they share (peer-exchange.ts): each tells
   * the others what it sent where, so that N routers route as one. This router's id is
   * `routing.routerId`. None: this router routes on what it sent itself.
   */
  readonly peers?: {
    readonly urls: readonly string[];
    readonly key: string;
    /** How often each stream is renewed (`PeerExchangeOptions.renewMs`; tests shorten it). */
    readonly renewMs?: number;
    /** PEM bundle trusted for `https://` peers besides Node's roots. */
    readonly ca?: string | Buffer;
  };
}

/** A listening router. */
export interface RunningRouter {
  /** http(s)://host:port */
  readonly url: string;
  readonly port: number;
  readonly server: Server;
  readonly runtime: RoutingRuntime;
  readonly handler: RouterHandler;
  readonly registry: Registry;
  /** Stops accepting, lets in-flight requests finish until graceMs (default 10 s), closes the runtime. */
  close(graceMs?: number): Promise<void>;
  /** {@link close}, reporting how it went. Calls after the first share its outcome. */
  stop(graceMs?: number): Promise<RouterStopReport>;
}

/** How a stop went, as data. */
export interface RouterStopReport {
  readonly durationMs: number;
  /** True when connections were still open at the grace deadline and were closed by force. */
  readonly forced: boolean;
}

/** Splits `HOST:PORT` / `:PORT` into a host ("" = all interfaces) and a port. */
export function splitListen(listen: string): { host: string; port: number } {
  const m = /^(\[[0-9a-fA-F:]+\]|[^\s:[\]]*):(\d{1,5})$/.exec(listen);
  const port = Number(m?.[2]);
  if (m === null || port > 65535) {
    throw new RouterServiceError(
      "LLMGW_ROUTER_CONFIG_INVALID",
      `listen address must be HOST:PORT or :PORT, got ${JSON.stringify(listen)}`,
    );
  }
  let host = m[1] as string;
  if (host.startsWith("[")) host = host.slice(1, -1);
  return { host, port };
}

/**
 * How much `/readyz` tells: `public` on the API listener, which anyone who reaches it may ask
 * (what a load balancer and a client need: `status`, `ready`, `source`, `stateAgeMs`,
 * `connected`); `full` on the metrics listener, which also names the control plane, the epoch,
 * the version, and why it is not ready.
 */
export type ReadinessDetail = "public" | "full";

/**
 * Answers `/healthz` and `/readyz` for a runtime; false for any other path. `detail` defaults
 * to `full`, what the standalone metrics listener answers.
 */
export function answerHealth(
  runtime: RoutingRuntime,
  path: string,
  res: ServerResponse,
  detail: ReadinessDetail = "full",
): boolean {
  if (path === "/healthz") {
    res.writeHead(200, { "content-type": "application/json" }).end('{"status":"ok"}');
    return true;
  }
  if (path === "/readyz") {
    const readiness = runtime.readiness();
    res
      .writeHead(readiness.ready ? 200 : 503, { "content-type": "application/json" })
      .end(JSON.stringify(readinessBody(readiness, detail)));
    return true;
  }
  return false;
}

function readinessBody(r: RoutingReadiness, detail: ReadinessDetail): Record<string, unknown> {
  const status = r.ready ? "ready" : "not_ready";
  if (detail === "public") {
    return {
      status,
      ready: r.ready,
      source: r.source,
      ...(r.stateAgeMs === undefined ? {} : { stateAgeMs: r.stateAgeMs }),
      ...(r.stale === true ? { stale: true } : {}),
      connected: r.connected,
    };
  }
  return {
    status,
    ...r,
    ...(r.ready
      ? {}
      : {
          reason:
            r.stale === true
              ? "routing state older than --max-state-age: no control plane has confirmed it since; keys revoked meanwhile may still be in it"
              : "no routing state yet: waiting for a snapshot from a control plane",
        }),
  };
}

const V = "v".charCodeAt(0);

/**
 * Starts the routing runtime (saved state first, then the feed or stream), the handler over
 * its route table and keys, and the listener; resolves once the port is open.
 * @throws RouterServiceError `LLMGW_ROUTER_LISTEN_FAILED` (address in use, no permission),
 *   `LLMGW_ROUTER_TLS_INVALID`, `LLMGW_ROUTER_CONFIG_INVALID`, `LLMGW_ROUTER_STATE_FAILED`.
 */
export async function startRouter(options: StartRouterOptions): Promise<RunningRouter> {
  const registry = options.registry ?? new Registry();
  const log = options.log ?? (() => {});
  const { host, port: wantedPort } = splitListen(options.listen ?? "127.0.0.1:0");
  const runtime = await startRoutingRuntime({
    cacheIsolation: options.router?.cacheIsolation ?? "none",
    // Tenants' own isolation needs tenants: a router without API keys has none to apply.
    appliesTenantCacheIsolation: options.router?.noAuth !== true,
    ...options.routing,
    log: options.routing.log ?? log,
  });
  let handler: RouterHandler | undefined;
  let reporter: InFlightReporter | undefined;
  let usageReporter: UsageReporter | undefined;
  let peers: PeerExchange | undefined;
  let server: Server;
  try {
    const metrics =
      options.metrics ??
      createPrometheusRouterMetricsSink(
        createRouterMetrics(registry, { workerPool: () => handler?.workerPool() }),
      );
    registerRoutingStateMetrics(registry, () => {
      const r = runtime.readiness();
      return {
        stateAgeSeconds: r.stateAgeMs === undefined ? undefined : r.stateAgeMs / 1000,
        stateVersion: r.version,
        controlPlaneConnected: r.connected ? 1 : 0,
        routers: runtime.state.routers,
        cacheIsolation: (options.router?.cacheIsolation ?? "none") === "none" ? 0 : 1,
        stateStale:
          options.routing.maxStateAgeMs === undefined ? undefined : runtime.stale() ? 1 : 0,
        usageBatchesRefused: usageReporter?.refusedBatches,
        usageRequestsRefused: usageReporter?.refusedRequests,
      };
    });
    const ledger = options.recordUsage === false ? undefined : new UsageLedger();
    if (options.peers !== undefined) {
      const [eventsSpec, connectedSpec] = ROUTER_PEER_FAMILIES as [FamilySpec, FamilySpec];
      const peerEvents = new Counter({
        name: eventsSpec.name,
        help: eventsSpec.help,
        labelNames: eventsSpec.labelNames,
        registers: [registry],
      });
      peers = startPeerExchange({
        routerId: options.routing.routerId,
        peers: options.peers.urls,
        key: options.peers.key,
        ...(options.peers.renewMs === undefined ? {} : { renewMs: options.peers.renewMs }),
        ...(options.peers.ca === undefined ? {} : { ca: options.peers.ca }),
        apply: (peer, event) => handler?.applyPeerEvent(peer, event),
        gone: (peer) => handler?.peerGone(peer),
        count: (direction, outcome) => peerEvents.inc({ direction, outcome }),
        log,
      });
      const exchange = peers;
      new Gauge({
        name: connectedSpec.name,
        help: connectedSpec.help,
        registers: [registry],
        collect() {
          this.set(exchange.connected());
        },
      });
    }
    const h = createRouterHandler({
      routeTable: runtime.state.routeTable,
      apiKeys: runtime.state.apiKeys,
      metrics,
      ...(options.router === undefined ? {} : { options: options.router }),
      log,
      ...(ledger === undefined ? {} : { usage: ledger }),
      onUsageFull: () => usageReporter?.sealNow(),
      ...(peers === undefined ? {} : { peers }),
      routers: () => runtime.state.routers,
    });
    handler = h;
    const stateDir = options.routing.stateDir;
    if (ledger !== undefined) {
      usageReporter = await startUsageReporter({
        ledger,
        send: (batch) => runtime.reportUsage(batch),
        // The control plane checked the batch and will never take it (see docs/api.md).
        refused: (error) => error instanceof ConnectError && error.code === Code.InvalidArgument,
        onStandings: (answer, includedUpToMs) => h.applyStandings(answer, includedUpToMs),
        ...(stateDir === undefined ? {} : { dir: path.join(stateDir, "usage") }),
        ...(options.usageReportIntervalMs === undefined
          ? {}
          : { intervalMs: options.usageReportIntervalMs }),
        log,
      });
    }
    reporter = startInFlightReporter({
      state: runtime.state,
      inFlight: h.inFlight,
      send: (report) => runtime.reportInFlight(report),
    });
    server = createHttpListener(
      options.listener ?? {},
      (req: IncomingMessage, res: ServerResponse) => {
        const url = req.url ?? "/";
        // `/v1/…` straight to the handler: one character compared on the hot path.
        if (url.charCodeAt(1) !== V) {
          const path = url.split("?", 1)[0] ?? url;
          if (answerHealth(runtime, path, res, "public")) return;
          if (path === PEER_EVENTS_PATH && peers !== undefined) {
            peers.handle(req, res);
            return;
          }
        }
        if (runtime.state.epoch === undefined) {
          // No routing state yet: every key would look wrong and every model unknown. Say
          // what is true, so that a client keeps its key and retries.
          sendError(
            res,
            FAILURE_HTTP.notReady,
            "this router has no routing state yet (it has not reached a control plane); retry shortly",
            { retryAfterSeconds: 1 },
          );
          return;
        }
        if (runtime.stale()) {
          // Cut off from every control plane for longer than the operator allows: the keys it
          // holds may have been revoked since. Refuse, so that a client tries another router.
          const ageS = Math.round((runtime.readiness().stateAgeMs ?? 0) / 1000);
          sendError(
            res,
            FAILURE_HTTP.stateStale,
            `this router has not heard from a control plane for ${ageS} s, longer than its --max-state-age; it refuses requests until one answers`,
            { retryAfterSeconds: 5 },
          );
          return;
        }
        h(req, res);
      },
    );
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(wantedPort, host === "" ? undefined : host, () => {
        server.off("error", reject);
        resolve();
      });
    }).catch((cause: unknown) => {
      throw new RouterServiceError(
        "LLMGW_ROUTER_LISTEN_FAILED",
        `cannot listen on ${options.listen ?? "127.0.0.1:0"}: ${(cause as Error).message}`,
        { cause },
      );
    });
  } catch (error) {
    peers?.close();
    reporter?.close();
    await usageReporter?.close(0);
    await handler?.close();
    await runtime.close();
    throw error;
  }
  const port = (server.address() as AddressInfo).port;
  const shownHost = host === "" ? "127.0.0.1" : host.includes(":") ? `[${host}]` : host;
  const h = handler as RouterHandler;
  let closing: Promise<RouterStopReport> | undefined;
  const stop = (graceMs = 10_000): Promise<RouterStopReport> => {
    closing ??= (async () => {
      const started = performance.now();
      // The peers' streams first: they would hold the listener open until the grace ends.
      peers?.close();
      const forced = await stopListening(server, graceMs);
      // No last report: the control plane stops counting this router with its stream.
      reporter?.close();
      // What the finished requests used, sealed and sent while the stream is still open.
      await usageReporter?.close();
      await h.close();
      await runtime.close();
      return { durationMs: Math.round(performance.now() - started), forced };
    })();
    return closing;
  };
  return {
    url: `${options.listener?.tls ? "https" : "http"}://${shownHost}:${port}`,
    port,
    server,
    runtime,
    handler: h,
    registry,
    stop,
    async close(graceMs) {
      await stop(graceMs);
    },
  };
}

/**
 * Stops accepting, closes idle keep-alive connections as they become idle, and waits for
 * in-flight requests until `graceMs`; then closes what is left. Returns true when forced.
 */
export async function stopListening(server: Server, graceMs: number): Promise<boolean> {
  let forced = false;
  await new Promise<void>((resolve) => {
    server.close(() => resolve());
    server.closeIdleConnections();
    // A connection whose last request just ended goes idle without closing: sweep it.
    const sweep = setInterval(() => server.closeIdleConnections(), 50);
    const deadline = setTimeout(() => {
      forced = true;
      server.closeAllConnections();
    }, graceMs);
    server.once("close", () => {
      clearInterval(sweep);
      clearTimeout(deadline);
    });
  });
  return forced;
}
