/**
 * The web console on the control listener: its static files under `/ui/`, a login that
 * trades the admin token for an httpOnly session cookie, and the one translation that lets
 * the page call `ClusterService` itself: a request carrying a live session cookie and its
 * CSRF token is let in as the admin. Nothing else changes for the admin API; the CLI's
 * bearer tokens go through untouched.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import type { ConsoleAsset } from "@llmgw/console";
import { clientAddressKey } from "@llmgw/router-server";
import { secretsEqual } from "../domain/tokens.js";
import { type ForwardedClient, forwardedClient, type ProxyTrust } from "./proxy-trust.js";
import {
  type ConsoleSession,
  createLoginThrottle,
  createSessionStore,
  type LoginThrottle,
  type SessionStore,
} from "./sessions.js";

/** The header a page sends its session's CSRF token in. */
export const CSRF_HEADER = "x-llmgw-csrf";
/** Only these paths accept a session cookie in place of the admin token. */
const ADMIN_API_PREFIX = "/llmgw.v1.ClusterService/";
const LOGIN_BODY_MAX_BYTES = 4_096;
/** setTimeout's longest delay (~24.8 days); a longer login re-arms its timer. */
const MAX_TIMER_MS = 2_147_483_647;

/**
 * No inline script or style, nothing from elsewhere, no framing: the page's only code is its
 * own bundle, and it talks to this origin only.
 */
export const CONSOLE_CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self' data:",
  "connect-src 'self'",
  "font-src 'self'",
  "base-uri 'none'",
  "form-action 'self'",
  "frame-ancestors 'none'",
].join("; ");

const SECURITY_HEADERS: Readonly<Record<string, string>> = {
  "content-security-policy": CONSOLE_CSP,
  "x-content-type-options": "nosniff",
  "x-frame-options": "DENY",
  "referrer-policy": "no-referrer",
  "cross-origin-opener-policy": "same-origin",
  "cross-origin-resource-policy": "same-origin",
};

/** Options of {@link createConsoleHttp}. */
export interface ConsoleHttpOptions {
  readonly adminToken: string;
  /** The built files; undefined when the console was not built (the page then says so). */
  readonly assets: readonly ConsoleAsset[] | undefined;
  /** The control listener speaks TLS: cookies get `Secure` and the `__Host-` prefix. */
  readonly secure: boolean;
  /**
   * Reverse proxies whose `X-Forwarded-For` / `X-Forwarded-Proto` count (`--trusted-proxy`):
   * failed logins are throttled per client behind them, and a client's HTTPS to them makes the
   * cookie `Secure`. Absent: none, the headers are ignored.
   */
  readonly trustedProxies?: ProxyTrust;
  readonly sessionTtlMs: number;
  readonly maxSessions?: number;
  readonly now?: () => number;
  readonly log?: (line: string) => void;
}

/** The console's side of the control listener. */
export interface ConsoleHttp {
  /** Answers `/ui` and everything under it; false for any other path. */
  handle(req: IncomingMessage, res: ServerResponse, path: string): boolean;
  /**
   * For an admin API call with a session cookie and no `Authorization` header: lets it in as
   * the admin when the session is live and the CSRF token matches (true), or answers it with
   * 401 / 403 (false). Any other request passes untouched (true). A call let in is cut if it
   * is still open when its session ends (logout, expiry, dropped for a newer one).
   */
  admit(req: IncomingMessage, res: ServerResponse, path: string): boolean;
  readonly sessions: SessionStore;
}

