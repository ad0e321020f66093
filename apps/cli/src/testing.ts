import type { CliIo } from "./command.js";

/** A `CliIo` for command tests: output discarded, no environment, never aborted. */
export function quietIo(): CliIo {
  return {
    stdout: { write: () => true },
    stderr: { write: () => true },
    env: {},
    cwd: process.cwd(),
    signal: new AbortController().signal,
  };
}
