import { createServer, request, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { networkInterfaces } from "node:os";
import { afterEach, describe, expect, it } from "vitest";
import { cookieValue, createConsoleHttp } from "./console-http.js";
import { createLoginThrottle, createSessionStore } from "./sessions.js";

describe("console sessions", () => {
  it("expire after their ttl and are dropped", () => {
    let now = 1_000;
    const store = createSessionStore({ ttlMs: 60_000, maxSessions: 10, now: () => now });
    const s = store.create();
    expect(store.get(s.id)).toBe(s);
    now += 59_999;
    expect(store.get(s.id)).toBe(s);
    now += 1;
    expect(store.get(s.id)).toBeUndefined();
    expect(store.size).toBe(0);
  });

  it("are bounded: the oldest gives way", () => {
    const store = createSessionStore({ ttlMs: 60_000, maxSessions: 3 });
    const [a, b, c, d] = [store.create(), store.create(), store.create(), store.create()];
    expect(store.size).toBe(3);
    expect(store.get(a.id)).toBeUndefined();
    for (const s of [b, c, d]) expect(store.get(s.id)).toBe(s);
  });

  it("have unguessable ids and CSRF tokens, never equal", () => {
    const store = createSessionStore({ ttlMs: 60_000, maxSessions: 100 });
    const seen = new Set<string>();
    for (let i = 0; i < 50; i++) {
      const s = store.create();
      expect(s.id).not.toBe(s.csrf);
      seen.add(s.id).add(s.csrf);
    }
    expect(seen.size).toBe(100);
  });
});

describe("the login throttle", () => {
  it("lets an address try again once its oldest failure in the window ages out", () => {
    let now = 0;
    const t = createLoginThrottle({
      maxFailures: 2,
      windowMs: 10_000,
      maxAddresses: 5,
      now: () => now,
    });
    t.failed("a");
    now = 4_000;
    t.failed("a");
    expect(t.retryAfterMs("a")).toBe(6_000);
    expect(t.retryAfterMs("b")).toBe(0);
    now = 10_001;
    expect(t.retryAfterMs("a")).toBe(0);
    t.failed("a");
    t.succeeded("a");
    expect(t.retryAfterMs("a")).toBe(0);
  });
});

describe("the login throttle's clients", () => {
  const throttle = () =>
    createLoginThrottle({ maxFailures: 2, windowMs: 60_000, maxAddresses: 5, now: () => 0 });

  it("counts every address of one IPv6 /64 as one client", () => {
    const t = throttle();
    t.failed("2001:db8:1:2::a");
    t.failed("2001:db8:1:2::b");
    expect(t.retryAfterMs("2001:db8:1:2:ffff::1")).toBe(60_000);
    expect(t.retryAfterMs("2001:db8:1:3::a")).toBe(0);
    t.succeeded("2001:db8:1:2::c");
    expect(t.retryAfterMs("2001:db8:1:2::a")).toBe(0);
  });

  it("counts an IPv4-mapped address as its IPv4 address, apart from ::1", () => {
    const t = throttle();
    t.failed("::ffff:192.0.2.1");
    t.failed("192.0.2.1");
    expect(t.retryAfterMs("::ffff:192.0.2.1")).toBe(60_000);
    expect(t.retryAfterMs("192.0.2.2")).toBe(0);
    expect(t.retryAfterMs("::ffff:192.0.2.2")).toBe(0);
    expect(t.retryAfterMs("::1")).toBe(0);
  });
});

/** Whether this host has IPv6 loopback (`::1`): some containers have IPv4 only. */
const hasIpv6Loopback = Object.values(networkInterfaces()).some((list) =>
  list?.some((i) => i.address === "::1"),
);

describe.skipIf(!hasIpv6Loopback)("failed logins on a dual-stack listener", () => {
  let server: Server | undefined;
  afterEach(() => server?.close());

  /** Posts a wrong token to `host:port` from `localAddress`; the answer's status and body. */
  const wrongLogin = (port: number, host: string, localAddress: string) =>
    new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = request(
        { host, port, localAddress, method: "POST", path: "/ui/api/login" },
        (res) => {
          let body = "";
          res.on("data", (c: Buffer) => {
            body += c.toString();
          });
          res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
        },
      );
      req.on("error", reject);
      req.end(JSON.stringify({ token: "wrong" }));
    });

  it("throttle an IPv4 client by its IPv4 address, never with ::1", async () => {
    const ui = createConsoleHttp({ adminToken: "t", assets: [], secure: false, sessionTtlMs: 1 });
    server = createServer((req, res) => {
      if (!ui.handle(req, res, req.url ?? "/")) res.end();
    });
    // `::` takes IPv4 clients too, and reports them IPv4-mapped: `::ffff:127.0.0.1`.
    await new Promise<void>((r) => server?.listen(0, "::", r));
    const port = (server.address() as AddressInfo).port;
    const statuses: number[] = [];
    for (let i = 0; i < 5; i++)
      statuses.push((await wrongLogin(port, "127.0.0.1", "127.0.0.1")).status);
    expect(statuses).toEqual([401, 401, 401, 401, 401]);
    const throttled = await wrongLogin(port, "127.0.0.1", "127.0.0.1");
    expect(throttled.status).toBe(429);
    expect(JSON.parse(throttled.body)).toMatchObject({
      message: expect.stringMatching(/^too many failed logins from 127\.0\.0\.1; try again in /),
    });
    // Another IPv4 address, and ::1 (in ::/64 like every IPv4-mapped address), are not held.
    expect((await wrongLogin(port, "127.0.0.1", "127.0.0.2")).status).toBe(401);
    expect((await wrongLogin(port, "::1", "::1")).status).toBe(401);
  });
});