export function createConsoleHttp(opts: ConsoleHttpOptions): ConsoleHttp {
  const now = opts.now ?? Date.now;
  const log = opts.log ?? (() => {});
  const clientOf = (req: IncomingMessage): ForwardedClient =>
    forwardedClient(req, opts.trustedProxies, opts.secure);
  /** The cookie's name on a request that is `secure`: a browser keeps `__Host-` only over TLS. */
  const cookieName = (secure: boolean) => (secure ? "__Host-llmgw_session" : "llmgw_session");
  /**
   * The calls each session let in that are still open. The session is checked once, when a
   * call starts; a stream (`WatchEvents`) would otherwise go on after a logout, after the
   * login's expiry, or after the session was dropped for a newer one, for as long as its
   * holder keeps it open. Each is cut when its session goes.
   */
  const open = new Map<string, OpenCalls>();
  const endCalls = (id: string): void => {
    const calls = open.get(id);
    if (calls === undefined) return;
    open.delete(id);
    clearTimeout(calls.expiry);
    for (const res of calls.responses) res.destroy();
  };
  const sessions = createSessionStore({
    ttlMs: opts.sessionTtlMs,
    maxSessions: opts.maxSessions ?? 1_000,
    now,
    onDrop: endCalls,
  });
  /** Ties `res` to `session`: it ends when the session does (see {@link open}). */
  const holdOpen = (session: ConsoleSession, res: ServerResponse): void => {
    let calls = open.get(session.id);
    if (calls === undefined) {
      const fresh: OpenCalls = { responses: new Set(), expiry: undefined };
      // At the expiry, `get` finds the session expired and drops it, which ends its calls.
      const arm = (): void => {
        fresh.expiry = setTimeout(
          () => {
            if (sessions.get(session.id) !== undefined) arm();
          },
          Math.min(MAX_TIMER_MS, Math.max(0, session.expiresAtMs - now())),
        );
        fresh.expiry.unref();
      };
      arm();
      open.set(session.id, fresh);
      calls = fresh;
    }
    const held = calls;
    held.responses.add(res);
    res.once("close", () => {
      held.responses.delete(res);
      if (held.responses.size === 0 && open.get(session.id) === held) {
        clearTimeout(held.expiry);
        open.delete(session.id);
      }
    });
  };
  const throttle: LoginThrottle = createLoginThrottle({
    maxFailures: 5,
    windowMs: 60_000,
    maxAddresses: 10_000,
    now,
  });
  const files = new Map<string, { asset: ConsoleAsset; bytes: Buffer }>();
  for (const asset of opts.assets ?? [])
    files.set(asset.path, { asset, bytes: Buffer.from(asset.body, "base64") });

  const cookie = (secure: boolean, value: string, maxAgeS: number): string =>
    [
      `${cookieName(secure)}=${value}`,
      "Path=/",
      "HttpOnly",
      "SameSite=Strict",
      `Max-Age=${maxAgeS}`,
      ...(secure ? ["Secure"] : []),
    ].join("; ");

  const sessionOf = (req: IncomingMessage): ConsoleSession | undefined => {
    const id = cookieValue(req.headers.cookie, cookieName(clientOf(req).secure));
    return id === undefined ? undefined : sessions.get(id);
  };

  /** A request from a page of another origin: refused whatever it carries. */
  const crossOrigin = (req: IncomingMessage): boolean => {
    const origin = req.headers.origin;
    if (origin === undefined) return false;
    try {
      return new URL(origin).host !== req.headers.host;
    } catch {
      return true;
    }
  };

  const json = (res: ServerResponse, status: number, body: unknown, extra = {}): void => {
    res.writeHead(status, {
      ...SECURITY_HEADERS,
      "content-type": "application/json",
      "cache-control": "no-store",
      ...extra,
    });
    res.end(JSON.stringify(body));
  };
  const refuse = (res: ServerResponse, status: number, code: string, message: string) =>
    json(res, status, { code, message });

  const serveFile = (res: ServerResponse, req: IncomingMessage, file: string): void => {
    const found = files.get(file);
    if (found === undefined) {
      if (opts.assets === undefined) {
        res.writeHead(503, { ...SECURITY_HEADERS, "content-type": "text/plain; charset=utf-8" });
        res.end(
          "The web console was not built into this control plane (run `pnpm build`, or start it with --no-ui).\n",
        );
        return;
      }
      res.writeHead(404, { ...SECURITY_HEADERS, "content-type": "text/plain; charset=utf-8" });
      res.end("not found\n");
      return;
    }
    res.writeHead(200, {
      ...SECURITY_HEADERS,
      "content-type": found.asset.contentType,
      "content-length": String(found.bytes.length),
      "cache-control": found.asset.immutable ? "public, max-age=31536000, immutable" : "no-cache",
    });
    res.end(req.method === "HEAD" ? undefined : found.bytes);
  };

  const login = (req: IncomingMessage, res: ServerResponse): void => {
    const client = clientOf(req);
    const address = client.address;
    /** For the log: the address, and the proxy it came through. */
    const from = client.via === undefined ? address : `${address} (via ${client.via})`;
    const wait = throttle.retryAfterMs(address);
    if (wait > 0) {
      refuse(
        res,
        429,
        "LLMGW_CONTROL_PLANE_UI_LOGIN_THROTTLED",
        `too many failed logins from ${clientAddressKey(address)}; try again in ${Math.ceil(wait / 1000)} s`,
      );
      return;
    }
    // Counted as failed now, cleared if right: logins sent together all pass the check above
    // before any body is read, and each must use up one of the address's tries.
    throttle.failed(address);
    readSmallBody(req, LOGIN_BODY_MAX_BYTES).then(
      (body) => {
        let token: unknown;
        try {
          token = (JSON.parse(body) as { token?: unknown }).token;
        } catch {
          refuse(res, 400, "LLMGW_CONTROL_PLANE_UI_BAD_LOGIN", 'expected JSON {"token": "…"}');
          return;
        }
        if (typeof token !== "string" || token.length === 0) {
          refuse(res, 400, "LLMGW_CONTROL_PLANE_UI_BAD_LOGIN", 'expected JSON {"token": "…"}');
          return;
        }
        if (!secretsEqual(token.trim(), opts.adminToken)) {
          log(`console: failed login from ${from}`);
          refuse(
            res,
            401,
            "LLMGW_CONTROL_PLANE_UI_LOGIN_FAILED",
            "wrong token: the console takes the admin token (llmgw control-plane token --admin)",
          );
          return;
        }
        throttle.succeeded(address);
        const session = sessions.create();
        log(`console: login from ${from}`);
        json(
          res,
          200,
          { csrf: session.csrf, expiresAtMs: session.expiresAtMs },
          {
            "set-cookie": cookie(client.secure, session.id, Math.floor(opts.sessionTtlMs / 1000)),
          },
        );
      },
      (error: Error) =>
        refuse(res, 413, "LLMGW_CONTROL_PLANE_UI_BAD_LOGIN", `login body: ${error.message}`),
    );
  };

  return {
    sessions,
    handle(req, res, path) {
      if (path !== "/ui" && !path.startsWith("/ui/")) return false;
      const method = req.method ?? "GET";
      if (path === "/ui") {
        res.writeHead(308, { ...SECURITY_HEADERS, location: "/ui/" });
        res.end();
        return true;
      }
      if (path.startsWith("/ui/api/")) {
        if (crossOrigin(req)) {
          refuse(res, 403, "LLMGW_CONTROL_PLANE_UI_CROSS_ORIGIN", "cross-origin request refused");
          return true;
        }
        const route = path.slice("/ui/api/".length);
        if (route === "login" && method === "POST") login(req, res);
        else if (route === "session" && method === "GET") {
          const session = sessionOf(req);
          if (session === undefined)
            refuse(res, 401, "LLMGW_CONTROL_PLANE_UI_NO_SESSION", "not logged in");
          else json(res, 200, { csrf: session.csrf, expiresAtMs: session.expiresAtMs });
        } else if (route === "logout" && method === "POST") {
          const session = sessionOf(req);
          if (session !== undefined && !csrfMatches(req, session)) {
            refuse(res, 403, "LLMGW_CONTROL_PLANE_UI_CSRF", `missing or wrong ${CSRF_HEADER}`);
            return true;
          }
          if (session !== undefined) sessions.revoke(session.id);
          const { secure } = clientOf(req);
          const cleared = [cookie(secure, "", 0)];
          if (secure) {
            // A session made over plain HTTP (before a TLS proxy was put in front, say) has a
            // cookie without `Secure`, which the browser sends over TLS too: it ends as well.
            const plain = cookieValue(req.headers.cookie, cookieName(false));
            if (plain !== undefined) {
              sessions.revoke(plain);
              cleared.push(cookie(false, "", 0));
            }
          }
          json(res, 200, {}, { "set-cookie": cleared });
        } else refuse(res, 404, "LLMGW_CONTROL_PLANE_UI_NOT_FOUND", `no ${method} ${path}`);
        return true;
      }
      if (method !== "GET" && method !== "HEAD") {
        res.writeHead(405, { ...SECURITY_HEADERS, allow: "GET, HEAD" });
        res.end();
        return true;
      }
      const file = path.slice("/ui/".length);
      serveFile(res, req, file === "" ? "index.html" : file);
      return true;
    },
    admit(req, res, path) {
      if (!path.startsWith(ADMIN_API_PREFIX) || req.headers.authorization !== undefined)
        return true;
      const id = cookieValue(req.headers.cookie, cookieName(clientOf(req).secure));
      if (id === undefined) return true;
      if (crossOrigin(req)) {
        refuse(res, 403, "permission_denied", "cross-origin request refused");
        return false;
      }
      const session = sessions.get(id);
      if (session === undefined) {
        // Connect's error shape: the page's client reads it as Code.Unauthenticated.
        json(res, 401, { code: "unauthenticated", message: "console session expired; log in" });
        return false;
      }
      if (!csrfMatches(req, session)) {
        json(res, 403, { code: "permission_denied", message: `missing or wrong ${CSRF_HEADER}` });
        return false;
      }
      holdOpen(session, res);
      req.headers.authorization = `Bearer ${opts.adminToken}`;
      return true;
    },
  };
}

