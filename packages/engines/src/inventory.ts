/**
 * The parts of a node inventory the engines read. These are structural subsets of
 * `@llmgw/discovery`'s `NodeInventory`/`Gpu` (and `@llmgw/nccl-env`'s fabric types), so a
 * discovery inventory is passed as is; keeping them local keeps this package free of a
 * dependency on discovery (and of its node:fs / child_process code).
 */
import type { NcclFabric, NcclGpuNic } from "@llmgw/nccl-env";

/** The fields of discovery's `Gpu` the engines read. */
export interface LaunchGpu {
  readonly index: number;
  readonly uuid: string;
  /** As printed by nvidia-smi, e.g. "NVIDIA H100 80GB HBM3". */
  readonly name: string;
  /** e.g. "h100-80g"; undefined when unknown. */
  readonly gpuClass?: string;
  readonly memoryTotalBytes?: number;
  /** "major.minor", e.g. "9.0". */
  readonly computeCapability?: string;
  readonly migEnabled: boolean;
  readonly healthy: boolean;
  readonly lost: boolean;
  readonly healthProblems?: readonly { readonly code: string; readonly message: string }[];
  /** Absent: `"nvidia"`. Decides which visibility variables the engine gets. */
  readonly vendor?: "nvidia" | "amd";
}

/** The fields of discovery's `NodeInventory` the engines read. */
export interface LaunchNode {
  readonly hostname: string;
  readonly addresses: readonly string[];
  readonly gpus: readonly LaunchGpu[];
  readonly fabrics: readonly NcclFabric[];
  readonly topology: { readonly gpuNics: readonly NcclGpuNic[] };
}
