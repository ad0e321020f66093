/**
 * Prefix-cache isolation (`llmgw router --cache-isolation`): through the router, an engine's
 * cache is shared within a tenant (or a key) and never across, so that no one learns from a
 * cache hit what another tenant sent; a client's own `cache_salt` cannot reach another
 * principal's cache. Against the simulated engine, which keys its cache with `cache_salt` as
 * vLLM does and reports `cached_tokens`; and what the router sends each kind of engine.
 */
import { type ChildProcess, spawn } from "node:child_process";
import {
  ensureTinyModel,
  findLlamaServer,
  type RunningEngineSim,
  startEngineSim,
} from "@llmgw/engine-sim";
import { type CacheIsolation, isolatedSalt, type TenantGrant } from "@llmgw/router";
import { freePort } from "@llmgw/supervisor";
import OpenAI from "openai";
import { afterEach, describe, expect, it } from "vitest";
import type { RunningRouter } from "../src/index.js";
import { type FakeEngine, startFakeEngine } from "./router-fake-engine.js";
import { routingSnapshot, startFedRouter } from "./routing-fixture.js";

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const KEYS = {
  "sk-a1": { id: "key-a1", name: "a1", tenant: "alpha" },
  "sk-a2": { id: "key-a2", name: "a2", tenant: "alpha" },
  "sk-b": { id: "key-b", name: "b", tenant: "beta" },
  "sk-solo": { id: "key-solo", name: "solo" },
};
const TENANTS: TenantGrant[] = [
  { name: "alpha", weight: 1 },
  { name: "beta", weight: 1 },
];

async function simRouter(cacheIsolation: CacheIsolation, tenants: TenantGrant[] = TENANTS) {
  const sim: RunningEngineSim = await startEngineSim({
    model: "m",
    port: 0,
    warmupSeconds: 0,
    timeScale: 50,
    maxOutputTokens: 16,
    enablePromptTokensDetails: true,
  });
  cleanups.push(() => sim.close());
  const { router } = await startFedRouter({
    snapshot: routingSnapshot({
      models: { m: { replicas: [{ id: "r0", baseUrl: sim.url }], cacheIsolation: "salt" } },
      keys: KEYS,
      tenants,
    }),
    router: { cacheIsolation, analyzer: { pool: false } },
  });
  cleanups.push(() => router.close());
  /** The prompt tokens the engine found cached for `key`'s request. */
  const ask = async (key: string, content: string, extra: Record<string, unknown> = {}) => {
    const client = new OpenAI({ apiKey: key, baseURL: `${router.url}/v1`, maxRetries: 0 });
    const answer = await client.chat.completions.create({
      model: "m",
      max_tokens: 2,
      messages: [{ role: "user", content }],
      ...extra,
    });
    const usage = answer.usage as { prompt_tokens_details?: { cached_tokens?: number } };
    return usage.prompt_tokens_details?.cached_tokens ?? 0;
  };
  return Object.assign(ask, { url: router.url });
}

const prompt = (tag: string) =>
  `${tag}: ${"the quarterly report of the secret project ".repeat(20)}`;

