/**
 * One error base for the agent (`llmgw agent`). What the agent finds wrong with the machine
 * or with a desired set is reported to the control plane as data (problems, FAILED replica
 * statuses with a message); it throws where it cannot go on (bad configuration, an unsafe
 * state dir) and where a refusal becomes such a message. The brand guard survives two copies
 * of this module in one process. The README has the table.
 */

const BRAND = Symbol.for("llmgw.agent.error");

/** Stable codes of {@link AgentError}. */
export type AgentErrorCode =
  /** Flags, environment or config file failed validation; the message names every bad field. */
  | "LLMGW_AGENT_CONFIG_INVALID"
  /** The state dir (or one below it) is a symlink, not a directory, or owned by another user. */
  | "LLMGW_AGENT_STATE_DIR_UNSAFE"
  /** `--model-root` cannot be resolved (missing, unreadable); the agent does not start. */
  | "LLMGW_AGENT_MODEL_ROOT_INVALID"
  /** A deployment's model is a local path that does not resolve inside `--model-root`. */
  | "LLMGW_AGENT_MODEL_OUTSIDE_ROOT"
  /**
   * An assignment this node will not run: no deployment, launch validation failed (GPUs,
   * engine), or `trustRemoteCode` without `--allow-trust-remote-code`. Reported as FAILED.
   */
  | "LLMGW_AGENT_ASSIGNMENT_REFUSED"
  /** An engine process could not be started (`cause`: the supervisor's error). Reported as FAILED. */
  | "LLMGW_AGENT_LAUNCH_FAILED";

/** The agent's one error class. */
export class AgentError extends Error {
  override readonly name = "AgentError";
  readonly code: AgentErrorCode;
  readonly [BRAND] = true;

  constructor(code: AgentErrorCode, message: string, options: { cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
  }
}

/** True for an {@link AgentError} from any copy of this module. */
export function isAgentError(value: unknown): value is AgentError {
  return (
    typeof value === "object" &&
    value !== null &&
    (value as Record<symbol, unknown>)[BRAND] === true
  );
}
