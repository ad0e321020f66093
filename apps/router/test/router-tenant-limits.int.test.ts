/**
 * Tenant limits through the real router and the official `openai` client, against a simulated
 * engine: a tenant's tpm bounds all its keys together, and a refusal says which limit refused
 * (`x-llmgw-limit`) and when to come back (`Retry-After`), never a hang.
 */
import { type RunningEngineSim, startEngineSim } from "@llmgw/engine-sim";
import { createRecordingRouterMetrics } from "@llmgw/router/testing";
import OpenAI from "openai";
import { afterEach, describe, expect, it } from "vitest";
import type { RunningRouter } from "../src/index.js";
import { type FakeEngine, startFakeEngine, waitFor } from "./router-fake-engine.js";
import { routingSnapshot, startFedRouter } from "./routing-fixture.js";

const MODEL = "sim-llama";
const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function setup(): Promise<{ router: RunningRouter; engine: RunningEngineSim }> {
  // Every answer is 400 tokens long.
  const engine = await startEngineSim({
    model: MODEL,
    port: 0,
    warmupSeconds: 0,
    timeScale: 200,
    minOutputTokens: 400,
    maxOutputTokens: 400,
  });
  cleanups.push(() => engine.close());
  const { router } = await startFedRouter({
    snapshot: routingSnapshot({
      models: { [MODEL]: { deployment: "sim", replicas: [{ id: "sim-0", baseUrl: engine.url }] } },
      tenants: [{ name: "search-team", tpm: 1_000, weight: 1 }],
      keys: {
        "sk-a": { id: "ka", name: "search-a", tenant: "search-team", tpm: 10_000 },
        "sk-b": { id: "kb", name: "search-b", tenant: "search-team" },
        "sk-solo": { id: "ks", name: "solo" },
      },
    }),
    router: { analyzer: { pool: false } },
  });
  cleanups.push(() => router.close());
  return { router, engine };
}

const clientFor = (router: RunningRouter, key: string) =>
  new OpenAI({ apiKey: key, baseURL: `${router.url}/v1`, maxRetries: 0 });

const ask = (client: OpenAI) =>
  client.chat.completions.create({
    model: MODEL,
    messages: [{ role: "user", content: "hi" }],
    max_tokens: 400,
  });

/**
 * A router over `engines` (model `m`, capacity 4 each) with two tenants: `app` (critical,
 * key `sk-app`) and `nightly` (batch, key `sk-batch`).
 */
async function priorityRouter(engines: readonly FakeEngine[]) {
  const metrics = createRecordingRouterMetrics();
  const { router } = await startFedRouter({
    metrics,
    snapshot: routingSnapshot({
      models: {
        m: { replicas: engines.map((e) => ({ id: e.name, baseUrl: e.url, capacity: 4 })) },
      },
      tenants: [
        { name: "app", priority: "critical", weight: 1 },
        { name: "nightly", priority: "batch", weight: 1 },
      ],
      keys: {
        "sk-app": { id: "ka", name: "app", tenant: "app" },
        "sk-batch": { id: "kb", name: "batch", tenant: "nightly" },
      },
    }),
    router: { analyzer: { pool: false } },
  });
  cleanups.push(() => router.close());
  return { router, metrics };
}

