export { freePort } from "@llmgw/supervisor";
export {
  type AgentConfig,
  type AgentConfigInput,
  agentConfigSchema,
  DEFAULT_AGENT_KERNEL_LOG,
  DEFAULT_LEAVE_TIMEOUT_MS,
  kernelLogPath,
  MAX_LEAVE_TIMEOUT_MS,
  parseAgentConfig,
} from "./config.js";
export {
  type ChannelHooks,
  type ChannelState,
  ControlChannel,
  type ControlChannelOptions,
  type LoadStream,
  openHeartbeatStream,
  openLoadStream,
  type ReportStream,
  watchDesired,
} from "./control-channel.js";
export { AgentError, type AgentErrorCode, isAgentError } from "./errors.js";
export { loadIdentity, type NodeIdentity, saveIdentity } from "./identity.js";
export {
  collectInventory,
  formatInventoryTable,
  type InventoryOptions,
  inventoryToJson,
} from "./inventory.js";
export type { LeaveOutcome, LeaveReport } from "./leave.js";
export { LEAVING_MARKER_FILE } from "./leaving-marker.js";
export {
  DEFAULT_LOAD_INTERVAL_MS,
  LoadReporter,
  type LoadReporterOptions,
  type LoadReporterState,
  type LoadReportSink,
  MAX_LOAD_INTERVAL_MS,
  MIN_LOAD_INTERVAL_MS,
} from "./load-reporter.js";
export { createEngineProbes } from "./probes.js";
export {
  type EngineLoadSignals,
  type EngineProbes,
  type ReplicaLoadSample,
  ReplicaManager,
  type ReplicaManagerOptions,
} from "./replica-manager.js";
export { type AgentDeps, type CloseOptions, type RunningAgent, startAgent } from "./run.js";
