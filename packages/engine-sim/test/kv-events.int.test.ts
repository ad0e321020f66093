import {
  createKvEventSubscriber,
  createReplicaBlockSet,
  type DecodedKvEventBatch,
  type KvEvent,
  type KvEventsResetReason,
  saltKey,
  tokenBlockKeys,
} from "@llmgw/kv-events";
import { afterEach, describe, expect, it } from "vitest";
import {
  type EngineSimOptions,
  type RunningEngineSim,
  simChatPrompt,
  simTokenIds,
  startEngineSim,
} from "../src/index.js";
import { spawnSim } from "./helpers.js";

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

async function waitFor(condition: () => boolean, what: string, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

const BS = 16;

async function sim(options: Partial<EngineSimOptions> = {}): Promise<RunningEngineSim> {
  const s = await startEngineSim({
    model: "m",
    port: 0,
    timeScale: 50,
    maxModelLen: 2048,
    ...options,
    kvEvents: {
      enableKvCacheEvents: true,
      endpoint: "tcp://127.0.0.1:0",
      replayEndpoint: "tcp://127.0.0.1:0",
      topic: "kv@sim@m",
      ...options.kvEvents,
    },
  });
  cleanups.push(() => s.close());
  return s;
}

/** A subscriber from @llmgw/kv-events feeding one block set, as a router would run it. */
function follow(s: RunningEngineSim) {
  const batches: DecodedKvEventBatch[] = [];
  const resets: KvEventsResetReason[] = [];
  const set = createReplicaBlockSet({ blockSize: BS });
  const sub = createKvEventSubscriber({
    endpoint: s.kvEvents!.endpoint,
    replayEndpoint: s.kvEvents!.replayEndpoint!,
    topic: "kv@sim@m",
    onBatch: (batch) => {
      batches.push(batch);
      set.apply(batch);
    },
    onReset: (reason) => {
      resets.push(reason);
      set.clear();
    },
  });
  cleanups.push(() => sub.close());
  return { sub, set, batches, resets };
}

async function chat(s: RunningEngineSim, content: string, maxTokens = 2) {
  const res = await fetch(`${s.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ messages: [{ role: "user", content }], max_tokens: maxTokens }),
  });
  expect(res.status).toBe(200);
  return (await res.json()) as {
    usage: { prompt_tokens: number; prompt_tokens_details: { cached_tokens: number } | null };
  };
}

async function complete(s: RunningEngineSim, prompt: string, maxTokens: number) {
  const res = await fetch(`${s.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, ignore_eos: true }),
  });
  expect(res.status).toBe(200);
  return (await res.json()) as {
    choices: { text: string }[];
    usage: {
      prompt_tokens: number;
      completion_tokens: number;
      prompt_tokens_details: { cached_tokens: number } | null;
    };
  };
}

const storedOf = (batches: readonly DecodedKvEventBatch[]) =>
  batches
    .flatMap((b) => b.events)
    .filter((e): e is Extract<KvEvent, { type: "BlockStored" }> => e.type === "BlockStored");

/** Our keys of a chat request, as a router computes them with the sim's tokenizer. */
const keysOf = (content: string) => [
  ...tokenBlockKeys(simTokenIds(simChatPrompt([{ role: "user", content }])), BS),
];

/**
 * PUB drops messages until the subscription reached the publisher; the subscriber's first
 * message is its baseline. Requests with throwaway prompts make events until one arrives.
 */
async function join(s: RunningEngineSim, f: ReturnType<typeof follow>): Promise<void> {
  for (let i = 0; f.sub.stats().received === 0; i++) await chat(s, `warm-up ${i} `.repeat(20));
}

/** Joins the subscriber, then empties the cache on both sides so only later events count. */
async function joinAndReset(s: RunningEngineSim, f: ReturnType<typeof follow>): Promise<void> {
  await join(s, f);
  await waitFor(() => s.stats().activeRequests === 0, "idle");
  expect((await fetch(`${s.url}/reset_prefix_cache`, { method: "POST" })).status).toBe(200);
  await waitFor(() => f.set.stats().clears >= 1 && f.set.stats().entries === 0, "the clear");
  f.batches.length = 0;
}

