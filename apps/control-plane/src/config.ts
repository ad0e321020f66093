import { CACHE_ISOLATION_MODES, type CacheIsolation } from "@llmgw/router";
import { z } from "zod";
import { DEFAULT_ROLLOUT_PROGRESS_DEADLINE_MS } from "./domain/cluster.js";
import { DEFAULT_MOVE_FAILED_AFTER_MS } from "./domain/failing-replicas.js";
import { ControlPlaneError } from "./errors.js";
import { MAX_TRUSTED_PROXIES, parseTrustedProxies } from "./ui/proxy-trust.js";

/** A `HOST:PORT` or `:PORT` listen address (`:PORT` binds all interfaces). */
const listenAddress = z
  .string()
  .regex(
    /^(\[[0-9a-fA-F:]+\]|[^\s:[\]]*):\d{1,5}$/,
    "expected HOST:PORT or :PORT, e.g. 127.0.0.1:7070",
  )
  .refine((v) => Number(v.slice(v.lastIndexOf(":") + 1)) <= 65535, "port must be 0–65535");

/**
 * Everything `startControlPlane` needs, as users give it (flags, env, a file). Defaults:
 * public `:8080` (the OpenAI API is meant to be reached), control `127.0.0.1:7070` (agents
 * and operators on other hosts need `--control-listen :7070`, ideally with TLS).
 */
