/**
 * The web console's side of the control listener, against a real control plane: the built
 * page with its security headers, the login that trades the admin token for an httpOnly
 * session cookie, and the cookie-plus-CSRF translation that lets the page call
 * `ClusterService` — and nothing else.
 */
import { connect } from "node:net";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { AgentService } from "@llmgw/proto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { ControlPlane } from "../src/run.js";
import { startControlPlane } from "../src/run.js";
import { CONSOLE_CSP, CSRF_HEADER } from "../src/ui/console-http.js";
import { adminClient, startTestControlPlane, tempDir } from "./helpers.js";

const dir = tempDir("llmgw-console-");
let cp: ControlPlane;

beforeAll(async () => {
  cp = await startTestControlPlane(dir.dir);
});
afterAll(async () => {
  await cp?.close();
  dir.cleanup();
});

async function login(token: string, headers: Record<string, string> = {}) {
  return fetch(`${cp.controlUrl}/ui/api/login`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify({ token }),
  });
}

/** A fresh session: its cookie pair ("llmgw_session=…") and CSRF token. */
async function session(): Promise<{ cookie: string; csrf: string }> {
  const res = await login(cp.adminToken);
  expect(res.status).toBe(200);
  const cookie = (res.headers.get("set-cookie") ?? "").split(";")[0] ?? "";
  const { csrf } = (await res.json()) as { csrf: string };
  return { cookie, csrf };
}

const anonymous = () => adminClient(cp);

async function codeOf(call: Promise<unknown>): Promise<Code | "ok"> {
  try {
    await call;
    return "ok";
  } catch (error) {
    return ConnectError.from(error).code;
  }
}

