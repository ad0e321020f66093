import { closeSync, fsyncSync, openSync, readFileSync, renameSync, writeSync } from "node:fs";
import { type Gpu, type Problem, ProblemCodes, pciBusKey } from "@llmgw/discovery";

/**
 * Node problems that explain why a GPU is missing from a read: the tool could not run, hung,
 * could not talk to the driver, or printed a row that could not be parsed.
 */
const READ_FAILURE_CODES: ReadonlySet<string> = new Set([
  ProblemCodes.nvidiaSmiNotFound,
  ProblemCodes.nvidiaSmiTimeout,
  ProblemCodes.nvidiaSmiDriverMismatch,
  ProblemCodes.nvidiaSmiDriverNotLoaded,
  ProblemCodes.nvidiaSmiFailed,
  ProblemCodes.nvidiaSmiFieldUnsupported,
  ProblemCodes.gpuRowInvalid,
  ProblemCodes.amdSmiFailed,
  ProblemCodes.rocmSmiFailed,
]);

/** The tools that read a vendor's GPUs (the `source` of their problems). */
const READ_SOURCES: Readonly<Record<NonNullable<Gpu["vendor"]>, readonly string[]>> = {
  nvidia: ["nvidia-smi"],
  amd: ["amd-smi", "rocm-smi"],
};

/** What the agent remembers of one GPU: its latest raw reading and when it was taken. */
interface Remembered {
  gpu: Gpu;
  atUnixMs: number;
}

/** A latched PCIe-degraded problem and when it was first seen. */
interface Latched {
  problem: Problem;
  atUnixMs: number;
}

/** One read of the node's GPUs, as discovery returned it. */
export interface GpuRead {
  readonly gpus: readonly Gpu[];
  readonly problems: readonly Problem[];
}

/**
 * The agent's memory of its GPUs across reads, so a bad read never reads as good news. Two
 * rules, both fail-closed:
 *
 * - **A GPU the agent has seen but the latest read lacks** (matched by uuid, else PCI bus id)
 *   is reported from its last reading with `healthy: false` and a health problem carrying the
 *   read's own failure (`LLMGW_DISCOVERY_NVIDIA_SMI_TIMEOUT`, `…_FAILED` for `Failed to
 *   initialize NVML: Unknown Error`, …; `LLMGW_DISCOVERY_GPU_LOST` when the tool said nothing).
 *   The control plane updates only the GPUs a heartbeat names, so without this a hung
 *   nvidia-smi would leave every GPU on its last healthy reading, exactly when one fell off
 *   the bus — and a kernel-log Xid 79 would have no GPU to attach to.
 * - **`LLMGW_DISCOVERY_GPU_PCIE_DEGRADED` is latched per uuid** for the life of the process:
 *   discovery reports it only under load, so without the latch a drained GPU idles, reads
 *   healthy, gets a replica, degrades again, and so on.
 *
 * Pure apart from its memory: time comes in with each read. Never throws.
 */
export interface GpuReadingMemory {
  /**
   * Folds one read in (at `atUnixMs`) and returns the GPUs to report: the read's GPUs with
   * latched problems re-applied, then each remembered GPU the read lacks, in index order.
   */
  observe(read: GpuRead, atUnixMs: number): Gpu[];
  /** What must survive an agent restart (the latches), as plain data. */
  snapshot(): GpuMemorySnapshot;
}

/**
 * The latches of a {@link GpuReadingMemory}: a GPU's PCIe-degraded verdict and the NVLinks it
 * once had active. Without them an agent restart would forget both and report the GPU healthy
 * — a fault cleared by restarting the agent.
 */
export interface GpuMemorySnapshot {
  readonly pcie: readonly { uuid: string; problem: Problem; atUnixMs: number }[];
  readonly nvlinks: readonly { uuid: string; active: number; atUnixMs: number }[];
}

