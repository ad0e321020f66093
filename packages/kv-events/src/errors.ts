const BRAND = Symbol.for("llmgw.kv-events.error");

/** Stable codes of {@link KvEventsError}; documented in the package README. */
export type KvEventsErrorCode =
  | "LLMGW_KV_EVENTS_INVALID_OPTIONS"
  | "LLMGW_KV_EVENTS_PAYLOAD_TOO_LARGE"
  | "LLMGW_KV_EVENTS_MALFORMED_PAYLOAD"
  | "LLMGW_KV_EVENTS_TOO_MANY_EVENTS"
  | "LLMGW_KV_EVENTS_MALFORMED_EVENT"
  | "LLMGW_KV_EVENTS_INVALID_HASH"
  | "LLMGW_KV_EVENTS_TOO_MANY_HASHES"
  | "LLMGW_KV_EVENTS_TOO_MANY_TOKENS"
  | "LLMGW_KV_EVENTS_TOKEN_COUNT_MISMATCH"
  | "LLMGW_KV_EVENTS_SOCKET_FAILED"
  | "LLMGW_KV_EVENTS_CLOSED";

/** The one error base of `@llmgw/kv-events`; `code` is stable, `cause` carries the origin. */
export class KvEventsError extends Error {
  readonly code: KvEventsErrorCode;
  /** Brand that survives two copies of this library in one process (see {@link isKvEventsError}). */
  readonly [BRAND] = true;

  constructor(code: KvEventsErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "KvEventsError";
    this.code = code;
  }
}

/** True for any {@link KvEventsError}, even one thrown by another copy of this package. */
export function isKvEventsError(value: unknown): value is KvEventsError {
  return (
    typeof value === "object" &&
    value !== null &&
    (value as Record<symbol, unknown>)[BRAND] === true
  );
}
