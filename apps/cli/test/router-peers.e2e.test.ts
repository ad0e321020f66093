/**
 * Two real `llmgw router` processes that are each other's peers (`--peer`, `--peer-key-file`),
 * watching a real control plane with two agents on simulated nodes: each opens its event
 * stream to the other, and a tenant met first by one router stays on its replica when it
 * reaches the other.
 */
import { create } from "@bufbuild/protobuf";
import { DeploymentSchema, Engine } from "@llmgw/proto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  allReady,
  deployment,
  metricSamples,
  type RouterProc,
  type RoutersCluster,
  startRoutersCluster,
  stopAll,
  tempRoot,
  waitFor,
} from "./cluster-harness.js";

const root = tempRoot("llmgw-router-peers-e2e-");
let c: RoutersCluster;

beforeAll(async () => {
  c = await startRoutersCluster(root, {
    peers: true,
    routerArgs: ["--session-header", "x-session-id"],
  });
  await c.cp.admin().applyDeployment(
    {
      deployment: create(DeploymentSchema, {
        name: "chat",
        model: "sim/chat",
        engine: Engine.SIM,
        gpuClass: "h100-80g",
        replicas: 4,
      }),
    },
    c.cp.adminHeaders(),
  );
  await waitFor(
    "chat's 4 replicas to be ready",
    async () => allReady(await deployment(c.cp, "chat"), 4) || undefined,
    90_000,
  );
}, 180_000);
afterAll(() => stopAll([root]));

/** A router's metric, summed over the samples with these labels. */
async function metric(r: RouterProc, name: string, labels: Record<string, string> = {}) {
  const text = await (await fetch(`${r.metricsUrl}/metrics`)).text();
  return metricSamples(text, name)
    .filter((s) => Object.entries(labels).every(([k, v]) => s.labels[k] === v))
    .reduce((sum, s) => sum + s.value, 0);
}

/** One chat request of `tenant` through `r`; the replica that served it. */
async function chat(r: RouterProc, tenant: string): Promise<string> {
  const res = await fetch(`${r.url}/v1/chat/completions`, {
    method: "POST",
    headers: {
      authorization: `Bearer ${c.apiKey}`,
      "content-type": "application/json",
      "x-session-id": tenant,
    },
    body: JSON.stringify({
      model: "chat",
      max_tokens: 2,
      messages: [{ role: "user", content: `${tenant}: hello` }],
    }),
  });
  expect(res.status).toBe(200);
  await res.arrayBuffer();
  return res.headers.get("x-llmgw-replica") ?? "";
}

describe("llmgw router --peer", () => {
  it("streams each router's dispatches to the other, which keeps each tenant where it was sent", async () => {
    const [a, b] = c.routers as [RouterProc, RouterProc];
    await waitFor(
      "both peer streams",
      async () =>
        ((await metric(a, "llmgw_router_peers_connected")) === 1 &&
          (await metric(b, "llmgw_router_peers_connected")) === 1) ||
        undefined,
    );
    const first = new Map<string, string>();
    for (let t = 0; t < 12; t++) first.set(`tenant-${t}`, await chat(a, `tenant-${t}`));
    // Each request's dispatch and end (and its first byte, when it had a prompt to compute)
    // reached b.
    await waitFor(
      "a's events at b",
      async () =>
        (await metric(b, "llmgw_router_peer_events_total", {
          direction: "in",
          outcome: "applied",
        })) >= 24 || undefined,
    );
    for (const [tenant, replica] of first) expect(await chat(b, tenant), tenant).toBe(replica);
    for (const r of [a, b]) {
      expect(await metric(r, "llmgw_router_peer_events_total", { outcome: "dropped" })).toBe(0);
      expect(await metric(r, "llmgw_router_peer_events_total", { outcome: "invalid" })).toBe(0);
    }
  });
});