describe("the console's page", () => {
  it("redirects /ui to /ui/ and serves the built page with a strict CSP", async () => {
    const bare = await fetch(`${cp.controlUrl}/ui`, { redirect: "manual" });
    expect(bare.status).toBe(308);
    expect(bare.headers.get("location")).toBe("/ui/");

    const page = await fetch(`${cp.controlUrl}/ui/`);
    const html = await page.text();
    // 503 means @llmgw/console was not built: `pnpm build` (scripts/check.sh builds first).
    expect(page.status, html).toBe(200);
    expect(page.headers.get("content-security-policy")).toBe(CONSOLE_CSP);
    expect(page.headers.get("x-frame-options")).toBe("DENY");
    expect(page.headers.get("cache-control")).toBe("no-cache");
    expect(html).not.toMatch(/<script>|<style>|style="/);

    const script = /<script type="module" src="\.\/(assets\/app-[0-9a-f]+\.js)"/.exec(html)?.[1];
    expect(script).toBeDefined();
    const js = await fetch(`${cp.controlUrl}/ui/${script}`);
    expect(js.status).toBe(200);
    expect(js.headers.get("content-type")).toMatch(/^text\/javascript/);
    expect(js.headers.get("cache-control")).toContain("immutable");
    expect((await js.arrayBuffer()).byteLength).toBeGreaterThan(10_000);

    expect((await fetch(`${cp.controlUrl}/ui/assets/nothing.js`)).status).toBe(404);
    expect((await fetch(`${cp.controlUrl}/ui/`, { method: "POST" })).status).toBe(405);
  });
});

describe("console login", () => {
  it("refuses a wrong token with a specific error and no cookie", async () => {
    const res = await login("not-the-admin-token");
    expect(res.status).toBe(401);
    expect(res.headers.get("set-cookie")).toBeNull();
    expect(await res.json()).toMatchObject({ code: "LLMGW_CONTROL_PLANE_UI_LOGIN_FAILED" });
  });

  it("refuses a body that is not the expected JSON, or too large", async () => {
    const url = `${cp.controlUrl}/ui/api/login`;
    const bad = await fetch(url, { method: "POST", body: "token=abc" });
    expect(bad.status).toBe(400);
    expect(await bad.json()).toMatchObject({ code: "LLMGW_CONTROL_PLANE_UI_BAD_LOGIN" });
    const huge = await fetch(url, {
      method: "POST",
      body: JSON.stringify({ token: "x".repeat(10_000) }),
    });
    expect(huge.status).toBe(413);
  });

  it("trades the admin token for an httpOnly SameSite=Strict cookie and a CSRF token", async () => {
    const res = await login(cp.adminToken);
    expect(res.status).toBe(200);
    const setCookie = res.headers.get("set-cookie") ?? "";
    expect(setCookie).toMatch(/^llmgw_session=[A-Za-z0-9_-]{43}; /);
    expect(setCookie).toContain("HttpOnly");
    expect(setCookie).toContain("SameSite=Strict");
    expect(setCookie).toContain("Path=/");
    expect(setCookie).toContain(`Max-Age=${12 * 3600}`);
    // Plain HTTP here: Secure would make the browser drop it.
    expect(setCookie).not.toContain("Secure");
    expect(res.headers.get("cache-control")).toBe("no-store");
    const body = (await res.json()) as { csrf: string; expiresAtMs: number };
    expect(body.csrf).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(body.expiresAtMs).toBeGreaterThan(Date.now());
    // The admin token itself is nowhere in the answer.
    expect(JSON.stringify(body) + setCookie).not.toContain(cp.adminToken);
  });

  it("refuses a login posted from another origin", async () => {
    const res = await login(cp.adminToken, { origin: "https://evil.example" });
    expect(res.status).toBe(403);
    expect(res.headers.get("set-cookie")).toBeNull();
  });
});

describe("ClusterService with a console session", () => {
  it("answers a call that carries the session cookie and its CSRF token", async () => {
    const s = await session();
    const res = await anonymous().getClusterStatus(
      {},
      { headers: { cookie: s.cookie, [CSRF_HEADER]: s.csrf } },
    );
    expect(res.store).toBe("sqlite");
  });

  it("refuses the cookie without the CSRF token, or with another session's", async () => {
    const s = await session();
    const other = await session();
    const client = anonymous();
    expect(await codeOf(client.listNodes({}, { headers: { cookie: s.cookie } }))).toBe(
      Code.PermissionDenied,
    );
    expect(
      await codeOf(
        client.listNodes({}, { headers: { cookie: s.cookie, [CSRF_HEADER]: other.csrf } }),
      ),
    ).toBe(Code.PermissionDenied);
  });

  it("refuses an unknown session, and a call from another origin", async () => {
    const s = await session();
    const client = anonymous();
    expect(
      await codeOf(
        client.listNodes(
          {},
          { headers: { cookie: `llmgw_session=${"A".repeat(43)}`, [CSRF_HEADER]: s.csrf } },
        ),
      ),
    ).toBe(Code.Unauthenticated);
    expect(
      await codeOf(
        client.listNodes(
          {},
          { headers: { cookie: s.cookie, [CSRF_HEADER]: s.csrf, origin: "http://evil.example" } },
        ),
      ),
    ).toBe(Code.PermissionDenied);
  });

  it("grants nothing outside ClusterService: the agent API still wants the join token", async () => {
    const s = await session();
    const agent = createClient(
      AgentService,
      createConnectTransport({ httpVersion: "1.1", baseUrl: cp.controlUrl }),
    );
    expect(
      await codeOf(agent.register({}, { headers: { cookie: s.cookie, [CSRF_HEADER]: s.csrf } })),
    ).toBe(Code.Unauthenticated);
  });

  it("leaves bearer-token callers (the CLI) as they were", async () => {
    expect(await codeOf(adminClient(cp, cp.adminToken).listNodes({}))).toBe("ok");
    expect(await codeOf(anonymous().listNodes({}))).toBe(Code.Unauthenticated);
  });

  it("resumes the session after a reload, and ends it at logout", async () => {
    const s = await session();
    const resumed = await fetch(`${cp.controlUrl}/ui/api/session`, {
      headers: { cookie: s.cookie },
    });
    expect(resumed.status).toBe(200);
    expect(((await resumed.json()) as { csrf: string }).csrf).toBe(s.csrf);

    const noCsrf = await fetch(`${cp.controlUrl}/ui/api/logout`, {
      method: "POST",
      headers: { cookie: s.cookie },
    });
    expect(noCsrf.status).toBe(403);
    const out = await fetch(`${cp.controlUrl}/ui/api/logout`, {
      method: "POST",
      headers: { cookie: s.cookie, [CSRF_HEADER]: s.csrf },
    });
    expect(out.status).toBe(200);
    expect(out.headers.get("set-cookie")).toMatch(/^llmgw_session=; .*Max-Age=0/);
    expect(
      await codeOf(
        anonymous().listNodes({}, { headers: { cookie: s.cookie, [CSRF_HEADER]: s.csrf } }),
      ),
    ).toBe(Code.Unauthenticated);
    const gone = await fetch(`${cp.controlUrl}/ui/api/session`, { headers: { cookie: s.cookie } });
    expect(gone.status).toBe(401);
  });
});

describe("a console session's event stream", () => {
  it("is cut at logout, not left open for as long as its holder keeps it", async () => {
    const s = await session();
    const headers = { cookie: s.cookie, [CSRF_HEADER]: s.csrf };
    const stream = anonymous().watchEvents({ backlog: 0 }, { headers });
    const ended = (async () => {
      try {
        for await (const _ of stream);
        return "ended";
      } catch (error) {
        return `failed: ${ConnectError.from(error).code}`;
      }
    })();
    // Let the call in before its session goes.
    await new Promise((r) => setTimeout(r, 300));
    const out = await fetch(`${cp.controlUrl}/ui/api/logout`, { method: "POST", headers });
    expect(out.status).toBe(200);
    const result = await Promise.race([
      ended,
      new Promise<string>((r) => setTimeout(() => r("still open"), 3_000)),
    ]);
    expect(result).not.toBe("still open");
  });
});

/** A control plane of its own for one test, closed after it. */
async function withControlPlane(
  ui: boolean,
  test: (other: ControlPlane) => Promise<void>,
  options: { trustedProxies?: string[] } = {},
) {
  const own = tempDir("llmgw-console-own-");
  const other = await startControlPlane({
    dataDir: own.dir,
    listen: "127.0.0.1:0",
    controlListen: "127.0.0.1:0",
    ui,
    shutdownGraceMs: 1_000,
    ...options,
  });
  try {
    await test(other);
  } finally {
    await other.close();
    own.cleanup();
  }
}

describe("--no-ui", () => {
  it("serves no console and takes no session cookie", async () => {
    await withControlPlane(false, async (plain) => {
      expect(plain.consoleUrl).toBeUndefined();
      expect((await fetch(`${plain.controlUrl}/ui/`)).status).toBe(404);
      expect((await fetch(`${plain.controlUrl}/ui/api/login`, { method: "POST" })).status).toBe(
        404,
      );
    });
  });
});

describe("failed logins", () => {
  it("are throttled per address after five in a minute, with the wait in the answer", async () => {
    await withControlPlane(true, async (own) => {
      const attempt = (token: string) =>
        fetch(`${own.controlUrl}/ui/api/login`, {
          method: "POST",
          body: JSON.stringify({ token }),
        });
      const statuses: number[] = [];
      for (let i = 0; i < 6; i++) statuses.push((await attempt(`wrong-${i}`)).status);
      expect(statuses).toEqual([401, 401, 401, 401, 401, 429]);
      // Even the right token waits: the throttle does not tell right from wrong.
      const right = await attempt(own.adminToken);
      expect(right.status).toBe(429);
      expect(await right.json()).toMatchObject({
        code: "LLMGW_CONTROL_PLANE_UI_LOGIN_THROTTLED",
        message: expect.stringMatching(/try again in \d+ s/),
      });
    });
  });

  it("are throttled when sent together, each counted before its body is read", async () => {
    await withControlPlane(true, async (own) => {
      const { hostname, port } = new URL(own.controlUrl);
      // Each login's head goes now and its body once every head is in: all of them pass the
      // throttle's check before any token is compared.
      const logins = Array.from({ length: 10 }, (_, i) => {
        const body = JSON.stringify({ token: `wrong-${i}` });
        const socket = connect(Number(port), hostname);
        socket.write(
          `POST /ui/api/login HTTP/1.1\r\nhost: ${hostname}\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\nconnection: close\r\n\r\n`,
        );
        let text = "";
        socket.on("data", (c: Buffer) => {
          text += c.toString("latin1");
        });
        const status = new Promise<number>((resolve, reject) => {
          socket.on("end", () => resolve(Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1])));
          socket.on("error", reject);
        });
        const answered = () => text.length > 0;
        return { socket, body, status, answered };
      });
      // The 429s answer on the head alone; the first five wait for their bodies.
      await expect.poll(() => logins.filter((l) => l.answered()).length).toBe(5);
      for (const l of logins) if (!l.answered()) l.socket.write(l.body);
      const statuses = await Promise.all(logins.map((l) => l.status));
      expect(statuses.filter((s) => s === 401)).toHaveLength(5);
      expect(statuses.filter((s) => s === 429)).toHaveLength(5);
    });
  });
});

