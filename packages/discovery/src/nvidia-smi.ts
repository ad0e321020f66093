import type { CommandResult, CommandRunner } from "./command-runner.js";
import { deriveGpuClass } from "./gpu-class.js";
import {
  COMPUTE_APPS_ARGS,
  type ComputeApp,
  GPU_QUERY_FIELDS,
  type GpuQueryRow,
  gpuQueryField,
  type NvlinkGpuStatus,
  parseComputeApps,
  parseGpuQuery,
  parseLostGpu,
  parseNvlinkStatus,
  parseUnknownField,
} from "./nvidia-smi-parse.js";
import { ProblemCodes, problem } from "./problem-codes.js";
import type { Gpu, GpuHealthReadings, Problem } from "./types.js";

const MIB = 1024 * 1024;
const SOURCE = "nvidia-smi";
/** Upper bound of the per-GPU fallback probe (`-i 0`, `-i 1`, …). */
const MAX_PROBED_GPUS = 64;

/**
 * Utilisation (percent) at or above which a PCIe link below its maximum generation or width is
 * a health problem ({@link ProblemCodes.gpuPcieDegraded}). Below it the drop is expected: an
 * idle GPU lowers its link generation to save power (health-formats.md §2.1: an idle RTX 2080
 * reads gen 1 of 3, and 3 under load). A GPU with unreported utilisation (MIG) is never flagged.
 */
export const PCIE_DEGRADED_MIN_UTILIZATION_PERCENT = 50;

/** Arguments of the NVLink status query (health-formats.md §2.4). */
export const NVLINK_STATUS_ARGS: readonly string[] = ["nvlink", "-s"];

/** What the GPU part of discovery needs; a slice of the resolved discovery options. */
export interface GpuQueryContext {
  readonly runner: CommandRunner;
  readonly nvidiaSmiPath: string;
  readonly timeoutMs: number;
  /** Pids whose GPU memory is llmgw's own (engines it supervises). */
  readonly managedPids: ReadonlySet<number>;
}

/** GPUs with readings and health, plus node-level problems. */
export interface GpuReadings {
  readonly gpus: readonly Gpu[];
  readonly problems: readonly Problem[];
}

function firstLine(result: CommandResult): string {
  const text = `${result.stdout}\n${result.stderr}`.trim();
  return text.split(/\r?\n/)[0]?.trim() ?? "";
}

/**
 * Turns a failed nvidia-smi run into a problem with a stable code, or `undefined` when it
 * succeeded. Exit codes mirror NVML return codes (formats.md §1.6).
 */
export function classifyNvidiaSmiFailure(
  path: string,
  what: string,
  result: CommandResult,
  timeoutMs: number,
): Problem | undefined {
  if (result.notFound) {
    return problem(
      ProblemCodes.nvidiaSmiNotFound,
      SOURCE,
      `nvidia-smi not found (${path}): no NVIDIA driver on this node, so no GPUs are reported`,
    );
  }
  if (result.timedOut) {
    return problem(
      ProblemCodes.nvidiaSmiTimeout,
      SOURCE,
      `nvidia-smi ${what} did not finish within ${timeoutMs} ms and was killed (hung driver?)`,
    );
  }
  if (result.exitCode === 0) return undefined;
  const output = firstLine(result);
  if (result.exitCode === 18 || /Driver\/library version mismatch/i.test(output)) {
    return problem(
      ProblemCodes.nvidiaSmiDriverMismatch,
      SOURCE,
      `nvidia-smi ${what}: driver/library version mismatch (exit ${result.exitCode}): ${output}`,
    );
  }
  if (/Failed to initialize NVML: Unknown Error/i.test(output)) {
    // health-formats.md §2.5: NVML itself cannot start, so no GPU can be named or probed with
    // `-i N`; usually a GPU that fell off the bus or a container that lost its device nodes.
    return problem(
      ProblemCodes.nvidiaSmiFailed,
      SOURCE,
      `nvidia-smi ${what} failed (exit ${result.exitCode ?? "none"}): ${output}: no GPU can be read; check the kernel log for Xid 79 (fallen off the bus) and the device nodes, then reboot`,
    );
  }
  if (result.exitCode === 9) {
    return problem(
      ProblemCodes.nvidiaSmiDriverNotLoaded,
      SOURCE,
      `nvidia-smi ${what}: cannot communicate with the NVIDIA driver (exit 9): ${output}`,
    );
  }
  return problem(
    ProblemCodes.nvidiaSmiFailed,
    SOURCE,
    `nvidia-smi ${what} failed (exit ${result.exitCode ?? "none"}): ${output || "no output"}`,
  );
}