describe("router: tenant limits", () => {
  it("shares a tenant's tpm between its keys and refuses with x-llmgw-limit: tenant-tpm", async () => {
    const { router } = await setup();
    const a = clientFor(router, "sk-a");
    const b = clientFor(router, "sk-b");
    // ~410 tokens each: two fit in the tenant's 1,000, a third reservation does not, whichever
    // key sends it (key a's own tpm of 10,000 has room to spare).
    expect((await ask(a)).usage?.completion_tokens).toBe(400);
    expect((await ask(b)).usage?.completion_tokens).toBe(400);
    for (const client of [a, b]) {
      const refused = await ask(client).then(
        () => undefined,
        (error: unknown) => error,
      );
      expect(refused).toBeInstanceOf(OpenAI.RateLimitError);
      const error = refused as InstanceType<typeof OpenAI.RateLimitError>;
      expect(error.status).toBe(429);
      expect(error.code).toBe("tokens_rate_limit_exceeded");
      expect(error.message).toContain("tenant search-team exceeded its tpm limit");
      expect(error.headers?.get("x-llmgw-limit")).toBe("tenant-tpm");
      expect(Number(error.headers?.get("retry-after"))).toBeGreaterThanOrEqual(1);
    }
    // Another key, outside the tenant, is not held back.
    expect((await ask(clientFor(router, "sk-solo"))).usage?.completion_tokens).toBe(400);
  });

  it("sheds a queued batch request for a standard one when the queue is full", async () => {
    const engine = await startFakeEngine({ name: "gated", gated: true });
    cleanups.push(() => engine.close());
    const metrics = createRecordingRouterMetrics();
    const { router } = await startFedRouter({
      metrics,
      snapshot: routingSnapshot({
        models: { m: { replicas: [{ id: "gated", baseUrl: engine.url, capacity: 1 }] } },
        tenants: [{ name: "nightly", priority: "batch", weight: 1 }],
        keys: {
          "sk-batch": { id: "kb", name: "batch", tenant: "nightly" },
          "sk-interactive": { id: "ki", name: "interactive" },
        },
      }),
      router: { analyzer: { pool: false }, maxQueueLength: 1 },
    });
    cleanups.push(() => router.close());
    const send = (key: string) =>
      fetch(`${router.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] }),
      });
    const running = send("sk-interactive");
    await waitFor(() => engine.held() === 1, 5_000, "the first request to reach the engine");
    const batch = send("sk-batch");
    await waitFor(
      () => metrics.of("queueDepth").some((a) => a[1] === 1),
      5_000,
      "the batch request to queue",
    );
    // The one slot is taken and the batch request fills the queue: a standard one sheds it.
    const standard = send("sk-interactive");
    const shed = await batch;
    expect(shed.status).toBe(429);
    expect(shed.headers.get("x-llmgw-limit")).toBe("shed");
    expect(shed.headers.get("retry-after")).toBe("1");
    expect(((await shed.json()) as { error: { code: string } }).error.code).toBe("queue_full");
    // A batch request that finds the queue full is refused at once.
    const refused = await send("sk-batch");
    expect([refused.status, refused.headers.get("x-llmgw-limit")]).toEqual([429, "queue_full"]);
    engine.openGate();
    expect([(await running).status, (await standard).status]).toEqual([200, 200]);
  });

  it("keeps a replica free of batch prefills while a critical request prefills", async () => {
    const engines = await Promise.all(
      ["a", "b"].map((name) => startFakeEngine({ name, gated: true, gateFirstChunk: true })),
    );
    for (const e of engines) cleanups.push(() => e.close());
    const { router, metrics } = await priorityRouter(engines);
    const send = (key: string, stream: boolean) =>
      fetch(`${router.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "m", stream, messages: [{ role: "user", content: "hi" }] }),
      });
    const reached = () => engines.reduce((n, e) => n + e.received.length, 0);
    // A critical stream reaches an engine and waits there for its first byte: of 2 replicas,
    // 1 is kept free of prefills, and the critical one holds the other.
    const critical = send("sk-app", true);
    await waitFor(() => reached() === 1, 5_000, "the critical request to reach an engine");
    const batch = send("sk-batch", true);
    await waitFor(
      () => metrics.of("queueDepth").some((a) => a[1] === 1),
      5_000,
      "the batch stream to be held",
    );
    // A non-streamed one waits too, though it will not count as prefilling once it starts
    // (the router cannot see its prefill end: its first byte is its last).
    const whole = send("sk-batch", false);
    await waitFor(
      () => metrics.of("queueDepth").some((a) => a[1] === 2),
      5_000,
      "the non-streamed request to be held",
    );
    expect(reached()).toBe(1);
    // The critical request's first byte (its engine's gate) lets one held request start: the
    // other waits for that one's first byte in turn (1 prefill at a time, of 2 replicas).
    const criticalEngine = engines.find((e) => e.received.length === 1) as FakeEngine;
    criticalEngine.openGate();
    await waitFor(() => reached() === 2, 5_000, "a held batch request to reach an engine");
    expect(metrics.of("queueDepth").at(-1)).toEqual(["m", 1]);
    for (const e of engines) e.openGate();
    await waitFor(() => reached() === 3, 5_000, "the last held request to reach an engine");
    for (const response of await Promise.all([critical, batch, whole])) {
      expect(response.status).toBe(200);
      await response.text();
    }
  });

  /**
   * One gated engine behind a router with a critical and a batch tenant: a critical stream
   * reaches the engine and waits for its first byte; then a batch stream is admitted (1
   * replica: the reserve does not apply) and picked for that same replica, where it is held.
   */
  async function batchBehindCritical() {
    const engine = await startFakeEngine({ name: "a", gated: true, gateFirstChunk: true });
    cleanups.push(() => engine.close());
    const { router, metrics } = await priorityRouter([engine]);
    const send = (key: string) =>
      fetch(`${router.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
        body: JSON.stringify({
          model: "m",
          stream: true,
          messages: [{ role: "user", content: "hi" }],
        }),
      });
    const picked = () => metrics.of("decision").length;
    const critical = send("sk-app");
    await waitFor(
      () => engine.received.length === 1,
      5_000,
      "the critical request to reach the engine",
    );
    const batch = send("sk-batch");
    await waitFor(() => picked() === 2, 5_000, "the batch stream to be picked");
    return { engine, send, picked, critical, batch, heldAt: performance.now() };
  }

  it("sends no batch request to a replica whose critical prefill is queued until its first byte", async () => {
    const { engine, send, picked, critical, batch, heldAt } = await batchBehindCritical();
    // A critical request sent after it is never held: it overtakes the batch one.
    const second = send("sk-app");
    await waitFor(
      () => engine.received.length === 2,
      5_000,
      "the second critical request to arrive",
    );
    expect(picked()).toBe(3);
    // Both critical prefills end (their first bytes): the batch stream goes, well before the
    // hold's 1 s bound.
    engine.openGate();
    await waitFor(
      () => engine.received.length === 3,
      5_000,
      "the held batch request to reach the engine",
    );
    expect(performance.now() - heldAt).toBeLessThan(900);
    for (const response of await Promise.all([critical, batch, second])) {
      expect(response.status).toBe(200);
      await response.text();
    }
  });

  it("holds a batch request behind a critical prefill for 1 s at most", async () => {
    const { engine, critical, batch, heldAt } = await batchBehindCritical();
    // The critical prefill never ends (a hung or very long prompt): the batch request goes
    // anyway once the bound passes, while the critical one still waits at the gate.
    await waitFor(() => engine.received.length === 2, 5_000, "the batch request to be let go");
    expect(performance.now() - heldAt).toBeGreaterThanOrEqual(950);
    expect(engine.held()).toBe(2);
    engine.openGate();
    for (const response of await Promise.all([critical, batch])) {
      expect(response.status).toBe(200);
      await response.text();
    }
  });
});
