import { MetricsCollectorError } from "./errors.js";
import { DEFAULT_LABEL_VALUE_MAX_LENGTH } from "./labels.js";

/** Why a GPU reading (or one of its fields) was refused; bounded, so usable as a label. */
export type GpuReadingRejectReason =
  | "not_an_object"
  | "wrong_type"
  | "non_finite"
  | "negative"
  | "out_of_range"
  | "label_too_long";

/** Every {@link GpuReadingRejectReason}, for tests and pre-initialised counters. */
export const GPU_READING_REJECT_REASONS: readonly GpuReadingRejectReason[] = [
  "not_an_object",
  "wrong_type",
  "non_finite",
  "negative",
  "out_of_range",
  "label_too_long",
];

/** A GPU reading that passed validation: plain finite numbers, bounded strings. */
export interface ValidGpuReading {
  readonly index: number;
  readonly uuid: string;
  readonly name?: string;
  readonly memoryTotalBytes?: number;
  readonly memoryUsedBytes?: number;
  readonly utilizationPercent?: number;
  readonly eccUncorrectedErrors?: number;
  readonly temperatureCelsius?: number;
  readonly powerWatts?: number;
  /** Missing `healthy` counts as unhealthy (fail closed). */
  readonly healthy: boolean;
}

/** One refused field: which, why, and a message that echoes the (truncated) bad value. */
export interface GpuReadingProblem {
  readonly field: string;
  readonly reason: GpuReadingRejectReason;
  readonly message: string;
}

/** Outcome of {@link validateGpuReading}. */
export type GpuReadingValidation =
  | { readonly ok: true; readonly reading: ValidGpuReading }
  | ({ readonly ok: false } & GpuReadingProblem);

/** Outcome of {@link sanitizeGpuReading}: the reading without its bad fields, and what was dropped. */
export interface GpuReadingSanitized {
  /** `undefined` when the reading's identity (index, uuid, name) itself is unusable. */
  readonly reading: ValidGpuReading | undefined;
  readonly dropped: readonly GpuReadingProblem[];
}

/** Plausibility bounds for readings. Partial; see {@link resolveGpuReadingLimits}. */
export interface GpuReadingLimits {
  /** Largest believable GPU memory. Default 4 TiB (a B200 has 180 GB). */
  maxMemoryBytes?: number;
  /** Largest believable power draw. Default 5,000 W. */
  maxPowerWatts?: number;
  /** Believable temperature range. Default -60..250 °C. */
  minTemperatureCelsius?: number;
  maxTemperatureCelsius?: number;
  /** Largest believable ECC error count. Default 2^40. */
  maxEccErrors?: number;
  /** Largest GPU index. Default 1023. */
  maxIndex?: number;
  /** Longest uuid or name, in UTF-16 code units. Default 128. */
  labelValueMaxLength?: number;
}

/** {@link GpuReadingLimits} with every default applied. */
export type ResolvedGpuReadingLimits = Readonly<Required<GpuReadingLimits>>;

const DEFAULT_LIMITS: ResolvedGpuReadingLimits = {
  maxMemoryBytes: 4 * 1024 ** 4,
  maxPowerWatts: 5_000,
  minTemperatureCelsius: -60,
  maxTemperatureCelsius: 250,
  maxEccErrors: 2 ** 40,
  maxIndex: 1023,
  labelValueMaxLength: DEFAULT_LABEL_VALUE_MAX_LENGTH,
};

/**
 * Applies defaults and checks the limits themselves.
 * @throws MetricsCollectorError `LLMGW_METRICS_COLLECTOR_INVALID_OPTION` naming the option.
 */
export function resolveGpuReadingLimits(limits: GpuReadingLimits = {}): ResolvedGpuReadingLimits {
  const resolved: Required<GpuReadingLimits> = { ...DEFAULT_LIMITS };
  for (const key of Object.keys(DEFAULT_LIMITS) as (keyof GpuReadingLimits)[]) {
    const value = limits[key];
    if (value === undefined) continue;
    if (
      typeof value !== "number" ||
      Number.isNaN(value) ||
      (key !== "minTemperatureCelsius" && value < 0)
    ) {
      throw new MetricsCollectorError(
        "LLMGW_METRICS_COLLECTOR_INVALID_OPTION",
        `${key} must be a non-negative number, got ${echo(value)}`,
      );
    }
    resolved[key] = value;
  }
  return resolved;
}

function echo(value: unknown): string {
  let s: string;
  try {
    s = typeof value === "string" ? JSON.stringify(value) : String(value);
  } catch {
    s = Object.prototype.toString.call(value);
  }
  return s.length > 40 ? `${s.slice(0, 40)}… (${s.length} chars)` : s;
}

type Check = { value: number } | GpuReadingProblem;

