import { readFileSync } from "node:fs";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  GPU_QUERY_FIELDS,
  normalizePciBusId,
  parseComputeApps,
  parseDriverVersion,
  parseGpuQuery,
  parseLostGpu,
  parseSmiCell,
  parseSmiNumber,
  parseUnknownField,
} from "./nvidia-smi-parse.js";

const FIELDS = GPU_QUERY_FIELDS.map((f) => f.field);
const fixture = (name: string) =>
  readFileSync(new URL(`../test/fixtures/${name}`, import.meta.url), "utf8");

describe("parseSmiCell / parseSmiNumber", () => {
  it.each([
    ["41", "41", 41],
    [" 69.85 ", "69.85", 69.85],
    ["81559 MiB", "81559 MiB", 81559],
    ["100 %", "100 %", 100],
    ["[N/A]", undefined, undefined],
    ["N/A", undefined, undefined],
    ["[Not Supported]", undefined, undefined],
    ["[Unknown Error]", undefined, undefined],
    ["[Insufficient Permissions]", undefined, undefined],
    ["[GPU is lost]", undefined, undefined],
    ["", undefined, undefined],
    ["   ", undefined, undefined],
    ["Enabled", "Enabled", undefined],
    ["9.0", "9.0", 9],
  ])("%j → cell %j, number %j", (raw, cell, number) => {
    expect(parseSmiCell(raw)).toBe(cell);
    expect(parseSmiNumber(raw)).toBe(number);
  });
});

describe("parseGpuQuery on real rows (formats.md §1.3, nounits)", () => {
  it("H100 idle: every reading present, 0 is a real 0", () => {
    const { value, problems } = parseGpuQuery(fixture("query-gpu-h100-idle.txt"), FIELDS);
    expect(problems).toEqual([]);
    expect(value).toEqual([
      {
        index: 0,
        uuid: "GPU-00000000-0000-0000-0000-000000000000",
        name: "NVIDIA H100 80GB HBM3",
        memoryTotalMiB: 81559,
        memoryUsedMiB: 0,
        pciBusId: "00000000:00:09.0",
        computeCapability: "9.0",
        eccUncorrectedErrors: 0,
        temperatureCelsius: 41,
        powerWatts: 69.85,
        migMode: "Disabled",
        utilizationPercent: 0,
      },
    ]);
  });

  it.each([
    [
      "query-gpu-h100-mig.txt",
      { migMode: "Enabled", utilizationPercent: undefined, memoryUsedMiB: 11125 },
    ],
    ["query-gpu-l40s.txt", { migMode: undefined, utilizationPercent: 9, computeCapability: "8.9" }],
    [
      "query-gpu-rtx2080super-windows.txt",
      { eccUncorrectedErrors: undefined, migMode: undefined, pciBusId: "00000000:0C:00.0" },
    ],
  ])("%s", (file, expected) => {
    const { value, problems } = parseGpuQuery(fixture(file), FIELDS);
    expect(problems).toEqual([]);
    expect(value).toHaveLength(1);
    for (const [key, v] of Object.entries(expected)) {
      expect(value[0]?.[key as keyof (typeof value)[0]]).toBe(v);
    }
  });

  it("matches columns by position in the requested list (no utilization, no compute_cap)", () => {
    const fields = FIELDS.filter((f) => f !== "utilization.gpu" && f !== "compute_cap");
    const { value } = parseGpuQuery(
      "0, GPU-aa, Tesla T4, 15109, 0, 00000000:00:04.0, 0, 33, 27.12, [N/A]\n",
      fields,
    );
    expect(value[0]).toMatchObject({
      name: "Tesla T4",
      memoryTotalMiB: 15109,
      temperatureCelsius: 33,
    });
    expect(value[0]?.computeCapability).toBeUndefined();
    expect(value[0]?.utilizationPercent).toBeUndefined();
  });

  it.each([
    ["[N/A]", undefined],
    ["[Not Supported]", undefined],
    ["[Unknown Error]", undefined],
    ["", undefined],
  ])("memory.used %j is unreported, never 0", (cell, expected) => {
    const { value } = parseGpuQuery(
      `0, GPU-aa, NVIDIA GB10, [N/A], ${cell}, 0000000F:01:00.0, 12.1, [N/A], 40, 10.00, [N/A], 96\n`,
      FIELDS,
    );
    expect(value[0]?.memoryUsedMiB).toBe(expected);
    expect(value[0]?.memoryTotalMiB).toBeUndefined();
  });

  it("skips a truncated row with a problem and keeps the others", () => {
    const text = `${fixture("query-gpu-h100-idle.txt")}1, GPU-11111111-0000-0000-0000-000000000000, NVIDIA H100 80GB HBM3, 81559, 0\n`;
    const { value, problems } = parseGpuQuery(text, FIELDS);
    expect(value.map((r) => r.index)).toEqual([0]);
    expect(problems).toHaveLength(1);
    expect(problems[0]?.code).toBe("LLMGW_DISCOVERY_GPU_ROW_INVALID");
    expect(problems[0]?.message).toContain("has 5 of 12 columns");
  });

  it("joins a name containing ', ' back together", () => {
    const { value } = parseGpuQuery(
      "0, GPU-aa, Weird, Name GPU, 1024, 0, 00000000:01:00.0, 8.0, 0, 30, 10.00, Disabled, 1\n",
      FIELDS,
    );
    expect(value[0]?.name).toBe("Weird, Name GPU");
    expect(value[0]?.memoryTotalMiB).toBe(1024);
  });

  it("rejects rows without a numeric index", () => {
    const { value, problems } = parseGpuQuery(
      "[N/A], GPU-aa, X, 1, 1, 00000000:01:00.0, 8.0, 0, 30, 10.00, Disabled, 1\n",
      FIELDS,
    );
    expect(value).toEqual([]);
    expect(problems[0]?.message).toContain("without a usable index and uuid");
  });

  it("never throws on arbitrary text", () => {
    fc.assert(
      fc.property(fc.string({ unit: "binary" }), (text) => {
        const { value } = parseGpuQuery(text, FIELDS);
        for (const row of value) expect(Number.isInteger(row.index)).toBe(true);
      }),
    );
  });
});

