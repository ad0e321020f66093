import { afterEach, describe, expect, it } from "vitest";
import {
  type EngineSimOptions,
  isEngineSimError,
  type RunningEngineSim,
  startEngineSim,
} from "../src/index.js";
import { eventually, freePort, probe, spawnSim } from "./helpers.js";

const sims: RunningEngineSim[] = [];
afterEach(async () => {
  await Promise.all(sims.splice(0).map((s) => s.close()));
});

async function sim(options: Partial<EngineSimOptions>): Promise<RunningEngineSim> {
  const s = await startEngineSim({ model: "m", port: 0, timeScale: 10, ...options });
  sims.push(s);
  return s;
}

function chat(
  s: RunningEngineSim,
  extra: Record<string, unknown> = {},
  signal?: AbortSignal,
): Promise<Response> {
  return fetch(`${s.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: "m",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 5,
      ...extra,
    }),
    signal,
  });
}

describe("startup like a real engine", () => {
  it("vLLM: keeps the port closed while loading, then 200 with an empty body and a readiness line", async () => {
    const port = await freePort();
    const lines: string[] = [];
    const starting = startEngineSim({
      model: "m",
      port,
      loadSeconds: 0.6,
      log: (l) => lines.push(l),
    });
    await new Promise((r) => setTimeout(r, 200));
    expect(await probe(`http://127.0.0.1:${port}/health`)).toBe("refused");
    const s = await starting;
    sims.push(s);
    const res = await fetch(`${s.url}/health`);
    expect([res.status, await res.text()]).toEqual([200, ""]);
    expect(lines.join("\n")).toMatch(
      new RegExp(
        `INFO \\d\\d-\\d\\d \\d\\d:\\d\\d:\\d\\d \\[api_server.py:1971\\] Starting vLLM API server 0 on http://127.0.0.1:${port}`,
      ),
    );
  });

  it("SGLang: answers 503 on /health while warming up, then 200, with SGLang metrics and models", async () => {
    const port = await freePort();
    const lines: string[] = [];
    const starting = startEngineSim({
      model: "/m",
      servedModelName: "served",
      mimic: "sglang",
      port,
      warmupSeconds: 1,
      log: (l) => lines.push(l),
    });
    const seen: (number | "refused")[] = [];
    let inferenceWhileWarming: number | undefined;
    await eventually(async () => {
      const status = await probe(`http://127.0.0.1:${port}/health`);
      if (seen.at(-1) !== status) seen.push(status);
      if (status === 503 && inferenceWhileWarming === undefined) {
        const r = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
          method: "POST",
          body: '{"prompt":"x"}',
        });
        inferenceWhileWarming = r.status;
        await r.arrayBuffer();
      }
      return status === 200;
    });
    sims.push(await starting);
    expect(seen.filter((s) => s !== "refused")).toEqual([503, 200]);
    expect(inferenceWhileWarming).toBe(503);
    expect(lines.join("\n")).toMatch(
      /^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] The server is fired up and ready to roll!$/m,
    );
    const models = await (await fetch(`http://127.0.0.1:${port}/v1/models`)).json();
    expect(models).toMatchObject({
      data: [{ id: "served", owned_by: "sglang", root: "/m", max_model_len: 8192 }],
    });
    const metrics = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
    expect(metrics).toMatch(/^sglang:num_queue_reqs\{model_name="served",tp_rank="0"\} 0\.0$/m);
    expect(metrics).toMatch(/^sglang:token_usage\{/m);
    expect(metrics).not.toMatch(/vllm:/);
  });
});