export const controlPlaneConfigSchema = z
  .object({
    /** Public listener: `/v1/*`, `/healthz`. */
    listen: listenAddress.default(":8080"),
    /** Control listener: Connect-RPC, `/metrics`, `/healthz`. */
    controlListen: listenAddress.default("127.0.0.1:7070"),
    /** SQLite store (unless `store` is PostgreSQL) and token files (created 0700). */
    dataDir: z.string().min(1),
    /**
     * Where the state lives: `sqlite:` (default: `state.db` in `dataDir`, one instance) or a
     * `postgres://` / `postgresql://` URL (several instances, one leader). Never echoed in
     * errors: it may hold a password.
     */
    store: z
      .string()
      .refine((v) => v === "sqlite:" || /^postgres(ql)?:\/\/[^\s]+$/.test(v), {
        message: 'must be "sqlite:" or a postgres:// URL',
      })
      .default("sqlite:"),
    /**
     * PostgreSQL only: how long the leader lease holds without renewal. A follower leads at
     * most this long (plus a poll) after the leader dies or loses the database.
     */
    leaseTtlMs: z.number().int().min(300).max(60_000).default(2_000),
    /**
     * PostgreSQL only: this instance's control URL as other hosts reach it, handed to clients
     * of followers as the leader's. Default: the control listener's URL.
     */
    advertiseUrl: z.url({ protocol: /^https?$/ }).optional(),
    tlsCertFile: z.string().min(1).optional(),
    tlsKeyFile: z.string().min(1).optional(),
    /**
     * Serve `/v1/*` on `listen` by running the router in-process over the routing feed (the
     * one-machine install, the demo). False (`--no-public-api`): no public listener; routers
     * run apart (`llmgw router`) and watch the routing state on the control listener.
     */
    publicApi: z.boolean().default(true),
    /** The web console at `/ui/` on the control listener (`--no-ui`: off). */
    ui: z.boolean().default(true),
    /** How long a console login lasts. */
    uiSessionTtlMs: z
      .number()
      .int()
      .min(60_000)
      .max(30 * 86_400_000)
      .default(12 * 3_600_000),
    /**
     * Reverse proxies in front of the control listener whose `X-Forwarded-For` and
     * `X-Forwarded-Proto` the console believes (`--trusted-proxy`): addresses or CIDR ranges.
     */
    trustedProxies: z
      .array(z.string().max(64))
      .max(MAX_TRUSTED_PROXIES)
      .default([])
      .superRefine((entries, ctx) => {
        const trust = parseTrustedProxies(entries);
        if (typeof trust === "string") ctx.addIssue({ code: "custom", message: trust });
      }),
    /** Public API without API keys (demo only). */
    noAuth: z.boolean().default(false),
    /**
     * Whose requests share an engine's prefix cache through the in-process router (`llmgw
     * router --cache-isolation`): `none`, `tenant` or `key`. Needs API keys.
     */
    cacheIsolation: z
      .enum(CACHE_ISOLATION_MODES as [CacheIsolation, ...CacheIsolation[]])
      .default("none"),
    /** Interval agents are told to heartbeat at. */
    heartbeatIntervalMs: z.number().int().min(50).max(600_000).default(2_000),
    /** Missed intervals before a node is `unreachable`. */
    unreachableAfterMissed: z.number().int().min(1).max(100).default(3),
    /** How long a node may stay unreachable before it is `lost` and its replicas move. */
    nodeLostAfterMs: z.number().int().min(0).max(86_400_000).default(60_000),
    /**
     * How long a replica may keep failing before it moves to another node that can take it
     * (0: never; its agent relaunches it where it is meanwhile). See failing-replicas.ts.
     */
    moveFailedAfterMs: z
      .number()
      .int()
      .min(0)
      .max(7 * 86_400_000)
      .default(DEFAULT_MOVE_FAILED_AFTER_MS),
    /**
     * How long a rolling update may have new replicas that cannot be placed, none of them
     * turning serving, before it is rolled back to the previous revision's spec (0: never).
     */
    rolloutProgressDeadlineMs: z
      .number()
      .int()
      .min(0)
      .max(7 * 86_400_000)
      .default(DEFAULT_ROLLOUT_PROGRESS_DEADLINE_MS),
    /** Recent events kept in the store. */
    eventsKept: z.number().int().min(10).max(1_000_000).default(1_000),
    /** First and last port handed out as rendezvous ports of multi-node replicas. */
    rendezvousPortMin: z.number().int().min(1024).max(65535).default(29_500),
    rendezvousPortMax: z.number().int().min(1024).max(65535).default(29_999),
    /** How long close() waits for in-flight requests before closing connections by force. */
    shutdownGraceMs: z.number().int().min(0).max(600_000).default(10_000),
    /** Both listeners: time a client has to send a request head (then 408). */
    headersTimeoutMs: z.number().int().min(100).max(3_600_000).default(30_000),
    /** Both listeners: time a client has to send a whole request, body included (then 408). */
    requestTimeoutMs: z.number().int().min(100).max(86_400_000).default(60_000),
    /** Both listeners: idle keep-alive connections are closed after this. */
    keepAliveTimeoutMs: z.number().int().min(100).max(3_600_000).default(5_000),
    /** Public listener: open connections at once; more are closed as they arrive. */
    maxConnections: z.number().int().min(1).max(1_000_000).default(4_096),
    /**
     * Control listener: its own cap, so a flood of the public listener never takes the
     * agents' and operators' way in (keep both caps together below the process's file limit).
     * An agent holds two while load streams are on (heartbeats, its `StreamLoad` request):
     * the default fits 2,000 agents with room for routers and operators.
     */
    maxControlConnections: z.number().int().min(1).max(1_000_000).default(4_096),
    /**
     * Public listener: open connections from one client address; more are closed at once.
     * Default a quarter of `maxConnections` (1,024), so one address cannot hold the listener,
     * yet an L4 balancer in front (one address for all clients) has room; raise it to the
     * listener cap there.
     */
    maxConnectionsPerAddress: z.number().int().min(1).max(1_000_000).optional(),
    /**
     * Control listener: open connections from one client address. Default a quarter of
     * `maxControlConnections` (1,024), so that one address (a compromised host, a runaway
     * script) cannot lock out every agent and operator.
     */
    maxControlConnectionsPerAddress: z.number().int().min(1).max(1_000_000).optional(),
    /**
     * Nodes held at most; a Register that would add one more is refused
     * (`LLMGW_CONTROL_PLANE_NODE_LIMIT`). Bounds what holders of the shared join token can
     * make the control plane keep and export.
     */
    maxNodes: z.number().int().min(1).max(1_000_000).default(10_000),
    /** Membership changes within this window reach routers as one delta. */
    routingCoalesceMs: z.number().int().min(1).max(10_000).default(25),
    /** Engine load reaches routers in one update this often. */
    routingLoadFlushMs: z.number().int().min(10).max(10_000).default(100),
    /** A quiet routing stream carries a keepalive this often (routers give up after three). */
    routingKeepaliveMs: z.number().int().min(100).max(60_000).default(2_000),
    /**
     * How long an agent keeps each of its streams open (`StreamHeartbeat`, `WatchDesired`,
     * `StreamLoad`; told in every desired-set answer as `load_stream_ms`); at most half of
     * `requestTimeoutMs`, since a client stream is one request body. 0: agents send each
     * heartbeat and load report as its own call (for a proxy in front of the control listener
     * that buffers request bodies). Default 20 s, or half of a shorter `requestTimeoutMs` (0
     * below 2 s).
     */
    agentStreamMs: z.number().int().min(0).max(3_600_000).optional(),
    /** Messages queued for one router that stopped reading before its stream is cut off. */
    routingMaxQueued: z.number().int().min(8).max(100_000).default(512),
  })
  .refine((c) => (c.tlsCertFile === undefined) === (c.tlsKeyFile === undefined), {
    message: "--tls-cert and --tls-key must be given together",
    path: ["tlsCertFile"],
  })
  .refine((c) => !c.noAuth || c.cacheIsolation === "none", {
    message:
      "--cache-isolation needs API keys: without them (--no-auth) no request says whose it is",
    path: ["cacheIsolation"],
  })
  .refine((c) => c.publicApi || c.cacheIsolation === "none", {
    message:
      "--cache-isolation sets the in-process router's mode, and --no-public-api runs none: give it to each llmgw router",
    path: ["cacheIsolation"],
  })
  .refine((c) => c.rendezvousPortMin <= c.rendezvousPortMax, {
    message: "rendezvousPortMin must not exceed rendezvousPortMax",
    path: ["rendezvousPortMin"],
  })
  .refine((c) => (c.maxConnectionsPerAddress ?? 0) <= c.maxConnections, {
    message: "maxConnectionsPerAddress must not exceed maxConnections",
    path: ["maxConnectionsPerAddress"],
  })
  .refine((c) => (c.maxControlConnectionsPerAddress ?? 0) <= c.maxControlConnections, {
    message: "maxControlConnectionsPerAddress must not exceed maxControlConnections",
    path: ["maxControlConnectionsPerAddress"],
  })
  .refine((c) => c.headersTimeoutMs <= c.requestTimeoutMs, {
    message: "headersTimeoutMs must not exceed requestTimeoutMs",
    path: ["headersTimeoutMs"],
  })
  .refine(
    (c) =>
      c.agentStreamMs === undefined ||
      c.agentStreamMs === 0 ||
      (c.agentStreamMs >= 1_000 && c.agentStreamMs * 2 <= c.requestTimeoutMs),
    {
      message: "agentStreamMs must be 0 (no streams) or 1 s up to half of requestTimeoutMs",
      path: ["agentStreamMs"],
    },
  )
  // Per-address caps follow their listener's cap unless given: lowering a cap alone must
  // neither fail validation nor let one address take the whole listener.
  .transform((c) => ({
    ...c,
    maxConnectionsPerAddress: c.maxConnectionsPerAddress ?? quarterOf(c.maxConnections),
    maxControlConnectionsPerAddress:
      c.maxControlConnectionsPerAddress ?? quarterOf(c.maxControlConnections),
    agentStreamMs: c.agentStreamMs ?? defaultAgentStreamMs(c.requestTimeoutMs),
  }));

