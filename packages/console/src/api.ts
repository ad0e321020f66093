/**
 * The console's one way to the control plane: `ClusterService` through Connect-Web, binary
 * protobuf, on this origin. The session cookie is httpOnly (this code never sees it); the
 * CSRF token the login answered goes in `x-llmgw-csrf` on every call, and lives in memory
 * only — never in a URL or local storage. A reload asks `/ui/api/session` for it again.
 */
import {
  type Client,
  Code,
  ConnectError,
  createClient,
  type Interceptor,
} from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { ClusterService } from "@llmgw/proto";

export const CSRF_HEADER = "x-llmgw-csrf";

export interface Session {
  readonly csrf: string;
  readonly expiresAtMs: number;
}

let session: Session | undefined;
const expiredListeners = new Set<() => void>();

/** Called when a call finds the session gone (expired, logged out elsewhere, restart). */
export function onSessionExpired(listener: () => void): () => void {
  expiredListeners.add(listener);
  return () => expiredListeners.delete(listener);
}

const csrf: Interceptor = (next) => async (req) => {
  if (session !== undefined) req.header.set(CSRF_HEADER, session.csrf);
  try {
    return await next(req);
  } catch (error) {
    if (ConnectError.from(error).code === Code.Unauthenticated) {
      session = undefined;
      for (const listener of expiredListeners) listener();
    }
    throw error;
  }
};

export const cluster: Client<typeof ClusterService> = createClient(
  ClusterService,
  createConnectTransport({
    baseUrl: window.location.origin,
    useBinaryFormat: true,
    interceptors: [csrf],
    fetch: (input, init) => fetch(input, { ...init, credentials: "same-origin" }),
  }),
);

/** An error as one line for the page: the control plane's own message, without the code prefix. */
export function describeError(error: unknown): string {
  const e = ConnectError.from(error);
  if (e.code === Code.Unavailable) return `control plane unreachable: ${e.rawMessage}`;
  return e.rawMessage || e.message;
}

async function sessionCall(path: string, init: RequestInit): Promise<Response> {
  return fetch(path, { ...init, credentials: "same-origin", cache: "no-store" });
}

/** The session this browser already holds (its cookie), or undefined. */
export async function resumeSession(): Promise<Session | undefined> {
  const res = await sessionCall("/ui/api/session", { method: "GET" });
  if (!res.ok) return undefined;
  session = (await res.json()) as Session;
  return session;
}

/** Trades the admin token for a session; throws with the control plane's words when refused. */
export async function login(token: string): Promise<Session> {
  const res = await sessionCall("/ui/api/login", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ token }),
  });
  const body = (await res.json().catch(() => ({}))) as Partial<Session> & { message?: string };
  if (!res.ok || body.csrf === undefined || body.expiresAtMs === undefined)
    throw new Error(body.message ?? `login failed (HTTP ${res.status})`);
  session = { csrf: body.csrf, expiresAtMs: body.expiresAtMs };
  return session;
}

export async function logout(): Promise<void> {
  const headers: Record<string, string> = {};
  if (session !== undefined) headers[CSRF_HEADER] = session.csrf;
  session = undefined;
  await sessionCall("/ui/api/logout", { method: "POST", headers });
}
