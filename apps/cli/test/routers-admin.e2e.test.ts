/**
 * The data plane apart, end to end (issue 17's acceptance tests, part 2: what routers learn
 * and how they share): a real control plane with `--no-public-api`, two real agents on
 * simulated nodes, two real `llmgw router` processes (and a third one for the credential and
 * state-file cases). One cluster is shared by the steps below, in order.
 */
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, writeFileSync } from "node:fs";
import path from "node:path";
import { create } from "@bufbuild/protobuf";
import { DeploymentSchema, Engine, RoutingPolicy } from "@llmgw/proto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  allReady,
  deployment,
  freePort,
  metricSamples,
  RouterProc,
  type RoutersCluster,
  runLlmgw,
  startRoutersCluster,
  stopAll,
  tempRoot,
  waitFor,
} from "./cluster-harness.js";

const root = tempRoot("llmgw-routers-admin-e2e-");
let c: RoutersCluster;

const sim = (name: string, fields: Record<string, unknown> = {}) =>
  create(DeploymentSchema, {
    name,
    model: `sim/${name}`,
    engine: Engine.SIM,
    gpuClass: "h100-80g",
    replicas: 1,
    ...fields,
  });

/** POST /v1/chat/completions through `r`: status and body. */
async function chat(
  r: RouterProc,
  model: string,
  key: string,
  maxTokens = 4,
): Promise<{ status: number; body: string }> {
  const res = await fetch(`${r.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({
      model,
      max_tokens: maxTokens,
      messages: [{ role: "user", content: "hello" }],
    }),
  });
  return { status: res.status, body: await res.text() };
}

/** GET /v1/models through `r` with `key`: its status. */
async function models(r: RouterProc, key: string): Promise<number> {
  const res = await fetch(`${r.url}/v1/models`, { headers: { authorization: `Bearer ${key}` } });
  await res.arrayBuffer();
  return res.status;
}

/**
 * From now, how long until `probe` says each router answers differently (polled back to
 * back, every router at once); ms per router.
 */
async function timeUntil(
  routers: readonly RouterProc[],
  changed: (r: RouterProc) => Promise<boolean>,
  timeoutMs = 10_000,
): Promise<number[]> {
  const t0 = performance.now();
  return Promise.all(
    routers.map(async (r) => {
      for (;;) {
        if (await changed(r)) return performance.now() - t0;
        if (performance.now() - t0 > timeoutMs)
          throw new Error(`${r.id} did not change within ${timeoutMs} ms`);
        await new Promise((done) => setTimeout(done, 5));
      }
    }),
  );
}

/** `llmgw routers --json` run as a real process: the routers the control plane lists. */
async function listRouters(): Promise<{ id: string; connected?: boolean; address?: string }[]> {
  const proc = runLlmgw(["routers", "--json"], {
    LLMGW_CONTROL_PLANE: c.cp.controlUrl,
    LLMGW_ADMIN_TOKEN: c.cp.token("admin"),
  });
  const code = await proc.exited;
  if (code !== 0) throw new Error(`llmgw routers exited ${code}:\n${proc.output()}`);
  return (
    (JSON.parse(proc.output()) as { routers?: { id: string; connected?: boolean }[] }).routers ?? []
  );
}

/** `llmgw_router_routers`: the router count a router last heard from the control plane. */
async function routerCount(r: RouterProc): Promise<number | undefined> {
  return metricSamples(await r.metrics(), "llmgw_router_routers")[0]?.value;
}

beforeAll(async () => {
  c = await startRoutersCluster(root);
  await c.cp
    .admin()
    .applyDeployment(
      { deployment: sim("chat", { routingPolicy: RoutingPolicy.ROUND_ROBIN }) },
      c.cp.adminHeaders(),
    );
  await waitFor(
    "chat to be ready",
    async () => allReady(await deployment(c.cp, "chat"), 1) || undefined,
    90_000,
  );
  await waitFor(
    "both routers to serve chat",
    async () => {
      const answers = await Promise.all(c.routers.map((r) => chat(r, "chat", c.apiKey)));
      return answers.every((a) => a.status === 200) || undefined;
    },
    30_000,
    50,
  );
}, 180_000);

afterAll(async () => {
  await stopAll([root]);
});

/** A third router, on its own ports and state dir. */
async function thirdRouter(options: RouterProc["options"] = {}): Promise<RouterProc> {
  return new RouterProc(root, "router-3", c.cp, await freePort(), await freePort(), options);
}

describe("routers and the admin API", { timeout: 120_000 }, () => {
  it("a new deployment and a revoked key reach both routers within 1 s of the admin call", async () => {
    for (const r of c.routers) expect((await chat(r, "late", c.apiKey)).status).toBe(404);
    await c.cp.admin().applyDeployment({ deployment: sim("late") }, c.cp.adminHeaders());
    // Known now (loading: 503, then served): anything but "no such model".
    const deployMs = await timeUntil(
      c.routers,
      async (r) => (await chat(r, "late", c.apiKey)).status !== 404,
    );

    const second = await c.cp.admin().createApiKey({ name: "revoked-soon" }, c.cp.adminHeaders());
    const keyMs = await timeUntil(c.routers, async (r) => (await models(r, second.secret)) === 200);
    await c.cp.admin().revokeApiKey({ key: "revoked-soon" }, c.cp.adminHeaders());
    const revokeMs = await timeUntil(
      c.routers,
      async (r) => (await models(r, second.secret)) === 401,
    );
    console.info(
      `reached both routers after the admin call: deployment ${deployMs.map(Math.round).join("/")} ms, new key ${keyMs.map(Math.round).join("/")} ms, revocation ${revokeMs.map(Math.round).join("/")} ms`,
    );
    for (const ms of [...deployMs, ...keyMs, ...revokeMs]) expect(ms).toBeLessThanOrEqual(1_000);
    // The revoked key stays refused for chat too, and the other key is untouched.
    for (const r of c.routers) {
      expect((await chat(r, "chat", second.secret)).status).toBe(401);
      expect((await chat(r, "chat", c.apiKey)).status).toBe(200);
    }
    await waitFor(
      "both routers to serve the new deployment",
      async () => {
        const answers = await Promise.all(c.routers.map((r) => chat(r, "late", c.apiKey)));
        return answers.every((a) => a.status === 200) || undefined;
      },
      60_000,
      100,
    );
  });

  it("a wrong router credential: not ready, LLMGW_ROUTER_UNAUTHENTICATED logged, no crash; the right one: ready", async () => {
    const right = c.cp.token("router");
    const wrong = `${right.slice(0, right.length - 43)}${randomBytes(32).toString("base64url")}`;
    expect(wrong).not.toBe(right);
    const r = await thirdRouter({ token: wrong });
    await r.start({ ready: false });
    await waitFor(
      "the refusal in the router's log",
      () => r.output().includes("LLMGW_ROUTER_UNAUTHENTICATED") || undefined,
      15_000,
      50,
    );
    const refused = await r.readiness();
    expect(refused.status).toBe(503);
    expect(refused.body).toMatchObject({ status: "not_ready", ready: false, source: "none" });
    // Nothing to route by, no key known either: "not ready", never "your key is wrong".
    const notReady = await chat(r, "chat", c.apiKey);
    expect(notReady.status).toBe(503);
    expect(notReady.body).toContain("router_not_ready");
    expect(r.running).toBe(true);
    expect(r.output()).not.toContain(wrong);
    expect(r.output()).not.toContain(right);
    expect(await r.stop()).toBe(0);

    r.options = {};
    await r.start();
    expect((await r.readiness()).body).toMatchObject({ source: "live", connected: true });
    expect((await chat(r, "chat", c.apiKey)).status).toBe(200);
    expect(r.output()).not.toContain(right);
    expect(await r.stop()).toBe(0);
  });

  it("a corrupt saved state: a clear error in the log, a fresh sync, ready, no crash", async () => {
    const stateDir = path.join(root, "corrupt-state");
    const r = await thirdRouter({ tokenVia: "env", stateDir });
    mkdirSync(stateDir, { recursive: true, mode: 0o700 });
    writeFileSync(path.join(stateDir, "routing-state.json"), '{"format": not json at all\n', {
      mode: 0o600,
    });
    await r.start();
    expect(r.output()).toContain("LLMGW_ROUTER_STATE_CORRUPT");
    expect(r.output()).toContain(path.join(stateDir, "routing-state.json"));
    expect(existsSync(path.join(stateDir, "routing-state.json.corrupt"))).toBe(true);
    expect((await r.readiness()).body).toMatchObject({ ready: true, source: "live" });
    expect((await chat(r, "chat", c.apiKey)).status).toBe(200);
    expect(r.running).toBe(true);
    expect(await r.stop()).toBe(0);
  });

  it("admission across routers: never more than a replica's capacity in flight at its engine, under a burst of 6× it through two routers", {
    timeout: 180_000,
  }, async () => {
    const capacity = 4;
    await c.cp.admin().applyDeployment(
      {
        deployment: sim("admit", {
          maxConcurrencyPerReplica: capacity,
          // About 1.2 s per answer of 20 tokens, so the burst keeps the replica full for a while.
          extraArgs: ["--decode-step-ms", "60", "--min-output-tokens", "20"],
        }),
      },
      c.cp.adminHeaders(),
    );
    const d = await waitFor(
      "admit to be ready",
      async () => {
        const dep = await deployment(c.cp, "admit");
        return allReady(dep, 1) ? dep : undefined;
      },
      90_000,
    );
    const port = d.replicas[0]?.ranks[0]?.status?.apiPort;
    expect(port).toBeGreaterThan(0);
    await waitFor(
      "both routers to serve admit, each counting two routers",
      async () => {
        for (const r of c.routers) {
          if ((await routerCount(r)) !== 2) return undefined;
          if ((await chat(r, "admit", c.apiKey, 1)).status !== 200) return undefined;
        }
        return true;
      },
      30_000,
      100,
    );

    let sampling = true;
    let peak = 0;
    let samples = 0;
    const sampler = (async () => {
      while (sampling) {
        const res = await fetch(`http://127.0.0.1:${port}/sim/stats`);
        const stats = (await res.json()) as { activeRequests: number };
        peak = Math.max(peak, stats.activeRequests);
        samples += 1;
        await new Promise((done) => setTimeout(done, 10));
      }
    })();
    const perRouter = 3 * capacity;
    const started = performance.now();
    const answers = await Promise.all(
      c.routers.flatMap((r) =>
        Array.from({ length: perRouter }, () => chat(r, "admit", c.apiKey, 20)),
      ),
    );
    const burstMs = performance.now() - started;
    sampling = false;
    await sampler;
    console.info(
      `admission: ${answers.length} requests through 2 routers, capacity ${capacity}: peak ${peak} in flight at the engine (${samples} samples over ${Math.round(burstMs)} ms)`,
    );
    expect(answers.map((a) => a.status)).toEqual(answers.map(() => 200));
    expect(peak).toBeLessThanOrEqual(capacity);
    // Both routers had their share in flight at once (one router alone admits capacity / 2).
    expect(peak).toBeGreaterThan(capacity / 2);
  });

  it("llmgw routers lists both routers connected, then one disconnected after it stops", async () => {
    const [one, two] = c.routers as [RouterProc, RouterProc];
    const listed = await waitFor("both routers listed as connected", async () => {
      const rows = await listRouters();
      const mine = rows.filter((row) => row.id === one.id || row.id === two.id);
      return mine.length === 2 && mine.every((row) => row.connected === true) ? rows : undefined;
    });
    expect(listed.find((row) => row.id === one.id)?.address).toBe(`127.0.0.1:${one.port}`);
    expect(await two.stop()).toBe(0);
    await waitFor("router-2 listed as disconnected", async () => {
      const rows = await listRouters();
      const a = rows.find((row) => row.id === one.id);
      const b = rows.find((row) => row.id === two.id);
      return a?.connected === true && b !== undefined && b.connected !== true ? true : undefined;
    });
    await two.start();
  });
});
