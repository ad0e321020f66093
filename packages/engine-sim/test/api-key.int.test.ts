import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { ENGINE_SIM_API_KEY_ENV, type RunningEngineSim, startEngineSim } from "../src/index.js";
import { freePort, type SimProcess, spawnSim } from "./helpers.js";

const KEY = "llmgw-engine-test-key-0123456789";
const MODEL = "sim-model";

async function get(
  url: string,
  authorization?: string,
): Promise<{ status: number; body: unknown }> {
  const res = await fetch(url, authorization === undefined ? {} : { headers: { authorization } });
  const text = await res.text();
  return { status: res.status, body: text === "" ? undefined : JSON.parse(text) };
}

describe("an engine with an API key answers only callers that send it", () => {
  let sim: RunningEngineSim;
  beforeAll(async () => {
    sim = await startEngineSim({ model: MODEL, port: 0, apiKey: KEY, warmupSeconds: 0 });
  });
  afterAll(async () => {
    await sim.close();
  });

  it.each([
    { what: "no Authorization header", authorization: undefined },
    { what: "a wrong key", authorization: "Bearer llmgw-engine-wrong" },
    { what: "the key without the Bearer scheme", authorization: KEY },
    { what: "a prefix of the key", authorization: `Bearer ${KEY.slice(0, -1)}` },
  ])("refuses /v1/models with $what: 401, OpenAI-shaped", async ({ authorization }) => {
    const r = await get(`${sim.url}/v1/models`, authorization);
    expect(r.status).toBe(401);
    expect(r.body).toEqual({
      error: {
        message: "Invalid API key: send Authorization: Bearer <key>",
        type: "authentication_error",
        param: null,
        code: 401,
      },
    });
  });

  it("refuses an inference request without the key before reading it", async () => {
    const res = await fetch(`${sim.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: MODEL, messages: [{ role: "user", content: "hi" }] }),
    });
    expect(res.status).toBe(401);
    await res.arrayBuffer();
  });

  it("serves the right key, and keeps /health and /metrics open like vLLM", async () => {
    const models = await get(`${sim.url}/v1/models`, `Bearer ${KEY}`);
    expect(models.status).toBe(200);
    expect((await fetch(`${sim.url}/health`)).status).toBe(200);
    const metrics = await fetch(`${sim.url}/metrics`);
    expect(metrics.status).toBe(200);
    expect(await metrics.text()).toContain("vllm:");
  });
});

describe("engine-sim on the command line", () => {
  let p: SimProcess | undefined;
  afterEach(() => p?.kill());

  it(`takes its key from $${ENGINE_SIM_API_KEY_ENV}, never from argv`, async () => {
    const port = await freePort();
    p = spawnSim(["--model", MODEL, "--port", String(port), "--warmup-seconds", "0"], {
      [ENGINE_SIM_API_KEY_ENV]: KEY,
    });
    await p.waitFor(/running on|Application startup complete/i);
    const base = `http://127.0.0.1:${port}`;
    expect((await get(`${base}/v1/models`)).status).toBe(401);
    expect((await get(`${base}/v1/models`, `Bearer ${KEY}`)).status).toBe(200);
  });

  it("refuses a key that cannot be sent in a header, without echoing it", async () => {
    p = spawnSim(["--model", MODEL, "--port", "0"], { [ENGINE_SIM_API_KEY_ENV]: "two words" });
    const exit = await p.exit;
    expect(exit.code).toBe(2);
    expect(p.output()).toContain(
      "apiKey must be 1-512 printable ASCII characters without spaces (got 9 characters)",
    );
    expect(p.output()).not.toContain("two words");
  });
});
