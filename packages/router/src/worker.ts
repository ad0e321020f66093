/**
 * tinypool worker entry: analyses one request body. Build it as its own bundle entry (the
 * default file name the analyzer looks for next to a bundle is `router-worker.js`).
 *
 * Task: `{ buffer, length, blockBytes, maxBlocks }` with `buffer` (the body) transferred in.
 * The answer transfers the same buffer back untouched (the caller forwards the body from it),
 * with the small features object and the hash chain (~8 bytes per KiB of prompt) cloned.
 */
import { markMovable, Tinypool } from "tinypool";
import { analyzeRequestBody, type BodyAnalysis } from "./analyze.js";

/** A task for {@link analyzeTask}. */
export interface AnalyzeTask {
  readonly buffer: ArrayBuffer;
  readonly length: number;
  readonly blockBytes: number;
  readonly maxBlocks: number;
}

/** What {@link analyzeTask} returns (after tinypool unwraps the movable). */
export interface AnalyzeTaskResult {
  /** The body's buffer, handed back. */
  readonly buffer: ArrayBuffer;
  readonly analysis: BodyAnalysis;
}

/** Analyses the body in `task.buffer` and hands the buffer back. */
export default function analyzeTask(task: AnalyzeTask): unknown {
  const analysis = analyzeRequestBody(new Uint8Array(task.buffer, 0, task.length), {
    blockBytes: task.blockBytes,
    maxBlocks: task.maxBlocks,
  });
  const value: AnalyzeTaskResult = { buffer: task.buffer, analysis };
  const movable = {
    [Tinypool.transferableSymbol]: task.buffer,
    [Tinypool.valueSymbol]: value,
  };
  markMovable(movable);
  return movable;
}
