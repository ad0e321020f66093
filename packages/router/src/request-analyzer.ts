/**
 * Hybrid body analysis. Bodies below `inlineThresholdBytes` are parsed and hashed on the calling
 * thread (the worker hop costs ~30–35 µs of CPU, ~15× the work for a small body); larger ones go
 * to a tinypool pool so that big prompts never stall the event loop. The body is copied into a
 * reused ArrayBuffer (free list by power-of-two size class: no fresh zero-filled allocation per
 * request), transferred to the worker and transferred back with the hash chain in it.
 */
import { Tinypool } from "tinypool";
import { analyzeRequestBody, type BodyAnalysis } from "./analyze.js";
import { DEFAULT_BLOCK_BYTES, DEFAULT_MAX_BLOCKS } from "./block-hash.js";
import { checkRange, RouterError } from "./errors.js";
import type { FeatureErrorReason } from "./features.js";
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
  /** Analyses one complete body. Rejects only with `LLMGW_ROUTER_POOL_FAILED`. */
  analyze(body: Uint8Array): RequestAnalysis | Promise<RequestAnalysis>;
  /**
   * Pool tasks in flight (running or queued), the pool's task slots (threads × tasks per
   * worker; 0 without a pool) and tinypool's own queue length.
   */
  poolLoad(): { readonly active: number; readonly slots: number; readonly queued: number };
  /** Stops the workers. */
  close(): Promise<void>;
}

const MIN_CLASS = 14; // 16 KiB
const MAX_CLASS = 26; // 64 MiB
const PER_CLASS = 8;

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
  const freeLists: ArrayBuffer[][] = [];

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

  const take = (length: number): ArrayBuffer => {
    const cls = Math.max(MIN_CLASS, Math.ceil(Math.log2(Math.max(1, length))));
    const reused = freeLists[cls]?.pop();
    return reused ?? new ArrayBuffer(2 ** cls);
  };
  const giveBack = (buffer: ArrayBuffer): void => {
    const cls = Math.log2(buffer.byteLength);
    if (!Number.isInteger(cls) || cls > MAX_CLASS) return;
    const list = freeLists[cls] ?? [];
    freeLists[cls] = list;
    if (list.length < PER_CLASS) list.push(buffer);
  };

  const inline = (body: Uint8Array): RequestAnalysis => ({
    ...analyzeRequestBody(body, hashOptions),
    mode: "inline",
  });

  const viaPool = async (p: Tinypool, body: Uint8Array): Promise<RequestAnalysis> => {
    const buffer = take(body.length);
    new Uint8Array(buffer, 0, body.length).set(body);
    const task: AnalyzeTask = { buffer, length: body.length, blockBytes, maxBlocks };
    active += 1;
    let r: AnalyzeTaskResult;
    try {
      r = (await p.run(task, { transferList: [buffer] })) as AnalyzeTaskResult;
    } catch (error) {
      throw new RouterError("LLMGW_ROUTER_POOL_FAILED", "request analysis worker failed", {
        cause: error,
      });
    } finally {
      active -= 1;
    }
    const chain = new Float64Array(r.buffer, 0, r.chainLength).slice();
    giveBack(r.buffer);
    if (!r.ok) {
      return {
        ok: false,
        reason: (r.reason ?? "invalid_json") as FeatureErrorReason,
        message: r.message ?? "invalid request body",
        ...(r.param === undefined ? {} : { param: r.param }),
        mode: "pool",
      };
    }
    return {
      ok: true,
      model: r.model ?? "",
      stream: r.stream ?? false,
      ...(r.maxTokens === undefined ? {} : { maxTokens: r.maxTokens }),
      estimatedTokens: r.estimatedTokens ?? 0,
      chain,
      mode: "pool",
    };
  };

  return {
    analyze(body) {
      if (pool === undefined || body.length < threshold) return inline(body);
      return viaPool(pool, body);
    },
    poolLoad: () => ({ active, slots, queued: pool?.queueSize ?? 0 }),
    async close() {
      const p = pool;
      pool = undefined;
      await p?.destroy();
    },
  };
}

function defaultWorkerUrl(): URL {
  const here = import.meta.url;
  if (/\/request-analyzer\.ts$/.test(here)) return new URL("./worker-source.mjs", here);
  if (/\/request-analyzer\.js$/.test(here)) return new URL("./worker.js", here);
  return new URL("./router-worker.js", here);
}
