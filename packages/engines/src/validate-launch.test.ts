import { describe, expect, it } from "vitest";
import {
  cpuNode,
  gpus,
  IB_FABRIC,
  IB_FABRIC_B,
  ibH100Node,
  node,
  twoFabricNode,
} from "../test/fixtures/inventories.js";
import { type DeploymentSpecInput, parseDeploymentSpecOrThrow } from "./deployment-spec.js";
import type { LaunchGpu } from "./inventory.js";
import { type LaunchRankInput, validateLaunch } from "./validate-launch.js";

const range = (from: number, to: number) => Array.from({ length: to - from }, (_, i) => from + i);
const spec = (s: Partial<DeploymentSpecInput>) =>
  parseDeploymentSpecOrThrow({ name: "m", model: "org/model", engine: "vllm", ...s });
const a100Node = node("gpu-a100", { gpus: gpus("a100", 8) });
const h100 = ibH100Node("gpu-a", "10.0.0.1");
const h200 = ibH100Node("gpu-b", "10.0.0.2", "h200");
const rank = (
  nodeId: string,
  n: typeof h100,
  gpuIndices: number[],
  fabricId?: string,
): LaunchRankInput => ({
  nodeId,
  node: n,
  gpuIndices,
  ...(fabricId === undefined ? {} : { fabricId }),
});
const withGpu = (index: number, patch: Partial<LaunchGpu>) =>
  node("gpu-x", { gpus: gpus("h100", 8).map((g) => (g.index === index ? { ...g, ...patch } : g)) });

