import { type ParseArgsConfig, parseArgs } from "node:util";

/** Where a command writes and what it may read; injected so commands run in tests without globals. */
export interface CliIo {
  readonly stdout: { write(chunk: string): unknown };
  readonly stderr: { write(chunk: string): unknown };
  readonly env: Readonly<Record<string, string | undefined>>;
  readonly cwd: string;
  /** Aborted on SIGINT/SIGTERM by main.ts; long-running commands stop when it fires. */
  readonly signal: AbortSignal;
  /**
   * Aborted on a second SIGINT/SIGTERM while a command listens to it (an agent leaving with
   * its engines stops waiting for its drain); unlistened, a second signal exits at once.
   */
  readonly interrupt?: AbortSignal;
}

/** One `llmgw` subcommand. `run` returns the process exit code. */
export interface Command {
  /** Words after `llmgw`, e.g. "agent inventory". */
  readonly name: string;
  readonly summary: string;
  /** Full help text printed by `--help`. */
  readonly usage: string;
  run(argv: string[], io: CliIo): Promise<number>;
}

/** A usage error: printed with the command's usage hint, exit code 2. */
export class UsageError extends Error {
  override readonly name = "UsageError";
}

/**
 * `node:util` parseArgs with usage errors instead of TypeErrors, so a bad flag prints
 * "unknown option --foo" and exits 2 rather than a stack trace.
 */
export function parseCommandArgs<T extends NonNullable<ParseArgsConfig["options"]>>(
  argv: string[],
  options: T,
  allowPositionals = false,
) {
  try {
    return parseArgs({ args: argv, options, allowPositionals, strict: true });
  } catch (error) {
    throw new UsageError(error instanceof Error ? error.message : String(error));
  }
}
