/**
 * `llmgw router`'s configuration: its flags (and the few environment variables that keep
 * secrets and paths off argv) validated once, with zod, into a {@link RouterConfig}. Every
 * error names the flag and echoes the bad value (`LLMGW_ROUTER_CONFIG_INVALID`); the bounds of
 * the router and listener options are the resolvers' own ({@link ROUTER_OPTION_LIMITS},
 * {@link LISTENER_OPTION_LIMITS}), so a flag never admits what the server would refuse.
 */
import { CACHE_ISOLATION_MODES, type CacheIsolation } from "@llmgw/router";
import { z } from "zod";
import { RouterServiceError } from "./errors.js";
import { type HttpListenerOptions, LISTENER_OPTION_LIMITS } from "./http-listener.js";
import {
  ROUTER_OPTION_LIMITS,
  type RouterServiceOptions,
  SESSION_HEADER_PATTERN,
} from "./options.js";

/** `node:util` parseArgs options of `llmgw router` (the CLI parses, this module validates). */
export const ROUTER_FLAGS = {
  "control-plane": { type: "string", multiple: true },
  "router-token": { type: "string" },
  "router-token-file": { type: "string" },
  "control-plane-ca": { type: "string" },
  listen: { type: "string" },
  "metrics-listen": { type: "string" },
  "tls-cert": { type: "string" },
  "tls-key": { type: "string" },
  "state-dir": { type: "string" },
  "router-id": { type: "string" },
  address: { type: "string" },
  "max-state-age": { type: "string" },
  "no-auth": { type: "boolean" },
  "max-body": { type: "string" },
  "too-large-drain": { type: "string" },
  "too-large-drain-bytes": { type: "string" },
  "queue-length": { type: "string" },
  "session-header": { type: "string" },
  "cache-isolation": { type: "string" },
  "queue-timeout": { type: "string" },
  "critical-headroom": { type: "string" },
  "critical-prefill-reserve": { type: "string" },
  "upstream-connect-timeout": { type: "string" },
  "upstream-headers-timeout": { type: "string" },
  "upstream-body-timeout": { type: "string" },
  "client-stall-timeout": { type: "string" },
  "upstream-connections": { type: "string" },
  "analyzer-threads": { type: "string" },
  "inline-analysis-bytes": { type: "string" },
  "max-header-bytes": { type: "string" },
  "headers-timeout": { type: "string" },
  "request-timeout": { type: "string" },
  "keep-alive-timeout": { type: "string" },
  "max-connections": { type: "string" },
  "max-connections-per-address": { type: "string" },
  "shutdown-grace": { type: "string" },
  peer: { type: "string", multiple: true },
  "peer-key-file": { type: "string" },
  "peer-ca": { type: "string" },
} as const;

/** A flag of `llmgw router`, without its leading `--`. */
export type RouterFlag = keyof typeof ROUTER_FLAGS;

/** What parseArgs returns for {@link ROUTER_FLAGS}. */
export type RouterFlagValues = {
  readonly [F in RouterFlag]?: (typeof ROUTER_FLAGS)[F] extends { type: "boolean" }
    ? boolean
    : (typeof ROUTER_FLAGS)[F] extends { multiple: true }
      ? readonly string[]
      : string;
};

/** Environment variables `llmgw router` reads (each flag wins over its variable). */
export const ROUTER_ENV = {
  controlPlane: "LLMGW_CONTROL_PLANE",
  routerToken: "LLMGW_ROUTER_TOKEN",
  routerTokenFile: "LLMGW_ROUTER_TOKEN_FILE",
  stateDir: "LLMGW_STATE_DIR",
  peers: "LLMGW_ROUTER_PEERS",
  peerKey: "LLMGW_ROUTER_PEER_KEY",
  peerKeyFile: "LLMGW_ROUTER_PEER_KEY_FILE",
} as const;

/** Most peers one router streams to. */
export const MAX_PEERS = 64;

/** Default `--state-dir`. */
export const DEFAULT_ROUTER_STATE_DIR = "/var/lib/llmgw/router";
/** Most control-plane URLs one router tries. */
export const MAX_CONTROL_PLANES = 16;
/** Router ids: what `llmgw routers` shows and the control plane checks. */
export const ROUTER_ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;

