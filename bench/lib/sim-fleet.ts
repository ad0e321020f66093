/**
 * A fleet of simulated engines for the benchmarks, several engines per child process (the
 * `sims` role of `processes.ts`: each engine its own HTTP server and port), and the
 * engine-side figures read back from each engine's `/metrics` and `/sim/stats`.
 */
import type { EngineSimOptions } from "@llmgw/engine-sim";
import { request } from "undici";
import { type BenchChild, startBenchChild } from "./children.js";
import type { SimsRestartConfig } from "./processes.js";

/** What one engine reports after a measurement (its counters since its last restart). */
export interface EngineFigures {
  /** Σ `vllm:prefix_cache_hits_total`, tokens. */
  readonly hits: number;
  /** Σ `vllm:prefix_cache_queries_total`, tokens. */
  readonly queries: number;
  /** Requests the engine answered (`/sim/stats`). */
  readonly requests: number;
}

/** A running fleet. */
export interface SimFleet {
  /** One URL per engine, in engine order (stable across restarts where the ports were free). */
  readonly urls: readonly string[];
  /** The child processes (each hosts `perProcess` engines). */
  readonly children: readonly BenchChild[];
  /**
   * With `kv`: where each engine's KV-cache blocks are served (its child's `KvCacheService`),
   * in engine order; otherwise empty.
   */
  readonly kvUrls: readonly string[];
  /** With `loads`: where each child serves its engines' loads, parsed (one per child). */
  readonly loadsUrls: readonly string[];
  /**
   * Restarts every engine (fresh prefix caches and counters), with `overrides` merged into
   * every engine's options (e.g. another `timeScale`).
   */
  restart(overrides?: Partial<EngineSimOptions>): Promise<void>;
  /** Every engine's figures, in engine order. */
  scrape(): Promise<EngineFigures[]>;
  stop(): Promise<void>;
}

/** Options of {@link startSimFleet}. */
export interface SimFleetOptions {
  readonly replicas: number;
  /** Engines per child process (default 8). */
  readonly perProcess?: number;
  /** Engine `i`'s options (`port` is ignored: the OS picks). */
  readonly options: (i: number) => EngineSimOptions;
  /**
   * Serve the engines' KV-cache blocks as agents do (the engines' options must enable KV
   * events), engine `i` as replica `r${i}`, to callers with this key.
   */
  readonly kvKey?: string;
  /** Each child also serves its engines' loads, parsed as an agent parses them (`loadsUrls`). */
  readonly loads?: boolean;
}

/** Starts `replicas` engines in `ceil(replicas / perProcess)` child processes. */
export async function startSimFleet(options: SimFleetOptions): Promise<SimFleet> {
  const perProcess = Math.max(1, options.perProcess ?? 8);
  const groups = Array.from({ length: Math.ceil(options.replicas / perProcess) }, (_, g) =>
    Array.from({ length: Math.min(perProcess, options.replicas - g * perProcess) }, (_, j) =>
      options.options(g * perProcess + j),
    ),
  );
  const children: BenchChild[] = [];
  try {
    for (const sims of await Promise.allSettled(
      groups.map((sims, g) =>
        startBenchChild("sims", {
          sims,
          ...(options.loads === true ? { loads: true } : {}),
          ...(options.kvKey === undefined
            ? {}
            : {
                kv: {
                  replicaIds: sims.map((_, j) => `r${g * perProcess + j}`),
                  key: options.kvKey,
                },
              }),
        }),
      ),
    )) {
      if (sims.status === "fulfilled") children.push(sims.value);
      else throw sims.reason;
    }
  } catch (error) {
    await Promise.all(children.map((c) => c.stop()));
    throw error;
  }
  const urls = (): string[] => children.flatMap((c) => c.urls);
  const fleet: SimFleet = {
    get urls() {
      return urls();
    },
    children,
    get kvUrls() {
      return children.flatMap((c) =>
        c.kvUrl === undefined ? [] : c.urls.map(() => c.kvUrl as string),
      );
    },
    get loadsUrls() {
      return children.flatMap((c) => (c.loadsUrl === undefined ? [] : [c.loadsUrl]));
    },
    async restart(overrides) {
      const config: SimsRestartConfig = overrides === undefined ? {} : { overrides };
      await Promise.all(children.map((c) => c.request("restart", config)));
    },
    scrape: () => Promise.all(urls().map(scrapeEngine)),
    async stop() {
      await Promise.all(children.map((c) => c.stop()));
    },
  };
  return fleet;
}

/** Sum of every sample of a Prometheus counter family in `metrics` (text format). */
export function sumMetric(metrics: string, name: string): number {
  return metrics
    .split("\n")
    .filter((l) => l.startsWith(`${name}{`) || l.startsWith(`${name} `))
    .reduce((n, l) => n + Number(l.slice(l.lastIndexOf(" ") + 1)), 0);
}

async function scrapeEngine(url: string): Promise<EngineFigures> {
  const metrics = await (await request(`${url}/metrics`)).body.text();
  const stats = (await (await request(`${url}/sim/stats`)).body.json()) as { requests: number };
  return {
    hits: sumMetric(metrics, "vllm:prefix_cache_hits_total"),
    queries: sumMetric(metrics, "vllm:prefix_cache_queries_total"),
    requests: stats.requests,
  };
}