/** A session's calls still open, and the timer that ends them at its expiry. */
interface OpenCalls {
  readonly responses: Set<ServerResponse>;
  expiry: ReturnType<typeof setTimeout> | undefined;
}

function csrfMatches(req: IncomingMessage, session: ConsoleSession): boolean {
  const sent = req.headers[CSRF_HEADER];
  return typeof sent === "string" && secretsEqual(sent, session.csrf);
}

/** The value of cookie `name` in a `Cookie` header, or undefined. */
export function cookieValue(header: string | undefined, name: string): string | undefined {
  if (header === undefined) return undefined;
  for (const part of header.split(";")) {
    const eq = part.indexOf("=");
    if (eq === -1) continue;
    if (part.slice(0, eq).trim() === name) {
      const value = part.slice(eq + 1).trim();
      return value === "" ? undefined : value;
    }
  }
  return undefined;
}

function readSmallBody(req: IncomingMessage, maxBytes: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size > maxBytes) {
        // Read on and drop the rest (the request timeout bounds it), so the answer gets out.
        req.off("data", onData);
        req.resume();
        reject(new Error(`over ${maxBytes} bytes`));
        return;
      }
      chunks.push(chunk);
    };
    req.on("data", onData);
    req.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
    req.on("error", reject);
  });
}