function gpuArgs(fields: readonly string[], index?: number): string[] {
  return [
    ...(index === undefined ? [] : ["-i", String(index)]),
    `--query-gpu=${fields.join(",")}`,
    "--format=csv,noheader,nounits",
  ];
}

interface RawGpus {
  rows: GpuQueryRow[];
  lost: { index: number; pciBusId: string; reason: string }[];
  problems: Problem[];
}

/** Each field can be rejected at most twice (its name, then its fallback), plus the last try. */
const MAX_GPU_QUERY_ATTEMPTS =
  GPU_QUERY_FIELDS.length + GPU_QUERY_FIELDS.filter((f) => f.fallback !== undefined).length + 1;

/**
 * Runs the GPU query: on exit 2 for an optional field, tries its fallback name in its place
 * (no problem: nothing is lost) or drops it (a problem: that reading is unreported) and
 * retries; on a lost GPU, falls back to per-GPU `-i N` queries. Never throws.
 */
async function queryGpuRows(ctx: GpuQueryContext): Promise<RawGpus> {
  const problems: Problem[] = [];
  let fields = GPU_QUERY_FIELDS.map((f) => f.field);
  for (let attempt = 0; attempt < MAX_GPU_QUERY_ATTEMPTS; attempt++) {
    const result = await ctx.runner.run(ctx.nvidiaSmiPath, gpuArgs(fields), {
      timeoutMs: ctx.timeoutMs,
    });
    if (!result.notFound && !result.timedOut && result.exitCode !== 0) {
      const output = `${result.stdout}\n${result.stderr}`;
      const unknown = parseUnknownField(output);
      if (unknown !== undefined) {
        const known = gpuQueryField(unknown);
        if (known?.optional && fields.includes(unknown)) {
          if (known.fallback !== undefined && unknown === known.field) {
            const fallback = known.fallback;
            fields = fields.map((f) => (f === unknown ? fallback : f));
            continue;
          }
          fields = fields.filter((f) => f !== unknown);
          problems.push(
            problem(
              ProblemCodes.nvidiaSmiFieldUnsupported,
              SOURCE,
              known.field === unknown
                ? `this nvidia-smi does not know "${unknown}"; queried without it (value unreported)`
                : `this nvidia-smi knows neither "${known.field}" nor "${unknown}"; queried without them (value unreported)`,
            ),
          );
          continue;
        }
        problems.push(
          problem(
            ProblemCodes.nvidiaSmiFieldUnsupported,
            SOURCE,
            `this nvidia-smi does not know the required field "${unknown}"; no GPUs reported`,
          ),
        );
        return { rows: [], lost: [], problems };
      }
      if (parseLostGpu(output) !== undefined) {
        const fallback = await queryEachGpu(ctx, fields);
        return { ...fallback, problems: [...problems, ...fallback.problems] };
      }
    }
    const failure = classifyNvidiaSmiFailure(
      ctx.nvidiaSmiPath,
      "--query-gpu",
      result,
      ctx.timeoutMs,
    );
    if (failure) return { rows: [], lost: [], problems: [...problems, failure] };
    const parsed = parseGpuQuery(result.stdout, fields);
    return { rows: parsed.value, lost: [], problems: [...problems, ...parsed.problems] };
  }
  return { rows: [], lost: [], problems };
}

/**
 * The fallback when one lost GPU makes every all-GPU query fail: `-i 0`, `-i 1`, … each with
 * the same fields. A query answering with the lost-GPU message marks that index lost; the probe
 * stops at the first other failure (an index past the last GPU), at a lost bus id seen before
 * (the message is about enumeration, not this index), or at {@link MAX_PROBED_GPUS}.
 * `-L` is no alternative: it fails as a whole too.
 */
async function queryEachGpu(ctx: GpuQueryContext, fields: readonly string[]): Promise<RawGpus> {
  const rows: GpuQueryRow[] = [];
  const lost: RawGpus["lost"] = [];
  const problems: Problem[] = [];
  for (let index = 0; index < MAX_PROBED_GPUS; index++) {
    const result = await ctx.runner.run(ctx.nvidiaSmiPath, gpuArgs(fields, index), {
      timeoutMs: ctx.timeoutMs,
    });
    if (result.exitCode === 0 && !result.timedOut) {
      const parsed = parseGpuQuery(result.stdout, fields);
      rows.push(...parsed.value);
      problems.push(...parsed.problems);
      if (parsed.value.length === 0) break;
      continue;
    }
    const message = parseLostGpu(`${result.stdout}\n${result.stderr}`);
    if (message && !lost.some((l) => l.pciBusId === message.pciBusId) && !result.timedOut) {
      lost.push({ index, ...message });
      continue;
    }
    if (result.timedOut) {
      const failure = classifyNvidiaSmiFailure(
        ctx.nvidiaSmiPath,
        `-i ${index}`,
        result,
        ctx.timeoutMs,
      );
      if (failure) problems.push(failure);
    }
    break;
  }
  return { rows, lost, problems };
}

