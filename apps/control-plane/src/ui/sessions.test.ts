import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
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
