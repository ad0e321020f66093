/**
 * Routers apart from the control plane, all real on loopback: a control plane in a temp data
 * dir, a fake agent reporting a real simulated engine ready, and routers started by THE server
 * factory (`startRouter`) watching `WatchRouting` — through an HTTP proxy where a test must
 * count their attempts or cut their streams. Lives with the CLI because the CLI is the package
 * that depends on both the control plane and the router.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import {
  createServer,
  request as httpRequest,
  type IncomingMessage,
  type Server,
  type ServerResponse,
} from "node:http";
import { request as httpsRequest } from "node:https";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { freePort } from "@llmgw/agent";
import { type ControlPlane, inventoryToProto, startControlPlane } from "@llmgw/control-plane";
import { FakeAgent, hasOpenssl, selfSignedCert } from "@llmgw/control-plane/testing";
import { simulateInventory } from "@llmgw/discovery";
import { type RunningEngineSim, startEngineSim } from "@llmgw/engine-sim";
import { ClusterService, Engine, ReplicaState } from "@llmgw/proto";
import { type RunningRouter, startRouter } from "@llmgw/router-server";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { runCli } from "../src/cli.js";
import type { CliIo } from "../src/command.js";

const MODEL = "chat";
const dirs: string[] = [];
const tempDir = (): string => {
  const d = mkdtempSync(join(tmpdir(), "llmgw-router-remote-"));
  dirs.push(d);
  return d;
};

let dataDir: string;
let controlPort: number;
let cp: ControlPlane;
let sim: RunningEngineSim;
let agent: FakeAgent;
let beating = true;

const startCp = (port = 0) =>
  startControlPlane({
    dataDir,
    listen: "127.0.0.1:0",
    controlListen: `127.0.0.1:${port}`,
    heartbeatIntervalMs: 200,
    shutdownGraceMs: 500,
  });

const admin = () =>
  createClient(
    ClusterService,
    createConnectTransport({
      httpVersion: "1.1",
      baseUrl: cp.controlUrl,
      interceptors: [
        (next) => (req) => {
          req.header.set("authorization", `Bearer ${cp.adminToken}`);
          return next(req);
        },
      ],
    }),
  );

async function waitFor(check: () => boolean | Promise<boolean>, ms: number, what: string) {
  const deadline = performance.now() + ms;
  while (!(await check())) {
    if (performance.now() > deadline)
      throw new Error(`timed out after ${ms}ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

beforeAll(async () => {
  dataDir = tempDir();
  cp = await startCp();
  controlPort = Number(new URL(cp.controlUrl).port);
  sim = await startEngineSim({ model: MODEL, port: 0, warmupSeconds: 0, timeScale: 50 });
  agent = new FakeAgent({
    controlUrl: cp.controlUrl,
    joinToken: cp.joinToken,
    inventory: inventoryToProto(
      simulateInventory("1xh100-80g", { hostname: "node-a", addresses: ["127.0.0.1"] }),
    ),
  });
  agent.defaultReport = { state: ReplicaState.READY, apiPort: sim.port };
  await agent.register();
  void (async () => {
    while (beating) {
      await agent.heartbeat().catch(() => undefined);
      await new Promise((r) => setTimeout(r, 100));
    }
  })();
  await admin().applyDeployment({
    deployment: {
      name: MODEL,
      model: "sim/chat",
      engine: Engine.SIM,
      gpuClass: "h100-80g",
      replicas: 1,
    },
  });
  await waitFor(
    () => cp.cluster.routingMembership().replicas.length === 1,
    10_000,
    "a ready replica",
  );
}, 60_000);

afterAll(async () => {
  beating = false;
  await cp?.close();
  await sim?.close();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** A router watching `controlPlane` with `token`, its events recorded. */
