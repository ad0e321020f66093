/**
 * Pure parsers of AMD's GPU tools: `amd-smi list|static|metric --json` and the deprecated
 * `rocm-smi --showallinfo --json` (health-formats.md §4). Text → plain facts; nothing here
 * runs a process and nothing throws on input. Every reading that was not reported — a missing
 * key, `"N/A"`, an unknown unit — stays `undefined`, never 0.
 */
import { normalizePciBusId, type ParseResult } from "./nvidia-smi-parse.js";
import { ProblemCodes, problem } from "./problem-codes.js";
import type { Problem } from "./types.js";

/** Output longer than this is not parsed (amd-smi on 8 GPUs in CPX prints well under 1 MiB). */
export const MAX_AMD_SMI_OUTPUT_CHARS = 16 * 1024 * 1024;

/** One GPU's (or one partition's) dictionary from an amd-smi JSON document. */
export interface AmdSmiEntry {
  /** amd-smi's `gpu` index: its own enumeration order, not HIP's (§4.5). */
  readonly gpu: number;
  readonly fields: Readonly<Record<string, unknown>>;
}

/**
 * Facts about one AMD GPU or partition, merged from `list`, `static` and `metric` (or read from
 * rocm-smi). Memory in MiB: amd-smi's "MB" is MiB (an MI300X reports 196592 MB, 192 × 1024 − 16).
 */
export interface AmdGpuFacts {
  /** amd-smi `gpu`, or N of rocm-smi's `cardN`. */
  readonly toolIndex: number;
  /** Normalised with {@link normalizePciBusId}. */
  readonly pciBusId: string;
  readonly uuid?: string;
  readonly name?: string;
  /** KFD topology node (amd-smi `list` `node_id`): the order ROCr and HIP number devices in. */
  readonly kfdNodeId?: number;
  readonly memoryTotalMiB?: number;
  readonly memoryUsedMiB?: number;
  readonly utilizationPercent?: number;
  readonly temperatureCelsius?: number;
  readonly powerWatts?: number;
  readonly eccUncorrectable?: number;
  readonly eccDeferred?: number;
  readonly pcieLinkGenCurrent?: number;
  readonly pcieLinkGenMax?: number;
  readonly pcieLinkWidthCurrent?: number;
  readonly pcieLinkWidthMax?: number;
}

type Mutable<T> = { -readonly [K in keyof T]: T[K] };

const SOURCE_AMD = "amd-smi";
const SOURCE_ROCM = "rocm-smi";

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** `obj.a.b.c` when every step is a dictionary, else `undefined`. */
function at(value: unknown, ...path: string[]): unknown {
  let current = value;
  for (const key of path) {
    if (!isRecord(current)) return undefined;
    current = current[key];
  }
  return current;
}

function tryParse(text: string): { ok: true; value: unknown } | { ok: false } {
  try {
    return { ok: true, value: JSON.parse(text) };
  } catch {
    return { ok: false };
  }
}

/** How many closing brackets from the end are tried when text trails the JSON. */
const MAX_JSON_END_TRIES = 8;

/**
 * The JSON document in a tool's stdout. amd-smi may print warnings before the document or
 * after it (and exit non-zero, §4.5), so when the whole text is not JSON the document is taken
 * from the first line that opens with `[` or `{` to one of the last closing brackets.
 */
