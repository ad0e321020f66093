import { createHash } from "node:crypto";
import { SupervisorError } from "./errors.js";

/**
 * What the supervisor starts: described data, independent of any engine adapter (the agent
 * maps an engine launch spec onto it).
 */
export interface ProcessSpec {
  /**
   * Executable and arguments; a bare `argv[0]` is resolved through the supervisor's
   * `searchPath` (default `env.PATH`), never through the shell.
   */
  readonly argv: readonly string[];
  /** The COMPLETE environment of the process (nothing is inherited from the agent). */
  readonly env: Readonly<Record<string, string>>;
  readonly cwd?: string;
  /** Signal sent to the whole process group on stop. Default `SIGTERM`. */
  readonly stopSignal?: NodeJS.Signals;
  /** Time between the stop signal and SIGKILL to the group. Default 30 000 ms. */
  readonly stopGraceMs?: number;
  /** Per-replica log file receiving stdout and stderr. */
  readonly logFile: string;
  /** Hash recorded in the pid file; default {@link hashProcessSpec} of this spec. */
  readonly specHash?: string;
}

/**
 * sha256 (hex) over argv, env (sorted by key) and cwd: two specs with the same hash start
 * the same program the same way. Stop settings and the log file do not count.
 */
export function hashProcessSpec(spec: ProcessSpec): string {
  const env = Object.keys(spec.env)
    .sort()
    .map((key) => [key, spec.env[key]]);
  return createHash("sha256")
    .update(JSON.stringify({ argv: spec.argv, env, cwd: spec.cwd ?? null }))
    .digest("hex");
}

/** Throws `LLMGW_SUPERVISOR_INVALID_OPTIONS` for a spec that cannot be launched. */
export function validateProcessSpec(spec: ProcessSpec): void {
  const fail = (message: string): never => {
    throw new SupervisorError("LLMGW_SUPERVISOR_INVALID_OPTIONS", message);
  };
  if (spec.argv.length === 0 || spec.argv[0] === "")
    fail("process spec argv must name an executable");
  if (spec.logFile === "") fail("process spec logFile must be a path");
  if (
    spec.stopGraceMs !== undefined &&
    !(Number.isFinite(spec.stopGraceMs) && spec.stopGraceMs >= 0)
  ) {
    fail(`process spec stopGraceMs must be a finite number ≥ 0, got ${spec.stopGraceMs}`);
  }
}