/** Where the peer key comes from (never argv). */
export type PeerKeySource =
  | { readonly kind: "env"; readonly key: string }
  | { readonly kind: "file"; readonly path: string };

/** Where the router token comes from; a token on argv is visible in `ps`. */
export type RouterTokenSource =
  | { readonly kind: "flag"; readonly token: string }
  | { readonly kind: "env"; readonly token: string }
  | { readonly kind: "file"; readonly path: string };

/** `llmgw router`'s validated configuration. */
export interface RouterConfig {
  /** Control-plane control URLs, tried in turn (no trailing slash). */
  readonly controlPlanes: readonly string[];
  readonly routerToken: RouterTokenSource;
  /** PEM CA bundle trusted for `https://` control planes (besides the system's). */
  readonly controlPlaneCaFile: string | undefined;
  /** Public listener, `HOST:PORT` or `:PORT`. */
  readonly listen: string;
  /** `/metrics`, `/readyz`, `/healthz`; undefined: `off`. */
  readonly metricsListen: string | undefined;
  readonly tlsCertFile: string | undefined;
  readonly tlsKeyFile: string | undefined;
  readonly stateDir: string;
  /** Undefined: the id kept in `<stateDir>/router-id` (made on first start). */
  readonly routerId: string | undefined;
  /** Advertised to `llmgw routers`; default `<hostname>:<listen port>`. */
  readonly address: string;
  /**
   * `--max-state-age`: past this long without a control plane confirming its state, the router
   * refuses requests (503 `router_state_stale`) and `/readyz` fails; undefined: no limit.
   */
  readonly maxStateAgeMs: number | undefined;
  /** How long a stop lets in-flight requests finish, ms. */
  readonly shutdownGraceMs: number;
  /** Handler options (unset ones take the handler's defaults). */
  readonly router: RouterServiceOptions;
  /** Listener limits (TLS is added from the files at start). */
  readonly listener: Omit<HttpListenerOptions, "tls">;
  /** The other routers' base URLs (`--peer`), told what this one sends (peer-exchange.ts). */
  readonly peers: readonly string[];
  /** The key the routers share; undefined: no peer exchange (no `--peer` either). */
  readonly peerKey: PeerKeySource | undefined;
  /** PEM CA bundle trusted for `https://` peers (besides the system's). */
  readonly peerCaFile: string | undefined;
}

/** What {@link parseRouterConfig} reads besides the flags. */
export interface RouterConfigEnv {
  readonly env?: Readonly<Record<string, string | undefined>>;
  /** For the default `--address`. */
  readonly hostname?: string;
}

/** What the control plane accepts as a router's address. */
const ADDRESS = /^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9._-]+):\d{1,5}$/;
const LISTEN = /^(\[[0-9a-fA-F:]+\]|[^\s:[\]]*):(\d{1,5})$/;

const listenAddress = z
  .string()
  .regex(LISTEN, "expected HOST:PORT or :PORT, e.g. 0.0.0.0:8080")
  .refine((v) => Number(v.slice(v.lastIndexOf(":") + 1)) <= 65535, "port must be 0–65535");

const path = z.string().min(1, "must not be empty").max(4096, "is longer than 4096 characters");

const DURATION = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/;
const UNIT_MS = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 } as const;

/** "500ms" | "30s" | "5m" | "1h" | "30" (seconds) → ms, within [min, max]. */
const duration = (limits: { readonly min: number; readonly max: number }) =>
  z
    .string()
    .regex(DURATION, "must be a duration like 500ms, 30s, 5m or 1h")
    .transform((text) => {
      const m = DURATION.exec(text) as RegExpExecArray;
      return Math.round(Number(m[1]) * UNIT_MS[(m[2] ?? "s") as keyof typeof UNIT_MS]);
    })
    .pipe(
      z
        .number()
        .min(limits.min, `must be at least ${limits.min}ms`)
        .max(limits.max, `must be at most ${limits.max}ms`),
    );

const SIZE = /^(\d+)(B|KiB|MiB|GiB)?$/;
const UNIT_BYTES = { B: 1, KiB: 1024, MiB: 1024 ** 2, GiB: 1024 ** 3 } as const;