describe("error messages", () => {
  it.each([
    ['Field "compute_cap" is not a valid field to query.\n\n', "compute_cap"],
    ['Field "device_minor" is not a valid field to query.\n\n', "device_minor"],
    ["No devices were found", undefined],
  ])("parseUnknownField(%j) = %j", (text, field) => {
    expect(parseUnknownField(text)).toBe(field);
  });

  it.each([
    [
      "Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost. Reboot the system to recover this GPU",
      "00000000:02:00.0",
      "GPU is lost. Reboot the system to recover this GPU",
    ],
    [
      "Unable to determine the device handle for GPU 0000:0B:00.0: Unknown Error",
      "00000000:0B:00.0",
      "Unknown Error",
    ],
    [
      "Unable to determine the device handle for GPU0000:17:00.0: Unknown Error",
      "00000000:17:00.0",
      "Unknown Error",
    ],
    ["Unable to determine the device handle for GPU 0000:01:00.0", "00000000:01:00.0", ""],
  ])("parseLostGpu(%j)", (text, pciBusId, reason) => {
    expect(parseLostGpu(text)).toEqual({ pciBusId, reason });
  });

  it("parseLostGpu ignores other text", () => {
    expect(
      parseLostGpu("Failed to initialize NVML: Driver/library version mismatch"),
    ).toBeUndefined();
  });

  it.each([
    ["0000:0b:00.0", "00000000:0B:00.0"],
    ["00000009:01:00.0", "00000009:01:00.0"],
    ["not a bus id", "not a bus id"],
  ])("normalizePciBusId(%j) = %j", (raw, expected) => {
    expect(normalizePciBusId(raw)).toBe(expected);
  });

  it("message parsers never throw on arbitrary text", () => {
    fc.assert(
      fc.property(fc.string({ unit: "binary" }), (text) => {
        parseUnknownField(text);
        parseDriverVersion(text);
        parseLostGpu(text);
        normalizePciBusId(text);
      }),
    );
  });
});

describe("parseDriverVersion", () => {
  it.each([
    [fixture("nvidia-smi-version-590.txt"), "590.48.01"],
    ["NVIDIA-SMI version  : 470.256.02\nDRIVER version      : 580.95.05\n", "580.95.05"],
    ["ERROR: Option --version is not recognized", undefined],
    ["", undefined],
  ])("%j → %j", (text, version) => {
    expect(parseDriverVersion(text)).toBe(version);
  });
});

describe("parseComputeApps", () => {
  it("parses the H100 load capture (formats.md §1.8)", () => {
    const { value, problems } = parseComputeApps(fixture("compute-apps-h100-load.txt"));
    expect(problems).toEqual([]);
    expect(value.map((a) => [a.pid, a.processName, a.usedMemoryMiB])).toEqual([
      [11327, "/root/tools/memhog", 2566],
      [11328, "/root/tools/memhog", 1542],
      [11345, "./gpu_burn", 15690],
    ]);
  });

  it("keeps Windows paths with spaces and backslashes; [N/A] memory is unreported", () => {
    const { value } = parseComputeApps(fixture("compute-apps-windows.txt"));
    expect(value).toEqual([
      {
        gpuUuid: "GPU-00000000-0000-0000-0000-000000000000",
        pid: 2140,
        processName: "C:\\Windows\\System32\\dwm.exe",
      },
      {
        gpuUuid: "GPU-00000000-0000-0000-0000-000000000000",
        pid: 9912,
        processName: "C:\\Program Files\\Mozilla Firefox\\firefox.exe",
      },
    ]);
  });

  it("empty output (noheader, no processes) is no apps", () => {
    expect(parseComputeApps("")).toEqual({ value: [], problems: [] });
  });

  it("never throws on arbitrary text", () => {
    fc.assert(
      fc.property(fc.string({ unit: "binary" }), (text) => {
        for (const app of parseComputeApps(text).value)
          expect(Number.isInteger(app.pid)).toBe(true);
      }),
    );
  });
});
