/**
 * Checks a whole replica (all its ranks) before anything is launched, and reports EVERY
 * problem, each naming the GPU, node or value at fault.
 */
import {
  type DeploymentSpec,
  deploymentGpusPerReplica,
  engineSupportsMultiNode,
} from "./deployment-spec.js";
import type { LaunchGpu, LaunchNode } from "./inventory.js";

/** Stable codes of {@link LaunchViolation} (see the README's table). */
export type LaunchViolationCode =
  | "LLMGW_ENGINES_NO_RANKS"
  | "LLMGW_ENGINES_MULTI_NODE_UNSUPPORTED"
  | "LLMGW_ENGINES_GPU_COUNT_MISMATCH"
  | "LLMGW_ENGINES_UNEVEN_NODES"
  | "LLMGW_ENGINES_DUPLICATE_NODE"
  | "LLMGW_ENGINES_GPU_NOT_FOUND"
  | "LLMGW_ENGINES_GPU_DUPLICATE"
  | "LLMGW_ENGINES_GPU_UNHEALTHY"
  | "LLMGW_ENGINES_GPU_LOST"
  | "LLMGW_ENGINES_GPU_MIG"
  | "LLMGW_ENGINES_GPU_CLASS_MISMATCH"
  | "LLMGW_ENGINES_MIXED_GPU_MODELS"
  | "LLMGW_ENGINES_FP8_UNSUPPORTED"
  | "LLMGW_ENGINES_FP8_UNVERIFIED"
  | "LLMGW_ENGINES_MODEL_TOO_LARGE"
  | "LLMGW_ENGINES_GPU_MEMORY_UNKNOWN"
  | "LLMGW_ENGINES_NO_FABRIC"
  | "LLMGW_ENGINES_MIXED_FABRICS"
  | "LLMGW_ENGINES_FABRIC_MISMATCH"
  | "LLMGW_ENGINES_FABRIC_MISSING";

/** One reason a replica must not be launched. */
export interface LaunchViolation {
  readonly code: LaunchViolationCode;
  /** Human sentence naming the node/GPU/value. */
  readonly message: string;
  readonly nodeId?: string;
  /** nvidia-smi index of the offending GPU. */
  readonly gpuIndex?: number;
  /** The offending value (a count, a class, a fabric id…). */
  readonly value?: unknown;
}

/** One rank as placed (by the scheduler, or naively by the dry run). */
export interface LaunchRankInput {
  readonly nodeId: string;
  readonly node: LaunchNode;
  readonly gpuIndices: readonly number[];
  /** The fabric the group uses; required on every rank of a multi-node group. */
  readonly fabricId?: string;
}

/** Input of {@link validateLaunch}. */
export interface ValidateLaunchInput {
  readonly deployment: DeploymentSpec;
  readonly ranks: readonly LaunchRankInput[];
}

/** Minimum compute capability with native FP8 (Ada 8.9, Hopper 9.0, Blackwell 10+). */
export const FP8_MIN_COMPUTE_CAPABILITY = 8.9;
/** Utilisation assumed when the deployment sets none (vLLM's default). */
export const DEFAULT_GPU_MEMORY_UTILIZATION = 0.9;

/** The deployment's FP8 settings as text (`"quantization fp8"`, …); empty when it asks for none. */
function fp8Settings(d: Pick<DeploymentSpec, "quantization" | "kvCacheDtype">): string[] {
  return [
    d.quantization?.toLowerCase().startsWith("fp8") ? `quantization ${d.quantization}` : undefined,
    d.kvCacheDtype?.toLowerCase().startsWith("fp8") ? `kvCacheDtype ${d.kvCacheDtype}` : undefined,
  ].filter((s) => s !== undefined);
}

/**
 * Returns every violation (empty = launchable):
 * - rank arithmetic: total GPUs = TP × PP (GPU engines), every node the same GPU count, no node
 *   twice, llama.cpp never across nodes;
 * - GPUs: present, distinct, healthy, not lost, not MIG, of the deployment's class, one model
 *   (class, else nvidia-smi name) across the whole group;
 * - FP8: `quantization` fp8* OR `kvCacheDtype` fp8* below compute capability 8.9 is refused,
 *   naming the GPU. KV-cache FP8 is treated like FP8 weights on purpose: on Ampere engines
 *   only emulate it (storage-only conversion, slower attention paths), and DESIGN §4 prefers a
 *   refusal over silently slower serving. An unknown capability is refused as unverified;
 * - memory: `modelSizeBytes` ≤ smallest GPU memory × utilisation × GPUs per replica;
 * - fabric (multi-node): every rank names the same fabric, matching `deployment.fabric` when
 *   set, and every node has that fabric with an ACTIVE port.
 */