/** "65536" | "64KiB" | "8MiB" | "1GiB" → bytes, within [min, max]. */
const size = (limits: { readonly min: number; readonly max: number }) =>
  z
    .string()
    .regex(SIZE, "must be a size like 65536, 64KiB, 8MiB or 1GiB")
    .transform((text) => {
      const m = SIZE.exec(text) as RegExpExecArray;
      return Number(m[1]) * UNIT_BYTES[(m[2] ?? "B") as keyof typeof UNIT_BYTES];
    })
    .pipe(
      z
        .number()
        .min(limits.min, `must be at least ${limits.min} bytes`)
        .max(limits.max, `must be at most ${limits.max} bytes`),
    );

/** A whole number within [min, max]. */
const count = (limits: { readonly min: number; readonly max: number }) =>
  z
    .string()
    .regex(/^\d+$/, "must be a whole number")
    .transform(Number)
    .pipe(
      z
        .number()
        .min(limits.min, `must be at least ${limits.min}`)
        .max(limits.max, `must be at most ${limits.max}`),
    );

const baseUrl = z
  .string()
  .transform((v) => v.trim().replace(/\/+$/, ""))
  .pipe(
    z
      .string()
      .max(2048, "is longer than 2048 characters")
      .refine((v) => {
        try {
          const url = new URL(v);
          return (
            (url.protocol === "http:" || url.protocol === "https:") &&
            url.username === "" &&
            url.password === "" &&
            url.search === "" &&
            url.hash === ""
          );
        } catch {
          return false;
        }
      }, "must be an http:// or https:// URL without credentials, query or fragment, e.g. https://10.0.0.1:7070"),
  );

const R = ROUTER_OPTION_LIMITS;
const L = LISTENER_OPTION_LIMITS;

/** The schema over the flags, keyed by flag name so that every issue names its flag. */
const flagsSchema = z.object({
  "control-plane": z
    .array(baseUrl)
    .min(1, "is required (or LLMGW_CONTROL_PLANE): the control plane's control URL")
    .max(MAX_CONTROL_PLANES, `takes at most ${MAX_CONTROL_PLANES} URLs`),
  "router-token": z
    .string()
    .min(1, "must not be empty")
    .max(4096, "is longer than 4096 characters")
    .refine((v) => !/\s/.test(v), "must not contain whitespace")
    .optional(),
  "router-token-file": path.optional(),
  "control-plane-ca": path.optional(),
  listen: listenAddress.default(":8080"),
  "metrics-listen": z.union([z.literal("off"), listenAddress]).default("127.0.0.1:9464"),
  "tls-cert": path.optional(),
  "tls-key": path.optional(),
  "state-dir": path.default(DEFAULT_ROUTER_STATE_DIR),
  "router-id": z
    .string()
    .regex(
      ROUTER_ID_PATTERN,
      "must be 1–63 letters, digits, '.', '_' or '-', starting alphanumeric",
    )
    .optional(),
  address: z
    .string()
    .regex(ADDRESS, "must be HOST:PORT, e.g. 10.0.0.9:8080")
    .max(255, "is longer than 255 characters")
    .optional(),
  "no-auth": z.boolean().default(false),
  // At least 10 s: a stream's keepalives come every 2 s, and a reconnect backs off up to 2 s.
  "max-state-age": duration({ min: 10_000, max: 30 * 86_400_000 }).optional(),
  "max-body": size(R.maxBodyBytes).optional(),
  "too-large-drain": duration(R.tooLargeDrainMs).optional(),
  "too-large-drain-bytes": size(R.tooLargeDrainBytes).optional(),
  "queue-length": count(R.maxQueueLength).optional(),
  "queue-timeout": duration(R.queueTimeoutMs).optional(),
  "critical-headroom": count(R.criticalHeadroomPercent).optional(),
  "critical-prefill-reserve": count(R.criticalPrefillReserve).optional(),
  "upstream-connect-timeout": duration(R.upstreamConnectTimeoutMs).optional(),
  "upstream-headers-timeout": duration(R.upstreamHeadersTimeoutMs).optional(),
  "upstream-body-timeout": duration(R.upstreamBodyTimeoutMs).optional(),
  "client-stall-timeout": duration(R.clientStallTimeoutMs).optional(),
  "upstream-connections": count(R.upstreamConnections).optional(),
  "session-header": z
    .string()
    .regex(
      SESSION_HEADER_PATTERN,
      "must be an HTTP header name of 1–64 characters, e.g. x-session-id",
    )
    .optional(),
  "cache-isolation": z
    .enum(CACHE_ISOLATION_MODES as [CacheIsolation, ...CacheIsolation[]], {
      message: `must be one of ${CACHE_ISOLATION_MODES.join(", ")}`,
    })
    .default("none"),
  "analyzer-threads": count({ min: 0, max: 64 }).optional(),
  "inline-analysis-bytes": size({ min: 0, max: 2 ** 31 - 1 }).optional(),
  "max-header-bytes": size(L.maxHeaderBytes).optional(),
  "headers-timeout": duration(L.headersTimeoutMs).optional(),
  "request-timeout": duration(L.requestTimeoutMs).optional(),
  "keep-alive-timeout": duration(L.keepAliveTimeoutMs).optional(),
  "max-connections": count(L.maxConnections).optional(),
  "max-connections-per-address": count(L.maxConnectionsPerAddress).optional(),
  "shutdown-grace": duration({ min: 0, max: 600_000 }).default(10_000),
  peer: z.array(baseUrl).max(MAX_PEERS, `takes at most ${MAX_PEERS} URLs`),
  "peer-key-file": path.optional(),
  "peer-ca": path.optional(),
});

