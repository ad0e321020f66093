import { type ChildProcess, spawn } from "node:child_process";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ensureTinyModel, findLlamaServer } from "../src/index.js";
import { eventually, freePort, probe } from "./helpers.js";

const cacheDir = process.env.LLMGW_CACHE_DIR || undefined;
const binary = findLlamaServer({ cacheDir });
const why =
  "llama-server is not built yet: run scripts/build-llamacpp.sh (CI builds it before the tests)";

describe.skipIf(!binary)(
  `the real llama.cpp engine with a generated tiny GGUF${binary ? "" : ` (skipped: ${why})`}`,
  () => {
    let child: ChildProcess;
    let url: string;
    let log = "";

    beforeAll(async () => {
      const model = await ensureTinyModel("tiny", { cacheDir });
      const port = await freePort();
      url = `http://127.0.0.1:${port}`;
      child = spawn(
        binary!,
        [
          "-m",
          model,
          "--host",
          "127.0.0.1",
          "--port",
          String(port),
          "-t",
          "1",
          "-c",
          "2048",
          "-np",
          "2",
          "--metrics",
        ],
        {
          stdio: ["ignore", "pipe", "pipe"],
        },
      );
      child.stdout?.on("data", (d: Buffer) => {
        log += d.toString();
      });
      child.stderr?.on("data", (d: Buffer) => {
        log += d.toString();
      });
      await eventually(async () => (await probe(`${url}/health`)) === 200, 30_000).catch(
        (error: unknown) => {
          throw new Error(
            `llama-server never became healthy: ${String(error)}\n${log.slice(-3000)}`,
          );
        },
      );
    });

    afterAll(async () => {
      if (child && child.exitCode === null) {
        const exited = new Promise((resolve) => child.once("exit", resolve));
        child.kill("SIGTERM");
        await exited;
      }
    });

    it("answers /health with status ok", async () => {
      const res = await fetch(`${url}/health`);
      expect(res.status).toBe(200);
      expect(await res.json()).toEqual({ status: "ok" });
    });

    it("serves chat completions through the openai client, streaming and not", async () => {
      const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: "unused", maxRetries: 0 });
      // A random-weight model may pick an end-of-generation token at any point; llama-server's
      // ignore_eos keeps the length (and so the finish reason) predictable.
      const r = await client.chat.completions.create({
        model: "tiny",
        messages: [{ role: "user", content: "hello there" }],
        max_tokens: 8,
        temperature: 0,
        ignore_eos: true,
      } as OpenAI.ChatCompletionCreateParamsNonStreaming);
      expect(r.choices[0]?.finish_reason).toBe("length");
      expect(r.usage?.completion_tokens).toBe(8);
      const stream = await client.chat.completions.create({
        model: "tiny",
        messages: [{ role: "user", content: "hello there" }],
        max_tokens: 8,
        temperature: 0,
        ignore_eos: true,
        stream: true,
      } as OpenAI.ChatCompletionCreateParamsStreaming);
      let text = "";
      let chunks = 0;
      for await (const chunk of stream) {
        chunks += 1;
        text += chunk.choices[0]?.delta.content ?? "";
      }
      expect(chunks).toBeGreaterThan(2);
      // Greedy decoding on the same prompt is deterministic.
      expect(text).toBe(r.choices[0]?.message.content);
    });

    it("exposes llamacpp: metrics", async () => {
      const text = await (await fetch(`${url}/metrics`)).text();
      expect(text).toMatch(/^llamacpp:prompt_tokens_total \d+/m);
      expect(text).toMatch(/^llamacpp:tokens_predicted_total \d+/m);
    });
  },
);
