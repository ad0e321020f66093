/**
 * The router in front of the real simulated engine (`@llmgw/engine-sim`, vLLM mimic): the
 * official client end to end, client aborts reaching the engine, and an engine crash mid-stream.
 */
import { type RunningEngineSim, startEngineSim } from "@llmgw/engine-sim";
import OpenAI from "openai";
import { afterEach, describe, expect, it } from "vitest";
import type { RunningRouter } from "../src/index.js";
import { waitFor } from "./router-fake-engine.js";
import { routingSnapshot, startFedRouter } from "./routing-fixture.js";

const MODEL = "sim-llama";
const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function sim(options: Parameters<typeof startEngineSim>[0]): Promise<RunningEngineSim> {
  const s = await startEngineSim({ port: 0, warmupSeconds: 0, ...options });
  cleanups.push(() => s.close());
  return s;
}

async function routerOver(
  sims: RunningEngineSim[],
): Promise<{ router: RunningRouter; client: OpenAI }> {
  const replicas = sims.map((s, i) => ({ id: `sim-${i}`, baseUrl: s.url, capacity: 8 }));
  const { router } = await startFedRouter({
    snapshot: routingSnapshot({
      models: { [MODEL]: { deployment: "sim", replicas } },
      keys: { "sk-sim": { id: "k", name: "k" } },
    }),
    router: { analyzer: { pool: false } },
  });
  cleanups.push(() => router.close());
  return {
    router,
    client: new OpenAI({ apiKey: "sk-sim", baseURL: `${router.url}/v1`, maxRetries: 0 }),
  };
}

describe("router over @llmgw/engine-sim", () => {
  it("serves chat, completions, embeddings, streaming and usage", async () => {
    const engines = [
      await sim({ model: MODEL, timeScale: 50, maxOutputTokens: 16 }),
      await sim({ model: MODEL, timeScale: 50, maxOutputTokens: 16 }),
    ];
    const { client } = await routerOver(engines);
    const chat = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: "user", content: "Hello there" }],
      max_tokens: 5,
    });
    expect(chat.object).toBe("chat.completion");
    expect(chat.usage?.completion_tokens).toBeGreaterThan(0);
    expect(chat.usage?.completion_tokens).toBeLessThanOrEqual(5);
    const completion = await client.completions.create({
      model: MODEL,
      prompt: "Once upon",
      max_tokens: 4,
    });
    expect(completion.choices[0]?.text.length).toBeGreaterThan(0);
    const embedding = await client.embeddings.create({ model: MODEL, input: "vector me" });
    expect(embedding.data[0]?.embedding.length).toBeGreaterThan(0);
    const stream = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: "user", content: "Stream it" }],
      max_tokens: 6,
      stream: true,
      stream_options: { include_usage: true },
    });
    let chunks = 0;
    let usage: OpenAI.CompletionUsage | undefined | null;
    for await (const chunk of stream) {
      chunks += 1;
      if (chunk.usage) usage = chunk.usage;
    }
    expect(chunks).toBeGreaterThan(1);
    expect(usage?.completion_tokens).toBeGreaterThan(0);
    expect((engines[0]?.stats().requests ?? 0) + (engines[1]?.stats().requests ?? 0)).toBe(4);
  });

  it("a client abort ends the engine's request long before its natural end", async () => {
    const engine = await sim({
      model: MODEL,
      minOutputTokens: 5000,
      maxOutputTokens: 5000,
      maxModelLen: 8192,
    });
    const { router } = await routerOver([engine]);
    const controller = new AbortController();
    const res = await fetch(`${router.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: "Bearer sk-sim", "content-type": "application/json" },
      body: JSON.stringify({
        model: MODEL,
        stream: true,
        messages: [{ role: "user", content: "long story" }],
      }),
      signal: controller.signal,
    });
    const reader = (res.body as ReadableStream<Uint8Array>).getReader();
    await reader.read();
    expect(engine.stats().activeRequests).toBe(1);
    controller.abort();
    await waitFor(
      () => engine.stats().activeRequests === 0,
      10_000,
      "the engine to drop the request",
    );
  });

  it("an engine crashing mid-stream ends the client's stream with an error", async () => {
    const engine = await sim({
      model: MODEL,
      timeScale: 20,
      minOutputTokens: 50,
      maxOutputTokens: 50,
      faults: { dieMidStreamAfterTokens: 5 },
    });
    const { client } = await routerOver([engine]);
    const stream = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: "user", content: "tell me" }],
      stream: true,
    });
    let chunks = 0;
    await expect(
      (async () => {
        for await (const _ of stream) chunks += 1;
      })(),
    ).rejects.toThrow(/failed mid-stream/);
    expect(chunks).toBeGreaterThan(0);
  });
});
