import { createHash } from "node:crypto";
import { DiscoveryError } from "./errors.js";
import { deriveGpuClass } from "./gpu-class.js";
import type { Fabric, Gpu, HostFacts, NodeInventory, Port } from "./types.js";

/** What a simulated GPU of a known class looks like (values from real nvidia-smi rows). */
export interface SimulatedGpuModel {
  readonly name: string;
  readonly memoryTotalMiB: number;
  readonly computeCapability: string;
}

/**
 * Known classes for `--simulate`, keyed by the class {@link deriveGpuClass} gives for the
 * name and memory (a test keeps the two in agreement). Names and MiB are from formats.md.
 */
export const SIMULATED_GPU_MODELS: Readonly<Record<string, SimulatedGpuModel>> = {
  "h100-80g": { name: "NVIDIA H100 80GB HBM3", memoryTotalMiB: 81559, computeCapability: "9.0" },
  "h100nvl-94g": { name: "NVIDIA H100 NVL", memoryTotalMiB: 95830, computeCapability: "9.0" },
  "h200-141g": { name: "NVIDIA H200", memoryTotalMiB: 143771, computeCapability: "9.0" },
  "b200-180g": { name: "NVIDIA B200", memoryTotalMiB: 183359, computeCapability: "10.0" },
  "gh200-96g": { name: "NVIDIA GH200 480GB", memoryTotalMiB: 97871, computeCapability: "9.0" },
  "h20-96g": { name: "NVIDIA H20", memoryTotalMiB: 97871, computeCapability: "9.0" },
  "a100-80g": { name: "NVIDIA A100-SXM4-80GB", memoryTotalMiB: 81920, computeCapability: "8.0" },
  "a100-40g": { name: "NVIDIA A100-SXM4-40GB", memoryTotalMiB: 40960, computeCapability: "8.0" },
  "l40s-45g": { name: "NVIDIA L40S", memoryTotalMiB: 46068, computeCapability: "8.9" },
  "l4-23g": { name: "NVIDIA L4", memoryTotalMiB: 23034, computeCapability: "8.9" },
  "a10-23g": { name: "NVIDIA A10", memoryTotalMiB: 23028, computeCapability: "8.6" },
  "rtx4090-24g": {
    name: "NVIDIA GeForce RTX 4090",
    memoryTotalMiB: 24564,
    computeCapability: "8.9",
  },
  "rtx4080super-16g": {
    name: "NVIDIA GeForce RTX 4080 SUPER",
    memoryTotalMiB: 16376,
    computeCapability: "8.9",
  },
};

/** A parsed `--simulate` spec. */
export interface SimulateSpec {
  readonly groups: readonly { readonly count: number; readonly gpuClass: string }[];
  /** Fabric id after `@`; the node gets one IB port per GPU on it. */
  readonly fabric?: string;
}

const MAX_SIMULATED_GPUS = 1024;

function invalid(spec: string, why: string): DiscoveryError {
  return new DiscoveryError(
    "LLMGW_DISCOVERY_INVALID_SIMULATE_SPEC",
    `invalid simulate spec ${JSON.stringify(spec)}: ${why} (expected <count>x<class>[,<count>x<class>…][@<fabric>], e.g. 8xh100-80g@ib-a)`,
  );
}

/**
 * Resolves a class as written in a spec: exact known classes (`h100-80g`), case-insensitive,
 * and a bare model (`H100`) when exactly one known class has it; any other `<model>-<N>g` is
 * accepted as an unknown class (generic name, N GiB, no compute capability).
 */
function resolveClass(spec: string, written: string): string {
  const lower = written.toLowerCase();
  if (lower in SIMULATED_GPU_MODELS) return lower;
  const byModel = Object.keys(SIMULATED_GPU_MODELS).filter((c) => c.startsWith(`${lower}-`));
  if (byModel.length === 1 && byModel[0]) return byModel[0];
  if (/^[a-z0-9]+-\d+g$/.test(lower)) return lower;
  throw invalid(
    spec,
    `unknown GPU class "${written}" (known: ${Object.keys(SIMULATED_GPU_MODELS).join(", ")}; or any <model>-<GiB>g)`,
  );
}

/**
 * Parses `<count>x<class>[,<count>x<class>…][@<fabric>]`: `8xh100-80g@ib-a`,
 * `2xh100-80g,1xl40s-45g`, `2xH100`. Throws {@link DiscoveryError}
 * `LLMGW_DISCOVERY_INVALID_SIMULATE_SPEC` naming the bad part.
 */