describe("cookieValue", () => {
  it("finds a cookie among others and ignores look-alikes", () => {
    expect(cookieValue("a=1; llmgw_session=abc; b=2", "llmgw_session")).toBe("abc");
    expect(cookieValue("xllmgw_session=abc", "llmgw_session")).toBeUndefined();
    expect(cookieValue("llmgw_session=", "llmgw_session")).toBeUndefined();
    expect(cookieValue(undefined, "llmgw_session")).toBeUndefined();
  });
});

describe("the console under TLS", () => {
  let server: Server | undefined;
  afterEach(() => server?.close());

  it("sets a Secure __Host- cookie (the listener itself is TLS; the flag is what matters)", async () => {
    const ui = createConsoleHttp({
      adminToken: "admin-secret",
      assets: [],
      secure: true,
      sessionTtlMs: 3_600_000,
    });
    server = createServer((req, res) => {
      if (!ui.handle(req, res, req.url ?? "/")) res.end();
    });
    await new Promise<void>((r) => server?.listen(0, "127.0.0.1", r));
    const port = (server.address() as AddressInfo).port;
    const res = await fetch(`http://127.0.0.1:${port}/ui/api/login`, {
      method: "POST",
      body: JSON.stringify({ token: "admin-secret" }),
    });
    expect(res.status).toBe(200);
    const cookie = res.headers.get("set-cookie") ?? "";
    expect(cookie).toMatch(
      /^__Host-llmgw_session=[^;]+; Path=\/; HttpOnly; SameSite=Strict; Max-Age=3600; Secure$/,
    );
  });
});

