import os from "node:os";
import { queryAmdGpus } from "./amd-smi.js";
import { type CommandRunner, createExecFileRunner } from "./command-runner.js";
import { DiscoveryError } from "./errors.js";
import { readAddresses, readHostFacts } from "./host.js";
import { type GpuReadings, queryNvidiaGpus } from "./nvidia-smi.js";
import { parseDriverVersion } from "./nvidia-smi-parse.js";
import { ProblemCodes } from "./problem-codes.js";
import { type NetdevAddressSource, osNetdevAddresses, readFabrics } from "./sysfs.js";
import { EMPTY_TOPOLOGY, queryTopology } from "./topology.js";
import type { NodeInventory, Problem } from "./types.js";

/** User-facing options of {@link discoverNode}; every field has a default. */
export interface DiscoveryOptions {
  /** nvidia-smi executable (a PATH name or a path). Default `"nvidia-smi"`. */
  readonly nvidiaSmiPath?: string;
  /** amd-smi executable (a PATH name or a path). Default `"amd-smi"`. */
  readonly amdSmiPath?: string;
  /** rocm-smi executable, the fallback when amd-smi is missing or fails. Default `"rocm-smi"`. */
  readonly rocmSmiPath?: string;
  /** Root of the RDMA class tree. Default `"/sys/class/infiniband"`. */
  readonly sysfsRoot?: string;
  /** Timeout of every nvidia-smi, amd-smi and rocm-smi run, in ms. Default 10 000. */
  readonly timeoutMs?: number;
  /** Operator-given fabric ids by RDMA device name (`mlx5_0` → `rail-0`); config wins. */
  readonly fabricNames?: Readonly<Record<string, string>> | ReadonlyMap<string, string>;
  /** Pids of processes llmgw manages; GPU memory held by any other pid is a health problem. */
  readonly managedPids?: Iterable<number>;
  /** Reported as `agentVersion`. Default `"0.0.0"`. */
  readonly agentVersion?: string;
  /** Milliseconds since the epoch, for `collectedAtUnixMs`. Default `Date.now`. */
  readonly clock?: () => number;
  /** Runs nvidia-smi. Default {@link createExecFileRunner}. */
  readonly runner?: CommandRunner;
  /** Prefix lengths of RoCE netdevs. Default `os.networkInterfaces()`. */
  readonly netdevAddresses?: NetdevAddressSource;
  /** Default `os.hostname()`. */
  readonly hostname?: string;
}

/** {@link DiscoveryOptions} with every default applied, validated once. */
export interface ResolvedDiscoveryOptions {
  readonly nvidiaSmiPath: string;
  readonly amdSmiPath: string;
  readonly rocmSmiPath: string;
  readonly sysfsRoot: string;
  readonly timeoutMs: number;
  readonly fabricNames: ReadonlyMap<string, string>;
  readonly managedPids: ReadonlySet<number>;
  readonly agentVersion: string;
  readonly clock: () => number;
  readonly runner: CommandRunner;
  readonly netdevAddresses: NetdevAddressSource;
  readonly hostname: string;
}

/** Default of {@link DiscoveryOptions.timeoutMs}: nvidia-smi on 8 GPUs answers in about 1 s. */
export const DEFAULT_NVIDIA_SMI_TIMEOUT_MS = 10_000;
/** Default of {@link DiscoveryOptions.sysfsRoot}. */
export const DEFAULT_SYSFS_ROOT = "/sys/class/infiniband";

function bad(option: string, value: unknown, rule: string): DiscoveryError {
  return new DiscoveryError(
    "LLMGW_DISCOVERY_INVALID_OPTION",
    `discovery option ${option} ${rule}; got ${JSON.stringify(value)}`,
  );
}

/**
 * Applies defaults and validates; throws {@link DiscoveryError} `LLMGW_DISCOVERY_INVALID_OPTION`
 * naming the option and echoing the bad value. Passing a resolved object again is harmless.
 */