/** Creates an empty {@link GpuReadingMemory}. */
export function createGpuReadingMemory(saved?: GpuMemorySnapshot): GpuReadingMemory {
  // Raw readings (no unread or latched problems added), so nothing accumulates across reads.
  const known: Remembered[] = [];
  const pcieLatched = new Map<string, Latched>(
    (saved?.pcie ?? []).map((p) => [p.uuid, { problem: p.problem, atUnixMs: p.atUnixMs }]),
  );
  /** NVLinks seen active per uuid, and when: all of them going inactive later is a fault. */
  const nvlinksSeenActive = new Map<string, { active: number; atUnixMs: number }>(
    (saved?.nvlinks ?? []).map((n) => [n.uuid, { active: n.active, atUnixMs: n.atUnixMs }]),
  );

  const remember = (gpu: Gpu, atUnixMs: number) => {
    const i = known.findIndex((k) => sameGpu(k.gpu, gpu));
    // A lost row (nvidia-smi could not read its uuid or name) keeps the richer reading before it.
    if (i >= 0 && gpu.lost && !known[i]!.gpu.lost) return;
    if (i >= 0) known[i] = { gpu, atUnixMs };
    else known.push({ gpu, atUnixMs });
  };

  return {
    observe(read, atUnixMs) {
      for (const gpu of read.gpus) {
        const pcie = gpu.healthProblems.find((p) => p.code === ProblemCodes.gpuPcieDegraded);
        if (pcie !== undefined && gpu.uuid !== "" && !pcieLatched.has(gpu.uuid)) {
          pcieLatched.set(gpu.uuid, { problem: pcie, atUnixMs });
        }
      }
      for (const gpu of read.gpus) {
        const { nvlinksTotal: total, nvlinksInactive: inactive } = gpu.health ?? {};
        if (total === undefined || inactive === undefined || gpu.uuid === "") continue;
        if (total - inactive > (nvlinksSeenActive.get(gpu.uuid)?.active ?? 0)) {
          nvlinksSeenActive.set(gpu.uuid, { active: total - inactive, atUnixMs });
        }
      }
      const unread = known.filter((k) => !read.gpus.some((g) => sameGpu(k.gpu, g)));
      for (const gpu of read.gpus) remember(gpu, atUnixMs);
      const out = [...read.gpus, ...unread.map((k) => asUnread(k, read.problems))].map((gpu) =>
        withLostNvlinks(withLatchedPcie(gpu, pcieLatched.get(gpu.uuid)), nvlinksSeenActive),
      );
      // Stable: a read's own row goes before a remembered one of the same index (see asUnread).
      return out.sort((a, b) => a.index - b.index);
    },
    snapshot() {
      return {
        pcie: [...pcieLatched].map(([uuid, l]) => ({ uuid, ...l })),
        nvlinks: [...nvlinksSeenActive].map(([uuid, n]) => ({ uuid, ...n })),
      };
    },
  };
}

/** Latches kept per kind at most (a node has a handful of GPUs; anything past this is junk). */
const MAX_SAVED_GPUS = 256;
const MAX_MEMORY_FILE_BYTES = 256 * 1024;

/**
 * Reads the latches saved under `bootId`. A file from another boot (a reboot re-judges every
 * link), a missing one, and one that is not what {@link saveGpuMemory} writes all give
 * `undefined`, never a throw: the agent then starts with an empty memory.
 */
export function loadGpuMemory(
  file: string,
  bootId: string | undefined,
): GpuMemorySnapshot | undefined {
  if (bootId === undefined) return undefined;
  let value: unknown;
  try {
    const text = readFileSync(file, "utf8");
    if (text.length > MAX_MEMORY_FILE_BYTES) return undefined;
    value = JSON.parse(text);
  } catch {
    return undefined;
  }
  const v = value as { bootId?: unknown; pcie?: unknown; nvlinks?: unknown };
  if (typeof v !== "object" || v === null || v.bootId !== bootId) return undefined;
  const str = (x: unknown, max: number): x is string => typeof x === "string" && x.length <= max;
  const num = (x: unknown): x is number =>
    typeof x === "number" && Number.isSafeInteger(x) && x >= 0;
  const pcie = (Array.isArray(v.pcie) ? v.pcie : []).slice(0, MAX_SAVED_GPUS).flatMap((e) => {
    const p = e?.problem;
    return str(e?.uuid, 128) &&
      num(e?.atUnixMs) &&
      str(p?.code, 128) &&
      str(p?.message, 1024) &&
      str(p?.source, 64)
      ? [
          {
            uuid: e.uuid,
            atUnixMs: e.atUnixMs,
            problem: { code: p.code, message: p.message, source: p.source },
          },
        ]
      : [];
  });
  const nvlinks = (Array.isArray(v.nvlinks) ? v.nvlinks : [])
    .slice(0, MAX_SAVED_GPUS)
    .flatMap((e) =>
      str(e?.uuid, 128) && num(e?.active) && num(e?.atUnixMs)
        ? [{ uuid: e.uuid, active: e.active, atUnixMs: e.atUnixMs }]
        : [],
    );
  return { pcie, nvlinks };
}

