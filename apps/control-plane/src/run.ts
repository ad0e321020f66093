import { readFileSync } from "node:fs";
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import type { ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { createClusterCollector, createMetricsEndpoint } from "@llmgw/metrics-collector";
import { AgentService, ClusterService } from "@llmgw/proto";
import { createHttpListener } from "@llmgw/router-server";
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
import { createAgentService } from "./rpc/agent-service.js";
import { createClusterService } from "./rpc/cluster-service.js";
import { answerMalformedRequestsAsInvalidArgument } from "./rpc/decode-errors.js";
import { errorMappingInterceptor } from "./rpc/errors.js";
import { openSqliteStore } from "./store/sqlite-store.js";
import type { ClusterStore } from "./store/types.js";

/** The version the control plane reports in `GetClusterStatus`. */
export const CONTROL_PLANE_VERSION = "0.1.0";

/** A Node HTTP request handler. */
export type HttpHandler = (req: IncomingMessage, res: ServerResponse) => void | Promise<void>;

/** What the public listener's handler factory receives (the router's seam). */
export interface PublicHandlerContext {
  readonly cluster: Cluster;
  readonly options: ResolvedControlPlaneOptions;
  /** The control listener's registry: add router metric families here. */
  readonly registry: Registry;
  /** Aborted when the control plane begins to shut down. */
  readonly shutdown: AbortSignal;
  readonly log: (line: string) => void;
}

/** Handler built by {@link ControlPlaneDeps.publicHandler}; `close` runs at shutdown. */
export interface PublicHandler {
  readonly handle: HttpHandler;
  close?(): Promise<void>;
}

/** Injected collaborators; every one has a production default. */
export interface ControlPlaneDeps {
  readonly clock?: Clock;
  /** Default: `schedule` from `@llmgw/scheduler`. */
  readonly schedule?: ScheduleFn;
  /** One line per transition and decision. Default: silent. */
  readonly log?: (line: string) => void;
  /** Builds the public listener's handler (the OpenAI router); default answers 404 JSON. */
  readonly publicHandler?: (ctx: PublicHandlerContext) => PublicHandler | Promise<PublicHandler>;
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
  /** e.g. "http://127.0.0.1:8080": /v1/*, /healthz. */
  readonly publicUrl: string;
  readonly options: ResolvedControlPlaneOptions;
  readonly cluster: Cluster;
  readonly store: ClusterStore;
  readonly registry: Registry;
  readonly joinToken: string;
  readonly adminToken: string;
  /** Stops accepting, finishes in-flight requests (force-closing after the grace), closes the store. */
  close(): Promise<ShutdownReport>;
}

function notFoundJson(res: ServerResponse, message: string): void {
  res.writeHead(404, { "content-type": "application/json" });
  res.end(JSON.stringify({ error: { message, type: "invalid_request_error", code: "not_found" } }));
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
 * control listener (Connect `AgentService` + `ClusterService`, `/metrics`, `/healthz`) and
 * the public listener (`/healthz` + the injected router). No process globals: signals and
 * exit codes belong to the CLI. Throws `ControlPlaneError` (config, store, TLS, listen).
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
  let publicHandler: PublicHandler | undefined;
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
    const registry = deps.registry ?? new Registry();
    // Cluster families are rendered straight to text at scrape time (76k samples at 1,000
    // nodes × 8 GPUs: half the CPU of going through prom-client); router families stay on
    // the registry.
    const metricsEndpoint = createMetricsEndpoint({
      registry,
      ...(deps.clusterMetrics === false
        ? {}
        : {
            cluster: createClusterCollector(registry, createClusterView(cluster), {
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
    const makeServer = (
      handler: HttpHandler,
      caps: { readonly maxConnections: number; readonly maxConnectionsPerAddress: number },
    ): Server => {
      const failed = (req: IncomingMessage, res: ServerResponse, error: unknown): void => {
        log(`request ${req.method} ${req.url} failed: ${(error as Error).message}`);
        if (!res.headersSent) res.writeHead(500, { "content-type": "application/json" });
        res.end();
      };
      // A promise only for handlers that return one: the router answers synchronously, and a
      // promise plus a closure per request is what its hot path was rid of.
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
      // The one server factory the router's tests and benchmarks use too.
      const server = createHttpListener({ ...listenerLimits, ...caps }, listener);
      servers.push(server);
      return server;
    };

    const connect = connectNodeAdapter({
      interceptors: [errorMappingInterceptor],
      // An 8-GPU inventory is a few KiB; this bounds what an unauthenticated caller can send.
      readMaxBytes: 4 * 1024 * 1024,
      routes: (router: ConnectRouter) => {
        router.service(AgentService, createAgentService(cluster, dataDir.joinToken));
        router.service(
          ClusterService,
          createClusterService(cluster, dataDir.adminToken, {
            version: CONTROL_PLANE_VERSION,
            shutdown: shutdown.signal,
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
        connect(req, res);
      },
      {
        maxConnections: resolved.maxControlConnections,
        maxConnectionsPerAddress: resolved.maxControlConnectionsPerAddress,
      },
    );

    publicHandler = deps.publicHandler
      ? await deps.publicHandler({
          cluster,
          options: resolved,
          registry,
          shutdown: shutdown.signal,
          log,
        })
      : undefined;
    const route = publicHandler?.handle;
    const publicServer = makeServer(
      (req, res) => {
        if (pathOf(req) === "/healthz") return healthz(res);
        if (route) return route(req, res);
        notFoundJson(res, `no route for ${req.method} ${pathOf(req)}`);
      },
      {
        maxConnections: resolved.maxConnections,
        maxConnectionsPerAddress: resolved.maxConnectionsPerAddress,
      },
    );

    const scheme = tls ? "https" : "http";
    const controlUrl = `${scheme}://${await listen(controlServer, resolved.controlListen, "--control-listen")}`;
    const publicUrl = `${scheme}://${await listen(publicServer, resolved.listen, "--listen")}`;
    log(
      `control plane listening: control ${controlUrl}, public ${publicUrl}, data dir ${resolved.dataDir}`,
    );

    timer = setInterval(
      () => cluster.tick(),
      Math.max(50, Math.min(1_000, resolved.heartbeatIntervalMs / 2)),
    );
    timer.unref();

    let closing: Promise<ShutdownReport> | undefined;
    const handler = publicHandler;
    return {
      controlUrl,
      publicUrl,
      options: resolved,
      cluster,
      store,
      registry,
      joinToken: dataDir.joinToken,
      adminToken: dataDir.adminToken,
      close() {
        closing ??= (async () => {
          const started = Date.now();
          clearInterval(timer);
          shutdown.abort(
            new ControlPlaneError(
              "LLMGW_CONTROL_PLANE_SHUTTING_DOWN",
              "the control plane is shutting down",
            ),
          );
          const forced = await closeServers(servers, resolved.shutdownGraceMs);
          await handler?.close?.();
          store.close();
          log(
            `control plane stopped after ${Date.now() - started} ms${forced ? " (connections closed by force)" : ""}`,
          );
          return { durationMs: Date.now() - started, forced };
        })();
        return closing;
      },
    };
  } catch (error) {
    clearInterval(timer);
    shutdown.abort();
    await closeServers(servers, 0);
    await publicHandler?.close?.();
    store.close();
    throw error;
  }
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