type ParsedFlags = z.output<typeof flagsSchema>;

/** Cross-flag rules, each naming the flags it relates. */
function crossCheck(f: ParsedFlags, tokenGiven: number, peerKeyGiven: number): string[] {
  const problems: string[] = [];
  if (f.peer.length > 0 && peerKeyGiven === 0)
    problems.push(
      "--peer needs the key the routers share: --peer-key-file FILE (or LLMGW_ROUTER_PEER_KEY, LLMGW_ROUTER_PEER_KEY_FILE)",
    );
  if (peerKeyGiven > 1)
    problems.push(
      "give the peer key one way: --peer-key-file, LLMGW_ROUTER_PEER_KEY or LLMGW_ROUTER_PEER_KEY_FILE",
    );
  if (f["no-auth"] && f["cache-isolation"] !== "none")
    problems.push(
      `--cache-isolation ${f["cache-isolation"]} needs API keys: without them (--no-auth) no request says whose it is`,
    );
  if ((f["tls-cert"] === undefined) !== (f["tls-key"] === undefined))
    problems.push("--tls-cert and --tls-key must be given together");
  if (tokenGiven === 0)
    problems.push(
      "--router-token-file FILE (or LLMGW_ROUTER_TOKEN, LLMGW_ROUTER_TOKEN_FILE) is required: print the token with 'llmgw control-plane token --router' on the control plane",
    );
  if (tokenGiven > 1)
    problems.push(
      "give the router token one way: --router-token, --router-token-file, LLMGW_ROUTER_TOKEN or LLMGW_ROUTER_TOKEN_FILE",
    );
  const headers = f["headers-timeout"] ?? 30_000;
  const request = f["request-timeout"] ?? 60_000;
  if (headers > request)
    problems.push(
      `--headers-timeout (${headers}ms) must not exceed --request-timeout (${request}ms)`,
    );
  const maxConnections = f["max-connections"] ?? 4096;
  if ((f["max-connections-per-address"] ?? 0) > maxConnections)
    problems.push(
      `--max-connections-per-address (${f["max-connections-per-address"]}) must not exceed --max-connections (${maxConnections})`,
    );
  if (f["metrics-listen"] !== "off" && samePort(f.listen, f["metrics-listen"]))
    problems.push(`--metrics-listen (${f["metrics-listen"]}) must not be --listen (${f.listen})`);
  return problems;
}

function samePort(a: string, b: string): boolean {
  const port = (v: string) => v.slice(v.lastIndexOf(":") + 1);
  return port(a) !== "0" && port(a) === port(b);
}

