/**
 * Two routers that tell each other what they sent (peer-exchange.ts), over loopback in front
 * of real simulated engines: a tenant goes to one replica from either router, the peers' books
 * follow each other's streams, and a wrong key or a bad event is refused with its reason.
 */
import { createServer as createHttpServer, type IncomingMessage, request } from "node:http";
import type { AddressInfo } from "node:net";
import { type RunningEngineSim, startEngineSim } from "@llmgw/engine-sim";
import { freePort } from "@llmgw/supervisor";
import { afterEach, describe, expect, it } from "vitest";
import { PEER_EVENTS_PATH, type RunningRouter } from "../src/index.js";
import { MAX_PEER_LINE_BYTES, startPeerExchange } from "../src/peer-exchange.js";
import { routingSnapshot, startFedRouter } from "./routing-fixture.js";

const MODEL = "sim-llama";
const KEY = "peer-key-0123456789abcdef";
const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function waitFor(predicate: () => boolean | Promise<boolean>, what: string): Promise<void> {
  const deadline = Date.now() + 15_000;
  while (!(await predicate())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

/** Sums a counter's samples with these labels from the router's registry. */
async function counter(router: RunningRouter, name: string, labels: Record<string, string>) {
  const family = (await router.registry.getMetricsAsJSON()).find((m) => m.name === name);
  let sum = 0;
  for (const v of (family?.values ?? []) as { labels: Record<string, string>; value: number }[])
    if (Object.entries(labels).every(([k, x]) => v.labels[k] === x)) sum += v.value;
  return sum;
}

/** Four engines and two routers over them; `exchange`: the routers are each other's peers. */
async function fleet(exchange: boolean, renewMs?: number) {
  const engines: RunningEngineSim[] = [];
  for (let i = 0; i < 4; i++) {
    const e = await startEngineSim({ port: 0, warmupSeconds: 0, model: MODEL, timeScale: 50 });
    cleanups.push(() => e.close());
    engines.push(e);
  }
  const snapshot = routingSnapshot({
    models: {
      [MODEL]: {
        deployment: "sim",
        replicas: engines.map((e, i) => ({ id: `sim-${i}`, baseUrl: e.url, capacity: 8 })),
      },
    },
    keys: { "sk-sim": { id: "k", name: "k" } },
    routers: 2,
  });
  const ports = [await freePort(), await freePort()];
  const routers: RunningRouter[] = [];
  for (const [i, port] of ports.entries()) {
    const { router } = await startFedRouter({
      snapshot,
      routerId: `router-${i}`,
      listen: `127.0.0.1:${port}`,
      router: { analyzer: { pool: false }, sessionHeader: "x-session-id" },
      ...(exchange
        ? {
            peers: {
              urls: [`http://127.0.0.1:${ports[1 - i]}`],
              key: KEY,
              ...(renewMs === undefined ? {} : { renewMs }),
            },
          }
        : {}),
    });
    cleanups.push(() => router.close(0));
    routers.push(router);
  }
  if (exchange) {
    await waitFor(
      async () =>
        (
          await Promise.all(routers.map((r) => counter(r, "llmgw_router_peers_connected", {})))
        ).every((n) => n === 1),
      "both peer streams",
    );
  }
  return routers as [RunningRouter, RunningRouter];
}

/** One chat request of `tenant` through `router`; the replica that served it. */
async function chat(router: RunningRouter, tenant: string): Promise<string> {
  const res = await fetch(`${router.url}/v1/chat/completions`, {
    method: "POST",
    headers: {
      authorization: "Bearer sk-sim",
      "content-type": "application/json",
      "x-session-id": tenant,
    },
    body: JSON.stringify({
      model: MODEL,
      max_tokens: 2,
      messages: [{ role: "user", content: `${tenant}: ${"a long shared preamble ".repeat(40)}` }],
    }),
  });
  expect(res.status).toBe(200);
  await res.arrayBuffer();
  return res.headers.get("x-llmgw-replica") ?? "";
}

/**
 * Router 0 meets tenants 0–7 first and router 1 tenants 8–15, each alone; then each router
 * serves the tenants the other met. Returns each tenant's replicas.
 */
async function crossTraffic(
  routers: [RunningRouter, RunningRouter],
  settle: () => Promise<void>,
): Promise<Map<string, Set<string>>> {
  const seen = new Map<string, Set<string>>();
  const send = async (r: 0 | 1, t: number) => {
    const tenant = `tenant-${t}`;
    const replica = await chat(routers[r], tenant);
    seen.set(tenant, (seen.get(tenant) ?? new Set()).add(replica));
  };
  for (let t = 0; t < 8; t++) await send(0, t);
  for (let t = 8; t < 16; t++) await send(1, t);
  await settle();
  for (let t = 0; t < 8; t++) await send(1, t);
  for (let t = 8; t < 16; t++) await send(0, t);
  return seen;
}

describe("routers that tell each other what they sent", () => {
  it("keep every tenant on one replica whichever router it reaches; apart, they split some", async () => {
    const apart = await crossTraffic(await fleet(false), async () => {});
    const split = [...apart.values()].filter((replicas) => replicas.size > 1).length;
    expect(split).toBeGreaterThan(0);
    for (const c of cleanups.splice(0).reverse()) await c();

    const routers = await fleet(true);
    const shared = await crossTraffic(routers, () =>
      // Router 0's 8 dispatches (and first bytes) reached router 1, and the other way round.
      waitFor(
        async () =>
          (
            await Promise.all(
              routers.map((r) =>
                counter(r, "llmgw_router_peer_events_total", {
                  direction: "in",
                  outcome: "applied",
                }),
              ),
            )
          ).every((n) => n >= 16),
        "the peers' events",
      ),
    );
    expect([...shared.values()].filter((replicas) => replicas.size > 1)).toEqual([]);
    expect(
      await counter(routers[0], "llmgw_router_peer_events_total", { outcome: "invalid" }),
    ).toBe(0);
  });

  it("refuses a wrong key, a bad router id and a malformed event, each with its reason", async () => {
    const [router] = await fleet(true);
    const post = (headers: Record<string, string>, body: string) =>
      fetch(`${router.url}${PEER_EVENTS_PATH}`, {
        method: "POST",
        headers: { "content-type": "application/x-ndjson", ...headers },
        body,
      });
    const wrongKey = await post(
      { authorization: "Bearer not-the-key-at-all", "x-llmgw-router-id": "x" },
      "",
    );
    expect([wrongKey.status, await wrongKey.text()]).toEqual([401, "peer key refused\n"]);
    const badId = await post({ authorization: `Bearer ${KEY}`, "x-llmgw-router-id": "a b" }, "");
    expect([badId.status, await badId.text()]).toEqual([400, "bad x-llmgw-router-id\n"]);
    const good = `{"t":"first","replica":"sim-0","prefill":10}\n`;
    const bad = await post(
      { authorization: `Bearer ${KEY}`, "x-llmgw-router-id": "intruder" },
      `${good}{"t":"sent","model":"${MODEL}","replica":"sim-0","prefill":-1}\n${good}`,
    );
    expect(await bad.text()).toBe(
      'line 2: "prefill" must be a whole number of tokens in 0–10000000\n',
    );
    expect(
      await counter(router, "llmgw_router_peer_events_total", {
        direction: "in",
        outcome: "invalid",
      }),
    ).toBe(1);
    // The router still serves, and its peer stream is still up.
    expect(await chat(router, "tenant-after")).toMatch(/^sim-/);
    expect(await counter(router, "llmgw_router_peers_connected", {})).toBe(1);
  });

  it("renews each stream before the peer's request timeout, losing no event", async () => {
    const routers = await fleet(true, 100);
    const events = (r: RunningRouter, direction: string, outcome: string) =>
      counter(r, "llmgw_router_peer_events_total", { direction, outcome });
    // Requests spread over several renewals (one every 100 ms), both ways.
    const deadline = Date.now() + 700;
    for (let i = 0; Date.now() < deadline; i++)
      await chat(routers[i % 2] as RunningRouter, `t-${i % 5}`);
    for (const [from, to] of [
      [0, 1],
      [1, 0],
    ] as const) {
      const sent = await events(routers[from], "out", "sent");
      expect(sent).toBeGreaterThan(10);
      await waitFor(
        async () => (await events(routers[to], "in", "applied")) >= sent,
        "every event",
      );
      expect(await events(routers[from], "out", "dropped")).toBe(0);
    }
    expect(await counter(routers[0], "llmgw_router_peers_connected", {})).toBe(1);
  });

  it("repeats an empty in-flight announcement, so one dropped on a backed-up stream is not final", async () => {
    // A peer that stops reading: the sender's stream backs up and it drops events, the end of
    // its last request and its first "nothing in flight" among them.
    let receiving: IncomingMessage | undefined;
    let lines = "";
    let dropped = 0;
    const server = createHttpServer((req, res) => {
      receiving = req;
      req.pause();
      res.writeHead(200).flushHeaders();
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const exchange = startPeerExchange({
      routerId: "sender",
      peers: [`http://127.0.0.1:${(server.address() as AddressInfo).port}`],
      key: KEY,
      apply() {},
      gone() {},
      count: (_, outcome) => {
        if (outcome === "dropped") dropped += 1;
      },
    });
    cleanups.push(async () => {
      exchange.close();
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    });
    await waitFor(() => exchange.connected() === 1, "the stream");
    const chain = Array.from({ length: 4096 }, (_, i) => 2 ** 40 + i);
    exchange.sent(MODEL, { replicaId: "r1", prefillTokens: 1 });
    // Megabytes the peer does not read: the socket's buffers fill and the sender drops events.
    while (dropped === 0) {
      for (let i = 0; i < 50; i++)
        exchange.sent(MODEL, { replicaId: "r2", prefillTokens: 1, chain });
      for (let i = 0; i < 50; i++) exchange.ended("r2");
      await new Promise((r) => setTimeout(r, 5));
    }
    exchange.ended("r1");
    // An announcement of nothing in flight falls while the stream is backed up.
    await new Promise((r) => setTimeout(r, 1_200));
    (receiving as IncomingMessage).setEncoding("utf8");
    (receiving as IncomingMessage).on("data", (t: string) => {
      lines += t;
    });
    (receiving as IncomingMessage).resume();
    await waitFor(
      () => lines.split("\n").some((l) => l === '{"t":"inflight","replicas":{}}'),
      "an empty announcement after the stream drained",
    );
  });

  it("answers 405 to other methods, refuses a line too long across chunks and 503 once stopping", async () => {
    const gone: string[] = [];
    const applied: string[] = [];
    const exchange = startPeerExchange({
      routerId: "receiver",
      peers: [],
      key: KEY,
      apply: (peer, event) => applied.push(`${peer} ${event.t}`),
      gone: (peer) => gone.push(peer),
    });
    const server = createHttpServer((req, res) => exchange.handle(req, res));
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    cleanups.push(async () => {
      exchange.close();
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    });
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}${PEER_EVENTS_PATH}`;
    const headers = { authorization: `Bearer ${KEY}`, "x-llmgw-router-id": "sender" };

    const get = await fetch(url, { headers });
    expect([get.status, await get.text()]).toEqual([405, "POST only\n"]);

    // One good event, then a line that never ends, written in pieces under the limit each.
    const answer = new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = request(url, { method: "POST", headers }, (res) => {
        let body = "";
        res.setEncoding("utf8").on("data", (c: string) => {
          body += c;
        });
        res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
        res.on("error", reject);
      });
      req.on("error", () => {}); // the receiver cuts the upload short
      req.write('{"t":"end","replica":"sim-0"}\n');
      const piece = "x".repeat(16 * 1024);
      let written = 0;
      const more = () => {
        while (written <= MAX_PEER_LINE_BYTES && !req.destroyed) {
          written += piece.length;
          if (!req.write(piece)) return void req.once("drain", more);
        }
      };
      more();
    });
    expect(await answer).toEqual({
      status: 200,
      body: `line 2: an event longer than ${MAX_PEER_LINE_BYTES} bytes\n`,
    });
    expect(applied).toEqual(["sender end"]);
    await waitFor(() => gone.length === 1, "the peer's last stream to close");
    expect(gone).toEqual(["sender"]);

    exchange.close();
    const stopping = await fetch(url, { method: "POST", headers, body: "" });
    expect([stopping.status, await stopping.text()]).toEqual([503, "this router is stopping\n"]);
  });
});
