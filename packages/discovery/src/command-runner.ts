import { execFile } from "node:child_process";

/** Options of one {@link CommandRunner.run} call. */
export interface RunOptions {
  /** Kill the command (SIGKILL) after this many milliseconds and report `timedOut`. */
  readonly timeoutMs: number;
}

/** What one command did, as data: never thrown. */
export interface CommandResult {
  /** Exit status; `undefined` when the command did not start, timed out or died by a signal. */
  readonly exitCode: number | undefined;
  readonly stdout: string;
  readonly stderr: string;
  readonly timedOut: boolean;
  /** The executable does not exist or is not executable (ENOENT / EACCES). */
  readonly notFound: boolean;
}

/**
 * Runs one short external command (nvidia-smi) to completion. The only way discovery touches
 * processes, so tests substitute a real fake executable rather than a mock.
 */
export interface CommandRunner {
  run(file: string, args: readonly string[], options: RunOptions): Promise<CommandResult>;
}

/** Output larger than this is cut; nvidia-smi on 8 GPUs prints a few KiB. */
const MAX_BUFFER_BYTES = 16 * 1024 * 1024;

/**
 * A {@link CommandRunner} on `child_process.execFile`: no shell (arguments are never
 * interpreted), a SIGKILL after `timeoutMs` (a hung nvidia-smi does not answer SIGTERM while
 * stuck in the driver), and every failure turned into a {@link CommandResult}.
 */
export function createExecFileRunner(): CommandRunner {
  return {
    run(file, args, options) {
      return new Promise((resolve) => {
        execFile(
          file,
          [...args],
          {
            timeout: options.timeoutMs,
            killSignal: "SIGKILL",
            maxBuffer: MAX_BUFFER_BYTES,
            encoding: "utf8",
            windowsHide: true,
          },
          (error, stdout, stderr) => {
            const out = String(stdout ?? "");
            const err = String(stderr ?? "");
            if (!error) {
              resolve({ exitCode: 0, stdout: out, stderr: err, timedOut: false, notFound: false });
              return;
            }
            const e = error as NodeJS.ErrnoException & { killed?: boolean; signal?: string };
            const errno = typeof e.code === "string" ? e.code : undefined;
            const notFound = errno === "ENOENT" || errno === "EACCES";
            const timedOut = !notFound && e.killed === true && e.signal === "SIGKILL";
            const exitCode = typeof e.code === "number" ? e.code : undefined;
            resolve({
              exitCode,
              stdout: out,
              stderr: err === "" && notFound ? e.message : err,
              timedOut,
              notFound,
            });
          },
        );
      });
    },
  };
}
