/**
 * THE router server over the routing runtime, fed the way the control plane feeds its
 * in-process router: readiness before and after the first snapshot, the saved state a restarted
 * router serves from, a corrupt state file and one it cannot read, the state gauges, resyncs,
 * and a graceful stop.
 */
import {
  existsSync,
  lstatSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { RoutingDelta, RoutingFeed } from "@llmgw/router";
import { createManualRoutingFeed } from "@llmgw/router/testing";
import { Registry } from "prom-client";
import { afterEach, describe, expect, it } from "vitest";
import {
  CORRUPT_ROUTING_STATE_FILE,
  ROUTING_STATE_FILE,
  type RunningRouter,
  startRouter,
} from "../src/index.js";
import { type FakeEngine, startFakeEngine, waitFor } from "./router-fake-engine.js";
import { routingSnapshot, startFedRouter } from "./routing-fixture.js";

const KEY = "sk-runtime";
const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function engine(name: string, options: { gated?: boolean } = {}): Promise<FakeEngine> {
  const e = await startFakeEngine({ name, ...options });
  cleanups.push(() => e.close());
  return e;
}

function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "llmgw-router-runtime-"));
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

async function fed(options: Parameters<typeof startFedRouter>[0] = {}) {
  const started = await startFedRouter({ router: { analyzer: { pool: false } }, ...options });
  cleanups.push(() => started.router.close(0));
  return started;
}

const snapshotOver = (e: FakeEngine, extra: { routers?: number; version?: number } = {}) =>
  routingSnapshot({
    models: { m: { replicas: [{ id: "m-0", baseUrl: e.url, capacity: 4 }] } },
    keys: { [KEY]: { id: "k", name: "k", rpm: 90 } },
    ...extra,
  });

const delta = (version: number, change: Partial<RoutingDelta> = {}): RoutingDelta => ({
  kind: "delta",
  epoch: "epoch-test",
  version,
  upsertedModels: [],
  removedModels: [],
  upsertedReplicas: [],
  removedReplicas: [],
  upsertedKeys: [],
  removedKeys: [],
  sentAtMs: Date.now(),
  ...change,
});

