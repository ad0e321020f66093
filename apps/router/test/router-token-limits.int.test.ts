/**
 * Per-key `tpm` limits against a real simulated engine (`@llmgw/engine-sim`, which honours
 * `max_completion_tokens` over `max_tokens` as vLLM does): a key pays for the tokens the
 * engine reports, however the request spelt (or left out) its output limit.
 */
import { type RunningEngineSim, startEngineSim } from "@llmgw/engine-sim";
import { afterEach, describe, expect, it } from "vitest";
import type { RunningRouter } from "../src/index.js";
import { routingSnapshot, startFedRouter } from "./routing-fixture.js";

const MODEL = "sim-llama";
const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** A router over one engine whose natural answer is `outputTokens` long, with a tpm key. */
async function setup(
  outputTokens: number,
  tpm: number,
  timeScale = 200,
): Promise<{ router: RunningRouter; engine: RunningEngineSim }> {
  const engine = await startEngineSim({
    model: MODEL,
    port: 0,
    warmupSeconds: 0,
    timeScale,
    minOutputTokens: outputTokens,
    maxOutputTokens: outputTokens,
  });
  cleanups.push(() => engine.close());
  const { router } = await startFedRouter({
    snapshot: routingSnapshot({
      models: { [MODEL]: { deployment: "sim", replicas: [{ id: "sim-0", baseUrl: engine.url }] } },
      keys: { "sk-tpm": { id: "k", name: "metered", tpm } },
    }),
    router: { analyzer: { pool: false } },
  });
  cleanups.push(() => router.close());
  return { router, engine };
}

