/** A request the router refuses with an OpenAI error answer (see `REJECTION_HTTP`). */
import type { RejectionReason } from "@llmgw/router";

/**
 * Thrown (or handed to an `onError`) inside the request path and answered by `answerError`.
 * Not an `Error`: it never leaves the handler, and a stack trace per refused request is waste.
 */
export class RejectedError {
  constructor(
    readonly reason: RejectionReason,
    readonly message: string,
    readonly retryAfterSeconds?: number,
    readonly param?: string,
    /** The API key's name, for the rate-limit metric. */
    readonly keyName?: string,
  ) {}
}

/** The 413 for a body over `maxBodyBytes`. */
export function bodyTooLarge(maxBodyBytes: number): RejectedError {
  return new RejectedError(
    "body_too_large",
    `request body exceeds the limit of ${maxBodyBytes} bytes`,
  );
}