/**
 * Runs the compute-apps query. When one lost GPU makes the all-GPU query fail (as it does the
 * GPU query), asks each readable GPU with `-i N` instead, so the healthy GPUs' unmanaged
 * memory stays known.
 */
async function queryComputeApps(
  ctx: GpuQueryContext,
  indices: readonly number[],
): Promise<{ apps: ComputeApp[] | undefined; problems: Problem[] }> {
  const result = await ctx.runner.run(ctx.nvidiaSmiPath, COMPUTE_APPS_ARGS, {
    timeoutMs: ctx.timeoutMs,
  });
  if (result.exitCode !== 0 && parseLostGpu(`${result.stdout}\n${result.stderr}`) !== undefined) {
    const apps: ComputeApp[] = [];
    const problems: Problem[] = [];
    for (const index of indices) {
      const args = ["-i", String(index), ...COMPUTE_APPS_ARGS];
      const one = computeAppsResult(
        ctx,
        await ctx.runner.run(ctx.nvidiaSmiPath, args, { timeoutMs: ctx.timeoutMs }),
      );
      if (one.apps === undefined) return one;
      apps.push(...one.apps);
      problems.push(...one.problems);
    }
    return { apps, problems };
  }
  return computeAppsResult(ctx, result);
}

function computeAppsResult(
  ctx: GpuQueryContext,
  result: CommandResult,
): { apps: ComputeApp[] | undefined; problems: Problem[] } {
  const failure = classifyNvidiaSmiFailure(
    ctx.nvidiaSmiPath,
    "--query-compute-apps",
    result,
    ctx.timeoutMs,
  );
  if (failure) {
    return {
      apps: undefined,
      problems: [
        problem(
          ProblemCodes.computeAppsFailed,
          SOURCE,
          `unmanaged GPU memory unknown: ${failure.message}`,
        ),
      ],
    };
  }
  const parsed = parseComputeApps(result.stdout);
  return { apps: parsed.value, problems: [...parsed.problems] };
}

/**
 * Runs `nvidia-smi nvlink -s` once for all GPUs. No readings and no problem when the tool says
 * NVLink is not supported (MIG) or a GPU is lost (the GPU query reports that); any other
 * failure is a node problem and leaves the NVLink readings unreported, never "all active".
 */
async function queryNvlinks(
  ctx: GpuQueryContext,
): Promise<{ links: readonly NvlinkGpuStatus[]; problems: Problem[] }> {
  const result = await ctx.runner.run(ctx.nvidiaSmiPath, NVLINK_STATUS_ARGS, {
    timeoutMs: ctx.timeoutMs,
  });
  const output = `${result.stdout}\n${result.stderr}`;
  if (result.exitCode === 0 && !result.timedOut) {
    return { links: parseNvlinkStatus(result.stdout).gpus, problems: [] };
  }
  if (!result.timedOut && !result.notFound) {
    if (parseNvlinkStatus(output).migUnsupported || /not supported/i.test(output)) {
      return { links: [], problems: [] };
    }
    if (parseLostGpu(output) !== undefined) return { links: [], problems: [] };
  }
  const failure = classifyNvidiaSmiFailure(
    ctx.nvidiaSmiPath,
    NVLINK_STATUS_ARGS.join(" "),
    result,
    ctx.timeoutMs,
  );
  return { links: [], problems: failure ? [failure] : [] };
}

/** The NVLink block of a row's GPU: by uuid when the header has one, else by index. */
function nvlinkFor(
  row: GpuQueryRow,
  links: readonly NvlinkGpuStatus[] | undefined,
): NvlinkGpuStatus | undefined {
  return links?.find((l) => (l.uuid === undefined ? l.index === row.index : l.uuid === row.uuid));
}