describe("cache isolation against the simulated engine", () => {
  it("without it, a tenant's prompt is a cache hit for anyone (what isolation prevents)", async () => {
    const ask = await simRouter("none");
    expect(await ask("sk-a1", prompt("p"))).toBe(0);
    expect(await ask("sk-b", prompt("p"))).toBeGreaterThan(0);
  });

  it("with tenant isolation, shares the cache within a tenant and never across", async () => {
    const ask = await simRouter("tenant");
    expect(await ask("sk-a1", prompt("p"))).toBe(0);
    // The same tenant's other key: a hit.
    expect(await ask("sk-a2", prompt("p"))).toBeGreaterThan(0);
    // Another tenant, and a key of no tenant: misses, then hits on their own caches.
    expect(await ask("sk-b", prompt("p"))).toBe(0);
    expect(await ask("sk-solo", prompt("p"))).toBe(0);
    expect(await ask("sk-b", prompt("p"))).toBeGreaterThan(0);
    expect(await ask("sk-solo", prompt("p"))).toBeGreaterThan(0);
  });

  it("takes no client salt as another principal's: beta cannot send alpha's salt", async () => {
    const ask = await simRouter("tenant");
    expect(await ask("sk-a1", prompt("q"))).toBe(0);
    // The router's own salts are refused from clients, whatever the router's mode: a router
    // left without isolation must not pass one on either.
    const alphas = isolatedSalt("tenant\0alpha", undefined);
    for (const router of [ask, await simRouter("none")]) {
      const refused = await router("sk-b", prompt("q"), { cache_salt: alphas }).catch(
        (error: unknown) => error,
      );
      expect(refused).toBeInstanceOf(OpenAI.BadRequestError);
      expect((refused as InstanceType<typeof OpenAI.BadRequestError>).param).toBe("cache_salt");
    }
    // Any other salt of beta's is hashed under beta: still a miss.
    expect(await ask("sk-b", prompt("q"), { cache_salt: alphas.slice(1) })).toBe(0);
    // A client's own salt still separates within its tenant.
    expect(await ask("sk-a2", prompt("q"), { cache_salt: "mine" })).toBe(0);
    expect(await ask("sk-a1", prompt("q"), { cache_salt: "mine" })).toBeGreaterThan(0);
  });

  it("answers isolated embeddings: the engine takes their salt as vLLM's pooling requests do", async () => {
    const ask = await simRouter("tenant");
    const client = new OpenAI({ apiKey: "sk-a1", baseURL: `${ask.url}/v1`, maxRetries: 0 });
    const answer = await client.embeddings.create({ model: "m", input: prompt("e") });
    expect(answer.data[0]?.embedding.length).toBeGreaterThan(0);
  });

  it("keeps apart the cache of a tenant that asks for it, on a router that shares the rest", async () => {
    const ask = await simRouter("none", [
      { name: "alpha", weight: 1 },
      { name: "beta", weight: 1, cacheIsolation: "tenant" },
    ]);
    // alpha's prompt is no hit for beta, nor beta's for alpha.
    expect(await ask("sk-a1", prompt("t"))).toBe(0);
    expect(await ask("sk-b", prompt("t"))).toBe(0);
    expect(await ask("sk-b", prompt("u"))).toBe(0);
    expect(await ask("sk-a1", prompt("u"))).toBe(0);
    // beta shares with itself; everyone else still shares as the router says.
    expect(await ask("sk-b", prompt("t"))).toBeGreaterThan(0);
    expect(await ask("sk-a2", prompt("t"))).toBeGreaterThan(0);
    expect(await ask("sk-solo", prompt("t"))).toBeGreaterThan(0);
  });

  it("with key isolation, keeps even one tenant's keys apart", async () => {
    const ask = await simRouter("key");
    expect(await ask("sk-a1", prompt("r"))).toBe(0);
    expect(await ask("sk-a2", prompt("r"))).toBe(0);
    expect(await ask("sk-a1", prompt("r"))).toBeGreaterThan(0);
  });
});

