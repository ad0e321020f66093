import { ProblemCodes, problem } from "./problem-codes.js";
import type { Problem } from "./types.js";

/** One field of the GPU query; optional fields are dropped (and retried without) on exit 2. */
export interface GpuQueryField {
  readonly field: string;
  readonly optional: boolean;
}

/**
 * The `--query-gpu` fields, in order (DESIGN §3). `compute_cap` is unknown to R470 nvidia-smi
 * and `utilization.gpu` is last and optional; columns are matched by position in the list
 * actually requested, never by header text (the header prints canonical names, not aliases).
 */
export const GPU_QUERY_FIELDS: readonly GpuQueryField[] = [
  { field: "index", optional: false },
  { field: "uuid", optional: false },
  { field: "name", optional: false },
  { field: "memory.total", optional: false },
  { field: "memory.used", optional: false },
  { field: "pci.bus_id", optional: false },
  { field: "compute_cap", optional: true },
  { field: "ecc.errors.uncorrected.volatile.total", optional: false },
  { field: "temperature.gpu", optional: false },
  { field: "power.draw", optional: false },
  { field: "mig.mode.current", optional: false },
  { field: "utilization.gpu", optional: true },
];

/** One parsed `--query-gpu` row; every reading that was not reported is `undefined`. */
export interface GpuQueryRow {
  readonly index: number;
  readonly uuid: string;
  readonly name: string;
  readonly memoryTotalMiB?: number;
  readonly memoryUsedMiB?: number;
  /** Normalised to nvidia-smi's 8-hex-digit domain, upper-case hex. */
  readonly pciBusId: string;
  readonly computeCapability?: string;
  readonly eccUncorrectedErrors?: number;
  readonly temperatureCelsius?: number;
  readonly powerWatts?: number;
  /** `Enabled` / `Disabled`; `undefined` for `[N/A]` (non-MIG GPUs). */
  readonly migMode?: string;
  readonly utilizationPercent?: number;
}

/** Text → data plus the problems met on the way; parsers never throw on input. */
export interface ParseResult<T> {
  readonly value: T;
  readonly problems: readonly Problem[];
}

const NUMERIC = /^-?\d+(\.\d+)?( (MiB|W|%|MHz|us|ms))?$/;

/**
 * One CSV cell: trimmed text, or `undefined` for "unreported" — empty, `N/A`, or any bracketed
 * token (`[N/A]`, `[Not Supported]`, `[Unknown Error]`, `[Insufficient Permissions]`, …).
 */
export function parseSmiCell(raw: string | undefined): string | undefined {
  if (raw === undefined) return undefined;
  const cell = raw.trim();
  if (cell === "" || cell === "N/A" || /^\[.*\]$/.test(cell)) return undefined;
  return cell;
}

/** A numeric cell (units tolerated) or `undefined`; non-numeric text is unreported, not zero. */
export function parseSmiNumber(raw: string | undefined): number | undefined {
  const cell = parseSmiCell(raw);
  if (cell === undefined || !NUMERIC.test(cell)) return undefined;
  return Number.parseFloat(cell);
}

/**
 * Normalises a PCI bus id to nvidia-smi's form: 8-hex-digit domain, upper-case hex
 * (`0000:0b:00.0` → `00000000:0B:00.0`). Text that is not a bus id is returned trimmed.
 */
export function normalizePciBusId(id: string): string {
  const match = /^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-9a-fA-F])$/.exec(
    id.trim(),
  );
  if (!match) return id.trim();
  const [, domain = "", bus = "", device = "", fn = ""] = match;
  return `${domain.padStart(8, "0")}:${bus}:${device}.${fn}`.toUpperCase();
}

function lines(text: string): string[] {
  return text
    .split(/\r?\n/)
    .map((line) => line.replace(/\r$/, ""))
    .filter((line) => line.trim() !== "");
}

/**
 * Parses `--query-gpu=<fields> --format=csv,noheader,nounits` output. Cells are separated by
 * `", "`; a row with more cells than fields has a comma in its name (the extra cells are
 * joined back into `name`); a row with fewer cells, or without a numeric index or a uuid, is
 * skipped with a {@link ProblemCodes.gpuRowInvalid} problem.
 *
 * @param fields - the field names that were requested, in order.
 */