/** 20 s, or half of a shorter request timeout; 0 (no streams) when that is below 1 s. */
function defaultAgentStreamMs(requestTimeoutMs: number): number {
  const ms = Math.min(20_000, Math.floor(requestTimeoutMs / 2));
  return ms < 1_000 ? 0 : ms;
}

function quarterOf(cap: number): number {
  return Math.max(1, Math.floor(cap / 4));
}

/** Control plane options as given (partial; defaults fill the rest). */
export type ControlPlaneOptions = z.input<typeof controlPlaneConfigSchema>;
/** Complete, validated control plane options. */
export type ResolvedControlPlaneOptions = Readonly<z.output<typeof controlPlaneConfigSchema>>;

/**
 * Validates options once. Throws `LLMGW_CONTROL_PLANE_CONFIG_INVALID` naming every bad
 * option and echoing its value.
 */
export function resolveControlPlaneOptions(
  options: ControlPlaneOptions,
): ResolvedControlPlaneOptions {
  const parsed = controlPlaneConfigSchema.safeParse(options);
  if (parsed.success) return parsed.data;
  const details = parsed.error.issues.map((issue) => {
    const key = issue.path.join(".");
    const value = key && key !== "store" ? (options as Record<string, unknown>)[key] : undefined;
    return `${key || "options"}: ${issue.message}${value === undefined ? "" : ` (got ${JSON.stringify(value)})`}`;
  });
  throw new ControlPlaneError(
    "LLMGW_CONTROL_PLANE_CONFIG_INVALID",
    `invalid control plane options: ${details.join("; ")}`,
  );
}

/** Splits `HOST:PORT` / `:PORT` into a host ("" = all interfaces) and a port number. */
export function splitListenAddress(address: string): { host: string; port: number } {
  const at = address.lastIndexOf(":");
  let host = address.slice(0, at);
  if (host.startsWith("[") && host.endsWith("]")) host = host.slice(1, -1);
  return { host, port: Number(address.slice(at + 1)) };
}
