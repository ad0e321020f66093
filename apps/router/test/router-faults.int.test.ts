/**
 * The router under failure and load, against real upstream servers on loopback: refused
 * connections, engines dying mid-stream, full queues, expired waits, and prefix affinity that
 * holds while a replica has room and yields when it does not.
 */

import {
  createServer,
  request as httpRequest,
  type IncomingMessage,
  type ServerResponse,
} from "node:http";
import { type AddressInfo, connect, type Socket } from "node:net";
import type { RoutingPolicy } from "@llmgw/router";
import { createRecordingRouterMetrics, type RecordingRouterMetrics } from "@llmgw/router/testing";
import OpenAI from "openai";
import { afterEach, describe, expect, it } from "vitest";
import type { RouterServiceOptions, RunningRouter } from "../src/index.js";
import { refusedPort, startFakeEngine, waitFor } from "./router-fake-engine.js";
import { type ReplicaSpec, routingSnapshot, startFedRouter } from "./routing-fixture.js";

type OpenAIError = { error: { message: string; type: string; code: string; param: string | null } };

const KEY = "sk-faults";
const cleanups: (() => Promise<void>)[] = [];

afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function engine(
  name: string,
  options: { gated?: boolean; dieAfterChunks?: number; chunks?: number; apiKey?: string } = {},
) {
  const e = await startFakeEngine({ name, ...options });
  cleanups.push(() => e.close());
  return e;
}

async function routerFor(
  replicas: ReplicaSpec[],
  options: RouterServiceOptions = {},
  policy: RoutingPolicy = "llmgw",
): Promise<{ router: RunningRouter; metrics: RecordingRouterMetrics; client: OpenAI }> {
  const metrics = createRecordingRouterMetrics();
  const { router } = await startFedRouter({
    snapshot: routingSnapshot({
      models: { m: { policy, replicas } },
      keys: { [KEY]: { id: "k", name: "k" } },
    }),
    metrics,
    router: { analyzer: { pool: false }, ...options },
  });
  cleanups.push(() => router.close());
  const client = new OpenAI({ apiKey: KEY, baseURL: `${router.url}/v1`, maxRetries: 0 });
  return { router, metrics, client };
}

const ready = (id: string, baseUrl: string, capacity = 8): ReplicaSpec => ({
  id,
  baseUrl,
  capacity,
});