describe("validateLaunch", () => {
  it.each([
    {
      what: "vllm TP 8 on one H100 node",
      d: spec({ tensorParallel: 8 }),
      ranks: [rank("gpu-a", h100, range(0, 8))],
    },
    {
      what: "fp8 on H100 (9.0)",
      d: spec({ quantization: "fp8", kvCacheDtype: "fp8_e4m3" }),
      ranks: [rank("gpu-a", h100, [0])],
    },
    {
      what: "fp8 on L40S (8.9, the boundary)",
      d: spec({ quantization: "fp8" }),
      ranks: [rank("l", node("l", { gpus: gpus("l40s", 1) }), [0])],
    },
    {
      what: "TP 8 × PP 2 over two IB nodes on one fabric",
      d: spec({ tensorParallel: 8, pipelineParallel: 2, fabric: IB_FABRIC }),
      ranks: [
        rank("gpu-a", h100, range(0, 8), IB_FABRIC),
        rank("gpu-c", ibH100Node("gpu-c", "10.0.0.3"), range(0, 8), IB_FABRIC),
      ],
    },
    {
      what: "llamacpp on CPU",
      d: spec({ engine: "llamacpp", model: "/m.gguf" }),
      ranks: [rank("cpu", cpuNode("cpu", "10.0.0.9"), [])],
    },
    {
      what: "70B in fp16 (141 GB) on 2×H100 at 0.9",
      d: spec({ tensorParallel: 2, modelSizeBytes: 141_000_000_000 }),
      ranks: [rank("gpu-a", h100, [0, 1])],
    },
  ])("accepts $what", (c) => {
    expect(validateLaunch({ deployment: c.d, ranks: c.ranks })).toEqual([]);
  });

  it.each([
    {
      what: "fp8 on A100 is refused with the GPU named",
      d: spec({ quantization: "fp8" }),
      ranks: [rank("gpu-a100", a100Node, [2])],
      want: [
        {
          code: "LLMGW_ENGINES_FP8_UNSUPPORTED",
          nodeId: "gpu-a100",
          gpuIndex: 2,
          message:
            "quantization fp8 needs compute capability ≥ 8.9 for native FP8; GPU 2 (NVIDIA A100-SXM4-80GB) on gpu-a100 has 8.0 and would fall back to a slower path",
        },
      ],
    },
    {
      what: "an fp8 KV cache on A100 is refused too",
      d: spec({ kvCacheDtype: "fp8_e5m2" }),
      ranks: [rank("gpu-a100", a100Node, [0])],
      want: [
        {
          code: "LLMGW_ENGINES_FP8_UNSUPPORTED",
          gpuIndex: 0,
          message: expect.stringContaining("kvCacheDtype fp8_e5m2 needs"),
        },
      ],
    },
    {
      what: "fp8 where the capability is unknown",
      d: spec({ quantization: "fp8" }),
      ranks: [rank("gpu-x", withGpu(1, { computeCapability: undefined }), [1])],
      want: [{ code: "LLMGW_ENGINES_FP8_UNVERIFIED", gpuIndex: 1 }],
    },
    {
      what: "mixed H100/H200 in one TP group",
      d: spec({ tensorParallel: 8, pipelineParallel: 2 }),
      ranks: [
        rank("gpu-a", h100, range(0, 8), IB_FABRIC),
        rank("gpu-b", h200, range(0, 8), IB_FABRIC),
      ],
      want: range(0, 8).map((i) => ({
        code: "LLMGW_ENGINES_MIXED_GPU_MODELS",
        nodeId: "gpu-b",
        gpuIndex: i,
        value: "h200-141g",
        message: `GPU ${i} on gpu-b is h200-141g (NVIDIA H200) but GPU 0 on gpu-a is h100-80g (NVIDIA H100 80GB HBM3): one tensor-parallel group needs one GPU model`,
      })),
    },
    {
      what: "TP × PP arithmetic and uneven nodes",
      d: spec({ tensorParallel: 8, pipelineParallel: 2 }),
      ranks: [
        rank("gpu-a", h100, range(0, 8), IB_FABRIC),
        rank("gpu-c", ibH100Node("gpu-c", "10.0.0.3"), range(0, 4), IB_FABRIC),
      ],
      want: [
        {
          code: "LLMGW_ENGINES_GPU_COUNT_MISMATCH",
          value: 12,
          message: "TP 8 × PP 2 needs 16 GPUs but 2 node(s) give 12 (gpu-a: 8, gpu-c: 4)",
        },
        { code: "LLMGW_ENGINES_UNEVEN_NODES", nodeId: "gpu-c", value: 4 },
      ],
    },
    {
      what: "unhealthy, lost and MIG GPUs, and an index that does not exist",
      d: spec({ tensorParallel: 4 }),
      ranks: [
        rank(
          "gpu-x",
          node("gpu-x", {
            gpus: gpus("h100", 3).map((g) =>
              g.index === 0
                ? {
                    ...g,
                    healthy: false,
                    healthProblems: [{ code: "GPU_ECC", message: "2 uncorrected ECC errors" }],
                  }
                : g.index === 1
                  ? { ...g, lost: true, healthy: false }
                  : { ...g, migEnabled: true },
            ),
          }),
          [0, 1, 2, 9],
        ),
      ],
      want: [
        {
          code: "LLMGW_ENGINES_GPU_UNHEALTHY",
          gpuIndex: 0,
          message: expect.stringContaining("is unhealthy: 2 uncorrected ECC errors"),
        },
        { code: "LLMGW_ENGINES_GPU_LOST", gpuIndex: 1 },
        { code: "LLMGW_ENGINES_GPU_MIG", gpuIndex: 2 },
        {
          code: "LLMGW_ENGINES_GPU_NOT_FOUND",
          gpuIndex: 9,
          message: "GPU 9 is not in gpu-x's inventory",
        },
      ],
    },
    {
      what: "a declared model size that does not fit",
      d: spec({ tensorParallel: 2, modelSizeBytes: 150_000_000_000, gpuMemoryUtilization: 0.8 }),
      ranks: [rank("gpu-a", h100, [0, 1])],
      want: [
        {
          code: "LLMGW_ENGINES_MODEL_TOO_LARGE",
          value: 150_000_000_000,
          message:
            "model org/model declares 139.7 GiB but 2 GPU(s) × 79.6 GiB × utilisation 0.8 give 127.4 GiB",
        },
      ],
    },
    {
      what: "a GPU of the wrong class",
      d: spec({ gpuClass: "h200-141g" }),
      ranks: [rank("gpu-a", h100, [0])],
      want: [{ code: "LLMGW_ENGINES_GPU_CLASS_MISMATCH", gpuIndex: 0, value: "h100-80g" }],
    },
    {
      what: "ranks on different fabrics, one without the other's",
      d: spec({ tensorParallel: 8, pipelineParallel: 2 }),
      ranks: [
        rank("gpu-a", h100, range(0, 8), IB_FABRIC),
        rank("gpu-f", twoFabricNode("gpu-f", "10.0.0.6"), range(0, 8), IB_FABRIC_B),
      ],
      want: [
        {
          code: "LLMGW_ENGINES_MIXED_FABRICS",
          message: `ranks are on different fabrics (gpu-a: ${IB_FABRIC}, gpu-f: ${IB_FABRIC_B})`,
        },
      ],
    },
    {
      what: "a rank on a node that lacks the group's fabric",
      d: spec({ tensorParallel: 8, pipelineParallel: 2 }),
      ranks: [
        rank("gpu-a", h100, range(0, 8), IB_FABRIC_B),
        rank("gpu-f", twoFabricNode("gpu-f", "10.0.0.6"), range(0, 8), IB_FABRIC_B),
      ],
      want: [
        {
          code: "LLMGW_ENGINES_FABRIC_MISSING",
          nodeId: "gpu-a",
          value: IB_FABRIC_B,
          message: `node gpu-a has no ACTIVE port on fabric ${IB_FABRIC_B} (it has ${IB_FABRIC})`,
        },
      ],
    },
    {
      what: "a multi-node group on a node without fabric, and the deployment's fabric restriction",
      d: spec({ tensorParallel: 8, pipelineParallel: 2, fabric: IB_FABRIC_B }),
      ranks: [
        rank("gpu-a", h100, range(0, 8), IB_FABRIC),
        rank("gpu-n", node("gpu-n", { gpus: gpus("h100", 8) }), range(0, 8)),
      ],
      want: [
        { code: "LLMGW_ENGINES_NO_FABRIC", nodeId: "gpu-n" },
        { code: "LLMGW_ENGINES_FABRIC_MISMATCH", nodeId: "gpu-a", value: IB_FABRIC },
      ],
    },
    {
      what: "llamacpp asked for two nodes",
      d: spec({ engine: "llamacpp", model: "/m.gguf" }),
      ranks: [
        rank("cpu-a", cpuNode("cpu-a", "10.0.0.8"), []),
        rank("cpu-b", cpuNode("cpu-b", "10.0.0.9"), []),
      ],
      want: [
        {
          code: "LLMGW_ENGINES_MULTI_NODE_UNSUPPORTED",
          message: "llamacpp cannot span nodes, but 2 ranks were given (cpu-a, cpu-b)",
        },
        { code: "LLMGW_ENGINES_NO_FABRIC", nodeId: "cpu-a" },
        { code: "LLMGW_ENGINES_NO_FABRIC", nodeId: "cpu-b" },
      ],
    },
    { what: "no ranks", d: spec({}), ranks: [], want: [{ code: "LLMGW_ENGINES_NO_RANKS" }] },
  ])("refuses $what", (c) => {
    const got = validateLaunch({ deployment: c.d, ranks: c.ranks });
    expect(got).toHaveLength(c.want.length);
    got.forEach((v, i) => {
      expect(v).toMatchObject(c.want[i] as object);
    });
  });
});

describe("FP8 detection (validateLaunch on an A100)", () => {
  it.each([
    [{}, false],
    [{ quantization: "awq" }, false],
    [{ quantization: "FP8" }, true],
    [{ kvCacheDtype: "fp8_e5m2" }, true],
    [{ kvCacheDtype: "auto" }, false],
  ])("%j → refused: %s", (s, want) => {
    const issues = validateLaunch({
      deployment: spec(s),
      ranks: [rank("gpu-a100", a100Node, [0])],
    });
    expect(issues.some((i) => i.code === "LLMGW_ENGINES_FP8_UNSUPPORTED")).toBe(want);
  });
});
