import { hostname } from "node:os";
import {
  isRouterServiceError,
  parseRouterConfig,
  ROUTER_FLAGS,
  type RouterConfig,
  startRouterDaemon,
} from "@llmgw/router-server";
import { type Command, parseCommandArgs, UsageError } from "../command.js";
import { createConsoleLogger } from "../logger.js";
import { LLMGW_VERSION } from "../version.js";

const USAGE = `Usage: llmgw router --control-plane URL[,URL...] --router-token-file FILE [options]

Runs a router until SIGINT/SIGTERM: the OpenAI-compatible API (/v1/*), /healthz and /readyz
on --listen, routing by the state the control plane streams (WatchRouting). It keeps serving
from its last state while no control plane answers, and saves that state in --state-dir, so a
router restarted during an outage serves at once. /readyz answers 503 until it has a state.
Run as many as you like behind a load balancer: each takes its share of every replica's
capacity and of every key's limits. On a stop it stops accepting, lets in-flight requests
finish (--shutdown-grace) and saves its state.

Control plane:
  --control-plane URL[,URL...]
                            control listeners of the control planes, tried in turn
                            (repeatable; env LLMGW_CONTROL_PLANE)
  --router-token-file FILE  file holding the router token ('llmgw control-plane token
                            --router'; env LLMGW_ROUTER_TOKEN_FILE)
  --router-token T          the token itself; prefer the env LLMGW_ROUTER_TOKEN or the file:
                            argv is visible in ps
  --control-plane-ca FILE   PEM CA bundle trusted for https:// control planes
  --state-dir DIR           saved routing state and router id, 0700
                            (default /var/lib/llmgw/router, env LLMGW_STATE_DIR)
  --router-id ID            id shown by 'llmgw routers' (default: made once, kept in
                            the state dir)
  --address HOST:PORT       where clients reach this router, for 'llmgw routers'
                            (default: this host's name and the --listen port)
  --max-state-age D         once no control plane has confirmed its state for this long
                            (10s–720h), refuse requests (503 router_state_stale) and fail
                            /readyz until one answers: keys revoked meanwhile stop working
                            here too (default: no limit, serving through any outage)

Peers (routers behind one balancer, routing as one):
  --peer URL[,URL...]       the other routers' public URLs (repeatable; env LLMGW_ROUTER_PEERS):
                            each router tells the others where it sent each request, so that
                            every one counts the whole fleet's queued prompts and keeps a
                            tenant on the replica any of them chose
  --peer-key-file FILE      the key the routers share, one line, at least 16 characters, the
                            same file on every router (env LLMGW_ROUTER_PEER_KEY_FILE, or the
                            key itself in LLMGW_ROUTER_PEER_KEY)
  --peer-ca FILE            PEM CA bundle trusted for https:// peers (routers serving
                            --tls-cert), besides the system's

Listeners:
  --listen HOST:PORT        public listener (default :8080)
  --metrics-listen HOST:PORT  /metrics, /readyz, /healthz (default 127.0.0.1:9464; "off")
  --tls-cert FILE           serve the public listener over TLS (with --tls-key)
  --tls-key FILE
  --max-header-bytes SIZE   largest request head; larger answers 431 (default 16KiB)
  --headers-timeout D       time a client has to send a request head (default 30s; then 408)
  --request-timeout D       time a client has to send a whole request, body included
                            (default 60s; then 408; answers and streams are not limited)
  --keep-alive-timeout D    idle keep-alive connections close after this (default 5s)
  --max-connections N       open connections at once (default 4096)
  --max-connections-per-address N
                            open connections from one client address, an IPv6 client by
                            its /64 (default 1024; behind a load balancer, one address for
                            every client, raise it to --max-connections)
  --shutdown-grace D        how long a stop lets in-flight requests finish (default 10s)

Requests:
  --no-auth                 serve without API keys (demos only)
  --max-body SIZE           largest request body; larger answers 413 (default 8MiB)
  --too-large-drain D       after a 413, how long the rest of the body is read before the
                            connection closes (default 5s)
  --too-large-drain-bytes SIZE
                            after a 413, most bytes read before it closes (default 64MiB)
  --queue-length N          requests waiting for a replica, per deployment (default 256;
                            0: refuse at once when every replica is full)
  --queue-timeout D         longest wait for a replica; then 429 (default 30s)
  --critical-headroom PCT   how far past a deployment's capacity critical requests may go,
                            in percent of it (default 100: as much again; 0: not at all)
  --critical-prefill-reserve N
                            while critical requests arrive, replicas kept free of the other
                            classes' streamed prefills, so a critical request never waits
                            behind one (default: a quarter of each deployment's replicas,
                            at least 1; 0: off)
  --cache-isolation MODE    whose requests share an engine's prefix cache, so that no one
                            learns from a cache hit what someone else sent: none (default:
                            everyone, as the engines do), tenant (a tenant's keys; a key of
                            no tenant alone), key (each key alone). Chat, completion
                            and embedding requests get a salt of their tenant or key
                            (vLLM, SGLang), or no cache reuse (llama.cpp). Needs API
                            keys. Give every router the same mode
  --session-header NAME     a header naming a session (e.g. x-session-id): its requests go to
                            the same replica while it has room (a body's prompt_cache_key
                            wins; it wins over user / safety_identifier; default: none)
  --upstream-connect-timeout D
                            TCP connect to an engine (default 5s)
  --upstream-headers-timeout D
                            an engine's time to its response head (default 5m: long prefills)
  --upstream-body-timeout D an engine's longest pause between body chunks (default 5m)
  --client-stall-timeout D  a client's longest time reading nothing of its answer (default 1m)
  --upstream-connections N  connections per replica (default 256)
  --analyzer-threads N      worker threads reading large request bodies (default 2;
                            0: all on the main thread)
  --inline-analysis-bytes SIZE
                            bodies smaller than this are read on the main thread
                            (default 16KiB)

Durations: 500ms, 30s, 5m, 1h, or a number of seconds. Sizes: 65536, 64KiB, 8MiB, 1GiB.
`;