export function resolveDiscoveryOptions(options: DiscoveryOptions = {}): ResolvedDiscoveryOptions {
  const timeoutMs = options.timeoutMs ?? DEFAULT_NVIDIA_SMI_TIMEOUT_MS;
  if (!Number.isInteger(timeoutMs) || timeoutMs <= 0) {
    throw bad("timeoutMs", options.timeoutMs, "must be a positive integer (milliseconds)");
  }
  const nvidiaSmiPath = options.nvidiaSmiPath ?? "nvidia-smi";
  if (nvidiaSmiPath.trim() === "") throw bad("nvidiaSmiPath", nvidiaSmiPath, "must not be empty");
  const amdSmiPath = options.amdSmiPath ?? "amd-smi";
  if (amdSmiPath.trim() === "") throw bad("amdSmiPath", amdSmiPath, "must not be empty");
  const rocmSmiPath = options.rocmSmiPath ?? "rocm-smi";
  if (rocmSmiPath.trim() === "") throw bad("rocmSmiPath", rocmSmiPath, "must not be empty");
  const sysfsRoot = options.sysfsRoot ?? DEFAULT_SYSFS_ROOT;
  if (sysfsRoot.trim() === "") throw bad("sysfsRoot", sysfsRoot, "must not be empty");
  const entries =
    options.fabricNames instanceof Map
      ? [...options.fabricNames]
      : Object.entries((options.fabricNames ?? {}) as Record<string, string>);
  for (const [device, id] of entries) {
    if (device.trim() === "" || typeof id !== "string" || id.trim() === "") {
      throw bad(
        "fabricNames",
        Object.fromEntries(entries),
        "must map device names to non-empty fabric ids",
      );
    }
  }
  const managedPids = new Set(options.managedPids ?? []);
  for (const pid of managedPids) {
    if (!Number.isInteger(pid) || pid <= 0)
      throw bad("managedPids", [...managedPids], "must hold positive integers");
  }
  return {
    nvidiaSmiPath,
    amdSmiPath,
    rocmSmiPath,
    sysfsRoot,
    timeoutMs,
    fabricNames: new Map(entries),
    managedPids,
    agentVersion: options.agentVersion ?? "0.0.0",
    clock: options.clock ?? Date.now,
    runner: options.runner ?? createExecFileRunner(),
    netdevAddresses: options.netdevAddresses ?? osNetdevAddresses,
    hostname: options.hostname ?? os.hostname(),
  };
}

function isResolved(
  options: DiscoveryOptions | ResolvedDiscoveryOptions,
): options is ResolvedDiscoveryOptions {
  return (
    options.fabricNames instanceof Map &&
    options.managedPids instanceof Set &&
    options.runner !== undefined
  );
}

/** Every vendor's GPUs of one reading, and the NVIDIA part on its own (topology needs it). */
interface AllGpus extends GpuReadings {
  readonly nvidia: GpuReadings;
  readonly amdDriverVersion?: string;
}

/**
 * Reads NVIDIA GPUs (nvidia-smi) and AMD GPUs (amd-smi, else rocm-smi) side by side; a node
 * may have both. NVIDIA GPUs keep nvidia-smi's indexes and come first; AMD GPUs are numbered
 * in ROCr/HIP order after them, from the highest NVIDIA index + 1 (from 0 on an AMD-only
 * node, where the index is the device ordinal itself), so indexes stay unique. A missing
 * nvidia-smi is no problem on a node whose GPUs are AMD; a missing amd-smi and rocm-smi is
 * never one (most nodes have no AMD GPUs).
 */
