export {
  type AgentConfig,
  type AgentConfigInput,
  agentConfigSchema,
  DEFAULT_AGENT_KERNEL_LOG,
  kernelLogPath,
  parseAgentConfig,
} from "./config.js";
export {
  type ChannelHooks,
  type ChannelState,
  ControlChannel,
  type ControlChannelOptions,
} from "./control-channel.js";
export { AgentError, type AgentErrorCode, isAgentError } from "./errors.js";
export { loadIdentity, type NodeIdentity, saveIdentity } from "./identity.js";
export {
  collectInventory,
  formatInventoryTable,
  type InventoryOptions,
  inventoryToJson,
} from "./inventory.js";
export { createEngineProbes } from "./probes.js";
export {
  type EngineLoadSignals,
  type EngineProbes,
  freePort,
  ReplicaManager,
  type ReplicaManagerOptions,
} from "./replica-manager.js";
export { type AgentDeps, type RunningAgent, startAgent } from "./run.js";
