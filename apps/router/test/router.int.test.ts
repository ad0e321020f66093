/**
 * The router's public API through the official `openai` client and raw fetch, against real
 * upstream servers on loopback: happy paths, streaming passthrough, and every refusal.
 */
import { createRecordingRouterMetrics } from "@llmgw/router/testing";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningRouter } from "../src/index.js";
import {
  type FakeEngine,
  startFakeEngine,
  waitFor,
  withoutUsageEvent,
} from "./router-fake-engine.js";
import { type ReplicaSpec, routingSnapshot, startFedRouter } from "./routing-fixture.js";

type OpenAIError = { error: { message: string; type: string; code: string; param: string | null } };

const KEY = "sk-test-good";
const LIMITED_KEY = "sk-test-rpm";
const metrics = createRecordingRouterMetrics();
let engineA: FakeEngine;
let engineB: FakeEngine;
let router: RunningRouter;
let client: OpenAI;

const replica = (id: string, engine: FakeEngine, capacity = 8): ReplicaSpec => ({
  id,
  baseUrl: engine.url,
  capacity,
});

beforeAll(async () => {
  engineA = await startFakeEngine({ name: "a" });
  engineB = await startFakeEngine({ name: "b" });
  ({ router } = await startFedRouter({
    snapshot: routingSnapshot({
      models: {
        "llama-8b": {
          deployment: "llama",
          replicas: [replica("llama-0", engineA), replica("llama-1", engineB)],
        },
        // Starting replicas are not routed: the control plane says the model is loading.
        "warming-model": { deployment: "warming", loading: true },
        // An unhealthy replica is not routed either, and nothing is loading.
        "broken-model": { deployment: "broken", policy: "least-loaded" },
      },
      keys: {
        [KEY]: { id: "k1", name: "good" },
        [LIMITED_KEY]: { id: "k2", name: "limited", rpm: 2 },
      },
    }),
    metrics,
    router: {
      maxBodyBytes: 64 * 1024,
      // Small threshold so that bodies over 2 KiB exercise the worker pool path.
      analyzer: { inlineThresholdBytes: 2048, pool: { maxThreads: 1, minThreads: 1 } },
    },
  }));
  client = new OpenAI({ apiKey: KEY, baseURL: `${router.url}/v1`, maxRetries: 0 });
});

afterAll(async () => {
  await router?.close();
  await engineA?.close();
  await engineB?.close();
});

const post = (path: string, body: string, headers: Record<string, string> = {}) =>
  fetch(`${router.url}${path}`, {
    method: "POST",
    headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json", ...headers },
    body,
  });

