/**
 * One error base for `@llmgw/scheduler`. Codes are stable (see the README's table); the brand
 * guard survives two copies of this package in one process, unlike bare `instanceof`.
 *
 * The scheduler throws only for inputs that break the contract itself (duplicate ids, negative
 * counts). A deployment that cannot be placed is never an error: it is reported as
 * `unschedulable` with reasons.
 */

const BRAND = Symbol.for("llmgw.scheduler.error");

/** Stable codes of {@link SchedulerError}. */
export type SchedulerErrorCode =
  /** The input broke the contract (duplicate ids, bad counts); the message names the field and value. */
  "LLMGW_SCHEDULER_INVALID_INPUT";

/** The only error class this package throws. */
export class SchedulerError extends Error {
  override readonly name = "SchedulerError";
  readonly code: SchedulerErrorCode;
  readonly [BRAND] = true;

  constructor(code: SchedulerErrorCode, message: string, options: { cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
  }
}

/** True for a {@link SchedulerError} from any copy of this package. */
export function isSchedulerError(value: unknown): value is SchedulerError {
  return (
    typeof value === "object" &&
    value !== null &&
    (value as Record<symbol, unknown>)[BRAND] === true
  );
}
