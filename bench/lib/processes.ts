/**
 * The child processes of the benchmarks, so that the load generator, each engine and the router
 * get their own event loop (the router is what is measured, not a sim sharing its loop):
 *
 *   node --conditions=@llmgw/source --import tsx bench/lib/processes.ts sim '<EngineSimOptions JSON>'
 *   node --conditions=@llmgw/source --import tsx bench/lib/processes.ts sims '<SimsChildConfig JSON>'
 *   node --conditions=@llmgw/source --import tsx bench/lib/processes.ts router '<RouterChildConfig JSON>'
 *   node --conditions=@llmgw/source --import tsx bench/lib/processes.ts trivial '{"delayMs": 16}'
 *   node --conditions=@llmgw/source --import tsx bench/lib/processes.ts floor '{"upstream": "http://…"}'
 *   node --conditions=@llmgw/source --import tsx bench/lib/processes.ts idle '{}'
 *   LLMGW_ROUTER_TOKEN=… node --conditions=@llmgw/source --import tsx bench/lib/processes.ts \
 *     remote-router '<RemoteRouterChildConfig JSON>'
 *
 * Each prints one JSON line `{ "url": … }` when ready (`sims`: also `"urls": […]`, one per engine) and answers IPC requests
 * `{ id, type, … }` with `{ id, … }` (see {@link ChildRequest}). `restart` replaces the engine
 * (fresh prefix cache) or the router (fresh prefix index, new policy) inside the same process,
 * which costs milliseconds instead of a new tsx start (seconds on this loaded 2-core box).
 */
// The control plane does not export its router listener from the package root (only `.`,
// `./testing`, `./client`), so the bench reaches for the module directly.

import { createHash } from "node:crypto";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { type EngineSimOptions, type RunningEngineSim, startEngineSim } from "@llmgw/engine-sim";
import { createKvBlockFeed, type KvBlockFeed, startKvCacheServer } from "@llmgw/kv-events";
import { createMetricsRegistry } from "@llmgw/metrics-collector";
import { type EngineLoad, extractEngineLoad, parsePrometheusText } from "@llmgw/readiness";
import type {
  CacheIsolation,
  KeyGrant,
  RoutingPolicy,
  ScoringOptions,
  TenantGrant,
} from "@llmgw/router";
import { createManualRoutingFeed, type ManualRoutingFeed } from "@llmgw/router/testing";
import { type RunningRouter, startRouter } from "@llmgw/router-server";
import { monitorLoopDelay } from "./loop-delay.js";

/**
 * What the `router` role serves: one model over the given engines, no auth unless `auth`
 * grants keys, and the `llmgw_router_*` Prometheus families recorded as the control plane
 * records them.
 */
