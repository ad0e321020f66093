/**
 * One error base for `@llmgw/router`. Codes are stable (see the README's table); the brand
 * guard survives two copies of this package in one process, unlike bare `instanceof`.
 */

const BRAND = Symbol.for("llmgw.router.error");

/** Stable codes of {@link RouterError}. */
export type RouterErrorCode =
  /** An option was out of range; the message names it and echoes the value. */
  | "LLMGW_ROUTER_INVALID_OPTIONS"
  /** The feature-extraction worker pool failed or was closed. */
  | "LLMGW_ROUTER_POOL_FAILED"
  /**
   * A routing message (snapshot, delta, load, keepalive) broke a bound or a rule; the message
   * names the field. The state is left as it was.
   */
  | "LLMGW_ROUTER_ROUTING_INVALID";

/** The only error class this package throws. */
export class RouterError extends Error {
  override readonly name = "RouterError";
  readonly code: RouterErrorCode;
  readonly [BRAND] = true;

  constructor(code: RouterErrorCode, message: string, options: { cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
  }
}

/** True for a {@link RouterError} from any copy of this package. */
export function isRouterError(value: unknown): value is RouterError {
  return (
    typeof value === "object" &&
    value !== null &&
    (value as Record<symbol, unknown>)[BRAND] === true
  );
}

/** Throws `LLMGW_ROUTER_INVALID_OPTIONS` unless `value` is a finite number within [min, max]. */
export function checkRange(name: string, value: number, min: number, max: number): number {
  if (!Number.isFinite(value) || value < min || value > max) {
    throw new RouterError(
      "LLMGW_ROUTER_INVALID_OPTIONS",
      `option ${name} must be a number in [${min}, ${max}], got ${String(value)}`,
    );
  }
  return value;
}