export function validateLaunch(input: ValidateLaunchInput): LaunchViolation[] {
  const { deployment: d, ranks } = input;
  const out: LaunchViolation[] = [];
  if (ranks.length === 0) {
    return [
      { code: "LLMGW_ENGINES_NO_RANKS", message: `deployment ${d.name} has no ranks to launch` },
    ];
  }
  const multiNode = ranks.length > 1;
  if (multiNode && !engineSupportsMultiNode(d.engine)) {
    out.push({
      code: "LLMGW_ENGINES_MULTI_NODE_UNSUPPORTED",
      message: `${d.engine} cannot span nodes, but ${ranks.length} ranks were given (${ranks.map((r) => r.nodeId).join(", ")})`,
      value: ranks.length,
    });
  }
  const seenNodes = new Set<string>();
  for (const r of ranks) {
    if (seenNodes.has(r.nodeId)) {
      out.push({
        code: "LLMGW_ENGINES_DUPLICATE_NODE",
        message: `node ${r.nodeId} appears in more than one rank`,
        nodeId: r.nodeId,
      });
    }
    seenNodes.add(r.nodeId);
  }

  const wanted = deploymentGpusPerReplica(d);
  const total = ranks.reduce((n, r) => n + r.gpuIndices.length, 0);
  if (total !== wanted) {
    const perNode = ranks.map((r) => `${r.nodeId}: ${r.gpuIndices.length}`).join(", ");
    out.push({
      code: "LLMGW_ENGINES_GPU_COUNT_MISMATCH",
      message:
        d.engine === "llamacpp"
          ? `llamacpp asks for ${wanted} GPU(s) (gpusPerReplica) but ${total} were given (${perNode})`
          : `TP ${d.tensorParallel} × PP ${d.pipelineParallel} needs ${wanted} GPUs but ${ranks.length} node(s) give ${total} (${perNode})`,
      value: total,
    });
  }
  const first = ranks[0];
  if (first !== undefined) {
    for (const r of ranks) {
      if (r.gpuIndices.length !== first.gpuIndices.length) {
        out.push({
          code: "LLMGW_ENGINES_UNEVEN_NODES",
          message: `every node of a group must give the same GPU count: ${r.nodeId} gives ${r.gpuIndices.length}, ${first.nodeId} gives ${first.gpuIndices.length}`,
          nodeId: r.nodeId,
          value: r.gpuIndices.length,
        });
      }
    }
  }

  const chosen: { nodeId: string; gpu: LaunchGpu }[] = [];
  for (const r of ranks) {
    const seen = new Set<number>();
    for (const index of r.gpuIndices) {
      const at = { nodeId: r.nodeId, gpuIndex: index };
      if (seen.has(index)) {
        out.push({
          code: "LLMGW_ENGINES_GPU_DUPLICATE",
          message: `GPU ${index} on ${r.nodeId} is listed twice`,
          ...at,
        });
        continue;
      }
      seen.add(index);
      const gpu = r.node.gpus.find((g) => g.index === index);
      if (gpu === undefined) {
        out.push({
          code: "LLMGW_ENGINES_GPU_NOT_FOUND",
          message: `GPU ${index} is not in ${r.nodeId}'s inventory`,
          ...at,
        });
        continue;
      }
      chosen.push({ nodeId: r.nodeId, gpu });
      const label = `GPU ${index} (${gpu.name}, ${gpu.uuid}) on ${r.nodeId}`;
      if (gpu.lost) {
        out.push({
          code: "LLMGW_ENGINES_GPU_LOST",
          message: `${label} has fallen off the bus`,
          ...at,
        });
      } else if (!gpu.healthy) {
        const why = (gpu.healthProblems ?? []).map((p) => p.message).join("; ");
        out.push({
          code: "LLMGW_ENGINES_GPU_UNHEALTHY",
          message: `${label} is unhealthy${why ? `: ${why}` : ""}`,
          ...at,
        });
      }
      if (gpu.migEnabled) {
        out.push({
          code: "LLMGW_ENGINES_GPU_MIG",
          message: `${label} has MIG enabled and cannot be used as a whole GPU`,
          ...at,
        });
      }
      if (d.gpuClass !== undefined && gpu.gpuClass !== d.gpuClass) {
        out.push({
          code: "LLMGW_ENGINES_GPU_CLASS_MISMATCH",
          message: `${label} is ${gpu.gpuClass ?? "of unknown class"}, the deployment asks for ${d.gpuClass}`,
          ...at,
          value: gpu.gpuClass,
        });
      }
    }
  }

  const model = (g: LaunchGpu) => g.gpuClass ?? g.name;
  const reference = chosen[0];
  if (reference !== undefined) {
    for (const c of chosen) {
      if (model(c.gpu) !== model(reference.gpu)) {
        out.push({
          code: "LLMGW_ENGINES_MIXED_GPU_MODELS",
          message: `GPU ${c.gpu.index} on ${c.nodeId} is ${model(c.gpu)} (${c.gpu.name}) but GPU ${reference.gpu.index} on ${reference.nodeId} is ${model(reference.gpu)} (${reference.gpu.name}): one tensor-parallel group needs one GPU model`,
          nodeId: c.nodeId,
          gpuIndex: c.gpu.index,
          value: model(c.gpu),
        });
      }
    }
  }

  const fp8 = fp8Settings(d);
  if (fp8.length > 0) {
    const what = fp8.join(" and ");
    for (const c of chosen) {
      const cc =
        c.gpu.computeCapability === undefined
          ? Number.NaN
          : Number.parseFloat(c.gpu.computeCapability);
      const at = { nodeId: c.nodeId, gpuIndex: c.gpu.index, value: c.gpu.computeCapability };
      if (Number.isNaN(cc)) {
        out.push({
          code: "LLMGW_ENGINES_FP8_UNVERIFIED",
          message: `${what} needs compute capability ≥ ${FP8_MIN_COMPUTE_CAPABILITY}, but GPU ${c.gpu.index} (${c.gpu.name}) on ${c.nodeId} did not report one`,
          ...at,
        });
      } else if (cc < FP8_MIN_COMPUTE_CAPABILITY) {
        out.push({
          code: "LLMGW_ENGINES_FP8_UNSUPPORTED",
          message: `${what} needs compute capability ≥ ${FP8_MIN_COMPUTE_CAPABILITY} for native FP8; GPU ${c.gpu.index} (${c.gpu.name}) on ${c.nodeId} has ${c.gpu.computeCapability} and would fall back to a slower path`,
          ...at,
        });
      }
    }
  }

  if (d.modelSizeBytes !== undefined && chosen.length > 0) {
    const unknown = chosen.filter((c) => c.gpu.memoryTotalBytes === undefined);
    if (unknown.length > 0) {
      for (const c of unknown) {
        out.push({
          code: "LLMGW_ENGINES_GPU_MEMORY_UNKNOWN",
          message: `GPU ${c.gpu.index} on ${c.nodeId} reported no memory.total, so the declared model size cannot be checked`,
          nodeId: c.nodeId,
          gpuIndex: c.gpu.index,
        });
      }
    } else {
      const util = d.gpuMemoryUtilization ?? DEFAULT_GPU_MEMORY_UTILIZATION;
      const smallest = Math.min(...chosen.map((c) => c.gpu.memoryTotalBytes as number));
      const usable = Math.floor(smallest * util) * chosen.length;
      if (d.modelSizeBytes > usable) {
        out.push({
          code: "LLMGW_ENGINES_MODEL_TOO_LARGE",
          message: `model ${d.model} declares ${gib(d.modelSizeBytes)} but ${chosen.length} GPU(s) × ${gib(smallest)} × utilisation ${util} give ${gib(usable)}`,
          value: d.modelSizeBytes,
        });
      }
    }
  }

  if (multiNode) {
    const ids = new Set(ranks.map((r) => r.fabricId));
    const missing = ranks.filter((r) => r.fabricId === undefined || r.fabricId === "");
    for (const r of missing) {
      out.push({
        code: "LLMGW_ENGINES_NO_FABRIC",
        message: `rank on ${r.nodeId} names no fabric; a multi-node group must run on one RDMA fabric`,
        nodeId: r.nodeId,
      });
    }
    if (ids.size > 1 && missing.length === 0) {
      out.push({
        code: "LLMGW_ENGINES_MIXED_FABRICS",
        message: `ranks are on different fabrics (${ranks.map((r) => `${r.nodeId}: ${r.fabricId}`).join(", ")})`,
        value: [...ids],
      });
    }
    for (const r of ranks) {
      if (r.fabricId === undefined || r.fabricId === "") continue;
      if (d.fabric !== undefined && r.fabricId !== d.fabric) {
        out.push({
          code: "LLMGW_ENGINES_FABRIC_MISMATCH",
          message: `rank on ${r.nodeId} uses fabric ${r.fabricId}, the deployment is restricted to ${d.fabric}`,
          nodeId: r.nodeId,
          value: r.fabricId,
        });
      }
      const fabric = r.node.fabrics.find((f) => f.id === r.fabricId);
      if (fabric === undefined || !fabric.ports.some((p) => p.state === "ACTIVE")) {
        const have = r.node.fabrics.map((f) => f.id);
        out.push({
          code: "LLMGW_ENGINES_FABRIC_MISSING",
          message: `node ${r.nodeId} has no ACTIVE port on fabric ${r.fabricId} (it has ${have.length === 0 ? "no fabric" : have.join(", ")})`,
          nodeId: r.nodeId,
          value: r.fabricId,
        });
      }
    }
  }
  return out;
}

function gib(bytes: number): string {
  return `${(bytes / 2 ** 30).toFixed(1)} GiB`;
}