export const command: Command = {
  name: "router",
  summary: "run a router (the OpenAI-compatible API) apart from the control plane",
  usage: USAGE,
  async run(argv, io) {
    const { values } = parseCommandArgs(argv, ROUTER_FLAGS);
    let config: RouterConfig;
    try {
      config = parseRouterConfig(values, { env: io.env, hostname: hostname() });
    } catch (error) {
      if (isRouterServiceError(error)) throw new UsageError(error.message);
      throw error;
    }
    if (config.routerToken.kind === "flag") {
      io.stderr.write(
        "llmgw router: warning: --router-token puts the secret on the command line, where every local user can read it (ps, /proc); use --router-token-file or LLMGW_ROUTER_TOKEN in the router's environment file instead\n",
      );
    }
    const logger = createConsoleLogger(io.stderr, "router");
    const log = (event: Readonly<Record<string, unknown>>) => {
      const { event: name, code, ...fields } = event;
      const line = `${String(name ?? "event")}${code === undefined ? "" : ` [${String(code)}]`}`;
      if (code === undefined) logger.info(line, fields);
      else logger.warn(line, fields);
    };
    let daemon: Awaited<ReturnType<typeof startRouterDaemon>>;
    try {
      daemon = await startRouterDaemon(config, {
        version: LLMGW_VERSION,
        log,
        ...(process.getuid === undefined ? {} : { uid: process.getuid() }),
      });
    } catch (error) {
      if (isRouterServiceError(error)) {
        if (error.code === "LLMGW_ROUTER_CONFIG_INVALID") throw new UsageError(error.message);
        io.stderr.write(`llmgw router: ${error.message} [${error.code}]\n`);
        return 1;
      }
      throw error;
    }
    const readiness = daemon.router.runtime.readiness();
    logger.info("listening", {
      public: daemon.router.url,
      metrics: daemon.metricsUrl ?? "off",
      routerId: daemon.routerId,
      controlPlanes: config.controlPlanes.join(","),
      state: readiness.source,
      stateAgeMs: readiness.stateAgeMs,
    });
    if (config.router.noAuth)
      logger.warn("--no-auth: the public API accepts requests without API keys");
    await new Promise<void>((resolve) => {
      if (io.signal.aborted) return resolve();
      io.signal.addEventListener("abort", () => resolve(), { once: true });
    });
    logger.info("shutting down", {
      reason: String((io.signal.reason as Error)?.message ?? io.signal.reason),
      graceMs: config.shutdownGraceMs,
    });
    const report = await daemon.close();
    logger.info("stopped", { durationMs: report.durationMs, forced: report.forced });
    return 0;
  },
};