const doc = (n: number) =>
  `Document ${n}: ${"the engine caches prompt blocks of sixteen tokens each. ".repeat(6)}`;

describe("engine-sim KV events read by @llmgw/kv-events", () => {
  it("publishes what enters and leaves its prefix cache; a subscriber rebuilds it from token ids", async () => {
    // A cache of 64 blocks: the later documents evict the earlier ones.
    const s = await sim({ maxModelLen: 256, timing: { kvCacheTokens: 32 * BS } });
    const f = follow(s);
    await join(s, f);
    // Events before the subscriber's first message were lost: start both sides from empty.
    expect((await fetch(`${s.url}/reset_prefix_cache`, { method: "POST" })).status).toBe(200);
    await waitFor(() => f.set.stats().clears === 1, "the clear");
    for (let n = 0; n < 12; n++) await chat(s, doc(n));
    await waitFor(() => s.stats().activeRequests === 0, "idle");
    const cachedBlocks = s.stats().timing.cachedFreeBlocks; // idle: every cached block is free
    // The last document's blocks are the last stored (and, most recent, none is evicted).
    const last = keysOf(doc(11));
    await waitFor(
      () => last.every((k) => f.set.has(k)) && f.set.stats().entries === cachedBlocks,
      "the set to hold what the sim holds",
    );
    const stats = f.set.stats();
    expect(stats).toMatchObject({ orphaned: 0, skippedGroup: 0, unknownRemoved: 0 });
    expect(stats.removed).toBeGreaterThan(0); // evictions happened
    // Every key held belongs to a document sent after the reset.
    const allKeys = new Set(Array.from({ length: 12 }, (_, n) => keysOf(doc(n))).flat());
    expect(f.set.snapshot().every((k) => allKeys.has(k))).toBe(true);
    expect(f.resets).toEqual([]);
    // Every BlockStored is full attention on the GPU, with vLLM's fields.
    const stored = f.batches.flatMap((b) => b.events).find((e) => e.type === "BlockStored");
    expect(stored).toMatchObject({
      blockSize: BS,
      medium: "GPU",
      groupIdx: 0,
      kvCacheSpecKind: "full_attention",
    });
    expect(f.set.blockSize).toBe(BS);
  });

  it("hashes per process: two sims send different engine hashes, and the same keys", async () => {
    const [a, b] = [await sim(), await sim()];
    const [fa, fb] = [follow(a), follow(b)];
    await Promise.all([join(a, fa), join(b, fb)]);
    const seen = (f: ReturnType<typeof follow>) =>
      f.batches
        .flatMap((x) => x.events)
        .flatMap((e) => (e.type === "BlockStored" ? e.blockHashes : []));
    const [before, beforeB] = [fa.batches.length, fb.batches.length];
    await chat(a, doc(1));
    await chat(b, doc(1));
    await waitFor(
      () => fa.batches.length > before && fb.batches.length > beforeB,
      "the documents' events",
    );
    const ha = new Set(seen(fa));
    expect(seen(fb).some((h) => ha.has(h))).toBe(false);
    for (const key of keysOf(doc(1))) {
      expect(fa.set.has(key)).toBe(true);
      expect(fb.set.has(key)).toBe(true);
    }
  });

  it("reports cached tokens in usage with enablePromptTokensDetails, only when some were cached, streamed and not", async () => {
    const s = await sim({
      enablePromptTokensDetails: true,
      kvEvents: { enableKvCacheEvents: false },
    });
    expect(s.kvEvents).toBeUndefined();
    const first = await chat(s, doc(3));
    // vLLM: `if self.enable_prompt_tokens_details and num_cached_tokens:`.
    expect(first.usage.prompt_tokens_details).toBeNull();
    const again = await chat(s, doc(3));
    // Every full block but the one holding the last prompt token comes from the cache.
    const hit = Math.floor((again.usage.prompt_tokens - 1) / BS) * BS;
    expect(again.usage.prompt_tokens_details).toEqual({ cached_tokens: hit });
    const res = await fetch(`${s.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        prompt: simChatPrompt([{ role: "user", content: doc(3) }]),
        max_tokens: 2,
        stream: true,
        stream_options: { include_usage: true },
      }),
    });
    const text = await res.text();
    const usage = text
      .split("\n")
      .filter((l) => l.startsWith("data: {"))
      .map((l) => JSON.parse(l.slice(6)) as { usage?: unknown })
      .find((c) => c.usage)?.usage;
    expect(usage).toMatchObject({ prompt_tokens_details: { cached_tokens: hit } });
  });

  it("keys its cache with cache_salt as vLLM does, publishing the salt as the first block's extra key", async () => {
    const s = await sim({ enablePromptTokensDetails: true });
    const f = follow(s);
    await joinAndReset(s, f);
    const ask = async (cacheSalt?: string | null) => {
      const res = await fetch(`${s.url}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          messages: [{ role: "user", content: doc(4) }],
          max_tokens: 2,
          ...(cacheSalt === undefined ? {} : { cache_salt: cacheSalt }),
        }),
      });
      expect(res.status).toBe(200);
      const body = (await res.json()) as {
        usage: { prompt_tokens_details: { cached_tokens: number } | null };
      };
      return body.usage.prompt_tokens_details?.cached_tokens ?? 0;
    };
    expect(await ask("tenant-a")).toBe(0);
    expect(await ask("tenant-b")).toBe(0);
    expect(await ask(undefined)).toBe(0);
    expect(await ask("tenant-a")).toBeGreaterThan(0);
    expect(await ask(null)).toBeGreaterThan(0); // null is no salt
    await waitFor(() => storedOf(f.batches).length >= 3, "three prompts' blocks");
    const firsts = storedOf(f.batches).filter((e) => e.parentBlockHash === undefined);
    expect(firsts.map((e) => e.extraKeys?.[0] ?? null)).toEqual([["tenant-a"], ["tenant-b"], null]);
    for (const e of firsts)
      expect(e.extraKeys?.slice(1).every((k) => k === null) ?? true).toBe(true);
    // A block set keys each salted prompt from its salt, as a router keys the salted request.
    const tokens = simTokenIds(simChatPrompt([{ role: "user", content: doc(4) }]));
    for (const salt of ["tenant-a", "tenant-b", undefined]) {
      const keys = tokenBlockKeys(tokens, BS, salt === undefined ? undefined : saltKey(salt));
      await waitFor(() => [...keys].every((k) => f.set.has(k)), `${salt}'s blocks`);
    }
    expect(f.set.stats().skippedExtraKeys).toBe(0);
    const bodies = {
      "/v1/chat/completions": { messages: [{ role: "user", content: "x" }] },
      // vLLM's pooling requests check the salt by the same rule.
      "/v1/embeddings": { input: "x" },
    };
    for (const [path, salt] of Object.keys(bodies).flatMap((p) => [
      [p, ""],
      [p, 7],
    ]) as [keyof typeof bodies, unknown][]) {
      const res = await fetch(`${s.url}${path}`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ ...bodies[path], cache_salt: salt }),
      });
      expect(res.status, path).toBe(400);
      expect(((await res.json()) as { error: { message: string } }).error.message).toBe(
        "Parameter 'cache_salt' must be a non-empty string if provided.",
      );
    }
  });

  it("leaves cached tokens out of usage by default, as vLLM without --enable-prompt-tokens-details", async () => {
    const s = await sim({ kvEvents: { enableKvCacheEvents: false } });
    await chat(s, doc(3));
    const again = await chat(s, doc(3));
    expect(s.stats().timing.prefixHitTokens).toBeGreaterThan(0);
    expect(again.usage.prompt_tokens_details).toBeNull();
    const res = await fetch(`${s.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        messages: [{ role: "user", content: doc(3) }],
        max_tokens: 2,
        stream: true,
        stream_options: { include_usage: true },
      }),
    });
    const usage = (await res.text())
      .split("\n")
      .filter((l) => l.startsWith("data: {"))
      .map((l) => JSON.parse(l.slice(6)) as { usage?: Record<string, unknown> })
      .find((c) => c.usage)?.usage;
    expect(usage).toBeDefined();
    expect(usage).not.toHaveProperty("prompt_tokens_details");
  });

  it("caches and publishes full blocks of generated tokens as they fill, chained from the prompt", async () => {
    const s = await sim({ maxModelLen: 4096 });
    const f = follow(s);
    await joinAndReset(s, f);
    // 128 characters = 32 sim tokens = 2 full prompt blocks; 40 output tokens.
    const prompt = "abcdefgh".repeat(16);
    const r = await complete(s, prompt, 40);
    expect(r.usage).toMatchObject({ prompt_tokens: 32, completion_tokens: 40 });
    await waitFor(() => f.set.stats().entries === 4, "the output blocks");
    // vLLM: computed tokens at the end = 32 + 40 - 1 = 71, so floor(71/16) = 4 full blocks:
    // the 2 prompt blocks, then 2 output blocks as each fills, each parented on the one before.
    const events = storedOf(f.batches);
    expect(events.flatMap((e) => e.blockHashes)).toHaveLength(4);
    for (const [i, e] of events.entries()) {
      if (i > 0) expect(e.parentBlockHash).toBe(events[i - 1]!.blockHashes.at(-1));
    }
    // The output blocks' token ids are the answer's own, as /tokenize gives them back.
    const sequence = [...simTokenIds(prompt + r.choices[0]!.text)].slice(0, 4 * BS);
    expect(events.flatMap((e) => e.tokenIds)).toEqual(sequence);
    for (const key of tokenBlockKeys(sequence, BS)) expect(f.set.has(key)).toBe(true);
  });

  it("serves a next turn that quotes the answer from the answer's cached blocks", async () => {
    const s = await sim({ maxModelLen: 4096, enablePromptTokensDetails: true });
    const prompt = "abcdefgh".repeat(16); // 32 tokens
    const first = await complete(s, prompt, 40);
    const next = await complete(s, `${prompt}${first.choices[0]!.text} and then?`, 4);
    // 4 blocks (2 of prompt, 2 of answer) were cached by the first turn.
    expect(next.usage.prompt_tokens_details).toEqual({ cached_tokens: 4 * BS });
  });

  it("publishes a long prompt's blocks chunk by chunk, as chunked prefill computes them", async () => {
    // A step budget of 256 tokens: a 1600-token prompt takes 7 steps to prefill.
    const s = await sim({
      maxModelLen: 4096,
      timing: { maxBatchedTokens: 256, maxRunningSeqs: 16 },
    });
    const f = follow(s);
    await joinAndReset(s, f);
    await complete(s, "0123456789abcdef".repeat(400), 1); // 6400 chars = 1600 tokens
    await waitFor(() => f.set.stats().entries === 100, "the prompt's blocks");
    const perBatch = f.batches
      .map((b) => storedOf([b]).reduce((n, e) => n + e.blockHashes.length, 0))
      .filter((n) => n > 0);
    // vLLM caches min(computed + scheduled, num_tokens) per step: 256/16 = 16 blocks a step.
    expect(perBatch).toEqual([16, 16, 16, 16, 16, 16, 4]);
  });

  it("publishes AllBlocksCleared on POST /reset_prefix_cache", async () => {
    const s = await sim();
    const f = follow(s);
    await join(s, f);
    await chat(s, doc(2));
    await waitFor(() => keysOf(doc(2)).every((k) => f.set.has(k)), "the document's blocks");
    const res = await fetch(`${s.url}/reset_prefix_cache`, { method: "POST" });
    expect(res.status).toBe(200);
    await waitFor(() => f.set.snapshot().length === 0, "the clear");
    expect(f.batches.at(-1)?.events).toEqual([{ type: "AllBlocksCleared" }]);
    expect(f.set.stats().clears).toBeGreaterThanOrEqual(1);
  });

  it("starts a new seq after a restart on the same endpoint: the subscriber resets", async () => {
    const first = await sim();
    const f = follow(first);
    await join(first, f);
    for (let n = 0; n < 40; n++) await chat(first, doc(n));
    await waitFor(() => f.sub.lastSeq !== undefined && f.sub.lastSeq >= 40n, "40 batches");
    const endpoints = first.kvEvents!;
    await first.close();
    const second = await sim({
      timeScale: 1, // ~30 ms a request: the SUB socket reconnects (100 ms) within a few
      kvEvents: {
        enableKvCacheEvents: true,
        endpoint: endpoints.endpoint,
        replayEndpoint: endpoints.replayEndpoint ?? null,
      },
    });
    // Fewer batches than the first engine sent, so the first one the subscriber sees is ≤ last.
    for (let n = 0; n < 35 && f.resets.length === 0; n++) await chat(second, doc(100 + n));
    await waitFor(() => f.resets.length > 0, "the reset");
    expect(f.resets[0]).toBe("restart");
    await chat(second, doc(200));
    await waitFor(() => keysOf(doc(200)).every((k) => f.set.has(k)), "the new engine's blocks");
    expect(f.set.has(keysOf(doc(0))[0] as number)).toBe(false);
  });
});

describe("POST /tokenize", () => {
  it.each([
    [{ prompt: "Hello, world!" }, "Hello, world!", null],
    [{ prompt: "abcdefgh", return_token_strs: true }, "abcdefgh", ["abcd", "efgh"]],
    [
      { messages: [{ role: "user", content: "Hi" }] },
      simChatPrompt([{ role: "user", content: "Hi" }]),
      null,
    ],
    [
      { messages: [{ role: "user", content: "Hi" }], add_generation_prompt: false },
      simChatPrompt([{ role: "user", content: "Hi" }], { addGenerationPrompt: false }),
      null,
    ],
    [
      { messages: [{ role: "assistant", content: "Sure" }], continue_final_message: true },
      "<|assistant|>\nSure",
      null,
    ],
  ])("tokenizes %j like vLLM", async (body, prompt, strs) => {
    const s = await sim({ kvEvents: { enableKvCacheEvents: false } });
    const res = await fetch(`${s.url}/tokenize`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "m", ...body }),
    });
    expect(res.status).toBe(200);
    const tokens = [...simTokenIds(prompt)];
    expect(await res.json()).toEqual({
      count: tokens.length,
      max_model_len: 2048,
      tokens,
      token_strs: strs,
    });
  });

  it.each([
    [{ prompt: 5 }, 400, "prompt must be a string (or send messages)"],
    [
      {
        messages: [{ role: "user", content: "x" }],
        add_generation_prompt: true,
        continue_final_message: true,
      },
      400,
      "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
    ],
    [{ model: "other", prompt: "x" }, 404, "The model `other` does not exist."],
  ])("refuses %j", async (body, status, message) => {
    const s = await sim({ kvEvents: { enableKvCacheEvents: false } });
    const res = await fetch(`${s.url}/tokenize`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    expect(res.status).toBe(status);
    expect(((await res.json()) as { error: { message: string } }).error.message).toBe(message);
  });
});

describe("engine-sim --kv-events-config", () => {
  it("publishes from its own process, with vLLM's flag", async () => {
    const proc = spawnSim([
      "--model",
      "m",
      "--port",
      "0",
      "--kv-events-config",
      '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://127.0.0.1:0","topic":"kv@p@m"}',
      "--kv-events-encoding",
      "positional",
    ]);
    cleanups.push(async () => {
      proc.kill();
      await proc.exit;
    });
    await proc.waitFor(
      /KV events: ZMQ publisher on tcp:\/\/127\.0\.0\.1:\d+ \(topic "kv@p@m", positional\)/,
    );
    await proc.waitFor(/Application startup complete/);
  });
});