export interface RouterChildConfig {
  readonly model: string;
  readonly policy: RoutingPolicy;
  readonly upstreams: readonly string[];
  /**
   * Where the engines' loads are served already parsed (each `sims` child's `loadsUrl`, where
   * it does the agent's part): read every {@link ROUTER_LOAD_INTERVAL_MS}, as a router gets
   * them relayed by the control plane. Without it the router child reads every upstream's
   * `/metrics` and parses it on its own event loop, work `llmgw router` never does (16 engines
   * at 500 ms: 32 scrapes a second among the requests it is measured on).
   */
  readonly loadsFrom?: readonly string[];
  /** In-flight capacity the router assumes per replica. */
  readonly capacity: number;
  /**
   * Routers sharing the cluster, as the control plane streams it (default 1): each admits
   * `max(1, floor(capacity / routers))` per replica, as `llmgw router` behind a balancer does.
   */
  readonly routers?: number;
  /**
   * Precise mode (routing on the engines' KV-cache events): where each upstream's blocks are
   * served (`KvCacheService` of the `sims` child hosting it, as an agent serves its node's), in
   * upstream order, and the key those calls carry. The model then names the sim tokenizer.
   */
  readonly precise?: { readonly kvEventsUrls: readonly string[]; readonly key: string };
  /**
   * A header the router reads as an affinity hint (`llmgw router --session-header`); the
   * benchmark's client sends `x-session-id`.
   */
  readonly sessionHeader?: string;
  /** `llmgw router --cache-isolation` (needs `auth`; default none). */
  readonly cacheIsolation?: CacheIsolation;
  /** Scoring options of the `llmgw` policy (default: the router's defaults). */
  readonly scoring?: ScoringOptions;
  /**
   * API keys and tenants, as the control plane grants them: auth on (without it, `noAuth`),
   * every key a grant holding the sha256 of its secret.
   */
  readonly auth?: RouterChildAuth;
  /** This router's id (default "bench-router"; routers that are each other's peers differ). */
  readonly routerId?: string;
  /**
   * The other routers' URLs and the key they share (`llmgw router --peer`): each tells the
   * others what it sent. The child answers once its stream to every peer is open.
   */
  readonly peers?: { readonly urls: readonly string[]; readonly key: string };
  /** Per-deployment admission queue length (default 8192: the benches' loads never queue). */
  readonly maxQueueLength?: number;
  /** Longest admission wait, ms (default: the router's, 30 000). */
  readonly queueTimeoutMs?: number;
  /** `llmgw router --critical-prefill-reserve` (default: the router's, 1). */
  readonly criticalPrefillReserve?: number;
  /**
   * Record each answered request's usage and report it to the feed (default true, as
   * shipped); false is `startRouter`'s `recordUsage: false`, the baseline of what accounting
   * costs.
   */
  readonly recordUsage?: boolean;
}

/** One API key of a {@link RouterChildAuth}: its grant, by its secret. */
export interface RouterChildKey extends Omit<KeyGrant, "secretSha256"> {
  /**
   * What clients send as `Authorization: Bearer <secret>`. A bench's throwaway key, so it may
   * travel in the child's argv; the grant holds only its sha256.
   */
  readonly secret: string;
}

/** Keys and tenants of a `router` child (see {@link RouterChildConfig.auth}). */
export interface RouterChildAuth {
  readonly keys: readonly RouterChildKey[];
  readonly tenants?: readonly TenantGrant[];
}

/**
 * How often the `router` role reads each upstream's `/metrics` and passes its load on, as an
 * agent does with `--load-interval` (its running/waiting requests, KV usage and KV capacity:
 * what sizes the router's model of each replica's prefix cache).
 */
const ROUTER_LOAD_INTERVAL_MS = 500;

/**
 * What the `remote-router` role runs: `startRouter` watching a real control plane
 * (`WatchRouting`, the router token from `LLMGW_ROUTER_TOKEN` in the environment), API keys
 * on, as `llmgw router` runs it.
 */
export interface RemoteRouterChildConfig {
  /** The control plane's control URL. */
  readonly controlPlane: string;
  readonly routerId: string;
}

/**
 * A `remote-router`'s answer to `arrivals`: when (epoch ms, this process's clock) each key id
 * first appeared in its routing state and when it left it, since the process started.
 */
export interface KeyArrivals {
  readonly appeared: Readonly<Record<string, number>>;
  readonly gone: Readonly<Record<string, number>>;
}

/**
 * What the `sims` role runs: several simulated engines in one process, each its own HTTP
 * server on its own port (a fleet of 16 engines as 16 tsx processes is more than 2 cores
 * start and schedule; the engines' own work is small). `restart` restarts them all, on the
 * same ports where the OS allows, with `{ overrides }` merged into every engine's options
 * (the routing benchmark's rate sweep changes `timeScale` per rung this way).
 */
export interface SimsChildConfig {
  /** One entry per engine (port is always 0: the OS picks). */
  readonly sims: readonly EngineSimOptions[];
  /**
   * When set, the child also does what an agent does for `kvEvents` engines: subscribes to
   * each engine's KV events and serves their blocks (`KvCacheService`, printed as `kvUrl`),
   * under these replica ids (one per engine), to callers with this key.
   */
  readonly kv?: { readonly replicaIds: readonly string[]; readonly key: string };
  /**
   * When true, the child also does an agent's part for load: reads and parses each engine's
   * `/metrics` every {@link ROUTER_LOAD_INTERVAL_MS} and serves the results (printed as
   * `loadsUrl`, {@link EngineLoads}) for routers' `loadsFrom`.
   */
  readonly loads?: boolean;
}