describe("the console's files", () => {
  let server: Server | undefined;
  afterEach(() => server?.close());

  async function serve(assets: Parameters<typeof createConsoleHttp>[0]["assets"]) {
    const ui = createConsoleHttp({ adminToken: "t", assets, secure: false, sessionTtlMs: 60_000 });
    server = createServer((req, res) => {
      if (!ui.handle(req, res, req.url ?? "/")) res.end();
    });
    await new Promise<void>((r) => server?.listen(0, "127.0.0.1", r));
    return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  }

  it("not built: /ui/ says how to build them, with the security headers", async () => {
    const res = await fetch(`${await serve(undefined)}/ui/`);
    expect(res.status).toBe(503);
    expect(await res.text()).toMatch(/not built into this control plane \(run `pnpm build`/);
    expect(res.headers.get("content-security-policy")).toContain("default-src 'none'");
  });

  it("built: a file that is not one of them is 404, never the page", async () => {
    const page = { path: "index.html", contentType: "text/html", body: "", immutable: false };
    const base = await serve([page]);
    expect((await fetch(`${base}/ui/`)).status).toBe(200);
    expect((await fetch(`${base}/ui/assets/app-0.js`)).status).toBe(404);
  });
});

describe("a session's open calls", () => {
  let server: Server | undefined;
  afterEach(() => {
    server?.closeAllConnections();
    server?.close();
  });

  /**
   * A control listener in small: the console, then an admin call that stays open as
   * `WatchEvents` does (one line now, then nothing until the client goes).
   */
  async function serve(sessionTtlMs: number, maxSessions = 10) {
    const ui = createConsoleHttp({
      adminToken: "admin-secret",
      assets: [],
      secure: false,
      sessionTtlMs,
      maxSessions,
    });
    server = createServer((req, res) => {
      const path = req.url ?? "/";
      if (ui.handle(req, res, path) || !ui.admit(req, res, path)) return;
      res.writeHead(200, { "content-type": "text/plain" });
      res.write("streaming\n");
    });
    await new Promise<void>((r) => server?.listen(0, "127.0.0.1", r));
    const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const login = async () => {
      const res = await fetch(`${base}/ui/api/login`, {
        method: "POST",
        body: JSON.stringify({ token: "admin-secret" }),
      });
      expect(res.status).toBe(200);
      const cookie = (res.headers.get("set-cookie") ?? "").split(";")[0] ?? "";
      const { csrf } = (await res.json()) as { csrf: string };
      return { cookie, csrf };
    };
    /** Opens the stream on a session; resolves once its first line is in. */
    const watch = async (s: { cookie: string; csrf: string }) => {
      const res = await fetch(`${base}/llmgw.v1.ClusterService/WatchEvents`, {
        method: "POST",
        headers: { cookie: s.cookie, "x-llmgw-csrf": s.csrf },
      });
      expect(res.status).toBe(200);
      const reader = (res.body as ReadableStream<Uint8Array>).getReader();
      expect((await reader.read()).done).toBe(false);
      return reader;
    };
    return { base, login, watch };
  }

  /** "ended" once the stream ends or breaks within `ms`, else "still open". */
  const endsWithin = (reader: ReadableStreamDefaultReader<Uint8Array>, ms: number) =>
    Promise.race([
      (async () => {
        try {
          while (!(await reader.read()).done);
        } catch {
          // A broken stream has ended too.
        }
        return "ended";
      })(),
      new Promise<string>((r) => setTimeout(() => r("still open"), ms)),
    ]);

  it("end at logout: a stream opened on the session does not outlive it", async () => {
    const { base, login, watch } = await serve(3_600_000);
    const s = await login();
    const other = await login();
    const stream = await watch(s);
    const otherStream = await watch(other);
    const out = await fetch(`${base}/ui/api/logout`, {
      method: "POST",
      headers: { cookie: s.cookie, "x-llmgw-csrf": s.csrf },
    });
    expect(out.status).toBe(200);
    expect(await endsWithin(stream, 2_000)).toBe("ended");
    // Another login's stream goes on.
    expect(await endsWithin(otherStream, 300)).toBe("still open");
  });

  it("end when the session expires", async () => {
    const { login, watch } = await serve(400);
    const stream = await watch(await login());
    expect(await endsWithin(stream, 3_000)).toBe("ended");
  });

  it("end when the session is dropped for a newer one", async () => {
    const { login, watch } = await serve(3_600_000, 1);
    const stream = await watch(await login());
    await login();
    expect(await endsWithin(stream, 2_000)).toBe("ended");
  });
});
