/**
 * One error base for `@llmgw/discovery`. Discovery reports everything it finds wrong with the
 * machine as {@link Problem} data; it throws only on programmer error (bad options, a bad
 * simulate spec). The brand guard survives two copies of this package in one process.
 */

const BRAND = Symbol.for("llmgw.discovery.error");

/** Stable codes of {@link DiscoveryError}. */
export type DiscoveryErrorCode =
  /** An option failed validation; the message names the option and echoes the value. */
  | "LLMGW_DISCOVERY_INVALID_OPTION"
  /** A `--simulate` spec did not match `<count>x<class>[,…][@<fabric>]`. */
  | "LLMGW_DISCOVERY_INVALID_SIMULATE_SPEC";

/** The only error class this package throws. */
export class DiscoveryError extends Error {
  override readonly name = "DiscoveryError";
  readonly code: DiscoveryErrorCode;
  readonly [BRAND] = true;

  constructor(code: DiscoveryErrorCode, message: string, options: { cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
  }
}

/** True for a {@link DiscoveryError} from any copy of this package. */
export function isDiscoveryError(value: unknown): value is DiscoveryError {
  return (
    typeof value === "object" &&
    value !== null &&
    (value as Record<symbol, unknown>)[BRAND] === true
  );
}