/**
 * What a `sims` child serves at `GET {loadsUrl}` (the agent's load reports, see
 * {@link reportLoadsFrom}): each engine's load by its URL, as the agent's parser read it from the
 * engine's `/metrics`, and when.
 */
export type EngineLoads = Record<string, { readonly load: EngineLoad; readonly atMs: number }>;

/** The config of a `sims` child's `restart` (optional): merged into every engine's options. */
export interface SimsRestartConfig {
  readonly overrides?: Partial<EngineSimOptions>;
}

/** What the `trivial` role serves: a fixed answer, optionally after a fixed service time. */
export interface TrivialChildConfig {
  /**
   * Milliseconds between the end of the request body and the answer (a `setTimeout`), like an
   * engine with a fixed service time; 0 (the default) answers at once. With a delay the
   * in-flight count of a closed-loop client comes from this service time (Little's law) rather
   * than from saturating the proxy in front.
   */
  readonly delayMs?: number;
  /**
   * Spread of the service time as a fraction of `delayMs`: each answer waits a uniform random
   * time in `delayMs × [1 − jitter, 1 + jitter]` (default 0). A fixed time makes a closed-loop
   * client's requests travel in synchronized waves (all answered together, all re-sent
   * together), a convoy no real traffic has; engines' service times vary.
   */
  readonly jitter?: number;
}

/** IPC requests a child answers. */
export type ChildRequest =
  | { readonly id: number; readonly type: "restart"; readonly config?: unknown }
  | { readonly id: number; readonly type: "reset" }
  | { readonly id: number; readonly type: "report" }
  | { readonly id: number; readonly type: "arrivals" };

/** The router's answer to `report`: main-loop delay since the last `reset`, and CPU time. */
export interface RouterReport {
  readonly loopP50Ms: number;
  readonly loopP99Ms: number;
  readonly loopMaxMs: number;
  /** Router process CPU (user + system) since the last `reset`, µs. */
  readonly cpuUs: number;
}

/**
 * Main-loop delay and CPU from `reset` to `report`. Started in the router and in the `idle`
 * probe: on a box whose run queue is many times its core count, an idle process's loop delay
 * is the OS scheduling delay every process suffers, the floor under the router's figure.
 * The sampling timer runs only in that window: it wakes the process every 5 ms, and a dozen
 * idle children doing that all run long were ~2,000 wake-ups a second on the load core.
 */
function loopMonitor(): { reset(): void; report(): RouterReport } {
  const delay = monitorLoopDelay(5);
  delay.disable();
  let cpu0 = process.cpuUsage();
  return {
    reset() {
      delay.reset();
      delay.enable();
      cpu0 = process.cpuUsage();
    },
    report() {
      const cpu = process.cpuUsage(cpu0);
      delay.disable();
      return {
        loopP50Ms: delay.percentileMs(50),
        loopP99Ms: delay.percentileMs(99),
        loopMaxMs: delay.maxMs(),
        cpuUs: cpu.user + cpu.system,
      };
    },
  };
}

/**
 * Answers `reset` and `report` from `monitor`, and `restart` with `restart` (the new URL) where
 * the role has one; without it `restart` is answered like `reset`, with nothing done.
 */
