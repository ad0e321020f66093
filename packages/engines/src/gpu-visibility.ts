/**
 * Which GPUs an engine process may see, as environment variables; pure. NVIDIA GPUs are chosen
 * with CUDA's variables; AMD GPUs with ROCm's, whose two layers compose (see
 * {@link buildGpuVisibilityEnv}).
 */
import { EnginesError } from "./errors.js";
import type { LaunchNode } from "./inventory.js";

/** The vendor of a node's GPUs as the engines see it; absent in an inventory means NVIDIA. */
export type LaunchGpuVendor = "nvidia" | "amd";

/**
 * The environment that makes exactly `gpuIndices` (the node's inventory indexes) visible.
 *
 * NVIDIA: `CUDA_DEVICE_ORDER=PCI_BUS_ID` (CUDA's default, fastest first, does not match
 * nvidia-smi's numbering) and `CUDA_VISIBLE_DEVICES=<indexes>`; empty for CPU engines.
 *
 * AMD: `ROCR_VISIBLE_DEVICES=<ROCr ordinals>`, and `HIP_VISIBLE_DEVICES` and
 * `CUDA_VISIBLE_DEVICES` both `0,…,n-1`. ROCr filters first and HIP numbers only the devices
 * ROCr left ("the ROCR env var is processed first which then reduces the number of GPUs that
 * HIP can select from", PyTorch `torch/cuda/__init__.py` `_parse_visible_devices`; AMD's GPU
 * isolation guide), so giving both the physical ordinals would select nothing past the first
 * n. `CUDA_VISIBLE_DEVICES` is set to the same value because HIP reads it as an alias (ROCm
 * HIP environment variables: "HIP_VISIBLE_DEVICES or CUDA_VISIBLE_DEVICES") and vLLM on ROCm
 * asserts the two are equal when both are set (`vllm/platforms/rocm.py`, "Prevent use of
 * clashing `{CUDA/HIP}_VISIBLE_DEVICES`"), so one inherited from the agent's environment must
 * not survive. The ROCr ordinal of a GPU is its position among the node's AMD GPUs by index:
 * discovery numbers AMD GPUs in ROCr order after any NVIDIA GPUs, so on an AMD-only node it is
 * the index itself.
 *
 * @throws EnginesError `LLMGW_ENGINES_INVALID_LAUNCH` when the indexes name GPUs of both vendors.
 */
export function buildGpuVisibilityEnv(
  node: Pick<LaunchNode, "gpus">,
  gpuIndices: readonly number[],
): Record<string, string> {
  const vendorOf = (index: number): LaunchGpuVendor =>
    node.gpus.find((g) => g.index === index)?.vendor ?? "nvidia";
  const vendors = new Set(gpuIndices.map(vendorOf));
  if (vendors.size > 1) {
    throw new EnginesError(
      "LLMGW_ENGINES_INVALID_LAUNCH",
      `placement.gpuIndices mix NVIDIA and AMD GPUs, which no engine can use together (got ${JSON.stringify(gpuIndices)})`,
    );
  }
  if (!vendors.has("amd")) {
    return { CUDA_DEVICE_ORDER: "PCI_BUS_ID", CUDA_VISIBLE_DEVICES: gpuIndices.join(",") };
  }
  const amdIndexes = node.gpus
    .filter((g) => g.vendor === "amd")
    .map((g) => g.index)
    .sort((a, b) => a - b);
  const ordinals = gpuIndices.map((index) => amdIndexes.indexOf(index));
  const relative = gpuIndices.map((_, i) => i).join(",");
  return {
    ROCR_VISIBLE_DEVICES: ordinals.join(","),
    HIP_VISIBLE_DEVICES: relative,
    CUDA_VISIBLE_DEVICES: relative,
  };
}