async function router(
  options: {
    controlPlane?: string;
    token?: string;
    routerId?: string;
    stateDir?: string;
    cacheIsolation?: "tenant";
    noAuth?: boolean;
  } = {},
) {
  const events: Record<string, unknown>[] = [];
  const r = await startRouter({
    routing: {
      controlPlanes: [options.controlPlane ?? cp.controlUrl],
      routerToken: options.token ?? cp.routerToken,
      routerId: options.routerId ?? "edge-1",
      address: "10.0.0.9:8080",
      version: "0.1.0",
      stateDir: options.stateDir ?? tempDir(),
      client: { unauthenticatedRetryMs: 200, maxBackoffMs: 500 },
    },
    router: {
      analyzer: { pool: false },
      ...(options.cacheIsolation === undefined ? {} : { cacheIsolation: options.cacheIsolation }),
      ...(options.noAuth === true ? { noAuth: true } : {}),
    },
    log: (event) => events.push({ ...event }),
  });
  cleanups.push(() => r.close(0));
  return { router: r, events };
}

/**
 * An HTTP proxy in front of the control listener that counts WatchRouting calls and can cut
 * every stream it carries (the control plane stays up).
 */
async function proxy(): Promise<{ url: string; watches: () => number; cut: () => void }> {
  let watches = 0;
  const open = new Set<{ destroy(): void }>();
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    if (req.url === "/llmgw.v1.RouterService/WatchRouting") watches += 1;
    const upstream = httpRequest(
      {
        host: "127.0.0.1",
        port: controlPort,
        path: req.url,
        method: req.method,
        headers: req.headers,
      },
      (answer) => {
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(res);
      },
    );
    upstream.on("error", () => res.destroy());
    open.add(upstream);
    open.add(res.socket as unknown as { destroy(): void });
    upstream.on("close", () => open.delete(upstream));
    req.pipe(upstream);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  cleanups.push(
    () =>
      new Promise<void>((r) => {
        server.close(() => r());
        server.closeAllConnections();
      }),
  );
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    watches: () => watches,
    cut: () => {
      for (const s of open) s.destroy();
      open.clear();
    },
  };
}