describe("router: OpenAI API through the official client", () => {
  it("answers a chat completion with usage and names the replica", async () => {
    const { data, response } = await client.chat.completions
      .create({ model: "llama-8b", messages: [{ role: "user", content: "hi" }], max_tokens: 4 })
      .withResponse();
    expect(data.choices[0]?.message.content).toBe("tok0 tok1 tok2 tok3");
    expect(data.usage).toEqual({ prompt_tokens: 7, completion_tokens: 4, total_tokens: 11 });
    expect(["llama-0", "llama-1"]).toContain(response.headers.get("x-llmgw-replica"));
    expect(response.headers.get("x-request-id")).toMatch(/^[0-9a-f-]{36}$/);
  });

  it("answers completions and embeddings", async () => {
    const completion = await client.completions.create({
      model: "llama-8b",
      prompt: "Once",
      max_tokens: 4,
    });
    expect(completion.choices[0]?.text).toBe("tok0 tok1 tok2 tok3");
    const embedding = await client.embeddings.create({ model: "llama-8b", input: "hello" });
    expect(embedding.data[0]?.embedding).toEqual([0.5, 0.25, 0.125]);
  });

  it("streams chat chunks with usage through the client", async () => {
    const stream = await client.chat.completions.create({
      model: "llama-8b",
      messages: [{ role: "user", content: "stream please" }],
      stream: true,
      stream_options: { include_usage: true },
    });
    const parts: string[] = [];
    let usage: unknown;
    for await (const chunk of stream) {
      parts.push(chunk.choices[0]?.delta.content ?? "");
      if (chunk.usage) usage = chunk.usage;
    }
    expect(parts.join("")).toBe("tok0 tok1 tok2 tok3 ");
    expect(usage).toEqual({ prompt_tokens: 7, completion_tokens: 4, total_tokens: 11 });
    expect(metrics.of("tokens")).toContainEqual(["llama-8b", "completion", 4]);
  });

  it("lists only models with a ready replica, filtered by the key", async () => {
    const models = await client.models.list();
    expect(models.data.map((m) => m.id)).toEqual(["llama-8b"]);
  });

  it("accepts a caller's x-request-id, and passes it to the engine made unique", async () => {
    const before = [...engineA.received, ...engineB.received].length;
    for (let i = 0; i < 2; i++) {
      const res = await post(
        "/v1/chat/completions",
        JSON.stringify({ model: "llama-8b", messages: [{ role: "user", content: "id" }] }),
        { "x-request-id": "req-abc.123" },
      );
      expect(res.status).toBe(200);
      expect(res.headers.get("x-request-id")).toBe("req-abc.123");
      await res.arrayBuffer();
    }
    // vLLM takes the header as its request id: two clients (or two requests) choosing one id
    // must not meet in an engine. The client's id stays its prefix, for the logs.
    const ids = [...engineA.received, ...engineB.received].slice(before).map((r) => r.requestId);
    expect(ids).toHaveLength(2);
    for (const id of ids) expect(id).toMatch(/^req-abc\.123\.[0-9a-f]{16}$/);
    expect(new Set(ids).size).toBe(2);
    // An id the router made is unique already, and goes as it is.
    const res = await post(
      "/v1/chat/completions",
      JSON.stringify({ model: "llama-8b", messages: [{ role: "user", content: "id" }] }),
    );
    const made = res.headers.get("x-request-id");
    await res.arrayBuffer();
    expect([...engineA.received, ...engineB.received].at(-1)?.requestId).toBe(made);
  });

  it("sends the engine its own key and never the client's", async () => {
    const { router: keyed } = await startFedRouter({
      snapshot: routingSnapshot({
        models: {
          "keyed-model": {
            deployment: "keyed",
            policy: "round-robin",
            replicas: [
              { ...replica("keyed-0", engineB), apiKey: "llmgw-engine-keyed-0" },
              replica("unkeyed-0", engineA),
            ],
          },
        },
        keys: { [KEY]: { id: "k1", name: "good" } },
      }),
      metrics: createRecordingRouterMetrics(),
    });
    try {
      const seen = new Map<string, string | undefined>();
      for (let i = 0; i < 4; i++) {
        const res = await fetch(`${keyed.url}/v1/chat/completions`, {
          method: "POST",
          headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
          body: JSON.stringify({
            model: "keyed-model",
            messages: [{ role: "user", content: `k${i}` }],
          }),
        });
        expect(res.status).toBe(200);
        const replicaId = res.headers.get("x-llmgw-replica") as string;
        await res.arrayBuffer();
        const engine = replicaId === "keyed-0" ? engineB : engineA;
        seen.set(replicaId, engine.received.at(-1)?.authorization);
      }
      // A replica without a key gets no Authorization at all: the client's key stays here.
      expect(Object.fromEntries(seen)).toEqual({
        "keyed-0": "Bearer llmgw-engine-keyed-0",
        "unkeyed-0": undefined,
      });
    } finally {
      await keyed.close();
    }
  });

  it("passes a JSON answer larger than one read through whole, with its Content-Length", async () => {
    // The fake engine answers `dimensions` floats with a declared length: ~400 KB arrives at the
    // router in many reads (small answers arrive in one and leave in one write).
    const res = await post(
      "/v1/embeddings",
      JSON.stringify({ model: "llama-8b", input: "big", dimensions: 50_000 }),
    );
    expect(res.status).toBe(200);
    const bytes = Buffer.from(await res.arrayBuffer());
    expect(res.headers.get("content-length")).toBe(String(bytes.length));
    const sent = [...engineA.written, ...engineB.written].map((w) => Buffer.concat(w));
    expect(bytes.length).toBeGreaterThan(300_000);
    expect(sent.some((b) => b.equals(bytes))).toBe(true);
    const body = JSON.parse(bytes.toString("utf8")) as { data: { embedding: number[] }[] };
    expect(body.data[0]?.embedding).toHaveLength(50_000);
  });

  it("forwards large bodies byte for byte through reused buffers, declared or chunked", async () => {
    // 16–64 KiB: read into pooled buffers, moved to the analysis worker and back, forwarded
    // from there, then reused by the next request; any mix-up would show as a wrong body.
    const sent = new Map<string, string>();
    const send = async (i: number, chunked: boolean): Promise<void> => {
      const id = `large-${i}-${chunked ? "chunked" : "declared"}`;
      const content = `${id} ${String.fromCharCode(97 + (i % 26)).repeat(20_000 + i * 1500)} é😀`;
      const body = JSON.stringify({ model: "llama-8b", messages: [{ role: "user", content }] });
      sent.set(id, content);
      const bytes = new TextEncoder().encode(body);
      const res = await fetch(`${router.url}/v1/chat/completions`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${KEY}`,
          "content-type": "application/json",
          "x-request-id": id,
        },
        body: chunked
          ? new ReadableStream({
              start(controller) {
                for (let at = 0; at < bytes.length; at += 7000) {
                  controller.enqueue(bytes.subarray(at, at + 7000));
                }
                controller.close();
              },
            })
          : bytes,
        ...(chunked ? { duplex: "half" } : {}),
      } as RequestInit);
      expect({ id, status: res.status, text: res.status === 200 ? "" : await res.text() }).toEqual({
        id,
        status: 200,
        text: "",
      });
      await res.arrayBuffer();
    };
    for (let round = 0; round < 3; round++) {
      await Promise.all([0, 1, 2, 3].map((k) => send(round * 4 + k, k % 2 === 1)));
    }
    const received = [...engineA.received, ...engineB.received].filter((r) =>
      r.requestId?.startsWith("large-"),
    );
    expect(received).toHaveLength(12);
    for (const r of received) {
      const messages = r.body.messages as { content: string }[];
      // The engine gets the client's id with a random suffix of its own (`<id>.<16 hex>`).
      expect(messages[0]?.content).toBe(sent.get((r.requestId ?? "").replace(/\.[^.]+$/, "")));
    }
  });

  it("passes streamed bytes through unaltered and incrementally", async () => {
    engineA.closeGate();
    engineB.closeGate();
    try {
      // A large body (over the 2 KiB threshold) also takes the worker-pool path.
      const system = "You are terse. ".repeat(300);
      const res = await post(
        "/v1/chat/completions",
        JSON.stringify({
          model: "llama-8b",
          stream: true,
          messages: [
            { role: "system", content: system },
            { role: "user", content: "go" },
          ],
        }),
      );
      expect(res.status).toBe(200);
      expect(res.headers.get("content-type")).toBe("text/event-stream");
      const engine = res.headers.get("x-llmgw-replica") === "llama-0" ? engineA : engineB;
      const reader = (res.body as ReadableStream<Uint8Array>).getReader();
      const received: Uint8Array[] = [];
      const first = await reader.read();
      received.push(first.value as Uint8Array);
      // The engine is still holding the rest of the stream at its gate: the first chunk came
      // through on its own, not buffered with the others.
      expect(engine.held()).toBe(1);
      expect(Buffer.from(first.value as Uint8Array).toString()).toMatch(/^data: .*tok0/);
      engine.openGate();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        received.push(value);
      }
      // Byte for byte what the engine sent, less the usage event the router asked it for (the
      // client did not).
      const sent = withoutUsageEvent(
        Buffer.concat(engine.written[engine.written.length - 1] ?? []).toString(),
      );
      expect(Buffer.concat(received).toString()).toBe(sent);
      expect(
        metrics.of("decision").some((args) => (args[0] as { mode: string }).mode === "pool"),
      ).toBe(true);
    } finally {
      engineA.openGate();
      engineB.openGate();
    }
  });

  it("aborting the client aborts the upstream request", async () => {
    engineA.closeGate();
    engineB.closeGate();
    try {
      const controller = new AbortController();
      const res = await post(
        "/v1/chat/completions",
        JSON.stringify({
          model: "llama-8b",
          stream: true,
          messages: [{ role: "user", content: "abort me" }],
        }),
      );
      const engine = res.headers.get("x-llmgw-replica") === "llama-0" ? engineA : engineB;
      const reader = (res.body as ReadableStream<Uint8Array>).getReader();
      await reader.read();
      const rec = engine.received[engine.received.length - 1];
      expect(rec?.aborted).toBe(false);
      controller.abort();
      await reader.cancel();
      await waitFor(() => rec?.aborted === true, 5000, "the engine to see the abort");
      await waitFor(() => metrics.of("clientDisconnect").length > 0, 5000, "a disconnect metric");
    } finally {
      engineA.openGate();
      engineB.openGate();
    }
  });
});

describe("router: refusals answer with OpenAI error bodies", () => {
  const chat = (model: string) =>
    JSON.stringify({ model, messages: [{ role: "user", content: "x" }] });

  it.each([
    {
      name: "missing key",
      send: () =>
        fetch(`${router.url}/v1/chat/completions`, { method: "POST", body: chat("llama-8b") }),
      status: 401,
      code: "invalid_api_key",
      message: "Missing API key: send `Authorization: Bearer <key>`.",
      param: null,
    },
    {
      name: "bad key",
      send: () =>
        post("/v1/chat/completions", chat("llama-8b"), { authorization: "Bearer sk-nope" }),
      status: 401,
      code: "invalid_api_key",
      message: "Incorrect API key provided.",
      param: null,
    },
    {
      name: "unknown model",
      send: () => post("/v1/chat/completions", chat("gpt-17")),
      status: 404,
      code: "model_not_found",
      message: "The model `gpt-17` does not exist or you do not have access to it.",
      param: "model",
    },
    {
      name: "malformed JSON",
      send: () => post("/v1/chat/completions", '{"model": "llama-8b", '),
      status: 400,
      code: "invalid_request",
      message: expect.stringMatching(/^request body is not valid JSON: /),
      param: null,
    },
    {
      name: "missing model",
      send: () => post("/v1/completions", '{"prompt": "x"}'),
      status: 400,
      code: "invalid_request",
      message: "`model` must be a non-empty string of at most 256 characters",
      param: "model",
    },
    {
      name: "oversize body",
      send: () =>
        post(
          "/v1/chat/completions",
          JSON.stringify({ model: "llama-8b", prompt: "x".repeat(70_000) }),
        ),
      status: 413,
      code: "request_too_large",
      message: "request body exceeds the limit of 65536 bytes",
      param: null,
    },
    {
      name: "no ready replica",
      send: () => post("/v1/chat/completions", chat("broken-model")),
      status: 503,
      code: "no_ready_replica",
      message: "no ready replica for model broken-model",
      param: null,
    },
    {
      name: "model loading",
      send: () => post("/v1/chat/completions", chat("warming-model")),
      status: 503,
      code: "model_loading",
      message: "model warming-model is loading; retry shortly",
      param: null,
    },
    {
      name: "unknown path",
      send: () => post("/v1/fine_tuning/jobs", "{}"),
      status: 404,
      code: "unknown_url",
      message: "Unknown request URL: POST /v1/fine_tuning/jobs.",
      param: null,
    },
  ])("$name → $status $code", async ({ send, status, code, message, param }) => {
    const res = await send();
    expect(res.status).toBe(status);
    expect(res.headers.get("content-type")).toBe("application/json");
    // Refusals are traceable too: every answer names its request.
    expect(res.headers.get("x-request-id")).toMatch(/^[0-9a-f-]{36}$/);
    expect(await res.json()).toEqual({
      error: { message, type: expect.any(String), code, param },
    });
  });

  it("surfaces a refusal as the client's typed error", async () => {
    await expect(
      client.chat.completions.create({
        model: "gpt-17",
        messages: [{ role: "user", content: "x" }],
      }),
    ).rejects.toMatchObject({ status: 404, code: "model_not_found" });
  });

  it("answers 429 with Retry-After once a key exceeds its rpm", async () => {
    const send = () =>
      post("/v1/chat/completions", chat("llama-8b"), { authorization: `Bearer ${LIMITED_KEY}` });
    const statuses: number[] = [];
    let retryAfter: string | null = null;
    for (let i = 0; i < 3; i++) {
      const res = await send();
      statuses.push(res.status);
      if (res.status === 429) {
        retryAfter = res.headers.get("retry-after");
        expect(res.headers.get("x-llmgw-limit")).toBe("key-rpm");
        expect(((await res.json()) as OpenAIError).error.code).toBe("rate_limit_exceeded");
      } else {
        await res.arrayBuffer();
      }
    }
    expect(statuses).toEqual([200, 200, 429]);
    expect(Number(retryAfter)).toBeGreaterThanOrEqual(1);
  });

  it("answers 413 when a chunked body grows past the limit while it is read", async () => {
    // No Content-Length to refuse up front: the limit is enforced chunk by chunk.
    const bytes = new TextEncoder().encode(
      JSON.stringify({ model: "llama-8b", prompt: "x".repeat(70_000) }),
    );
    const res = await fetch(`${router.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
      body: new ReadableStream({
        start(controller) {
          for (let at = 0; at < bytes.length; at += 8000) {
            controller.enqueue(bytes.subarray(at, at + 8000));
          }
          controller.close();
        },
      }),
      duplex: "half",
    } as RequestInit);
    expect(res.status).toBe(413);
    expect(((await res.json()) as OpenAIError).error.code).toBe("request_too_large");
  });

  it("refuses an oversize head with 431", async () => {
    const res = await post("/v1/chat/completions", chat("llama-8b"), {
      "x-big": "y".repeat(20_000),
    });
    expect(res.status).toBe(431);
  });
});
