import { readFileSync, statSync } from "node:fs";
import {
  type ControlPlaneOptions,
  isControlPlaneError,
  parseTrustedProxies,
  startControlPlane,
} from "@llmgw/control-plane";
import { CACHE_ISOLATION_MODES, type CacheIsolation } from "@llmgw/router";
import { type Command, parseCommandArgs, UsageError } from "../command.js";
import { createConsoleLogger } from "../logger.js";

const USAGE = `Usage: llmgw control-plane [options]

Runs the control plane until SIGINT/SIGTERM: the agent, admin and router APIs
(Connect-RPC), /metrics and /healthz on the control listener; on the public listener, the
OpenAI-compatible API (/v1/*, /healthz, /readyz) by the same router 'llmgw router' runs,
in-process. Routers apart from it watch the routing state on the control listener. State
lives in the data dir (SQLite), created 0700 on first start with a join token, an admin
token and a router token ('llmgw control-plane token [--admin | --router]'); the
in-process router keeps its last routing state in <data-dir>/router.

Options:
  --listen HOST:PORT          public listener (default :8080)
  --no-public-api             no public listener and no in-process router: clients reach
                              'llmgw router' processes instead
  --control-listen HOST:PORT  control listener (default 127.0.0.1:7070; use :7070 with TLS
                              so agents on other hosts can reach it)
  --data-dir DIR              state and tokens (env LLMGW_DATA_DIR, default /var/lib/llmgw/control-plane)
  --store URL                 where the state lives: sqlite: (default, state.db in the data
                              dir, one instance) or postgres://USER@HOST:PORT/DB (several
                              instances share it, one leads). A URL with a password is
                              refused here (argv is public): use --store-url-file or
                              LLMGW_STORE_URL, or PGPASSWORD / ~/.pgpass
  --store-url-file FILE       read the store URL from FILE (keep it 0600: a password in a
                              file every local user may read is warned about)
  --advertise-url URL         this instance's control URL as agents and the CLI on other
                              hosts reach it; followers hand it out as the leader's
                              (default: the control listener's URL)
  --lease-ttl D               PostgreSQL: how long the leader lease holds unrenewed, so
                              the longest a dead leader goes unreplaced (default 2s)
  --tls-cert FILE             serve both listeners over TLS (with --tls-key)
  --tls-key FILE
  --heartbeat-interval D      how often agents heartbeat (default 2s)
  --node-lost-after D         how long an unreachable node may stay silent before its
                              replicas move elsewhere (default 60s)
  --move-failed-after D       how long a replica may keep failing (its agent relaunching
                              it) before it moves to another node that has room, which its
                              deployment then avoids for an hour (default 5m; 0: never)
  --rollout-progress-deadline D
                              how long a rolling update may have new replicas that cannot
                              be placed, none of them turning ready, before it is rolled
                              back to the previous revision's spec (default 10m; 0: never)
  --routing-keepalive D       how often a quiet routing stream carries a keepalive to
                              routers (default 2s); a router that has not read a message
                              within 3 of these is cut off, one that hears nothing for 3
                              reconnects. Raise it for routers on very slow links
  --agent-stream D            how long an agent keeps each of its streams (heartbeats,
                              desired-set watch, load reports) open before it opens the
                              next (default 20s or half of a shorter --request-timeout; at
                              most half of it); 0: each heartbeat and report is its own
                              call (for a proxy in front of the control listener that
                              buffers request bodies)
  --no-ui                     no web console (default: served at /ui/ on the control
                              listener; log in with the admin token)
  --ui-session-ttl D          how long a console login lasts (default 12h)
  --trusted-proxy CIDR        a reverse proxy in front of the control listener (address or
                              range; repeatable): the console believes its X-Forwarded-For
                              (failed logins throttled per client) and X-Forwarded-Proto
                              (https: a Secure cookie)
  --no-auth                   public API without API keys (demos only)
  --cache-isolation MODE      whose requests share an engine's prefix cache: none (default),
                              tenant (a tenant's keys), key (each key alone); see
                              llmgw router --help
  --headers-timeout D         time a client has to send a request head, both listeners
                              (default 30s; then 408)
  --request-timeout D         time a client has to send a whole request, body included
                              (default 60s; then 408; answers and streams are not limited)
  --max-connections N         open public connections at once (default 4096)
  --max-control-connections N open control connections at once (default 4096; an agent
                              holds two, one for its load stream); keep both caps
                              together below the process's open-file limit
  --max-connections-per-address N
                              open public connections from one client address, an
                              IPv6 client by its /64 (default 1024; behind a load
                              balancer, which is one address for every client, raise it
                              to --max-connections)
  --max-control-connections-per-address N
                              open control connections from one client address (IPv6:
                              its /64; default 1024, so one address cannot lock out the
                              others)
  --max-nodes N               nodes held at most; a Register that would add one more is
                              refused (default 10000)

Durations: 500ms, 30s, 5m, 1h, or a number of seconds.
`;

