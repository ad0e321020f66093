export {
  parseSimChatMessages,
  type SimChatMessage,
  type SimChatPromptOptions,
  simChatPrompt,
} from "./chat-prompt.js";
export { ENGINE_SIM_API_KEY_ENV, type EngineSimCliIo, runEngineSimCli } from "./cli.js";
export {
  type EngineSimClock,
  type EngineSimDeps,
  type EngineSimExitReport,
  type EngineSimState,
  type EngineSimStats,
  type RunningEngineSim,
  startEngineSim,
  systemEngineSimClock,
} from "./engine-sim.js";
export { EngineSimError, type EngineSimErrorCode, isEngineSimError } from "./errors.js";
export {
  buildTinyLlamaGguf,
  TINY_CHAT_TEMPLATE,
  TINY_MODEL_SPECS,
  type TinyLlamaSpec,
  type TinyModelKind,
  tinyModelParameters,
  tinyVocab,
} from "./gguf.js";
export {
  defaultLlamaCacheDir,
  type EnsureLlamaServerOptions,
  ensureLlamaServer,
  ensureTinyModel,
  findLlamaServer,
  type LlamaCacheOptions,
} from "./llamacpp.js";
export { Histogram, type MetricsState, renderSglangMetrics, renderVllmMetrics } from "./metrics.js";
export {
  ENGINE_SIM_USAGE,
  type EngineSimFaults,
  type EngineSimKvEventsOptions,
  type EngineSimMimic,
  type EngineSimOptions,
  parseEngineSimArgv,
  parseKvEventsConfig,
  type ResolvedEngineSimFaults,
  type ResolvedEngineSimKvEvents,
  type ResolvedEngineSimOptions,
  resolveEngineSimOptions,
  resolveKvEventsOptions,
} from "./options.js";
export {
  DEFAULT_TIMING_MODEL_OPTIONS,
  type PrefixCacheEvent,
  type ResolvedTimingModelOptions,
  resolveTimingModelOptions,
  type SequenceSpec,
  type StepPlan,
  TimingModel,
  type TimingModelHooks,
  type TimingModelOptions,
  type TimingSnapshot,
  type TokenEvent,
} from "./timing-model.js";
export {
  blockHashes,
  CHARS_PER_TOKEN,
  countTokens,
  createPrng,
  sequenceBlockHashes,
  simTokenIds,
  simTokenTexts,
} from "./tokenizer.js";
