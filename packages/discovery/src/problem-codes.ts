import type { Problem } from "./types.js";

/**
 * Stable codes of the {@link Problem}s discovery reports (the README has the same table).
 * Node-level problems land in `NodeInventory.problems`; `GPU_*` codes are per-GPU health
 * problems in `Gpu.healthProblems` (and make the GPU unhealthy).
 */
export const ProblemCodes = {
  /** The nvidia-smi binary does not exist (ENOENT) or is not executable. */
  nvidiaSmiNotFound: "LLMGW_DISCOVERY_NVIDIA_SMI_NOT_FOUND",
  /** nvidia-smi did not finish within `timeoutMs` (broken driver); it was killed. */
  nvidiaSmiTimeout: "LLMGW_DISCOVERY_NVIDIA_SMI_TIMEOUT",
  /** Exit 18: kernel driver and NVML library versions differ (reboot or reload the module). */
  nvidiaSmiDriverMismatch: "LLMGW_DISCOVERY_NVIDIA_SMI_DRIVER_MISMATCH",
  /** Exit 9: nvidia-smi could not talk to the driver (module not loaded). */
  nvidiaSmiDriverNotLoaded: "LLMGW_DISCOVERY_NVIDIA_SMI_DRIVER_NOT_LOADED",
  /** Exit 2 on a field this nvidia-smi does not know; optional fields are dropped and retried. */
  nvidiaSmiFieldUnsupported: "LLMGW_DISCOVERY_NVIDIA_SMI_FIELD_UNSUPPORTED",
  /** Any other non-zero exit or unexpected output. */
  nvidiaSmiFailed: "LLMGW_DISCOVERY_NVIDIA_SMI_FAILED",
  /** One `--query-gpu` row could not be parsed (truncated, no index/uuid); the row is skipped. */
  gpuRowInvalid: "LLMGW_DISCOVERY_GPU_ROW_INVALID",
  /** `--query-compute-apps` failed; unmanaged-memory health is unknown. */
  computeAppsFailed: "LLMGW_DISCOVERY_COMPUTE_APPS_FAILED",
  /** `nvidia-smi topo -m` failed or printed nothing parseable. */
  topologyFailed: "LLMGW_DISCOVERY_TOPOLOGY_FAILED",
  /** The sysfs root exists but a device or port directory could not be read. */
  sysfsUnreadable: "LLMGW_DISCOVERY_SYSFS_UNREADABLE",
  /** An ACTIVE RoCE port has no usable RoCE v2 GID (no IPv4/routable address). */
  roceNoGid: "LLMGW_DISCOVERY_ROCE_NO_GID",
  /** The RoCE netdev's prefix length was unknown; the fabric id assumes /24. */
  rocePrefixAssumed: "LLMGW_DISCOVERY_ROCE_PREFIX_ASSUMED",
  /** Health: uncorrected volatile ECC errors > 0. */
  gpuEccUncorrected: "LLMGW_DISCOVERY_GPU_ECC_UNCORRECTED",
  /** Health: a process llmgw does not manage holds memory on the GPU. */
  gpuUnmanagedMemory: "LLMGW_DISCOVERY_GPU_UNMANAGED_MEMORY",
  /** Health: MIG mode is enabled, so the GPU cannot be scheduled as a whole. */
  gpuMigEnabled: "LLMGW_DISCOVERY_GPU_MIG_ENABLED",
  /** Health: the GPU cannot be queried at all ("fallen off the bus"). */
  gpuLost: "LLMGW_DISCOVERY_GPU_LOST",

  // Kernel log (NVRM Xid / SXid, see kernel-log.ts).
  /** The kernel log (`/dev/kmsg` or `--kernel-log`) cannot be read: faults there are unknown, not absent. */
  kernelLogUnreadable: "LLMGW_DISCOVERY_KERNEL_LOG_UNREADABLE",
  /**
   * Records or faults were lost before llmgw could report them: the kernel's ring buffer
   * overwrote records before they were read (kmsg EPIPE, or a first record with seq > 0), or
   * more faults than the watcher keeps (`maxFaults`) were seen.
   */
  kernelLogOverrun: "LLMGW_DISCOVERY_KERNEL_LOG_OVERRUN",
  /**
   * The kernel-log watcher's `stateFile` (faults saved across agent restarts) could not be read,
   * was corrupt, or could not be written: faults the kernel log no longer holds may be missing.
   */
  kernelLogStateFailed: "LLMGW_DISCOVERY_KERNEL_LOG_STATE_FAILED",
  /** Health: the kernel log holds a fault whose action is reset-gpu, drain-node or reboot. */
  gpuFault: "LLMGW_DISCOVERY_GPU_FAULT",

  // More nvidia-smi health (remapped rows, retired pages, PCIe, NVLink, recovery action).
  /** Health: a row remap is pending; the GPU needs a reset for it to take effect. */
  gpuRowRemapPending: "LLMGW_DISCOVERY_GPU_ROW_REMAP_PENDING",
  /** Health: a row could not be remapped (bad memory for good). */
  gpuRowRemapFailure: "LLMGW_DISCOVERY_GPU_ROW_REMAP_FAILURE",
  /** Health: retired pages are pending (pre-Ampere); reload the driver or reset the GPU. */
  gpuRetiredPagesPending: "LLMGW_DISCOVERY_GPU_RETIRED_PAGES_PENDING",
  /** Health: the PCIe link runs below its generation or width while the GPU is busy. */
  gpuPcieDegraded: "LLMGW_DISCOVERY_GPU_PCIE_DEGRADED",
  /** Health: one or more of the GPU's NVLinks is inactive. */
  gpuNvlinkInactive: "LLMGW_DISCOVERY_GPU_NVLINK_INACTIVE",
  /** Health: nvidia-smi's gpu_recovery_action is not "None". */
  gpuRecoveryAction: "LLMGW_DISCOVERY_GPU_RECOVERY_ACTION",

  // RDMA port health (sysfs counters and state over time).
  /** A port left ACTIVE too often within the flap window. */
  portFlapping: "LLMGW_DISCOVERY_PORT_FLAPPING",
  /** A port's error counter rose faster than its threshold. */
  portErrors: "LLMGW_DISCOVERY_PORT_ERRORS",
  /** A port's error counter is at its maximum, so new errors can no longer be seen. */
  portCounterSaturated: "LLMGW_DISCOVERY_PORT_COUNTER_SATURATED",
  /** Not health: some of a port's error counters cannot be read (EINVAL on restricted PFs, EPERM, …), so their errors are unknown. */
  portCountersUnreadable: "LLMGW_DISCOVERY_PORT_COUNTERS_UNREADABLE",
  /** An ACTIVE port runs below the operator's `minActiveRateGbps` (off by default). */
  portRateDegraded: "LLMGW_DISCOVERY_PORT_RATE_DEGRADED",

  // AMD (amd-smi JSON, rocm-smi fallback).
  /** amd-smi failed or printed JSON of no known shape; rocm-smi was tried next. */
  amdSmiFailed: "LLMGW_DISCOVERY_AMD_SMI_FAILED",
  /** rocm-smi (the fallback) failed too, or printed nothing usable. */
  rocmSmiFailed: "LLMGW_DISCOVERY_ROCM_SMI_FAILED",
  /** Health: AMD RAS reports uncorrectable ECC errors. */
  gpuRasUncorrected: "LLMGW_DISCOVERY_GPU_RAS_UNCORRECTED",
} as const;

/** One of {@link ProblemCodes}' values. */
export type ProblemCode = (typeof ProblemCodes)[keyof typeof ProblemCodes];

/** Builds a {@link Problem}; kept tiny so every call site reads as data. */
export function problem(code: ProblemCode, source: string, message: string): Problem {
  return { code, source, message };
}
