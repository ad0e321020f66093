/**
 * Precise mode end to end (issue 22): a `kvEvents` deployment of the simulator on two real
 * agents, whose engines publish their KV-cache events on the agents' unix sockets; the agents
 * serve each replica's blocks (`KvCacheService`) and two real `llmgw router` processes watch them.
 * A prompt sent through one router is matched, on the other router that never saw it, against
 * the blocks the engine reported: that router's own history is empty for it, so only the
 * engine's events can give it a prefix hit. The engine's own `cached_tokens` then confirm it.
 */

import { create } from "@bufbuild/protobuf";
import { DeploymentSchema, Engine, RoutingPolicy } from "@llmgw/proto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  allReady,
  deployment,
  metricSamples,
  type RoutersCluster,
  startRoutersCluster,
  stopAll,
  tempRoot,
  waitFor,
} from "./cluster-harness.js";

const MODEL = "precise";
const root = tempRoot("llmgw-precise-e2e-");
let c: RoutersCluster;

beforeAll(async () => {
  c = await startRoutersCluster(root);
  await c.cp.admin().applyDeployment(
    {
      deployment: create(DeploymentSchema, {
        name: MODEL,
        model: `sim/${MODEL}`,
        engine: Engine.SIM,
        gpuClass: "h100-80g",
        replicas: 2,
        routingPolicy: RoutingPolicy.LLMGW,
        kvEvents: true,
      }),
    },
    c.cp.adminHeaders(),
  );
  await waitFor(
    "both replicas to be ready",
    async () => allReady(await deployment(c.cp, MODEL), 2) || undefined,
    90_000,
  );
}, 180_000);

afterAll(async () => {
  await stopAll([root]);
});

const metric = async (url: string, name: string, labels: Record<string, string> = {}) => {
  const text = await (await fetch(`${url}/metrics`)).text();
  return metricSamples(text, name)
    .filter((s) => Object.entries(labels).every(([k, v]) => s.labels[k] === v))
    .reduce((n, s) => n + s.value, 0);
};

async function chat(
  routerUrl: string,
  content: string,
): Promise<{ replica: string; cached: number }> {
  const res = await fetch(`${routerUrl}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${c.apiKey}`, "content-type": "application/json" },
    body: JSON.stringify({ model: MODEL, max_tokens: 16, messages: [{ role: "user", content }] }),
  });
  expect(res.status).toBe(200);
  const body = (await res.json()) as {
    usage?: { prompt_tokens_details?: { cached_tokens?: number } };
  };
  return {
    replica: res.headers.get("x-llmgw-replica") ?? "",
    cached: body.usage?.prompt_tokens_details?.cached_tokens ?? 0,
  };
}

describe("precise routing from the engines' KV events", { timeout: 120_000 }, () => {
  it("a router that never saw a prompt matches it on the blocks the engine reported", async () => {
    const [first, second] = c.routers as [
      RoutersCluster["routers"][0],
      RoutersCluster["routers"][0],
    ];
    const prompt = `precise ${"lorem ipsum dolor sit amet ".repeat(200)}`;
    const hits = () => metric(second.metricsUrl, "llmgw_router_prefix_hit_requests_total");
    // Each router watches both replicas' feeds before anything is sent.
    await waitFor(
      "both routers to match precisely (no kv_events_not_synced fallback on a probe)",
      async () => {
        const probe = await chat(second.url, `probe ${Math.random()}`);
        const fallbacks = await metric(second.metricsUrl, "llmgw_router_routing_fallbacks_total", {
          reason: "kv_events_not_synced",
        });
        return probe.replica !== "" && (await precise(second.metricsUrl, fallbacks))
          ? true
          : undefined;
      },
      30_000,
      200,
    );
    const preciseHits = () =>
      metric(second.metricsUrl, "llmgw_router_prefix_predictions_total", {
        source: "precise",
        outcome: "hit",
      });
    const before = { hits: await hits(), precise: await preciseHits() };
    const sent = await chat(first.url, prompt);
    expect(sent.cached).toBe(0);
    // The second router never sent this prompt. A decision it makes from the engines' blocks
    // (source "precise") that the engine confirms (cached_tokens) is the engine's event reaching
    // it, and it must point at the replica that holds the prompt. (Its own approximate index
    // learns the prompt from the first try on, but approximate decisions never count here.)
    const again = await waitFor(
      "the second router to match the prompt on the engine's blocks",
      async () => {
        const r = await chat(second.url, prompt);
        return (await preciseHits()) > before.precise ? r : undefined;
      },
      15_000,
      100,
    );
    expect(again.replica).toBe(sent.replica);
    expect(again.cached).toBeGreaterThan(0);
    expect(await hits()).toBeGreaterThan(before.hits);
  });
});

/** True once the router's last decisions were precise: its not-synced fallbacks stopped growing. */
const lastFallbacks = new Map<string, number>();
async function precise(url: string, fallbacks: number): Promise<boolean> {
  const seen = lastFallbacks.get(url);
  lastFallbacks.set(url, fallbacks);
  return seen !== undefined && seen === fallbacks;
}
