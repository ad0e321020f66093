import { createServer, type IncomingMessage, type Server } from "node:http";
import { afterEach, describe, expect, it } from "vitest";
import { runOpenLoop } from "./client.js";

/** What the fake engine saw of one request. */
interface Seen {
  readonly sessionHeader: string | undefined;
  readonly body: Record<string, unknown>;
}

/** A real HTTP server on port 0 answering every chat request with a short SSE stream. */
async function fakeEngine(usage: unknown): Promise<{ url: string; seen: Seen[]; server: Server }> {
  const seen: Seen[] = [];
  const server = createServer((req: IncomingMessage, res) => {
    let text = "";
    req.on("data", (d: Buffer) => {
      text += d.toString();
    });
    req.on("end", () => {
      seen.push({
        sessionHeader: req.headers["x-session-id"] as string | undefined,
        body: JSON.parse(text) as Record<string, unknown>,
      });
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write(
        `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: "hi" } }] })}\n\n`,
      );
      if (usage !== undefined) res.write(`data: ${JSON.stringify({ choices: [], usage })}\n\n`);
      res.end("data: [DONE]\n\n");
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const { port } = server.address() as { port: number };
  return { url: `http://127.0.0.1:${port}`, seen, server };
}

const servers: Server[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => new Promise((r) => s.close(r))));
});

const run = (url: string, hints?: boolean) =>
  runOpenLoop({
    url,
    model: "m",
    conversations: [{ session: "t3", system: "sys", turns: ["a"] }],
    ratePerSecond: 1000,
    maxTokens: 4,
    requestTimeoutMs: 5000,
    ...(hints === undefined ? {} : { hints }),
  });

describe("runOpenLoop", () => {
  it.each<[string, unknown, { promptTokens?: number; cachedTokens?: number }]>([
    [
      "usage with cached_tokens",
      { prompt_tokens: 40, completion_tokens: 1, prompt_tokens_details: { cached_tokens: 32 } },
      { promptTokens: 40, cachedTokens: 32 },
    ],
    ["usage without details", { prompt_tokens: 40, completion_tokens: 1 }, { promptTokens: 40 }],
    [
      "details null (vLLM without --enable-prompt-tokens-details)",
      { prompt_tokens: 40, completion_tokens: 1, prompt_tokens_details: null },
      { promptTokens: 40 },
    ],
    ["no usage chunk", undefined, {}],
  ])("reads the final usage chunk: %s", async (_, usage, expected) => {
    const engine = await fakeEngine(usage);
    servers.push(engine.server);
    const { samples } = await run(engine.url);
    expect(samples).toHaveLength(1);
    const [sample] = samples;
    expect(sample?.ok).toBe(true);
    expect({ promptTokens: sample?.promptTokens, cachedTokens: sample?.cachedTokens }).toEqual({
      promptTokens: expected.promptTokens,
      cachedTokens: expected.cachedTokens,
    });
  });

  it.each([
    [true, "t3", "t3"],
    [false, undefined, undefined],
  ])(
    "hints %s: x-session-id %s, prompt_cache_key %s, usage asked for",
    async (hints, header, key) => {
      const engine = await fakeEngine(undefined);
      servers.push(engine.server);
      await run(engine.url, hints);
      expect(engine.seen).toHaveLength(1);
      const [seen] = engine.seen;
      expect(seen?.sessionHeader).toBe(header);
      expect(seen?.body.prompt_cache_key).toBe(key);
      expect(seen?.body.stream_options).toEqual({ include_usage: true });
    },
  );

  it.each<[string, number | undefined, string[]]>([
    ["every turn, new conversations first", undefined, ["a0", "b0", "c0", "a1", "b1", "c1"]],
    // Seed 11 at 10 a second: arrivals 72–94 ms apart, each after the answer before it.
    ["a pool: answered conversations first, then stop", 4, ["a0", "a1", "b0", "b1"]],
  ])("sends %s", async (_, requests, expected) => {
    const engine = await fakeEngine(undefined);
    servers.push(engine.server);
    const result = await runOpenLoop({
      url: engine.url,
      model: "m",
      conversations: ["a", "b", "c"].map((session) => ({
        session,
        system: "sys",
        turns: ["one", "two"],
      })),
      ratePerSecond: 10,
      seed: 11,
      maxTokens: 4,
      requestTimeoutMs: 5000,
      ...(requests === undefined ? {} : { requests }),
    });
    const sent = engine.seen.map(
      (s) => `${s.sessionHeader}${((s.body.messages as unknown[]).length - 2) / 2}`,
    );
    expect(sent).toEqual(expected);
    expect(result.samples).toHaveLength(expected.length);
  });
});