const chat = (r: RunningRouter, key: string) =>
  fetch(`${r.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({
      model: MODEL,
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 2,
    }),
  });

function capture(env: Record<string, string>) {
  const out: string[] = [];
  const err: string[] = [];
  const io: CliIo = {
    stdout: { write: (c: string) => out.push(c) },
    stderr: { write: (c: string) => err.push(c) },
    env,
    cwd: process.cwd(),
    signal: new AbortController().signal,
  };
  return { io, stdout: () => out.join(""), stderr: () => err.join("") };
}

describe("a router watching a real control plane", () => {
  it("routes by the streamed state, sees a new key and a revoked one within 1 s, and is listed", async () => {
    const { router: r, events } = await router({ cacheIsolation: "tenant" });
    await waitFor(() => r.runtime.readiness().connected, 10_000, "the stream");
    expect(r.runtime.readiness()).toMatchObject({
      ready: true,
      source: "live",
      connected: true,
      controlPlane: cp.controlUrl,
    });
    expect(events.find((e) => e.event === "routing_stream_open")).toMatchObject({
      controlPlane: cp.controlUrl,
    });

    const created = await admin().createApiKey({ name: "team-a" });
    const createdAt = performance.now();
    await waitFor(
      () => r.runtime.state.apiKeys.verify(created.secret) !== undefined,
      5_000,
      "the new key at the router",
    );
    const keyMs = performance.now() - createdAt;
    const res = await chat(r, created.secret);
    expect(res.status).toBe(200);
    expect(res.headers.get("x-llmgw-replica")).toBe(`${MODEL}-0`);
    await res.arrayBuffer();

    await admin().revokeApiKey({ key: created.key?.id ?? "" });
    const revokedAt = performance.now();
    await waitFor(
      () => r.runtime.state.apiKeys.verify(created.secret) === undefined,
      5_000,
      "the revoked key gone at the router",
    );
    const revokeMs = performance.now() - revokedAt;
    expect((await chat(r, created.secret)).status).toBe(401);
    console.log(
      `key reached the router in ${keyMs.toFixed(0)} ms, revocation in ${revokeMs.toFixed(0)} ms`,
    );
    expect(keyMs).toBeLessThan(1_000);
    expect(revokeMs).toBeLessThan(1_000);

    // `llmgw routers`: this one and the control plane's in-process router.
    const env = { LLMGW_CONTROL_PLANE: cp.controlUrl, LLMGW_ADMIN_TOKEN: cp.adminToken };
    const table = capture(env);
    expect(await runCli(["routers"], table.io)).toBe(0);
    const lines = table.stdout().trimEnd().split("\n");
    expect(lines[0]).toMatch(
      /^ROUTER +ADDRESS +LLMGW +STATE +CONNECTED +LAST SEEN +VERSION SENT +STATE AGE +IN-PROCESS +ISOLATION$/,
    );
    expect(lines.find((l) => l.startsWith("edge-1 "))).toMatch(
      /^edge-1 +10\.0\.0\.9:8080 +0\.1\.0 +connected +\d+s ago +now +\d+ +\d+s +no +tenant$/,
    );
    expect(lines.some((l) => / yes +none$/.test(l))).toBe(true);
    // The two keep tenants' caches apart differently: `llmgw status` says so.
    const status = capture(env);
    expect(await runCli(["status"], status.io)).toBe(0);
    expect(status.stdout()).toContain(
      "isolation    routers differ in --cache-isolation (tenant: edge-1; none: in-process)",
    );
    const json = capture(env);
    expect(await runCli(["routers", "--json"], json.io)).toBe(0);
    const listed = JSON.parse(json.stdout()) as { routers: Record<string, unknown>[] };
    expect(listed.routers.find((x) => x.id === "edge-1")).toMatchObject({
      address: "10.0.0.9:8080",
      version: "0.1.0",
      connected: true,
      cacheIsolation: "tenant",
      // This release applies tenants' own isolation; the in-process router too.
      appliesTenantCacheIsolation: true,
    });
    expect(listed.routers.find((x) => x.id === "in-process")).toMatchObject({
      appliesTenantCacheIsolation: true,
    });
  });

  it("names a router that cannot apply a tenant's own cache isolation: one without API keys", async () => {
    const { router: r } = await router({ routerId: "edge-open", noAuth: true });
    await waitFor(() => r.runtime.readiness().connected, 10_000, "the stream");
    await admin().createTenant({ tenant: { name: "private", cacheIsolation: "tenant" } });
    try {
      const env = { LLMGW_CONTROL_PLANE: cp.controlUrl, LLMGW_ADMIN_TOKEN: cp.adminToken };
      const status = capture(env);
      expect(await runCli(["status"], status.io)).toBe(0);
      expect(status.stdout()).toContain(
        "isolation    tenant private asks for cache isolation; router edge-open does not apply it (--no-auth, or a release before it)",
      );
    } finally {
      await admin().deleteTenant({ name: "private" });
    }
  });

  it.each([
    ["the join token", () => cp.joinToken],
    ["the admin token", () => cp.adminToken],
    ["a made-up token", () => "rt-not-the-token"],
  ])(
    "refuses %s, retries every few hundred ms, logs it once and never crashes",
    async (_name, token) => {
      const p = await proxy();
      const { router: r, events } = await router({ controlPlane: p.url, token: token() });
      await waitFor(() => p.watches() >= 3, 5_000, "three refused attempts");
      const refused = events.filter((e) => e.event === "routing_stream_refused");
      expect(refused).toHaveLength(1);
      expect(refused[0]).toMatchObject({
        code: "LLMGW_ROUTER_UNAUTHENTICATED",
        controlPlane: p.url,
        message: expect.stringContaining("'llmgw control-plane token --router'"),
      });
      expect(JSON.stringify(events)).not.toContain(token());
      expect(r.runtime.readiness()).toMatchObject({ ready: false, connected: false });
      expect((await fetch(`${r.url}/readyz`)).status).toBe(503);
      expect((await fetch(`${r.url}/healthz`)).status).toBe(200);
    },
  );

  it("opens a new stream, from a snapshot, when one is cut", async () => {
    const p = await proxy();
    const { router: r, events } = await router({ controlPlane: p.url, routerId: "edge-cut" });
    await waitFor(() => r.runtime.readiness().connected, 10_000, "the first stream");
    p.cut();
    const cutAt = performance.now();
    await waitFor(
      () => events.filter((e) => e.event === "routing_stream_open").length === 2,
      5_000,
      "a second stream",
    );
    const reconnectMs = performance.now() - cutAt;
    console.log(`stream cut → new stream with a snapshot in ${reconnectMs.toFixed(0)} ms`);
    expect(events.find((e) => e.event === "routing_stream_lost")).toMatchObject({
      code: "LLMGW_ROUTER_CONTROL_PLANE_UNREACHABLE",
    });
    expect(p.watches()).toBe(2);
    expect(r.runtime.readiness()).toMatchObject({ ready: true, connected: true, source: "live" });
    expect(reconnectMs).toBeLessThan(2_500);
  });
});

describe("two routers with one id", () => {
  it("each hears from the real control plane that the other took its stream over", async () => {
    const a = await router({ routerId: "edge-twin" });
    const b = await router({ routerId: "edge-twin" });
    await waitFor(
      () => [a, b].every(({ events }) => events.some((e) => e.event === "routing_stream_replaced")),
      10_000,
      "both twins to be told they were replaced",
    );
    for (const { events } of [a, b]) {
      expect(events.find((e) => e.event === "routing_stream_replaced")).toMatchObject({
        code: "LLMGW_CONTROL_PLANE_ROUTER_REPLACED",
        routerId: "edge-twin",
      });
    }
  });
});

describe("a router while its control plane is down", () => {
  it("keeps serving, restarts from its saved state, and finds the restarted control plane", async () => {
    const key = await admin().createApiKey({ name: "outage" });
    const stateDir = tempDir();
    const first = await router({ routerId: "edge-outage", stateDir });
    await waitFor(
      () => first.router.runtime.state.apiKeys.verify(key.secret) !== undefined,
      5_000,
      "the key at the router",
    );
    const epochBefore = first.router.runtime.readiness().epoch;
    await cp.close();
    await waitFor(() => !first.router.runtime.readiness().connected, 10_000, "the stream to end");
    // Nobody answers on the control port: still serving.
    const during = await chat(first.router, key.secret);
    expect(during.status).toBe(200);
    await during.arrayBuffer();

    // Restarted while the control plane is down: serves from its saved state at once.
    await first.router.close(0);
    const second = await router({ routerId: "edge-outage", stateDir });
    expect(second.router.runtime.readiness()).toMatchObject({ ready: true, source: "saved" });
    const afterRestart = await chat(second.router, key.secret);
    expect(afterRestart.status).toBe(200);
    await afterRestart.arrayBuffer();

    // The control plane comes back on the same port: the router finds it within ~2 s.
    cp = await startCp(controlPort);
    const upAt = performance.now();
    await waitFor(
      () => second.router.runtime.readiness().source === "live",
      10_000,
      "a snapshot from the restarted control plane",
    );
    const foundMs = performance.now() - upAt;
    console.log(`restarted control plane found in ${foundMs.toFixed(0)} ms`);
    expect(second.router.runtime.readiness().epoch).not.toBe(epochBefore);
    expect(foundMs).toBeLessThan(3_000);
    const live = await chat(second.router, key.secret);
    expect(live.status).toBe(200);
    await live.arrayBuffer();
  }, 60_000);
});

/** GET over HTTPS trusting `ca`: status and body. */
function httpsGet(url: string, ca: Buffer): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    httpsRequest(url, { ca }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (c: string) => {
        body += c;
      });
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
    })
      .on("error", reject)
      .end();
  });
}

describe.skipIf(!hasOpenssl())("llmgw router with TLS on both sides", () => {
  it("trusts a control plane's certificate with --control-plane-ca and serves HTTPS itself", async () => {
    const dir = tempDir();
    const { cert, key } = selfSignedCert(dir);
    const tlsCp = await startControlPlane({
      dataDir: join(dir, "data"),
      listen: "127.0.0.1:0",
      controlListen: "127.0.0.1:0",
      tlsCertFile: cert,
      tlsKeyFile: key,
      publicApi: false,
    });
    cleanups.push(() => tlsCp.close().then(() => {}));
    const tokenFile = join(dir, "router-token");
    writeFileSync(tokenFile, `${tlsCp.routerToken}\n`, { mode: 0o600 });

    /** Runs `llmgw router` until the returned stop is called; its stderr so far. */
    const launch = (extra: string[]) => {
      const controller = new AbortController();
      const err: string[] = [];
      const io: CliIo = {
        stdout: { write: () => true },
        stderr: { write: (c: string) => err.push(c) },
        env: {},
        cwd: process.cwd(),
        signal: controller.signal,
      };
      const done = runCli(
        [
          "router",
          "--control-plane",
          tlsCp.controlUrl,
          "--router-token-file",
          tokenFile,
          "--state-dir",
          join(dir, `state-${extra.length}`),
          "--listen",
          "127.0.0.1:0",
          "--metrics-listen",
          "off",
          ...extra,
        ],
        io,
      );
      return {
        stderr: () => err.join(""),
        stop: async () => {
          controller.abort(new Error("test over"));
          return done;
        },
      };
    };

    // Without the CA the control plane's self-signed certificate is refused: not ready, said why.
    const untrusting = launch([]);
    await waitFor(
      () =>
        /routing_stream_failed \[LLMGW_ROUTER_CONTROL_PLANE_UNREACHABLE\]/.test(
          untrusting.stderr(),
        ),
      10_000,
      "the refused certificate in the log",
    );
    expect(untrusting.stderr()).toMatch(/SELF_SIGNED|self.signed|UNABLE_TO_VERIFY/i);
    expect(await untrusting.stop()).toBe(0);

    const trusting = launch(["--control-plane-ca", cert, "--tls-cert", cert, "--tls-key", key]);
    await waitFor(() => /listening public=https:/.test(trusting.stderr()), 10_000, "the listener");
    const url = /listening public=(https:\/\/\S+)/.exec(trusting.stderr())?.[1] as string;
    await waitFor(
      async () => (await httpsGet(`${url}/readyz`, readFileSync(cert))).status === 200,
      10_000,
      "a ready router over TLS",
    );
    const ready = JSON.parse((await httpsGet(`${url}/readyz`, readFileSync(cert))).body);
    expect(ready).toMatchObject({ ready: true, source: "live", connected: true });
    expect(await trusting.stop()).toBe(0);
    expect(trusting.stderr()).toMatch(/router stopped durationMs=\d+ forced=false/);
    expect(trusting.stderr()).not.toContain(tlsCp.routerToken);
  }, 60_000);
});

describe.skipIf(!hasOpenssl())("routers that serve HTTPS as each other's peers", () => {
  it("trust each other's certificate with the peer CA, and refuse it without, saying why", async () => {
    const dir = tempDir();
    const { cert, key } = selfSignedCert(dir);
    const tls = { cert: readFileSync(cert), key: readFileSync(key) };
    const ports = await Promise.all([0, 1].map(() => freePort()));
    const start = async (i: number, ca: Buffer | undefined) => {
      const events: Record<string, unknown>[] = [];
      const r = await startRouter({
        routing: {
          controlPlanes: [cp.controlUrl],
          routerToken: cp.routerToken,
          routerId: `tls-peer-${i}`,
          address: `127.0.0.1:${ports[i]}`,
          version: "0.1.0",
          stateDir: tempDir(),
        },
        router: { analyzer: { pool: false } },
        listener: { tls },
        listen: `127.0.0.1:${ports[i]}`,
        peers: {
          urls: [`https://127.0.0.1:${ports[1 - i]}`],
          key: "tls-peer-key-0123456789",
          ...(ca === undefined ? {} : { ca }),
        },
        log: (event) => events.push({ ...event }),
      });
      cleanups.push(() => r.close(0));
      return { r, events };
    };
    const connected = async (r: RunningRouter) =>
      (await r.registry.getSingleMetric("llmgw_router_peers_connected")?.get())?.values[0]?.value;
    // Router 0 does not trust router 1's certificate; router 1 trusts router 0's.
    const [a, b] = [await start(0, undefined), await start(1, tls.cert)];
    await waitFor(
      async () => (await connected(b.r)) === 1,
      10_000,
      "router 1's stream to router 0",
    );
    await waitFor(
      () => a.events.some((e) => e.event === "peer_down" && /self.signed/i.test(String(e.reason))),
      10_000,
      "router 0's refusal of the certificate in its log",
    );
    expect(await connected(a.r)).toBe(0);
  });
});
