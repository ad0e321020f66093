/**
 * One error base for `@llmgw/engines`. Codes are stable (see the README's table); the brand
 * guard survives two copies of this package in one process, unlike bare `instanceof`.
 */

const BRAND = Symbol.for("llmgw.engines.error");

/** Stable codes of {@link EnginesError}. */
export type EnginesErrorCode =
  /** A deployment spec failed validation; `issues` lists every field. */
  | "LLMGW_ENGINES_INVALID_SPEC"
  /** An engine was asked for something it cannot do (e.g. llama.cpp across nodes). */
  | "LLMGW_ENGINES_UNSUPPORTED"
  /** The launch inputs (rank, GPUs, addresses, ports) are inconsistent. */
  | "LLMGW_ENGINES_INVALID_LAUNCH"
  /** Node-level engine configuration (commands, paths, host) is invalid. */
  | "LLMGW_ENGINES_INVALID_CONFIG"
  /** The NCCL environment could not be derived; `cause` is the `@llmgw/nccl-env` error. */
  | "LLMGW_ENGINES_NCCL_ENV"
  /** A deployment env name is not on this node's allow-list (or may never be set). */
  | "LLMGW_ENGINES_ENV_NOT_ALLOWED";

/** One field of a deployment spec that failed validation. */
export interface DeploymentSpecIssue {
  /** Dotted path with indices, e.g. `"extraArgs[2]"`, `"env.HF_TOKEN"`; `""` for the whole spec. */
  readonly field: string;
  /** Human text naming the rule that failed. */
  readonly message: string;
  /**
   * The offending value as given, echoed so the operator sees what was refused; absent where
   * it may be a secret (an env value), and `--flag=…` for an argument's value after `=`. The
   * refusal goes to logs and replica statuses, where a refused token must not.
   */
  readonly value?: unknown;
}

/** Options of {@link EnginesError}. */
export interface EnginesErrorOptions {
  readonly cause?: unknown;
  readonly issues?: readonly DeploymentSpecIssue[];
}

/** The only error class this package throws. */
export class EnginesError extends Error {
  override readonly name = "EnginesError";
  readonly code: EnginesErrorCode;
  /** Per-field problems for `LLMGW_ENGINES_INVALID_SPEC`; empty otherwise. */
  readonly issues: readonly DeploymentSpecIssue[];
  readonly [BRAND] = true;

  constructor(code: EnginesErrorCode, message: string, options: EnginesErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
    this.issues = options.issues ?? [];
  }
}

/** True for an {@link EnginesError} from any copy of this package. */
export function isEnginesError(value: unknown): value is EnginesError {
  return (
    typeof value === "object" &&
    value !== null &&
    (value as Record<symbol, unknown>)[BRAND] === true
  );
}
