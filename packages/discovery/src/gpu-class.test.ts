import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { deriveGpuClass, deriveGpuModel } from "./gpu-class.js";

// Every name/memory pair from formats.md §1.3 and §1.11 (plus the §1.3 multi-GPU sample).
describe("deriveGpuClass on real nvidia-smi rows", () => {
  it.each([
    ["NVIDIA H100 80GB HBM3", 81559, "h100-80g"],
    ["NVIDIA H100 NVL", 95830, "h100nvl-94g"],
    ["NVIDIA H200", 143771, "h200-141g"],
    ["NVIDIA B200", 183359, "b200-180g"],
    ["NVIDIA GH200 480GB", 97871, "gh200-96g"],
    ["NVIDIA H20", 97871, "h20-96g"],
    ["NVIDIA A100-SXM4-80GB", 81920, "a100-80g"],
    ["NVIDIA A100-SXM4-80GB", 81251, "a100-80g"],
    ["NVIDIA A100 80GB PCIe", 81920, "a100-80g"],
    ["NVIDIA A100 80GB PCIe", 81251, "a100-80g"],
    ["NVIDIA A100-SXM4-40GB", 40960, "a100-40g"],
    ["NVIDIA A100-PCIE-40GB", 40536, "a100-40g"],
    ["NVIDIA L40S", 46068, "l40s-45g"],
    ["NVIDIA L4", 23034, "l4-23g"],
    ["NVIDIA A10", 23028, "a10-23g"],
    ["NVIDIA A10G", 23028, "a10g-23g"],
    ["NVIDIA GeForce RTX 4090", 24564, "rtx4090-24g"],
    ["NVIDIA GeForce RTX 4090", 49140, "rtx4090-48g"],
    ["NVIDIA GeForce RTX 4080 SUPER", 16376, "rtx4080super-16g"],
    ["NVIDIA GeForce RTX 2080 SUPER", 8192, "rtx2080super-8g"],
  ] as const)("%s with %i MiB is %s", (name, mib, expected) => {
    expect(deriveGpuClass(name, mib)).toBe(expected);
  });
});

describe("deriveGpuModel word rules", () => {
  it.each([
    // vendor and family words go; SUPER, NVL, RTX, Ti, Ada stay (they are different products)
    ["NVIDIA GeForce RTX 4080 SUPER", "rtx4080super", "SUPER is a different product: kept"],
    ["NVIDIA H100 NVL", "h100nvl", "NVL (dual-board, 94 GB) is kept"],
    ["NVIDIA H100 PCIe", "h100", "PCIe is a form factor: dropped"],
    ["NVIDIA A100-SXM4-80GB", "a100", "SXM4 is a form factor: dropped"],
    ["NVIDIA GeForce RTX 3080 Ti", "rtx3080ti", "Ti is kept"],
    ["NVIDIA RTX 5880 Ada Generation", "rtx5880ada", "'Generation' is dropped, 'Ada' kept"],
    ["Tesla V100-SXM2-32GB", "v100", "Tesla is a family word"],
    ["Quadro RTX 8000", "rtx8000", "Quadro is a family word"],
    ["NVIDIA TITAN V", "titanv", "plain words are joined"],
    ["NVIDIA", "gpu", "nothing left gives 'gpu'"],
  ])("%s → %s (%s)", (name, model) => {
    expect(deriveGpuModel(name)).toBe(model);
  });
});

describe("deriveGpuClass without a usable memory figure", () => {
  it.each([[undefined], [0], [-1], [Number.NaN], [Number.POSITIVE_INFINITY]])(
    "memory %s gives no class (GB10 reports [N/A])",
    (mib) => {
      expect(deriveGpuClass("NVIDIA GB10", mib)).toBeUndefined();
    },
  );

  it("classes are always <model>-<N>g with a lower-case alphanumeric model", () => {
    fc.assert(
      fc.property(fc.string(), fc.integer({ min: 1, max: 10_000_000 }), (name, mib) => {
        expect(deriveGpuClass(name, mib)).toMatch(/^[a-z0-9]+-\d+g$/);
      }),
    );
  });
});

// AMD market names from health-formats.md §4.2/§4.4/§4.5. Only MI300X VRAM totals are in the
// reference (196592 MB in ROCm 7.0/7.1, 196300 MB in 6.3 CPX), so only MI300X gets a class
// here; the other names are checked as models.
describe("deriveGpuClass on AMD market names", () => {
  it.each([
    ["AMD Instinct MI300X", 196592, "mi300x-192g"],
    ["AMD Instinct MI300X", 196300, "mi300x-192g"],
  ] as const)("%s with %i MiB is %s", (name, mib, expected) => {
    expect(deriveGpuClass(name, mib)).toBe(expected);
  });

  it.each([
    ["MI308X", "mi308x"],
    ["AMD Instinct MI308X OAM", "mi308x"],
    ["AMD Instinct MI350X", "mi350x"],
    ["AMD Instinct MI350 OAM", "mi350"],
    ["AMD INSTINCT MI200 (MCM) OAM LC MBA HPE C2", "mi200"],
    ["Phoenix3", "phoenix3"],
  ])("%s → model %s", (name, model) => {
    expect(deriveGpuModel(name)).toBe(model);
  });

  it("MI308X and AMD Instinct MI308X OAM (one SKU, ROCm/vllm#359) give one class", () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 1_000_000 }), (mib) => {
        expect(deriveGpuClass("MI308X", mib)).toBe(deriveGpuClass("AMD Instinct MI308X OAM", mib));
      }),
    );
  });
});