describe("behind a trusted reverse proxy (--trusted-proxy)", () => {
  /** A login as a proxy on loopback passes it on for `client`, over `proto` to the proxy. */
  const viaProxy = (url: string, token: string, client: string, proto = "http") =>
    fetch(`${url}/ui/api/login`, {
      method: "POST",
      headers: { "x-forwarded-for": client, "x-forwarded-proto": proto },
      body: JSON.stringify({ token }),
    });
  /** The statuses of six wrong logins, the i-th as `clientOf(i)`. */
  const sixWrong = async (url: string, clientOf: (i: number) => string) => {
    const statuses: number[] = [];
    for (let i = 0; i < 6; i++)
      statuses.push((await viaProxy(url, `wrong-${i}`, clientOf(i))).status);
    return statuses;
  };

  it("throttles failed logins per client behind the proxy, not the proxy's address", async () => {
    await withControlPlane(
      true,
      async (own) => {
        expect(await sixWrong(own.controlUrl, () => "203.0.113.9")).toEqual([
          401, 401, 401, 401, 401, 429,
        ]);
        const refused = await viaProxy(own.controlUrl, own.adminToken, "203.0.113.9");
        expect(await refused.json()).toMatchObject({
          message: expect.stringContaining("too many failed logins from 203.0.113.9"),
        });
        // Another operator behind the same proxy still logs in.
        expect((await viaProxy(own.controlUrl, own.adminToken, "198.51.100.4")).status).toBe(200);
      },
      { trustedProxies: ["127.0.0.1"] },
    );
  });

  it("gives a client whose connection to the proxy was HTTPS a Secure __Host- cookie that works", async () => {
    await withControlPlane(
      true,
      async (own) => {
        const res = await viaProxy(own.controlUrl, own.adminToken, "198.51.100.4", "https");
        expect(res.status).toBe(200);
        const setCookie = res.headers.get("set-cookie") ?? "";
        expect(setCookie).toMatch(/^__Host-llmgw_session=[^;]+; Path=\/; HttpOnly/);
        expect(setCookie).toContain("; Secure");
        const { csrf } = (await res.json()) as { csrf: string };
        const cookie = setCookie.split(";")[0] as string;
        const me = (proto: string) =>
          fetch(`${own.controlUrl}/ui/api/session`, {
            headers: { cookie, "x-llmgw-csrf": csrf, "x-forwarded-proto": proto },
          });
        expect((await me("https")).status).toBe(200);
        // The same cookie over plain HTTP is not the console's: a browser would not send it.
        expect((await me("http")).status).toBe(401);
      },
      { trustedProxies: ["127.0.0.0/8", "::1"] },
    );
  });

  it("ends the plain-HTTP session too when a browser that has both logs out over TLS", async () => {
    await withControlPlane(
      true,
      async (own) => {
        const login = async (proto: string) => {
          const res = await viaProxy(own.controlUrl, own.adminToken, "198.51.100.4", proto);
          const { csrf } = (await res.json()) as { csrf: string };
          return { cookie: (res.headers.get("set-cookie") ?? "").split(";")[0] as string, csrf };
        };
        const plain = await login("http");
        const secure = await login("https");
        const session = (cookie: string, proto: string) =>
          fetch(`${own.controlUrl}/ui/api/session`, {
            headers: { cookie, "x-forwarded-proto": proto },
          });
        expect((await session(plain.cookie, "http")).status).toBe(200);
        // Over TLS the browser sends both: the __Host- one and the one without Secure.
        const out = await fetch(`${own.controlUrl}/ui/api/logout`, {
          method: "POST",
          headers: {
            cookie: `${secure.cookie}; ${plain.cookie}`,
            "x-llmgw-csrf": secure.csrf,
            "x-forwarded-proto": "https",
          },
        });
        expect(out.status).toBe(200);
        expect(out.headers.getSetCookie().map((c) => c.split("=")[0])).toEqual([
          "__Host-llmgw_session",
          "llmgw_session",
        ]);
        expect((await session(secure.cookie, "https")).status).toBe(401);
        expect((await session(plain.cookie, "http")).status).toBe(401);
      },
      { trustedProxies: ["127.0.0.0/8", "::1"] },
    );
  });

  it("believes none of it from a peer that is not a trusted proxy", async () => {
    await withControlPlane(
      true,
      async (own) => {
        // Each try claims another client: the throttle still counts the real peer.
        expect(await sixWrong(own.controlUrl, (i) => `203.0.113.${i}`)).toEqual([
          401, 401, 401, 401, 401, 429,
        ]);
      },
      { trustedProxies: ["10.0.0.0/8"] },
    );
  });

  it("refuses a --trusted-proxy that is not an address or range, naming it", async () => {
    await expect(
      withControlPlane(true, async () => {}, { trustedProxies: ["proxy.internal"] }),
    ).rejects.toMatchObject({
      code: "LLMGW_CONTROL_PLANE_CONFIG_INVALID",
      message: expect.stringContaining(
        'trustedProxies: "proxy.internal" is not an IP address or CIDR range',
      ),
    });
  });
});