/** The health problems the readings imply; each says what is wrong and what to do. */
function healthReadingProblems(
  at: string,
  health: GpuHealthReadings,
  utilizationPercent: number | undefined,
): Problem[] {
  const problems: Problem[] = [];
  if (health.remappedRowsPending === true) {
    problems.push(
      problem(
        ProblemCodes.gpuRowRemapPending,
        SOURCE,
        `${at} has a row remap pending: drain it and reset the GPU so the remap takes effect`,
      ),
    );
  }
  if (health.remappedRowsFailure === true) {
    problems.push(
      problem(
        ProblemCodes.gpuRowRemapFailure,
        SOURCE,
        `${at} failed to remap a row (memory it cannot repair): drain it and have the GPU serviced`,
      ),
    );
  }
  if (health.retiredPagesPending === true) {
    problems.push(
      problem(
        ProblemCodes.gpuRetiredPagesPending,
        SOURCE,
        `${at} has retired pages pending: drain it and reset the GPU (or reload the driver) to retire them`,
      ),
    );
  }
  if (health.recoveryAction !== undefined && health.recoveryAction !== "None") {
    problems.push(
      problem(
        ProblemCodes.gpuRecoveryAction,
        SOURCE,
        `${at} reports GPU recovery action "${health.recoveryAction}": drain it and carry out that action before it serves again`,
      ),
    );
  }
  // Every link inactive is what a PCIe card without an NVLink bridge reports (A100 PCIe: all 12
  // links "down", NVIDIA/NVSentinel#1481, NVIDIA/DCGM#49), so only some inactive among active
  // ones is a fault here; links that all go down after being up are caught by the agent, which
  // remembers what it saw (apps/agent/src/gpu-readings.ts).
  if (
    health.nvlinksInactive !== undefined &&
    health.nvlinksInactive > 0 &&
    health.nvlinksTotal !== undefined &&
    health.nvlinksInactive < health.nvlinksTotal
  ) {
    problems.push(
      problem(
        ProblemCodes.gpuNvlinkInactive,
        SOURCE,
        `${at} has ${health.nvlinksInactive} of ${health.nvlinksTotal ?? "?"} NVLinks inactive: check the fabric manager and the NVLink/NVSwitch state (nvidia-smi nvlink -s), then reset the GPU`,
      ),
    );
  }
  const { pcieLinkGenCurrent: gen, pcieLinkGenMax: genMax } = health;
  const { pcieLinkWidthCurrent: width, pcieLinkWidthMax: widthMax } = health;
  const genLow = gen !== undefined && genMax !== undefined && gen < genMax;
  const widthLow = width !== undefined && widthMax !== undefined && width < widthMax;
  if (
    (genLow || widthLow) &&
    utilizationPercent !== undefined &&
    utilizationPercent >= PCIE_DEGRADED_MIN_UTILIZATION_PERCENT
  ) {
    problems.push(
      problem(
        ProblemCodes.gpuPcieDegraded,
        SOURCE,
        `${at} PCIe link runs at gen ${gen ?? "?"} x${width ?? "?"} below its max gen ${genMax ?? "?"} x${widthMax ?? "?"} while ${utilizationPercent}% busy: check the slot, riser and cabling (reseat the GPU)`,
      ),
    );
  }
  return problems;
}

/**
 * Builds one {@link Gpu} from a query row, the processes on it and its NVLink status; health
 * flags: uncorrected ECC > 0, memory held by pids outside `managedPids`, MIG enabled, a row
 * remap pending or failed, retired pages pending, a recovery action other than `None`, an
 * inactive NVLink, and a PCIe link below its maximum while the GPU is at least
 * {@link PCIE_DEGRADED_MIN_UTILIZATION_PERCENT}% busy. Clock-event reasons (thermal or power
 * slowdown) are a reading, never a problem.
 *
 * @param nvlinks - `nvidia-smi nvlink -s` per GPU; omitted or without this GPU: NVLink unreported.
 */