function send(router: RunningRouter, content: string, extra: Record<string, unknown> = {}) {
  return fetch(`${router.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "m", messages: [{ role: "user", content }], ...extra }),
  });
}

/** A plain HTTP upstream on loopback, closed after the test; its base URL. */
async function upstreamServer(
  handle: (req: IncomingMessage, res: ServerResponse) => void,
  beforeClose?: () => void,
): Promise<string> {
  const server = createServer(handle);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  cleanups.push(async () => {
    beforeClose?.();
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

/**
 * A raw connection that sends a chat completion's head announcing `length` body bytes, then
 * `sent` of them; destroyed after the test.
 */
async function rawPost(router: RunningRouter, length: number, sent: string): Promise<Socket> {
  const socket = connect({ host: "127.0.0.1", port: router.port });
  socket.on("error", () => {});
  cleanups.push(async () => {
    socket.destroy();
  });
  await new Promise<void>((resolve) => socket.once("connect", () => resolve()));
  await new Promise<void>((resolve) =>
    socket.write(
      `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nContent-Type: application/json\r\nContent-Length: ${length}\r\n\r\n${sent}`,
      () => resolve(),
    ),
  );
  return socket;
}

describe("router faults", () => {
  it("tries a replica whose engine refused the router's key (a restart) again elsewhere", async () => {
    // `stale` restarted with a new key; its route still carries the old one until a heartbeat.
    const stale = await engine("stale", { apiKey: "sk-new" });
    const fresh = await engine("fresh", { apiKey: "sk-fresh" });
    const { router, metrics } = await routerFor(
      [
        { ...ready("stale", stale.url), apiKey: "sk-old" },
        { ...ready("fresh", fresh.url), apiKey: "sk-fresh" },
      ],
      {},
      "round-robin",
    );
    for (let i = 0; i < 6; i++) {
      const response = await send(router, `hello ${i}`);
      expect(response.status).toBe(200);
      expect(response.headers.get("x-llmgw-replica")).toBe("fresh");
      await response.text();
    }
    expect(stale.received.length).toBeGreaterThan(0);
    expect(fresh.received.length).toBe(6);
    expect(metrics.of("upstreamError")).toContainEqual(["m", "stale", "key_refused"]);
  });

  it("answers 503, not the engine's 401, when the only replica refused the router's key", async () => {
    const stale = await engine("stale", { apiKey: "sk-new" });
    const { router } = await routerFor([{ ...ready("stale", stale.url), apiKey: "sk-old" }]);
    const response = await send(router, "hello");
    expect(response.status).toBe(503);
    expect(response.headers.get("retry-after")).toBe("1");
    const body = (await response.json()) as { error: { code: string; message: string } };
    expect(body.error.code).toBe("upstream_key_refused");
    expect(body.error.message).toBe(
      "replica stale refused the router's engine key; it restarted and its new key has not arrived yet",
    );
    expect(stale.received).toHaveLength(1);
  });

  it("retries a refused connection once on the next replica and opens the circuit", async () => {
    const live = await engine("live");
    const deadPort = await refusedPort();
    const { router, metrics } = await routerFor(
      [ready("dead", `http://127.0.0.1:${deadPort}`), ready("live", live.url)],
      { picker: { health: { failureThreshold: 2, cooldownMs: 60_000 } } },
      "round-robin",
    );
    const served: (string | null)[] = [];
    for (let i = 0; i < 6; i++) {
      const res = await send(router, `q${i}`);
      expect(res.status).toBe(200);
      served.push(res.headers.get("x-llmgw-replica"));
      await res.arrayBuffer();
    }
    expect(served).toEqual(Array(6).fill("live"));
    expect(metrics.of("upstreamError")).toContainEqual(["m", "dead", "connect"]);
    expect(metrics.of("circuitState")).toContainEqual(["m", "dead", "open"]);
    // Once the circuit is open the dead replica is skipped: exactly two attempts hit it.
    expect(metrics.of("retry")).toHaveLength(2);
    expect(live.received).toHaveLength(6);
  });

  it("routes to a half-open replica again once its probe answers, though the probe streams on", async () => {
    // Three 500s open the circuit; the probe after the cooldown is a stream that goes on.
    let failures = 3;
    let endProbe: (() => void) | undefined;
    const url = await upstreamServer(
      (req, res) => {
        req.resume();
        req.on("end", () => {
          if (failures > 0) {
            failures--;
            res.writeHead(500, { "content-type": "application/json" });
            res.end('{"error":{"message":"boom"}}');
          } else if (endProbe === undefined) {
            res.writeHead(200, { "content-type": "text/event-stream" });
            res.write('data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n');
            endProbe = () => res.end("data: [DONE]\n\n");
          } else {
            res.writeHead(200, { "content-type": "application/json" });
            res.end('{"choices":[{"index":0,"message":{"role":"assistant","content":"b"}}]}');
          }
        });
      },
      () => endProbe?.(),
    );
    const { router } = await routerFor([ready("r0", url)], {
      picker: { health: { failureThreshold: 3, cooldownMs: 100 } },
    });
    for (let i = 0; i < 3; i++) expect((await send(router, "x")).status).toBe(500);
    expect((await send(router, "x")).status).toBe(503);
    // 503s until the cooldown ends; then the probe.
    let probe = await send(router, "x", { stream: true });
    for (const deadline = Date.now() + 5000; probe.status === 503 && Date.now() < deadline; ) {
      await probe.text();
      await new Promise((r) => setTimeout(r, 20));
      probe = await send(router, "x", { stream: true });
    }
    expect(probe.status).toBe(200);
    const reader = probe.body!.getReader();
    await reader.read(); // its first event: the replica answered
    const during = await send(router, "y");
    expect(during.status).toBe(200);
    await during.text();
    endProbe?.();
    await reader.cancel();
  });

  it("ends a stream its client stopped reading, and frees the engine's request and the slot", async () => {
    // An engine that streams 64 KiB events as fast as it may, for ever.
    let open = 0;
    const url = await upstreamServer((req, res) => {
      req.resume();
      req.on("end", () => {
        open++;
        res.on("close", () => open--);
        res.writeHead(200, { "content-type": "text/event-stream" });
        const event = `data: ${JSON.stringify({ x: "a".repeat(64 * 1024) })}\n\n`;
        const pump = (): void => {
          while (!res.destroyed) if (!res.write(event)) return void res.once("drain", pump);
        };
        pump();
      });
    });
    const { router, metrics } = await routerFor([ready("r0", url, 1)], {
      clientStallTimeoutMs: 500,
    });
    const body = JSON.stringify({
      model: "m",
      stream: true,
      messages: [{ role: "user", content: "hi" }],
    });
    const socket = await rawPost(router, body.length, body);
    socket.pause(); // never read: the window closes once the buffers fill
    await waitFor(() => open === 1, 5000, "the engine to be streaming");
    // Cut once nothing was read for 500 ms: the engine's request ends, the slot is free.
    await waitFor(() => open === 0, 5000, "the stalled stream to be cut");
    const next = await send(router, "hi", { stream: false });
    expect(next.status).toBe(200);
    expect(metrics.of("clientDisconnect")).toContainEqual(["m", "streaming"]);
  });

  it("pauses and resumes the engine for a slow client, and loses no byte", async () => {
    // ~3 MB of JSON to a client that reads nothing for 300 ms: the router's writes report
    // backpressure, so it pauses the upstream and must resume it on drain or this never ends.
    const big = await engine("big", { chunks: 400_000 });
    const { router } = await routerFor([ready("big-0", big.url)]);
    const body = JSON.stringify({ model: "m", messages: [{ role: "user", content: "long" }] });
    const received = await new Promise<Buffer>((resolve, reject) => {
      const req = httpRequest(
        `${router.url}/v1/chat/completions`,
        {
          method: "POST",
          headers: {
            authorization: `Bearer ${KEY}`,
            "content-type": "application/json",
            "content-length": Buffer.byteLength(body),
          },
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.pause();
          setTimeout(() => {
            res.on("data", (c: Buffer) => chunks.push(c));
            res.on("end", () => resolve(Buffer.concat(chunks)));
            res.resume();
          }, 300);
        },
      );
      req.on("error", reject);
      req.end(body);
    });
    const sent = Buffer.concat(big.written[0] ?? []);
    expect(sent.length).toBeGreaterThan(2_000_000);
    expect(received.equals(sent)).toBe(true);
  });

  it("tries the only replica again on a new connection when the engine closed the one it used", async () => {
    // What llama.cpp's server does after a streamed answer: it closes the connection without
    // `Connection: close`, and the next request sent on it meets a reset. Here the engine
    // resets every second request of a connection, before answering.
    const served = new WeakSet<Socket>();
    let resets = 0;
    let answered = 0;
    const closer = createServer((req, res) => {
      req.resume();
      req.on("end", () => {
        if (served.has(req.socket)) {
          resets++;
          req.socket.destroy();
          return;
        }
        served.add(req.socket);
        answered++;
        res.writeHead(200, { "content-type": "application/json" });
        res.end(
          JSON.stringify({
            id: `c${answered}`,
            object: "chat.completion",
            choices: [{ index: 0, message: { role: "assistant", content: "hi" } }],
            usage: { prompt_tokens: 3, completion_tokens: 1, total_tokens: 4 },
          }),
        );
      });
    });
    await new Promise<void>((resolve) => closer.listen(0, "127.0.0.1", resolve));
    cleanups.push(() => new Promise<void>((resolve) => closer.close(() => resolve())));
    const { port } = closer.address() as AddressInfo;
    const { router, metrics } = await routerFor([ready("only", `http://127.0.0.1:${port}`)]);
    for (let i = 0; i < 3; i++) {
      const res = await send(router, `q${i}`);
      expect(res.status, await res.clone().text()).toBe(200);
      await res.arrayBuffer();
    }
    // Requests 2 and 3 each met a closed connection first, then went through on a new one.
    expect(resets).toBe(2);
    expect(answered).toBe(3);
    expect(metrics.of("retry")).toHaveLength(2);
    expect(metrics.of("upstreamError")).toContainEqual(["m", "only", "reset_before_response"]);
  });

  it("answers 502 when every replica refuses", async () => {
    const { router } = await routerFor([ready("dead", `http://127.0.0.1:${await refusedPort()}`)]);
    const res = await send(router, "anyone?");
    expect(res.status).toBe(502);
    expect(((await res.json()) as OpenAIError).error).toMatchObject({
      code: "upstream_unavailable",
    });
  });

  it("refuses a routing delta with a replica whose URL does not parse, and keeps serving", async () => {
    // The handler opens a pool per replica origin: a URL that does not parse must never reach
    // it. The routing state refuses the whole message; the router keeps what it held.
    const good = await engine("good");
    const events: Readonly<Record<string, unknown>>[] = [];
    const { router, feed } = await startFedRouter({
      snapshot: routingSnapshot({
        models: { m: { replicas: [ready("good", good.url, 1)] } },
        keys: { [KEY]: { id: "k", name: "k" } },
      }),
      router: { analyzer: { pool: false } },
      log: (event) => events.push(event),
    });
    cleanups.push(() => router.close());
    feed.push({
      kind: "delta",
      epoch: "epoch-test",
      version: 2,
      upsertedModels: [],
      removedModels: [],
      upsertedReplicas: [
        {
          id: "bad",
          model: "m",
          deployment: "m",
          baseUrl: "not a url",
          state: "ready",
          capacity: 1,
        },
      ],
      removedReplicas: [],
      upsertedKeys: [],
      removedKeys: [],
      sentAtMs: Date.now(),
    });
    expect(events.find((e) => e.event === "routing_message_refused")).toMatchObject({
      code: "LLMGW_ROUTER_STREAM_INVALID",
      message: expect.stringContaining("baseUrl"),
    });
    expect(router.runtime.readiness()).toMatchObject({ ready: true, version: 1 });
    for (let i = 0; i < 2; i++) {
      const res = await send(router, `try ${i}`);
      expect(res.status).toBe(200);
      expect(res.headers.get("x-llmgw-replica")).toBe("good");
      await res.arrayBuffer();
    }
  });

  it("ends a stream with an SSE error event when the engine dies mid-stream", async () => {
    const dying = await engine("dying", { dieAfterChunks: 2 });
    const { router, metrics, client } = await routerFor([ready("dying", dying.url)]);
    const res = await send(router, "tell me", { stream: true });
    expect(res.status).toBe(200);
    const text = await res.text(); // resolves: the client is not left hanging
    const events = text.split("\n\n").filter((e) => e !== "");
    expect(events).toHaveLength(3);
    expect(events[0]).toContain("tok0");
    expect(events[1]).toContain("tok1");
    expect(JSON.parse((events[2] as string).replace(/^data: /, ""))).toEqual({
      error: {
        message: expect.stringMatching(
          /^replica dying failed mid-stream \(.+\); the response is incomplete$/,
        ),
        type: "upstream_error",
        code: "upstream_unavailable",
        param: null,
      },
    });
    expect(metrics.of("upstreamError")).toContainEqual(["m", "dying", "reset_mid_body"]);
    const stream = await client.chat.completions.create({
      model: "m",
      messages: [{ role: "user", content: "again" }],
      stream: true,
    });
    const seen: string[] = [];
    await expect(
      (async () => {
        for await (const chunk of stream) seen.push(chunk.choices[0]?.delta.content ?? "");
      })(),
    ).rejects.toThrow(/failed mid-stream/);
    expect(seen).toEqual(["tok0 ", "tok1 "]);
  });

  it("queues beyond capacity, answers 429 with Retry-After when the queue is full, then drains", async () => {
    const slow = await engine("slow", { gated: true });
    const { router, metrics } = await routerFor([ready("slow", slow.url, 1)], {
      maxQueueLength: 1,
      queueTimeoutMs: 30_000,
    });
    const first = send(router, "one");
    await waitFor(() => slow.held() === 1, 5000, "the first request to reach the engine");
    const second = send(router, "two");
    await waitFor(
      () => metrics.of("queueDepth").some((a) => a[1] === 1),
      5000,
      "the second to queue",
    );
    const third = await send(router, "three");
    expect(third.status).toBe(429);
    expect(third.headers.get("retry-after")).toBe("1");
    expect(((await third.json()) as OpenAIError).error.code).toBe("queue_full");
    slow.openGate();
    const [r1, r2] = await Promise.all([first, second]);
    expect([r1.status, r2.status]).toEqual([200, 200]);
    expect(metrics.of("rejected")).toContainEqual(["m", "queue_full", undefined]);
    expect(metrics.of("queueWait")).toHaveLength(1);
  });

  it("answers 429 queue_timeout when the wait expires", async () => {
    const slow = await engine("slow", { gated: true });
    const { router } = await routerFor([ready("slow", slow.url, 1)], { queueTimeoutMs: 150 });
    const first = send(router, "one");
    await waitFor(() => slow.held() === 1, 5000, "the first request to reach the engine");
    const second = await send(router, "two");
    expect(second.status).toBe(429);
    expect(Number(second.headers.get("retry-after"))).toBeGreaterThanOrEqual(1);
    expect(((await second.json()) as OpenAIError).error.code).toBe("queue_timeout");
    slow.openGate();
    expect((await first).status).toBe(200);
  });
});

