import { readFileSync } from "node:fs";
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import type { ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { createClusterCollector, createMetricsEndpoint } from "@llmgw/metrics-collector";
import { AgentService, ClusterService, RouterService } from "@llmgw/proto";
import type { RoutingFeed, RoutingMessage } from "@llmgw/router";
import {
  createHttpListener,
  isRouterServiceError,
  type RunningRouter,
  startRouter,
} from "@llmgw/router-server";
import { schedule as defaultSchedule } from "@llmgw/scheduler";
import { Registry } from "prom-client";
import { createClusterView } from "./cluster-view.js";
import {
  type ControlPlaneOptions,
  type ResolvedControlPlaneOptions,
  resolveControlPlaneOptions,
  splitListenAddress,
} from "./config.js";
import { type Clock, Cluster } from "./domain/cluster.js";
import type { ScheduleFn } from "./domain/reconcile.js";
import { joinHostPort } from "./domain/replica-state.js";
import { initDataDir } from "./domain/tokens.js";
import { ControlPlaneError } from "./errors.js";
import { createRoutingPublisher, type RoutingPublisher } from "./routing/publisher.js";
import {
  createRouterRegistry,
  type RouterRegistry,
  type RouterSession,
} from "./routing/router-registry.js";
import { createAgentService, createAgentStreams } from "./rpc/agent-service.js";
import { createAgentStreamFastPath } from "./rpc/agent-stream-fast-path.js";
import { createClusterService } from "./rpc/cluster-service.js";
import { answerMalformedRequestsAsInvalidArgument } from "./rpc/decode-errors.js";
import { errorMappingInterceptor } from "./rpc/errors.js";
import { createRouterService, routerServiceContextValues } from "./rpc/router-service.js";
import { openSqliteStore } from "./store/sqlite-store.js";
import type { ClusterStore } from "./store/types.js";

/** The version the control plane reports in `GetClusterStatus`. */
export const CONTROL_PLANE_VERSION = "0.1.0";

/** A Node HTTP request handler. */
export type HttpHandler = (req: IncomingMessage, res: ServerResponse) => void | Promise<void>;

/** Router id of the control plane's own (in-process) router in `llmgw routers`. */
export const IN_PROCESS_ROUTER_ID = "in-process";

/** Injected collaborators; every one has a production default. */
export interface ControlPlaneDeps {
  readonly clock?: Clock;
  /** Default: `schedule` from `@llmgw/scheduler`. */
  readonly schedule?: ScheduleFn;
  /** One line per transition and decision. Default: silent. */
  readonly log?: (line: string) => void;
  /** Default: a fresh Registry (never prom-client's global one). */
  readonly registry?: Registry;
  /** Register the cluster families of `@llmgw/metrics-collector` on the registry. Default true. */
  readonly clusterMetrics?: boolean;
}

/** How a shutdown went, as data. */
export interface ShutdownReport {
  readonly durationMs: number;
  /** True when connections were still open at the deadline and were closed by force. */
  readonly forced: boolean;
}

/** A running control plane. */
export interface ControlPlane {
  /** e.g. "http://127.0.0.1:7070": Connect-RPC, /metrics, /healthz. */
  readonly controlUrl: string;
  /** e.g. "http://127.0.0.1:8080": /v1/*, /healthz, /readyz; undefined with `publicApi: false`. */
  readonly publicUrl: string | undefined;
  readonly options: ResolvedControlPlaneOptions;
  readonly cluster: Cluster;
  readonly store: ClusterStore;
  readonly registry: Registry;
  readonly joinToken: string;
  readonly adminToken: string;
  /** The credential `WatchRouting` takes (`llmgw control-plane token --router`). */
  readonly routerToken: string;
  /** The routing feed every router watches. */
  readonly routing: RoutingPublisher;
  /** The routers watching it (`ListRouters`). */
  readonly routers: RouterRegistry;
  /** The in-process router; undefined with `publicApi: false`. */
  readonly router: RunningRouter | undefined;
  /** Stops accepting, finishes in-flight requests (force-closing after the grace), closes the store. */
  close(): Promise<ShutdownReport>;
}

function healthz(res: ServerResponse): void {
  res.writeHead(200, { "content-type": "application/json" });
  res.end('{"status":"ok"}');
}

function pathOf(req: IncomingMessage): string {
  const url = req.url ?? "/";
  const q = url.indexOf("?");
  return q === -1 ? url : url.slice(0, q);
}

async function listen(server: Server, address: string, what: string): Promise<string> {
  const { host, port } = splitListenAddress(address);
  await new Promise<void>((resolve, reject) => {
    const onError = (error: Error) => {
      reject(
        new ControlPlaneError(
          "LLMGW_CONTROL_PLANE_LISTEN_FAILED",
          `cannot listen on ${address} (${what}): ${error.message}`,
          { cause: error },
        ),
      );
    };
    server.once("error", onError);
    server.listen(port, host === "" ? undefined : host, () => {
      server.off("error", onError);
      resolve();
    });
  });
  const bound = server.address() as AddressInfo;
  const shown = host === "" || host === "0.0.0.0" ? "127.0.0.1" : host === "::" ? "::1" : host;
  return joinHostPort(shown, bound.port);
}

/**
 * Starts a control plane: data dir and tokens, the SQLite store, the cluster state, the
 * routing feed, the control listener (Connect `AgentService`, `ClusterService` and
 * `RouterService`, `/metrics`, `/healthz`) and, unless `publicApi` is false, the in-process
 * router (`startRouter` over the routing feed, on `listen`). No process globals: signals and
 * exit codes belong to the CLI. Throws `ControlPlaneError` (config, store, TLS, listen) or the
 * router's `RouterServiceError` (its listener, its state dir).
 */
export async function startControlPlane(
  options: ControlPlaneOptions,
  deps: ControlPlaneDeps = {},
): Promise<ControlPlane> {
  const resolved = resolveControlPlaneOptions(options);
  const log = deps.log ?? (() => {});
  const clock = deps.clock ?? { now: () => Date.now() };
  const dataDir = initDataDir(resolved.dataDir);
  const store = openSqliteStore({
    file: dataDir.databaseFile,
    eventsKept: resolved.eventsKept,
    expectExisting: dataDir.initialisedBefore,
  });
  const shutdown = new AbortController();
  const servers: Server[] = [];
  let timer: NodeJS.Timeout | undefined;
  let publisher: RoutingPublisher | undefined;
  let router: RunningRouter | undefined;
  let routerSession: RouterSession | undefined;
  try {
    const cluster = new Cluster({
      store,
      schedule: deps.schedule ?? defaultSchedule,
      clock,
      heartbeatIntervalMs: resolved.heartbeatIntervalMs,
      unreachableAfterMs: resolved.heartbeatIntervalMs * resolved.unreachableAfterMissed,
      nodeLostAfterMs: resolved.nodeLostAfterMs,
      rendezvousPortMin: resolved.rendezvousPortMin,
      rendezvousPortMax: resolved.rendezvousPortMax,
      maxNodes: resolved.maxNodes,
      log,
      defer: (run) => {
        setImmediate(() => {
          if (!shutdown.signal.aborted) run();
        });
      },
    });
    const routers = createRouterRegistry({ log, keepaliveMs: resolved.routingKeepaliveMs });
    const routing = createRoutingPublisher(cluster, {
      routers,
      coalesceMs: resolved.routingCoalesceMs,
      loadFlushMs: resolved.routingLoadFlushMs,
      keepaliveMs: resolved.routingKeepaliveMs,
      log,
    });
    publisher = routing;
    const registry = deps.registry ?? new Registry();
    // Cluster families are rendered straight to text at scrape time (76k samples at 1,000
    // nodes × 8 GPUs: half the CPU of going through prom-client); router families stay on
    // the registry.
    const metricsEndpoint = createMetricsEndpoint({
      registry,
      ...(deps.clusterMetrics === false
        ? {}
        : {
            cluster: createClusterCollector(registry, createClusterView(cluster, routers), {
              exposition: "text",
            }),
          }),
    });

    let tls: { cert: Buffer; key: Buffer } | undefined;
    if (resolved.tlsCertFile && resolved.tlsKeyFile) {
      try {
        tls = { cert: readFileSync(resolved.tlsCertFile), key: readFileSync(resolved.tlsKeyFile) };
      } catch (cause) {
        throw new ControlPlaneError(
          "LLMGW_CONTROL_PLANE_TLS_INVALID",
          `cannot read --tls-cert ${resolved.tlsCertFile} / --tls-key ${resolved.tlsKeyFile}: ${(cause as Error).message}`,
          { cause },
        );
      }
    }
    const listenerLimits = {
      headersTimeoutMs: resolved.headersTimeoutMs,
      requestTimeoutMs: resolved.requestTimeoutMs,
      keepAliveTimeoutMs: resolved.keepAliveTimeoutMs,
      ...(tls === undefined ? {} : { tls }),
    };
    const publicCaps = {
      maxConnections: resolved.maxConnections,
      maxConnectionsPerAddress: resolved.maxConnectionsPerAddress,
    };
    const makeServer = (
      handler: HttpHandler,
      caps: { readonly maxConnections: number; readonly maxConnectionsPerAddress: number },
    ): Server => {
      const failed = (req: IncomingMessage, res: ServerResponse, error: unknown): void => {
        log(`request ${req.method} ${req.url} failed: ${(error as Error).message}`);
        if (!res.headersSent) res.writeHead(500, { "content-type": "application/json" });
        res.end();
      };
      // A promise only for handlers that return one: a promise plus a closure per request is
      // what the router's hot path was rid of.
      const listener = (req: IncomingMessage, res: ServerResponse): void => {
        let result: void | Promise<void>;
        try {
          result = handler(req, res);
        } catch (error) {
          failed(req, res, error);
          return;
        }
        if (result instanceof Promise) result.catch((error: unknown) => failed(req, res, error));
      };
      // The one server factory the router uses too.
      const server = createHttpListener({ ...listenerLimits, ...caps }, listener);
      servers.push(server);
      return server;
    };

    const agentServiceOptions = {
      loadStreamMs: resolved.agentStreamMs,
      heartbeatStreams: true,
      shutdown: shutdown.signal,
    };
    // An 8-GPU inventory is a few KiB; this bounds what an unauthenticated caller can send.
    const readMaxBytes = 4 * 1024 * 1024;
    // The agents' client streams in the encoding agents use, without Connect's per-message
    // async iterables (see agent-stream-fast-path.ts); anything else goes to Connect.
    const agentStreams = createAgentStreamFastPath(
      createAgentStreams(cluster, agentServiceOptions),
      { readMaxBytes },
    );
    const connect = connectNodeAdapter({
      // WatchRouting's watchdog tears down the socket of a router that stopped reading.
      contextValues: routerServiceContextValues,
      interceptors: [errorMappingInterceptor],
      readMaxBytes,
      routes: (router: ConnectRouter) => {
        router.service(
          AgentService,
          createAgentService(cluster, dataDir.joinToken, agentServiceOptions),
        );
        router.service(
          ClusterService,
          createClusterService(cluster, dataDir.adminToken, {
            version: CONTROL_PLANE_VERSION,
            shutdown: shutdown.signal,
            routers,
            flushRouting: () => routing.flush(),
          }),
        );
        router.service(
          RouterService,
          createRouterService(routing, routers, dataDir.routerToken, {
            shutdown: shutdown.signal,
            maxQueued: resolved.routingMaxQueued,
            keepaliveMs: resolved.routingKeepaliveMs,
          }),
        );
        answerMalformedRequestsAsInvalidArgument(router);
      },
    });
    const controlServer = makeServer(
      async (req, res) => {
        const path = pathOf(req);
        if (path === "/healthz") return healthz(res);
        if (path === "/metrics" && req.method === "GET") {
          const body = await metricsEndpoint.body();
          res.writeHead(200, { "content-type": metricsEndpoint.contentType });
          res.end(body);
          return;
        }
        if (agentStreams(req, res)) return;
        connect(req, res);
      },
      {
        maxConnections: resolved.maxControlConnections,
        maxConnectionsPerAddress: resolved.maxControlConnectionsPerAddress,
      },
    );

    const scheme = tls ? "https" : "http";
    const controlUrl = `${scheme}://${await listen(controlServer, resolved.controlListen, "--control-listen")}`;

    let publicUrl: string | undefined;
    if (resolved.publicApi) {
      // The in-process router is a router like any other: it counts in every router's share
      // and is listed by ListRouters; what it was last handed is recorded like a stream's.
      let last: RoutingMessage | undefined;
      const feed: RoutingFeed = {
        subscribe: (listener) =>
          routing.subscribe((message) => {
            last = message;
            routerSession?.sent(message);
            listener(message);
          }),
      };
      router = await startRouter({
        routing: {
          feed,
          routerId: IN_PROCESS_ROUTER_ID,
          version: CONTROL_PLANE_VERSION,
          stateDir: join(dataDir.dir, "router"),
          log: (event) => log(`router ${JSON.stringify(event)}`),
        },
        router: { noAuth: resolved.noAuth },
        listener: { ...listenerLimits, ...publicCaps },
        listen: resolved.listen,
        registry,
        log: (event) => log(`router ${JSON.stringify(event)}`),
      }).catch((error: unknown) => {
        throw asControlPlaneError(error, resolved.listen);
      });
      publicUrl = router.url;
      routerSession = routers.connect({
        id: IN_PROCESS_ROUTER_ID,
        address: new URL(router.url).host,
        version: CONTROL_PLANE_VERSION,
        inProcess: true,
      });
      if (last !== undefined) routerSession.sent(last);
    }
    log(
      `control plane listening: control ${controlUrl}, public ${publicUrl ?? "off (--no-public-api)"}, data dir ${resolved.dataDir}`,
    );

    timer = setInterval(
      () => cluster.tick(),
      Math.max(50, Math.min(1_000, resolved.heartbeatIntervalMs / 2)),
    );
    timer.unref();

    let closing: Promise<ShutdownReport> | undefined;
    const inProcess = router;
    return {
      controlUrl,
      publicUrl,
      options: resolved,
      cluster,
      store,
      registry,
      joinToken: dataDir.joinToken,
      adminToken: dataDir.adminToken,
      routerToken: dataDir.routerToken,
      routing,
      routers,
      router: inProcess,
      close() {
        closing ??= (async () => {
          const started = Date.now();
          clearInterval(timer);
          // Ends every WatchRouting stream (Unavailable): remote routers move on to another
          // control plane or keep serving from what they hold.
          shutdown.abort(
            new ControlPlaneError(
              "LLMGW_CONTROL_PLANE_SHUTTING_DOWN",
              "the control plane is shutting down",
            ),
          );
          const [forced, routerReport] = await Promise.all([
            closeServers(servers, resolved.shutdownGraceMs),
            inProcess?.stop(resolved.shutdownGraceMs),
          ]);
          routerSession?.close();
          routing.close();
          store.close();
          const anyForced = forced || routerReport?.forced === true;
          log(
            `control plane stopped after ${Date.now() - started} ms${anyForced ? " (connections closed by force)" : ""}`,
          );
          return { durationMs: Date.now() - started, forced: anyForced };
        })();
        return closing;
      },
    };
  } catch (error) {
    clearInterval(timer);
    shutdown.abort();
    await closeServers(servers, 0);
    await router?.stop(0);
    routerSession?.close();
    publisher?.close();
    store.close();
    throw error;
  }
}

/**
 * The in-process router's start errors in the control plane's terms, so that callers (the
 * CLI) see one error base: its listener is the control plane's `--listen`.
 */
function asControlPlaneError(error: unknown, listenAddress: string): unknown {
  if (!isRouterServiceError(error)) return error;
  if (error.code === "LLMGW_ROUTER_LISTEN_FAILED") {
    const reason = error.cause instanceof Error ? error.cause.message : error.message;
    return new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_LISTEN_FAILED",
      `cannot listen on ${listenAddress} (--listen): ${reason}`,
      { cause: error },
    );
  }
  const code =
    error.code === "LLMGW_ROUTER_TLS_INVALID"
      ? "LLMGW_CONTROL_PLANE_TLS_INVALID"
      : error.code === "LLMGW_ROUTER_CONFIG_INVALID"
        ? "LLMGW_CONTROL_PLANE_CONFIG_INVALID"
        : "LLMGW_CONTROL_PLANE_STORE_FAILED";
  return new ControlPlaneError(code, `the in-process router: ${error.message}`, { cause: error });
}

/** Stops accepting, lets in-flight requests finish until `graceMs`, then closes by force. */
async function closeServers(servers: readonly Server[], graceMs: number): Promise<boolean> {
  let forced = false;
  await Promise.all(
    servers.map(
      (server) =>
        new Promise<void>((resolve) => {
          if (!server.listening) return resolve();
          const deadline = setTimeout(() => {
            forced = true;
            server.closeAllConnections();
          }, graceMs);
          // Keep-alive sockets turn idle as their last request finishes; close each then.
          const sweep = setInterval(() => server.closeIdleConnections(), 25);
          server.close(() => {
            clearTimeout(deadline);
            clearInterval(sweep);
            resolve();
          });
          server.closeIdleConnections();
        }),
    ),
  );
  return forced;
}
