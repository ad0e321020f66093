import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { type ControlPlaneErrorCode, isControlPlaneError } from "../errors.js";

/**
 * The one place where domain errors become Connect codes. Agents rely on
 * `Unauthenticated` from Heartbeat meaning "register again with the join token".
 */
const CODE_BY_ERROR: Readonly<Record<ControlPlaneErrorCode, Code>> = {
  LLMGW_CONTROL_PLANE_CONFIG_INVALID: Code.InvalidArgument,
  LLMGW_CONTROL_PLANE_STORE_CORRUPT: Code.Internal,
  LLMGW_CONTROL_PLANE_STORE_FAILED: Code.Internal,
  LLMGW_CONTROL_PLANE_STORE_TOO_NEW: Code.Internal,
  // PostgreSQL did not confirm a write in time: the client may retry, here or elsewhere.
  LLMGW_CONTROL_PLANE_STORE_UNAVAILABLE: Code.Unavailable,
  // A follower: `llmgw-leader` names the leader's URL when one is known.
  LLMGW_CONTROL_PLANE_NOT_LEADER: Code.Unavailable,
  LLMGW_CONTROL_PLANE_LISTEN_FAILED: Code.Internal,
  LLMGW_CONTROL_PLANE_TLS_INVALID: Code.Internal,
  LLMGW_CONTROL_PLANE_UNAUTHENTICATED: Code.Unauthenticated,
  LLMGW_CONTROL_PLANE_NODE_UNKNOWN: Code.Unauthenticated,
  LLMGW_CONTROL_PLANE_NODE_REVOKED: Code.Unauthenticated,
  // Not Unauthenticated: that tells an agent to register again, which is what was refused.
  LLMGW_CONTROL_PLANE_NODE_ID_TAKEN: Code.PermissionDenied,
  LLMGW_CONTROL_PLANE_NODE_LIMIT: Code.ResourceExhausted,
  LLMGW_CONTROL_PLANE_NOT_FOUND: Code.NotFound,
  LLMGW_CONTROL_PLANE_INVALID_ARGUMENT: Code.InvalidArgument,
  LLMGW_CONTROL_PLANE_ALREADY_EXISTS: Code.AlreadyExists,
  LLMGW_CONTROL_PLANE_SHUTTING_DOWN: Code.Unavailable,
  LLMGW_CONTROL_PLANE_ROUTER_LIMIT: Code.ResourceExhausted,
  // A newer stream of the same router id took over; the old one has nothing to retry.
  LLMGW_CONTROL_PLANE_ROUTER_REPLACED: Code.Aborted,
  // The router stopped reading its stream; it reconnects for a fresh snapshot.
  LLMGW_CONTROL_PLANE_ROUTER_TOO_SLOW: Code.ResourceExhausted,
  LLMGW_CONTROL_PLANE_TENANT_NAME_INVALID: Code.InvalidArgument,
  LLMGW_CONTROL_PLANE_TENANT_WEIGHT_INVALID: Code.InvalidArgument,
  LLMGW_CONTROL_PLANE_TENANT_CACHE_ISOLATION_INVALID: Code.InvalidArgument,
  LLMGW_CONTROL_PLANE_TENANT_LIMIT_INVALID: Code.InvalidArgument,
  LLMGW_CONTROL_PLANE_TENANT_FIELD_UNKNOWN: Code.InvalidArgument,
  // A key naming a tenant that does not exist: create the tenant first.
  LLMGW_CONTROL_PLANE_TENANT_UNKNOWN: Code.FailedPrecondition,
  // Deleting a tenant that still has keys: revoke them first.
  LLMGW_CONTROL_PLANE_TENANT_HAS_KEYS: Code.FailedPrecondition,
  // An update conditional on the tenant as read found it changed since: read it again.
  LLMGW_CONTROL_PLANE_TENANT_CHANGED: Code.Aborted,
  LLMGW_CONTROL_PLANE_PRIORITY_INVALID: Code.InvalidArgument,
  LLMGW_CONTROL_PLANE_BUDGET_INVALID: Code.InvalidArgument,
  LLMGW_CONTROL_PLANE_BUDGET_DUPLICATE: Code.InvalidArgument,
  LLMGW_CONTROL_PLANE_BUDGET_TOO_MANY: Code.InvalidArgument,
};

/** Header carrying the stable `LLMGW_…` code of a refused call, for clients that branch on it. */
export const ERROR_CODE_HEADER = "llmgw-error-code";

// The follower headers are the clients' contract, defined once in @llmgw/wire.
export { COPY_AGE_HEADER, LEADER_HEADER, SERVED_BY_HEADER } from "@llmgw/wire";

/** Converts anything thrown by a handler into a ConnectError with the right code. */
export function toConnectError(error: unknown): ConnectError {
  if (error instanceof ConnectError) return error;
  if (isControlPlaneError(error)) {
    return new ConnectError(
      error.message,
      CODE_BY_ERROR[error.code],
      { [ERROR_CODE_HEADER]: error.code },
      undefined,
      error,
    );
  }
  return ConnectError.from(error, Code.Internal);
}

async function* mapStream<T>(stream: AsyncIterable<T>): AsyncIterable<T> {
  try {
    yield* stream;
  } catch (error) {
    throw toConnectError(error);
  }
}

/** Server interceptor applying {@link toConnectError} to unary and streaming handlers. */
export const errorMappingInterceptor: Interceptor = (next) => async (req) => {
  try {
    const res = await next(req);
    if (!res.stream) return res;
    return { ...res, message: mapStream(res.message) };
  } catch (error) {
    throw toConnectError(error);
  }
};
