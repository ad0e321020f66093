import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import type { IncomingMessage, Server, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { hostname } from "node:os";
import { join } from "node:path";
import type { DescService } from "@bufbuild/protobuf";
import {
  Code,
  ConnectError,
  type ConnectRouter,
  type HandlerContext,
  type Interceptor,
  type ServiceImpl,
} from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import type { ConsoleAsset } from "@llmgw/console";
import {
  type ClusterView,
  type ControlPlaneMetrics,
  createClusterCollector,
  createControlPlaneMetrics,
  createMetricsEndpoint,
  createUsageMetrics,
  type UsageMetrics,
} from "@llmgw/metrics-collector";
import { AgentService, ClusterService, RouterService } from "@llmgw/proto";
import type { RoutingFeed, RoutingMessage } from "@llmgw/router";
import {
  createHttpListener,
  isRouterServiceError,
  type RunningRouter,
  startRouter,
} from "@llmgw/router-server";
import { schedule as defaultSchedule } from "@llmgw/scheduler";
import { LLMGW_VERSION, usageAnswerFromProto, usageBatchToProto } from "@llmgw/wire";
import { Registry } from "prom-client";
import { createClusterView } from "./cluster-view.js";
import {
  type ControlPlaneOptions,
  type ResolvedControlPlaneOptions,
  resolveControlPlaneOptions,
  splitListenAddress,
} from "./config.js";
import { type Clock, Cluster, type InventoryLookup } from "./domain/cluster.js";
import type { ScheduleFn } from "./domain/reconcile.js";
import { joinHostPort } from "./domain/replica-state.js";
import { initDataDir } from "./domain/tokens.js";
import { budgetSpecs, ClusterUsage, usageByTenantAndModel } from "./domain/usage.js";
import { ControlPlaneError } from "./errors.js";
import { createRoutingPublisher, type RoutingPublisher } from "./routing/publisher.js";
import {
  createRouterRegistry,
  type RouterRegistry,
  type RouterSession,
} from "./routing/router-registry.js";
import { createAgentFastPath } from "./rpc/agent-fast-path.js";
import { createAgentCalls, createAgentService, createAgentStreams } from "./rpc/agent-service.js";
import { type ControlPlaneInstanceInfo, createClusterService } from "./rpc/cluster-service.js";
import { answerMalformedRequestsAsInvalidArgument } from "./rpc/decode-errors.js";
import {
  COPY_AGE_HEADER,
  ERROR_CODE_HEADER,
  errorMappingInterceptor,
  LEADER_HEADER,
  SERVED_BY_HEADER,
} from "./rpc/errors.js";
import { createRouterService, routerServiceContextValues } from "./rpc/router-service.js";
import { usageReportToProto, validateReportUsageRequest } from "./rpc/usage-requests.js";
import { type LeaderInfo, type LeaderLease, startLeaderLease } from "./store/postgres-lease.js";
import { openPostgresDatabase, openPostgresStore } from "./store/postgres-store.js";
import { openPostgresUsageStore } from "./store/postgres-usage-store.js";
import { snapshotStore } from "./store/snapshot-store.js";
import { openSqliteStore } from "./store/sqlite-store.js";
import type { ClusterStore } from "./store/types.js";
import type { UsageStore } from "./store/usage-store.js";
import { startWarmCopy, type WarmCopy, type WarmCopyState } from "./store/warm-copy.js";
import { type ConsoleHttp, createConsoleHttp } from "./ui/console-http.js";
import { type ProxyTrust, parseTrustedProxies } from "./ui/proxy-trust.js";

/** The version the control plane reports in `GetClusterStatus`. */
export const CONTROL_PLANE_VERSION = LLMGW_VERSION;

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
  /** The web console, e.g. "http://127.0.0.1:7070/ui/"; undefined with `ui: false`. */
  readonly consoleUrl: string | undefined;
  readonly options: ResolvedControlPlaneOptions;
  /**
   * The cluster state, the store and the routing feed of the current leadership term. Over
   * PostgreSQL they change with each term, and reading one while following throws
   * `LLMGW_CONTROL_PLANE_NOT_LEADER`; over SQLite they never change.
   */
  readonly cluster: Cluster;
  readonly store: ClusterStore;
  /** The usage routers report (`ReportUsage`), of the current term like `cluster`. */
  readonly usage: ClusterUsage;
  /** True while this instance leads (always over SQLite). */
  readonly leading: boolean;
  /** The leader lease over PostgreSQL; undefined over SQLite. */
  readonly lease: LeaderLease | undefined;
  /** Where the state lives, without secrets: the SQLite file or the PostgreSQL URL. */
  readonly storeLocation: string;
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

/**
 * The console's built files, or why they cannot be loaded: `@llmgw/console` was not built
 * (running from source before `pnpm build`; the `llmgw` bundle always has them compiled in).
 * The control plane then answers `/ui/` with how to build it and logs the reason.
 */
async function loadConsoleAssets(): Promise<readonly ConsoleAsset[] | string> {
  try {
    return (await import("@llmgw/console")).assets;
  } catch (error) {
    return (error as Error).message;
  }
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

/** A refusal from a follower: `Unavailable`, with the leader's URL when one is known. */
function notLeader(self: string, leader: LeaderInfo | undefined): ConnectError {
  const where =
    leader === undefined
      ? "no instance holds the leader lease now (one takes it within seconds, or the state store is unreachable)"
      : `the leader is ${leader.url}`;
  return new ConnectError(
    `this control plane (${self}) is a follower: ${where}`,
    Code.Unavailable,
    {
      [ERROR_CODE_HEADER]: "LLMGW_CONTROL_PLANE_NOT_LEADER",
      ...(leader === undefined ? {} : { [LEADER_HEADER]: leader.url }),
    },
  );
}

/** Every method of `service` answering `refuse()`: what a follower serves. */
function refusingService<S extends DescService>(
  service: S,
  refuse: () => ConnectError,
): ServiceImpl<S> {
  const impl: Record<string, unknown> = {};
  for (const method of service.methods) {
    impl[method.localName] =
      method.methodKind === "server_streaming" || method.methodKind === "bidi_streaming"
        ? // biome-ignore lint/correctness/useYield: it refuses before its first message
          async function* () {
            throw refuse();
          }
        : async () => {
            throw refuse();
          };
  }
  return impl as ServiceImpl<S>;
}

/** The `ClusterService` reads a follower answers from its warm copy of the state. */
export const FOLLOWER_READS: ReadonlySet<string> = new Set([
  "listNodes",
  "getNode",
  "getDeployment",
  "listDeployments",
  "listReplicas",
  "listApiKeys",
  "listTenants",
  "listEvents",
  "getClusterStatus",
]);

/** What a follower serves reads from: a read-only cluster over a snapshot, and its service. */
interface FollowerCopy {
  readonly cluster: Cluster;
  readonly service: ServiceImpl<typeof ClusterService>;
}

/**
 * A follower's `ClusterService`: the reads of {@link FOLLOWER_READS} from its warm copy,
 * marked as such ({@link SERVED_BY_HEADER}, {@link COPY_AGE_HEADER}, the leader when known);
 * every other call, and any read before the first copy, refused as {@link notLeader}.
 */
function followerClusterService(
  refuse: () => ConnectError,
  copy: () => WarmCopyState<FollowerCopy> | undefined,
  leader: () => LeaderInfo | undefined,
): ServiceImpl<typeof ClusterService> {
  const impl = refusingService(ClusterService, refuse) as Record<string, unknown>;
  for (const method of ClusterService.methods) {
    const name = method.localName;
    if (!FOLLOWER_READS.has(name)) continue;
    impl[name] = (req: unknown, ctx: HandlerContext) => {
      const held = copy();
      if (held === undefined) throw refuse();
      ctx.responseHeader.set(SERVED_BY_HEADER, "follower");
      ctx.responseHeader.set(COPY_AGE_HEADER, String(Math.max(0, Date.now() - held.readAtMs)));
      const url = leader()?.url;
      if (url !== undefined) ctx.responseHeader.set(LEADER_HEADER, url);
      const read = (held.value.service as Record<string, unknown>)[name] as (
        req: unknown,
        ctx: HandlerContext,
      ) => unknown;
      return read(req, ctx);
    };
  }
  return impl as ServiceImpl<typeof ClusterService>;
}

/**
 * Unary answers wait until what the call changed is durable (`ClusterStore.flush`): nothing
 * a client was told is lost when the leader dies. Streams wait per message where it matters
 * (`WatchDesired`).
 */
function durableAnswers(store: ClusterStore): Interceptor {
  return (next) => async (req) => {
    const res = await next(req);
    if (!res.stream) await store.flush();
    return res;
  };
}

/** What one leadership term runs: over SQLite the one term lasts the process's life. */
interface Term {
  readonly cluster: Cluster;
  readonly store: ClusterStore;
  readonly usage: ClusterUsage;
  /** Where `usage` lives: closed with the term (the SQLite one closes with the store). */
  readonly usageStore: UsageStore;
  readonly routing: RoutingPublisher;
  readonly view: ClusterView;
  readonly handle: (req: IncomingMessage, res: ServerResponse) => void;
  readonly shutdown: AbortController;
  readonly timer: NodeJS.Timeout;
}

/**
 * Starts a control plane: data dir and tokens, the store, the routing feed, the control
 * listener (Connect `AgentService`, `ClusterService` and `RouterService`, `/metrics`,
 * `/healthz`) and, unless `publicApi` is false, the in-process router (`startRouter` over
 * the routing feed, on `listen`). Over SQLite it leads at once. Over PostgreSQL it contends
 * for the leader lease: while it follows, every RPC answers `Unavailable` naming the leader
 * (`llmgw-leader`), and once it wins, it loads the state and leads until it stops or loses
 * the lease. No process globals: signals and exit codes belong to the CLI. Throws
 * `ControlPlaneError` (config, store, TLS, listen) or the router's `RouterServiceError`.
 */
export async function startControlPlane(
  options: ControlPlaneOptions,
  deps: ControlPlaneDeps = {},
): Promise<ControlPlane> {
  const resolved = resolveControlPlaneOptions(options);
  const log = deps.log ?? (() => {});
  const clock = deps.clock ?? { now: () => Date.now() };
  const dataDir = initDataDir(resolved.dataDir);
  const postgres =
    resolved.store === "sqlite:"
      ? undefined
      : await openPostgresDatabase({
          url: resolved.store,
          tokens: [dataDir.joinToken, dataDir.adminToken, dataDir.routerToken],
        });
  const sqlite =
    postgres === undefined
      ? openSqliteStore({
          file: dataDir.databaseFile,
          eventsKept: resolved.eventsKept,
          expectExisting: dataDir.initialisedBefore,
          onBackup: (backup, from, to) =>
            log(
              `state store backed up to ${backup} before migrating it from schema ${from} to ${to}`,
            ),
        })
      : undefined;
  const storeLocation = postgres?.location ?? dataDir.databaseFile;
  const stopping = new AbortController();
  const servers: Server[] = [];
  let term: Term | undefined;
  let lease: LeaderLease | undefined;
  let router: RunningRouter | undefined;
  let routerSession: RouterSession | undefined;
  const routers = createRouterRegistry({ log, keepaliveMs: resolved.routingKeepaliveMs });
  /** Subscribers of the in-process router's feed → their subscription to this term's feed. */
  const relayed = new Map<(message: RoutingMessage) => void, (() => void) | undefined>();
  // The in-process router is a router like any other: it counts in every router's share and
  // is listed by ListRouters; what it was last handed is recorded like a stream's. Between
  // terms it keeps serving from what it holds.
  let last: RoutingMessage | undefined;
  const relay: RoutingFeed = {
    subscribe(listener) {
      const recorded = (message: RoutingMessage) => {
        last = message;
        routerSession?.sent(message);
        listener(message);
      };
      relayed.set(recorded, term?.routing.subscribe(recorded));
      return () => {
        relayed.get(recorded)?.();
        relayed.delete(recorded);
      };
    },
    // The in-process router's in-flight counts, for drains, as a remote router's report.
    reportInFlight(report) {
      term?.cluster.reportInFlight(IN_PROCESS_ROUTER_ID, report);
    },
    // The in-process router's usage, checked and stored as a remote router's batch is (the
    // RPC itself refuses this router's reserved id). No term (not leading): refused, and the
    // router keeps the batch for the next one.
    async reportUsage(routerId, batch) {
      const current = term;
      if (current === undefined) throw new Error("this control plane does not lead now");
      const request = usageBatchToProto(routerId, batch);
      const report = await current.usage.report(validateReportUsageRequest(request, Date.now()));
      return usageAnswerFromProto(usageReportToProto(report));
    },
  };
  const readMaxBytes = 4 * 1024 * 1024;
  let selfUrl = "";
  /** The `llmgw_usage_*` families: cumulative over this process's terms. */
  let usageMetrics: UsageMetrics | undefined;
  let controlPlaneMetrics: ControlPlaneMetrics | undefined;

  const clusterOptions = (store: ClusterStore) => ({
    store,
    // A draining replica stops once every router connected now reported nothing in flight.
    connectedRouters: () =>
      routers
        .list()
        .filter((r) => r.connected)
        .map((r) => r.id),
    schedule: deps.schedule ?? defaultSchedule,
    clock,
    heartbeatIntervalMs: resolved.heartbeatIntervalMs,
    unreachableAfterMs: resolved.heartbeatIntervalMs * resolved.unreachableAfterMissed,
    nodeLostAfterMs: resolved.nodeLostAfterMs,
    moveFailedAfterMs: resolved.moveFailedAfterMs,
    rolloutProgressDeadlineMs: resolved.rolloutProgressDeadlineMs,
    rendezvousPortMin: resolved.rendezvousPortMin,
    rendezvousPortMax: resolved.rendezvousPortMax,
    maxNodes: resolved.maxNodes,
  });
  const storeKind = postgres === undefined ? "sqlite" : "postgres";
  /** The instances as last read: what `GetClusterStatus` shows while the database is down. */
  let instances: ControlPlaneInstanceInfo[] = [];
  let instancesFailing = false;
  const controlPlanes = async (): Promise<readonly ControlPlaneInstanceInfo[]> => {
    if (lease === undefined) return [];
    const leader = lease.leader;
    try {
      instances = (await lease.instances()).map((i) => ({ ...i, leader: i.id === leader?.holder }));
      instancesFailing = false;
    } catch (error) {
      // A follower answers from its copy while the database is unreachable; so does this.
      // Once per outage: status pollers would repeat it every call.
      if (!instancesFailing)
        log(
          `cannot list the control-plane instances (showing the last list read): ${(error as Error).message}`,
        );
      instancesFailing = true;
    }
    return instances;
  };

  const startTerm = (
    store: ClusterStore,
    usageStore: UsageStore,
    inventories?: InventoryLookup,
  ): Term => {
    const shutdown = new AbortController();
    const cluster = new Cluster({
      ...clusterOptions(store),
      ...(inventories === undefined ? {} : { inventories }),
      log,
      onReconciled: (ms) => controlPlaneMetrics?.reconciled(ms / 1000),
      defer: (run) => {
        setImmediate(() => {
          if (!shutdown.signal.aborted) run();
        });
      },
    });
    const usage = new ClusterUsage({
      store: usageStore,
      clock,
      budgets: budgetSpecs(
        () => cluster.routingTenants(),
        () => cluster.routingKeys(),
      ),
      tenantCreatedAt: (name) => cluster.tenants.get(name)?.createdAtMs,
      onStored: (records) => {
        for (const { tenant, model, counts } of usageByTenantAndModel(records)) {
          // A tenant deleted since (or never defined) is one series, not one per name.
          const known = tenant === "" || cluster.tenants.get(tenant) !== undefined;
          usageMetrics?.add(known ? tenant : "other", model, counts);
        }
      },
      log,
    });
    // Standings ready before the first batch; a failure is retried by the first batch.
    usage.load().catch((error: unknown) => {
      log(`usage: cannot load this month's totals yet: ${(error as Error).message}`);
    });
    const routing = createRoutingPublisher(cluster, {
      routers,
      coalesceMs: resolved.routingCoalesceMs,
      loadFlushMs: resolved.routingLoadFlushMs,
      keepaliveMs: resolved.routingKeepaliveMs,
      log,
    });
    const agentServiceOptions = {
      loadStreamMs: resolved.agentStreamMs,
      heartbeatStreams: true,
      shutdown: shutdown.signal,
      durable: () => store.flush(),
    };
    // The agents' frequent calls in the encoding agents use, without Connect's per-call and
    // per-message machinery (see agent-fast-path.ts); anything else goes to Connect.
    const agentFastPath = createAgentFastPath({
      streams: createAgentStreams(cluster, agentServiceOptions),
      calls: createAgentCalls(cluster, agentServiceOptions),
      durable: () => store.flush(),
      readMaxBytes,
    });
    const connect = connectNodeAdapter({
      // WatchRouting's watchdog tears down the socket of a router that stopped reading.
      contextValues: routerServiceContextValues,
      interceptors: [errorMappingInterceptor, durableAnswers(store)],
      readMaxBytes,
      routes: (r: ConnectRouter) => {
        r.service(
          AgentService,
          createAgentService(cluster, dataDir.joinToken, agentServiceOptions),
        );
        r.service(
          ClusterService,
          createClusterService(cluster, dataDir.adminToken, {
            version: CONTROL_PLANE_VERSION,
            shutdown: shutdown.signal,
            routers,
            flushRouting: () => routing.flush(),
            store: storeKind,
            controlPlanes,
            usage,
          }),
        );
        r.service(
          RouterService,
          createRouterService(routing, routers, dataDir.routerToken, {
            shutdown: shutdown.signal,
            maxQueued: resolved.routingMaxQueued,
            keepaliveMs: resolved.routingKeepaliveMs,
            onInFlight: (routerId, report) => cluster.reportInFlight(routerId, report),
            onUsage: (batch) => usage.report(batch),
            now: () => clock.now(),
          }),
        );
        answerMalformedRequestsAsInvalidArgument(r);
      },
    });
    const timer = setInterval(
      () => {
        cluster.tick();
        usage.tick();
      },
      Math.max(50, Math.min(1_000, resolved.heartbeatIntervalMs / 2)),
    );
    timer.unref();
    for (const listener of relayed.keys()) relayed.set(listener, routing.subscribe(listener));
    return {
      cluster,
      store,
      usage,
      usageStore,
      routing,
      view: createClusterView(cluster, routers),
      handle: (req, res) => {
        if (agentFastPath(req, res)) return;
        connect(req, res);
      },
      shutdown,
      timer,
    };
  };
  /** Ends `ended`: its streams end with `reason`, its feed detaches, its store closes. */
  const endTerm = (ended: Term, reason: ControlPlaneError): void => {
    if (term === ended) term = undefined;
    clearInterval(ended.timer);
    ended.shutdown.abort(reason);
    for (const [listener, unsubscribe] of relayed) {
      unsubscribe?.();
      relayed.set(listener, undefined);
    }
    ended.routing.close();
    ended.store.close();
    const { usage, usageStore } = ended;
    void usage
      .close()
      .then(() => usageStore.close())
      .catch((error: unknown) => log(`usage: closing the store: ${(error as Error).message}`));
  };

  /** While following over PostgreSQL: the state as last read, for reads. */
  let warm: WarmCopy<FollowerCopy> | undefined;
  const follower = connectNodeAdapter({
    readMaxBytes,
    interceptors: [errorMappingInterceptor],
    routes: (r: ConnectRouter) => {
      const refuse = () => notLeader(selfUrl, lease?.leader);
      r.service(AgentService, refusingService(AgentService, refuse));
      r.service(
        ClusterService,
        followerClusterService(
          refuse,
          () => warm?.current,
          () => lease?.leader,
        ),
      );
      r.service(RouterService, refusingService(RouterService, refuse));
    },
  });

  try {
    // Before the first term: its Cluster reconciles as it starts.
    const registry = deps.registry ?? new Registry();
    usageMetrics = createUsageMetrics(registry);
    controlPlaneMetrics = createControlPlaneMetrics(registry);
    if (sqlite !== undefined) term = startTerm(sqlite, sqlite.usage);
    // Cluster families are rendered straight to text at scrape time (76k samples at 1,000
    // nodes × 8 GPUs: half the CPU of going through prom-client); router families stay on
    // the registry. A follower exports none: it holds no cluster state.
    const view: ClusterView = {
      nodes: () => term?.view.nodes() ?? [],
      deployments: () => term?.view.deployments() ?? [],
      replicas: () => term?.view.replicas() ?? [],
      routers: () => term?.view.routers?.() ?? [],
    };
    const metricsEndpoint = createMetricsEndpoint({
      registry,
      ...(deps.clusterMetrics === false
        ? {}
        : { cluster: createClusterCollector(registry, view, { exposition: "text" }) }),
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

    let ui: ConsoleHttp | undefined;
    if (resolved.ui) {
      const assets = await loadConsoleAssets();
      if (typeof assets === "string")
        log(`console: cannot load @llmgw/console (${assets}); /ui/ says to run pnpm build`);
      ui = createConsoleHttp({
        adminToken: dataDir.adminToken,
        assets: typeof assets === "string" ? undefined : assets,
        secure: tls !== undefined,
        ...(resolved.trustedProxies.length === 0
          ? {}
          : { trustedProxies: parseTrustedProxies(resolved.trustedProxies) as ProxyTrust }),
        sessionTtlMs: resolved.uiSessionTtlMs,
        log,
      });
    }
    const scrape = async (res: ServerResponse): Promise<void> => {
      // Written as rendered, in the render's own buffers: lent until the response closes.
      const out = await metricsEndpoint.exposition();
      res.on("close", out.release);
      res.writeHead(200, {
        "content-type": metricsEndpoint.contentType,
        "content-length": out.byteLength,
      });
      for (const chunk of out.chunks) res.write(chunk);
      res.end();
    };
    const controlServer = makeServer(
      // Not async: a heartbeat (hundreds a second) makes no promise here.
      (req, res) => {
        const path = pathOf(req);
        if (path === "/healthz") return healthz(res);
        if (path === "/metrics" && req.method === "GET") return scrape(res);
        if (ui !== undefined && (ui.handle(req, res, path) || !ui.admit(req, res, path))) return;
        if (term !== undefined) term.handle(req, res);
        else follower(req, res);
      },
      {
        maxConnections: resolved.maxControlConnections,
        maxConnectionsPerAddress: resolved.maxControlConnectionsPerAddress,
      },
    );

    const scheme = tls ? "https" : "http";
    const controlUrl = `${scheme}://${await listen(controlServer, resolved.controlListen, "--control-listen")}`;
    selfUrl = resolved.advertiseUrl?.replace(/\/+$/, "") ?? controlUrl;

    let publicUrl: string | undefined;
    if (resolved.publicApi) {
      router = await startRouter({
        routing: {
          feed: relay,
          routerId: IN_PROCESS_ROUTER_ID,
          version: CONTROL_PLANE_VERSION,
          stateDir: join(dataDir.dir, "router"),
          log: (event) => log(`router ${JSON.stringify(event)}`),
        },
        router: { noAuth: resolved.noAuth, cacheIsolation: resolved.cacheIsolation },
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
        cacheIsolation: resolved.cacheIsolation,
        // Under --no-auth no request has a tenant whose isolation it could apply.
        appliesTenantCacheIsolation: !resolved.noAuth,
      });
      if (last !== undefined) routerSession.sent(last);
    }

    if (postgres !== undefined) {
      const database = postgres;
      const instanceId = `${hostname()}-${process.pid}-${randomBytes(3).toString("hex")}`;
      /** Bumped on every election and deposal: a store loaded for an older one is dropped. */
      let elections = 0;
      const follow = () => {
        if (warm !== undefined || stopping.signal.aborted) return;
        warm = startWarmCopy({
          database,
          eventsKept: resolved.eventsKept,
          log,
          build: (snapshot): FollowerCopy => {
            const previous = warm?.current?.value.cluster;
            return readsOf(
              new Cluster({
                ...clusterOptions(snapshotStore(snapshot, database.location)),
                readOnly: true,
                ...(previous === undefined ? {} : { inventories: previous.inventories() }),
              }),
            );
          },
        });
      };
      const readsOf = (cluster: Cluster): FollowerCopy => ({
        cluster,
        service: createClusterService(cluster, dataDir.adminToken, {
          version: CONTROL_PLANE_VERSION,
          shutdown: stopping.signal,
          store: storeKind,
          controlPlanes,
        }),
      });
      const unfollow = () => {
        void warm?.close();
        warm = undefined;
      };
      follow();
      const depose = (reason: string) => {
        elections++;
        follow();
        if (term === undefined) return;
        // Until its copy is read (the database may be what it lost), it answers reads from
        // the state it led with, frozen as the term ends.
        warm?.seed(readsOf(term.cluster), clock.now());
        endTerm(
          term,
          new ControlPlaneError(
            "LLMGW_CONTROL_PLANE_NOT_LEADER",
            `this control plane stopped leading: ${reason}`,
          ),
        );
      };
      lease = startLeaderLease({
        database,
        instanceId,
        url: selfUrl,
        version: CONTROL_PLANE_VERSION,
        ttlMs: resolved.leaseTtlMs,
        log,
        onDeposed: depose,
        onElected: (writer) => {
          const election = ++elections;
          // What the copy decoded need not be decoded again (most of loading a large cluster).
          const inventories = warm?.current?.value.cluster.inventories();
          unfollow();
          const startedAt = performance.now();
          openPostgresStore({
            database,
            writer,
            eventsKept: resolved.eventsKept,
            log,
            onFenced: (error) => {
              log(error.message);
              void lease?.resign(error.message, writer.epoch);
            },
          }).then(
            (store) => {
              if (election !== elections || stopping.signal.aborted) {
                store.close();
                return;
              }
              const usageStore = openPostgresUsageStore({
                database,
                writer,
                onFenced: (error) => {
                  log(error.message);
                  void lease?.resign(error.message, writer.epoch);
                },
              });
              try {
                term = startTerm(store, usageStore, inventories);
              } catch (error) {
                store.close();
                void usageStore.close();
                log(`cannot lead: ${(error as Error).message}`);
                void lease?.resign((error as Error).message, writer.epoch);
                return;
              }
              log(
                `leading (epoch ${writer.epoch}): state loaded from ${database.location} in ${Math.round(performance.now() - startedAt)} ms`,
              );
            },
            (error: unknown) => {
              // A load that failed after its term ended (deposed meanwhile) says nothing.
              if (election !== elections || stopping.signal.aborted) return;
              log(`cannot lead: ${(error as Error).message}`);
              void lease?.resign((error as Error).message, writer.epoch);
            },
          );
        },
      });
    }
    log(
      `control plane listening: control ${controlUrl}, public ${publicUrl ?? "off (--no-public-api)"}, data dir ${resolved.dataDir}, store ${storeLocation}`,
    );

    let closing: Promise<ShutdownReport> | undefined;
    const inProcess = router;
    const current = (): Term => {
      if (term !== undefined) return term;
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_NOT_LEADER",
        `this control plane (${selfUrl}) does not lead now`,
      );
    };
    return {
      controlUrl,
      consoleUrl: ui === undefined ? undefined : `${controlUrl}/ui/`,
      publicUrl,
      options: resolved,
      get cluster() {
        return current().cluster;
      },
      get store() {
        return current().store;
      },
      get usage() {
        return current().usage;
      },
      get routing() {
        return current().routing;
      },
      get leading() {
        return term !== undefined;
      },
      get lease() {
        return lease;
      },
      storeLocation,
      registry,
      joinToken: dataDir.joinToken,
      adminToken: dataDir.adminToken,
      routerToken: dataDir.routerToken,
      routers,
      router: inProcess,
      close() {
        closing ??= (async () => {
          const started = Date.now();
          stopping.abort();
          const shuttingDown = new ControlPlaneError(
            "LLMGW_CONTROL_PLANE_SHUTTING_DOWN",
            "the control plane is shutting down",
          );
          // Ends every stream (Unavailable): agents and remote routers move on to another
          // control plane or keep running what they hold.
          term?.shutdown.abort(shuttingDown);
          const [forced, routerReport] = await Promise.all([
            closeServers(servers, resolved.shutdownGraceMs),
            inProcess?.stop(resolved.shutdownGraceMs),
          ]);
          routerSession?.close();
          const ending = term;
          if (ending !== undefined) {
            // What was answered is durable already; this writes what ticks changed since.
            await ending.store.flush(resolved.shutdownGraceMs).catch((error: unknown) => {
              log(`stopping with unwritten changes: ${(error as Error).message}`);
            });
            endTerm(ending, shuttingDown);
          }
          await warm?.close();
          await lease?.close();
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
    stopping.abort();
    if (term !== undefined)
      endTerm(term, new ControlPlaneError("LLMGW_CONTROL_PLANE_SHUTTING_DOWN", "start failed"));
    sqlite?.close();
    await warm?.close();
    await lease?.close();
    await closeServers(servers, 0);
    await router?.stop(0);
    routerSession?.close();
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
