export { buildLaunchSpec, engineAdapters } from "./build-launch-spec.js";
export {
  DEFAULT_DRAIN_TIMEOUT_SECONDS,
  DEFAULT_MAX_SURGE,
  DEFAULT_MAX_UNAVAILABLE,
  type DeploymentSpec,
  type DeploymentSpecInput,
  deploymentGpusPerReplica,
  deploymentSpecSchema,
  ENGINES,
  type EngineName,
  engineEnvRefusal,
  engineSupportsMultiNode,
  NOT_LAUNCHED_FIELDS,
  OWNED_ENV,
  OWNED_FLAGS,
  OWNED_SHORT_FLAGS,
  ownedFlagIn,
  type ParseDeploymentSpecOptions,
  type ParseDeploymentSpecResult,
  parseDeploymentSpec,
  parseDeploymentSpecOrThrow,
  ROUTING_POLICIES,
  type RoutingPolicy,
  refusedEngineEnv,
  rolloutLimits,
  sameLaunch,
} from "./deployment-spec.js";
export {
  allowEngineEnvHint,
  ENGINE_ENV_ALLOWED,
  ENGINE_ENV_NAME,
  ENGINE_ENV_NEVER_ALLOWED,
  ENGINE_ENV_NEVER_ALLOWED_PATTERNS,
  type EngineEnvDenyReason,
  type EngineEnvGroup,
} from "./engine-env.js";
export {
  type DeploymentSpecIssue,
  EnginesError,
  type EnginesErrorCode,
  type EnginesErrorOptions,
  isEnginesError,
} from "./errors.js";
export { buildGpuVisibilityEnv, type LaunchGpuVendor } from "./gpu-visibility.js";
export type { LaunchGpu, LaunchNode } from "./inventory.js";
export {
  type BuildLaunchSpecInput,
  ENGINE_API_KEY_ENV,
  ENGINE_API_KEY_ENV_NAMES,
  type EngineAdapter,
  type LaunchPlacement,
  type LaunchPorts,
  type LaunchReadiness,
  type LaunchSpec,
  type NodeEngineConfig,
  type ResolvedNodeEngineConfig,
  resolveNodeEngineConfig,
  SECRET_ENV_NAMES,
} from "./launch-spec.js";
export { LLAMACPP_DEFAULT_CONTEXT } from "./llamacpp.js";
export {
  LLAMACPP_OWNED_LONG,
  LLAMACPP_OWNED_OPTIONS,
  LLAMACPP_OWNED_SHORT,
  type LlamacppOwnedReason,
  type LlamaServerHelpOption,
  llamacppOptionMustBeOwned,
  parseLlamaServerHelp,
  parseLlamaServerHelpOptions,
} from "./llamacpp-flags.js";
export { schedulesByPriority } from "./scheduling-policy.js";
export {
  DEFAULT_GPU_MEMORY_UTILIZATION,
  FP8_MIN_COMPUTE_CAPABILITY,
  type LaunchRankInput,
  type LaunchViolation,
  type LaunchViolationCode,
  type ValidateLaunchInput,
  validateLaunch,
} from "./validate-launch.js";
