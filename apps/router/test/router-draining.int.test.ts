/**
 * Draining, end to end: a real router (startRouter over a manual feed) in front of real fake
 * engines on loopback. A replica turned draining takes no new request, finishes the stream it
 * has to the last byte, and the feed hears what the router still has on it until that is 0.
 */
import type { InFlightReport, RoutedReplica, RoutingDelta } from "@llmgw/router";
import type { ManualRoutingFeed } from "@llmgw/router/testing";
import { afterEach, describe, expect, it, vi } from "vitest";
import type { RunningRouter } from "../src/index.js";
import { type FakeEngine, startFakeEngine, withoutUsageEvent } from "./router-fake-engine.js";
import { routingSnapshot, startFedRouter } from "./routing-fixture.js";

const KEY = "sk-drain";
const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function engine(name: string, gated = false): Promise<FakeEngine> {
  const e = await startFakeEngine({ name, gated, chunks: 6 });
  cleanups.push(() => e.close());
  return e;
}

const replica = (
  id: string,
  e: FakeEngine,
  state: RoutedReplica["state"] = "ready",
): RoutedReplica => ({ id, model: "m", deployment: "m", baseUrl: e.url, state, capacity: 1 });

const delta = (version: number, over: Partial<RoutingDelta>): RoutingDelta => ({
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
  ...over,
});

/** A router whose model `m` has replica `a` (capacity 1) only; no admission queue by default. */
async function routerOn(
  a: FakeEngine,
  maxQueueLength = 0,
): Promise<{ router: RunningRouter; feed: ManualRoutingFeed }> {
  const started = await startFedRouter({
    snapshot: routingSnapshot({
      models: { m: { replicas: [{ id: "a", baseUrl: a.url, capacity: 1 }] } },
      keys: { [KEY]: { id: "k", name: "k" } },
    }),
    // No queue: a request the admission capacity has no room for is refused at once (429),
    // so a drain that shut new requests out would show.
    router: { analyzer: { pool: false }, maxQueueLength },
  });
  cleanups.push(() => started.router.close());
  return started;
}