export function extractJson(text: string): unknown {
  if (text.length > MAX_AMD_SMI_OUTPUT_CHARS) return undefined;
  const whole = tryParse(text.trim());
  if (whole.ok) return whole.value;
  const start = /^[ \t]*[[{]/m.exec(text);
  if (!start) return undefined;
  const from = start.index;
  let end = text.length;
  for (let i = 0; i < MAX_JSON_END_TRIES; i++) {
    const close = Math.max(text.lastIndexOf("]", end - 1), text.lastIndexOf("}", end - 1));
    if (close <= from) return undefined;
    const part = tryParse(text.slice(from, close + 1));
    if (part.ok) return part.value;
    end = close;
  }
  return undefined;
}

/**
 * The per-GPU entries of an amd-smi JSON document of either top-level shape: a list
 * `[{"gpu": 0, …}]` (amd-smi < 26) or `{"gpu_data": [{"gpu": 0, …}]}` (26.0 / ROCm 7.0, §4.1).
 * `value` is `undefined` when the text holds no JSON of a known shape; entries that are not
 * dictionaries with a non-negative integer `gpu` are skipped, each with a problem.
 *
 * @param what - the command, for messages, e.g. `"metric --json"`.
 */
export function parseAmdSmiDocument(
  text: string,
  what: string,
): ParseResult<AmdSmiEntry[] | undefined> {
  const json = extractJson(text);
  const list = Array.isArray(json) ? json : at(json, "gpu_data");
  if (!Array.isArray(list)) {
    const why =
      json === undefined
        ? "printed no JSON"
        : "printed JSON of no known shape (neither a list nor {gpu_data: [...]})";
    return {
      value: undefined,
      problems: [problem(ProblemCodes.amdSmiFailed, SOURCE_AMD, `amd-smi ${what} ${why}`)],
    };
  }
  const entries: AmdSmiEntry[] = [];
  const problems: Problem[] = [];
  for (const [position, item] of list.entries()) {
    const gpu = at(item, "gpu");
    if (!isRecord(item) || typeof gpu !== "number" || !Number.isInteger(gpu) || gpu < 0) {
      problems.push(
        problem(
          ProblemCodes.amdSmiFailed,
          SOURCE_AMD,
          `amd-smi ${what}: entry ${position} has no GPU index; skipped`,
        ),
      );
      continue;
    }
    entries.push({ gpu, fields: item });
  }
  return { value: entries, problems };
}

/** Unit → factor into the wanted unit; a bare number is taken as the wanted unit (pre-6.1 shape). */
type UnitTable = Readonly<Record<string, number>>;

const MIB_UNITS: UnitTable = { MB: 1, B: 1 / (1024 * 1024) };
const WATT_UNITS: UnitTable = { W: 1 };
const CELSIUS_UNITS: UnitTable = { C: 1 };
const PERCENT_UNITS: UnitTable = { "%": 1 };
const GTS_UNITS: UnitTable = { "GT/s": 1 };
const COUNT_UNITS: UnitTable = {};

const NUMBER_WITH_UNIT = /^(-?\d+(?:\.\d+)?)\s*(\S*)$/;

/**
 * One amd-smi leaf in the wanted unit: `{"value": N, "unit": "W"}` (6.1+), a bare number, or
 * a text-mode style string `"32 GT/s"`; `"N/A"`, arrays, unknown units and non-finite or
 * negative values are `undefined`.
 */
export function readAmdQuantity(leaf: unknown, units: UnitTable): number | undefined {
  let value: unknown = leaf;
  let unit: string | undefined;
  if (isRecord(leaf)) {
    value = leaf.value;
    unit = typeof leaf.unit === "string" ? leaf.unit.trim() : undefined;
  } else if (typeof leaf === "string") {
    const match = NUMBER_WITH_UNIT.exec(leaf.trim());
    if (!match) return undefined;
    value = Number.parseFloat(match[1] ?? "");
    unit = match[2] === "" ? undefined : match[2];
  }
  if (typeof value !== "number" || !Number.isFinite(value) || value < 0) return undefined;
  if (unit === undefined || unit === "") return value;
  const factor = units[unit];
  return factor === undefined ? undefined : value * factor;
}

function readCount(leaf: unknown): number | undefined {
  const value = readAmdQuantity(leaf, COUNT_UNITS);
  return value !== undefined && Number.isInteger(value) ? value : undefined;
}

function readText(leaf: unknown): string | undefined {
  if (typeof leaf !== "string") return undefined;
  const text = leaf.trim();
  return text === "" || /^N\/A\b/i.test(text) ? undefined : text.slice(0, 256);
}

/** PCIe generation by transfer rate (GT/s per lane); the link speed amd-smi reports. */
const PCIE_GEN_BY_GTS: ReadonlyMap<number, number> = new Map([
  [2.5, 1],
  [5, 2],
  [8, 3],
  [16, 4],
  [32, 5],
  [64, 6],
]);

function pcieGen(leaf: unknown): number | undefined {
  const gts = readAmdQuantity(leaf, GTS_UNITS);
  return gts === undefined ? undefined : PCIE_GEN_BY_GTS.get(gts);
}

function readBdf(leaf: unknown): string | undefined {
  const text = readText(leaf);
  if (text === undefined) return undefined;
  const normalized = normalizePciBusId(text);
  return /^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-9A-F]$/.test(normalized)
    ? normalized
    : undefined;
}

function set<T, K extends keyof T>(target: Mutable<T>, key: K, value: T[K] | undefined): void {
  if (value !== undefined) target[key] = value;
}

type PartialFacts = Partial<Mutable<AmdGpuFacts>>;

/** `list` keys (§4.3): `gpu, bdf, uuid, kfd_id, node_id, partition_id`. */
function listFacts(fields: Readonly<Record<string, unknown>>): PartialFacts {
  const facts: PartialFacts = {};
  set(facts, "pciBusId", readBdf(fields.bdf));
  set(facts, "uuid", readText(fields.uuid));
  set(facts, "kfdNodeId", readCount(fields.node_id));
  return facts;
}

/** `static` keys (§4.3): `asic.market_name`, `bus.{bdf,max_pcie_width,max_pcie_speed}`, `vram.size`. */
function staticFacts(fields: Readonly<Record<string, unknown>>): PartialFacts {
  const facts: PartialFacts = {};
  set(facts, "pciBusId", readBdf(at(fields, "bus", "bdf")));
  set(
    facts,
    "name",
    readText(at(fields, "asic", "market_name")) ?? readText(at(fields, "board", "product_name")),
  );
  set(facts, "pcieLinkWidthMax", readCount(at(fields, "bus", "max_pcie_width")));
  set(facts, "pcieLinkGenMax", pcieGen(at(fields, "bus", "max_pcie_speed")));
  set(facts, "memoryTotalMiB", readAmdQuantity(at(fields, "vram", "size"), MIB_UNITS));
  return facts;
}

/** Sum of `ecc_blocks.<BLOCK>.<key>`; undefined when the blocks are `"N/A"` or carry none. */
function sumEccBlocks(blocks: unknown, key: string): number | undefined {
  if (!isRecord(blocks)) return undefined;
  let sum: number | undefined;
  for (const block of Object.values(blocks)) {
    const count = readCount(at(block, key));
    if (count !== undefined) sum = (sum ?? 0) + count;
  }
  return sum;
}

/** `metric` keys (§4.3): usage, power, temperature, pcie, ecc, ecc_blocks, mem_usage. */
function metricFacts(fields: Readonly<Record<string, unknown>>): PartialFacts {
  const facts: PartialFacts = {};
  set(
    facts,
    "utilizationPercent",
    readAmdQuantity(at(fields, "usage", "gfx_activity"), PERCENT_UNITS),
  );
  set(
    facts,
    "temperatureCelsius",
    readAmdQuantity(at(fields, "temperature", "hotspot"), CELSIUS_UNITS) ??
      readAmdQuantity(at(fields, "temperature", "edge"), CELSIUS_UNITS),
  );
  set(facts, "powerWatts", readAmdQuantity(at(fields, "power", "socket_power"), WATT_UNITS));
  set(facts, "memoryTotalMiB", readAmdQuantity(at(fields, "mem_usage", "total_vram"), MIB_UNITS));
  set(facts, "memoryUsedMiB", readAmdQuantity(at(fields, "mem_usage", "used_vram"), MIB_UNITS));
  set(
    facts,
    "eccUncorrectable",
    readCount(at(fields, "ecc", "total_uncorrectable_count")) ??
      sumEccBlocks(fields.ecc_blocks, "uncorrectable_count"),
  );
  set(
    facts,
    "eccDeferred",
    readCount(at(fields, "ecc", "total_deferred_count")) ??
      sumEccBlocks(fields.ecc_blocks, "deferred_count"),
  );
  set(facts, "pcieLinkWidthCurrent", readCount(at(fields, "pcie", "width")));
  set(facts, "pcieLinkGenCurrent", pcieGen(at(fields, "pcie", "speed")));
  return facts;
}

/** The three amd-smi documents of one run; `undefined` for one that failed. */
export interface AmdSmiDocuments {
  readonly list?: readonly AmdSmiEntry[];
  readonly static?: readonly AmdSmiEntry[];
  readonly metric?: readonly AmdSmiEntry[];
}

/**
 * Merges one run's `list`, `static` and `metric` entries into one {@link AmdGpuFacts} per GPU
 * or partition. Identity is the BDF (from `list`, else `static`); `static` joins on the BDF
 * when it has one, `metric` (which carries no BDF) on amd-smi's `gpu` index of the same run.
 * An index with no BDF in any document is skipped with a problem. Where two documents give the
 * same reading, `metric` (live) wins over `static` for memory total. Sorted by amd-smi index.
 */
export function mergeAmdSmiDocuments(docs: AmdSmiDocuments): ParseResult<AmdGpuFacts[]> {
  const problems: Problem[] = [];
  const listByGpu = new Map((docs.list ?? []).map((e) => [e.gpu, listFacts(e.fields)]));
  const staticByGpu = new Map((docs.static ?? []).map((e) => [e.gpu, staticFacts(e.fields)]));
  const staticByBdf = new Map<string, PartialFacts>();
  for (const facts of staticByGpu.values()) {
    if (facts.pciBusId !== undefined) staticByBdf.set(facts.pciBusId, facts);
  }
  const metricByGpu = new Map((docs.metric ?? []).map((e) => [e.gpu, metricFacts(e.fields)]));
  const indexes = [
    ...new Set([...listByGpu.keys(), ...staticByGpu.keys(), ...metricByGpu.keys()]),
  ].sort((a, b) => a - b);
  const out: AmdGpuFacts[] = [];
  const seen = new Set<string>();
  for (const gpu of indexes) {
    const listed = listByGpu.get(gpu) ?? {};
    const bdf = listed.pciBusId ?? staticByGpu.get(gpu)?.pciBusId;
    if (bdf === undefined) {
      problems.push(
        problem(
          ProblemCodes.amdSmiFailed,
          SOURCE_AMD,
          `amd-smi reported GPU ${gpu} without a PCI address (BDF); skipped`,
        ),
      );
      continue;
    }
    if (seen.has(bdf)) {
      problems.push(
        problem(
          ProblemCodes.amdSmiFailed,
          SOURCE_AMD,
          `amd-smi reported ${bdf} twice (GPU ${gpu} again); the second entry is skipped`,
        ),
      );
      continue;
    }
    seen.add(bdf);
    const fromStatic = staticByBdf.get(bdf) ?? staticByGpu.get(gpu) ?? {};
    const fromMetric = metricByGpu.get(gpu) ?? {};
    out.push({
      ...fromStatic,
      ...fromMetric,
      ...listed,
      memoryTotalMiB: fromMetric.memoryTotalMiB ?? fromStatic.memoryTotalMiB,
      toolIndex: gpu,
      pciBusId: bdf,
    } as AmdGpuFacts);
  }
  return { value: out.map(dropUndefined), problems };
}

function dropUndefined(facts: AmdGpuFacts): AmdGpuFacts {
  return Object.fromEntries(
    Object.entries(facts).filter(([, v]) => v !== undefined),
  ) as unknown as AmdGpuFacts;
}

/** A rocm-smi string as a number; `"N/A"`, `"N/A (Secondary die)"` and text are `undefined`. */
function rocmNumber(value: unknown): number | undefined {
  if (typeof value !== "string" || !/^\s*\d+(\.\d+)?\s*$/.test(value)) return undefined;
  const n = Number.parseFloat(value);
  return Number.isFinite(n) ? n : undefined;
}

/** First key present (compared lower-case: `(C)` vs `(c)`, `Card Series` vs `Card series`, §4.4). */
function rocmField(card: Readonly<Record<string, unknown>>, ...keys: string[]): unknown {
  const lower = new Map(Object.entries(card).map(([k, v]) => [k.toLowerCase(), v]));
  for (const key of keys) {
    const value = lower.get(key.toLowerCase());
    if (value !== undefined && readText(value) !== undefined) return value;
  }
  return undefined;
}

/**
 * Parses `rocm-smi --showallinfo --json` (§4.4): `{"card0": {...}, …}` plus an optional
 * `"system"` entry, every value a string, keys that change with version and ASIC. Reads name
 * (`Card Series` / `Card series`, else `Device Name`), BDF (`PCI Bus`), temperature (junction,
 * else edge), power (`Current Socket Graphics Package Power (W)`, else the older
 * `Average Graphics Package Power (W)`) and `GPU use (%)`. The reference holds no rocm-smi key
 * for total or used VRAM in bytes (only `GPU Memory Allocated (VRAM%)`), so memory stays
 * unreported and such GPUs get no class; ECC stays unreported too (`--showrasinfo` prints no
 * JSON). `value` is `undefined` when the text is not such a document. Sorted by card number.
 */
export function parseRocmSmiJson(text: string): ParseResult<AmdGpuFacts[] | undefined> {
  const json = extractJson(text);
  const cards = isRecord(json)
    ? Object.entries(json)
        .map(([key, card]) => ({ n: /^card(\d{1,4})$/.exec(key)?.[1], card }))
        .filter((c): c is { n: string; card: unknown } => c.n !== undefined)
    : [];
  if (!isRecord(json) || cards.length === 0) {
    const why = json === undefined ? "printed no JSON" : "printed JSON without any cardN entry";
    return {
      value: undefined,
      problems: [problem(ProblemCodes.rocmSmiFailed, SOURCE_ROCM, `rocm-smi ${why}`)],
    };
  }
  const problems: Problem[] = [];
  const out: AmdGpuFacts[] = [];
  for (const { n, card } of cards.sort((a, b) => Number(a.n) - Number(b.n))) {
    const toolIndex = Number(n);
    const bdf = isRecord(card) ? readBdf(rocmField(card, "PCI Bus")) : undefined;
    if (!isRecord(card) || bdf === undefined) {
      problems.push(
        problem(
          ProblemCodes.rocmSmiFailed,
          SOURCE_ROCM,
          `rocm-smi card${n} has no PCI address (PCI Bus); skipped`,
        ),
      );
      continue;
    }
    const facts: Mutable<AmdGpuFacts> = { toolIndex, pciBusId: bdf };
    set(facts, "name", readText(rocmField(card, "Card Series", "Device Name", "Card Model")));
    set(
      facts,
      "temperatureCelsius",
      rocmNumber(rocmField(card, "Temperature (Sensor junction) (C)")) ??
        rocmNumber(rocmField(card, "Temperature (Sensor edge) (C)")),
    );
    set(
      facts,
      "powerWatts",
      rocmNumber(rocmField(card, "Current Socket Graphics Package Power (W)")) ??
        rocmNumber(rocmField(card, "Average Graphics Package Power (W)")),
    );
    set(facts, "utilizationPercent", rocmNumber(rocmField(card, "GPU use (%)")));
    out.push(facts);
  }
  return { value: out, problems };
}

/** The amdgpu driver version from `static` entries' `driver.version`; first one reported. */
export function parseAmdDriverVersion(entries: readonly AmdSmiEntry[]): string | undefined {
  for (const entry of entries) {
    const version = readText(at(entry.fields, "driver", "version"));
    if (version !== undefined) return version;
  }
  return undefined;
}
