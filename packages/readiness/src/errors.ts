const BRAND = Symbol.for("llmgw.readiness.error");

/** Stable codes of {@link ReadinessError}; documented in the package README. */
export type ReadinessErrorCode =
  | "LLMGW_READINESS_INVALID_OPTIONS"
  | "LLMGW_READINESS_NOT_READY"
  | "LLMGW_READINESS_SCRAPE_FAILED";

/** The one error base of `@llmgw/readiness`; `code` is stable, `cause` carries the origin. */
export class ReadinessError extends Error {
  readonly code: ReadinessErrorCode;
  /** Brand that survives two copies of this library in one process (see {@link isReadinessError}). */
  readonly [BRAND] = true;

  constructor(code: ReadinessErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "ReadinessError";
    this.code = code;
  }
}

/** True for any {@link ReadinessError}, even one thrown by another copy of this package. */
export function isReadinessError(value: unknown): value is ReadinessError {
  return (
    typeof value === "object" &&
    value !== null &&
    (value as Record<symbol, unknown>)[BRAND] === true
  );
}