/** One chat request, read to its end; the status and, for JSON, the parsed body. */
async function chat(
  router: RunningRouter,
  extra: Record<string, unknown>,
): Promise<{ status: number; body: string; retryAfter: string | null }> {
  const response = await fetch(`${router.url}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: "Bearer sk-tpm", "content-type": "application/json" },
    body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hi" }], ...extra }),
  });
  return {
    status: response.status,
    body: await response.text(),
    retryAfter: response.headers.get("retry-after"),
  };
}

describe("router: tpm limits settle to the engine's real usage", () => {
  it("charges max_completion_tokens when it is larger than max_tokens", async () => {
    // The engine generates 60 tokens (max_completion_tokens wins there); charging max_tokens
    // (1) would let every one of these through a 100-tpm key.
    const { router } = await setup(500, 100);
    const request = { max_tokens: 1, max_completion_tokens: 60, ignore_eos: true };
    const first = await chat(router, request);
    expect(first.status).toBe(200);
    expect(JSON.parse(first.body).usage.completion_tokens).toBe(60);
    const second = await chat(router, request);
    expect(second.status).toBe(429);
    expect(JSON.parse(second.body).error.code).toBe("tokens_rate_limit_exceeded");
  });

  it("settles a request without an output limit to what the engine generated", async () => {
    // 600 tokens per answer, 256 reserved for each: on the reservation alone a third request
    // would pass a 1,000-tpm key (3 × 258 < 1,000); on the real count (2 × ~610) it may not.
    const { router } = await setup(600, 1000);
    const first = await chat(router, {});
    expect(first.status).toBe(200);
    const usage = JSON.parse(first.body).usage;
    expect(usage.completion_tokens).toBe(600);
    expect((await chat(router, {})).status).toBe(200);
    const third = await chat(router, {});
    expect(third.status).toBe(429);
    expect(JSON.parse(third.body).error.code).toBe("tokens_rate_limit_exceeded");
  });

  it("settles a stream to the usage in its last event", async () => {
    const { router } = await setup(600, 1000);
    const streamed = { stream: true, stream_options: { include_usage: true } };
    const first = await chat(router, streamed);
    expect(first.status).toBe(200);
    expect(first.body).toContain('"completion_tokens":600');
    expect((await chat(router, streamed)).status).toBe(200);
    expect((await chat(router, streamed)).status).toBe(429);
  });

  it("settles a stream without usage to its events, a lower bound of its tokens", async () => {
    const { router } = await setup(600, 1000);
    const first = await chat(router, { stream: true });
    expect(first.status).toBe(200);
    expect(first.body).not.toContain("completion_tokens");
    expect((await chat(router, { stream: true })).status).toBe(200);
    expect((await chat(router, { stream: true })).status).toBe(429);
  });

  it("refunds the reservation an answer did not use", async () => {
    // 17 tokens per answer against a 300-tpm key, ~258 reserved for each: without the refund
    // the second request would already be refused; with it, three fit (300 − 2 × 17 ≥ 258),
    // and the fourth finds less than one reservation left (300 − 3 × 17 < 258).
    const { router } = await setup(10, 300);
    const statuses: number[] = [];
    for (let i = 0; i < 4; i++) statuses.push((await chat(router, {})).status);
    expect(statuses).toEqual([200, 200, 200, 429]);
  });

  it("charges a client that leaves mid-stream for the events it was sent", async () => {
    // 3 ms a token: the 2,000-token stream is still running when the client leaves after 400
    // events. Settled on the reservation alone (257), the key would keep 743 of 1,000 and admit
    // the 701-token request after it; charged for the ~400 events, it has ~600 left.
    const { router } = await setup(2000, 1000, 4);
    const abort = new AbortController();
    const response = await fetch(`${router.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: "Bearer sk-tpm", "content-type": "application/json" },
      body: JSON.stringify({
        model: MODEL,
        messages: [{ role: "user", content: "hi" }],
        stream: true,
      }),
      signal: abort.signal,
    });
    expect(response.status).toBe(200);
    const reader = (response.body as ReadableStream<Uint8Array>).getReader();
    const decoder = new TextDecoder();
    let text = "";
    while ((text.match(/\n\n/g)?.length ?? 0) < 400) {
      const { value, done } = await reader.read();
      if (done) throw new Error("the stream ended before the client meant to leave");
      text += decoder.decode(value, { stream: true });
    }
    expect(text).not.toContain("[DONE]");
    abort.abort();
    await reader.cancel().catch(() => {});
    // The router settles once it sees the client gone: wait for that, never a fixed sleep.
    const deadline = Date.now() + 5_000;
    let status = 200;
    while (Date.now() < deadline) {
      status = (await chat(router, { max_tokens: 700 })).status;
      if (status === 429) break;
      await new Promise((r) => setTimeout(r, 25));
    }
    expect(status).toBe(429);
  });

  it("refuses outright, with no Retry-After, a request that reserves more than the whole tpm", async () => {
    const { router } = await setup(10, 100);
    const response = await chat(router, { max_completion_tokens: 100_000 });
    expect(response.status).toBe(429);
    expect(response.retryAfter).toBeNull();
    const body = JSON.parse(response.body) as { error: { code: string; message: string } };
    expect(body.error.code).toBe("tokens_rate_limit_exceeded");
    expect(body.error.message).toMatch(
      /^request reserves 100002 tokens, more than API key metered's tpm of 100; lower max_tokens/,
    );
    // A request that fits is still admitted: the refusal charged nothing.
    expect((await chat(router, { max_tokens: 50 })).status).toBe(200);
  });

  it("reserves the output limit once for each of n choices", async () => {
    // 2 + 4 × 300 = 1,202 > 1,000: refused, where one choice's 301 would pass.
    const { router } = await setup(10, 1000);
    const refused = await chat(router, { max_tokens: 300, n: 4 });
    expect(refused.status).toBe(429);
    expect(JSON.parse(refused.body).error.message).toMatch(/^request reserves 1202 tokens/);
    // 902 fits: admitted and sent on (engine-sim itself refuses n > 1 with a 400).
    const fits = await chat(router, { max_tokens: 300, n: 3 });
    expect(fits.status).not.toBe(429);
  });
});
