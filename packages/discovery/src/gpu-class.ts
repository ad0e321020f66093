/**
 * Words dropped from a GPU name when deriving its class model (DESIGN §2): the vendor, product
 * family words, and form-factor / memory-technology words. Everything else is kept, so product
 * variants that differ in capability stay distinct: `SUPER`, `NVL`, `Ti`, `Ada`, `RTX`.
 */
const DROPPED_WORDS = new Set([
  // vendors
  "nvidia",
  "amd",
  // AMD brand lines ("AMD Instinct MI300X", "AMD Radeon RX 7900 XTX")
  "instinct",
  "radeon",
  // product families (brand lines, not chips)
  "geforce",
  "tesla",
  "quadro",
  // form factors
  "pcie",
  "sxm",
  "sxm2",
  "sxm3",
  "sxm4",
  "sxm5",
  // memory technology
  "hbm2",
  "hbm2e",
  "hbm3",
  "hbm3e",
  // "RTX 5880 Ada Generation": "generation" carries nothing once "ada" is kept
  "generation",
]);

/**
 * An AMD Instinct model word (`mi300x`, `mi308x`, `mi250x`, `mi210`, `mi350x`). When a name has
 * one, it alone is the model: market names are unstable around it (`MI308X` and
 * `AMD Instinct MI308X OAM` on the same SKU, `AMD INSTINCT MI200 (MCM) OAM LC MBA HPE C2`,
 * health-formats.md §4.4/§4.5), and the words around it are form factors and board variants.
 */
const INSTINCT_MODEL_WORD = /^mi\d{2,3}[a-z]*$/;

/** A memory-size word such as `80GB`, `141gb`, `480GB` (GH200 counts CPU memory too). */
const MEMORY_WORD = /^\d+(\.\d+)?gb$/;

/**
 * The model part of a GPU class: the nvidia-smi `name` lower-cased, split on spaces and dashes,
 * without vendor, family, memory-size and form-factor words, joined without separators.
 * `NVIDIA H100 80GB HBM3` → `h100`, `NVIDIA A100-SXM4-80GB` → `a100`, `NVIDIA GeForce RTX 4090`
 * → `rtx4090`, `NVIDIA H100 NVL` → `h100nvl`, `NVIDIA GeForce RTX 4080 SUPER` → `rtx4080super`.
 * AMD: an Instinct model word is the whole model (`AMD Instinct MI308X OAM` → `mi308x`, see
 * {@link INSTINCT_MODEL_WORD}); other AMD names follow the same word rules
 * (`AMD Radeon RX 7900 XTX` → `rx7900xtx`).
 * Returns `"gpu"` when nothing is left (a name made only of dropped words).
 */
export function deriveGpuModel(name: string): string {
  const all = name
    .toLowerCase()
    .split(/[\s\-_/]+/)
    .map((word) => word.replace(/[^a-z0-9.]/g, ""));
  const instinct = all.find((word) => INSTINCT_MODEL_WORD.test(word));
  if (instinct !== undefined) return instinct;
  const words = all.filter(
    (word) => word !== "" && !DROPPED_WORDS.has(word) && !MEMORY_WORD.test(word),
  );
  const model = words.join("").replace(/\./g, "");
  return model === "" ? "gpu" : model;
}

/**
 * The scheduler's unit of capacity, `<model>-<GiB>g` (DESIGN §2), derived here and nowhere else.
 * `<GiB>` is `ceil(memoryTotalMiB / 1024)`: ceil keeps the class stable when a driver upgrade
 * moves A100-80GB from 81251 to 81920 MiB, and makes an L40S (46068 MiB) `l40s-45g`.
 *
 * An MI300X (amd-smi `total_vram` 196592 MB) is `mi300x-192g`.
 *
 * @param name - `name` as printed by nvidia-smi, e.g. `NVIDIA H200`, or amd-smi's
 *   `market_name`, e.g. `AMD Instinct MI300X`.
 * @param memoryTotalMiB - `memory.total` (amd-smi: `total_vram`, whose "MB" is MiB) in MiB; `undefined` (e.g. `[N/A]` on GB10) or a
 *   non-positive / non-finite value gives `undefined`: no class, so nothing is scheduled on it.
 */
export function deriveGpuClass(
  name: string,
  memoryTotalMiB: number | undefined,
): string | undefined {
  if (memoryTotalMiB === undefined || !Number.isFinite(memoryTotalMiB) || memoryTotalMiB <= 0) {
    return undefined;
  }
  return `${deriveGpuModel(name)}-${Math.ceil(memoryTotalMiB / 1024)}g`;
}
