/**
 * Router traffic reaches the `llmgw_router_*` Prometheus families of
 * `@llmgw/metrics-collector` on the registry `startRouter` is given, as production records them.
 */
import { createInFlightCounters } from "@llmgw/router";
import { Registry } from "prom-client";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningRouter } from "../src/index.js";
import { type FakeEngine, startFakeEngine } from "./router-fake-engine.js";
import { routingSnapshot, startFedRouter } from "./routing-fixture.js";

let engine: FakeEngine;
let router: RunningRouter;
const registry = new Registry();

beforeAll(async () => {
  engine = await startFakeEngine({ name: "e" });
  ({ router } = await startFedRouter({
    snapshot: routingSnapshot({
      models: { m: { replicas: [{ id: "m-0", baseUrl: engine.url, capacity: 4 }] } },
      keys: { "sk-m": { id: "k", name: "metrics-key", rpm: 3 } },
    }),
    registry,
    router: { analyzer: { pool: { maxThreads: 1 } } },
  }));
});

afterAll(async () => {
  await router?.close();
  await engine?.close();
});

const chat = (model: string, key = "sk-m", stream = false) =>
  fetch(`${router.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model, stream, messages: [{ role: "user", content: "count me" }] }),
  });

describe("a replica that leaves the route table", () => {
  it("loses its series and its routing state; the one that stays keeps serving", async () => {
    const gone = await startFakeEngine({ name: "gone" });
    const stays = await startFakeEngine({ name: "stays" });
    const own = new Registry();
    const inFlight = createInFlightCounters();
    const { router: r, feed } = await startFedRouter({
      snapshot: routingSnapshot({
        models: {
          d: {
            policy: "round-robin",
            replicas: [
              { id: "d-0", baseUrl: gone.url, capacity: 4 },
              { id: "d-1", baseUrl: stays.url, capacity: 4 },
            ],
          },
        },
      }),
      registry: own,
      router: { noAuth: true, analyzer: { pool: false }, picker: { inFlight } },
    });
    try {
      const send = async () => {
        const res = await fetch(`${r.url}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ model: "d", messages: [{ role: "user", content: "hi" }] }),
        });
        await res.arrayBuffer();
        return res.headers.get("x-llmgw-replica");
      };
      // Round robin over two replicas: both get traffic, so both have series.
      expect(new Set([await send(), await send()])).toEqual(new Set(["d-0", "d-1"]));
      const replicas = async () =>
        new Set(
          (await own.getSingleMetricAsString("llmgw_router_replica_requests_in_flight"))
            .split("\n")
            .filter((l) => l.startsWith("llmgw_router_replica_requests_in_flight{"))
            .map((l) => /replica="([^"]+)"/.exec(l)?.[1]),
        );
      expect(await replicas()).toEqual(new Set(["d-0", "d-1"]));
      const slot = inFlight.slotOf("d-0");

      feed.push({
        kind: "delta",
        epoch: "epoch-test",
        version: 2,
        upsertedModels: [],
        removedModels: [],
        upsertedReplicas: [],
        removedReplicas: ["d-0"],
        upsertedKeys: [],
        removedKeys: [],
        sentAtMs: Date.now(),
      });
      expect(await replicas()).toEqual(new Set(["d-1"]));
      // Its shared in-flight slot is free again: the next new replica id gets it.
      expect(inFlight.slotOf("d-9")).toBe(slot);
      expect([await send(), await send()]).toEqual(["d-1", "d-1"]);
    } finally {
      await r.close();
      await gone.close();
      await stays.close();
    }
  });
});

describe("router metrics", () => {
  it("exports requests, refusals, tokens and decisions in llmgw_router_* families", async () => {
    await (await chat("m")).arrayBuffer();
    await (await chat("m", "sk-m", true)).arrayBuffer();
    await (await chat("no-such-model")).arrayBuffer();
    await (await chat("m", "sk-wrong")).arrayBuffer();
    await (await chat("m")).arrayBuffer();
    // The key's fourth routed request in a minute exceeds its rpm of 3.
    expect((await chat("m")).status).toBe(429);
    const text = await registry.metrics();
    const line = (prefix: string) => text.split("\n").find((l) => l.startsWith(prefix));
    expect(
      line('llmgw_router_requests_total{model="m",endpoint="chat_completions",code="200"}'),
    ).toMatch(/ 3$/);
    expect(
      line('llmgw_router_requests_total{model="other",endpoint="chat_completions",code="404"}'),
    ).toMatch(/ 1$/);
    expect(
      line('llmgw_router_admission_rejections_total{model="other",reason="model_not_found"}'),
    ).toMatch(/ 1$/);
    expect(line('llmgw_router_auth_failures_total{reason="invalid"}')).toMatch(/ 1$/);
    expect(line('llmgw_router_rate_limited_total{key_name="metrics-key",limit="key-rpm"}')).toMatch(
      / 1$/,
    );
    // 4 tokens for each of the 3 answers, the stream's too: the router asked its engine for
    // the usage the client did not.
    expect(line('llmgw_router_completion_tokens_total{model="m"}')).toMatch(/ 12$/);
    expect(line('llmgw_router_scoring_tasks_total{path="inline"}')).toMatch(/ 3$/);
    expect(line('llmgw_router_replicas_available{model="m"}')).toMatch(/ 1$/);
    expect(line('llmgw_router_requests_in_flight{model="m"}')).toMatch(/ 0$/);
    expect(
      line('llmgw_router_routing_fallbacks_total{model="m",reason="missing_load_signals"}'),
    ).toMatch(/ 3$/);
    expect(line("llmgw_router_worker_pool_utilization_ratio")).toMatch(/ 0$/);
    const families = new Set(
      text
        .split("\n")
        .filter((l) => l.startsWith("# TYPE llmgw_router_"))
        .map((l) => l.split(" ")[2]),
    );
    expect(families.size).toBeGreaterThanOrEqual(22);
  });
});
