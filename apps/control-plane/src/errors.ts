const BRAND = Symbol.for("llmgw.control-plane.error");

/** Stable codes of {@link ControlPlaneError}; the README has the table. */
export type ControlPlaneErrorCode =
  | "LLMGW_CONTROL_PLANE_CONFIG_INVALID"
  | "LLMGW_CONTROL_PLANE_STORE_CORRUPT"
  | "LLMGW_CONTROL_PLANE_STORE_FAILED"
  | "LLMGW_CONTROL_PLANE_STORE_TOO_NEW"
  | "LLMGW_CONTROL_PLANE_STORE_UNAVAILABLE"
  | "LLMGW_CONTROL_PLANE_NOT_LEADER"
  | "LLMGW_CONTROL_PLANE_LISTEN_FAILED"
  | "LLMGW_CONTROL_PLANE_TLS_INVALID"
  | "LLMGW_CONTROL_PLANE_UNAUTHENTICATED"
  | "LLMGW_CONTROL_PLANE_NODE_UNKNOWN"
  | "LLMGW_CONTROL_PLANE_NODE_REVOKED"
  | "LLMGW_CONTROL_PLANE_NODE_ID_TAKEN"
  | "LLMGW_CONTROL_PLANE_NODE_LIMIT"
  | "LLMGW_CONTROL_PLANE_NOT_FOUND"
  | "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT"
  | "LLMGW_CONTROL_PLANE_ALREADY_EXISTS"
  | "LLMGW_CONTROL_PLANE_SHUTTING_DOWN"
  | "LLMGW_CONTROL_PLANE_ROUTER_LIMIT"
  | "LLMGW_CONTROL_PLANE_ROUTER_REPLACED"
  | "LLMGW_CONTROL_PLANE_ROUTER_TOO_SLOW"
  | "LLMGW_CONTROL_PLANE_TENANT_NAME_INVALID"
  | "LLMGW_CONTROL_PLANE_TENANT_WEIGHT_INVALID"
  | "LLMGW_CONTROL_PLANE_TENANT_CACHE_ISOLATION_INVALID"
  | "LLMGW_CONTROL_PLANE_TENANT_LIMIT_INVALID"
  | "LLMGW_CONTROL_PLANE_TENANT_FIELD_UNKNOWN"
  | "LLMGW_CONTROL_PLANE_TENANT_UNKNOWN"
  | "LLMGW_CONTROL_PLANE_TENANT_HAS_KEYS"
  | "LLMGW_CONTROL_PLANE_TENANT_CHANGED"
  | "LLMGW_CONTROL_PLANE_PRIORITY_INVALID"
  | "LLMGW_CONTROL_PLANE_BUDGET_INVALID"
  | "LLMGW_CONTROL_PLANE_BUDGET_DUPLICATE"
  | "LLMGW_CONTROL_PLANE_BUDGET_TOO_MANY";

/**
 * The control plane's one error base. Domain modules and RPC handlers throw only this;
 * `rpc/errors.ts` maps it to Connect codes in one place.
 */
export class ControlPlaneError extends Error {
  override readonly name = "ControlPlaneError";
  readonly code: ControlPlaneErrorCode;
  readonly [BRAND] = true;

  constructor(code: ControlPlaneErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
  }
}

/** True for a {@link ControlPlaneError}, even one from a second copy of this module. */
export function isControlPlaneError(value: unknown): value is ControlPlaneError {
  return (
    typeof value === "object" && value !== null && (value as { [BRAND]?: unknown })[BRAND] === true
  );
}
