import {
  type AmdGpuFacts,
  type AmdSmiEntry,
  mergeAmdSmiDocuments,
  parseAmdDriverVersion,
  parseAmdSmiDocument,
  parseRocmSmiJson,
} from "./amd-smi-parse.js";
import type { CommandResult, CommandRunner } from "./command-runner.js";
import { deriveGpuClass } from "./gpu-class.js";
import type { GpuReadings } from "./nvidia-smi.js";
import { ProblemCodes, problem } from "./problem-codes.js";
import type { Gpu, GpuHealthReadings, Problem } from "./types.js";

const MIB = 1024 * 1024;

/** What the AMD part of discovery needs; a slice of the resolved discovery options. */
export interface AmdGpuQueryContext {
  readonly runner: CommandRunner;
  readonly amdSmiPath: string;
  readonly rocmSmiPath: string;
  readonly timeoutMs: number;
}

/** AMD GPUs with readings and health, plus node-level problems and which tool answered. */
export interface AmdGpuReadings extends GpuReadings {
  /** The tool the GPUs came from; undefined when neither amd-smi nor rocm-smi is installed. */
  readonly tool?: "amd-smi" | "rocm-smi";
  /** amdgpu driver version from `amd-smi static` (`driver.version`), when reported. */
  readonly driverVersion?: string;
}

/** The three amd-smi runs of one reading, each `--json` (§4.3). */
export const AMD_SMI_COMMANDS = {
  list: ["list", "--json"],
  static: ["static", "--json"],
  metric: ["metric", "--json"],
} as const satisfies Record<string, readonly string[]>;

/** The rocm-smi fallback run: every reading in one JSON document (§4.4). */
export const ROCM_SMI_ARGS = ["--showallinfo", "--json"] as const;

type Outcome =
  | { readonly kind: "absent" }
  | { readonly kind: "failed"; readonly problem: Problem }
  | { readonly kind: "ok"; readonly result: CommandResult };

function firstLine(text: string): string {
  return (
    text
      .split(/\r?\n/)
      .find((l) => l.trim() !== "")
      ?.trim()
      .slice(0, 200) ?? ""
  );
}

function classify(
  tool: "amd-smi" | "rocm-smi",
  what: string,
  result: CommandResult,
  timeoutMs: number,
): Outcome {
  if (result.notFound) return { kind: "absent" };
  const code = tool === "amd-smi" ? ProblemCodes.amdSmiFailed : ProblemCodes.rocmSmiFailed;
  if (result.timedOut) {
    return {
      kind: "failed",
      problem: problem(
        code,
        tool,
        `${tool} ${what} did not finish within ${timeoutMs} ms and was killed (hung driver?)`,
      ),
    };
  }
  return { kind: "ok", result };
}

/** A failed parse, told with the exit status and the first line of stderr. */
function explain(problems: readonly Problem[], result: CommandResult): Problem[] {
  const detail = `exit ${result.exitCode ?? "none"}${result.stderr.trim() ? `: ${firstLine(result.stderr)}` : ""}`;
  return problems.map((p) => ({ ...p, message: `${p.message} (${detail})` }));
}

/**
 * The order ROCr and HIP number devices in: KFD topology node order (amd-smi `list`
 * `node_id`). amd-smi's own `gpu` index is its discovery order, which can differ from it, so
 * `node_id` decides when every entry has one; otherwise the tool's index is the best guess.
 */
export function orderAmdGpus(facts: readonly AmdGpuFacts[]): AmdGpuFacts[] {
  const byNode = facts.every((f) => f.kfdNodeId !== undefined);
  return [...facts].sort((a, b) =>
    byNode
      ? (a.kfdNodeId ?? 0) - (b.kfdNodeId ?? 0) || a.toolIndex - b.toolIndex
      : a.toolIndex - b.toolIndex,
  );
}

