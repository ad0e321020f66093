/**
 * The one HTTP(S) server factory: production's public and control listeners, the router's
 * test and benchmark server all come from {@link createHttpListener}, so the limits an
 * operator sets are the limits the tests and benchmarks ran with.
 */
import {
  createServer as createHttpServer,
  type IncomingMessage,
  type RequestListener,
  type Server,
  type ServerResponse,
} from "node:http";
import { createServer as createHttpsServer } from "node:https";
import type { Socket } from "node:net";
import { clientAddressKey } from "./client-address-key.js";
import { RouterServiceError } from "./errors.js";
import { optionInt } from "./option-int.js";

/** What a listener enforces on its clients (all optional; defaults below). */
export interface HttpListenerOptions {
  /** Largest request head (URL + headers); larger answers 431. Default 16 KiB. */
  readonly maxHeaderBytes?: number;
  /** Time a client has to send a request head, ms; then 408. Default 30 000. */
  readonly headersTimeoutMs?: number;
  /**
   * Time a client has to send the whole request, head and body, ms; then 408 (the answer, e.g.
   * a long stream, is not limited). Default 60 000; at least `headersTimeoutMs`.
   */
  readonly requestTimeoutMs?: number;
  /** Idle keep-alive connections are closed after this, ms. Default 5 000. */
  readonly keepAliveTimeoutMs?: number;
  /** Open connections at once; more are closed as they arrive. Default 4 096. */
  readonly maxConnections?: number;
  /**
   * Open connections from one client address; more are closed as they arrive. An IPv6 client
   * counts by its /64 (one host normally holds all of it), an IPv4 one (IPv4-mapped included)
   * by its address. Default 1024.
   */
  readonly maxConnectionsPerAddress?: number;
  /** PEM certificate and key: serve HTTPS. */
  readonly tls?: { readonly cert: Buffer | string; readonly key: Buffer | string };
}

/** {@link HttpListenerOptions} validated, with defaults and the derived check interval. */
export interface ResolvedHttpListenerOptions {
  readonly maxHeaderBytes: number;
  readonly headersTimeoutMs: number;
  readonly requestTimeoutMs: number;
  readonly keepAliveTimeoutMs: number;
  readonly maxConnections: number;
  readonly maxConnectionsPerAddress: number;
  /**
   * How often Node checks the head and request timeouts, ms: a quarter of the smaller one,
   * 50–1 000. Node checks every 30 s by default, so a 30 s head timeout fired after 30–60 s.
   */
  readonly connectionsCheckingIntervalMs: number;
  readonly tls: { readonly cert: Buffer | string; readonly key: Buffer | string } | undefined;
}

/**
 * Bounds of each integer option, inclusive: the resolver checks them, and `llmgw router`'s
 * flags (config.ts) check the same ones, naming the flag.
 */
export const LISTENER_OPTION_LIMITS = {
  maxHeaderBytes: { min: 1024, max: 1 << 20 },
  headersTimeoutMs: { min: 1, max: 3_600_000 },
  requestTimeoutMs: { min: 1, max: 86_400_000 },
  keepAliveTimeoutMs: { min: 1, max: 3_600_000 },
  maxConnections: { min: 1, max: 1_000_000 },
  maxConnectionsPerAddress: { min: 1, max: 1_000_000 },
} as const;

const int = (name: keyof typeof LISTENER_OPTION_LIMITS, value: number): number =>
  optionInt(
    "listener",
    name,
    value,
    LISTENER_OPTION_LIMITS[name].min,
    LISTENER_OPTION_LIMITS[name].max,
  );

/** Applies defaults once; throws `LLMGW_ROUTER_CONFIG_INVALID` naming the bad option. */
export function resolveHttpListenerOptions(
  options: HttpListenerOptions = {},
): ResolvedHttpListenerOptions {
  const headersTimeoutMs = int("headersTimeoutMs", options.headersTimeoutMs ?? 30_000);
  const requestTimeoutMs = int("requestTimeoutMs", options.requestTimeoutMs ?? 60_000);
  if (requestTimeoutMs < headersTimeoutMs) {
    throw new RouterServiceError(
      "LLMGW_ROUTER_CONFIG_INVALID",
      `listener option requestTimeoutMs (${requestTimeoutMs}) must not be below headersTimeoutMs (${headersTimeoutMs})`,
    );
  }
  return {
    maxHeaderBytes: int("maxHeaderBytes", options.maxHeaderBytes ?? 16 * 1024),
    headersTimeoutMs,
    requestTimeoutMs,
    keepAliveTimeoutMs: int("keepAliveTimeoutMs", options.keepAliveTimeoutMs ?? 5_000),
    maxConnections: int("maxConnections", options.maxConnections ?? 4096),
    maxConnectionsPerAddress: int(
      "maxConnectionsPerAddress",
      options.maxConnectionsPerAddress ?? 1024,
    ),
    connectionsCheckingIntervalMs: Math.max(
      50,
      Math.min(1_000, Math.floor(Math.min(headersTimeoutMs, requestTimeoutMs) / 4)),
    ),
    tls: options.tls,
  };
}