function answerWithMonitor(
  monitor: ReturnType<typeof loopMonitor>,
  restart?: (config: unknown) => Promise<string>,
  extra?: () => Promise<Record<string, unknown>>,
): void {
  process.on("message", (raw) => {
    const msg = raw as ChildRequest;
    if (msg.type === "restart" && restart) {
      // A refused config is answered, not left to crash the child (the caller sees `error`).
      void restart(msg.config).then(
        (url) => reply({ id: msg.id, url }),
        (error: unknown) => reply({ id: msg.id, error: (error as Error).message }),
      );
      return;
    }
    if (msg.type === "reset") monitor.reset();
    if (msg.type === "report" && extra !== undefined) {
      void extra().then((more) => reply({ id: msg.id, ...monitor.report(), ...more }));
      return;
    }
    reply({ id: msg.id, ...(msg.type === "report" ? monitor.report() : {}) });
  });
}

const [role, configText] = process.argv.slice(2);
// Never outlive the benchmark that started us (it may be killed before its cleanup runs).
process.on("disconnect", () => process.exit(0));
const reply = (msg: Record<string, unknown>): void => {
  process.send?.(msg);
};

if (role === "trivial") {
  // The calibration's trivial upstream: reads the whole body, answers a fixed ~300-byte JSON
  // body, or 16 SSE chunks in one write burst. For the 200 KB rows, where the simulated
  // engine's own tokenising (~0.2 s of CPU per 200 KB prompt here) would be the bottleneck.
  // With `delayMs` > 0 the answer waits that long after the body ended (the paced rows).
  const { createServer } = await import("node:http");
  const trivialConfig = JSON.parse(configText ?? "{}") as TrivialChildConfig;
  const delayMs = Math.max(0, Number(trivialConfig.delayMs ?? 0));
  const jitter = Math.min(1, Math.max(0, Number(trivialConfig.jitter ?? 0)));
  const serviceMs = (): number => delayMs * (1 - jitter + 2 * jitter * Math.random());
  const json = JSON.stringify({
    id: "chatcmpl-trivial",
    object: "chat.completion",
    created: 1,
    model: "m",
    choices: [
      {
        index: 0,
        message: { role: "assistant", content: "ok ".repeat(40) },
        finish_reason: "stop",
      },
    ],
    usage: { prompt_tokens: 10, completion_tokens: 40, total_tokens: 50 },
  });
  const streamMarker = '"stream":true';
  const chunk = `data: ${JSON.stringify({ id: "c", object: "chat.completion.chunk", choices: [{ index: 0, delta: { content: "tok " } }] })}\n\n`;
  const server = createServer({ noDelay: true }, (req, res) => {
    let stream = false;
    // The marker may straddle two chunks: look at the previous chunk's end joined to this one's.
    let seam = "";
    req.on("data", (d: Buffer) => {
      if (!stream) {
        stream =
          d.includes(streamMarker) ||
          (seam + d.toString("latin1", 0, streamMarker.length)).includes(streamMarker);
        seam = (seam + d.toString("latin1", Math.max(0, d.length - streamMarker.length))).slice(
          -streamMarker.length,
        );
      }
    });
    const answer = (): void => {
      if (res.destroyed) return; // the client left while we "computed" (end of a wrk run)
      if (!stream) {
        res.writeHead(200, {
          "content-type": "application/json",
          "content-length": Buffer.byteLength(json),
        });
        res.end(json);
        return;
      }
      res.writeHead(200, { "content-type": "text/event-stream" });
      for (let i = 0; i < 16; i++) res.write(chunk);
      res.end("data: [DONE]\n\n");
    };
    req.on("end", () => {
      if (delayMs > 0) setTimeout(answer, serviceMs());
      else answer();
    });
  });
  server.keepAliveTimeout = 60_000;
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  console.log(
    JSON.stringify({ url: `http://127.0.0.1:${(server.address() as { port: number }).port}` }),
  );
  process.on("message", (raw) => reply({ id: (raw as ChildRequest).id }));
  process.on("SIGTERM", () => process.exit(0));
} else if (role === "floor") {
  // The Node floor: the least a Node proxy can do per request (node:http server, one
  // JSON.parse, undici `dispatch` with a raw handler, bytes streamed back). No auth, scoring,
  // admission or metrics: what is left between it and llmgw is llmgw's own cost, and what is
  // left between it and nginx is the runtime's.
  const { createServer } = await import("node:http");
  const { Pool } = await import("undici");
  const upstream = (JSON.parse(configText ?? "{}") as { upstream: string }).upstream;
  const pool = new Pool(upstream, { connections: 256, keepAliveTimeout: 30_000 });
  const server = createServer({ noDelay: true }, (req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks);
      let model: unknown;
      try {
        model = (JSON.parse(body.toString()) as { model?: unknown }).model;
      } catch {}
      if (typeof model !== "string") {
        res.writeHead(400).end();
        return;
      }
      // Correct, not just fast: a client that goes away aborts the upstream request, or a
      // paused stream would hold its pool connection forever.
      let abortUpstream: ((reason: Error) => void) | undefined;
      res.once("close", () => {
        if (!res.writableFinished) abortUpstream?.(new Error("client went away"));
      });
      pool.dispatch(
        {
          path: req.url ?? "/",
          method: "POST",
          headers: { "content-type": "application/json" },
          body,
        },
        {
          onRequestStart(controller) {
            abortUpstream = (reason) => controller.abort(reason);
            if (res.destroyed) controller.abort(new Error("client went away"));
          },
          onResponseStart(_controller, statusCode, headers) {
            const out: Record<string, string> = {};
            const type = headers["content-type"];
            const length = headers["content-length"];
            if (typeof type === "string") out["content-type"] = type;
            if (typeof length === "string") out["content-length"] = length;
            res.writeHead(statusCode, out);
          },
          onResponseData(controller, chunk) {
            if (!res.write(chunk)) {
              controller.pause();
              res.once("drain", () => controller.resume());
            }
          },
          onResponseEnd() {
            res.end();
          },
          onResponseError() {
            if (res.destroyed) return;
            if (!res.headersSent) res.writeHead(502);
            res.end();
          },
        },
      );
    });
  });
  server.keepAliveTimeout = 60_000;
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  console.log(
    JSON.stringify({ url: `http://127.0.0.1:${(server.address() as { port: number }).port}` }),
  );
  answerWithMonitor(loopMonitor());
  process.on("SIGTERM", () => process.exit(0));
} else if (role === "idle") {
  answerWithMonitor(loopMonitor());
  console.log(JSON.stringify({ url: "" }));
} else if (role === "sim") {
  const options = JSON.parse(configText ?? "{}") as EngineSimOptions;
  let sim: RunningEngineSim = await startEngineSim({ ...options, port: 0 });
  process.on("message", (raw) => {
    const msg = raw as ChildRequest;
    if (msg.type === "restart") {
      void (async () => {
        const port = sim.port;
        await sim.close();
        // Same port when the OS allows it, so callers' URLs stay valid.
        sim = await startEngineSim({ ...options, port }).catch(() =>
          startEngineSim({ ...options, port: 0 }),
        );
        reply({ id: msg.id, url: sim.url });
      })();
    } else reply({ id: msg.id, error: `unknown request ${msg.type}` });
  });
  console.log(JSON.stringify({ url: sim.url }));
  process.on("SIGTERM", () => void sim.close().then(() => process.exit(0)));
} else if (role === "sims") {
  const config = JSON.parse(configText ?? "{}") as SimsChildConfig;
  let sims: RunningEngineSim[] = await Promise.all(
    config.sims.map((options) => startEngineSim({ ...options, port: 0 })),
  );
  const urls = (): string[] => sims.map((s) => s.url);
  // The agent's part for KV events: one feed per engine, served on one port.
  let feeds = new Map<string, KvBlockFeed>();
  const follow = (): void => {
    const kv = config.kv;
    if (kv === undefined) return;
    feeds = new Map(
      sims.flatMap((s, i) => {
        const endpoint = s.kvEvents?.endpoint;
        const id = kv.replicaIds[i];
        return endpoint === undefined || id === undefined
          ? []
          : [[id, createKvBlockFeed({ endpoint })] as const];
      }),
    );
  };
  follow();
  // The agent's part for load: each engine's /metrics read and parsed every interval, served
  // to routers already parsed (as the control plane relays an agent's reports).
  let loads: EngineLoads = {};
  const readLoads = async (): Promise<void> => {
    const next: EngineLoads = {};
    await Promise.all(
      sims.map(async (s) => {
        const load = await readEngineLoad(s.url);
        if (load !== undefined) next[s.url] = { load, atMs: Date.now() };
      }),
    );
    loads = next;
  };
  let loadsUrl: string | undefined;
  if (config.loads === true) {
    setInterval(() => void readLoads(), ROUTER_LOAD_INTERVAL_MS).unref();
    void readLoads();
    const loadsServer = createServer((_req, res) => {
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(loads));
    });
    await new Promise<void>((resolve) => loadsServer.listen(0, "127.0.0.1", resolve));
    loadsUrl = `http://127.0.0.1:${(loadsServer.address() as AddressInfo).port}/loads`;
  }
  const kvServer =
    config.kv === undefined
      ? undefined
      : await startKvCacheServer({
          registry: {
            get: (id) => {
              const feed = feeds.get(id);
              return feed === undefined ? undefined : { feed, apiKey: config.kv?.key };
            },
          },
        });
  process.on("message", (raw) => {
    const msg = raw as ChildRequest;
    if (msg.type !== "restart") {
      reply({ id: msg.id, error: `unknown request ${msg.type}` });
      return;
    }
    const overrides = (msg.config as SimsRestartConfig | undefined)?.overrides ?? {};
    void (async () => {
      const ports = sims.map((s) => s.port);
      await Promise.all([
        ...sims.map((s) => s.close()),
        ...[...feeds.values()].map((f) => f.close()),
      ]);
      sims = await Promise.all(
        config.sims.map((options, i) => {
          const next = { ...options, ...overrides };
          // Same port when the OS allows it, so callers' URLs (and proxy configs) stay valid.
          return startEngineSim({ ...next, port: ports[i] ?? 0 }).catch(() =>
            startEngineSim({ ...next, port: 0 }),
          );
        }),
      );
      follow();
      if (loadsUrl !== undefined) void readLoads();
      reply({ id: msg.id, url: sims[0]?.url ?? "", urls: urls(), kvUrl: kvServer?.url, loadsUrl });
    })();
  });
  console.log(
    JSON.stringify({ url: sims[0]?.url ?? "", urls: urls(), kvUrl: kvServer?.url, loadsUrl }),
  );
  process.on(
    "SIGTERM",
    () => void Promise.all(sims.map((s) => s.close())).then(() => process.exit(0)),
  );
} else if (role === "router") {
  // THE router server, as `llmgw router` runs it, fed the way the control plane feeds it.
  let stopLoads = (): void => {};
  const start = async (config: RouterChildConfig, port = 0): Promise<RunningRouter> => {
    const feed = createManualRoutingFeed();
    const precise = config.precise;
    feed.push({
      kind: "snapshot",
      epoch: "bench",
      version: 1,
      models: [
        {
          name: config.model,
          deployment: config.model,
          policy: config.policy,
          loading: false,
          ...(precise === undefined ? {} : { tokenizer: "sim" as const }),
          // The simulator keys its cache with `cache_salt`, as the control plane says of vLLM.
          cacheIsolation: "salt" as const,
        },
      ],
      replicas: config.upstreams.map((baseUrl, i) => {
        const kvEventsUrl = precise?.kvEventsUrls[i];
        return {
          id: `r${i}`,
          model: config.model,
          deployment: config.model,
          baseUrl,
          state: "ready" as const,
          capacity: config.capacity,
          ...(precise === undefined ? {} : { apiKey: precise.key }),
          ...(kvEventsUrl === undefined ? {} : { kvEventsUrl }),
        };
      }),
      keys: (config.auth?.keys ?? []).map(
        ({ secret, ...grant }): KeyGrant => ({
          ...grant,
          secretSha256: createHash("sha256").update(secret).digest("hex"),
        }),
      ),
      ...(config.auth?.tenants === undefined ? {} : { tenants: config.auth.tenants }),
      routers: config.routers ?? 1,
      sentAtMs: Date.now(),
    });
    stopLoads();
    stopLoads =
      config.loadsFrom === undefined
        ? reportLoads(feed, config.upstreams)
        : reportLoadsFrom(feed, config.upstreams, config.loadsFrom);
    const running = await startRouter({
      routing: { feed, routerId: config.routerId ?? "bench-router" },
      ...(config.peers === undefined ? {} : { peers: config.peers }),
      listen: `127.0.0.1:${port}`,
      // Every request updates the router's metric families, as in production.
      registry: createMetricsRegistry(),
      ...(config.recordUsage === false ? { recordUsage: false } : {}),
      router: {
        noAuth: config.auth === undefined,
        maxBodyBytes: 16 * 1024 * 1024,
        maxQueueLength: config.maxQueueLength ?? 8192,
        ...(config.queueTimeoutMs === undefined ? {} : { queueTimeoutMs: config.queueTimeoutMs }),
        ...(config.criticalPrefillReserve === undefined
          ? {}
          : { criticalPrefillReserve: config.criticalPrefillReserve }),
        ...(config.sessionHeader === undefined ? {} : { sessionHeader: config.sessionHeader }),
        ...(config.cacheIsolation === undefined ? {} : { cacheIsolation: config.cacheIsolation }),
        ...(config.scoring === undefined ? {} : { picker: { scoring: config.scoring } }),
      },
      listener: { requestTimeoutMs: 300_000 },
    });
    if (config.peers !== undefined) {
      // The peers restart at the same time: wait (10 s at most) until each stream is open.
      const want = config.peers.urls.length;
      const deadline = Date.now() + 10_000;
      const connected = async () =>
        (await running.registry.getSingleMetric("llmgw_router_peers_connected")?.get())?.values[0]
          ?.value ?? 0;
      while ((await connected()) < want && Date.now() < deadline)
        await new Promise((r) => setTimeout(r, 20));
    }
    return running;
  };
  let router = await start(JSON.parse(configText ?? "{}") as RouterChildConfig);
  answerWithMonitor(
    loopMonitor(),
    async (config) => {
      const port = router.port;
      await router.close(0);
      router = await start(config as RouterChildConfig, port).catch(() =>
        start(config as RouterChildConfig, 0),
      );
      return router.url;
    },
    // How the router's prefix model fared against the engines' cached tokens since it started.
    async () => {
      const predictions: Record<string, number> = {};
      const family = (await router.registry.getMetricsAsJSON()).find(
        (m) => m.name === "llmgw_router_prefix_predictions_total",
      );
      for (const v of (family?.values ?? []) as {
        labels: Record<string, string>;
        value: number;
      }[]) {
        const key = `${v.labels.source} ${v.labels.outcome}`;
        predictions[key] = (predictions[key] ?? 0) + v.value;
      }
      return { predictions };
    },
  );
  console.log(JSON.stringify({ url: router.url }));
  process.on("SIGTERM", () => void router.close(0).then(() => process.exit(0)));
} else if (role === "remote-router") {
  // A router of the control-plane benchmark: a real WatchRouting stream into a RoutingState.
  // It notes when each key grant arrives and leaves (the delta fan-out delay) on every
  // membership change, which is when deltas are applied; load updates do not call it.
  const config = JSON.parse(configText ?? "{}") as RemoteRouterChildConfig;
  const routerToken = process.env.LLMGW_ROUTER_TOKEN;
  if (!routerToken) throw new Error("remote-router: LLMGW_ROUTER_TOKEN is not set");
  const router = await startRouter({
    routing: { controlPlanes: [config.controlPlane], routerToken, routerId: config.routerId },
    registry: createMetricsRegistry(),
    router: { maxQueueLength: 8192 },
    listener: { requestTimeoutMs: 300_000 },
  });
  const appeared: Record<string, number> = {};
  const gone: Record<string, number> = {};
  let held = new Set<string>();
  router.runtime.state.onMembershipChange(() => {
    const now = Date.now();
    const keys = new Set((router.runtime.state.snapshot()?.keys ?? []).map((k) => k.id));
    for (const id of keys) if (!held.has(id) && appeared[id] === undefined) appeared[id] = now;
    for (const id of held) if (!keys.has(id) && gone[id] === undefined) gone[id] = now;
    held = keys;
  });
  const monitor = loopMonitor();
  process.on("message", (raw) => {
    const msg = raw as ChildRequest;
    if (msg.type === "arrivals") {
      reply({ id: msg.id, appeared, gone } satisfies KeyArrivals & { id: number });
      return;
    }
    if (msg.type === "reset") monitor.reset();
    reply({ id: msg.id, ...(msg.type === "report" ? monitor.report() : {}) });
  });
  console.log(JSON.stringify({ url: router.url }));
  process.on("SIGTERM", () => void router.close(0).then(() => process.exit(0)));
} else {
  console.error(
    "usage: processes.ts sim|sims|router|trivial|floor|idle|remote-router '<config JSON>' (see the top of the file)",
  );
  process.exit(2);
}

