import { readFileSync } from "node:fs";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { buildAmdGpus } from "./amd-smi.js";
import {
  type AmdSmiEntry,
  extractJson,
  mergeAmdSmiDocuments,
  parseAmdDriverVersion,
  parseAmdSmiDocument,
  parseRocmSmiJson,
  readAmdQuantity,
} from "./amd-smi-parse.js";

/** A fixture's JSON without its `#` provenance header (see each file's header for its source). */
const fixture = (name: string) =>
  readFileSync(new URL(`../test/fixtures/${name}`, import.meta.url), "utf8")
    .split("\n")
    .filter((line) => !line.startsWith("#"))
    .join("\n");

const entries = (name: string, what = name): AmdSmiEntry[] => {
  const parsed = parseAmdSmiDocument(fixture(name), what);
  expect(parsed.problems).toEqual([]);
  if (parsed.value === undefined) throw new Error(`${name} did not parse`);
  return parsed.value;
};

describe("parseAmdSmiDocument", () => {
  it.each([
    ["amd-smi-list-mi210.txt"],
    ["amd-smi-list-mi210-gpu-data.txt"],
    ["amd-smi-static-mi350x.txt"],
    ["amd-smi-static-mi350x-gpu-data.txt"],
    ["amd-smi-metric-radeon.txt"],
    ["amd-smi-metric-radeon-gpu-data.txt"],
    ["amd-smi-metric-radeon-bare.txt"],
    ["amd-smi-metric-power.txt"],
  ])("%s: one entry for GPU 0, whichever top-level shape", (name) => {
    expect(entries(name).map((e) => e.gpu)).toEqual([0]);
  });

  it.each([
    ["", "amd-smi metric --json printed no JSON"],
    ["WARNING: No JSON data to report\n", "amd-smi metric --json printed no JSON"],
    [
      '{"card0": {}}',
      "amd-smi metric --json printed JSON of no known shape (neither a list nor {gpu_data: [...]})",
    ],
    [
      '{"gpu_data": "N/A"}',
      "amd-smi metric --json printed JSON of no known shape (neither a list nor {gpu_data: [...]})",
    ],
  ])("%j is LLMGW_DISCOVERY_AMD_SMI_FAILED: %s", (text, message) => {
    const parsed = parseAmdSmiDocument(text, "metric --json");
    expect(parsed.value).toBeUndefined();
    expect(parsed.problems).toEqual([
      { code: "LLMGW_DISCOVERY_AMD_SMI_FAILED", source: "amd-smi", message },
    ]);
  });

  it("entries without a GPU index are skipped, each with a problem", () => {
    const parsed = parseAmdSmiDocument('[{"gpu": 0}, "N/A", {"gpu": -1}, {"bdf": "x"}]', "list");
    expect(parsed.value?.map((e) => e.gpu)).toEqual([0]);
    expect(parsed.problems.map((p) => p.message)).toEqual([
      "amd-smi list: entry 1 has no GPU index; skipped",
      "amd-smi list: entry 2 has no GPU index; skipped",
      "amd-smi list: entry 3 has no GPU index; skipped",
    ]);
  });
});

describe("extractJson", () => {
  const doc = fixture("amd-smi-metric-power.txt");

  it("reads JSON followed by warnings (§4.5)", () => {
    expect(extractJson(`${doc}\nWARNING: some metrics could not be read {see log}\n`)).toEqual(
      JSON.parse(doc),
    );
  });

  it("reads JSON preceded by warnings", () => {
    expect(extractJson(`WARNING: something\n${doc}`)).toEqual(JSON.parse(doc));
  });

  it("returns undefined for truncated JSON", () => {
    expect(extractJson(doc.slice(0, doc.length / 2))).toBeUndefined();
  });
});

describe("readAmdQuantity", () => {
  const mib = { MB: 1, B: 1 / (1024 * 1024) };
  it.each([
    [{ value: 30576, unit: "MB" }, 30576],
    [{ value: 1048576, unit: "B" }, 1],
    [30576, 30576],
    ["N/A", undefined],
    [{ value: "N/A", unit: "MB" }, undefined],
    [{ value: 1, unit: "GB" }, undefined],
    [[{ value: 0, unit: "%" }, "N/A"], undefined],
    [-1, undefined],
    [null, undefined],
  ])("%j → %j", (leaf, expected) => {
    expect(readAmdQuantity(leaf, mib)).toBe(expected);
  });

  it("a text-mode string with its unit: MAX_PCIE_SPEED 32 GT/s", () => {
    expect(readAmdQuantity("32 GT/s", { "GT/s": 1 })).toBe(32);
  });
});

