/**
 * Exact usage against the real llama.cpp server: what the router records for each request
 * through the official `openai` client (streams that asked for usage, streams that did not,
 * plain answers, completions) adds up to the engine's own counters on its `/metrics`, token
 * for token: prompt = processed + cached, completion = predicted.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { ensureTinyModel, findLlamaServer } from "@llmgw/engine-sim";
import { freePort } from "@llmgw/supervisor";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningRouter } from "../src/index.js";
import { routingSnapshot, startFedRouter } from "./routing-fixture.js";

const cacheDir = process.env.LLMGW_CACHE_DIR || undefined;
const llamaServer = findLlamaServer({ cacheDir });

/** The engine's own counters: `llamacpp:<name>` on its `/metrics`. */
async function engineCounters(url: string): Promise<Record<string, number>> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const out: Record<string, number> = {};
  for (const line of text.split("\n")) {
    const m = /^llamacpp:(\w+) (\S+)$/.exec(line);
    if (m) out[m[1] as string] = Number(m[2]);
  }
  return out;
}

describe.skipIf(llamaServer === undefined)(
  `router usage against the real llama.cpp server${llamaServer ? "" : " (skipped: llama-server is not built; run scripts/build-llamacpp.sh, CI builds it before tests)"}`,
  () => {
    let engine: ChildProcess | undefined;
    let engineUrl = "";
    let router: RunningRouter | undefined;
    let feed: Awaited<ReturnType<typeof startFedRouter>>["feed"];

    beforeAll(async () => {
      const model = await ensureTinyModel("tiny", cacheDir === undefined ? {} : { cacheDir });
      const port = await freePort();
      engineUrl = `http://127.0.0.1:${port}`;
      engine = spawn(
        llamaServer as string,
        ["-m", model, "--host", "127.0.0.1", "--port", String(port), "-c", "1024", "--metrics"],
        { stdio: "ignore" },
      );
      const deadline = Date.now() + 30_000;
      for (;;) {
        const ok = await fetch(`${engineUrl}/health`).then(
          (r) => r.ok,
          () => false,
        );
        if (ok) break;
        if (Date.now() > deadline) throw new Error("llama-server did not become healthy in 30 s");
        await new Promise((r) => setTimeout(r, 100));
      }
      ({ router, feed } = await startFedRouter({
        snapshot: routingSnapshot({
          models: { tiny: { replicas: [{ id: "l0", baseUrl: engineUrl, gpus: 1 }] } },
          keys: { "sk-l": { id: "key-l", name: "l" } },
        }),
        usageReportIntervalMs: 20,
      }));
    }, 60_000);

    afterAll(async () => {
      await router?.close();
      engine?.kill("SIGKILL");
    });

    it("records what the engine counted, streams the client did not ask usage for included", async () => {
      const client = new OpenAI({
        baseURL: `${(router as RunningRouter).url}/v1`,
        apiKey: "sk-l",
        maxRetries: 0,
      });
      const messages = (i: number) => [
        { role: "user" as const, content: `tell me about routers, part ${i}` },
      ];
      let requests = 0;
      for (let i = 0; i < 3; i++) {
        const plain = await client.chat.completions.create({
          model: "tiny",
          messages: messages(i),
          max_tokens: 5,
        });
        expect(plain.usage?.completion_tokens).toBeGreaterThan(0);
        const asked = await client.chat.completions.create({
          model: "tiny",
          messages: messages(i),
          max_tokens: 6,
          stream: true,
          stream_options: { include_usage: true },
        });
        let sawUsage = false;
        for await (const chunk of asked) if (chunk.usage) sawUsage = true;
        expect(sawUsage).toBe(true);
        const unasked = await client.chat.completions.create({
          model: "tiny",
          messages: messages(i + 10),
          max_tokens: 7,
          stream: true,
        });
        for await (const chunk of unasked) {
          // The usage event the router asked for never reaches this client.
          expect(chunk.usage ?? undefined).toBeUndefined();
        }
        const completion = await client.completions.create({
          model: "tiny",
          prompt: `a prompt ${i}`,
          max_tokens: 4,
        });
        expect(completion.usage?.prompt_tokens).toBeGreaterThan(0);
        requests += 4;
      }
      const sums = () =>
        feed.usageBatches
          .flatMap((b) => b.records)
          .reduce(
            (t, r) => ({
              requests: t.requests + r.requests,
              prompt: t.prompt + r.promptTokens,
              cached: t.cached + r.cachedTokens,
              completion: t.completion + r.completionTokens,
              estimated: t.estimated + r.estimatedRequests,
              refused: t.refused + r.refusedUsage,
            }),
            { requests: 0, prompt: 0, cached: 0, completion: 0, estimated: 0, refused: 0 },
          );
      const expected = async () => {
        const c = await engineCounters(engineUrl);
        return {
          requests,
          prompt:
            (c.prompt_tokens_total ?? Number.NaN) + (c.prompt_tokens_cached_total ?? Number.NaN),
          cached: c.prompt_tokens_cached_total,
          completion: c.tokens_predicted_total,
          estimated: 0,
          refused: 0,
        };
      };
      // Both sides settle a moment after the last answer: the router's next usage batch, and
      // llama-server's counters (updated as its slot is released, which may follow the answer).
      const deadline = Date.now() + 5_000;
      let want = await expected();
      while (JSON.stringify(sums()) !== JSON.stringify(want) && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 20));
        want = await expected();
      }
      expect(sums()).toEqual(want);
    });
  },
);