/** `--cache-isolation`'s mode. */
function cacheIsolationFlag(text: string): CacheIsolation {
  const mode = CACHE_ISOLATION_MODES.find((m) => m === text);
  if (mode !== undefined) return mode;
  throw new UsageError(
    `--cache-isolation must be one of ${CACHE_ISOLATION_MODES.join(", ")}, got "${text}"`,
  );
}

/** `--trusted-proxy`'s entries, each an address or range, repeated or comma-separated. */
function trustedProxiesFlag(given: readonly string[]): string[] {
  const entries = given.flatMap((v) => v.split(",")).map((v) => v.trim());
  const trust = parseTrustedProxies(entries);
  if (typeof trust === "string") throw new UsageError(`--trusted-proxy: ${trust}`);
  return entries;
}

/** A whole number ≥ 1 given to `flag`. */
export function parseCount(text: string, flag: string): number {
  if (!/^\d+$/.test(text.trim()) || Number(text) < 1) {
    throw new UsageError(`${flag} must be a whole number of at least 1, got "${text}"`);
  }
  return Number(text);
}

/** "500ms" | "30s" | "5m" | "1h" | "30" (seconds) → ms. */
export function parseDurationMs(text: string, flag: string): number {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(text.trim());
  if (!m)
    throw new UsageError(`${flag} must be a duration like 500ms, 30s, 5m or 1h, got "${text}"`);
  const unit = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }[(m[2] ?? "s") as "ms" | "s" | "m" | "h"];
  return Math.round(Number(m[1]) * unit);
}

/**
 * Whether a store URL carries a password, read as node-postgres reads it: a scheme in any
 * case, and query keys percent-decoded (`?pass%77ord=…` is its password too).
 * @throws UsageError when it names PostgreSQL but is no URL.
 */
function storeUrlHasPassword(text: string, flag: string): boolean {
  try {
    const url = /^postgres/i.test(text) ? new URL(text) : undefined;
    return url !== undefined && (url.password !== "" || url.searchParams.has("password"));
  } catch {
    throw new UsageError(`${flag} must be "sqlite:" or a postgres:// URL`);
  }
}

/** The flags a command takes a store URL by, as its errors name them. */
export interface StoreUrlFlags {
  readonly flag: string;
  readonly file: string;
}

const CONTROL_PLANE_STORE_FLAGS: StoreUrlFlags = { flag: "--store", file: "--store-url-file" };

/**
 * The store URL from `--store`, `--store-url-file` or `LLMGW_STORE_URL` (one of them; `names`
 * are the flags' names in the command that asks, for its errors). A
 * password on the command line is refused: every user of the host can read argv. A file
 * with a password that every local user may read is used, with a `warn`ing (the password
 * has leaked already; refusing would only stop the service).
 */
