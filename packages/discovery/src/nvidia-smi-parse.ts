import { ProblemCodes, problem } from "./problem-codes.js";
import type { GpuHealthReadings, Problem } from "./types.js";

/**
 * One field of the GPU query. On exit 2 (`Field "x" is not a valid field to query.`) an
 * optional field is replaced by its `fallback` name if it has one (and that was not tried yet),
 * otherwise dropped, and the query retried; a required field ends the query.
 */
export interface GpuQueryField {
  readonly field: string;
  readonly optional: boolean;
  /**
   * An older name of the same field, tried in its place when this nvidia-smi rejects `field`
   * (e.g. `clocks_throttle_reasons.active` before `clocks_event_reasons.active` existed).
   */
  readonly fallback?: string;
}

/**
 * The `--query-gpu` fields, in order (DESIGN §3). `compute_cap` is unknown to R470 nvidia-smi;
 * `utilization.gpu` and the health fields after it (health-formats.md §2.1) are optional and
 * trailing, so a driver that answers with fewer cells than asked for still yields every GPU.
 * Columns are matched by position in the list actually requested, never by header text (the
 * header prints canonical names, not aliases).
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
  // Health readings (health-formats.md §2.1). Yes/No, counts, a 16-hex-digit bitmask, numbers
  // and a string; `[N/A]` on MIG GPUs (remapped rows), GeForce (ECC, pages, rows), pre-Ampere
  // (remapped rows) or Ampere+ (retired pages).
  { field: "remapped_rows.pending", optional: true },
  { field: "remapped_rows.failure", optional: true },
  { field: "remapped_rows.correctable", optional: true },
  { field: "remapped_rows.uncorrectable", optional: true },
  { field: "retired_pages.single_bit_ecc.count", optional: true },
  { field: "retired_pages.double_bit.count", optional: true },
  { field: "retired_pages.pending", optional: true },
  {
    field: "clocks_event_reasons.active",
    optional: true,
    fallback: "clocks_throttle_reasons.active",
  },
  // `pcie.link.gen.current` is "Deprecated, use pcie.link.gen.gpucurrent instead" on 590.
  { field: "pcie.link.gen.gpucurrent", optional: true, fallback: "pcie.link.gen.current" },
  { field: "pcie.link.gen.max", optional: true },
  { field: "pcie.link.width.current", optional: true },
  { field: "pcie.link.width.max", optional: true },
  { field: "gpu_recovery_action", optional: true },
];

/** The spec of a requested field name (its own name or its fallback), if it is one of ours. */
export function gpuQueryField(name: string): GpuQueryField | undefined {
  return GPU_QUERY_FIELDS.find((f) => f.field === name || f.fallback === name);
}

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
  /**
   * The `--query-gpu` health readings (no NVLink: that is another query); absent when the
   * tool reported none of them.
   */
  readonly health?: GpuHealthReadings;
}

/** Text → data plus the problems met on the way; parsers never throw on input. */
export interface ParseResult<T> {
  readonly value: T;
  readonly problems: readonly Problem[];
}

const NUMERIC = /^-?\d+(\.\d+)?( (MiB|W|%|MHz|us|ms))?$/;

/**
 * One CSV cell: trimmed text, or `undefined` for "unreported" — empty, `N/A`, `Requested
 * functionality has been deprecated` (health-formats.md §2.6, bare in `-q`), or any bracketed
 * token (`[N/A]`, `[Not Supported]`, `[Unknown Error]`, `[Insufficient Permissions]`, …).
 */
export function parseSmiCell(raw: string | undefined): string | undefined {
  if (raw === undefined) return undefined;
  const cell = raw.trim();
  if (
    cell === "" ||
    cell === "N/A" ||
    cell === "Requested functionality has been deprecated" ||
    /^\[.*\]$/.test(cell)
  ) {
    return undefined;
  }
  return cell;
}

/** `Yes` → true, `No` → false (`--query-gpu` spelling); anything else is unreported. */
export function parseSmiYesNo(raw: string | undefined): boolean | undefined {
  const cell = parseSmiCell(raw);
  if (cell === "Yes") return true;
  if (cell === "No") return false;
  return undefined;
}

/** A non-negative integer (a count, a PCIe generation or width); anything else is unreported. */
export function parseSmiCount(raw: string | undefined): number | undefined {
  const cell = parseSmiCell(raw);
  if (cell === undefined || !/^\d{1,15}$/.test(cell)) return undefined;
  return Number.parseInt(cell, 10);
}

/**
 * A hex bitmask such as `0x0000000000000001` (`clocks_event_reasons.active`, 16 digits) →
 * number. A mask that does not fit a double exactly (a bit above 2^53, none defined by NVML
 * today) is unreported rather than rounded into other bits.
 */
