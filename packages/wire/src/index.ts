export {
  deploymentInputFromProto,
  deploymentSpecFromProto,
  deploymentSpecToProto,
  sameDeploymentSpec,
} from "./deployment.js";
export {
  COPY_AGE_HEADER,
  classifyControlPlaneError,
  createFailoverTransport,
  type FailoverTransport,
  type FailoverTransportOptions,
  LEADER_HEADER,
  SERVED_BY_HEADER,
  splitControlPlaneUrls,
} from "./failover.js";
export {
  type ClearedFaults,
  faultCleared,
  faultCounts,
  faultIsActionable,
  type GpuHealthVerdict,
  gpuFaultFromProto,
  gpuFaultKey,
  gpuFaultToProto,
  gpuFromProto,
  gpuHealthVerdict,
  gpuHealthy,
  gpuReadingFromProto,
  gpuReadingToProto,
  gpuToProto,
  healthReadingsFromProto,
  healthReadingsToProto,
  inventoryFromProto,
  inventoryToProto,
  portFromProto,
  portToProto,
  problemFromProto,
} from "./inventory.js";
export {
  budgetPeriodFromProto,
  budgetPeriodToProto,
  engineLoadFromProto,
  engineLoadToProto,
  priorityClassFromProto,
  priorityClassToProto,
  routingMessageFromProto,
  routingMessageToProto,
  tokenBudgetToProto,
} from "./routing.js";
export { usageAnswerFromProto, usageAnswerToProto, usageBatchToProto } from "./usage.js";
export { LLMGW_VERSION, PROTO_PACKAGE } from "./version.js";
