import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type RunningEngineSim, startEngineSim } from "../src/index.js";

const MODEL = "meta-llama/Llama-3.1-8B-Instruct";
let sim: RunningEngineSim;
let client: OpenAI;

beforeAll(async () => {
  sim = await startEngineSim({
    model: "/models/llama-8b",
    servedModelName: MODEL,
    port: 0,
    maxModelLen: 1024,
    timeScale: 20,
    seed: 7,
  });
  client = new OpenAI({ baseURL: `${sim.url}/v1`, apiKey: "unused", maxRetries: 0 });
});
afterAll(async () => {
  await sim.close();
});

async function post(path: string, body: string): Promise<{ status: number; json: unknown }> {
  const res = await fetch(`${sim.url}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body,
  });
  return { status: res.status, json: await res.json() };
}

describe("the simulated engine through the official openai client", () => {
  it("answers a chat completion with usage and finish_reason length at max_tokens", async () => {
    const r = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: "user", content: "Say something." }],
      max_tokens: 5,
    });
    expect(r.object).toBe("chat.completion");
    expect(r.model).toBe(MODEL);
    expect(r.choices[0]?.finish_reason).toBe("length");
    expect(r.choices[0]?.message.role).toBe("assistant");
    // "<|user|>\nSay something.\n<|assistant|>\n" is 38 characters: 10 tokens at 4 chars/token.
    expect(r.usage).toEqual({
      prompt_tokens: 10,
      completion_tokens: 5,
      total_tokens: 15,
      // vLLM without --enable-prompt-tokens-details: UsageInfo's unset field dumps as null.
      prompt_tokens_details: null,
    });
  });

  it("ends the output before the first stop string, with finish_reason stop and its stop_reason", async () => {
    const body = { model: MODEL, prompt: "tell me a story ".repeat(10), max_tokens: 200 };
    const complete = async (extra: object) => {
      const r = await post(
        "/v1/completions",
        JSON.stringify({ ...body, ignore_eos: true, ...extra }),
      );
      expect(r.status).toBe(200);
      return r.json as {
        choices: { text: string; finish_reason: string; stop_reason: string | null }[];
        usage: { completion_tokens: number };
      };
    };
    const free = await complete({});
    const cut = free.choices[0]!.text.indexOf(" the");
    expect(cut).toBeGreaterThanOrEqual(0);
    const stopped = await complete({ stop: [" nope", " the"] });
    expect(stopped.choices[0]).toMatchObject({
      text: free.choices[0]!.text.slice(0, cut),
      finish_reason: "stop",
      stop_reason: " the",
    });
    // vLLM counts every generated token, the one that completed the stop string included.
    expect(stopped.usage.completion_tokens).toBe(Math.ceil((cut + 4) / 4));
    const kept = await complete({ stop: " the", include_stop_str_in_output: true });
    expect(kept.choices[0]?.text).toBe(free.choices[0]!.text.slice(0, cut + 4));
  });

  it("stops a chat stream at a stop string too, stop_reason on its last chunk", async () => {
    const ask = { model: MODEL, messages: [{ role: "user" as const, content: "Go on." }] };
    const whole = await client.chat.completions.create({ ...ask, max_tokens: 300, seed: 5 });
    const content = whole.choices[0]?.message.content ?? "";
    const stop = content.slice(40, 48); // two output tokens of the answer
    const cut = content.indexOf(stop);
    const stream = await client.chat.completions.create({
      ...ask,
      max_tokens: 300,
      seed: 5,
      stop,
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    const text = chunks.flatMap((c) => c.choices.map((ch) => ch.delta.content ?? "")).join("");
    expect(text).toBe(content.slice(0, cut));
    const last = chunks.flatMap((c) => c.choices).at(-1) as Record<string, unknown> | undefined;
    expect(last).toMatchObject({ finish_reason: "stop", stop_reason: stop });
    expect(chunks.at(-1)?.usage?.completion_tokens).toBe(Math.ceil((cut + stop.length) / 4));
  });

  it("refuses a stop that is not a string or an array of strings", async () => {
    const r = await post("/v1/completions", JSON.stringify({ prompt: "x", stop: [1] }));
    expect(r).toMatchObject({
      status: 400,
      json: { error: { message: "stop must be a string or an array of strings", param: "stop" } },
    });
  });

  it("finishes with stop before a generous max_tokens and is deterministic for a seed", async () => {
    const ask = () =>
      client.chat.completions.create({
        model: MODEL,
        messages: [
          {
            role: "user",
            content: "Tell me about GPUs, at length, in a way that fills a few KV blocks.",
          },
        ],
        max_tokens: 900,
        seed: 3,
      });
    const [a, b] = [await ask(), await ask()];
    expect(a.choices[0]?.finish_reason).toBe("stop");
    expect(a.usage!.completion_tokens).toBeGreaterThanOrEqual(16);
    expect(a.usage!.completion_tokens).toBeLessThanOrEqual(256);
    expect(b.choices[0]?.message.content).toBe(a.choices[0]?.message.content);
  });

  it("streams chat chunks, then a usage chunk when include_usage is set", async () => {
    const stream = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: "user", content: "Stream please." }],
      max_tokens: 8,
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    const content = chunks.flatMap((c) => c.choices.map((ch) => ch.delta.content ?? "")).join("");
    const finish = chunks.flatMap((c) => c.choices.map((ch) => ch.finish_reason)).filter(Boolean);
    expect(chunks[0]?.choices[0]?.delta.role).toBe("assistant");
    expect(content.length).toBeGreaterThan(0);
    expect(finish).toEqual(["length"]);
    expect(chunks.at(-1)?.choices).toEqual([]);
    expect(chunks.at(-1)?.usage).toMatchObject({ completion_tokens: 8 });
  });

  it("serves /v1/completions streaming and not", async () => {
    const r = await client.completions.create({
      model: MODEL,
      prompt: "Once upon a time",
      max_tokens: 4,
    });
    expect(r.choices[0]?.finish_reason).toBe("length");
    expect(r.usage?.completion_tokens).toBe(4);
    const stream = await client.completions.create({
      model: MODEL,
      prompt: "Once upon a time",
      max_tokens: 4,
      stream: true,
    });
    let text = "";
    for await (const chunk of stream) text += chunk.choices[0]?.text ?? "";
    expect(text).toBe(r.choices[0]?.text);
  });

  it("serves embeddings (float and base64)", async () => {
    const r = await client.embeddings.create({ model: MODEL, input: ["alpha", "beta"] });
    expect(r.data.map((d) => d.embedding.length)).toEqual([64, 64]);
    const norm = Math.sqrt(r.data[0]!.embedding.reduce((s, x) => s + x * x, 0));
    expect(norm).toBeCloseTo(1, 4);
    const f = await client.embeddings.create({
      model: MODEL,
      input: "alpha",
      encoding_format: "float",
    });
    expect(f.data[0]!.embedding[0]).toBeCloseTo(r.data[0]!.embedding[0]!, 6);
  });

  it.each([
    [
      "unknown model",
      { model: "nope", messages: [{ role: "user", content: "x" }] },
      404,
      "The model `nope` does not exist.",
    ],
    [
      "over-long prompt",
      { model: MODEL, messages: [{ role: "user", content: "x".repeat(5000) }] },
      400,
      "This model's maximum context length is 1024 tokens. However, your request has 1256 input tokens. Please reduce the length of the input messages.",
    ],
    [
      "prompt + max_tokens over the context",
      { model: MODEL, messages: [{ role: "user", content: "hello" }], max_tokens: 1020 },
      400,
      "This model's maximum context length is 1024 tokens. However, you requested 1028 tokens (8 in the messages, 1020 in the completion). Please reduce the length of the messages or completion.",
    ],
    ["missing messages", { model: MODEL }, 400, "messages must be a non-empty array"],
    [
      "n > 1",
      { model: MODEL, messages: [{ role: "user", content: "x" }], n: 2 },
      400,
      "engine-sim only supports n=1",
    ],
  ])(
    "rejects %s through the client with the right status and message",
    async (_name, body, status, message) => {
      const error = await client.chat.completions
        .create(body as unknown as OpenAI.ChatCompletionCreateParamsNonStreaming)
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(OpenAI.APIError);
      expect((error as InstanceType<typeof OpenAI.APIError>).status).toBe(status);
      expect((error as InstanceType<typeof OpenAI.APIError>).message).toBe(`${status} ${message}`);
    },
  );

  it("answers bad JSON with an OpenAI error body", async () => {
    const r = await post("/v1/chat/completions", "{not json");
    expect(r.status).toBe(400);
    expect(r.json).toMatchObject({ error: { type: "BadRequestError", code: 400, param: null } });
    expect((r.json as { error: { message: string } }).error.message).toMatch(
      /^Invalid JSON body: /,
    );
  });

  it("refuses bodies over the size limit with 413", async () => {
    const small = await startEngineSim({ model: "m", port: 0, maxBodyBytes: 1000 });
    try {
      const res = await fetch(`${small.url}/v1/completions`, {
        method: "POST",
        body: JSON.stringify({ model: "m", prompt: "p".repeat(5000) }),
      });
      expect(res.status).toBe(413);
      expect(await res.json()).toMatchObject({
        error: { code: 413, type: "RequestEntityTooLarge" },
      });
    } finally {
      await small.close();
    }
  });

  it("lists the served model with max_model_len in the vLLM shape", async () => {
    const models = (await (await fetch(`${sim.url}/v1/models`)).json()) as {
      data: Record<string, unknown>[];
    };
    expect(models.data).toHaveLength(1);
    expect(models.data[0]).toMatchObject({
      id: MODEL,
      object: "model",
      owned_by: "vllm",
      root: "/models/llama-8b",
      parent: null,
      max_model_len: 1024,
    });
    const health = await fetch(`${sim.url}/health`);
    expect([health.status, await health.text()]).toEqual([200, ""]);
  });

  it("exposes vLLM metrics that count the traffic above", async () => {
    const text = await (await fetch(`${sim.url}/metrics`)).text();
    const labels = `engine="0",model_name="${MODEL}"`;
    for (const name of [
      "vllm:num_requests_running",
      "vllm:num_requests_waiting",
      "vllm:kv_cache_usage_perc",
      "vllm:prefix_cache_queries_total",
      "vllm:prefix_cache_hits_total",
      "vllm:prompt_tokens_total",
      "vllm:generation_tokens_total",
      "vllm:time_to_first_token_seconds_count",
      "vllm:inter_token_latency_seconds_count",
    ]) {
      expect(text).toMatch(new RegExp(`^${name}\\{${labels}\\} \\d`, "m"));
    }
    const generated = Number(/^vllm:generation_tokens_total\{[^}]*\} (\S+)$/m.exec(text)?.[1]);
    expect(generated).toBeGreaterThan(30);
    const hits = Number(/^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)$/m.exec(text)?.[1]);
    expect(hits).toBeGreaterThan(0); // the seeded question was asked twice
  });
});