describe("mergeAmdSmiDocuments", () => {
  const listShape = {
    list: entries("amd-smi-list-mi210.txt"),
    static: entries("amd-smi-static-mi350x.txt"),
    metric: entries("amd-smi-metric-radeon.txt"),
  };

  it("joins list, static and metric into one device keyed on its BDF", () => {
    const merged = mergeAmdSmiDocuments(listShape);
    expect(merged.problems).toEqual([]);
    expect(merged.value).toEqual([
      {
        toolIndex: 0,
        pciBusId: "00000000:23:00.0",
        uuid: "67ff740f-0000-1000-80e6-b5bb3c3ce0db",
        kfdNodeId: 2,
        name: "AMD Instinct MI350X",
        pcieLinkGenMax: 5,
        memoryTotalMiB: 30576,
        memoryUsedMiB: 20450,
        utilizationPercent: 91,
        temperatureCelsius: 63,
        eccUncorrectable: 0,
        eccDeferred: 0,
        pcieLinkWidthCurrent: 8,
        pcieLinkGenCurrent: 1,
      },
    ]);
  });

  // The test: AMD JSON of each shape gives the same inventory.
  it.each([
    [
      "gpu_data (26.0)",
      {
        list: entries("amd-smi-list-mi210-gpu-data.txt"),
        static: entries("amd-smi-static-mi350x-gpu-data.txt"),
        metric: entries("amd-smi-metric-radeon-gpu-data.txt"),
      },
    ],
    [
      "bare values (6.0)",
      {
        list: entries("amd-smi-list-mi210.txt"),
        static: entries("amd-smi-static-mi350x.txt"),
        metric: entries("amd-smi-metric-radeon-bare.txt"),
      },
    ],
  ])("%s gives the same GPUs as the list shape", (_, docs) => {
    const inventory = (d: typeof docs) => buildAmdGpus(mergeAmdSmiDocuments(d).value, "amd-smi");
    expect(inventory(docs)).toEqual(inventory(listShape));
  });

  it("metric alone names no BDF: the GPU is skipped with a problem, not invented", () => {
    const merged = mergeAmdSmiDocuments({ metric: entries("amd-smi-metric-radeon.txt") });
    expect(merged.value).toEqual([]);
    expect(merged.problems.map((p) => [p.code, p.message])).toEqual([
      [
        "LLMGW_DISCOVERY_AMD_SMI_FAILED",
        "amd-smi reported GPU 0 without a PCI address (BDF); skipped",
      ],
    ]);
  });

  it("socket_power from the 6.1 `metric -p` sample is the power reading", () => {
    const merged = mergeAmdSmiDocuments({
      list: entries("amd-smi-list-mi210.txt"),
      metric: entries("amd-smi-metric-power.txt"),
    });
    expect(merged.value[0]?.powerWatts).toBe(10);
  });

  it("ecc_blocks as the fallback when ecc totals are absent; 'N/A' blocks are unreported", () => {
    const list = entries("amd-smi-list-mi210.txt");
    const blocks = (eccBlocks: unknown) =>
      mergeAmdSmiDocuments({
        list,
        metric: [{ gpu: 0, fields: { gpu: 0, ecc_blocks: eccBlocks } }],
      }).value[0];
    expect(
      blocks({
        UMC: { correctable_count: 0, uncorrectable_count: 2, deferred_count: 1 },
        GFX: { correctable_count: 0, uncorrectable_count: 3, deferred_count: "N/A" },
      }),
    ).toMatchObject({ eccUncorrectable: 5, eccDeferred: 1 });
    const none = blocks("N/A");
    expect(none?.eccUncorrectable).toBeUndefined();
    expect(none?.eccDeferred).toBeUndefined();
  });

  it("one entry per partition: each BDF is a device; a repeated BDF is skipped", () => {
    const list = [0, 1, 2].map((gpu) => ({
      gpu,
      fields: { gpu, bdf: gpu === 2 ? "0000:23:00.0" : `0000:23:00.${gpu}` },
    }));
    const merged = mergeAmdSmiDocuments({ list });
    expect(merged.value.map((f) => f.pciBusId)).toEqual(["00000000:23:00.0", "00000000:23:00.1"]);
    expect(merged.problems.map((p) => p.message)).toEqual([
      "amd-smi reported 00000000:23:00.0 twice (GPU 2 again); the second entry is skipped",
    ]);
  });

  it("the driver version comes from static driver.version", () => {
    expect(
      parseAmdDriverVersion([{ gpu: 0, fields: { driver: { name: "amdgpu", version: "N/A" } } }]),
    ).toBeUndefined();
    expect(parseAmdDriverVersion(entries("amd-smi-static-mi350x.txt"))).toBeUndefined();
  });
});