describe("prefix affinity", () => {
  const system = "You are the support bot of ACME. Policy: be kind, cite sources. ".repeat(130);
  const ask = (router: RunningRouter, question: string) =>
    fetch(`${router.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
      body: JSON.stringify({
        model: "m",
        messages: [
          { role: "system", content: system },
          { role: "user", content: question },
        ],
      }),
    });

  it("keeps a shared system prompt on one replica while it has room, spreads when it is loaded", async () => {
    const a = await engine("a", { gated: true });
    const b = await engine("b", { gated: true });
    const { router, metrics } = await routerFor([ready("a", a.url, 4), ready("b", b.url, 4)]);
    a.openGate();
    b.openGate();
    const sequential: (string | null)[] = [];
    for (let i = 0; i < 6; i++) {
      const res = await ask(router, `question ${i}`);
      sequential.push(res.headers.get("x-llmgw-replica"));
      await res.arrayBuffer();
    }
    expect(new Set(sequential).size).toBe(1);
    const decisions = metrics
      .of("decision")
      .map((x) => x[0] as { prefixBlocks: number; chainLength: number });
    expect(decisions[0]?.chainLength).toBeGreaterThanOrEqual(8);
    expect(decisions.slice(1).every((d) => d.prefixBlocks >= 8)).toBe(true);

    // Now a burst of 6 held requests: the favoured replica gives up its claim at 3/4 busy.
    a.closeGate();
    b.closeGate();
    const burst = Array.from({ length: 6 }, (_, i) => ask(router, `burst ${i}`));
    await waitFor(() => a.held() + b.held() === 6, 5000, "the burst to reach the engines");
    const [favoured, other] = sequential[0] === "a" ? [a, b] : [b, a];
    expect(favoured.held()).toBe(3);
    expect(other.held()).toBe(3);
    a.openGate();
    b.openGate();
    const statuses = (await Promise.all(burst)).map((r) => r.status);
    expect(statuses).toEqual(Array(6).fill(200));
  });

  it.each(["round-robin", "least-loaded"] as const)("%s ignores the prefix", async (policy) => {
    const a = await engine("a");
    const b = await engine("b");
    const { router } = await routerFor([ready("a", a.url, 4), ready("b", b.url, 4)], {}, policy);
    const served: (string | null)[] = [];
    for (let i = 0; i < 4; i++) {
      const res = await ask(router, `q ${i}`);
      served.push(res.headers.get("x-llmgw-replica"));
      await res.arrayBuffer();
    }
    expect(new Set(served)).toEqual(new Set(["a", "b"]));
  });
});

describe("router: clients that go away while sending", () => {
  /** A router whose log and metrics the test reads, with a short request deadline. */
  async function watchedRouter() {
    const metrics = createRecordingRouterMetrics();
    const events: Readonly<Record<string, unknown>>[] = [];
    const { router } = await startFedRouter({
      snapshot: routingSnapshot({ keys: { [KEY]: { id: "k", name: "k" } } }),
      metrics,
      log: (event) => events.push(event),
      router: { analyzer: { pool: false } },
      listener: { headersTimeoutMs: 300, requestTimeoutMs: 600 },
    });
    cleanups.push(() => router.close());
    return { router, metrics, events };
  }

  /** Sends a head announcing 1,000 bytes and a first few; returns the socket. */
  const partialUpload = (router: RunningRouter): Promise<Socket> =>
    rawPost(router, 1000, '{"model":');

  it.each([
    ["hangs up", (socket: Socket) => setTimeout(() => socket.destroy(), 50)],
    ["is too slow for the request deadline", () => {}],
  ])("a client that %s is counted as gone, not logged as a router fault", async (_name, leave) => {
    const { router, metrics, events } = await watchedRouter();
    const socket = await partialUpload(router);
    leave(socket);
    await waitFor(
      () => events.some((e) => e.event === "client_closed"),
      5000,
      "the router to see the client go",
    );
    expect(events.filter((e) => e.event === "internal_error")).toEqual([]);
    expect(events.find((e) => e.event === "client_closed")).toMatchObject({
      phase: "request",
      code: "ECONNRESET",
    });
    expect(metrics.of("clientDisconnect")).toEqual([["", "before_first_byte"]]);
  });

  it("a client gone while its large body is analysed is neither queued nor dispatched", async () => {
    const upstream = await engine("e", { chunks: 400 });
    const metrics = createRecordingRouterMetrics();
    const events: Readonly<Record<string, unknown>>[] = [];
    const { router } = await startFedRouter({
      snapshot: routingSnapshot({
        models: { m: { replicas: [ready("r0", upstream.url, 1)] } },
        keys: { [KEY]: { id: "k", name: "k" } },
      }),
      metrics,
      log: (event) => events.push(event),
      // Bodies over 2 KiB are analysed in the worker pool, off the event loop.
      router: { analyzer: { inlineThresholdBytes: 2048, pool: { minThreads: 1, maxThreads: 1 } } },
    });
    cleanups.push(() => router.close());
    const body = JSON.stringify({
      model: "m",
      stream: true,
      messages: [{ role: "user", content: "word ".repeat(800_000) }],
    });
    // The whole body is sent, then the client hangs up while the router is analysing it.
    const socket = await rawPost(router, body.length, body);
    socket.destroy();
    await waitFor(
      () => events.some((e) => e.event === "client_closed"),
      10_000,
      "the router to see the client go",
    );
    expect(events.find((e) => e.event === "client_closed")).toMatchObject({ phase: "analysis" });
    expect(upstream.received).toEqual([]);
    expect(router.handler.inFlight("r0")).toBe(0);
    // Its capacity of one is free: the next request is answered, not queued behind a ghost.
    const next = await send(router, "hi");
    expect(next.status).toBe(200);
    await next.text();
    expect(upstream.received).toHaveLength(1);
  });
});
