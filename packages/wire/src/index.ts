export {
  deploymentInputFromProto,
  deploymentSpecFromProto,
  deploymentSpecToProto,
  sameDeploymentSpec,
} from "./deployment.js";
export {
  gpuFromProto,
  gpuHealthy,
  gpuReadingToProto,
  gpuToProto,
  inventoryFromProto,
  inventoryToProto,
} from "./inventory.js";