/**
 * Creates (does not start) an HTTP or HTTPS server enforcing every option: head size, head and
 * request deadlines (checked often enough to hold within a second), keep-alive idle time, a cap
 * on open connections and one per client address (an IPv6 client's /64). A connection over
 * either cap is destroyed as it arrives, before any byte is read, so a flood costs one accept
 * per connection and never holds descriptors. Throws `LLMGW_ROUTER_TLS_INVALID` for an unusable certificate/key.
 */
export function createHttpListener(
  options: HttpListenerOptions | ResolvedHttpListenerOptions,
  handler: RequestListener,
): Server {
  const o =
    "connectionsCheckingIntervalMs" in options ? options : resolveHttpListenerOptions(options);
  const serverOptions = {
    maxHeaderSize: o.maxHeaderBytes,
    headersTimeout: o.headersTimeoutMs,
    requestTimeout: o.requestTimeoutMs,
    keepAliveTimeout: o.keepAliveTimeoutMs,
    connectionsCheckingInterval: o.connectionsCheckingIntervalMs,
    noDelay: true,
  };
  let server: Server;
  try {
    server = o.tls
      ? // HTTP's deadlines start once the handshake is done: the head deadline bounds the
        // handshake too (Node's default is 120 s), or a client that never finishes it holds
        // its connection and its address's share four times as long.
        createHttpsServer(
          { ...o.tls, ...serverOptions, handshakeTimeout: o.headersTimeoutMs },
          handler,
        )
      : createHttpServer(serverOptions, handler);
  } catch (cause) {
    throw new RouterServiceError(
      "LLMGW_ROUTER_TLS_INVALID",
      `invalid TLS certificate or key: ${(cause as Error).message}`,
      { cause },
    );
  }
  // Also as properties: older Node versions read some of these only from the server object.
  server.headersTimeout = o.headersTimeoutMs;
  server.requestTimeout = o.requestTimeoutMs;
  server.keepAliveTimeout = o.keepAliveTimeoutMs;
  server.maxConnections = o.maxConnections;
  const admit = createPerAddressCap(o.maxConnectionsPerAddress);
  // After the HTTP layer's own listener: a destroyed socket then ends as any client hang-up.
  server.on("connection", (socket: Socket) => {
    admit(socket);
  });
  // `Expect: 100-continue`: Node answers 100 at once unless told otherwise, inviting a body the
  // handler may refuse on its head alone (a key, a declared length), and then drains. The 100
  // goes when the handler starts reading the body; an answer given first ends the connection
  // (Node closes it: the client never sent what it announced).
  server.on("checkContinue", (req: IncomingMessage, res: ServerResponse) => {
    uninvited.add(req);
    const invite = (event: string | symbol): void => {
      if (event !== "data" && event !== "readable") return;
      req.off("newListener", invite);
      if (res.headersSent) return;
      uninvited.delete(req);
      res.writeContinue();
    };
    req.on("newListener", invite);
    handler(req, res);
  });
  return server;
}

/** Requests that announced a body with `Expect: 100-continue` and were not asked for it. */
const uninvited = new WeakSet<IncomingMessage>();

/**
 * Whether `req` announced its body with `Expect: 100-continue` and was never asked for it: the
 * client sends no body, so an answer need not wait to drain one.
 */
export function bodyNotInvited(req: IncomingMessage): boolean {
  return uninvited.has(req);
}

/** The part of an accepted `net.Socket` that {@link createPerAddressCap} reads and acts on. */
export interface CountedConnection {
  readonly remoteAddress?: string | undefined;
  destroy(): unknown;
  once(event: "close", listener: () => void): unknown;
}

/**
 * The per-address cap's accounting: counts open connections per client key
 * ({@link clientAddressKey}: an IPv4 address, an IPv6 /64) and destroys each new connection
 * whose client already has `max` open. Returns the function to call on each accepted
 * connection: true when it was let in (and is counted until it closes), false when destroyed.
 */
export function createPerAddressCap(max: number): (connection: CountedConnection) => boolean {
  const open = new Map<string, number>();
  return (connection) => {
    const key = clientAddressKey(connection.remoteAddress ?? "");
    const count = open.get(key) ?? 0;
    if (count >= max) {
      connection.destroy();
      return false;
    }
    open.set(key, count + 1);
    connection.once("close", () => {
      const left = (open.get(key) ?? 1) - 1;
      if (left <= 0) open.delete(key);
      else open.set(key, left);
    });
    return true;
  };
}
