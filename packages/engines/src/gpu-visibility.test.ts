import { describe, expect, it } from "vitest";
import { amdNode, cpuNode, ibH100Node, mixedVendorNode } from "../test/fixtures/inventories.js";
import { isEnginesError } from "./errors.js";
import { buildGpuVisibilityEnv } from "./gpu-visibility.js";

describe("buildGpuVisibilityEnv", () => {
  it.each([
    [
      "NVIDIA, 2 GPUs",
      ibH100Node("n", "10.0.0.1"),
      [6, 7],
      { CUDA_DEVICE_ORDER: "PCI_BUS_ID", CUDA_VISIBLE_DEVICES: "6,7" },
    ],
    [
      "CPU engine",
      cpuNode("n", "10.0.0.1"),
      [],
      { CUDA_DEVICE_ORDER: "PCI_BUS_ID", CUDA_VISIBLE_DEVICES: "" },
    ],
    [
      "AMD, GPUs 6 and 7: ROCr selects them, HIP numbers the survivors 0 and 1",
      amdNode("n", "10.0.0.1"),
      [6, 7],
      { ROCR_VISIBLE_DEVICES: "6,7", HIP_VISIBLE_DEVICES: "0,1", CUDA_VISIBLE_DEVICES: "0,1" },
    ],
    [
      "AMD, in the order given",
      amdNode("n", "10.0.0.1"),
      [3, 1],
      { ROCR_VISIBLE_DEVICES: "3,1", HIP_VISIBLE_DEVICES: "0,1", CUDA_VISIBLE_DEVICES: "0,1" },
    ],
    [
      "mixed node, AMD GPUs 3 and 4 are ROCr devices 1 and 2 (NVIDIA GPUs are numbered first)",
      mixedVendorNode("n", "10.0.0.1"),
      [3, 4],
      { ROCR_VISIBLE_DEVICES: "1,2", HIP_VISIBLE_DEVICES: "0,1", CUDA_VISIBLE_DEVICES: "0,1" },
    ],
    [
      "mixed node, NVIDIA GPU 1",
      mixedVendorNode("n", "10.0.0.1"),
      [1],
      { CUDA_DEVICE_ORDER: "PCI_BUS_ID", CUDA_VISIBLE_DEVICES: "1" },
    ],
  ] as const)("%s", (_, node, indexes, env) => {
    expect(buildGpuVisibilityEnv(node, indexes)).toEqual(env);
  });

  it("AMD env never names a device ordinal twice or HIP past ROCr's list", () => {
    const env = buildGpuVisibilityEnv(amdNode("n", "10.0.0.1"), [0, 1, 2, 3, 4, 5, 6, 7]);
    expect(env.ROCR_VISIBLE_DEVICES).toBe("0,1,2,3,4,5,6,7");
    expect(env.HIP_VISIBLE_DEVICES).toBe("0,1,2,3,4,5,6,7");
    expect(env.CUDA_DEVICE_ORDER).toBeUndefined();
  });

  it("a placement mixing vendors is refused", () => {
    let caught: unknown;
    try {
      buildGpuVisibilityEnv(mixedVendorNode("n", "10.0.0.1"), [1, 2]);
    } catch (error) {
      caught = error;
    }
    expect(isEnginesError(caught) && caught.code).toBe("LLMGW_ENGINES_INVALID_LAUNCH");
    expect((caught as Error).message).toBe(
      "placement.gpuIndices mix NVIDIA and AMD GPUs, which no engine can use together (got [1,2])",
    );
  });
});