function toNumber(field: string, raw: unknown, min: number, max: number, integer: boolean): Check {
  let n: number;
  if (typeof raw === "bigint") n = Number(raw);
  else if (typeof raw === "number") n = raw;
  else
    return { field, reason: "wrong_type", message: `${field} must be a number, got ${typeof raw}` };
  if (!Number.isFinite(n))
    return { field, reason: "non_finite", message: `${field} is not finite (${echo(raw)})` };
  if (n < 0 && min >= 0)
    return { field, reason: "negative", message: `${field} is negative (${echo(raw)})` };
  if (n < min || n > max || (integer && !Number.isInteger(n))) {
    return {
      field,
      reason: "out_of_range",
      message: `${field} ${echo(raw)} is outside ${min}..${max}${integer ? " (integer)" : ""}`,
    };
  }
  return { value: n };
}

function toLabel(
  field: string,
  raw: unknown,
  maxLength: number,
): { value: string } | GpuReadingProblem {
  if (typeof raw !== "string")
    return { field, reason: "wrong_type", message: `${field} must be a string, got ${typeof raw}` };
  if (raw.length > maxLength) {
    return {
      field,
      reason: "label_too_long",
      message: `${field} is ${raw.length} chars, limit ${maxLength}`,
    };
  }
  return { value: raw };
}

function check(
  raw: unknown,
  limits: ResolvedGpuReadingLimits,
  stopAtFirst: boolean,
): GpuReadingSanitized {
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) {
    const problem: GpuReadingProblem = {
      field: "reading",
      reason: "not_an_object",
      message: `reading must be an object, got ${raw === null ? "null" : Array.isArray(raw) ? "array" : typeof raw}`,
    };
    return { reading: undefined, dropped: [problem] };
  }
  const r = raw as Record<string, unknown>;
  const dropped: GpuReadingProblem[] = [];
  const index = toNumber("index", r.index, 0, limits.maxIndex, true);
  if ("reason" in index) return { reading: undefined, dropped: [index] };
  const uuid = toLabel("uuid", r.uuid, limits.labelValueMaxLength);
  if ("reason" in uuid) return { reading: undefined, dropped: [uuid] };
  const out: { -readonly [K in keyof ValidGpuReading]: ValidGpuReading[K] } = {
    index: index.value,
    uuid: uuid.value,
    healthy: r.healthy === true,
  };
  if (r.healthy !== undefined && typeof r.healthy !== "boolean") {
    dropped.push({
      field: "healthy",
      reason: "wrong_type",
      message: `healthy must be a boolean, got ${typeof r.healthy}`,
    });
    if (stopAtFirst) return { reading: undefined, dropped };
  }
  if (r.name !== undefined) {
    const name = toLabel("name", r.name, limits.labelValueMaxLength);
    if ("reason" in name) return { reading: undefined, dropped: [...dropped, name] };
    out.name = name.value;
  }
  const numeric: [keyof ValidGpuReading, number, number, boolean][] = [
    ["memoryTotalBytes", 0, limits.maxMemoryBytes, true],
    ["memoryUsedBytes", 0, limits.maxMemoryBytes, true],
    ["utilizationPercent", 0, 100, false],
    ["eccUncorrectedErrors", 0, limits.maxEccErrors, true],
    ["temperatureCelsius", limits.minTemperatureCelsius, limits.maxTemperatureCelsius, false],
    ["powerWatts", 0, limits.maxPowerWatts, false],
  ];
  for (const [field, min, max, integer] of numeric) {
    if (r[field] === undefined || r[field] === null) continue;
    const n = toNumber(field, r[field], min, max, integer);
    if ("reason" in n) {
      dropped.push(n);
      if (stopAtFirst) return { reading: undefined, dropped };
      continue;
    }
    (out as Record<string, unknown>)[field] = n.value;
  }
  return { reading: out, dropped };
}

/**
 * Validates one GPU reading as an agent sent it (plain object or protobuf message; `bigint`
 * counters accepted) and refuses it whole at the first bad field: NaN/Infinity, negative or
 * absurd values, wrong types, or label values (uuid, name) over the length bound. Never
 * throws; the caller logs `message` and counts `reason`.
 */
export function validateGpuReading(raw: unknown, limits?: GpuReadingLimits): GpuReadingValidation {
  const { reading, dropped } = check(raw, resolveGpuReadingLimits(limits), true);
  const first = dropped[0];
  if (reading === undefined || first !== undefined) {
    const problem = first ?? {
      field: "reading",
      reason: "wrong_type" as const,
      message: "reading refused",
    };
    return { ok: false, ...problem };
  }
  return { ok: true, reading };
}

/**
 * The lenient sibling of {@link validateGpuReading}: keeps a reading whose identity is sound
 * and drops only its bad readings (which then read as missing, never 0), returning what was
 * dropped and why. Never throws.
 */
export function sanitizeGpuReading(raw: unknown, limits?: GpuReadingLimits): GpuReadingSanitized {
  return check(raw, resolveGpuReadingLimits(limits), false);
}
