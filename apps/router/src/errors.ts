const BRAND = Symbol.for("llmgw.router-server.error");

/** Stable codes of {@link RouterServiceError}; docs/api.md has the table. */
export type RouterServiceErrorCode =
  /** A flag or option is out of range or malformed; the message names it. */
  | "LLMGW_ROUTER_CONFIG_INVALID"
  /** The public listener could not bind its address. */
  | "LLMGW_ROUTER_LISTEN_FAILED"
  /** The TLS certificate or key could not be read. */
  | "LLMGW_ROUTER_TLS_INVALID"
  /** The saved routing state is unreadable or malformed; the router syncs afresh. */
  | "LLMGW_ROUTER_STATE_CORRUPT"
  /** The state dir is unsafe, or the state file could not be written or read (left in place). */
  | "LLMGW_ROUTER_STATE_FAILED"
  /** A control plane refused the router credential. */
  | "LLMGW_ROUTER_UNAUTHENTICATED"
  /** No control plane answered; the router serves from its last state. */
  | "LLMGW_ROUTER_CONTROL_PLANE_UNREACHABLE"
  /** The routing stream broke its contract (a gap in versions, an unknown epoch). */
  | "LLMGW_ROUTER_STREAM_INVALID"
  /** No control plane confirmed the state for longer than `--max-state-age`: requests refused. */
  | "LLMGW_ROUTER_STATE_STALE";

/** The router server's one error base (the pure core in `@llmgw/router` has `RouterError`). */
export class RouterServiceError extends Error {
  override readonly name = "RouterServiceError";
  readonly code: RouterServiceErrorCode;
  readonly [BRAND] = true;

  constructor(code: RouterServiceErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
  }
}

/** True for a {@link RouterServiceError}, even one from a second copy of this module. */
export function isRouterServiceError(value: unknown): value is RouterServiceError {
  return (
    typeof value === "object" && value !== null && (value as { [BRAND]?: unknown })[BRAND] === true
  );
}