export function parseGpuQuery(text: string, fields: readonly string[]): ParseResult<GpuQueryRow[]> {
  const rows: GpuQueryRow[] = [];
  const problems: Problem[] = [];
  const nameAt = fields.indexOf("name");
  for (const line of lines(text)) {
    let cells = line.split(", ");
    if (cells.length > fields.length && nameAt >= 0) {
      const extra = cells.length - fields.length;
      cells = [
        ...cells.slice(0, nameAt),
        cells.slice(nameAt, nameAt + extra + 1).join(", "),
        ...cells.slice(nameAt + extra + 1),
      ];
    }
    if (cells.length !== fields.length) {
      problems.push(
        problem(
          ProblemCodes.gpuRowInvalid,
          "nvidia-smi",
          `GPU row has ${cells.length} of ${fields.length} columns, skipped: ${JSON.stringify(line)}`,
        ),
      );
      continue;
    }
    const get = (field: string): string | undefined => {
      const at = fields.indexOf(field);
      return at < 0 ? undefined : cells[at];
    };
    const indexText = parseSmiCell(get("index"));
    const uuid = parseSmiCell(get("uuid"));
    if (indexText === undefined || !/^\d+$/.test(indexText) || uuid === undefined) {
      problems.push(
        problem(
          ProblemCodes.gpuRowInvalid,
          "nvidia-smi",
          `GPU row without a usable index and uuid, skipped: ${JSON.stringify(line)}`,
        ),
      );
      continue;
    }
    const row: {
      -readonly [K in keyof GpuQueryRow]: GpuQueryRow[K];
    } = {
      index: Number.parseInt(indexText, 10),
      uuid,
      name: parseSmiCell(get("name")) ?? "",
      pciBusId: normalizePciBusId(parseSmiCell(get("pci.bus_id")) ?? ""),
    };
    const set = <K extends keyof GpuQueryRow>(key: K, value: GpuQueryRow[K] | undefined) => {
      if (value !== undefined) row[key] = value;
    };
    set("memoryTotalMiB", parseSmiNumber(get("memory.total")));
    set("memoryUsedMiB", parseSmiNumber(get("memory.used")));
    const cc = parseSmiCell(get("compute_cap"));
    set("computeCapability", cc !== undefined && /^\d+\.\d+$/.test(cc) ? cc : undefined);
    set("eccUncorrectedErrors", parseSmiNumber(get("ecc.errors.uncorrected.volatile.total")));
    set("temperatureCelsius", parseSmiNumber(get("temperature.gpu")));
    set("powerWatts", parseSmiNumber(get("power.draw")));
    set("migMode", parseSmiCell(get("mig.mode.current")));
    set("utilizationPercent", parseSmiNumber(get("utilization.gpu")));
    rows.push(row);
  }
  return { value: rows, problems };
}

/** The field an old nvidia-smi rejected (`Field "x" is not a valid field to query.`), if any. */
export function parseUnknownField(text: string): string | undefined {
  return /Field "([^"]+)" is not a valid field to query/.exec(text)?.[1];
}

/** A GPU nvidia-smi could not open: `Unable to determine the device handle for GPU <bus>: <why>`. */
export interface LostGpuMessage {
  /** Normalised bus id, e.g. `00000000:02:00.0`. */
  readonly pciBusId: string;
  /** The driver's reason, e.g. `GPU is lost. Reboot the system to recover this GPU`. */
  readonly reason: string;
}

/**
 * Recognises the fallen-off-the-bus message in its spellings (with or without a space after
 * `GPU`); `undefined` when the text is something else.
 */
export function parseLostGpu(text: string): LostGpuMessage | undefined {
  const match =
    /Unable to determine the device handle for GPU\s*([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*:?\s*(.*)/.exec(
      text,
    );
  if (!match) return undefined;
  return { pciBusId: normalizePciBusId(match[1] ?? ""), reason: (match[2] ?? "").trim() };
}

/** One process holding GPU memory, from `--query-compute-apps`. */
export interface ComputeApp {
  readonly gpuUuid: string;
  readonly pid: number;
  readonly processName: string;
  /** `undefined` when unreported (`[N/A]` on Windows WDDM). */
  readonly usedMemoryMiB?: number;
}

/** The compute-apps query discovery runs; the parser below expects exactly these columns. */
export const COMPUTE_APPS_ARGS: readonly string[] = [
  "--query-compute-apps=gpu_uuid,pid,process_name,used_memory",
  "--format=csv,noheader,nounits",
];

/**
 * Parses `--query-compute-apps=gpu_uuid,pid,process_name,used_memory` (noheader, nounits).
 * The process name is everything between the pid and the last cell, so Windows paths with
 * spaces (and even `", "`) survive. Empty output means no processes.
 */
export function parseComputeApps(text: string): ParseResult<ComputeApp[]> {
  const apps: ComputeApp[] = [];
  const problems: Problem[] = [];
  for (const line of lines(text)) {
    const cells = line.split(", ");
    const gpuUuid = parseSmiCell(cells[0]);
    const pidText = cells[1]?.trim() ?? "";
    if (cells.length < 4 || gpuUuid === undefined || !/^\d+$/.test(pidText)) {
      problems.push(
        problem(
          ProblemCodes.computeAppsFailed,
          "nvidia-smi",
          `compute-apps row not understood, skipped: ${JSON.stringify(line)}`,
        ),
      );
      continue;
    }
    const usedMemoryMiB = parseSmiNumber(cells[cells.length - 1]);
    apps.push({
      gpuUuid,
      pid: Number.parseInt(pidText, 10),
      processName: cells.slice(2, -1).join(", ").trim(),
      ...(usedMemoryMiB === undefined ? {} : { usedMemoryMiB }),
    });
  }
  return { value: apps, problems };
}

/**
 * The driver version from `nvidia-smi --version` (`DRIVER version      : 590.48.01`); the
 * kernel driver can differ from the nvidia-smi binary's own version, and the driver is what
 * matters. `undefined` when the line is missing.
 */
export function parseDriverVersion(text: string): string | undefined {
  return /^DRIVER version\s*:\s*(\S+)\s*$/im.exec(text)?.[1];
}