export function storeUrl(
  flag: string | undefined,
  file: string | undefined,
  env: string | undefined,
  warn: (line: string) => void = () => {},
  names: StoreUrlFlags = CONTROL_PLANE_STORE_FLAGS,
): string | undefined {
  if (flag !== undefined && file !== undefined)
    throw new UsageError(`give ${names.flag} or ${names.file}, not both`);
  if (file !== undefined) {
    let text: string;
    let mode: number;
    try {
      text = readFileSync(file, "utf8");
      mode = statSync(file).mode & 0o777;
    } catch (error) {
      throw new UsageError(`cannot read ${names.file} ${file}: ${(error as Error).message}`);
    }
    const url = text.trim();
    if (url === "") throw new UsageError(`${names.file} ${file} is empty`);
    // Checked whatever its mode, so that a broken URL is refused from a file as from the flag.
    const hasPassword = storeUrlHasPassword(url, names.file);
    if ((mode & 0o004) !== 0 && hasPassword)
      warn(
        `${names.file} ${file} holds a password and every local user can read it (mode ${mode.toString(8)}): chmod 600 it`,
      );
    return url;
  }
  if (flag !== undefined) {
    if (storeUrlHasPassword(flag, names.flag))
      throw new UsageError(
        `${names.flag} holds a password, which every user of this host can read in the process list: put the URL in ${names.file} FILE (mode 0600) or LLMGW_STORE_URL, or the password in PGPASSWORD or ~/.pgpass`,
      );
    return flag;
  }
  return env === undefined || env === "" ? undefined : env.trim();
}