export function parseSimulateSpec(spec: string): SimulateSpec {
  const trimmed = spec.trim();
  const at = trimmed.indexOf("@");
  const body = at < 0 ? trimmed : trimmed.slice(0, at);
  const fabric = at < 0 ? undefined : trimmed.slice(at + 1).trim();
  if (fabric !== undefined && !/^[A-Za-z0-9][A-Za-z0-9._:/-]*$/.test(fabric)) {
    throw invalid(spec, `fabric id "${fabric}" must be letters, digits and . _ : / -`);
  }
  if (body === "") throw invalid(spec, "no GPU groups");
  let total = 0;
  const groups = body.split(",").map((part) => {
    const match = /^\s*(\d+)\s*x\s*([A-Za-z0-9-]+)\s*$/.exec(part);
    if (!match) throw invalid(spec, `"${part}" is not <count>x<class>`);
    const count = Number(match[1]);
    if (count < 1) throw invalid(spec, `count in "${part}" must be at least 1`);
    total += count;
    return { count, gpuClass: resolveClass(spec, match[2] ?? "") };
  });
  if (total > MAX_SIMULATED_GPUS) throw invalid(spec, `more than ${MAX_SIMULATED_GPUS} GPUs`);
  return { groups, ...(fabric === undefined ? {} : { fabric }) };
}

/** Options of {@link simulateInventory}. */
export interface SimulateOptions {
  readonly hostname?: string;
  readonly agentVersion?: string;
  readonly addresses?: readonly string[];
  readonly nowMs?: number;
}

function deterministicUuid(hostname: string, index: number): string {
  const hex = createHash("sha256").update(`${hostname}/${index}`).digest("hex");
  return `GPU-${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20, 32)}`;
}

function modelFor(gpuClass: string): SimulatedGpuModel | { name: string; memoryTotalMiB: number } {
  const known = SIMULATED_GPU_MODELS[gpuClass];
  if (known) return known;
  const [model = "gpu", gib = "1g"] = gpuClass.split("-");
  return {
    name: `NVIDIA ${model.toUpperCase()}`,
    memoryTotalMiB: Number.parseInt(gib, 10) * 1024,
  };
}

/**
 * A realistic inventory of a node that does not exist, for demos and tests on machines
 * without GPUs: GPUs with real names, memory and compute capability for known classes, uuids
 * derived from hostname + index (stable across runs), idle readings, healthy; with `@fabric`,
 * one ACTIVE 400 Gb/s InfiniBand port per GPU (`mlx5_0`…) on a fabric with that id; NVLink
 * between same-class GPUs is not simulated. `simulated: true`.
 */
export function simulateInventory(
  spec: string | SimulateSpec,
  options: SimulateOptions = {},
): NodeInventory {
  const parsed = typeof spec === "string" ? parseSimulateSpec(spec) : spec;
  const hostname = options.hostname ?? "sim-node";
  const gpus: Gpu[] = [];
  for (const group of parsed.groups) {
    const model = modelFor(group.gpuClass);
    for (let i = 0; i < group.count; i++) {
      const index = gpus.length;
      const bus = (index + 1).toString(16).toUpperCase().padStart(2, "0");
      gpus.push({
        index,
        uuid: deterministicUuid(hostname, index),
        name: model.name,
        gpuClass: deriveGpuClass(model.name, model.memoryTotalMiB) ?? group.gpuClass,
        pciBusId: `00000000:${bus}:00.0`,
        memoryTotalBytes: model.memoryTotalMiB * 1024 * 1024,
        ...("computeCapability" in model ? { computeCapability: model.computeCapability } : {}),
        migEnabled: false,
        memoryUsedBytes: 0,
        utilizationPercent: 0,
        eccUncorrectedErrors: 0,
        temperatureCelsius: 35,
        powerWatts: 70,
        healthy: true,
        healthProblems: [],
        unmanagedMemoryBytes: 0,
        lost: false,
      });
    }
  }
  const fabrics: Fabric[] = [];
  if (parsed.fabric !== undefined) {
    const ports: Port[] = gpus.map((_, i) => ({
      device: `mlx5_${i}`,
      port: 1,
      linkLayer: "infiniband",
      state: "ACTIVE",
      physState: "LinkUp",
      rateGbps: 400,
      netdev: `ibp${i}s0`,
      subnetPrefix: "fe80:0000:0000:0000",
      smLid: "0x1",
    }));
    fabrics.push({ id: parsed.fabric, linkLayer: "infiniband", ports, idSource: "configured" });
  }
  const host: HostFacts = {
    cpuCount: 64,
    memoryBytes: 512 * 1024 ** 3,
    os: "Linux",
    osRelease: "simulated",
    arch: "x64",
  };
  return {
    hostname,
    addresses: options.addresses ?? [],
    agentVersion: options.agentVersion ?? "0.0.0",
    simulated: true,
    host,
    gpus,
    fabrics,
    inactivePorts: [],
    topology: {
      gpuLinks: [],
      gpuNics:
        fabrics.length > 0
          ? gpus.map((g, i) => ({ gpu: g.index, nic: `mlx5_${i}`, path: "PIX" }))
          : [],
      gpuAffinity: [],
    },
    problems: [],
    collectedAtUnixMs: options.nowMs ?? 0,
  };
}
