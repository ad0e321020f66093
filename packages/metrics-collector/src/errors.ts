/** Stable codes of every {@link MetricsCollectorError}; listed in the package README. */
export type MetricsCollectorErrorCode =
  /** An option passed to a factory is out of range or of the wrong type. */
  | "LLMGW_METRICS_COLLECTOR_INVALID_OPTION"
  /** A family of this package is already registered on the injected registry. */
  | "LLMGW_METRICS_COLLECTOR_ALREADY_REGISTERED";

const BRAND = Symbol.for("llmgw.metrics-collector.error");

/**
 * The one error base of `@llmgw/metrics-collector`. Thrown only while wiring metrics up
 * (bad options, double registration); a scrape never throws because of cluster state.
 */
export class MetricsCollectorError extends Error {
  /** Stable machine-readable code. */
  readonly code: MetricsCollectorErrorCode;
  readonly [BRAND] = true;

  constructor(code: MetricsCollectorErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "MetricsCollectorError";
    this.code = code;
  }
}

/** True for a {@link MetricsCollectorError}, even one thrown by another copy of this package. */
export function isMetricsCollectorError(value: unknown): value is MetricsCollectorError {
  return (
    typeof value === "object" &&
    value !== null &&
    (value as Record<symbol, unknown>)[BRAND] === true
  );
}