/**
 * Validates `llmgw router`'s flags (as parseArgs returns them for {@link ROUTER_FLAGS}) with the
 * environment: `LLMGW_CONTROL_PLANE` (comma-separated URLs), `LLMGW_ROUTER_TOKEN`,
 * `LLMGW_ROUTER_TOKEN_FILE`, `LLMGW_STATE_DIR`. Flags win over variables; `--control-plane`
 * may repeat and each may hold several comma-separated URLs.
 *
 * @throws RouterServiceError `LLMGW_ROUTER_CONFIG_INVALID` naming every bad flag, with its value
 *   (never a token's).
 */
export function parseRouterConfig(
  flags: RouterFlagValues,
  { env = {}, hostname = "localhost" }: RouterConfigEnv = {},
): RouterConfig {
  const urls = (
    flags["control-plane"] ?? (env.LLMGW_CONTROL_PLANE ? [env.LLMGW_CONTROL_PLANE] : [])
  )
    .flatMap((v) => v.split(","))
    .map((v) => v.trim())
    .filter((v) => v !== "");
  const tokenFile = flags["router-token-file"] ?? nonEmpty(env.LLMGW_ROUTER_TOKEN_FILE);
  const peers = (flags.peer ?? (env.LLMGW_ROUTER_PEERS ? [env.LLMGW_ROUTER_PEERS] : []))
    .flatMap((v) => v.split(","))
    .map((v) => v.trim())
    .filter((v) => v !== "");
  const peerKeyFile = flags["peer-key-file"] ?? nonEmpty(env.LLMGW_ROUTER_PEER_KEY_FILE);
  const input = {
    ...flags,
    peer: peers,
    "peer-key-file": peerKeyFile,
    "control-plane": urls,
    "state-dir": flags["state-dir"] ?? nonEmpty(env.LLMGW_STATE_DIR),
    "router-token-file": tokenFile,
  };
  const parsed = flagsSchema.safeParse(input);
  const tokenSources = [
    flags["router-token"],
    flags["router-token-file"],
    nonEmpty(env.LLMGW_ROUTER_TOKEN),
    flags["router-token-file"] === undefined ? nonEmpty(env.LLMGW_ROUTER_TOKEN_FILE) : undefined,
  ].filter((v) => v !== undefined).length;
  const peerKeySources = [
    flags["peer-key-file"],
    nonEmpty(env.LLMGW_ROUTER_PEER_KEY),
    flags["peer-key-file"] === undefined ? nonEmpty(env.LLMGW_ROUTER_PEER_KEY_FILE) : undefined,
  ].filter((v) => v !== undefined).length;
  const problems = parsed.success
    ? crossCheck(parsed.data, tokenSources, peerKeySources)
    : parsed.error.issues.map((issue) => describeIssue(issue, input));
  if (!parsed.success || problems.length > 0) {
    throw new RouterServiceError(
      "LLMGW_ROUTER_CONFIG_INVALID",
      `invalid llmgw router options: ${problems.join("; ")}`,
    );
  }
  const f = parsed.data;
  const envToken = nonEmpty(env.LLMGW_ROUTER_TOKEN);
  const routerToken: RouterTokenSource =
    f["router-token"] !== undefined
      ? { kind: "flag", token: f["router-token"] }
      : f["router-token-file"] !== undefined
        ? { kind: "file", path: f["router-token-file"] }
        : { kind: "env", token: envToken as string };
  if (routerToken.kind === "env" && /\s/.test(routerToken.token)) {
    throw new RouterServiceError(
      "LLMGW_ROUTER_CONFIG_INVALID",
      "invalid llmgw router options: LLMGW_ROUTER_TOKEN must not contain whitespace",
    );
  }
  const listenPort = f.listen.slice(f.listen.lastIndexOf(":") + 1);
  const listenHost = f.listen.slice(0, f.listen.lastIndexOf(":"));
  const threads = f["analyzer-threads"];
  const inline = f["inline-analysis-bytes"];
  const analyzer =
    threads === undefined && inline === undefined
      ? undefined
      : {
          ...(inline === undefined ? {} : { inlineThresholdBytes: inline }),
          ...(threads === undefined
            ? {}
            : { pool: threads === 0 ? (false as const) : { minThreads: 1, maxThreads: threads } }),
        };
  const router: RouterServiceOptions = {
    noAuth: f["no-auth"],
    ...defined("maxBodyBytes", f["max-body"]),
    ...defined("tooLargeDrainMs", f["too-large-drain"]),
    ...defined("tooLargeDrainBytes", f["too-large-drain-bytes"]),
    ...defined("maxQueueLength", f["queue-length"]),
    ...defined("queueTimeoutMs", f["queue-timeout"]),
    ...defined(
      "criticalHeadroom",
      f["critical-headroom"] === undefined ? undefined : f["critical-headroom"] / 100,
    ),
    ...defined("criticalPrefillReserve", f["critical-prefill-reserve"]),
    ...defined("upstreamConnectTimeoutMs", f["upstream-connect-timeout"]),
    ...defined("upstreamHeadersTimeoutMs", f["upstream-headers-timeout"]),
    ...defined("upstreamBodyTimeoutMs", f["upstream-body-timeout"]),
    ...defined("clientStallTimeoutMs", f["client-stall-timeout"]),
    ...defined("upstreamConnections", f["upstream-connections"]),
    ...defined("analyzer", analyzer),
    ...defined("sessionHeader", f["session-header"]),
    cacheIsolation: f["cache-isolation"],
  };
  const listener: Omit<HttpListenerOptions, "tls"> = {
    ...defined("maxHeaderBytes", f["max-header-bytes"]),
    ...defined("headersTimeoutMs", f["headers-timeout"]),
    ...defined("requestTimeoutMs", f["request-timeout"]),
    ...defined("keepAliveTimeoutMs", f["keep-alive-timeout"]),
    ...defined("maxConnections", f["max-connections"]),
    ...defined("maxConnectionsPerAddress", f["max-connections-per-address"]),
  };
  const address =
    f.address ??
    `${listenHost === "" || listenHost === "0.0.0.0" || listenHost === "[::]" ? hostname : listenHost}:${listenPort}`;
  if (!ADDRESS.test(address) || address.length > 255) {
    throw new RouterServiceError(
      "LLMGW_ROUTER_CONFIG_INVALID",
      `invalid llmgw router options: --address defaults to ${JSON.stringify(address)} (host name and --listen port), which is not HOST:PORT; give --address`,
    );
  }
  return {
    controlPlanes: [...new Set(f["control-plane"])],
    routerToken,
    controlPlaneCaFile: f["control-plane-ca"],
    listen: f.listen,
    metricsListen: f["metrics-listen"] === "off" ? undefined : f["metrics-listen"],
    tlsCertFile: f["tls-cert"],
    tlsKeyFile: f["tls-key"],
    stateDir: f["state-dir"],
    routerId: f["router-id"],
    address,
    maxStateAgeMs: f["max-state-age"],
    shutdownGraceMs: f["shutdown-grace"],
    router,
    listener,
    peers: [...new Set(f.peer)],
    peerCaFile: f["peer-ca"],
    peerKey:
      f["peer-key-file"] !== undefined
        ? { kind: "file", path: f["peer-key-file"] }
        : env.LLMGW_ROUTER_PEER_KEY
          ? { kind: "env", key: env.LLMGW_ROUTER_PEER_KEY }
          : undefined,
  };
}

const nonEmpty = (v: string | undefined): string | undefined =>
  v === undefined || v === "" ? undefined : v;

function defined<K extends string, V>(key: K, value: V | undefined): { [P in K]?: V } {
  return (value === undefined ? {} : { [key]: value }) as { [P in K]?: V };
}

const SECRET_FLAGS = new Set(["router-token"]);

/** `--flag: problem (got "value")`, never echoing a secret. */
function describeIssue(issue: z.core.$ZodIssue, input: Record<string, unknown>): string {
  const flag = String(issue.path[0] ?? "");
  let value = input[flag];
  if (Array.isArray(value) && typeof issue.path[1] === "number") value = value[issue.path[1]];
  const shown =
    value === undefined || Array.isArray(value) || SECRET_FLAGS.has(flag)
      ? ""
      : ` (got ${JSON.stringify(value)})`;
  return `${flag === "" ? "options" : `--${flag}`} ${lowerFirst(issue.message)}${shown}`;
}

const lowerFirst = (s: string): string => s.charAt(0).toLowerCase() + s.slice(1);