async function queryAllGpus(resolved: ResolvedDiscoveryOptions): Promise<AllGpus> {
  const nvidia = await queryNvidiaGpus(resolved);
  const last = nvidia.gpus.reduce((max, g) => Math.max(max, g.index), -1);
  const amd = await queryAmdGpus(resolved, last + 1);
  const nvidiaProblems =
    amd.gpus.length > 0
      ? nvidia.problems.filter((p) => p.code !== ProblemCodes.nvidiaSmiNotFound)
      : nvidia.problems;
  return {
    gpus: [...nvidia.gpus, ...amd.gpus],
    problems: [...nvidiaProblems, ...amd.problems],
    nvidia,
    ...(amd.driverVersion === undefined ? {} : { amdDriverVersion: amd.driverVersion }),
  };
}

/**
 * The GPU part only (no sysfs or topology), for heartbeats: fresh memory, utilisation,
 * temperature, ECC and health, from the same vendors and with the same indexes as
 * {@link discoverNode}. Never throws on outside input.
 */
export async function readGpuReadings(
  options: DiscoveryOptions | ResolvedDiscoveryOptions = {},
): Promise<GpuReadings> {
  const resolved = isResolved(options) ? options : resolveDiscoveryOptions(options);
  const { gpus, problems } = await queryAllGpus(resolved);
  return { gpus, problems };
}

/** nvidia-smi problems after which running `topo -m` would only repeat the failure. */
const NO_TOPOLOGY_AFTER = new Set<string>([
  ProblemCodes.nvidiaSmiNotFound,
  ProblemCodes.nvidiaSmiTimeout,
  ProblemCodes.nvidiaSmiDriverMismatch,
  ProblemCodes.nvidiaSmiDriverNotLoaded,
]);

/**
 * Everything this node is made of: GPUs (nvidia-smi; amd-smi or rocm-smi, see
 * {@link readGpuReadings} for how a node with both is numbered), RDMA fabrics (sysfs), GPU↔GPU/NIC
 * topology (`nvidia-smi topo -m`, NVIDIA GPUs only: it never runs on an AMD-only node),
 * driver version (`nvidia-smi --version`, best effort; amd-smi's on an AMD-only node), host
 * facts and addresses. GPUs and fabrics are read in
 * parallel. Throws only {@link DiscoveryError} for invalid options; everything found wrong
 * with the machine is in `problems` (or a GPU's `healthProblems`).
 */
export async function discoverNode(
  options: DiscoveryOptions | ResolvedDiscoveryOptions = {},
): Promise<NodeInventory> {
  const resolved = isResolved(options) ? options : resolveDiscoveryOptions(options);
  const [gpuReport, fabricReport] = await Promise.all([
    queryAllGpus(resolved),
    readFabrics(resolved),
  ]);
  const problems: Problem[] = [...gpuReport.problems];
  let topology = EMPTY_TOPOLOGY;
  let driverVersion: string | undefined;
  const nvidia = gpuReport.nvidia;
  if (nvidia.gpus.length > 0 && !nvidia.problems.some((p) => NO_TOPOLOGY_AFTER.has(p.code))) {
    const topo = await queryTopology(resolved);
    topology = topo.topology;
    problems.push(...topo.problems);
    // Best effort: an nvidia-smi without --version leaves driverVersion unset, no problem.
    const version = await resolved.runner.run(resolved.nvidiaSmiPath, ["--version"], {
      timeoutMs: resolved.timeoutMs,
    });
    driverVersion = version.exitCode === 0 ? parseDriverVersion(version.stdout) : undefined;
  } else {
    driverVersion = gpuReport.amdDriverVersion;
  }
  problems.push(...fabricReport.problems);
  return {
    hostname: resolved.hostname,
    addresses: readAddresses(),
    agentVersion: resolved.agentVersion,
    simulated: false,
    host: readHostFacts(),
    gpus: gpuReport.gpus,
    fabrics: fabricReport.fabrics,
    inactivePorts: fabricReport.inactivePorts,
    topology,
    problems,
    ...(driverVersion === undefined ? {} : { driverVersion }),
    collectedAtUnixMs: resolved.clock(),
  };
}
