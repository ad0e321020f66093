/**
 * Exact usage: every answered request is charged the engine's own counts, streams too (the
 * router asks for the usage event a client left out, and takes it out again so the client
 * gets the bytes it asked for), and sent to the control plane in batches that survive the
 * router's restart and count once.
 */
import { mkdtemp, readdir, rm } from "node:fs/promises";
import { createServer, request as httpRequest } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { type RunningEngineSim, startEngineSim } from "@llmgw/engine-sim";
import type { UsageEntry } from "@llmgw/router";
import { createManualRoutingFeed } from "@llmgw/router/testing";
import OpenAI from "openai";
import { afterEach, describe, expect, it } from "vitest";
import { type RunningRouter, startRouter } from "../src/index.js";
import { type FakeEngine, type FakeEngineOptions, startFakeEngine } from "./router-fake-engine.js";
import { routingSnapshot, startFedRouter } from "./routing-fixture.js";

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const KEYS = {
  "sk-a": { id: "key-a", name: "a" },
  "sk-b": { id: "key-b", name: "b" },
  "sk-c": { id: "key-c", name: "c" },
};

/** Sums of what the batches sent so far say, per key. */
function totals(batches: readonly { records: readonly UsageEntry[] }[]) {
  const out = new Map<
    string,
    {
      requests: number;
      prompt: number;
      cached: number;
      cachedReported: number;
      completion: number;
      gpuMs: number;
      estimated: number;
      refused: number;
    }
  >();
  for (const b of batches) {
    for (const r of b.records) {
      const t = out.get(r.keyId) ?? {
        requests: 0,
        prompt: 0,
        cached: 0,
        cachedReported: 0,
        completion: 0,
        gpuMs: 0,
        estimated: 0,
        refused: 0,
      };
      t.requests += r.requests;
      t.prompt += r.promptTokens;
      t.cached += r.cachedTokens;
      t.cachedReported += r.cachedReported;
      t.completion += r.completionTokens;
      t.gpuMs += r.gpuMs;
      t.estimated += r.estimatedRequests;
      t.refused += r.refusedUsage;
      out.set(r.keyId, t);
    }
  }
  return out;
}

