const BRAND = Symbol.for("llmgw.supervisor.error");

/** Stable codes of {@link SupervisorError}; documented in the package README. */
export type SupervisorErrorCode =
  | "LLMGW_SUPERVISOR_INVALID_OPTIONS"
  | "LLMGW_SUPERVISOR_SPAWN_FAILED"
  | "LLMGW_SUPERVISOR_PID_FILE"
  | "LLMGW_SUPERVISOR_PROC_UNREADABLE"
  | "LLMGW_SUPERVISOR_STOP_FAILED"
  | "LLMGW_SUPERVISOR_INVALID_TRANSITION"
  | "LLMGW_SUPERVISOR_ALREADY_RUNNING"
  /** A log file path is a symlink, FIFO, device or hard link: never written or read through. */
  | "LLMGW_SUPERVISOR_UNSAFE_LOG_FILE";

/** The one error base of `@llmgw/supervisor`; `code` is stable, `cause` carries the origin. */
export class SupervisorError extends Error {
  readonly code: SupervisorErrorCode;
  /** Brand that survives two copies of this library in one process (see {@link isSupervisorError}). */
  readonly [BRAND] = true;

  constructor(code: SupervisorErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "SupervisorError";
    this.code = code;
  }
}

/** True for any {@link SupervisorError}, even one thrown by another copy of this package. */
export function isSupervisorError(value: unknown): value is SupervisorError {
  return (
    typeof value === "object" &&
    value !== null &&
    (value as Record<symbol, unknown>)[BRAND] === true
  );
}
