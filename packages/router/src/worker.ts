/**
 * tinypool worker entry: analyses one request body. Build it as its own bundle entry (the
 * default file name the analyzer looks for next to a bundle is `router-worker.js`).
 *
 * Task: `{ buffer, length, blockBytes, maxBlocks, scope? }`, `buffer` a pooled `SharedArrayBuffer`
 * holding the body (see `buffer-pool.ts`): only its handle travels, and the body is read in
 * place. The answer is the analysis (features and the hash chain, ~8 bytes per KiB of prompt).
 */
import { analyzeRequestBody, type BodyAnalysis, SCAN_THRESHOLD_BYTES } from "./analyze.js";

/** A task for {@link analyzeTask}. */
export interface AnalyzeTask {
  readonly buffer: SharedArrayBuffer;
  readonly length: number;
  readonly blockBytes: number;
  readonly maxBlocks: number;
  /** The request's cache-isolation scope (`isolationScope`), when the router isolates. */
  readonly scope?: string;
}

/** What {@link analyzeTask} returns. */
export interface AnalyzeTaskResult {
  readonly analysis: BodyAnalysis;
}

/** Analyses the body in `task.buffer`. */
export default function analyzeTask(task: AnalyzeTask): AnalyzeTaskResult {
  const body = new Uint8Array(task.buffer, 0, task.length);
  // `TextDecoder` refuses shared memory: the JSON.parse path (below 64 KiB) gets a private
  // copy; the byte scanner reads the shared bytes in place.
  const bytes = task.length < SCAN_THRESHOLD_BYTES ? body.slice() : body;
  return {
    analysis: analyzeRequestBody(
      bytes,
      { blockBytes: task.blockBytes, maxBlocks: task.maxBlocks },
      task.scope,
    ),
  };
}
