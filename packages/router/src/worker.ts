/**
 * tinypool worker entry: analyses one request body. Build it as its own bundle entry (the
 * default file name the analyzer looks for next to a bundle is `router-worker.js`).
 *
 * Task: `{ buffer, length, blockBytes, maxBlocks }` with `buffer` transferred in. The answer
 * transfers the same buffer back (the caller reuses it), with the hash chain written into its
 * first `chainLength × 8` bytes, so nothing is allocated per request for the return trip but
 * the small features object (the prompt text stays here).
 */
import { markMovable, Tinypool } from "tinypool";
import { analyzeRequestBody } from "./analyze.js";

/** A task for {@link analyzeTask}. */
export interface AnalyzeTask {
  readonly buffer: ArrayBuffer;
  readonly length: number;
  readonly blockBytes: number;
  readonly maxBlocks: number;
}

/** What {@link analyzeTask} returns (after tinypool unwraps the movable). */
export interface AnalyzeTaskResult {
  readonly buffer: ArrayBuffer;
  readonly chainLength: number;
  readonly ok: boolean;
  readonly model?: string;
  readonly stream?: boolean;
  readonly maxTokens?: number;
  readonly estimatedTokens?: number;
  readonly reason?: string;
  readonly message?: string;
  readonly param?: string;
}

/** Analyses the body in `task.buffer` and hands the buffer back. */
export default function analyzeTask(task: AnalyzeTask): unknown {
  const analysis = analyzeRequestBody(new Uint8Array(task.buffer, 0, task.length), {
    blockBytes: task.blockBytes,
    maxBlocks: task.maxBlocks,
  });
  const chainLength = analysis.ok ? analysis.chain.length : 0;
  if (analysis.ok) new Float64Array(task.buffer, 0, chainLength).set(analysis.chain);
  const value: AnalyzeTaskResult = analysis.ok
    ? {
        buffer: task.buffer,
        chainLength,
        ok: true,
        model: analysis.model,
        stream: analysis.stream,
        estimatedTokens: analysis.estimatedTokens,
        ...(analysis.maxTokens === undefined ? {} : { maxTokens: analysis.maxTokens }),
      }
    : {
        buffer: task.buffer,
        chainLength: 0,
        ok: false,
        reason: analysis.reason,
        message: analysis.message,
        ...(analysis.param === undefined ? {} : { param: analysis.param }),
      };
  const movable = {
    [Tinypool.transferableSymbol]: task.buffer,
    [Tinypool.valueSymbol]: value,
  };
  markMovable(movable);
  return movable;
}
