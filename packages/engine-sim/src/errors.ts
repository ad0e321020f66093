const BRAND = Symbol.for("llmgw.engine-sim.error");

/** Stable codes of {@link EngineSimError}; documented in the package README. */
export type EngineSimErrorCode =
  | "LLMGW_ENGINE_SIM_INVALID_OPTION"
  | "LLMGW_ENGINE_SIM_LOAD_FAILED"
  | "LLMGW_ENGINE_SIM_LISTEN_FAILED"
  | "LLMGW_ENGINE_SIM_RANK_LOST"
  | "LLMGW_ENGINE_SIM_INVALID_TRANSITION"
  | "LLMGW_ENGINE_SIM_LLAMACPP_BUILD_FAILED"
  | "LLMGW_ENGINE_SIM_LLAMACPP_NOT_BUILT"
  | "LLMGW_ENGINE_SIM_GGUF_INVALID";

/** The one error base of `@llmgw/engine-sim`; `code` is stable, `cause` carries the origin. */
export class EngineSimError extends Error {
  readonly code: EngineSimErrorCode;
  /** Brand that survives two copies of this library in one process (see {@link isEngineSimError}). */
  readonly [BRAND] = true;

  constructor(code: EngineSimErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "EngineSimError";
    this.code = code;
  }
}

/** True for any {@link EngineSimError}, even one thrown by another copy of this package. */
export function isEngineSimError(value: unknown): value is EngineSimError {
  return (
    typeof value === "object" &&
    value !== null &&
    (value as Record<symbol, unknown>)[BRAND] === true
  );
}