/** One engine's load as a routing feed takes it. */
type LoadSample = { replicaId: string; load: EngineLoad; reportedAtMs: number };

/**
 * Pushes what `read` returns to `feed` every {@link ROUTER_LOAD_INTERVAL_MS}, as the control
 * plane relays agents' reports. Returns the function that stops it.
 */
function pushLoads(feed: ManualRoutingFeed, read: () => Promise<LoadSample[]>): () => void {
  let stopped = false;
  const round = async (): Promise<void> => {
    const samples = await read();
    if (!stopped) feed.push({ kind: "load", epoch: "bench", samples });
  };
  const timer = setInterval(() => void round(), ROUTER_LOAD_INTERVAL_MS);
  timer.unref();
  void round();
  return () => {
    stopped = true;
    clearInterval(timer);
  };
}

/**
 * An engine's load from its `/metrics`, read with the agent's parser; undefined when the engine
 * does not answer (restarting between measurements: nothing to report this time).
 */
async function readEngineLoad(engineUrl: string): Promise<EngineLoad | undefined> {
  try {
    const res = await fetch(`${engineUrl}/metrics`, { signal: AbortSignal.timeout(2_000) });
    return extractEngineLoad(parsePrometheusText(await res.text()));
  } catch {
    return undefined;
  }
}