/**
 * One {@link Gpu} (`vendor: "amd"`) from merged facts. `index` is given by the caller (the
 * device's ROCr/HIP ordinal plus any offset, see `discoverNode`). `uuid` is the amd-smi
 * `uuid` when it is unique on the node, else `AMD-<BDF>` (rocm-smi, partitions sharing a
 * uuid, or none reported). Uncorrectable RAS errors > 0 make the GPU unhealthy.
 */
export function buildAmdGpu(
  facts: AmdGpuFacts,
  index: number,
  uuid: string,
  source: "amd-smi" | "rocm-smi",
): Gpu {
  const healthProblems: Problem[] = [];
  if (facts.eccUncorrectable !== undefined && facts.eccUncorrectable > 0) {
    healthProblems.push(
      problem(
        ProblemCodes.gpuRasUncorrected,
        source,
        `GPU ${index} (${facts.pciBusId}) has ${facts.eccUncorrectable} uncorrectable ECC errors (RAS)`,
      ),
    );
  }
  const health: GpuHealthReadings = {
    ...(facts.eccDeferred === undefined ? {} : { eccDeferredErrors: facts.eccDeferred }),
    ...(facts.pcieLinkGenCurrent === undefined
      ? {}
      : { pcieLinkGenCurrent: facts.pcieLinkGenCurrent }),
    ...(facts.pcieLinkGenMax === undefined ? {} : { pcieLinkGenMax: facts.pcieLinkGenMax }),
    ...(facts.pcieLinkWidthCurrent === undefined
      ? {}
      : { pcieLinkWidthCurrent: facts.pcieLinkWidthCurrent }),
    ...(facts.pcieLinkWidthMax === undefined ? {} : { pcieLinkWidthMax: facts.pcieLinkWidthMax }),
  };
  const name = facts.name ?? "";
  const gpuClass = name === "" ? undefined : deriveGpuClass(name, facts.memoryTotalMiB);
  const bytes = (mib: number) => Math.round(mib * MIB);
  return {
    index,
    uuid,
    name,
    ...(gpuClass === undefined ? {} : { gpuClass }),
    pciBusId: facts.pciBusId,
    ...(facts.memoryTotalMiB === undefined
      ? {}
      : { memoryTotalBytes: bytes(facts.memoryTotalMiB) }),
    migEnabled: false,
    ...(facts.memoryUsedMiB === undefined ? {} : { memoryUsedBytes: bytes(facts.memoryUsedMiB) }),
    ...(facts.utilizationPercent === undefined
      ? {}
      : { utilizationPercent: facts.utilizationPercent }),
    ...(facts.eccUncorrectable === undefined
      ? {}
      : { eccUncorrectedErrors: facts.eccUncorrectable }),
    ...(facts.temperatureCelsius === undefined
      ? {}
      : { temperatureCelsius: facts.temperatureCelsius }),
    ...(facts.powerWatts === undefined ? {} : { powerWatts: facts.powerWatts }),
    healthy: healthProblems.length === 0,
    healthProblems,
    lost: false,
    vendor: "amd",
    ...(Object.keys(health).length === 0 ? {} : { health }),
  };
}

/**
 * {@link Gpu}s from facts in ROCr order: `index` = `indexOffset` + ordinal (0, 1, …), so on an
 * AMD-only node the index is the HIP/ROCr device ordinal engines are given.
 */
export function buildAmdGpus(
  facts: readonly AmdGpuFacts[],
  source: "amd-smi" | "rocm-smi",
  indexOffset = 0,
): Gpu[] {
  const ordered = orderAmdGpus(facts);
  const uuidCounts = new Map<string, number>();
  for (const f of ordered) {
    if (f.uuid !== undefined) uuidCounts.set(f.uuid, (uuidCounts.get(f.uuid) ?? 0) + 1);
  }
  return ordered.map((f, ordinal) => {
    const uuid =
      f.uuid !== undefined && uuidCounts.get(f.uuid) === 1 ? f.uuid : `AMD-${f.pciBusId}`;
    return buildAmdGpu(f, indexOffset + ordinal, uuid, source);
  });
}

async function queryAmdSmi(
  ctx: AmdGpuQueryContext,
): Promise<
  | { kind: "absent" }
  | { kind: "failed"; problems: Problem[] }
  | { kind: "ok"; facts: AmdGpuFacts[]; problems: Problem[]; driverVersion?: string }