/** Writes the latches under `bootId`: owner-only, through a temporary file and a rename. */
export function saveGpuMemory(file: string, bootId: string, snapshot: GpuMemorySnapshot): void {
  const tmp = `${file}.tmp`;
  const fd = openSync(tmp, "w", 0o600);
  try {
    writeSync(fd, JSON.stringify({ bootId, ...snapshot }));
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
  renameSync(tmp, file);
}

/** Same GPU: by uuid when both have one, else by PCI bus id (a lost row has no uuid). */
function sameGpu(a: Gpu, b: Gpu): boolean {
  if (a.uuid !== "" && b.uuid !== "") return a.uuid === b.uuid;
  const key = pciBusKey(a.pciBusId);
  return key !== undefined && key === pciBusKey(b.pciBusId);
}

/**
 * A remembered GPU the latest read lacks: its last reading, unhealthy, with a problem that
 * says why. When a renumbered read puts another GPU at the same index, both rows are sent and
 * the control plane (which matches readings by index) keeps the last: the unhealthy one.
 */
function asUnread(last: Remembered, problems: readonly Problem[]): Gpu {
  const { gpu } = last;
  const sources = READ_SOURCES[gpu.vendor ?? "nvidia"];
  // The last failure is the one that ended the read (amd-smi failing is followed by rocm-smi's).
  const cause = problems.findLast(
    (p) => sources.includes(p.source) && READ_FAILURE_CODES.has(p.code),
  );
  const tool = sources[0] ?? "nvidia-smi";
  const who = `GPU ${gpu.index} (${gpu.uuid || gpu.pciBusId})`;
  const since = `its last reading (${new Date(last.atUnixMs).toISOString()}) is reported`;
  const problem: Problem =
    cause === undefined
      ? {
          code: ProblemCodes.gpuLost,
          source: tool,
          message: `${who} is missing from ${tool}'s latest answer; ${since}`,
        }
      : {
          code: cause.code,
          source: cause.source,
          message: `${who} could not be read: ${bounded(cause.message)}; ${since}`,
        };
  return { ...gpu, healthy: false, healthProblems: [...gpu.healthProblems, problem] };
}

/**
 * Longest quoted tool message: the control plane refuses a heartbeat whose health-problem
 * message is over 1,024 characters (and the node then goes lost).
 */
const MAX_QUOTED_CHARS = 512;

const bounded = (text: string) =>
  text.length <= MAX_QUOTED_CHARS ? text : `${text.slice(0, MAX_QUOTED_CHARS - 1)}…`;

/** `gpu` with a latched PCIe-degraded problem put back when this reading lacks it. */
function withLatchedPcie(gpu: Gpu, latched: Latched | undefined): Gpu {
  if (latched === undefined) return gpu;
  if (gpu.healthProblems.some((p) => p.code === ProblemCodes.gpuPcieDegraded)) return gpu;
  const problem: Problem = {
    ...latched.problem,
    message: `${latched.problem.message} (seen under load at ${new Date(latched.atUnixMs).toISOString()}; it holds until the node reboots, as fixing a link takes)`,
  };
  return { ...gpu, healthy: false, healthProblems: [...gpu.healthProblems, problem] };
}

/**
 * A GPU whose NVLinks are all inactive now although some were active before: discovery cannot
 * tell that from a card without an NVLink bridge (every link inactive from the start), the
 * agent's memory can.
 */
function withLostNvlinks(
  gpu: Gpu,
  seen: ReadonlyMap<string, { active: number; atUnixMs: number }>,
): Gpu {
  const { nvlinksTotal: total, nvlinksInactive: inactive } = gpu.health ?? {};
  const before = seen.get(gpu.uuid);
  if (total === undefined || inactive !== total || before === undefined || total === 0) return gpu;
  if (gpu.healthProblems.some((p) => p.code === ProblemCodes.gpuNvlinkInactive)) return gpu;
  return {
    ...gpu,
    healthy: false,
    healthProblems: [
      ...gpu.healthProblems,
      {
        code: ProblemCodes.gpuNvlinkInactive,
        source: "nvidia-smi",
        message: `GPU ${gpu.index} (${gpu.uuid}) has all ${total} NVLinks inactive; ${before.active} were active at ${new Date(before.atUnixMs).toISOString()}: check the fabric manager and the NVLink/NVSwitch state (nvidia-smi nvlink -s), then reset the GPU`,
      },
    ],
  };
}
