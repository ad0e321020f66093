/**
 * One error base for `@llmgw/nccl-env`, with stable codes (README table) and a `Symbol.for`
 * brand so the guard works across two copies of the package.
 */

const BRAND = Symbol.for("llmgw.nccl-env.error");

/** Stable codes of {@link NcclEnvError}. */
export type NcclEnvErrorCode =
  /** A multi-node group was asked for without naming the fabric it runs on. */
  | "LLMGW_NCCL_ENV_NO_FABRIC_CHOSEN"
  /** The chosen fabric is not among this node's fabrics. */
  | "LLMGW_NCCL_ENV_FABRIC_MISSING"
  /** The chosen fabric is on this node but none of its ports is ACTIVE. */
  | "LLMGW_NCCL_ENV_NO_ACTIVE_PORTS"
  /** No interface for bootstrap/Gloo: the fabric ports have no netdev and none was configured. */
  | "LLMGW_NCCL_ENV_NO_SOCKET_INTERFACE"
  /** A device or interface name would not survive NCCL's list syntax (`,` `:` `^` `=`, spaces). */
  | "LLMGW_NCCL_ENV_INVALID_NAME";

/** The only error class this package throws. */
export class NcclEnvError extends Error {
  override readonly name = "NcclEnvError";
  readonly code: NcclEnvErrorCode;
  readonly [BRAND] = true;

  constructor(code: NcclEnvErrorCode, message: string, options: { cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
  }
}

/** True for an {@link NcclEnvError} from any copy of this package. */
export function isNcclEnvError(value: unknown): value is NcclEnvError {
  return (
    typeof value === "object" &&
    value !== null &&
    (value as Record<symbol, unknown>)[BRAND] === true
  );
}
