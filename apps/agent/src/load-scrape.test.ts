import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { simulateInventory } from "@llmgw/discovery";
import { ReplicaState } from "@llmgw/proto";
import { createSupervisor, silentLogger } from "@llmgw/supervisor";
import { afterEach, describe, expect, it } from "vitest";
import { simReplicaAssignment } from "../test/assignments.js";
import { createEngineProbes } from "./probes.js";
import { ReplicaManager } from "./replica-manager.js";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

// The vLLM sample exposition of reference/formats.md §4.6, verbatim.
const VLLM_METRICS = [
  "# HELP vllm:num_requests_running Number of requests in model execution batches.",
  "# TYPE vllm:num_requests_running gauge",
  'vllm:num_requests_running{engine="0",model_name="google/gemma-3-4b-it"} 0.0',
  'vllm:kv_cache_usage_perc{engine="0",model_name="google/gemma-3-4b-it"} 0.0',
  'vllm:prefix_cache_queries_total{engine="0",model_name="google/gemma-3-4b-it"} 123362.0',
  'vllm:prefix_cache_hits_total{engine="0",model_name="google/gemma-3-4b-it"} 61216.0',
  'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="google/gemma-3-4b-it"} 3.0',
  'vllm:time_to_first_token_seconds_count{engine="0",model_name="google/gemma-3-4b-it"} 10.0',
].join("\n");

/**
 * A stand-in engine (run by the real supervisor with the sim adapter's flags): an HTTP server
 * on `--host`/`--port` whose `/metrics` answers after `SLOW_MS`, and whose `/stats` says how
 * many scrapes it served and the most it ever had in flight at once.
 */
const SLOW_MS = 300;
const slowEngine = `
const http = require("node:http");
const arg = (name) => process.argv[process.argv.indexOf(name) + 1];
const body = ${JSON.stringify(`${VLLM_METRICS}\n`)};
let inFlight = 0, peak = 0, served = 0;
http.createServer((req, res) => {
  if (req.url === "/stats") return res.end(JSON.stringify({ peak, served }));
  if (req.url !== "/metrics") { res.statusCode = 404; return res.end(); }
  inFlight++; peak = Math.max(peak, inFlight);
  setTimeout(() => { inFlight--; served++; res.end(body); }, ${SLOW_MS});
}).listen(Number(arg("--port")), arg("--host"));
`;

describe("ReplicaManager load scraping", () => {
  it("never starts a scrape of an engine while its previous one is still running", async () => {
    const stateDir = mkdtempSync(path.join(tmpdir(), "llmgw-load-scrape-"));
    cleanups.push(() => rmSync(stateDir, { recursive: true, force: true }));
    const node = simulateInventory("1xh100-80g", { hostname: "node-a" });
    const manager = new ReplicaManager({
      supervisor: createSupervisor({ stateDir: path.join(stateDir, "pids") }),
      stateDir,
      inventory: () => node,
      nodeConfig: {
        simCommand: [process.execPath, "-e", slowEngine, "--"],
        bindHost: "127.0.0.1",
      },
      // Readiness is not under test; the scrape is the agent's real one over HTTP.
      probes: { probe: async () => "ready", scrapeLoad: createEngineProbes().scrapeLoad },
      baseEnv: { PATH: process.env.PATH ?? "/usr/bin:/bin" },
      secretEnv: {},
      logger: silentLogger,
      probeIntervalMs: 20,
      // The scrape timeout is far longer than the interval, and the engine is slower than it.
      probeTimeoutMs: 5_000,
      defaultLoadingDeadlineMs: 60_000,
      localAddress: "127.0.0.1",
    });
    cleanups.push(() => manager.close(true));
    await manager.apply([simReplicaAssignment()]);
    await expect
      .poll(() => manager.statuses()[0]?.state, { timeout: 10_000 })
      .toBe(ReplicaState.READY);
    const port = manager.statuses()[0]?.apiPort;
    const stats = async () =>
      (await (await fetch(`http://127.0.0.1:${port}/stats`)).json()) as {
        peak: number;
        served: number;
      };

    expect(manager.loadSamples(), "not scraped yet: no sample").toEqual([]);
    // What the load reporter sees after each round.
    const seen: ReturnType<ReplicaManager["loadSamples"]>[] = [];
    manager.startLoadScraping(20, () => seen.push(manager.loadSamples()));
    // Three slow scrapes take ≥ 900 ms: about 45 ticks, all but three of them skipped.
    await expect
      .poll(async () => (await stats()).served, { timeout: 10_000 })
      .toBeGreaterThanOrEqual(3);
    expect((await stats()).peak).toBe(1);
    expect(manager.statuses()[0]?.load).toMatchObject({ running: 0, kvCacheUsage: 0 });
    await expect.poll(() => seen.at(-1)?.length).toBe(1);
    expect(seen.at(-1)?.[0]).toEqual({
      replicaId: "m-0",
      // The sample has no waiting gauge: absent, not 0.
      load: { running: 0, kvCacheUsage: 0, prefixCacheHitRate: 61216 / 123362 },
      scrapedAtMs: expect.any(Number),
    });
    // The heartbeat's status carries the scrape its load came from, to be ordered by it.
    const sample = manager.loadSamples()[0];
    expect(manager.statuses()[0]?.loadScrapedAtUnixMs).toBe(
      BigInt(Math.round(sample?.scrapedAtMs ?? Number.NaN)),
    );
  });
});