const chat = (router: RunningRouter, content = "hi") =>
  fetch(`${router.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "m", messages: [{ role: "user", content }] }),
  });

const readyz = async (router: RunningRouter) => {
  const res = await fetch(`${router.url}/readyz`);
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
};

const gauge = async (registry: Registry, name: string): Promise<number | undefined> => {
  const line = (await registry.metrics()).split("\n").find((l) => l.startsWith(`${name} `));
  return line === undefined ? undefined : Number(line.slice(name.length + 1));
};

describe("readiness", () => {
  it("is 503 until the first snapshot, 200 after; /healthz is 200 throughout", async () => {
    const e = await engine("e");
    const { router, feed } = await fed();
    // The public listener says only what a load balancer needs (the detail is on the metrics
    // listener: router-readyz.int.test.ts).
    expect(await readyz(router)).toEqual({
      status: 503,
      body: { status: "not_ready", ready: false, source: "none", connected: true },
    });
    expect((await fetch(`${router.url}/healthz`)).status).toBe(200);
    // Nothing to route by yet: not "your key is wrong" but "not ready", with a retry hint.
    const early = await chat(router);
    expect(early.status).toBe(503);
    expect(early.headers.get("retry-after")).toBe("1");
    expect(((await early.json()) as { error: { code: string } }).error.code).toBe(
      "router_not_ready",
    );

    feed.push(snapshotOver(e));
    const after = await readyz(router);
    expect(after).toEqual({
      status: 200,
      body: {
        status: "ready",
        ready: true,
        source: "live",
        stateAgeMs: expect.any(Number),
        connected: true,
      },
    });
    expect(after.body.stateAgeMs).toBeGreaterThanOrEqual(0);
    expect(after.body.stateAgeMs).toBeLessThan(5_000);
    const res = await chat(router);
    expect(res.status).toBe(200);
    await res.arrayBuffer();
  });

  it("exposes the state age, version, connection and router count as gauges", async () => {
    const e = await engine("e");
    const registry = new Registry();
    const { router, feed } = await fed({ registry });
    expect(await gauge(registry, "llmgw_router_state_age_seconds")).toBeUndefined();
    expect(await gauge(registry, "llmgw_router_state_version")).toBe(0);
    expect(await gauge(registry, "llmgw_router_control_plane_connected")).toBe(1);
    feed.push(snapshotOver(e));
    feed.push(delta(2, { routers: 3 }));
    expect(await gauge(registry, "llmgw_router_state_age_seconds")).toBeLessThan(5);
    expect(await gauge(registry, "llmgw_router_state_version")).toBe(2);
    expect(await gauge(registry, "llmgw_router_routers")).toBe(3);
    expect(await gauge(registry, "llmgw_router_cache_isolation")).toBe(0);
    // No --max-state-age: never stale, and no series says otherwise.
    expect(await gauge(registry, "llmgw_router_state_stale")).toBeUndefined();
    const isolating = new Registry();
    await fed({
      registry: isolating,
      router: { analyzer: { pool: false }, cacheIsolation: "key" },
    });
    expect(await gauge(isolating, "llmgw_router_cache_isolation")).toBe(1);
    // The router families share the registry.
    await (await chat(router)).arrayBuffer();
    expect(await registry.metrics()).toContain(
      'llmgw_router_requests_total{model="m",endpoint="chat_completions",code="200"} 1',
    );
    await router.close(0);
    expect(await gauge(registry, "llmgw_router_control_plane_connected")).toBe(0);
  });
});

describe("versions", () => {
  it("ignores duplicate and old deltas", async () => {
    const a = await engine("a");
    const b = await engine("b");
    const { router, feed } = await fed();
    feed.push(snapshotOver(a));
    const replicaB = {
      id: "m-1",
      model: "m",
      deployment: "m",
      baseUrl: b.url,
      state: "ready" as const,
      capacity: 4,
    };
    feed.push(delta(2, { upsertedReplicas: [replicaB] }));
    expect(router.runtime.state.version).toBe(2);
    // Version 2 again (with another change) and version 1: both ignored.
    feed.push(delta(2, { removedReplicas: ["m-0"] }));
    feed.push(delta(1, { removedReplicas: ["m-0"] }));
    expect(router.runtime.state.version).toBe(2);
    expect(router.runtime.state.routeTable.resolve("m")?.replicas.map((r) => r.id)).toEqual([
      "m-0",
      "m-1",
    ]);
  });

  it("resubscribes for a snapshot when it misses a delta, and gets what it missed", async () => {
    const a = await engine("a");
    const b = await engine("b");
    // A feed that loses delta 3 on its first subscription only, the way a stream cut mid-delta
    // would: the router sees 2 then 4, a gap.
    const inner = createManualRoutingFeed();
    let subscriptions = 0;
    const lossy: RoutingFeed = {
      subscribe(listener) {
        subscriptions += 1;
        const first = subscriptions === 1;
        return inner.subscribe((m) => {
          if (first && m.kind === "delta" && m.version === 3) return;
          listener(m);
        });
      },
    };
    inner.push(snapshotOver(a));
    const router = await startRouter({ routing: { feed: lossy, routerId: "lossy" } });
    cleanups.push(() => router.close(0));
    const replicaB = {
      id: "m-1",
      model: "m",
      deployment: "m",
      baseUrl: b.url,
      state: "ready" as const,
      capacity: 4,
    };
    inner.push(delta(2, { upsertedReplicas: [replicaB] }));
    inner.push(delta(3, { removedReplicas: ["m-0"] }));
    expect(router.runtime.state.version).toBe(2);
    inner.push(delta(4, { routers: 2 }));
    await waitFor(() => router.runtime.state.version === 4, 5000, "a resync to version 4");
    expect(subscriptions).toBe(2);
    expect(inner.subscribers).toBe(1);
    // What delta 3 said arrived with the snapshot.
    expect(router.runtime.state.routeTable.resolve("m")?.replicas.map((r) => r.id)).toEqual([
      "m-1",
    ]);
    expect(router.runtime.state.routers).toBe(2);
  });
});

describe("saved state", () => {
  it("lets a router restarted without any control plane serve at once", async () => {
    const e = await engine("e");
    const dir = join(tempDir(), "router");
    const first = await fed({ stateDir: dir, snapshot: snapshotOver(e) });
    await waitFor(
      () => existsSync(join(dir, ROUTING_STATE_FILE)),
      5000,
      "the state file to be written",
    );
    expect(statSync(dir).mode & 0o777).toBe(0o700);
    expect(statSync(join(dir, ROUTING_STATE_FILE)).mode & 0o777).toBe(0o600);
    // The engine key travels in the file: owner-only, as checked above.
    await first.router.close(0);

    // A new router on the same dir, and a feed that never says anything (no control plane).
    const second = await fed({ stateDir: dir });
    const ready = await readyz(second.router);
    expect(ready).toMatchObject({ status: 200, body: { ready: true, source: "saved" } });
    expect(second.router.runtime.readiness()).toMatchObject({ epoch: "epoch-test", version: 1 });
    const res = await chat(second.router, "after a restart");
    expect(res.status).toBe(200);
    expect(res.headers.get("x-llmgw-replica")).toBe("m-0");
    await res.arrayBuffer();
    expect(e.received.at(-1)?.body.messages).toEqual([
      { role: "user", content: "after a restart" },
    ]);
    // The first live snapshot replaces the saved state.
    second.feed.push(snapshotOver(e, { version: 5 }));
    expect(second.router.runtime.readiness()).toMatchObject({ source: "live", version: 5 });
  });

  it("refuses requests and fails /readyz past --max-state-age, until a control plane is heard", async () => {
    const e = await engine("e");
    const dir = join(tempDir(), "router");
    const first = await fed({ stateDir: dir, snapshot: snapshotOver(e) });
    await waitFor(() => existsSync(join(dir, ROUTING_STATE_FILE)), 5000, "the state file");
    await first.router.close(0);

    // Restarted two minutes later (as its clock reads), allowed one minute without a control
    // plane: the keys it saved may have been revoked since.
    let skewMs = 120_000;
    const feed = createManualRoutingFeed();
    const events: Record<string, unknown>[] = [];
    const registry = new Registry();
    const second = await startRouter({
      registry,
      routing: {
        feed,
        routerId: "stale",
        stateDir: dir,
        maxStateAgeMs: 60_000,
        now: () => Date.now() + skewMs,
        log: (event) => events.push({ ...event }),
      },
      router: { analyzer: { pool: false } },
    });
    cleanups.push(() => second.close(0));
    const ready = await readyz(second);
    expect(ready.status).toBe(503);
    expect(ready.body).toMatchObject({ ready: false, stale: true, source: "saved" });
    expect(await gauge(registry, "llmgw_router_state_stale")).toBe(1);
    const refused = await chat(second, "revoked since?");
    expect(refused.status).toBe(503);
    expect(refused.headers.get("retry-after")).toBe("5");
    expect(((await refused.json()) as { error: { code: string } }).error.code).toBe(
      "router_state_stale",
    );
    expect(e.received.map((r) => r.body.messages)).not.toContainEqual([
      { role: "user", content: "revoked since?" },
    ]);
    // The operator's log says so, once.
    await waitFor(
      () => events.some((x) => x.event === "routing_state_stale"),
      5000,
      "the stale event",
    );
    expect(events.find((x) => x.event === "routing_state_stale")).toMatchObject({
      code: "LLMGW_ROUTER_STATE_STALE",
      maxStateAgeMs: 60_000,
    });
    // A control plane is heard again: it serves, and says so.
    feed.push(snapshotOver(e, { version: 2 }));
    expect((await readyz(second)).status).toBe(200);
    expect(await gauge(registry, "llmgw_router_state_stale")).toBe(0);
    const served = await chat(second, "after");
    expect(served.status).toBe(200);
    await served.arrayBuffer();
    await waitFor(
      () => events.some((x) => x.event === "routing_state_fresh"),
      5000,
      "the fresh event",
    );
    // A control plane that announces keepalives 60 s apart: a quiet stream is fresh for three
    // of them, whatever the shorter limit.
    const keepalive = { kind: "keepalive" as const, epoch: "epoch-test", version: 2 };
    feed.push({ ...keepalive, sentAtMs: Date.now(), intervalMs: 60_000 });
    skewMs += 150_000;
    expect((await readyz(second)).status).toBe(200);
    // Past three intervals without a message, it refuses again.
    skewMs += 31_000;
    expect((await chat(second, "later")).status).toBe(503);
    // A heard time far ahead of the clock (a host whose clock went back) is not trusted.
    feed.push({ ...keepalive, sentAtMs: Date.now(), intervalMs: 2_000 });
    expect((await readyz(second)).status).toBe(200);
    skewMs -= 120_000;
    expect((await readyz(second)).body).toMatchObject({ stale: true });
  });

  it("saves a membership change within about a second, and on close", async () => {
    const a = await engine("a");
    const dir = tempDir();
    const { router, feed } = await fed({ stateDir: dir, snapshot: snapshotOver(a) });
    const saved = () =>
      existsSync(join(dir, ROUTING_STATE_FILE))
        ? (JSON.parse(readFileSync(join(dir, ROUTING_STATE_FILE), "utf8")) as {
            snapshot: { version: string };
          })
        : undefined;
    await waitFor(() => saved()?.snapshot.version === "1", 5000, "version 1 saved");
    const changed = performance.now();
    feed.push(delta(2, { removedKeys: ["k"] }));
    feed.push(delta(3, { routers: 2 }));
    await waitFor(() => saved()?.snapshot.version === "3", 5000, "version 3 saved");
    expect(performance.now() - changed).toBeLessThan(2_500);
    feed.push(delta(4, { routers: 3 }));
    await router.close(0);
    expect(saved()?.snapshot.version).toBe("4");
  });

  it("moves a corrupt state file aside, says so, and syncs afresh", async () => {
    const e = await engine("e");
    const dir = tempDir();
    writeFileSync(join(dir, ROUTING_STATE_FILE), '{"format":"llmgw.routing-state.v1","sav');
    const events: Readonly<Record<string, unknown>>[] = [];
    const { router, feed } = await fed({ stateDir: dir, log: (event) => events.push(event) });
    expect(events.find((ev) => ev.event === "routing_state_corrupt")).toEqual({
      event: "routing_state_corrupt",
      code: "LLMGW_ROUTER_STATE_CORRUPT",
      file: join(dir, ROUTING_STATE_FILE),
      message: expect.stringMatching(
        new RegExp(
          `^${join(dir, ROUTING_STATE_FILE)}: it is not JSON \\(a syntax error at position 39\\); moved aside to ${join(dir, CORRUPT_ROUTING_STATE_FILE)}, not ready until a control plane sends a snapshot$`,
        ),
      ),
    });
    expect(readdirSync(dir)).toEqual([CORRUPT_ROUTING_STATE_FILE]);
    expect((await readyz(router)).status).toBe(503);
    feed.push(snapshotOver(e));
    expect((await readyz(router)).status).toBe(200);
    await waitFor(() => existsSync(join(dir, ROUTING_STATE_FILE)), 5000, "a fresh state file");
  });

  it("leaves a state file it cannot read in place, says so, and replaces it after a snapshot", async () => {
    const e = await engine("e");
    const dir = tempDir();
    const file = join(dir, ROUTING_STATE_FILE);
    // A symlink to itself: open fails (ELOOP) the way EACCES, EMFILE or EIO would, even as
    // root. Such a failure says nothing about the content: nothing is moved aside.
    symlinkSync(ROUTING_STATE_FILE, file);
    const events: Readonly<Record<string, unknown>>[] = [];
    const { router, feed } = await fed({ stateDir: dir, log: (event) => events.push(event) });
    expect(events.filter((ev) => String(ev.event).startsWith("routing_state_"))).toEqual([
      {
        event: "routing_state_unreadable",
        code: "LLMGW_ROUTER_STATE_FAILED",
        file,
        message: `cannot open ${file}: ELOOP; left in place, not ready until a control plane sends a snapshot`,
      },
    ]);
    expect(readdirSync(dir)).toEqual([ROUTING_STATE_FILE]);
    expect(lstatSync(file).isSymbolicLink()).toBe(true);
    expect((await readyz(router)).status).toBe(503);
    // The first save after a live snapshot replaces it with a good file.
    feed.push(snapshotOver(e));
    expect((await readyz(router)).status).toBe(200);
    await waitFor(() => lstatSync(file).isFile(), 5000, "a fresh state file");
    expect(JSON.parse(readFileSync(file, "utf8")).snapshot.epoch).toBe("epoch-test");
  });
});

describe("in-flight reports in process", () => {
  it("hands them to the feed, and logs a feed that throws once per kind, never throwing back", async () => {
    const manual = createManualRoutingFeed();
    let refusals = 0;
    const feed: RoutingFeed = {
      subscribe: (listener) => manual.subscribe(listener),
      reportInFlight(report) {
        if (report.draining.length > 0 && refusals++ < 2) {
          throw Object.assign(new Error("the cluster is closing"), { code: "LLMGW_TEST_CLOSING" });
        }
        manual.reportInFlight(report);
      },
    };
    const events: Record<string, unknown>[] = [];
    const router = await startRouter({
      routing: { feed, routerId: "router-test", log: (e) => events.push({ ...e }) },
      router: { analyzer: { pool: false } },
    });
    cleanups.push(() => router.close(0));
    const report = { epoch: "e1", stateVersion: 3, draining: [{ replicaId: "m-0", inFlight: 0 }] };
    router.runtime.reportInFlight(report);
    router.runtime.reportInFlight(report);
    router.runtime.reportInFlight(report);
    expect(manual.reports).toEqual([report]);
    expect(events.filter((e) => e.event === "in_flight_report_failed")).toEqual([
      {
        event: "in_flight_report_failed",
        kind: "LLMGW_TEST_CLOSING",
        message:
          "the in-process control plane refused an in-flight report: the cluster is closing; reporting goes on",
      },
    ]);
  });
});

describe("stopping", () => {
  it("stops accepting, lets an in-flight request finish, then reports", async () => {
    const e = await engine("slow", { gated: true });
    const { router } = await fed({ snapshot: snapshotOver(e) });
    const inFlight = chat(router, "finish me");
    await waitFor(() => e.received.length === 1, 5000, "the request to reach the engine");
    const stopping = router.stop(10_000);
    await waitFor(() => !router.server.listening, 5000, "the listener to close");
    await expect(fetch(`${router.url}/healthz`)).rejects.toThrow();
    e.openGate();
    const res = await inFlight;
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    expect(await stopping).toMatchObject({ forced: false });
  });

  it("closes what is left at the grace deadline", async () => {
    const e = await engine("stuck", { gated: true });
    const { router } = await fed({ snapshot: snapshotOver(e) });
    const inFlight = chat(router, "never answered").catch((error: unknown) => error);
    await waitFor(() => e.received.length === 1, 5000, "the request to reach the engine");
    const report = await router.stop(200);
    expect(report.forced).toBe(true);
    expect(report.durationMs).toBeGreaterThanOrEqual(150);
    expect(await inFlight).toBeInstanceOf(Error);
    e.openGate();
  });
});