export function buildGpu(
  row: GpuQueryRow,
  apps: readonly ComputeApp[] | undefined,
  managedPids: ReadonlySet<number>,
  nvlinks?: readonly NvlinkGpuStatus[],
): Gpu {
  const healthProblems: Problem[] = [];
  const at = `GPU ${row.index} (${row.uuid})`;
  const nvlink = nvlinkFor(row, nvlinks);
  const readings: GpuHealthReadings = {
    ...row.health,
    ...(nvlink === undefined
      ? {}
      : { nvlinksTotal: nvlink.linksTotal, nvlinksInactive: nvlink.linksInactive }),
  };
  const health = Object.keys(readings).length === 0 ? undefined : readings;
  if (row.eccUncorrectedErrors !== undefined && row.eccUncorrectedErrors > 0) {
    healthProblems.push(
      problem(
        ProblemCodes.gpuEccUncorrected,
        SOURCE,
        `${at} has ${row.eccUncorrectedErrors} uncorrected volatile ECC errors`,
      ),
    );
  }
  const migEnabled = row.migMode === "Enabled";
  if (migEnabled) {
    healthProblems.push(
      problem(
        ProblemCodes.gpuMigEnabled,
        SOURCE,
        `${at} has MIG enabled and cannot be scheduled as a whole GPU`,
      ),
    );
  }
  if (health !== undefined) {
    healthProblems.push(...healthReadingProblems(at, health, row.utilizationPercent));
  }
  let unmanagedMemoryBytes: number | undefined;
  if (apps !== undefined) {
    const foreign = apps.filter((a) => a.gpuUuid === row.uuid && !managedPids.has(a.pid));
    if (foreign.length > 0) {
      const known = foreign.filter((a) => a.usedMemoryMiB !== undefined);
      unmanagedMemoryBytes =
        known.length > 0
          ? known.reduce((sum, a) => sum + (a.usedMemoryMiB ?? 0) * MIB, 0)
          : undefined;
      const who = foreign
        .map(
          (a) =>
            `${a.processName} (pid ${a.pid}, ${a.usedMemoryMiB === undefined ? "unreported" : `${a.usedMemoryMiB} MiB`})`,
        )
        .join(", ");
      healthProblems.push(
        problem(
          ProblemCodes.gpuUnmanagedMemory,
          SOURCE,
          `${at} has memory held by processes llmgw does not manage: ${who}`,
        ),
      );
    } else {
      unmanagedMemoryBytes = 0;
    }
  }
  const gpuClass = deriveGpuClass(row.name, row.memoryTotalMiB);
  return {
    index: row.index,
    uuid: row.uuid,
    name: row.name,
    ...(gpuClass === undefined ? {} : { gpuClass }),
    pciBusId: row.pciBusId,
    ...(row.memoryTotalMiB === undefined ? {} : { memoryTotalBytes: row.memoryTotalMiB * MIB }),
    ...(row.computeCapability === undefined ? {} : { computeCapability: row.computeCapability }),
    migEnabled,
    ...(row.memoryUsedMiB === undefined ? {} : { memoryUsedBytes: row.memoryUsedMiB * MIB }),
    ...(row.utilizationPercent === undefined ? {} : { utilizationPercent: row.utilizationPercent }),
    ...(row.eccUncorrectedErrors === undefined
      ? {}
      : { eccUncorrectedErrors: row.eccUncorrectedErrors }),
    ...(row.temperatureCelsius === undefined ? {} : { temperatureCelsius: row.temperatureCelsius }),
    ...(row.powerWatts === undefined ? {} : { powerWatts: row.powerWatts }),
    healthy: healthProblems.length === 0,
    healthProblems,
    ...(unmanagedMemoryBytes === undefined ? {} : { unmanagedMemoryBytes }),
    lost: false,
    ...(health === undefined ? {} : { health }),
  };
}

/**
 * Queries every GPU with nvidia-smi (GPU query, then compute apps and `nvlink -s` side by
 * side) and derives classes and health. Both discovery and every heartbeat readings refresh
 * run all three: `nvlink -s` is one more short process per refresh (every 10 s by default),
 * bounded by the same `timeoutMs` and run in parallel with compute apps, so a refresh takes no
 * longer for it and an NVLink that goes down shows on the next heartbeat. Lost GPUs are
 * included (`lost: true`, unhealthy, uuid/name empty: nvidia-smi cannot read them). Never
 * throws: every failure is a problem in the result.
 */
export async function queryNvidiaGpus(ctx: GpuQueryContext): Promise<GpuReadings> {
  const raw = await queryGpuRows(ctx);
  const problems: Problem[] = [...raw.problems];
  let apps: ComputeApp[] | undefined;
  let nvlinks: readonly NvlinkGpuStatus[] | undefined;
  if (raw.rows.length > 0) {
    const indices = raw.rows.map((row) => row.index);
    const [queried, links] = await Promise.all([queryComputeApps(ctx, indices), queryNvlinks(ctx)]);
    apps = queried.apps;
    nvlinks = links.links;
    problems.push(...queried.problems, ...links.problems);
  }
  const gpus: Gpu[] = raw.rows.map((row) => buildGpu(row, apps, ctx.managedPids, nvlinks));
  for (const lost of raw.lost) {
    const message = `GPU ${lost.index} at ${lost.pciBusId} cannot be queried (lost): ${lost.reason || "no reason given"}`;
    gpus.push({
      index: lost.index,
      uuid: "",
      name: "",
      pciBusId: lost.pciBusId,
      migEnabled: false,
      healthy: false,
      healthProblems: [problem(ProblemCodes.gpuLost, SOURCE, message)],
      lost: true,
    });
    problems.push(problem(ProblemCodes.gpuLost, SOURCE, message));
  }
  gpus.sort((a, b) => a.index - b.index);
  return { gpus, problems };
}
