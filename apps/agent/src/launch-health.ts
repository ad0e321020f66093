import { type Gpu, type NodeInventory, ProblemCodes } from "@llmgw/discovery";

/**
 * The inventory the agent's launch check reads: each GPU without its kernel-log fault
 * problems (`ProblemCodes.gpuFault`), healthy again when they were its only problems.
 *
 * The agent reports a kernel-log fault for as long as its record is in the log, but whether
 * it still counts is the control plane's decision: an operator's `llmgw gpu clear` is known
 * only there, and the control plane already refuses to place on a GPU with an uncleared
 * fault. Refusing here as well would refuse forever the replica the control plane places
 * after a clear. Every other problem, a lost GPU, and a `healthy: false` that no problem
 * explains still refuse the launch. A fault problem on a GPU without fault records is kept:
 * no record means nothing an operator could have cleared (the control plane fails closed on
 * it the same way).
 */
export function withoutKernelLogFaults(node: NodeInventory): NodeInventory {
  let changed = false;
  const gpus = node.gpus.map((gpu): Gpu => {
    if ((gpu.faults ?? []).length === 0) return gpu;
    const kept = gpu.healthProblems.filter((p) => p.code !== ProblemCodes.gpuFault);
    if (kept.length === gpu.healthProblems.length) return gpu;
    changed = true;
    return { ...gpu, healthProblems: kept, healthy: kept.length === 0 && !gpu.lost };
  });
  return changed ? { ...node, gpus } : node;
}