export function parseSmiBitmask(raw: string | undefined): number | undefined {
  const cell = parseSmiCell(raw);
  if (cell === undefined || !/^0x[0-9a-fA-F]{1,16}$/.test(cell)) return undefined;
  const value = BigInt(cell);
  return value > BigInt(Number.MAX_SAFE_INTEGER) ? undefined : Number(value);
}

/** Longest `gpu_recovery_action` text kept; NVML's names are a few words. */
const MAX_RECOVERY_ACTION_CHARS = 64;

/** A short printable word or phrase (`None`, `Reset`, `Drain and Reset`); else unreported. */
function parseSmiWord(raw: string | undefined): string | undefined {
  const cell = parseSmiCell(raw);
  if (cell === undefined || cell.length > MAX_RECOVERY_ACTION_CHARS) return undefined;
  return /^[\x20-\x7e]+$/.test(cell) ? cell : undefined;
}

/** Longest piece of outside text quoted in a problem message. */
const MAX_QUOTED_CHARS = 160;

/** Quotes outside text for a problem message, bounded (the control plane caps messages). */
export function quoteBounded(text: string): string {
  return text.length > MAX_QUOTED_CHARS
    ? `${JSON.stringify(text.slice(0, MAX_QUOTED_CHARS))}…`
    : JSON.stringify(text);
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

const BUS_ID = /^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]$/;

/**
 * How many `", "` the name cell holds. The bus id after it finds the answer even in a row that
 * is also short (so the cell count cannot tell); without a bus id column, extra cells can.
 */
function nameCommas(cells: readonly string[], fields: readonly string[], nameAt: number): number {
  if (nameAt < 0) return 0;
  const busAt = fields.indexOf("pci.bus_id");
  if (busAt < nameAt) return Math.max(0, cells.length - fields.length);
  if (BUS_ID.test(cells[busAt]?.trim() ?? "")) return 0;
  for (let extra = 1; busAt + extra < cells.length; extra++) {
    if (BUS_ID.test(cells[busAt + extra]?.trim() ?? "")) return extra;
  }
  return 0;
}

/**
 * Parses `--query-gpu=<fields> --format=csv,noheader,nounits` output. Cells are separated by
 * `", "`; a name containing `", "` is joined back together (found by where the bus id cell
 * is). A row with fewer cells is kept when only optional trailing cells
 * are missing — a driver too old to know a trailing field may print a shorter row — and those
 * readings are unreported, exactly as `[N/A]` would be. A row that also lacks a required cell,
 * or has no numeric index or uuid, is skipped with a {@link ProblemCodes.gpuRowInvalid}
 * problem.
 *
 * @param fields - the field names that were requested, in order (fallback names included).
 */
