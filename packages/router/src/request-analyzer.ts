/**
 * Hybrid body analysis. Bodies below `inlineThresholdBytes` are parsed and hashed on the calling
 * thread (the worker hop costs ~30–35 µs of CPU, ~15× the work for a small body); larger ones go
 * to a tinypool pool so that big prompts never stall the event loop. The body sits in a pooled
 * `SharedArrayBuffer` (`buffer-pool.ts`): the caller reads it there and hands it over
 * (`owned`), or it is copied there; the worker reads it in place.
 */
import { Tinypool } from "tinypool";
import { analyzeRequestBody, type BodyAnalysis } from "./analyze.js";
import { DEFAULT_BLOCK_BYTES, DEFAULT_MAX_BLOCKS } from "./block-hash.js";
import { type BufferPool, createBufferPool } from "./buffer-pool.js";
import { checkRange, RouterError } from "./errors.js";
import type { AnalyzeTask, AnalyzeTaskResult } from "./worker.js";

/** Options of {@link createRequestAnalyzer}. */
export interface RequestAnalyzerOptions {
  /** Bodies of at least this many bytes go to the pool (default 16 384; measured, see README). */
  readonly inlineThresholdBytes?: number;
  /** Prefix block size in UTF-8 bytes (default 1024). */
  readonly blockBytes?: number;
  /** Most blocks hashed per prompt (default 512). */
  readonly maxBlocks?: number;
  /** Worker pool settings, or `false` to analyse everything inline. */
  readonly pool?: false | RequestAnalyzerPoolOptions;
}

/** Worker-pool settings of {@link RequestAnalyzerOptions}. */
export interface RequestAnalyzerPoolOptions {
  /** Default 1. */
  readonly minThreads?: number;
  /** Default 2. */
  readonly maxThreads?: number;
  /** Default 16 (the calibration found 1 halves throughput; ≥ 8 removes the stall). */
  readonly concurrentTasksPerWorker?: number;
  /**
   * The worker module. Default: `./worker-source.mjs` (registers tsx, then loads `worker.ts`)
   * when running from source, `./worker.js` beside a compiled `request-analyzer.js`, else
   * `./router-worker.js` beside the running bundle.
   */
  readonly filename?: string | URL;
  /** Node flags for workers (default: the `@llmgw/source` condition for the source bootstrap). */
  readonly execArgv?: readonly string[];
}

/** Result of {@link RequestAnalyzer.analyze}: the body's analysis and where it ran. */
export type RequestAnalysis = BodyAnalysis & { readonly mode: "inline" | "pool" };

/** The analyzer. */
export interface RequestAnalyzer {
  /**
   * Analyses one complete body. Rejects only with `LLMGW_ROUTER_POOL_FAILED`. With `owned`,
   * `body` is a view from {@link buffers} at offset 0 that the caller does not change until the
   * analysis is back: a pooled analysis then reads it in place instead of copying it.
   * `scope`: the request's cache-isolation scope (`isolationScope`), when the router isolates.
   */
  analyze(
    body: Uint8Array,
    owned?: boolean,
    scope?: string,
  ): RequestAnalysis | Promise<RequestAnalysis>;
  /** Where to read large bodies into, so they can be handed over with `owned`. */
  readonly buffers: BufferPool;
  /**
   * Pool tasks in flight (running or queued), the pool's task slots (threads × tasks per
   * worker; 0 without a pool) and tinypool's own queue length.
   */
  poolLoad(): { readonly active: number; readonly slots: number; readonly queued: number };
  /** Stops the workers. */
  close(): Promise<void>;
}

