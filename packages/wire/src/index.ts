export {
  deploymentInputFromProto,
  deploymentSpecFromProto,
  deploymentSpecToProto,
  sameDeploymentSpec,
} from "./deployment.js";
export {
  gpuFaultFromProto,
  gpuFaultToProto,
  gpuFromProto,
  gpuHealthy,
  gpuReadingToProto,
  gpuToProto,
  healthReadingsFromProto,
  healthReadingsToProto,
  inventoryFromProto,
  inventoryToProto,
  portFromProto,
  portToProto,
} from "./inventory.js";
