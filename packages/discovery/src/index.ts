export {
  type CommandResult,
  type CommandRunner,
  createExecFileRunner,
  type RunOptions,
} from "./command-runner.js";
export {
  DEFAULT_NVIDIA_SMI_TIMEOUT_MS,
  DEFAULT_SYSFS_ROOT,
  type DiscoveryOptions,
  discoverNode,
  type ResolvedDiscoveryOptions,
  readGpuReadings,
  resolveDiscoveryOptions,
} from "./discover.js";
export { DiscoveryError, type DiscoveryErrorCode, isDiscoveryError } from "./errors.js";
export { deriveGpuClass, deriveGpuModel } from "./gpu-class.js";
export { collectAddresses, readAddresses, readHostFacts } from "./host.js";
export {
  classifyXid,
  createXidAggregator,
  type FallenOffBus,
  type KernelLogRecord,
  NVIDIA_ACTION_TO_ACTION,
  type NvidiaXidAction,
  type ParsedXid,
  parseFallenOffBus,
  parseKmsgRecord,
  parseXid,
  pciBusKey,
  RECOVERY_ACTIONS,
  UNKNOWN_XID,
  XID_CATALOG,
  type XidAction,
  type XidAddResult,
  type XidAggregator,
  type XidAggregatorOptions,
  type XidCatalogEntry,
  type XidFault,
} from "./kernel-log.js";
export {
  buildGpu,
  classifyNvidiaSmiFailure,
  type GpuQueryContext,
  type GpuReadings,
  queryNvidiaGpus,
} from "./nvidia-smi.js";
export {
  COMPUTE_APPS_ARGS,
  type ComputeApp,
  GPU_QUERY_FIELDS,
  type GpuQueryField,
  type GpuQueryRow,
  type LostGpuMessage,
  normalizePciBusId,
  type ParseResult,
  parseComputeApps,
  parseDriverVersion,
  parseGpuQuery,
  parseLostGpu,
  parseSmiCell,
  parseSmiNumber,
  parseUnknownField,
} from "./nvidia-smi-parse.js";
export { type ProblemCode, ProblemCodes } from "./problem-codes.js";
export {
  parseSimulateSpec,
  SIMULATED_GPU_MODELS,
  type SimulatedGpuModel,
  type SimulateOptions,
  type SimulateSpec,
  simulateInventory,
} from "./simulate.js";
export {
  ASSUMED_ROCE_PREFIX_LENGTH,
  chooseRoceGid,
  type FabricReadOptions,
  type FabricReport,
  type GidEntry,
  ipv4FromGid,
  ipv4Subnet,
  isRoutableGid,
  type NetdevAddress,
  type NetdevAddressSource,
  osNetdevAddresses,
  parseLinkLayer,
  parseRateGbps,
  parseSysfsState,
  readFabrics,
} from "./sysfs.js";
export { EMPTY_TOPOLOGY, parseTopology, queryTopology } from "./topology.js";
export type {
  Fabric,
  Gpu,
  GpuAffinity,
  GpuLink,
  GpuNicAffinity,
  HostFacts,
  LinkLayer,
  NodeInventory,
  Port,
  Problem,
  Topology,
} from "./types.js";