> {
  const names = Object.keys(AMD_SMI_COMMANDS) as (keyof typeof AMD_SMI_COMMANDS)[];
  // The three runs are independent; amd-smi is a Python program that takes about a second to
  // start, so running them side by side keeps a heartbeat reading near one run's time.
  const results = await Promise.all(
    names.map((name) =>
      ctx.runner.run(ctx.amdSmiPath, AMD_SMI_COMMANDS[name], { timeoutMs: ctx.timeoutMs }),
    ),
  );
  const problems: Problem[] = [];
  const docs: Partial<Record<(typeof names)[number], AmdSmiEntry[]>> = {};
  let absent = 0;
  for (const [i, name] of names.entries()) {
    const result = results[i] as CommandResult;
    const what = AMD_SMI_COMMANDS[name].join(" ");
    const outcome = classify("amd-smi", what, result, ctx.timeoutMs);
    if (outcome.kind === "absent") {
      absent++;
      continue;
    }
    if (outcome.kind === "failed") {
      problems.push(outcome.problem);
      continue;
    }
    // A document that parses counts even after a non-zero exit: amd-smi prints warnings and
    // exits non-zero on some readings it could not take (§4.5).
    const parsed = parseAmdSmiDocument(result.stdout, what);
    if (parsed.value === undefined) problems.push(...explain(parsed.problems, result));
    else {
      docs[name] = parsed.value;
      problems.push(...parsed.problems);
    }
  }
  if (absent === names.length) return { kind: "absent" };
  if (docs.list === undefined && docs.static === undefined && docs.metric === undefined) {
    return { kind: "failed", problems };
  }
  const merged = mergeAmdSmiDocuments(docs);
  const driverVersion = docs.static === undefined ? undefined : parseAmdDriverVersion(docs.static);
  return {
    kind: "ok",
    facts: merged.value,
    problems: [...problems, ...merged.problems],
    ...(driverVersion === undefined ? {} : { driverVersion }),
  };
}

/**
 * Queries AMD GPUs: `amd-smi list|static|metric --json`, and `rocm-smi --showallinfo --json`
 * when amd-smi is not installed or none of its documents could be read. Neither tool
 * installed is no problem (a node without AMD GPUs); a tool that fails is
 * {@link ProblemCodes.amdSmiFailed} / {@link ProblemCodes.rocmSmiFailed}. Never throws.
 *
 * @param indexOffset - added to every GPU's ordinal (NVIDIA GPUs on the same node come first).
 */
export async function queryAmdGpus(
  ctx: AmdGpuQueryContext,
  indexOffset = 0,
): Promise<AmdGpuReadings> {
  const amd = await queryAmdSmi(ctx);
  if (amd.kind === "ok") {
    return {
      gpus: buildAmdGpus(amd.facts, "amd-smi", indexOffset),
      problems: amd.problems,
      tool: "amd-smi",
      ...(amd.driverVersion === undefined ? {} : { driverVersion: amd.driverVersion }),
    };
  }
  const problems: Problem[] = amd.kind === "failed" ? [...amd.problems] : [];
  const what = ROCM_SMI_ARGS.join(" ");
  const result = await ctx.runner.run(ctx.rocmSmiPath, ROCM_SMI_ARGS, { timeoutMs: ctx.timeoutMs });
  const outcome = classify("rocm-smi", what, result, ctx.timeoutMs);
  if (outcome.kind === "absent") return { gpus: [], problems };
  if (outcome.kind === "failed") return { gpus: [], problems: [...problems, outcome.problem] };
  const parsed = parseRocmSmiJson(result.stdout);
  if (parsed.value === undefined) {
    return { gpus: [], problems: [...problems, ...explain(parsed.problems, result)] };
  }
  return {
    gpus: buildAmdGpus(parsed.value, "rocm-smi", indexOffset),
    problems: [...problems, ...parsed.problems],
    tool: "rocm-smi",
  };
}