/** Creates a {@link RequestAnalyzer}. */
export function createRequestAnalyzer(options: RequestAnalyzerOptions = {}): RequestAnalyzer {
  const threshold = checkRange(
    "inlineThresholdBytes",
    options.inlineThresholdBytes ?? 16_384,
    0,
    2 ** 31,
  );
  const blockBytes = checkRange(
    "blockBytes",
    options.blockBytes ?? DEFAULT_BLOCK_BYTES,
    16,
    1 << 20,
  );
  const maxBlocks = checkRange("maxBlocks", options.maxBlocks ?? DEFAULT_MAX_BLOCKS, 0, 1 << 16);
  const hashOptions = { blockBytes, maxBlocks };
  const poolOptions = options.pool === false ? undefined : (options.pool ?? {});
  let pool: Tinypool | undefined;
  let active = 0;
  let slots = 0;
  const buffers = createBufferPool();

  if (poolOptions !== undefined) {
    const filename = poolOptions.filename ?? defaultWorkerUrl();
    const filenameText = String(filename);
    const execArgv =
      poolOptions.execArgv ?? (filenameText.endsWith(".mjs") ? ["--conditions=@llmgw/source"] : []);
    const maxThreads = checkRange("pool.maxThreads", poolOptions.maxThreads ?? 2, 1, 256);
    const perWorker = checkRange(
      "pool.concurrentTasksPerWorker",
      poolOptions.concurrentTasksPerWorker ?? 16,
      1,
      1024,
    );
    slots = maxThreads * perWorker;
    pool = new Tinypool({
      filename: filenameText.startsWith("file:") ? new URL(filenameText).pathname : filenameText,
      minThreads: checkRange("pool.minThreads", poolOptions.minThreads ?? 1, 0, maxThreads),
      maxThreads,
      concurrentTasksPerWorker: perWorker,
      execArgv: [...execArgv],
      idleTimeout: 60_000,
    });
  }

  const inline = (body: Uint8Array, scope: string | undefined): RequestAnalysis =>
    placed(analyzeRequestBody(body, hashOptions, scope), "inline");

  const viaPool = async (
    p: Tinypool,
    body: Uint8Array,
    owned: boolean,
    scope: string | undefined,
  ): Promise<RequestAnalysis> => {
    // An owned pooled body is read by the worker in place; anything else is copied into a
    // pooled shared buffer first.
    const length = body.length;
    const inPlace = owned && body.buffer instanceof SharedArrayBuffer && body.byteOffset === 0;
    const shared = inPlace ? body : buffers.take(length);
    if (!inPlace) shared.set(body);
    const task: AnalyzeTask = {
      buffer: shared.buffer as SharedArrayBuffer,
      length,
      blockBytes,
      maxBlocks,
      ...(scope === undefined ? {} : { scope }),
    };
    active += 1;
    let r: AnalyzeTaskResult;
    try {
      r = (await p.run(task)) as AnalyzeTaskResult;
    } catch (error) {
      throw new RouterError("LLMGW_ROUTER_POOL_FAILED", "request analysis worker failed", {
        cause: error,
      });
    } finally {
      active -= 1;
      if (!inPlace) buffers.give(shared);
    }
    return placed(r.analysis, "pool");
  };

  return {
    buffers,
    analyze(body, owned = false, scope = undefined) {
      if (pool === undefined || body.length < threshold) return inline(body, scope);
      return viaPool(pool, body, owned, scope);
    },
    poolLoad: () => ({ active, slots, queued: pool?.queueSize ?? 0 }),
    async close() {
      const p = pool;
      pool = undefined;
      await p?.destroy();
    },
  };
}

/** `a` with where it ran (built field by field: a spread of the analysis costs ~3 µs here, as
 * much as analysing a small body). */
function placed(a: BodyAnalysis, mode: "inline" | "pool"): RequestAnalysis {
  if (!a.ok) {
    return a.param === undefined
      ? { ok: false, reason: a.reason, message: a.message, mode }
      : { ok: false, reason: a.reason, message: a.message, param: a.param, mode };
  }
  // Several choices, or a salt, are rare enough for the spread.
  if (a.choices !== undefined || a.salt !== undefined) return { ...a, mode };
  const { model, stream, streamUsage, maxTokens, estimatedTokens, chain, quarters, hint } = a;
  // One literal per shape: absent stays absent without a spread (or a `delete`, which would
  // turn the object into a slow dictionary).
  if (hint === undefined) {
    return maxTokens === undefined
      ? { ok: true, model, stream, streamUsage, estimatedTokens, chain, quarters, mode }
      : { ok: true, model, stream, streamUsage, maxTokens, estimatedTokens, chain, quarters, mode };
  }
  return maxTokens === undefined
    ? { ok: true, model, stream, streamUsage, estimatedTokens, chain, quarters, hint, mode }
    : {
        ok: true,
        model,
        stream,
        streamUsage,
        maxTokens,
        estimatedTokens,
        chain,
        quarters,
        hint,
        mode,
      };
}

function defaultWorkerUrl(): URL {
  const here = import.meta.url;
  if (/\/request-analyzer\.ts$/.test(here)) return new URL("./worker-source.mjs", here);
  if (/\/request-analyzer\.js$/.test(here)) return new URL("./worker.js", here);
  return new URL("./router-worker.js", here);
}