export function parseGpuQuery(text: string, fields: readonly string[]): ParseResult<GpuQueryRow[]> {
  const rows: GpuQueryRow[] = [];
  const problems: Problem[] = [];
  const nameAt = fields.indexOf("name");
  // Cells up to the last required field must be there; a name we do not know counts as required.
  let requiredCells = 0;
  for (const [at, field] of fields.entries()) {
    if (!gpuQueryField(field)?.optional) requiredCells = at + 1;
  }
  for (const line of lines(text)) {
    let cells = line.split(", ");
    const extra = nameCommas(cells, fields, nameAt);
    if (extra > 0) {
      cells = [
        ...cells.slice(0, nameAt),
        cells.slice(nameAt, nameAt + extra + 1).join(", "),
        ...cells.slice(nameAt + extra + 1),
      ];
    }
    if (cells.length < requiredCells || cells.length > fields.length) {
      problems.push(
        problem(
          ProblemCodes.gpuRowInvalid,
          "nvidia-smi",
          `GPU row has ${cells.length} of ${fields.length} columns, skipped: ${quoteBounded(line)}`,
        ),
      );
      continue;
    }
    const get = (field: string): string | undefined => {
      const spec = gpuQueryField(field);
      let at = fields.indexOf(field);
      if (at < 0 && spec?.fallback !== undefined) at = fields.indexOf(spec.fallback);
      return at < 0 ? undefined : cells[at];
    };
    const indexText = parseSmiCell(get("index"));
    const uuid = parseSmiCell(get("uuid"));
    if (indexText === undefined || !/^\d+$/.test(indexText) || uuid === undefined) {
      problems.push(
        problem(
          ProblemCodes.gpuRowInvalid,
          "nvidia-smi",
          `GPU row without a usable index and uuid, skipped: ${quoteBounded(line)}`,
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
    set("health", parseHealthCells(get));
    rows.push(row);
  }
  return { value: rows, problems };
}

/** The health readings of one row; `undefined` when none was reported. */
function parseHealthCells(
  get: (field: string) => string | undefined,
): GpuHealthReadings | undefined {
  const health: { -readonly [K in keyof GpuHealthReadings]: GpuHealthReadings[K] } = {};
  const set = <K extends keyof GpuHealthReadings>(
    key: K,
    value: GpuHealthReadings[K] | undefined,
  ) => {
    if (value !== undefined) health[key] = value;
  };
  set("remappedRowsPending", parseSmiYesNo(get("remapped_rows.pending")));
  set("remappedRowsFailure", parseSmiYesNo(get("remapped_rows.failure")));
  set("remappedRowsCorrectable", parseSmiCount(get("remapped_rows.correctable")));
  set("remappedRowsUncorrectable", parseSmiCount(get("remapped_rows.uncorrectable")));
  set("retiredPagesSingleBit", parseSmiCount(get("retired_pages.single_bit_ecc.count")));
  set("retiredPagesDoubleBit", parseSmiCount(get("retired_pages.double_bit.count")));
  set("retiredPagesPending", parseSmiYesNo(get("retired_pages.pending")));
  set("clocksEventReasonsActive", parseSmiBitmask(get("clocks_event_reasons.active")));
  set("pcieLinkGenCurrent", parseSmiCount(get("pcie.link.gen.gpucurrent")));
  set("pcieLinkGenMax", parseSmiCount(get("pcie.link.gen.max")));
  set("pcieLinkWidthCurrent", parseSmiCount(get("pcie.link.width.current")));
  set("pcieLinkWidthMax", parseSmiCount(get("pcie.link.width.max")));
  set("recoveryAction", parseSmiWord(get("gpu_recovery_action")));
  return Object.keys(health).length === 0 ? undefined : health;
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
  const reason = (match[2] ?? "").trim().slice(0, MAX_QUOTED_CHARS);
  return { pciBusId: normalizePciBusId(match[1] ?? ""), reason };
}

/** One GPU block of `nvidia-smi nvlink -s`. */
export interface NvlinkGpuStatus {
  /** From the `GPU N:` header. */
  readonly index: number;
  /** From `(UUID: GPU-…)`; absent when the header has none or a masked one (`UUID: ...`). */
  readonly uuid?: string;
  /** Distinct `Link N:` lines under the header. */
  readonly linksTotal: number;
  /** Links printed as `<inactive>`. */
  readonly linksInactive: number;
}

/** What `nvidia-smi nvlink -s` said, per GPU. */
export interface NvlinkStatus {
  /** GPUs with a header and no MIG refusal under it; a GPU without NVLink prints nothing. */
  readonly gpus: readonly NvlinkGpuStatus[];
  /** `Nvlink queries are not supported for Devices in MIG mode` appeared somewhere. */
  readonly migUnsupported: boolean;
}

const MIG_NVLINK_UNSUPPORTED = /Nvlink queries are not supported for Devices in MIG mode/i;

/**
 * Parses `nvidia-smi nvlink -s` (health-formats.md §2.4): `GPU N: <name> (UUID: GPU-…)`
 * headers, each followed by indented `Link N: <rate>` lines (tab + space, or 9 spaces) or
 * `Link N: <inactive>`. A MIG refusal line under a header drops that GPU (no reading, not a
 * fault); lines before the first header and anything else are ignored. Never throws.
 */
export function parseNvlinkStatus(text: string): NvlinkStatus {
  const gpus: NvlinkGpuStatus[] = [];
  let migUnsupported = false;
  let current: { index: number; uuid?: string; links: Set<number>; inactive: Set<number> } | null =
    null;
  const flush = () => {
    if (current === null) return;
    gpus.push({
      index: current.index,
      ...(current.uuid === undefined ? {} : { uuid: current.uuid }),
      linksTotal: current.links.size,
      linksInactive: current.inactive.size,
    });
    current = null;
  };
  for (const line of lines(text)) {
    const header = /^GPU (\d{1,4}): (.*)$/.exec(line);
    if (header) {
      flush();
      const uuid = /\(UUID: (GPU-[0-9a-fA-F-]{1,64})\)\s*$/.exec(header[2] ?? "")?.[1];
      current = {
        index: Number.parseInt(header[1] ?? "", 10),
        ...(uuid === undefined ? {} : { uuid }),
        links: new Set(),
        inactive: new Set(),
      };
      continue;
    }
    if (MIG_NVLINK_UNSUPPORTED.test(line)) {
      migUnsupported = true;
      current = null;
      continue;
    }
    const link = /^\s+Link (\d{1,3}): (.*)$/.exec(line);
    if (link && current !== null) {
      const n = Number.parseInt(link[1] ?? "", 10);
      current.links.add(n);
      if ((link[2] ?? "").trim() === "<inactive>") current.inactive.add(n);
    }
  }
  flush();
  return { gpus, migUnsupported };
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
