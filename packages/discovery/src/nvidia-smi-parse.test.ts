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
  parseNvlinkStatus,
  parseSmiBitmask,
  parseSmiCell,
  parseSmiCount,
  parseSmiNumber,
  parseSmiYesNo,
  parseUnknownField,
  quoteBounded,
} from "./nvidia-smi-parse.js";
import { stripFixtureComments } from "./testing/index.js";

const FIELDS = GPU_QUERY_FIELDS.map((f) => f.field);
const fixture = (name: string) =>
  stripFixtureComments(readFileSync(new URL(`../test/fixtures/${name}`, import.meta.url), "utf8"));

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
    // health-formats.md §2.6: the third absence spelling (bare in `-q`, bracketed in CSV).
    ["Requested functionality has been deprecated", undefined, undefined],
    ["[Requested functionality has been deprecated]", undefined, undefined],
  ])("%j → cell %j, number %j", (raw, cell, number) => {
    expect(parseSmiCell(raw)).toBe(cell);
    expect(parseSmiNumber(raw)).toBe(number);
  });
});

describe("health cell parsers (health-formats.md §2.1, §2.6)", () => {
  it.each([
    ["Yes", true],
    ["No", false],
    [" No ", false],
    ["[N/A]", undefined],
    ["N/A", undefined],
    // `--query-remapped-rows` prints 0/1 (§2.3); `--query-gpu` prints Yes/No, which we query.
    ["1", undefined],
    ["Active", undefined],
    [undefined, undefined],
  ])("parseSmiYesNo(%j) = %j", (raw, expected) => {
    expect(parseSmiYesNo(raw)).toBe(expected);
  });

  it.each([
    ["0", 0],
    ["16", 16],
    ["2560", 2560],
    ["[N/A]", undefined],
    ["-1", undefined],
    ["1.5", undefined],
    ["16x", undefined],
    ["9999999999999999", undefined],
  ])("parseSmiCount(%j) = %j", (raw, expected) => {
    expect(parseSmiCount(raw)).toBe(expected);
  });

  it.each([
    ["0x0000000000000001", 0x1],
    ["0x0000000000000004", 0x4],
    ["0x00000000000001FF", 0x1ff],
    ["0x0000000000000000", 0],
    ["0xFFFFFFFFFFFFFFFF", undefined],
    ["0x00000000000000001", undefined],
    ["1", undefined],
    ["Not Active", undefined],
    ["[N/A]", undefined],
  ])("parseSmiBitmask(%j) = %j", (raw, expected) => {
    expect(parseSmiBitmask(raw)).toBe(expected);
  });

  it("quoteBounded keeps problem messages short", () => {
    expect(quoteBounded("abc")).toBe('"abc"');
    expect(quoteBounded("x".repeat(1000)).length).toBeLessThan(200);
  });

  it("health cell parsers never throw on arbitrary text", () => {
    fc.assert(
      fc.property(fc.string({ unit: "binary" }), (text) => {
        parseSmiYesNo(text);
        const count = parseSmiCount(text);
        if (count !== undefined) expect(Number.isSafeInteger(count)).toBe(true);
        const mask = parseSmiBitmask(text);
        if (mask !== undefined) expect(Number.isSafeInteger(mask)).toBe(true);
      }),
    );
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
    expect(problems[0]?.message).toContain("has 5 of 25 columns");
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

describe("parseGpuQuery health readings", () => {
  const H100_IDLE_HEALTH = {
    remappedRowsPending: false,
    remappedRowsFailure: false,
    remappedRowsCorrectable: 0,
    remappedRowsUncorrectable: 0,
    clocksEventReasonsActive: 0x1,
    pcieLinkGenCurrent: 5,
    pcieLinkGenMax: 5,
    pcieLinkWidthCurrent: 16,
    pcieLinkWidthMax: 16,
    recoveryAction: "None",
  };
  const fullRow = () => fixture("query-gpu-h100-idle-health.txt").trim();

  it("H100 idle (CAP 590.48.01 tokens): every health reading, [N/A] retired pages unset", () => {
    const { value, problems } = parseGpuQuery(fixture("query-gpu-h100-idle-health.txt"), FIELDS);
    expect(problems).toEqual([]);
    expect(value[0]?.health).toEqual(H100_IDLE_HEALTH);
    expect(value[0]?.utilizationPercent).toBe(0);
  });

  it("H100 MIG: remapped rows [N/A] and a shorter row: the GPU is kept, no health at all", () => {
    const { value, problems } = parseGpuQuery(fixture("query-gpu-h100-mig-health.txt"), FIELDS);
    expect(problems).toEqual([]);
    expect(value.map((r) => [r.index, r.migMode, r.memoryUsedMiB])).toEqual([
      [0, "Enabled", 11125],
    ]);
    expect(value[0]?.health).toBeUndefined();
  });

  // The regression DESIGN names: a driver too old for a trailing field prints fewer cells.
  // Cut the real row after every cell from the last required one (mig.mode.current, 11) on.
  it.each(Array.from({ length: 15 }, (_, i) => 11 + i))(
    "the real row cut to %i cells keeps the GPU with exactly those readings",
    (kept) => {
      const cut = `${fullRow().split(", ").slice(0, kept).join(", ")}\n`;
      const { value, problems } = parseGpuQuery(cut, FIELDS);
      expect(problems).toEqual([]);
      expect(value.map((r) => r.uuid)).toEqual(["GPU-00000000-0000-0000-0000-000000000000"]);
      // Same as asking only for the fields that were printed.
      expect(value[0]).toEqual(parseGpuQuery(cut, FIELDS.slice(0, kept)).value[0]);
      expect(value[0]?.utilizationPercent).toBe(kept >= 12 ? 0 : undefined);
      expect(value[0]?.health?.recoveryAction).toBe(kept === 25 ? "None" : undefined);
    },
  );

  it("a row cut inside the required cells is still skipped", () => {
    const cut = fullRow().split(", ").slice(0, 10).join(", ");
    const { value, problems } = parseGpuQuery(cut, FIELDS);
    expect(value).toEqual([]);
    expect(problems[0]?.message).toContain("has 10 of 25 columns");
  });

  it("a name containing ', ' in a shorter row is still joined at the bus id", () => {
    const { value } = parseGpuQuery(
      "0, GPU-aa, Weird, Name GPU, 1024, 0, 00000000:01:00.0, 8.0, 0, 30, 10.00, Disabled, 1, Yes\n",
      FIELDS,
    );
    expect(value[0]).toMatchObject({ name: "Weird, Name GPU", utilizationPercent: 1 });
    expect(value[0]?.health).toEqual({ remappedRowsPending: true });
  });

  const optional = GPU_QUERY_FIELDS.filter((f) => f.optional).map((f) => f.field);
  it.each(optional)("without %s (unknown to the tool) the rest still parse", (missing) => {
    const at = FIELDS.indexOf(missing);
    const cells = fullRow().split(", ");
    const row = cells.filter((_, i) => i !== at).join(", ");
    const { value, problems } = parseGpuQuery(
      row,
      FIELDS.filter((f) => f !== missing),
    );
    expect(problems).toEqual([]);
    const full = parseGpuQuery(fullRow(), FIELDS).value[0];
    const expectedMissing: Record<string, string> = {
      "remapped_rows.pending": "remappedRowsPending",
      "remapped_rows.failure": "remappedRowsFailure",
      "remapped_rows.correctable": "remappedRowsCorrectable",
      "remapped_rows.uncorrectable": "remappedRowsUncorrectable",
      "clocks_event_reasons.active": "clocksEventReasonsActive",
      "pcie.link.gen.gpucurrent": "pcieLinkGenCurrent",
      "pcie.link.gen.max": "pcieLinkGenMax",
      "pcie.link.width.current": "pcieLinkWidthCurrent",
      "pcie.link.width.max": "pcieLinkWidthMax",
      gpu_recovery_action: "recoveryAction",
    };
    const key = expectedMissing[missing];
    const health = { ...full?.health } as Record<string, unknown>;
    if (key !== undefined) delete health[key];
    expect(value[0]?.health).toEqual(health);
    if (missing === "compute_cap") expect(value[0]?.computeCapability).toBeUndefined();
    if (missing === "utilization.gpu") expect(value[0]?.utilizationPercent).toBeUndefined();
  });

  it("reads the old field names in place of the new ones", () => {
    const fields = FIELDS.map((f) =>
      f === "clocks_event_reasons.active"
        ? "clocks_throttle_reasons.active"
        : f === "pcie.link.gen.gpucurrent"
          ? "pcie.link.gen.current"
          : f,
    );
    const { value } = parseGpuQuery(fullRow(), fields);
    expect(value[0]?.health).toEqual(H100_IDLE_HEALTH);
  });
});

describe("parseNvlinkStatus (health-formats.md §2.4)", () => {
  it("H100, tab + space indent: 18 links, none inactive, matched by uuid", () => {
    expect(parseNvlinkStatus(fixture("nvlink-status-h100.txt"))).toEqual({
      gpus: [
        {
          index: 0,
          uuid: "GPU-00000000-0000-0000-0000-000000000000",
          linksTotal: 18,
          linksInactive: 0,
        },
      ],
      migUnsupported: false,
    });
  });

  it("V100, 9-space indent, two links <inactive>, masked uuid: matched by index", () => {
    expect(parseNvlinkStatus(fixture("nvlink-status-v100-inactive.txt"))).toEqual({
      gpus: [{ index: 3, linksTotal: 6, linksInactive: 2 }],
      migUnsupported: false,
    });
  });

  it("a GPU without NVLink prints nothing: no GPUs, not a refusal", () => {
    expect(parseNvlinkStatus("")).toEqual({ gpus: [], migUnsupported: false });
  });

  it("MIG: the refusal line, alone or under a header, leaves the GPU without a reading", () => {
    const line = "Nvlink queries are not supported for Devices in MIG mode";
    expect(parseNvlinkStatus(`${line}\n`)).toEqual({ gpus: [], migUnsupported: true });
    const h100 = fixture("nvlink-status-h100.txt");
    const header = h100.split("\n")[0] ?? "";
    expect(parseNvlinkStatus(`${header}\n${line}\n`)).toEqual({ gpus: [], migUnsupported: true });
  });

  it("two GPUs, CRLF line ends, a repeated link line counted once", () => {
    const v100 = fixture("nvlink-status-v100-inactive.txt");
    const h100 = fixture("nvlink-status-h100.txt");
    const text = `${h100}\t Link 17: 26.562 GB/s\n${v100}`.replace(/\n/g, "\r\n");
    expect(
      parseNvlinkStatus(text).gpus.map((g) => [g.index, g.linksTotal, g.linksInactive]),
    ).toEqual([
      [0, 18, 0],
      [3, 6, 2],
    ]);
  });

  it("never throws on arbitrary text", () => {
    fc.assert(
      fc.property(fc.string({ unit: "binary" }), (text) => {
        for (const gpu of parseNvlinkStatus(text).gpus) {
          expect(gpu.linksInactive).toBeLessThanOrEqual(gpu.linksTotal);
        }
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
    // health-formats.md §2.5, verbatim stdout (exit 15): no space after GPU, two after "lost.".
    [
      "Unable to determine the device handle for GPU0000:C3:00.0: GPU is lost.  Reboot the system to recover this GPU",
      "00000000:C3:00.0",
      "GPU is lost.  Reboot the system to recover this GPU",
    ],
  ])("parseLostGpu(%j)", (text, pciBusId, reason) => {
    expect(parseLostGpu(text)).toEqual({ pciBusId, reason });
  });

  it("parseLostGpu ignores other text", () => {
    expect(
      parseLostGpu("Failed to initialize NVML: Driver/library version mismatch"),
    ).toBeUndefined();
    // health-formats.md §2.5: names no GPU, so it is a node failure, not one lost GPU.
    expect(parseLostGpu("Failed to initialize NVML: Unknown Error")).toBeUndefined();
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
