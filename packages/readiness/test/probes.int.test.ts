import { createServer, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import {
  createReadinessProbe,
  isReadinessError,
  probeHealth,
  probeModels,
  probeReadiness,
  scrapeEngineLoad,
  waitForReadiness,
} from "@llmgw/readiness";
import { afterEach, describe, expect, it } from "vitest";

// vLLM /v1/models body, verbatim from formats.md §4.5.
const VLLM_MODELS = `{"object":"list","data":[{"id":"swiss-ai/Apertus-8B-Instruct-2509","object":"model","created":1777903758,"owned_by":"vllm","root":"swiss-ai/Apertus-8B-Instruct-2509","parent":null,"max_model_len":65536,"permission":[{"id":"modelperm-97715325774948e5870d47f15f717fbb","object":"model_permission","created":1777903758,"allow_create_engine":false,"allow_sampling":true,"allow_logprobs":true,"allow_search_indices":false,"allow_view":true,"allow_fine_tuning":false,"organization":"*","group":null,"is_blocking":false}]}]}`;
const MODEL = "swiss-ai/Apertus-8B-Instruct-2509";

type Phase = "503" | "health-only" | "ready" | "hang" | "500" | "bad-json";

const servers: Server[] = [];
afterEach(async () => {
  for (const server of servers.splice(0)) {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
});

/** A real engine stand-in on 127.0.0.1:0 whose behaviour follows `phase.current`. */
async function engineServer(initial: Phase) {
  const phase = { current: initial };
  const server = createServer((req, res: ServerResponse) => {
    const p = phase.current;
    if (p === "hang") return; // never answers
    if (p === "503") return void res.writeHead(503).end();
    if (p === "500") return void res.writeHead(500).end();
    if (req.url === "/health") return void res.writeHead(200).end();
    if (req.url === "/v1/models") {
      if (p === "bad-json") return void res.writeHead(200).end("<html>");
      const body = p === "ready" ? VLLM_MODELS : `{"object":"list","data":[]}`;
      return void res.writeHead(200, { "content-type": "application/json" }).end(body);
    }
    if (req.url === "/metrics") {
      return void res
        .writeHead(200)
        .end(
          'vllm:num_requests_running{engine="0",model_name="m"} 2.0\nvllm:num_requests_waiting{model_name="m",engine="0"} 1.0\n',
        );
    }
    res.writeHead(404).end();
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, phase };
}

/** A URL on which nothing listens. */
async function refusedUrl(): Promise<string> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  await new Promise((resolve) => server.close(resolve));
  return `http://127.0.0.1:${port}`;
}

describe("probeReadiness against real servers", () => {
  it("connection refused → starting", async () => {
    const report = await probeReadiness(await refusedUrl(), MODEL);
    expect(report.state).toBe("starting");
    expect(report.checks.map((c) => c.check)).toEqual(["health"]);
    expect(report.detail).toMatch(/^health: connection refused after \d+ ms$/);
  });

  it("503 → starting", async () => {
    const { url } = await engineServer("503");
    const report = await probeReadiness(url, MODEL);
    expect(report.state).toBe("starting");
    expect(report.detail).toMatch(/^health: HTTP 503 after \d+ ms$/);
  });

  it("health OK, model not listed → loading", async () => {
    const { url } = await engineServer("health-only");
    const report = await probeReadiness(url, MODEL);
    expect(report.state).toBe("loading");
    expect(report.checks.map((c) => [c.check, c.state])).toEqual([
      ["health", "ready"],
      ["models", "loading"],
    ]);
    expect(report.checks[1]?.detail).toMatch(
      /^models: "swiss-ai\/Apertus-8B-Instruct-2509" not listed \(have \[\]\) after \d+ ms$/,
    );
  });

  it("health OK and model listed → ready", async () => {
    const { url } = await engineServer("ready");
    const report = await probeReadiness(`${url}/`, MODEL);
    expect(report.state).toBe("ready");
    expect(report.checks[1]?.models).toEqual([MODEL]);
  });

  it.each([
    { phase: "500" as const, detail: /^health: HTTP 500 after \d+ ms$/ },
    {
      phase: "bad-json" as const,
      detail: /^health: HTTP 200 after \d+ ms; models: body is not a model list after \d+ ms$/,
    },
  ])("$phase → failed-probe naming the check", async ({ phase, detail }) => {
    const { url } = await engineServer(phase);
    const report = await probeReadiness(url, MODEL);
    expect(report.state).toBe("failed-probe");
    expect(report.detail).toMatch(detail);
  });

  it("a server that never answers → failed-probe after the check's own timeout", async () => {
    const { url } = await engineServer("hang");
    const report = await probeReadiness(url, MODEL, { healthTimeoutMs: 200 });
    expect(report.state).toBe("failed-probe");
    expect(report.detail).toMatch(/^health: timed out after 200 ms after \d+ ms$/);
    expect(report.elapsedMs).toBeGreaterThanOrEqual(150);
    expect(report.elapsedMs).toBeLessThan(5000);
  });

  it("probeHealth and probeModels are usable alone", async () => {
    const { url } = await engineServer("ready");
    expect((await probeHealth(url)).state).toBe("ready");
    expect((await probeModels(url, "other-model")).state).toBe("loading");
    expect(await createReadinessProbe(url, MODEL)()).toBe("ready");
  });
});

describe("waitForReadiness", () => {
  it("follows 503 → health only → ready within the deadline", async () => {
    const { url, phase } = await engineServer("503");
    const seen: string[] = [];
    const done = waitForReadiness(url, MODEL, {
      deadlineMs: 10_000,
      intervalMs: 20,
      onReport: (r) => {
        if (seen.at(-1) !== r.state) seen.push(r.state);
        if (r.state === "starting") phase.current = "health-only";
        if (r.state === "loading") phase.current = "ready";
      },
    });
    const report = await done;
    expect(report.state).toBe("ready");
    expect(seen).toEqual(["starting", "loading", "ready"]);
  });

  it("throws LLMGW_READINESS_NOT_READY naming the state, check and elapsed time", async () => {
    const { url } = await engineServer("health-only");
    const error = await waitForReadiness(url, MODEL, { deadlineMs: 1500, intervalMs: 50 }).catch(
      (e: unknown) => e,
    );
    expect(isReadinessError(error)).toBe(true);
    expect((error as { code: string }).code).toBe("LLMGW_READINESS_NOT_READY");
    expect((error as Error).message).toMatch(
      new RegExp(
        `^${url} not ready for "swiss-ai/Apertus-8B-Instruct-2509" after \\d+ ms \\(deadline 1500 ms\\): loading: health: HTTP 200 after \\d+ ms; models: .* not listed`,
      ),
    );
  });
});

describe("scrapeEngineLoad", () => {
  it("reads load signals from a real /metrics endpoint", async () => {
    const { url } = await engineServer("ready");
    expect(await scrapeEngineLoad(`${url}/metrics`)).toEqual({ running: 2, waiting: 1 });
  });

  it.each([
    {
      name: "HTTP error",
      make: async () => `${(await engineServer("503")).url}/metrics`,
      message: /: HTTP 503 after \d+ ms$/,
    },
    {
      name: "refused",
      make: async () => `${await refusedUrl()}/metrics`,
      message: /: fetch failed after \d+ ms$/,
    },
  ])("fails with LLMGW_READINESS_SCRAPE_FAILED on $name", async ({ make, message }) => {
    const url = await make();
    const error = await scrapeEngineLoad(url).catch((e: unknown) => e);
    expect((error as { code: string }).code).toBe("LLMGW_READINESS_SCRAPE_FAILED");
    expect((error as Error).message).toMatch(message);
  });
});

describe("an engine whose answer never ends (outside input is bounded)", () => {
  /** Serves `mib` MiB of `filler` at `path`, declared in Content-Length or not; counts what left. */
  async function floodServer(path: string, filler: string, mib: number, declared: boolean) {
    const chunk = Buffer.from(filler.repeat(2 ** 20 / filler.length));
    const sent = { bytes: 0 };
    const server = createServer((req, res) => {
      if (req.url !== path) return void res.writeHead(404).end();
      res.writeHead(200, declared ? { "content-length": String(mib * chunk.length) } : {});
      let left = mib;
      const pump = (): void => {
        while (left > 0 && !res.destroyed) {
          left--;
          sent.bytes += chunk.length;
          if (!res.write(chunk)) return void res.once("drain", pump);
        }
        res.end();
      };
      res.on("close", () => {
        left = 0;
      });
      pump();
    });
    servers.push(server);
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, sent };
  }

  it("a /metrics body past 8 MiB fails the scrape, and the rest is not read", async () => {
    const { url, sent } = await floodServer("/metrics", `# ${"x".repeat(1021)}\n`, 64, false);
    const error = await scrapeEngineLoad(`${url}/metrics`, { timeoutMs: 20_000 }).catch(
      (e: unknown) => e,
    );
    expect(error).toMatchObject({
      code: "LLMGW_READINESS_SCRAPE_FAILED",
      message: expect.stringMatching(/: body over 8388608 bytes after \d+ ms$/),
    });
    expect(sent.bytes).toBeLessThan(32 * 2 ** 20);
  }, 30_000);

  it("a /metrics body declared past 8 MiB is refused before it is read", async () => {
    const { url } = await floodServer("/metrics", `# ${"x".repeat(1021)}\n`, 9, true);
    const error = await scrapeEngineLoad(`${url}/metrics`).catch((e: unknown) => e);
    expect((error as Error).message).toMatch(/: body of 9437184 bytes is over 8388608 after/);
  });

  it("a /v1/models body past 4 MiB is a failed probe that says so", async () => {
    const { url } = await floodServer("/v1/models", " ", 16, false);
    const report = await probeModels(url, MODEL, { timeoutMs: 20_000 });
    expect(report).toMatchObject({
      state: "failed-probe",
      detail: expect.stringMatching(
        /^models: body is not a model list \(body over 4194304 bytes\) after/,
      ),
    });
  }, 30_000);
});

describe("an engine that demands an API key (llama-server: only /health is public)", () => {
  const KEY = "llmgw-engine-probe-key";
  async function keyedEngine(): Promise<string> {
    const server = createServer((req, res) => {
      if (req.url === "/health") return void res.writeHead(200).end();
      if (req.headers.authorization !== `Bearer ${KEY}`) return void res.writeHead(401).end();
      if (req.url === "/metrics") {
        return void res
          .writeHead(200)
          .end("llamacpp:requests_processing 3\nllamacpp:requests_deferred 1\n");
      }
      return void res.writeHead(200, { "content-type": "application/json" }).end(VLLM_MODELS);
    });
    servers.push(server);
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  }

  it("is ready when the probe sends the key", async () => {
    const base = await keyedEngine();
    expect((await probeReadiness(base, MODEL, { apiKey: KEY })).state).toBe("ready");
  });

  it.each([
    { what: "no key", apiKey: undefined, why: "the engine wants an API key and none was sent" },
    { what: "a wrong key", apiKey: "stale", why: "the engine refused the API key" },
  ])("says why it is not ready with $what, without echoing any key", async ({ apiKey, why }) => {
    const base = await keyedEngine();
    const report = await probeReadiness(base, MODEL, apiKey === undefined ? {} : { apiKey });
    expect(report.state).toBe("failed-probe");
    expect(report.detail).toMatch(
      new RegExp(`^health: HTTP 200 after \\d+ ms; models: HTTP 401 \\(${why}\\) after \\d+ ms$`),
    );
  });

  it("scrapes /metrics with the key, and fails clearly without it", async () => {
    const base = await keyedEngine();
    expect(await scrapeEngineLoad(`${base}/metrics`, { apiKey: KEY })).toMatchObject({
      running: 3,
      waiting: 1,
    });
    await expect(scrapeEngineLoad(`${base}/metrics`)).rejects.toThrow(/HTTP 401/);
  });
});