/** Waits until `check` holds, polling every 20 ms, for at most `ms`. */
async function until(check: () => boolean | Promise<boolean>, ms = 5_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error("condition not met in time");
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function fakeSetup(
  options: Pick<FakeEngineOptions, "usage" | "dieAfterChunks" | "lineEnd"> = {},
) {
  const engine = await startFakeEngine({ name: "e", chunks: 5, ...options });
  cleanups.push(() => engine.close());
  const { router, feed } = await startFedRouter({
    snapshot: routingSnapshot({
      models: { m: { replicas: [{ id: "r0", baseUrl: engine.url, gpus: 2 }] } },
      keys: KEYS,
    }),
    router: { analyzer: { pool: false } },
    usageReportIntervalMs: 20,
  });
  cleanups.push(() => router.close());
  return { engine, router, feed };
}

/** The value of one series in the router's scrape (`name` with its labels, if any). */
async function scraped(router: RunningRouter, series: string): Promise<number | undefined> {
  const line = (await router.registry.metrics())
    .split("\n")
    .find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

/** The URL of a loopback port nothing listens on: every connection to it is refused. */
async function refusingUrl(): Promise<string> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return `http://127.0.0.1:${port}`;
}

/** A plain HTTP server on loopback for the test's duration; resolves with its URL. */
async function serve(handle: Parameters<typeof createServer>[1]): Promise<string> {
  const server = createServer(handle);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  cleanups.push(async () => {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

async function post(router: RunningRouter, key: string, body: Record<string, unknown>) {
  const res = await fetch(`${router.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }], ...body }),
  });
  return { status: res.status, text: await res.text() };
}

const engineBytes = (engine: FakeEngine, i: number): string =>
  Buffer.concat(engine.written[i] ?? []).toString();

describe("router: exact usage of streams", () => {
  it("asks the engine for a stream's usage and gives the client exactly the bytes it asked for", async () => {
    const { engine, router, feed } = await fakeSetup();
    const asked = await post(router, "sk-a", { stream: true });
    expect(asked.status).toBe(200);
    // The engine was asked for usage; the client did not ask and does not get it.
    expect(engine.received[0]?.body.stream_options).toEqual({ include_usage: true });
    const sent = engineBytes(engine, 0);
    expect(sent).toContain('"usage":');
    expect(asked.text).not.toContain('"usage"');
    const usageEvent = sent.split("\n\n").find((e) => e.includes('"usage"'));
    expect(asked.text).toBe(sent.replace(`${usageEvent}\n\n`, ""));
    expect(asked.text.endsWith("data: [DONE]\n\n")).toBe(true);

    // A client that asks gets the engine's bytes unchanged, usage event included.
    const own = await post(router, "sk-a", {
      stream: true,
      stream_options: { include_usage: true },
    });
    expect(own.text).toBe(engineBytes(engine, 1));
    expect(engine.received[1]?.body.stream_options).toEqual({ include_usage: true });

    // Any other stream_options is left alone: nothing added, the stream charged an estimate.
    const other = await post(router, "sk-b", { stream: true, stream_options: {} });
    expect(other.text).toBe(engineBytes(engine, 2));
    expect(engine.received[2]?.body.stream_options).toEqual({});

    await until(() => (totals(feed.usageBatches).get("key-b")?.requests ?? 0) === 1);
    await until(() => (totals(feed.usageBatches).get("key-a")?.requests ?? 0) === 2);
    const t = totals(feed.usageBatches);
    expect(t.get("key-a")).toMatchObject({ prompt: 14, completion: 10, estimated: 0, refused: 0 });
    // Five content events streamed, no usage: charged the estimate of the prompt and what
    // was streamed, and flagged.
    expect(t.get("key-b")).toMatchObject({ completion: 4, estimated: 1, refused: 0 });
    // Two GPUs held for each request's duration: a share, more than nothing.
    expect(t.get("key-a")?.gpuMs).toBeGreaterThan(0);
  });

  it.each([
    ["LF", "\n"],
    ["CRLF", "\r\n"],
    ["CR", "\r"],
  ] as const)(
    "charges a stream cut short what it streamed, flagged as estimated (%s line ends)",
    async (_name, lineEnd) => {
      const { router, feed } = await fakeSetup({ dieAfterChunks: 3, lineEnd });
      const cut = await post(router, "sk-a", { stream: true });
      expect(cut.status).toBe(200);
      expect(cut.text).toContain("failed mid-stream");
      await until(() => (totals(feed.usageBatches).get("key-a")?.requests ?? 0) === 1);
      expect(totals(feed.usageBatches).get("key-a")).toMatchObject({
        completion: 1,
        estimated: 1,
        refused: 0,
      });
    },
  );

  it.each([
    ["negative", '{"prompt_tokens":-3,"completion_tokens":5}'],
    ["NaN", '{"prompt_tokens":NaN,"completion_tokens":5}'],
    ["1e30", '{"prompt_tokens":7,"completion_tokens":1e30}'],
    ["absurd", '{"prompt_tokens":7,"completion_tokens":99999999}'],
  ])("refuses and counts %s usage from an engine, storing none of it", async (_name, usage) => {
    const { router, feed } = await fakeSetup({ usage });
    const answer = await post(router, "sk-a", {});
    expect(answer.status).toBe(200);
    await until(() => (totals(feed.usageBatches).get("key-a")?.requests ?? 0) === 1);
    const t = totals(feed.usageBatches).get("key-a");
    expect(t).toMatchObject({ refused: 1, estimated: 1, completion: 0 });
    expect(t?.prompt).toBeLessThan(100);
  });

  it("counts missing usage as estimated, not refused", async () => {
    const { router, feed } = await fakeSetup({ usage: "null" });
    await post(router, "sk-a", {});
    await until(() => (totals(feed.usageBatches).get("key-a")?.requests ?? 0) === 1);
    expect(totals(feed.usageBatches).get("key-a")).toMatchObject({ refused: 0, estimated: 1 });
  });
});

describe("router: usage of a request an engine held but never answered", () => {
  it("charges a headers timeout as a stream cut before its first chunk, with the GPU-seconds it held", async () => {
    // Accepts every request and never answers: queued or prefilling, as far as the router knows.
    const hung = await startEngineSim({
      model: "m",
      port: 0,
      warmupSeconds: 0,
      faults: { hangAfterRequests: 0 },
    });
    cleanups.push(() => hung.close());
    // Answers a stream's head, then closes before its first chunk: what such a cut is charged.
    const cutServer = createServer((req, res) => {
      req.resume();
      req.on("end", () => {
        res.writeHead(200, { "content-type": "text/event-stream" });
        res.flushHeaders();
        setTimeout(() => res.socket?.destroy(), 20);
      });
    });
    await new Promise<void>((resolve) => cutServer.listen(0, "127.0.0.1", resolve));
    cleanups.push(async () => {
      cutServer.closeAllConnections();
      await new Promise<void>((resolve) => cutServer.close(() => resolve()));
    });
    const cutUrl = `http://127.0.0.1:${(cutServer.address() as AddressInfo).port}`;
    const headersTimeoutMs = 300;
    const { router, feed } = await startFedRouter({
      snapshot: routingSnapshot({
        models: {
          m: { replicas: [{ id: "hung", baseUrl: hung.url, gpus: 2 }] },
          n: { replicas: [{ id: "cut", baseUrl: cutUrl, gpus: 2 }] },
        },
        keys: KEYS,
      }),
      router: { analyzer: { pool: false }, upstreamHeadersTimeoutMs: headersTimeoutMs },
      usageReportIntervalMs: 20,
    });
    cleanups.push(() => router.close());

    const started = performance.now();
    const timedOut = await post(router, "sk-a", { model: "m", stream: true });
    const elapsedMs = performance.now() - started;
    expect(timedOut.status).toBe(504);
    expect(JSON.parse(timedOut.text)).toMatchObject({ error: { code: "upstream_timeout" } });
    // Same body length (model names of one letter): the same prompt estimate.
    const cut = await post(router, "sk-b", { model: "n", stream: true });
    expect(cut.status).toBe(200);
    expect(cut.text).toContain("failed mid-stream");

    await until(() => (totals(feed.usageBatches).get("key-a")?.requests ?? 0) === 1);
    await until(() => (totals(feed.usageBatches).get("key-b")?.requests ?? 0) === 1);
    const t = totals(feed.usageBatches);
    const cutShort = t.get("key-b");
    expect(cutShort).toMatchObject({ requests: 1, completion: 0, estimated: 1, refused: 0 });
    expect(cutShort?.prompt).toBeGreaterThan(0);
    const held = t.get("key-a");
    expect(held).toMatchObject({
      requests: 1,
      prompt: cutShort?.prompt,
      cached: 0,
      completion: 0,
      estimated: 1,
      refused: 0,
    });
    // Two GPUs, alone on the replica from dispatch until the router gave up on its headers.
    expect(held?.gpuMs).toBeGreaterThanOrEqual(2 * headersTimeoutMs - 10);
    expect(held?.gpuMs).toBeLessThanOrEqual(2 * elapsedMs + 10);
  });

  it("charges a client that leaves before the head for what the engine held until the abort; one that leaves while queued, nothing", async () => {
    const hung = await startEngineSim({
      model: "m",
      port: 0,
      warmupSeconds: 0,
      faults: { hangAfterRequests: 0 },
    });
    cleanups.push(() => hung.close());
    const { router, feed } = await startFedRouter({
      snapshot: routingSnapshot({
        // Room for one: a second request waits in admission.
        models: { m: { replicas: [{ id: "hung", baseUrl: hung.url, gpus: 2, capacity: 1 }] } },
        keys: KEYS,
      }),
      router: { analyzer: { pool: false } },
      usageReportIntervalMs: 20,
    });
    cleanups.push(() => router.close());
    /** A stream request whose client leaves (closes its connection) when `leave()` is called. */
    const leavable = (key: string) => {
      const body = JSON.stringify({
        model: "m",
        stream: true,
        messages: [{ role: "user", content: "hi" }],
      });
      const req = httpRequest(`${router.url}/v1/chat/completions`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${key}`,
          "content-type": "application/json",
          "content-length": Buffer.byteLength(body),
        },
      });
      req.on("error", () => {}); // destroyed on purpose
      req.end(body);
      return { leave: () => req.destroy() };
    };

    const started = performance.now();
    const held = leavable("sk-a");
    await until(() => router.handler.inFlight("hung") === 1);
    const dispatchedBy = performance.now();
    const queued = leavable("sk-b");
    await until(async () => (await scraped(router, 'llmgw_router_queue_depth{model="m"}')) === 1);
    queued.leave();
    const disconnects = 'llmgw_router_client_disconnects_total{model="m",phase="queued"}';
    await until(async () => (await scraped(router, disconnects)) === 1);
    await new Promise((resolve) => setTimeout(resolve, 300 - (performance.now() - dispatchedBy)));
    held.leave();

    await until(() => (totals(feed.usageBatches).get("key-a")?.requests ?? 0) === 1);
    const elapsedMs = performance.now() - started;
    const t = totals(feed.usageBatches);
    const charged = t.get("key-a");
    // An estimate's cached tokens are unknown, not 0.
    expect(charged).toMatchObject({
      cached: 0,
      cachedReported: 0,
      completion: 0,
      estimated: 1,
      refused: 0,
    });
    expect(charged?.prompt).toBeGreaterThan(0);
    // Two GPUs, alone on the replica from dispatch until the client left.
    expect(charged?.gpuMs).toBeGreaterThanOrEqual(2 * 300 - 10);
    expect(charged?.gpuMs).toBeLessThanOrEqual(2 * elapsedMs + 10);
    // The queued one reached no engine; it left first, so its record would be here by now.
    expect(t.get("key-b")).toBeUndefined();
  });

  it("adds the GPU-seconds of a try an engine dropped after the request was sent to the request's one record; a refused try adds nothing", async () => {
    const heldMs = 200;
    /**
     * Reads each request whole, holds it `heldMs` (queued, prefilling) and closes its connection
     * with no answer, as an engine that crashes does: the first `crashes` requests; it answers
     * the others.
     */
    const crashing = (crashes: number) => {
      let seen = 0;
      return serve((req, res) => {
        req.resume();
        req.on("end", () => {
          seen += 1;
          if (seen <= crashes) {
            setTimeout(() => req.socket.destroy(), heldMs);
            return;
          }
          res.writeHead(200, { "content-type": "application/json" });
          res.end(
            JSON.stringify({
              id: "c1",
              object: "chat.completion",
              choices: [{ index: 0, message: { role: "assistant", content: "hi" } }],
              usage: { prompt_tokens: 3, completion_tokens: 1, total_tokens: 4 },
            }),
          );
        });
      });
    };
    const { router, feed } = await startFedRouter({
      snapshot: routingSnapshot({
        models: {
          m: { replicas: [{ id: "once", baseUrl: await crashing(1), gpus: 2 }] },
          n: { replicas: [{ id: "always", baseUrl: await crashing(Infinity), gpus: 2 }] },
          d: { replicas: [{ id: "dead", baseUrl: await refusingUrl(), gpus: 2 }] },
        },
        keys: KEYS,
      }),
      router: { analyzer: { pool: false } },
      usageReportIntervalMs: 20,
    });
    cleanups.push(() => router.close());

    // Refused on its only replica, twice: it never reached an engine.
    const refused = await post(router, "sk-c", { model: "d" });
    expect(refused.status).toBe(502);
    // Dropped after it was sent, then answered by the retry on a new connection.
    const startedA = performance.now();
    const retried = await post(router, "sk-a", { model: "m" });
    const elapsedA = performance.now() - startedA;
    expect(retried.status).toBe(200);
    // Dropped after it was sent by both tries.
    const lost = await post(router, "sk-b", { model: "n", stream: true });
    expect(lost.status).toBe(502);

    await until(() => (totals(feed.usageBatches).get("key-a")?.requests ?? 0) === 1);
    await until(() => (totals(feed.usageBatches).get("key-b")?.requests ?? 0) === 1);
    const t = totals(feed.usageBatches);
    // One record for the request: the answer's own counts, and the GPU time of both tries.
    const a = t.get("key-a");
    expect(a).toMatchObject({ prompt: 3, completion: 1, estimated: 0, refused: 0 });
    expect(a?.gpuMs).toBeGreaterThanOrEqual(2 * heldMs - 10);
    expect(a?.gpuMs).toBeLessThanOrEqual(2 * elapsedA + 10);
    // No try answered: charged as a stream cut before its first chunk, with both tries' time.
    const b = t.get("key-b");
    expect(b).toMatchObject({ cached: 0, completion: 0, estimated: 1, refused: 0 });
    expect(b?.prompt).toBeGreaterThan(0);
    expect(b?.gpuMs).toBeGreaterThanOrEqual(2 * 2 * heldMs - 20);
    // Sent first: its record, had it one, would be here by now.
    expect(t.get("key-c")).toBeUndefined();
  });
});

describe("router: usage through the official client equals the engine's own counts", () => {
  let engine: RunningEngineSim;

  it("streaming and not, with and without include_usage, cached tokens too", async () => {
    engine = await startEngineSim({
      model: "sim",
      port: 0,
      warmupSeconds: 0,
      timeScale: 100,
      minOutputTokens: 3,
      maxOutputTokens: 12,
      // As llmgw launches vLLM: cached tokens reported, and only when some were cached.
      enablePromptTokensDetails: true,
    });
    cleanups.push(() => engine.close());
    const { router, feed } = await startFedRouter({
      snapshot: routingSnapshot({
        models: { sim: { replicas: [{ id: "s0", baseUrl: engine.url, gpus: 1 }] } },
        keys: KEYS,
      }),
      usageReportIntervalMs: 20,
    });
    cleanups.push(() => router.close());
    const client = new OpenAI({ baseURL: `${router.url}/v1`, apiKey: "sk-a", maxRetries: 0 });
    const expected = { prompt: 0, completion: 0, cached: 0 };
    const prompt = `${"a shared system prompt ".repeat(30)}`;
    for (let i = 0; i < 6; i++) {
      const messages = [{ role: "user" as const, content: `${prompt} question ${i}` }];
      if (i % 3 === 0) {
        const r = await client.chat.completions.create({ model: "sim", messages });
        expected.prompt += r.usage?.prompt_tokens ?? Number.NaN;
        expected.completion += r.usage?.completion_tokens ?? Number.NaN;
        expected.cached += r.usage?.prompt_tokens_details?.cached_tokens ?? 0;
      } else if (i % 3 === 1) {
        const stream = await client.chat.completions.create({
          model: "sim",
          messages,
          stream: true,
          stream_options: { include_usage: true },
        });
        for await (const chunk of stream) {
          if (chunk.usage) {
            expected.prompt += chunk.usage.prompt_tokens;
            expected.completion += chunk.usage.completion_tokens;
            expected.cached += chunk.usage.prompt_tokens_details?.cached_tokens ?? 0;
          }
        }
      } else {
        // No usage asked: the client sees none, and the same request asked again with usage
        // (the sim's answer to a prompt is fixed) says what this one used.
        const stream = await client.chat.completions.create({
          model: "sim",
          messages,
          stream: true,
        });
        let chunks = 0;
        for await (const chunk of stream) {
          chunks += 1;
          expect(chunk.usage ?? undefined).toBeUndefined();
          expect(chunk.choices.length).toBeGreaterThan(0);
        }
        expect(chunks).toBeGreaterThan(1);
        const again = await client.chat.completions.create({ model: "sim", messages });
        expected.prompt += 2 * (again.usage?.prompt_tokens ?? Number.NaN);
        expected.completion += 2 * (again.usage?.completion_tokens ?? Number.NaN);
        // Cached tokens of the unasked stream are not visible to the client: read them from
        // the router's own record below instead (they are the engine's, not an estimate).
        expected.cached += again.usage?.prompt_tokens_details?.cached_tokens ?? 0;
      }
    }
    await until(() => (totals(feed.usageBatches).get("key-a")?.requests ?? 0) === 8);
    const t = totals(feed.usageBatches).get("key-a");
    expect(t).toMatchObject({
      requests: 8,
      prompt: expected.prompt,
      completion: expected.completion,
      // The first answer (nothing cached, so no cached count) came before the engine was seen
      // to report them: unknown. Every later one is known, left out meaning 0.
      cachedReported: 7,
      estimated: 0,
      refused: 0,
    });
    // Every cached count the client saw is in there (absent = none, as the router counts it),
    // and the unseen ones add to it. The shared system prompt is cached after the first.
    expect(expected.cached).toBeGreaterThan(0);
    expect(t?.cached).toBeGreaterThanOrEqual(expected.cached);
    expect(t?.cached).toBeLessThanOrEqual(expected.prompt);
  });
});

describe("router: usage batches survive the router's restart and count once", () => {
  it("keeps unacknowledged batches in the state dir and sends them after a restart", async () => {
    const engine = await startFakeEngine({ name: "e", chunks: 2 });
    cleanups.push(() => engine.close());
    const stateDir = await mkdtemp(path.join(tmpdir(), "llmgw-usage-"));
    cleanups.push(() => rm(stateDir, { recursive: true, force: true }));
    const feed = createManualRoutingFeed();
    feed.push(
      routingSnapshot({
        models: { m: { replicas: [{ id: "r0", baseUrl: engine.url }] } },
        keys: KEYS,
      }),
    );
    feed.refuseUsage = true;
    const start = () =>
      startRouter({
        routing: { feed, routerId: "router-usage", stateDir },
        router: { analyzer: { pool: false } },
        usageReportIntervalMs: 20,
      });
    const batchFiles = async () =>
      (await readdir(path.join(stateDir, "usage")).catch(() => [] as string[])).filter((f) =>
        f.endsWith(".json"),
      );
    const first = await start();
    for (let i = 0; i < 3; i++) expect((await post(first, "sk-a", {})).status).toBe(200);
    // Sealed and kept while the control plane refuses it.
    await until(async () => (await batchFiles()).length > 0);
    await first.close();
    expect(feed.usageBatches).toEqual([]);
    expect((await batchFiles()).length).toBeGreaterThan(0);

    feed.refuseUsage = false;
    const second = await start();
    cleanups.push(() => second.close());
    await until(() => (totals(feed.usageBatches).get("key-a")?.requests ?? 0) >= 3);
    await until(async () => (await batchFiles()).length === 0);
    expect(totals(feed.usageBatches).get("key-a")).toMatchObject({
      requests: 3,
      prompt: 21,
      completion: 6,
    });
    // A batch sent again (its answer lost) is a duplicate: counted once.
    const again = await feed.reportUsage("router-usage", feed.usageBatches[0] as never);
    expect(again.duplicate).toBe(true);
    expect(totals(feed.usageBatches).get("key-a")?.requests).toBe(3);
  });
});

describe("router: usage batches a control plane refuses", () => {
  it("counts the batches set aside, and the requests in them", async () => {
    const { router, feed } = await fakeSetup();
    const report = feed.reportUsage.bind(feed);
    let refusals = 0;
    // A control plane that checked each batch and will never take it (as it refuses one whose
    // records are older than it keeps batch ids for); it answers the empty asks.
    feed.reportUsage = async (routerId, batch) => {
      if (batch.records.length === 0) return report(routerId, batch);
      refusals += 1;
      throw new ConnectError("usage records too old", Code.InvalidArgument);
    };
    const batches = "llmgw_router_usage_batches_refused_total";
    const requests = "llmgw_router_usage_requests_refused_total";
    expect(await scraped(router, batches)).toBe(0);
    expect(await scraped(router, requests)).toBe(0);
    for (let i = 0; i < 3; i++) expect((await post(router, "sk-a", {})).status).toBe(200);
    await until(async () => (await scraped(router, requests)) === 3);
    expect(refusals).toBeGreaterThan(0);
    expect(await scraped(router, batches)).toBe(refusals);
    expect(feed.usageBatches).toEqual([]);
  });
});

describe("router: a deployment whose engines schedule by priority", () => {
  it("gets each request's class as `priority`, over whatever the client wrote", async () => {
    const engine = await startFakeEngine({ name: "e", chunks: 2 });
    cleanups.push(() => engine.close());
    const snapshot = routingSnapshot({
      models: {
        m: { replicas: [{ id: "r0", baseUrl: engine.url }] },
        plain: { replicas: [{ id: "r1", baseUrl: engine.url }] },
      },
      keys: KEYS,
    });
    const { router } = await startFedRouter({
      snapshot: {
        ...snapshot,
        models: snapshot.models.map((m) => (m.name === "m" ? { ...m, enginePriority: true } : m)),
        keys: snapshot.keys.map((k) => (k.id === "key-b" ? { ...k, priority: "batch" } : k)),
      },
      router: { analyzer: { pool: false } },
    });
    cleanups.push(() => router.close());
    expect((await post(router, "sk-a", { priority: -50 })).status).toBe(200);
    expect((await post(router, "sk-b", { stream: true })).status).toBe(200);
    const plain = await fetch(`${router.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: "Bearer sk-b", "content-type": "application/json" },
      body: JSON.stringify({ model: "plain", messages: [{ role: "user", content: "x" }] }),
    });
    expect(plain.status).toBe(200);
    // Standard (the default class) is 1, batch 2; a client cannot buy its way up.
    expect(engine.received.map((r) => r.body.priority)).toEqual([1, 2, undefined]);
    expect(engine.received[1]?.body.stream_options).toEqual({ include_usage: true });
  });
});
