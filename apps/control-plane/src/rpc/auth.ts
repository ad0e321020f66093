import { secretsEqual } from "../domain/tokens.js";
import { ControlPlaneError } from "../errors.js";

/** The bearer token of a request, or undefined. */
export function bearerToken(headers: Headers): string | undefined {
  const value = headers.get("authorization");
  if (!value) return undefined;
  const match = /^Bearer\s+(\S+)\s*$/i.exec(value);
  return match?.[1];
}

/**
 * Requires `Authorization: Bearer <expected>`. `what` names the token in the error, e.g.
 * "the admin token (llmgw control-plane token --admin)".
 */
export function requireToken(headers: Headers, expected: string, what: string): void {
  const token = bearerToken(headers);
  if (token === undefined) {
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_UNAUTHENTICATED",
      `missing Authorization: Bearer header; this call needs ${what}`,
    );
  }
  if (!secretsEqual(token, expected)) {
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_UNAUTHENTICATED",
      `wrong token; this call needs ${what}`,
    );
  }
}