describe("faults on demand", () => {
  it("--fail-load: refuses to load with an error line and LLMGW_ENGINE_SIM_LOAD_FAILED", async () => {
    const lines: string[] = [];
    const error = await startEngineSim({
      model: "m",
      port: 0,
      faults: { failLoad: true },
      log: (l) => lines.push(l),
    }).catch((e: unknown) => e);
    expect(isEngineSimError(error) && error.code).toBe("LLMGW_ENGINE_SIM_LOAD_FAILED");
    expect(lines.at(-1)).toMatch(
      /^ERROR .* engine-sim failed: torch.OutOfMemoryError: CUDA out of memory/,
    );
  });

  it("--fail-load as a process: exits 1 during loading", async () => {
    const p = spawnSim(["--model", "m", "--port", "0", "--fail-load", "--load-seconds", "0.2"]);
    try {
      expect((await p.exit).code).toBe(1);
      expect(p.output()).toMatch(/ERROR .*CUDA out of memory/);
    } finally {
      p.kill();
    }
  });

  it("--crash-after-requests: answers N requests, then drops the port and exits 1", async () => {
    const s = await sim({ faults: { crashAfterRequests: 2 } });
    expect((await chat(s)).status).toBe(200);
    expect((await chat(s)).status).toBe(200);
    const report = await s.exited;
    expect(report).toEqual({
      exitCode: 1,
      reason: "simulated crash after 2 requests (--crash-after-requests)",
    });
    expect(await probe(`${s.url}/health`)).toBe("refused");
  });

  it("--hang-after-requests: accepts the next request and never answers, /health stays 200", async () => {
    const s = await sim({ faults: { hangAfterRequests: 1 } });
    expect((await chat(s)).status).toBe(200);
    const hung = await chat(s, {}, AbortSignal.timeout(700)).catch((e: unknown) => e);
    expect((hung as Error).name).toBe("TimeoutError");
    expect(await probe(`${s.url}/health`)).toBe(200);
  });

  it.each([
    [1, 20, 0],
    [0.5, 40, 1],
  ])("--error-rate %f: answers that fraction with OpenAI-shaped 500s", async (rate, n, minOk) => {
    const s = await sim({ faults: { errorRate: rate }, seed: 1 });
    const statuses = await Promise.all(
      Array.from({ length: n }, () =>
        chat(s).then(async (r) => [r.status, await r.json()] as const),
      ),
    );
    const errors = statuses.filter(([status]) => status === 500);
    expect(errors[0]?.[1]).toMatchObject({ error: { type: "InternalServerError", code: 500 } });
    expect(statuses.length - errors.length).toBeGreaterThanOrEqual(minOk);
    if (rate === 0.5) expect(errors.length).toBeGreaterThan(5);
    else expect(errors.length).toBe(n);
  });

  it("--slow-token-ms: adds the delay to every token of a stream", async () => {
    const timed = async (options: Partial<EngineSimOptions>): Promise<number> => {
      const s = await sim({ timeScale: 1, ...options });
      const t0 = performance.now();
      await (await chat(s, { stream: true, max_tokens: 6 })).text();
      return performance.now() - t0;
    };
    const slow = await timed({ faults: { slowTokenMs: 80 } });
    const normal = await timed({});
    expect(slow).toBeGreaterThanOrEqual(6 * 80);
    expect(slow).toBeGreaterThan(normal + 200);
  });

  it("--die-mid-stream-after-tokens: the stream breaks after N tokens and the engine exits 1", async () => {
    const s = await sim({ faults: { dieMidStreamAfterTokens: 3 } });
    const res = await chat(s, { stream: true, max_tokens: 50 });
    const body = await res.text().catch((e: unknown) => `ERR ${String(e)}`);
    expect(body).toMatch(/terminated|ERR/);
    const report = await s.exited;
    expect(report.exitCode).toBe(1);
    expect(report.reason).toBe(
      "simulated death mid-stream after 3 tokens (--die-mid-stream-after-tokens)",
    );
  });
});

describe("continuous batching through the server", () => {
  it("queues requests beyond --max-num-seqs (visible in /metrics while running)", async () => {
    const s = await sim({ timeScale: 1, timing: { maxRunningSeqs: 2, maxBatchedTokens: 64 } });
    const pending = Array.from({ length: 5 }, () =>
      chat(s, { max_tokens: 20, ignore_eos: true }).then((r) => r.json()),
    );
    await new Promise((r) => setTimeout(r, 100));
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).toMatch(/^vllm:num_requests_running\{engine="0",model_name="m"\} 2\.0$/m);
    expect(metrics).toMatch(/^vllm:num_requests_waiting\{engine="0",model_name="m"\} 3\.0$/m);
    const done = (await Promise.all(pending)) as { usage: { completion_tokens: number } }[];
    expect(done.map((d) => d.usage.completion_tokens)).toEqual([20, 20, 20, 20, 20]);
  });

  it("aborts a stream whose client goes away and counts it", async () => {
    const s = await sim({ timeScale: 1 });
    const controller = new AbortController();
    const res = await chat(
      s,
      { stream: true, max_tokens: 200, ignore_eos: true },
      controller.signal,
    );
    const reader = res.body!.getReader();
    await reader.read();
    controller.abort();
    await eventually(async () => s.stats().activeRequests === 0, 5000);
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    expect(metrics).toMatch(
      /^vllm:request_success_total\{engine="0",finished_reason="abort",model_name="m"\} 1\.0$/m,
    );
    expect(s.stats().timing.running).toBe(0);
  });
});