function send(router: RunningRouter, content: string, stream = false): Promise<Response> {
  return fetch(`${router.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "m", messages: [{ role: "user", content }], stream }),
  });
}

const lists = (reports: readonly InFlightReport[]) =>
  reports.map((r) => r.draining.map((d) => `${d.replicaId}=${d.inFlight}`).join(","));

/** A long stream on `a`: its head and first chunk have arrived, the rest waits at a's gate. */
async function streamOn(router: RunningRouter, a: FakeEngine) {
  const response = await send(router, "a long answer", true);
  expect(response.headers.get("x-llmgw-replica")).toBe("a");
  await vi.waitFor(() => expect(a.held()).toBe(1), { interval: 5 });
  return response;
}

describe("a draining replica", () => {
  it("takes no new request, finishes its stream intact, and is reported until it has none", async () => {
    const a = await engine("a", true);
    const b = await engine("b");
    const { router, feed } = await routerOn(a);
    const long = await streamOn(router, a);

    // Make before break: b joins, then a drains.
    feed.push(delta(2, { upsertedReplicas: [replica("b", b)] }));
    feed.push(delta(3, { upsertedReplicas: [replica("a", a, "draining")] }));
    await vi.waitFor(() => expect(lists(feed.reports)).toEqual(["a=1"]), { interval: 5 });
    expect(feed.reports[0]).toMatchObject({ epoch: "epoch-test", stateVersion: 3 });

    // a is full and draining, b has room: each new request goes to b, none is refused.
    for (let i = 0; i < 4; i++) {
      const r = await send(router, `new request ${i}`, i % 2 === 0);
      expect(r.status).toBe(200);
      expect(r.headers.get("x-llmgw-replica")).toBe("b");
      await r.text();
    }
    expect(a.received).toHaveLength(1);
    expect(b.received).toHaveLength(4);

    a.openGate();
    const body = await long.text();
    // What the engine sent, less the usage event the router asked for on the client's behalf.
    const expected = withoutUsageEvent(Buffer.concat(a.written[0] ?? []).toString("utf8"));
    expect(body).toBe(expected);
    expect(body.match(/tok\d/g)).toEqual(["tok0", "tok1", "tok2", "tok3", "tok4", "tok5"]);
    expect(body.endsWith("data: [DONE]\n\n")).toBe(true);

    // Within a check interval of the stream's end, the control plane hears a has none left.
    await vi.waitFor(() => expect(lists(feed.reports).at(-1)).toBe("a=0"), {
      interval: 5,
      timeout: 2_000,
    });
    expect(new Set(lists(feed.reports))).toEqual(new Set(["a=1", "a=0"]));
    expect(router.handler.inFlight("a")).toBe(0);

    // Drained: the control plane removes a; one empty report ends it.
    feed.push(delta(4, { removedReplicas: ["a"] }));
    await vi.waitFor(() => expect(feed.reports.at(-1)?.draining).toEqual([]), { interval: 5 });
  });

  it("keeps the slots of a replica removed outright while its stream runs, until it ends", async () => {
    const a = await engine("a", true);
    const b = await engine("b");
    const { router, feed } = await routerOn(a);
    const long = await streamOn(router, a);

    // b joins, and a leaves the table at once (its node lost, not drained): its stream runs on.
    feed.push(delta(2, { upsertedReplicas: [replica("b", b)] }));
    feed.push(delta(3, { removedReplicas: ["a"] }));
    await vi.waitFor(() => expect(router.runtime.state.version).toBe(3), { interval: 5 });
    expect(router.handler.inFlight("a")).toBe(1);

    // a's running request holds a's slot, not b's: b takes new requests, none is refused.
    for (let i = 0; i < 3; i++) {
      const r = await send(router, `new request ${i}`);
      expect(r.status).toBe(200);
      expect(r.headers.get("x-llmgw-replica")).toBe("b");
      await r.text();
    }

    a.openGate();
    expect((await long.text()).endsWith("data: [DONE]\n\n")).toBe(true);
    await vi.waitFor(() => expect(router.handler.inFlight("a")).toBe(0), { interval: 5 });
    // Once a's last request ended, the capacity is b's alone again: one request at a time.
    const r = await send(router, "after a");
    expect(r.headers.get("x-llmgw-replica")).toBe("b");
    await r.text();
  });

  it("leaves a model with only draining replicas answering 503 no_ready_replica", async () => {
    const a = await engine("a", true);
    const { router, feed } = await routerOn(a);
    const long = await streamOn(router, a);
    feed.push(delta(2, { upsertedReplicas: [replica("a", a, "draining")] }));

    const refused = await send(router, "nowhere to go");
    expect(refused.status).toBe(503);
    expect(refused.headers.get("retry-after")).toBe("5");
    expect(((await refused.json()) as { error: { code: string; message: string } }).error).toEqual(
      expect.objectContaining({
        code: "no_ready_replica",
        message: "no ready replica for model m",
      }),
    );
    expect(a.received).toHaveLength(1);

    a.openGate();
    expect((await long.text()).endsWith("data: [DONE]\n\n")).toBe(true);
  });

  it("finishes its stream when its deployment was deleted (the model gone at once)", async () => {
    const a = await engine("a", true);
    const { router, feed } = await routerOn(a);
    const long = await streamOn(router, a);
    feed.push(delta(2, { removedModels: ["m"], upsertedReplicas: [replica("a", a, "draining")] }));
    await vi.waitFor(() => expect(lists(feed.reports)).toEqual(["a=1"]), { interval: 5 });
    expect(router.runtime.state.version).toBe(2); // applied, not refused

    const gone = await send(router, "the model is gone");
    expect(gone.status).toBe(404);
    expect(a.received).toHaveLength(1);

    a.openGate();
    expect((await long.text()).match(/tok\d/g)).toHaveLength(6);
    await vi.waitFor(() => expect(lists(feed.reports).at(-1)).toBe("a=0"), {
      interval: 5,
      timeout: 2_000,
    });
  });

  it("sends a request that was queued while it turned draining to the replica that took over", async () => {
    const a = await engine("a", true);
    const b = await engine("b");
    const { router, feed } = await routerOn(a, 8);
    const long = await streamOn(router, a);
    const queued = send(router, "waits for room");
    const depth = async () =>
      (await router.registry.getSingleMetric("llmgw_router_queue_depth")?.get())?.values.find(
        (v) => v.labels.model === "m",
      )?.value;
    await vi.waitFor(async () => expect(await depth()).toBe(1), { interval: 5 });
    feed.push(delta(2, { upsertedReplicas: [replica("b", b), replica("a", a, "draining")] }));
    const answer = await queued;
    expect(answer.status).toBe(200);
    expect(answer.headers.get("x-llmgw-replica")).toBe("b");
    a.openGate();
    expect((await long.text()).endsWith("data: [DONE]\n\n")).toBe(true);
  });
});