/** Reads each upstream's `/metrics` and parses it here (the same parser the agent uses). */
function reportLoads(feed: ManualRoutingFeed, upstreams: readonly string[]): () => void {
  return pushLoads(feed, async () => {
    const samples = await Promise.all(
      upstreams.map(async (url, i) => {
        const load = await readEngineLoad(url);
        return load === undefined ? [] : [{ replicaId: `r${i}`, load, reportedAtMs: Date.now() }];
      }),
    );
    return samples.flat();
  });
}

/**
 * Reads the engines' loads, already parsed, from each of `sources` (the `sims` children's
 * `loadsUrl`), under the replica ids of `upstreams` (`r${i}`).
 */
function reportLoadsFrom(
  feed: ManualRoutingFeed,
  upstreams: readonly string[],
  sources: readonly string[],
): () => void {
  return pushLoads(feed, async () => {
    const answers = await Promise.all(
      sources.map(async (url) => {
        try {
          const res = await fetch(url, { signal: AbortSignal.timeout(2_000) });
          return (await res.json()) as EngineLoads;
        } catch {
          return {}; // a child restarting its engines: nothing to report
        }
      }),
    );
    const byUrl: EngineLoads = Object.assign({}, ...answers);
    return upstreams.flatMap((url, i) => {
      const got = byUrl[url];
      return got === undefined
        ? []
        : [{ replicaId: `r${i}`, load: got.load, reportedAtMs: got.atMs }];
    });
  });
}