describe("what an isolating router sends each engine", () => {
  async function fakeRouter(
    cacheIsolation: CacheIsolation,
    engineIsolation: "salt" | "no-reuse" | undefined,
  ): Promise<{ engine: FakeEngine; router: RunningRouter }> {
    const engine = await startFakeEngine({ name: "e" });
    cleanups.push(() => engine.close());
    const { router } = await startFedRouter({
      snapshot: routingSnapshot({
        models: {
          m: {
            replicas: [{ id: "r0", baseUrl: engine.url }],
            ...(engineIsolation === undefined ? {} : { cacheIsolation: engineIsolation }),
          },
        },
        keys: KEYS,
        tenants: TENANTS,
      }),
      router: { cacheIsolation, analyzer: { pool: false } },
    });
    cleanups.push(() => router.close());
    return { engine, router };
  }
  const post = (router: RunningRouter, path: string, body: unknown) =>
    fetch(`${router.url}${path}`, {
      method: "POST",
      headers: { authorization: "Bearer sk-a1", "content-type": "application/json" },
      body: JSON.stringify(body),
    });
  const chat = { model: "m", messages: [{ role: "user", content: "hi" }], cache_salt: "own" };
  const alphaOwn = isolatedSalt("tenant\0alpha", "own");

  it("vLLM and SGLang: the router's salt, overriding the client's", async () => {
    const { engine, router } = await fakeRouter("tenant", "salt");
    expect((await post(router, "/v1/chat/completions", chat)).status).toBe(200);
    const { body } = engine.received[0] as { body: Record<string, unknown> };
    // The fake engine reads JSON as Python and nlohmann do: the last of a repeated key wins.
    expect(body.cache_salt).toBe(alphaOwn);
    expect(body.cache_prompt).toBeUndefined();
  });

  it("llama.cpp: no reuse for the request; an engine not known: both", async () => {
    const llama = await fakeRouter("tenant", "no-reuse");
    await post(llama.router, "/v1/completions", { model: "m", prompt: "hi" });
    expect(llama.engine.received[0]?.body).toEqual({
      model: "m",
      prompt: "hi",
      cache_prompt: false,
    });
    const unknown = await fakeRouter("tenant", undefined);
    await post(unknown.router, "/v1/chat/completions", chat);
    expect(unknown.engine.received[0]?.body).toMatchObject({
      cache_salt: alphaOwn,
      cache_prompt: false,
    });
  });

  it("salts embeddings too (vLLM caches some embedding models' prefixes)", async () => {
    const isolating = await fakeRouter("tenant", "salt");
    await post(isolating.router, "/v1/embeddings", { model: "m", input: "hi" });
    expect(isolating.engine.received[0]?.body).toEqual({
      model: "m",
      input: "hi",
      cache_salt: isolatedSalt("tenant\0alpha", undefined),
    });
  });

  it("leaves every body of a router that does not isolate as it was", async () => {
    const plain = await fakeRouter("none", "salt");
    await post(plain.router, "/v1/embeddings", { model: "m", input: "hi" });
    expect(plain.engine.received[0]?.body).toEqual({ model: "m", input: "hi" });
    await post(plain.router, "/v1/chat/completions", chat);
    expect(plain.engine.received[1]?.body).toEqual(chat);
  });
});

const cacheDir = process.env.LLMGW_CACHE_DIR || undefined;
const llamaServer = findLlamaServer({ cacheDir });

describe.skipIf(llamaServer === undefined)(
  `cache isolation against the real llama.cpp server${llamaServer ? "" : " (skipped: llama-server is not built; run scripts/build-llamacpp.sh, CI builds it before tests)"}`,
  () => {
    it("turns prompt reuse off for an isolated request, which llama.cpp then computes whole", async () => {
      const model = await ensureTinyModel("tiny", cacheDir === undefined ? {} : { cacheDir });
      const port = await freePort();
      const engineUrl = `http://127.0.0.1:${port}`;
      const engine: ChildProcess = spawn(
        llamaServer as string,
        ["-m", model, "--host", "127.0.0.1", "--port", String(port), "-c", "1024"],
        { stdio: "ignore" },
      );
      cleanups.push(async () => {
        engine.kill("SIGKILL");
      });
      const deadline = Date.now() + 30_000;
      while (
        !(await fetch(`${engineUrl}/health`).then(
          (r) => r.ok,
          () => false,
        ))
      ) {
        if (Date.now() > deadline) throw new Error("llama-server did not become healthy in 30 s");
        await new Promise((r) => setTimeout(r, 100));
      }
      const routerWith = async (cacheIsolation: CacheIsolation) => {
        const { router } = await startFedRouter({
          snapshot: routingSnapshot({
            models: {
              tiny: { replicas: [{ id: "l0", baseUrl: engineUrl }], cacheIsolation: "no-reuse" },
            },
            keys: KEYS,
            tenants: TENANTS,
          }),
          router: { cacheIsolation },
        });
        cleanups.push(() => router.close());
        return new OpenAI({ apiKey: "sk-a1", baseURL: `${router.url}/v1`, maxRetries: 0 });
      };
      const cached = async (client: OpenAI) => {
        const answer = await client.chat.completions.create({
          model: "tiny",
          max_tokens: 3,
          messages: [
            { role: "user", content: "tell me about the routers of the world, in detail" },
          ],
        });
        return (answer.usage as { prompt_tokens_details?: { cached_tokens?: number } })
          .prompt_tokens_details?.cached_tokens;
      };
      const plain = await routerWith("none");
      await cached(plain);
      expect(await cached(plain)).toBeGreaterThan(0);
      const isolated = await routerWith("tenant");
      expect(await cached(isolated)).toBe(0);
      expect(await cached(isolated)).toBe(0);
    }, 60_000);
  },
);