describe("parseRocmSmiJson", () => {
  it("reads the Phoenix3 sample (§4.4); memory stays unreported (no byte key in the reference)", () => {
    const parsed = parseRocmSmiJson(fixture("amd-rocm-smi-phoenix3.txt"));
    expect(parsed.problems).toEqual([]);
    expect(parsed.value).toEqual([
      {
        toolIndex: 0,
        pciBusId: "00000000:C4:00.0",
        name: "Phoenix3",
        temperatureCelsius: 31,
        powerWatts: 7.222,
        utilizationPercent: 19,
      },
    ]);
  });

  // Keys from the other §4.4 captures: MI250 `-a` (wandb/wandb#5449), 2019 junction with
  // lower-case (c) (RainbowMiner#749), MI300 secondary die (ROCm/rocm_smi_lib#149), MI250X
  // `--showproductname` (ROCm/rocm_smi_lib#159).
  it("tolerates the keys that change by version and ASIC", () => {
    const parsed = parseRocmSmiJson(
      JSON.stringify({
        card1: {
          "Card series": "AMD INSTINCT MI200 (MCM) OAM LC MBA HPE C2",
          "Average Graphics Package Power (W)": "128.0",
          "PCI Bus": "0000:C9:00.0",
          "Temperature (Sensor junction) (c)": "103.0",
        },
        card0: {
          "Card Series": "AMD INSTINCT MI200 (MCM) OAM LC MBA HPE C2",
          "Current Socket Graphics Package Power (W)": "N/A (Secondary die)",
          "PCI Bus": "0000:C4:00.0",
        },
        system: { "Driver version": "6.2.4" },
      }),
    );
    expect(parsed.value).toEqual([
      {
        toolIndex: 0,
        pciBusId: "00000000:C4:00.0",
        name: "AMD INSTINCT MI200 (MCM) OAM LC MBA HPE C2",
      },
      {
        toolIndex: 1,
        pciBusId: "00000000:C9:00.0",
        name: "AMD INSTINCT MI200 (MCM) OAM LC MBA HPE C2",
        temperatureCelsius: 103,
        powerWatts: 128,
      },
    ]);
  });

  it.each([
    ["WARNING: No JSON data to report\n", "rocm-smi printed no JSON"],
    ['{"system": {"Driver version": "6.2.4"}}', "rocm-smi printed JSON without any cardN entry"],
    ["[]", "rocm-smi printed JSON without any cardN entry"],
  ])("%j is LLMGW_DISCOVERY_ROCM_SMI_FAILED", (text, message) => {
    expect(parseRocmSmiJson(text)).toEqual({
      value: undefined,
      problems: [{ code: "LLMGW_DISCOVERY_ROCM_SMI_FAILED", source: "rocm-smi", message }],
    });
  });

  it("a card without a PCI Bus is skipped with a problem", () => {
    const parsed = parseRocmSmiJson('{"card0": {"Device Name": "Phoenix3"}, "card1": "N/A"}');
    expect(parsed.value).toEqual([]);
    expect(parsed.problems.map((p) => p.message)).toEqual([
      "rocm-smi card0 has no PCI address (PCI Bus); skipped",
      "rocm-smi card1 has no PCI address (PCI Bus); skipped",
    ]);
  });
});

describe("AMD parsers never throw", () => {
  const json = fc.jsonValue({ maxDepth: 5 });
  const text = fc.oneof(
    fc.string(),
    json.map((v) => JSON.stringify(v)),
    json.map((v) => `${JSON.stringify(v)}\nWARNING: trailing`),
    json.map((v) => JSON.stringify({ gpu_data: [v] })),
  );

  it("on arbitrary text and JSON", () => {
    fc.assert(
      fc.property(text, (t) => {
        const doc = parseAmdSmiDocument(t, "metric --json");
        mergeAmdSmiDocuments({ list: doc.value, static: doc.value, metric: doc.value });
        parseRocmSmiJson(t);
      }),
    );
  });

  it("on arbitrary entry fields, and every GPU built from them is well formed", () => {
    const entry = fc.record({ gpu: fc.nat({ max: 8 }), fields: fc.dictionary(fc.string(), json) });
    fc.assert(
      fc.property(fc.array(entry), fc.array(entry), (a, b) => {
        const list = a.map((e) => ({
          gpu: e.gpu,
          fields: { ...e.fields, bdf: `0000:0${e.gpu}:00.0` },
        }));
        const gpus = buildAmdGpus(mergeAmdSmiDocuments({ list, metric: b }).value, "amd-smi");
        for (const gpu of gpus) {
          expect(gpu.vendor).toBe("amd");
          if (gpu.memoryTotalBytes !== undefined)
            expect(gpu.memoryTotalBytes).toBeGreaterThanOrEqual(0);
        }
        expect(new Set(gpus.map((g) => g.uuid)).size).toBe(gpus.length);
      }),
    );
  });
});