export const command: Command = {
  name: "control-plane",
  summary: "run the control plane",
  usage: USAGE,
  async run(argv, io) {
    const { values } = parseCommandArgs(argv, {
      listen: { type: "string" },
      "control-listen": { type: "string" },
      "data-dir": { type: "string" },
      store: { type: "string" },
      "store-url-file": { type: "string" },
      "advertise-url": { type: "string" },
      "lease-ttl": { type: "string" },
      "tls-cert": { type: "string" },
      "tls-key": { type: "string" },
      "heartbeat-interval": { type: "string" },
      "node-lost-after": { type: "string" },
      "move-failed-after": { type: "string" },
      "rollout-progress-deadline": { type: "string" },
      "routing-keepalive": { type: "string" },
      "agent-stream": { type: "string" },
      "no-auth": { type: "boolean" },
      "cache-isolation": { type: "string" },
      "no-public-api": { type: "boolean" },
      "no-ui": { type: "boolean" },
      "ui-session-ttl": { type: "string" },
      "trusted-proxy": { type: "string", multiple: true },
      "headers-timeout": { type: "string" },
      "request-timeout": { type: "string" },
      "max-connections": { type: "string" },
      "max-control-connections": { type: "string" },
      "max-connections-per-address": { type: "string" },
      "max-control-connections-per-address": { type: "string" },
      "max-nodes": { type: "string" },
    });
    const duration = (flag: "headers-timeout" | "request-timeout") => {
      const v = values[flag];
      return v === undefined ? undefined : parseDurationMs(v, `--${flag}`);
    };
    const count = (
      flag:
        | "max-connections"
        | "max-control-connections"
        | "max-connections-per-address"
        | "max-control-connections-per-address"
        | "max-nodes",
    ) => {
      const v = values[flag];
      return v === undefined ? undefined : parseCount(v, `--${flag}`);
    };
    const headersTimeoutMs = duration("headers-timeout");
    const requestTimeoutMs = duration("request-timeout");
    const maxConnections = count("max-connections");
    const maxControlConnections = count("max-control-connections");
    const maxConnectionsPerAddress = count("max-connections-per-address");
    const maxControlConnectionsPerAddress = count("max-control-connections-per-address");
    const maxNodes = count("max-nodes");
    const store = storeUrl(values.store, values["store-url-file"], io.env.LLMGW_STORE_URL, (w) =>
      io.stderr.write(`llmgw control-plane: warning: ${w}\n`),
    );
    const options: ControlPlaneOptions = {
      dataDir: values["data-dir"] ?? io.env.LLMGW_DATA_DIR ?? "/var/lib/llmgw/control-plane",
      ...(store === undefined ? {} : { store }),
      ...(values["advertise-url"] ? { advertiseUrl: values["advertise-url"] } : {}),
      ...(values["lease-ttl"]
        ? { leaseTtlMs: parseDurationMs(values["lease-ttl"], "--lease-ttl") }
        : {}),
      ...(values.listen ? { listen: values.listen } : {}),
      ...(values["control-listen"] ? { controlListen: values["control-listen"] } : {}),
      ...(values["tls-cert"] ? { tlsCertFile: values["tls-cert"] } : {}),
      ...(values["tls-key"] ? { tlsKeyFile: values["tls-key"] } : {}),
      ...(values["heartbeat-interval"]
        ? {
            heartbeatIntervalMs: parseDurationMs(
              values["heartbeat-interval"],
              "--heartbeat-interval",
            ),
          }
        : {}),
      ...(values["node-lost-after"]
        ? { nodeLostAfterMs: parseDurationMs(values["node-lost-after"], "--node-lost-after") }
        : {}),
      ...(values["move-failed-after"]
        ? {
            moveFailedAfterMs: parseDurationMs(values["move-failed-after"], "--move-failed-after"),
          }
        : {}),
      ...(values["rollout-progress-deadline"]
        ? {
            rolloutProgressDeadlineMs: parseDurationMs(
              values["rollout-progress-deadline"],
              "--rollout-progress-deadline",
            ),
          }
        : {}),
      ...(values["agent-stream"]
        ? { agentStreamMs: parseDurationMs(values["agent-stream"], "--agent-stream") }
        : {}),
      ...(values["routing-keepalive"]
        ? {
            routingKeepaliveMs: parseDurationMs(values["routing-keepalive"], "--routing-keepalive"),
          }
        : {}),
      noAuth: values["no-auth"] ?? false,
      ...(values["cache-isolation"] === undefined
        ? {}
        : { cacheIsolation: cacheIsolationFlag(values["cache-isolation"]) }),
      publicApi: values["no-public-api"] !== true,
      ui: values["no-ui"] !== true,
      ...(values["ui-session-ttl"]
        ? { uiSessionTtlMs: parseDurationMs(values["ui-session-ttl"], "--ui-session-ttl") }
        : {}),
      ...(values["trusted-proxy"] === undefined
        ? {}
        : { trustedProxies: trustedProxiesFlag(values["trusted-proxy"]) }),
      ...(headersTimeoutMs === undefined ? {} : { headersTimeoutMs }),
      ...(requestTimeoutMs === undefined ? {} : { requestTimeoutMs }),
      ...(maxConnections === undefined ? {} : { maxConnections }),
      ...(maxControlConnections === undefined ? {} : { maxControlConnections }),
      ...(maxConnectionsPerAddress === undefined ? {} : { maxConnectionsPerAddress }),
      ...(maxControlConnectionsPerAddress === undefined ? {} : { maxControlConnectionsPerAddress }),
      ...(maxNodes === undefined ? {} : { maxNodes }),
    };
    const logger = createConsoleLogger(io.stderr, "control-plane");
    let cp: Awaited<ReturnType<typeof startControlPlane>>;
    try {
      cp = await startControlPlane(options, { log: (line) => logger.info(line) });
    } catch (error) {
      if (isControlPlaneError(error)) {
        if (error.code === "LLMGW_CONTROL_PLANE_CONFIG_INVALID")
          throw new UsageError(error.message);
        io.stderr.write(`llmgw control-plane: ${error.message} [${error.code}]\n`);
        return 1;
      }
      throw error;
    }
    logger.info("ready", {
      control: cp.controlUrl,
      store: cp.storeLocation,
      public: cp.publicUrl ?? "off (--no-public-api)",
      console: cp.consoleUrl ?? "off (--no-ui)",
      dataDir: options.dataDir,
      joinToken: `llmgw control-plane token --data-dir ${options.dataDir}`,
      routerToken: `llmgw control-plane token --router --data-dir ${options.dataDir}`,
    });
    if (options.noAuth) logger.warn("--no-auth: the public API accepts requests without API keys");
    await new Promise<void>((resolve) => {
      if (io.signal.aborted) return resolve();
      io.signal.addEventListener("abort", () => resolve(), { once: true });
    });
    logger.info("shutting down", {
      reason: String((io.signal.reason as Error)?.message ?? io.signal.reason),
    });
    const report = await cp.close();
    logger.info("stopped", { durationMs: report.durationMs, forced: report.forced });
    return 0;
  },
};
