import type { CommandResult, CommandRunner } from "./command-runner.js";
import { deriveGpuClass } from "./gpu-class.js";
import {
  COMPUTE_APPS_ARGS,
  type ComputeApp,
  GPU_QUERY_FIELDS,
  type GpuQueryRow,
  parseComputeApps,
  parseGpuQuery,
  parseLostGpu,
  parseUnknownField,
} from "./nvidia-smi-parse.js";
import { ProblemCodes, problem } from "./problem-codes.js";
import type { Gpu, Problem } from "./types.js";

const MIB = 1024 * 1024;
const SOURCE = "nvidia-smi";
/** Upper bound of the per-GPU fallback probe (`-i 0`, `-i 1`, …). */
const MAX_PROBED_GPUS = 64;

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

/**
 * Runs the GPU query: on exit 2 for an optional field, drops it and retries; on a lost GPU,
 * falls back to per-GPU `-i N` queries. Never throws.
 */
async function queryGpuRows(ctx: GpuQueryContext): Promise<RawGpus> {
  const problems: Problem[] = [];
  let fields = GPU_QUERY_FIELDS.map((f) => f.field);
  for (let attempt = 0; attempt <= GPU_QUERY_FIELDS.length; attempt++) {
    const result = await ctx.runner.run(ctx.nvidiaSmiPath, gpuArgs(fields), {
      timeoutMs: ctx.timeoutMs,
    });
    if (!result.notFound && !result.timedOut && result.exitCode !== 0) {
      const output = `${result.stdout}\n${result.stderr}`;
      const unknown = parseUnknownField(output);
      if (unknown !== undefined) {
        const known = GPU_QUERY_FIELDS.find((f) => f.field === unknown);
        if (known?.optional && fields.includes(unknown)) {
          fields = fields.filter((f) => f !== unknown);
          problems.push(
            problem(
              ProblemCodes.nvidiaSmiFieldUnsupported,
              SOURCE,
              `this nvidia-smi does not know "${unknown}"; queried without it (value unreported)`,
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

async function queryComputeApps(
  ctx: GpuQueryContext,
): Promise<{ apps: ComputeApp[] | undefined; problems: Problem[] }> {
  const result = await ctx.runner.run(ctx.nvidiaSmiPath, COMPUTE_APPS_ARGS, {
    timeoutMs: ctx.timeoutMs,
  });
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
 * Builds one {@link Gpu} from a query row and the processes on it; health flags: uncorrected
 * ECC > 0, memory held by pids outside `managedPids`, MIG enabled.
 */
export function buildGpu(
  row: GpuQueryRow,
  apps: readonly ComputeApp[] | undefined,
  managedPids: ReadonlySet<number>,
): Gpu {
  const healthProblems: Problem[] = [];
  const at = `GPU ${row.index} (${row.uuid})`;
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
  };
}

/**
 * Queries every GPU with nvidia-smi (GPU query + compute apps) and derives classes and health.
 * Lost GPUs are included (`lost: true`, unhealthy, uuid/name empty: nvidia-smi cannot read
 * them). Never throws: every failure is a problem in the result.
 */
export async function queryNvidiaGpus(ctx: GpuQueryContext): Promise<GpuReadings> {
  const raw = await queryGpuRows(ctx);
  const problems: Problem[] = [...raw.problems];
  let apps: ComputeApp[] | undefined;
  if (raw.rows.length > 0) {
    const queried = await queryComputeApps(ctx);
    apps = queried.apps;
    problems.push(...queried.problems);
  }
  const gpus: Gpu[] = raw.rows.map((row) => buildGpu(row, apps, ctx.managedPids));
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
