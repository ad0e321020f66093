import { readFileSync } from "node:fs";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  applyKernelFaults,
  boundEvidence,
  classifyXid,
  createKernelFaultTracker,
  createXidAggregator,
  earlierBootNote,
  type KernelFaultEvent,
  type KernelLogRecord,
  MAX_FAULT_EVIDENCE_CHARS,
  type ParsedXid,
  parseFallenOffBus,
  parseKmsgRecord,
  parseWallClockMs,
  parseXid,
  pciBusKey,
  RECOVERY_ACTIONS,
  recordTimeMs,
  UNKNOWN_XID,
  XID_CATALOG,
  type XidAction,
} from "./kernel-log.js";
import { normalizePciBusId } from "./nvidia-smi-parse.js";
import { ProblemCodes } from "./problem-codes.js";
import { simulateInventory } from "./simulate.js";
import type { Gpu, GpuFault } from "./types.js";

// Every line below is copied verbatim from shared/reference/health-formats.md §1.1, §1.3, §1.5
// (sources cited there). None is invented.

describe("parseKmsgRecord", () => {
  it.each<[string, KernelLogRecord | undefined]>([
    // §1.1 KDOC example: a record with key/value continuation lines.
    [
      "7,160,424069,-;pci_root PNP0A03:00: host bridge window [io  0x0000-0x0cf7] (ignored)\n SUBSYSTEM=acpi\n DEVICE=+acpi:PNP0A03:00\n",
      {
        seq: 160,
        tsUsec: 424069,
        facility: 0,
        level: 7,
        message: "pci_root PNP0A03:00: host bridge window [io  0x0000-0x0cf7] (ignored)",
      },
    ],
    [
      "6,339,5140900,-;NET: Registered protocol family 10",
      {
        seq: 339,
        tsUsec: 5140900,
        facility: 0,
        level: 6,
        message: "NET: Registered protocol family 10",
      },
    ],
    // §1.1 GPUD pkg/kmsg/testdata/kmsg.1.log.
    [
      "6,3964,206764307,-;nvidia-nvswitch2: open (major=510)",
      {
        seq: 3964,
        tsUsec: 206764307,
        facility: 0,
        level: 6,
        message: "nvidia-nvswitch2: open (major=510)",
      },
    ],
    [
      "6,3973,227986636,-;IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
      {
        seq: 3973,
        tsUsec: 227986636,
        facility: 0,
        level: 6,
        message: "IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
      },
    ],
    // §1.1 other front-ends.
    [
      "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
      { tsUsec: 1843308145, message: "NVRM: The NVIDIA GPU 0000:b3:00.0" },
    ],
    [
      "[Sun Feb 23 16:24:18 2025] NVRM: GPU Board Serial Number: 1650124014249",
      { message: "NVRM: GPU Board Serial Number: 1650124014249" },
    ],
    [
      "kern  :warn  : 2025-01-21T04:41:44,283302+00:00 NVRM: Xid (PCI:0000:38:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Global Exception on (GPC 8, TPC 5, SM 1): Multiple Warp Errors",
      {
        facility: 0,
        level: 4,
        message:
          "NVRM: Xid (PCI:0000:38:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Global Exception on (GPC 8, TPC 5, SM 1): Multiple Warp Errors",
      },
    ],
    [
      "Feb 14 05:03:41 000-000-00000-1-gpu-1 kernel: mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link INIT",
      { message: "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link INIT" },
    ],
    // §1.3 syslog prefix followed by dmesg's monotonic stamp; bare `kernel: `.
    [
      "Dec  2 11:38:47 worker4 kernel: [  219.470994] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.",
      {
        tsUsec: 219470994,
        message:
          "NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.",
      },
    ],
    [
      "Dec 23 23:32:27 rescue kernel: [ 270.439207] NVRM: Xid (PCI:0000:01:00): 62, 0096(1c54) 00000000 00000000",
      {
        tsUsec: 270439207,
        message: "NVRM: Xid (PCI:0000:01:00): 62, 0096(1c54) 00000000 00000000",
      },
    ],
    [
      "kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
      {
        message:
          "NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
      },
    ],
    // §1.3 dmesg indents the rest of a multi-line record.
    [
      "               NVRM: (PCI ID: 10de:26b5) installed in this system has",
      { continuation: true, message: "NVRM: (PCI ID: 10de:26b5) installed in this system has" },
    ],
    // No prefix at all.
    ["NVRM: GPU Board Serial Number: 0", { message: "NVRM: GPU Board Serial Number: 0" }],
    ["", undefined],
    ["   \n", undefined],
    // A kmsg header with no text, and one whose sequence number does not fit a safe integer.
    ["6,1,2,-;", undefined],
    ["6,99999999999999999999,2,-;x", undefined],
  ])("%j", (line, expected) => {
    expect(parseKmsgRecord(line)).toEqual(expected);
  });

  it("ignores unknown header fields before ';' and decodes \\xNN escapes into one message", () => {
    // The header/escape grammar of KDOC applied to the verbatim R570 lines (§1.1: kmsg
    // delivers the multi-line record once, its newlines escaped).
    const text = [
      "NVRM: The NVIDIA GPU 0000:b3:00.0",
      "NVRM: (PCI ID: 10de:26b5) installed in this system has",
      "NVRM: fallen off the bus and is not responding to commands.",
    ].join("\\x0a");
    const record = parseKmsgRecord(`3,42,1843308145,-,future=1;${text}`);
    expect(record).toEqual({
      seq: 42,
      tsUsec: 1843308145,
      facility: 0,
      level: 3,
      message: text.replaceAll("\\x0a", "\n"),
    });
    expect(parseKmsgRecord("6,1,2,-;a\\x5cb")?.message).toBe("a\\b");
  });

  it("reports facility 1 for a record user space wrote to /dev/kmsg", () => {
    expect(parseKmsgRecord("12,5,6,-;NVRM: GPU Board Serial Number: 0")).toMatchObject({
      facility: 1,
      level: 4,
    });
  });
});

const xid = (fields: Partial<ParsedXid> & Pick<ParsedXid, "code" | "pciBusId" | "detail">) =>
  ({ kind: "xid", ...fields }) as ParsedXid;

// [verbatim message, expected parse (raw is checked separately)]
const REAL_LINES: [string, Omit<ParsedXid, "raw"> | undefined][] = [
  // §1.3, open-gpu-kernel-modules#1151.
  ["NVRM: GPU at PCI:0000:06:00: GPU-0b6b7808-c002-f593-ac86-cd8e57757b94", undefined],
  ["NVRM: GPU Board Serial Number: 0", undefined],
  [
    "NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.",
    xid({ code: 79, pciBusId: "00000000:06:00.0", detail: "GPU has fallen off the bus." }),
  ],
  ["NVRM: GPU 0000:06:00.0: GPU has fallen off the bus.", undefined],
  ["NVRM: GPU 0000:06:00.0: GPU serial number is 0.", undefined],
  ["NVRM: kgspRcAndNotifyAllChannels_IMPL: RC all channels for critical error 79.", undefined],
  // §1.3, NVSentinel#155.
  ["[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0", undefined],
  ["               NVRM: (PCI ID: 10de:26b5) installed in this system has", undefined],
  ["               NVRM: fallen off the bus and is not responding to commands.", undefined],
  ["[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).", undefined],
  // §1.3, other codes.
  [
    "[Sun Feb 23 16:24:18 2025] NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-b600-ac93-3616-d754b23d636d",
    undefined,
  ],
  [
    "[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).",
    xid({
      code: 119,
      pciBusId: "00000000:9B:00.0",
      pid: 2024380,
      processName: "nvidia-smi",
      detail:
        "Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).",
    }),
  ],
  [
    "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
    xid({
      code: 13,
      pciBusId: "00000000:CB:00.0",
      detail: "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
    }),
  ],
  [
    "[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
    xid({
      code: 109,
      pciBusId: "00000000:CB:00.0",
      pid: 1797828,
      processName: "pt_main_thread",
      detail: "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
    }),
  ],
  [
    "[  365.969681] NVRM: Xid (PCI:0000:01:00): 31, pid=13705, name=UnrealEditor, channel 0x0000000c, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC2 GPCCLIENT_PROP_0 faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    xid({
      code: 31,
      pciBusId: "00000000:01:00.0",
      pid: 13705,
      processName: "UnrealEditor",
      detail:
        "channel 0x0000000c, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC2 GPCCLIENT_PROP_0 faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    }),
  ],
  [
    "NVRM: Xid (PCI:0000:01:00): 31, Ch 0000005a, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_1 faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ",
    xid({
      code: 31,
      pciBusId: "00000000:01:00.0",
      detail:
        "Ch 0000005a, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_1 faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ",
    }),
  ],
  [
    "Dec  2 11:38:47 worker4 kernel: [  219.470994] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.",
    xid({
      code: 48,
      pciBusId: "00000000:07:00.0",
      detail:
        "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.",
    }),
  ],
  [
    "Dec  2 11:38:47 worker4 kernel: [  219.471050] NVRM: Xid (PCI:0000:07:00): 64, pid='<unknown>', name=<unknown>, Dynamic Page Retirement: Blacklisting failed.  Page should have been blacklisted on boot(0x00000000007fffa8).",
    xid({
      code: 64,
      pciBusId: "00000000:07:00.0",
      detail:
        "Dynamic Page Retirement: Blacklisting failed.  Page should have been blacklisted on boot(0x00000000007fffa8).",
    }),
  ],
  [
    "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
    xid({
      code: 63,
      pciBusId: "00000000:10:1C.0",
      pid: 1896,
      detail: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    }),
  ],
  [
    "kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
    xid({
      code: 45,
      pciBusId: "00000000:DC:00.0",
      pid: 1818990,
      processName: "python3",
      detail: "Ch 00000001 caused by previous Xid 149",
      causedByXid: 149,
    }),
  ],
  [
    "[605633.376794] NVRM: Xid (PCI:0000:06:00): 120, GSP task exception: store access page fault (cause:0xf) @ pc:0x13ebd80, partition:2#0, task:3",
    xid({
      code: 120,
      pciBusId: "00000000:06:00.0",
      detail:
        "GSP task exception: store access page fault (cause:0xf) @ pc:0x13ebd80, partition:2#0, task:3",
    }),
  ],
  [
    "Dec 23 23:32:27 rescue kernel: [ 270.439207] NVRM: Xid (PCI:0000:01:00): 62, 0096(1c54) 00000000 00000000",
    xid({ code: 62, pciBusId: "00000000:01:00.0", detail: "0096(1c54) 00000000 00000000" }),
  ],
  [
    "[449410.332316] NVRM: Xid (PCI:0003:00:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    xid({
      code: 74,
      pciBusId: "00000003:00:00.0",
      detail: "NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    }),
  ],
  [
    "[171167.620236] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
    xid({
      code: 149,
      pciBusId: "00000009:01:00.0",
      detail:
        "NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
      fatal: true,
    }),
  ],
  [
    "[171167.621162] NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
    xid({
      code: 154,
      pciBusId: "00000009:01:00.0",
      detail: "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
      recoveryAction: 4,
    }),
  ],
  [
    "[171167.897562] NVRM: Xid (PCI:0019:01:00): 154, GPU recovery action changed from 0x4 (Drain and Reset) to 0x1 (GPU Reset Required)",
    xid({
      code: 154,
      pciBusId: "00000019:01:00.0",
      detail: "GPU recovery action changed from 0x4 (Drain and Reset) to 0x1 (GPU Reset Required)",
      recoveryAction: 1,
    }),
  ],
  [
    "NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)",
    xid({
      code: 145,
      pciBusId: "00000018:01:00.0",
      detail:
        "RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)",
      fatal: false,
    }),
  ],
  // §1.3 Xid 94/95 format from the driver source (DRV), quotes stripped.
  [
    "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
    xid({
      code: 94,
      pciBusId: "00000000:01:00.0",
      gpuInstance: "05",
      pid: 7194,
      detail: "Contained: CE User Channel (0x9). RST: No, D-RST: No",
      resetRequired: false,
      drainAndResetRequired: false,
    }),
  ],
  [
    "NVRM: Xid (PCI:0000:01:00): 94, pid=7062, Contained: CE User Channel (0x9). RST: No, D-RST: No",
    xid({
      code: 94,
      pciBusId: "00000000:01:00.0",
      pid: 7062,
      detail: "Contained: CE User Channel (0x9). RST: No, D-RST: No",
      resetRequired: false,
      drainAndResetRequired: false,
    }),
  ],
  [
    "NVRM: Xid (PCI:0000:01:00): 95, pid=7062, Uncontained: LTC TAG (0x2, 0x1). RST: Yes, D-RST: No",
    xid({
      code: 95,
      pciBusId: "00000000:01:00.0",
      pid: 7062,
      detail: "Uncontained: LTC TAG (0x2, 0x1). RST: Yes, D-RST: No",
      resetRequired: true,
      drainAndResetRequired: false,
    }),
  ],
  // §1.1 decode front-end (Xid 13 at warn).
  [
    "kern  :warn  : 2025-01-21T04:41:44,283302+00:00 NVRM: Xid (PCI:0000:38:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Global Exception on (GPC 8, TPC 5, SM 1): Multiple Warp Errors",
    xid({
      code: 13,
      pciBusId: "00000000:38:00.0",
      detail: "Graphics SM Global Exception on (GPC 8, TPC 5, SM 1): Multiple Warp Errors",
    }),
  ],
  // §1.1 non-NVRM noise.
  [
    "Feb 14 05:03:41 000-000-00000-1-gpu-1 kernel: mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link INIT",
    undefined,
  ],
  ["6,3964,206764307,-;nvidia-nvswitch2: open (major=510)", undefined],
  // §1.5 SXid.
  [
    "[73309.599396] nvidia-nvswitch0: SXid (PCI:0000:06:00.0): 20009, Non-fatal, Link 04 RX Short Error Rate",
    {
      kind: "sxid",
      code: 20009,
      pciBusId: "00000000:06:00.0",
      detail: "Non-fatal, Link 04 RX Short Error Rate",
      fatal: false,
    },
  ],
  [
    "[ 1108.858286] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout error (First)",
    {
      kind: "sxid",
      code: 24007,
      pciBusId: "00000000:C3:00.0",
      detail: "Fatal, Link 28 sourcetrack timeout error (First)",
      fatal: true,
    },
  ],
  [
    "[131453.740743] nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
    {
      kind: "sxid",
      code: 20034,
      pciBusId: "00000000:00:00.0",
      detail: "Fatal, Link 30 LTSSM Fault Up",
      fatal: true,
    },
  ],
  [
    "nvidia-nvswitch0: SXid (PCI:0004:00:00.0): 26006, SOE HALTED",
    { kind: "sxid", code: 26006, pciBusId: "00000004:00:00.0", detail: "SOE HALTED" },
  ],
  [
    "[131453.740758] nvidia-nvswitch0: SXid (PCI:0000:a9:00.0): 20034, Data {0x50610002, 0x10100030}",
    {
      kind: "sxid",
      code: 20034,
      pciBusId: "00000000:A9:00.0",
      detail: "Data {0x50610002, 0x10100030}",
    },
  ],
];

describe("parseXid over every real line in the reference", () => {
  it.each(REAL_LINES)("%s", (line, expected) => {
    // Both as given (parseXid tolerates any prefix) and after the record parser strips it.
    const direct = parseXid(line);
    const viaRecord = parseXid(parseKmsgRecord(line)?.message ?? "");
    if (expected === undefined) {
      expect(direct).toBeUndefined();
      expect(viaRecord).toBeUndefined();
      return;
    }
    expect(direct).toEqual({ ...expected, raw: line });
    expect(viaRecord).toEqual({ ...expected, raw: parseKmsgRecord(line)!.message });
  });

  it("reads the same Xid from a kmsg record of the line (kmsg prefix `4,` for Xid 13)", () => {
    const message =
      "NVRM: Xid (PCI:0000:38:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Global Exception on (GPC 8, TPC 5, SM 1): Multiple Warp Errors";
    const record = parseKmsgRecord(`4,1001,2000,-;${message}`)!;
    expect(record.level).toBe(4);
    expect(parseXid(record.message)).toMatchObject({ code: 13, pciBusId: "00000000:38:00.0" });
  });

  it("parses the old form without `PCI:` (§1.2: `Xid (0000:01:00): 31, …`)", () => {
    // Built from the verbatim 418-driver line above with the `PCI:` removed, as §1.2 describes.
    const line =
      "NVRM: Xid (0000:01:00): 31, Ch 0000005a, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_1 faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ";
    expect(parseXid(line)).toMatchObject({ kind: "xid", code: 31, pciBusId: "00000000:01:00.0" });
  });

  it.each([
    // §1.6: `pid=<unknown>` unquoted, and `name=` holding `:` and `[]`.
    [
      "NVRM: Xid (PCI:0000:cb:00): 13, pid=<unknown>, name=nvc:[driver], Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
      {
        processName: "nvc:[driver]",
        detail: "Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
      },
    ],
  ])("tolerates the §1.6 field spellings: %s", (line, fields) => {
    const parsed = parseXid(line)!;
    expect(parsed).toMatchObject(fields);
    expect(parsed.pid).toBeUndefined();
  });
});

describe("parseFallenOffBus", () => {
  it("finds the single-line message, and the R570 record once its lines are joined", () => {
    expect(parseFallenOffBus("NVRM: GPU 0000:06:00.0: GPU has fallen off the bus.")).toEqual({
      pciBusId: "00000000:06:00.0",
      raw: "NVRM: GPU 0000:06:00.0: GPU has fallen off the bus.",
    });
    const lines = [
      "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
      "               NVRM: (PCI ID: 10de:26b5) installed in this system has",
      "               NVRM: fallen off the bus and is not responding to commands.",
    ].map((line) => parseKmsgRecord(line)!);
    expect(lines.map((r) => r.continuation === true)).toEqual([false, true, true]);
    const joined = lines.map((r) => r.message).join("\n");
    expect(parseFallenOffBus(joined)?.pciBusId).toBe("00000000:B3:00.0");
    expect(parseFallenOffBus(lines[0]!.message)).toBeUndefined();
    expect(parseFallenOffBus("NVRM: GPU 0000:06:00.0: GPU serial number is 0.")).toBeUndefined();
    expect(
      parseFallenOffBus("[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s)."),
    ).toBeUndefined();
  });
});

describe("pciBusKey", () => {
  it.each([
    ["PCI:0000:9b:00", "00000000:9B:00.0"],
    ["0000:9b:00", "00000000:9B:00.0"],
    ["00000000:9B:00.0", "00000000:9B:00.0"],
    ["0000:9b:00.0", "00000000:9B:00.0"],
    ["PCI:0009:01:00", "00000009:01:00.0"],
    ["0000:10:1c", "00000000:10:1C.0"],
    ["0000:c3:00.0", "00000000:C3:00.0"],
    ["GPU-0b6b7808", undefined],
    ["", undefined],
  ])("%j → %j", (id, key) => {
    expect(pciBusKey(id)).toBe(key);
  });

  it("gives the Xid line's BDF the key nvidia-smi's pci.bus_id gets from normalizePciBusId", () => {
    const fromXid = parseXid(
      "[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).",
    )!.pciBusId;
    expect(fromXid).toBe(normalizePciBusId("00000000:9B:00.0"));
    expect(pciBusKey(normalizePciBusId("00000000:9B:00.0"))).toBe(fromXid);
  });
});

describe("XID_CATALOG and classifyXid", () => {
  // NVIDIA's immediate action per code, reference §1.4 (and "also seen" 109, 136, 143).
  it.each<[number, string, XidAction]>([
    [13, "RESTART_APP", "restart-engine"],
    [31, "RESTART_APP", "restart-engine"],
    [43, "IGNORE", "ignore"],
    [45, "WORKFLOW_XID_45", "restart-engine"],
    [48, "WORKFLOW_XID_48", "reset-gpu"],
    [61, "CONTACT_SUPPORT", "drain-node"],
    [62, "RESET_GPU", "reset-gpu"],
    [63, "IGNORE", "ignore"],
    [64, "RESET_GPU", "reset-gpu"],
    [74, "WORKFLOW_NVLINK_ERR", "reset-gpu"],
    [79, "RESTART_BM", "reboot"],
    [92, "IGNORE", "ignore"],
    [94, "RESTART_APP", "restart-engine"],
    [95, "RESET_GPU", "reset-gpu"],
    [109, "RESET_GPU", "reset-gpu"],
    [119, "RESET_GPU", "reset-gpu"],
    [120, "RESET_GPU", "reset-gpu"],
    [136, "RESET_GPU", "reset-gpu"],
    [140, "RESET_GPU", "reset-gpu"],
    [143, "RESET_GPU", "reset-gpu"],
    ...[144, 145, 146, 147, 148, 149, 150].map((code): [number, string, XidAction] => [
      code,
      "WORKFLOW_NVLINK5_ERR",
      "reset-gpu",
    ]),
    [154, "XID_154", "drain-node"],
  ])("Xid %i: NVIDIA %s → %s", (code, nvidiaAction, action) => {
    expect(XID_CATALOG.get(code)).toMatchObject({ nvidiaAction, action });
    if (code !== 154) {
      expect(classifyXid(xid({ code, pciBusId: "00000000:01:00.0", detail: "" }))).toBe(action);
    }
  });

  it("classifies every real Xid line by its catalog entry", () => {
    const actions = REAL_LINES.flatMap(([line]) => {
      const parsed = parseXid(line);
      return parsed ? [`${parsed.kind} ${parsed.code} ${classifyXid(parsed)}`] : [];
    });
    expect(actions).toEqual([
      "xid 79 reboot",
      "xid 119 reset-gpu",
      "xid 13 restart-engine",
      "xid 109 reset-gpu",
      "xid 31 restart-engine",
      "xid 31 restart-engine",
      "xid 48 reset-gpu",
      "xid 64 reset-gpu",
      "xid 63 ignore",
      "xid 45 restart-engine",
      "xid 120 reset-gpu",
      "xid 62 reset-gpu",
      "xid 74 reset-gpu",
      "xid 149 reset-gpu",
      // Xid 154 acts on the new recovery action in the line: 0x4 Drain and Reset, 0x1 GPU reset.
      "xid 154 reset-gpu",
      "xid 154 reset-gpu",
      "xid 145 reset-gpu",
      "xid 94 restart-engine",
      "xid 94 restart-engine",
      "xid 95 reset-gpu",
      "xid 13 restart-engine",
      "sxid 20009 ignore",
      "sxid 24007 drain-node",
      "sxid 20034 drain-node",
      "sxid 26006 drain-node",
      "sxid 20034 ignore",
    ]);
  });

  it("maps every Xid 154 recovery action value, and an unknown one conservatively", () => {
    const at = (recoveryAction: number | undefined) =>
      classifyXid(
        xid({
          code: 154,
          pciBusId: "00000009:01:00.0",
          detail: "",
          ...(recoveryAction === undefined ? {} : { recoveryAction }),
        }),
      );
    expect([0, 1, 2, 3, 4, 5, 6, 7].map(at)).toEqual([
      "ignore",
      "reset-gpu",
      "reboot",
      "drain-node",
      "reset-gpu",
      "drain-node",
      "reset-gpu",
      "reboot",
    ]);
    expect(RECOVERY_ACTIONS.size).toBe(8);
    expect(at(9)).toBe("drain-node");
    expect(at(undefined)).toBe("drain-node");
  });

  it("fails closed on the GPU for a code not in the catalog", () => {
    expect(XID_CATALOG.has(160)).toBe(false);
    expect(classifyXid(xid({ code: 160, pciBusId: "00000000:01:00.0", detail: "" }))).toBe(
      UNKNOWN_XID.action,
    );
    expect(UNKNOWN_XID.action).toBe("reset-gpu");
  });
});

describe("createXidAggregator", () => {
  const XID_13 =
    "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter";
  const XID_109 =
    "[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005";

  it("folds a burst of 100 Xid 13 lines into one fault with a count", () => {
    let now = 1_000;
    const agg = createXidAggregator({ windowMs: 5_000, clock: () => now });
    const opened: boolean[] = [];
    for (let i = 0; i < 100; i++) {
      opened.push(agg.add(parseXid(XID_13)!).opened);
      now += 10;
    }
    const faults = agg.faults();
    expect(faults).toHaveLength(1);
    expect(faults[0]).toMatchObject({
      key: "xid:00000000:CB:00.0:13",
      code: 13,
      pciBusId: "00000000:CB:00.0",
      action: "restart-engine",
      count: 100,
      total: 100,
      bursts: 1,
      firstSeenMs: 1_000,
      lastSeenMs: 1_990,
    });
    expect(opened.filter(Boolean)).toHaveLength(1);
  });

  it("keeps codes and GPUs apart, opens a new burst after a quiet window, and never expires", () => {
    let now = 0;
    const agg = createXidAggregator({ windowMs: 1_000, clock: () => now });
    agg.add(parseXid(XID_13)!);
    agg.add(parseXid(XID_109)!);
    now = 999;
    expect(agg.add(parseXid(XID_13)!).opened).toBe(false);
    now = 1_999;
    const again = agg.add(parseXid(XID_13)!);
    expect(again.opened).toBe(true);
    expect(again.fault).toMatchObject({ count: 1, total: 3, bursts: 2, burstStartMs: 1_999 });
    now = 10_000_000;
    expect(agg.faults().map((f) => `${f.code} ${f.action}`)).toEqual([
      "13 restart-engine",
      "109 reset-gpu",
    ]);
  });

  it("takes each Xid 154's new action and forgets a GPU's faults only when told", () => {
    const agg = createXidAggregator({ windowMs: 60_000, clock: () => 0 });
    const first = REAL_LINES.find(([line]) => line.includes("to 0x4 (Drain and Reset)"))![0];
    agg.add(parseXid(first)!, 1);
    expect(agg.add(parseXid(first)!, 2).fault).toMatchObject({ count: 2, action: "reset-gpu" });
    agg.add(
      parseXid(
        "[171167.620236] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
      )!,
      3,
    );
    agg.add(parseXid(XID_13)!, 4);
    expect(agg.clear("0009:01:00")).toBe(2);
    expect(agg.faults().map((f) => f.key)).toEqual(["xid:00000000:CB:00.0:13"]);
  });

  it("forgets ignore, then restart-engine faults past maxFaults, before one that takes a GPU out", () => {
    const agg = createXidAggregator({ maxFaults: 2, clock: () => 0 });
    const line = (code: number) => REAL_LINES.find(([l]) => l.includes(`): ${code}, `))![0];
    agg.add(parseXid(line(48))!, 1); // reset-gpu, the stalest
    agg.add(parseXid(XID_13)!, 2); // restart-engine
    // Full: the ignore fault goes, even though it is the newest.
    expect(agg.add(parseXid(line(63))!, 3).evicted).toMatchObject({ code: 63 });
    expect(agg.faults().map((f) => f.code)).toEqual([48, 13]);
    expect(agg.add(parseXid(line(79))!, 4).evicted).toMatchObject({ code: 13 }); // reboot in
    expect(agg.faults().map((f) => f.code)).toEqual([48, 79]);
    expect(agg.evictions()).toEqual({ total: 2, unhealthy: 0 });
    // Every fault takes a GPU out: the stalest goes, and the count says so.
    agg.add(parseXid(XID_109)!, 5);
    expect(agg.faults().map((f) => f.code)).toEqual([79, 109]);
    expect(agg.evictions()).toMatchObject({ total: 3, unhealthy: 1, lastUnhealthy: { code: 48 } });
  });
});

describe("a fault's action over its records", () => {
  // §1.5 lists the two 20034 lines from different captures (switches a9 and 00); the driver
  // prints the `Data {…}` line right after the record it repeats, on the same switch, so the
  // Data line is moved onto the Fatal line's switch here.
  const FATAL_20034 =
    "[131453.740743] nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 LTSSM Fault Up";
  const DATA_20034 =
    "[131453.740758] nvidia-nvswitch0: SXid (PCI:0000:a9:00.0): 20034, Data {0x50610002, 0x10100030}".replace(
      "PCI:0000:a9:00.0",
      "PCI:0000:00:00.0",
    );

  it("keeps a fatal SXid drain-node through its own Data {…} line", () => {
    const tracker = createKernelFaultTracker({ clock: () => 0 });
    expect(tracker.add(FATAL_20034, true).map((e) => e.kind)).toEqual(["opened"]);
    expect(tracker.add(DATA_20034, true)).toEqual([]); // no action-changed to ignore
    expect(tracker.faults()).toMatchObject([
      { kind: "sxid", code: 20034, action: "drain-node", count: 2 },
    ]);
    const { gpus } = applyKernelFaults([gpuAt(0, OTHER_BUS)], tracker.faults());
    expect(gpus[0]!.healthy).toBe(false);
  });

  it("raises a fault to its most severe record, and lets only Xid 154 replace it", () => {
    const agg = createXidAggregator({ clock: () => 0 });
    const xid94 = parseXid(
      "NVRM: Xid (PCI:0000:01:00): 94, pid=7062, Contained: CE User Channel (0x9). RST: No, D-RST: No",
    )!;
    agg.add({ ...xid94, resetRequired: true }, 1);
    expect(agg.add(xid94, 2).fault.action).toBe("reset-gpu"); // the milder repeat keeps it
    // Xid 154 carries the driver's current recovery action: it replaces, lower too. The 154
    // fault says nothing else; the Xid 149 that caused it keeps its own action.
    const to4 = parseXid(REAL_LINES.find(([l]) => l.includes("to 0x4 (Drain and Reset)"))![0])!;
    agg.add(
      parseXid(
        "[171167.620236] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
      )!,
      3,
    );
    expect(agg.add({ ...to4, recoveryAction: 2 }, 4).fault.action).toBe("reboot");
    const lowered = agg.add(to4, 5);
    expect(lowered).toMatchObject({ previousAction: "reboot", fault: { action: "reset-gpu" } });
    expect(agg.add({ ...to4, recoveryAction: 0 }, 6).fault.action).toBe("ignore");
    expect(agg.find("xid", "00000009:01:00.0", 149)!.action).toBe("reset-gpu");
  });
});

describe("the driver's reset verdict (Xid 94/95 RST / D-RST)", () => {
  // §1.3, DRV: the three lines the driver's comment gives.
  const DRV = [
    "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
    "NVRM: Xid (PCI:0000:01:00): 94, pid=7062, Contained: CE User Channel (0x9). RST: No, D-RST: No",
    "NVRM: Xid (PCI:0000:01:00): 95, pid=7062, Uncontained: LTC TAG (0x2, 0x1). RST: Yes, D-RST: No",
  ];

  it("keeps RST: No at the catalog's action and RST: Yes at reset-gpu or worse", () => {
    expect(DRV.map((l) => classifyXid(parseXid(l)!))).toEqual([
      "restart-engine",
      "restart-engine",
      "reset-gpu",
    ]);
  });

  it("raises a 94 that says RST: Yes or D-RST: Yes to reset-gpu, never lowers a worse catalog action", () => {
    // No capture of a 94 with `Yes` exists in the reference; the flags are the parsed fields
    // of the verbatim 94 line, set as the driver's format (`RST: %s, D-RST: %s`) allows.
    const xid94 = parseXid(DRV[1]!)!;
    expect(classifyXid({ ...xid94, resetRequired: true })).toBe("reset-gpu");
    expect(classifyXid({ ...xid94, drainAndResetRequired: true })).toBe("reset-gpu");
    const xid79 = parseXid("NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.")!;
    expect(classifyXid({ ...xid79, resetRequired: true })).toBe("reboot");
  });
});

describe("forged fault records", () => {
  // The Xid 48 line is verbatim (§1.3); each forgery puts its text where the driver's is not.
  const XID_48_TEXT =
    "NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.";
  const XID_79_TEXT = "NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.";
  it.each([
    // A user process (tag `alice`) logging through syslog, with and without a fake stamp.
    `Dec  2 11:38:47 worker4 alice: ${XID_48_TEXT}`,
    `Dec  2 11:38:47 worker4 alice: [  219.470994] ${XID_48_TEXT}`,
    // A kernel record whose text merely contains the words (a USB product string).
    `6,1200,5000000,-;usb 1-1: Product: ${XID_79_TEXT}`,
    `[  219.470994] usb 1-1: Product: ${XID_79_TEXT}`,
    "6,1201,5000001,-;usb 1-1: Product: NVRM: GPU 0000:06:00.0: GPU has fallen off the bus.",
    "[  219.470994] usb 1-1: Manufacturer: nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout error (First)",
  ])("opens no fault: %s", (line) => {
    expect(parseXid(line)).toBeUndefined();
    expect(parseFallenOffBus(line)).toBeUndefined();
    const tracker = createKernelFaultTracker({ clock: () => 0 });
    expect(tracker.add(line, true)).toEqual([]);
    expect(tracker.faults()).toEqual([]);
  });

  it("still reads the real syslog form with a stamp after `kernel: ` (§1.3 Xid 48)", () => {
    const tracker = createKernelFaultTracker({ clock: () => 0 });
    tracker.add(`Dec  2 11:38:47 worker4 kernel: [  219.470994] ${XID_48_TEXT}`, true);
    expect(tracker.faults()).toMatchObject([{ code: 48, action: "reset-gpu" }]);
  });
});

describe("property: arbitrary input", () => {
  const text = fc.oneof(
    fc.string({ unit: "binary" }),
    fc.string({ unit: "grapheme-ascii" }),
    fc
      .tuple(
        fc.constantFrom("", "6,1,2,-;", "[ 1.5] ", "kernel: ", "NVRM: Xid (PCI:", "SXid ("),
        fc.string({ unit: "grapheme-ascii" }),
      )
      .map(([head, tail]) => head + tail),
    fc.uint8Array().map((bytes) => new TextDecoder().decode(bytes)),
  );

  it("parseKmsgRecord never throws and returns a well-formed record or undefined", () => {
    fc.assert(
      fc.property(text, (line) => {
        const record = parseKmsgRecord(line);
        if (record === undefined) return;
        expect(record.message.trim()).not.toBe("");
        for (const n of [record.seq, record.tsUsec, record.facility, record.level]) {
          if (n !== undefined) expect(Number.isSafeInteger(n) && n >= 0).toBe(true);
        }
      }),
      { numRuns: 2_000 },
    );
  });

  it("parseXid and parseFallenOffBus never throw and return well-formed results or undefined", () => {
    fc.assert(
      fc.property(text, (message) => {
        const parsed = parseXid(message);
        if (parsed !== undefined) {
          expect(["xid", "sxid"]).toContain(parsed.kind);
          expect(Number.isSafeInteger(parsed.code)).toBe(true);
          expect(parsed.pciBusId).toMatch(/^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$/);
          expect(typeof parsed.detail).toBe("string");
          expect(parsed.raw).toBe(message);
          if (parsed.pid !== undefined) expect(Number.isSafeInteger(parsed.pid)).toBe(true);
          expect(typeof classifyXid(parsed)).toBe("string");
        }
        const fallen = parseFallenOffBus(message);
        if (fallen !== undefined) expect(fallen.pciBusId).toMatch(/^[0-9A-F]{8}:/);
      }),
      { numRuns: 2_000 },
    );
  });
});

describe("purity", () => {
  it("kernel-log.ts and what it imports stay free of node: modules", () => {
    for (const file of ["kernel-log.ts", "nvidia-smi-parse.ts", "problem-codes.ts", "types.ts"]) {
      const source = readFileSync(new URL(`./${file}`, import.meta.url), "utf8");
      expect(source, file).not.toMatch(/from "node:/);
    }
  });
});

// ---- The tracker (records → faults) and applyKernelFaults (faults → GPU health). Every line is
// verbatim from health-formats.md §1.3 / §1.5 (sources there), or the driver's own format
// comment for Xid 94/95 (§1.3, DRV). The reference has no real Xid 43 line, so 43 is covered by
// the catalog table above only.

const baseGpu = simulateInventory("1xh100-80g", { hostname: "faults" }).gpus[0]!;
const gpuAt = (index: number, pciBusId: string): Gpu => ({ ...baseGpu, index, pciBusId });
/** A bus no line in the reference names. */
const OTHER_BUS = "00000000:AA:00.0";

interface FaultCase {
  title: string;
  lines: string[];
  kind: GpuFault["kind"];
  code: number;
  action: XidAction;
  /** The GPU the line names (absent for an SXid: the record names the switch). */
  bus?: string;
  /** Whether the GPU the line names stays healthy, and whether the other GPU does. */
  healthy: boolean;
  othersHealthy: boolean;
}

const FAULT_CASES: FaultCase[] = [
  {
    title: "Xid 13 restarts the engine, health unchanged",
    lines: [
      "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter",
    ],
    kind: "xid",
    code: 13,
    action: "restart-engine",
    bus: "00000000:CB:00.0",
    healthy: true,
    othersHealthy: true,
  },
  {
    title: "Xid 31 restarts the engine",
    lines: [
      "[  365.969681] NVRM: Xid (PCI:0000:01:00): 31, pid=13705, name=UnrealEditor, channel 0x0000000c, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC2 GPCCLIENT_PROP_0 faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    ],
    kind: "xid",
    code: 31,
    action: "restart-engine",
    bus: "00000000:01:00.0",
    healthy: true,
    othersHealthy: true,
  },
  {
    title: "Xid 45 restarts the engine",
    lines: [
      "kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149",
    ],
    kind: "xid",
    code: 45,
    action: "restart-engine",
    bus: "00000000:DC:00.0",
    healthy: true,
    othersHealthy: true,
  },
  {
    title: "Xid 48 (double-bit ECC) takes the GPU out",
    lines: [
      "Dec  2 11:38:47 worker4 kernel: [  219.470994] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.",
    ],
    kind: "xid",
    code: 48,
    action: "reset-gpu",
    bus: "00000000:07:00.0",
    healthy: false,
    othersHealthy: true,
  },
  {
    title: "Xid 63 (row remap event) is informational",
    lines: [
      "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
    ],
    kind: "xid",
    code: 63,
    action: "ignore",
    bus: "00000000:10:1C.0",
    healthy: true,
    othersHealthy: true,
  },
  {
    title: "Xid 64 (remap failure) takes the GPU out",
    lines: [
      "Dec  2 11:38:47 worker4 kernel: [  219.471050] NVRM: Xid (PCI:0000:07:00): 64, pid='<unknown>', name=<unknown>, Dynamic Page Retirement: Blacklisting failed.  Page should have been blacklisted on boot(0x00000000007fffa8).",
    ],
    kind: "xid",
    code: 64,
    action: "reset-gpu",
    bus: "00000000:07:00.0",
    healthy: false,
    othersHealthy: true,
  },
  {
    title: "Xid 74 (NVLink) takes the GPU out",
    lines: [
      "[449410.332316] NVRM: Xid (PCI:0003:00:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    ],
    kind: "xid",
    code: 74,
    action: "reset-gpu",
    bus: "00000003:00:00.0",
    healthy: false,
    othersHealthy: true,
  },
  {
    title: "Xid 79 (fallen off the bus) reboots the node: every GPU out",
    lines: ["NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus."],
    kind: "xid",
    code: 79,
    action: "reboot",
    bus: "00000000:06:00.0",
    healthy: false,
    othersHealthy: false,
  },
  {
    title: "Xid 94 (contained ECC) restarts the engine",
    lines: [
      "NVRM: Xid (PCI:0000:01:00): 94, pid=7062, Contained: CE User Channel (0x9). RST: No, D-RST: No",
    ],
    kind: "xid",
    code: 94,
    action: "restart-engine",
    bus: "00000000:01:00.0",
    healthy: true,
    othersHealthy: true,
  },
  {
    title: "Xid 95 (uncontained ECC) takes the GPU out",
    lines: [
      "NVRM: Xid (PCI:0000:01:00): 95, pid=7062, Uncontained: LTC TAG (0x2, 0x1). RST: Yes, D-RST: No",
    ],
    kind: "xid",
    code: 95,
    action: "reset-gpu",
    bus: "00000000:01:00.0",
    healthy: false,
    othersHealthy: true,
  },
  {
    title: "Xid 119 (GSP RPC timeout) takes the GPU out",
    lines: [
      "[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).",
    ],
    kind: "xid",
    code: 119,
    action: "reset-gpu",
    bus: "00000000:9B:00.0",
    healthy: false,
    othersHealthy: true,
  },
  {
    title: "Xid 120 (GSP error) takes the GPU out",
    lines: [
      "[605633.376794] NVRM: Xid (PCI:0000:06:00): 120, GSP task exception: store access page fault (cause:0xf) @ pc:0x13ebd80, partition:2#0, task:3",
    ],
    kind: "xid",
    code: 120,
    action: "reset-gpu",
    bus: "00000000:06:00.0",
    healthy: false,
    othersHealthy: true,
  },
  {
    title: "Xid 154 acts on the new recovery action (drain and reset → the GPU out)",
    lines: [
      "[171167.621162] NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
    ],
    kind: "xid",
    code: 154,
    action: "reset-gpu",
    bus: "00000009:01:00.0",
    healthy: false,
    othersHealthy: true,
  },
  {
    title: "a fatal SXid drains the node: every GPU out",
    lines: [
      "[ 1108.858286] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 28 sourcetrack timeout error (First)",
    ],
    kind: "sxid",
    code: 24007,
    action: "drain-node",
    healthy: false,
    othersHealthy: false,
  },
  {
    title: "fallen off the bus without any Xid (R570, one record over three dmesg lines)",
    lines: [
      "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
      "               NVRM: (PCI ID: 10de:26b5) installed in this system has",
      "               NVRM: fallen off the bus and is not responding to commands.",
      "[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).",
    ],
    kind: "fallen-off-bus",
    code: 79,
    action: "reboot",
    bus: "00000000:B3:00.0",
    healthy: false,
    othersHealthy: false,
  },
];

describe("createKernelFaultTracker + applyKernelFaults over every fault class", () => {
  it.each(FAULT_CASES)("$title", (c) => {
    const tracker = createKernelFaultTracker({ clock: () => 1_700_000_000_000 });
    const events = c.lines.flatMap((line) => tracker.add(line, true));
    const faults = tracker.faults();
    expect(faults).toHaveLength(1);
    const fault = faults[0]!;
    expect(fault).toMatchObject({ kind: c.kind, code: c.code, action: c.action, count: 1 });
    expect(events.map((e) => `${e.kind} ${e.live}`)).toEqual(["opened true"]);
    const named = gpuAt(0, c.bus ?? "00000000:AB:00.0");
    const { gpus, problems } = applyKernelFaults([named, gpuAt(1, OTHER_BUS)], faults);
    const [first, other] = gpus;
    // The named GPU always carries the fault; node-wide faults reach the other GPU too.
    if (c.bus !== undefined) expect(first!.faults).toEqual([fault]);
    expect(first!.healthy).toBe(c.healthy);
    expect(other!.healthy).toBe(c.othersHealthy);
    expect(problems).toEqual([]);
    if (!c.healthy) {
      expect(first!.healthProblems).toHaveLength(1);
      const health = first!.healthProblems[0]!;
      expect(health.code).toBe(ProblemCodes.gpuFault);
      expect(health.source).toBe("kernel-log");
      // Timed by the line's own stamp where it has a wall-clock one, else when read.
      expect(health.message).toContain(
        `: action ${c.action}; 1 record since ${new Date(fault.firstSeenUnixMs).toISOString()}`,
      );
      expect(health.message).toContain(fault.description);
      expect(health.message).toContain(`evidence: ${fault.evidence}`);
    } else {
      expect(first!.healthProblems).toEqual([]);
    }
  });

  it("names the code, description, action, count, time and evidence in the health problem", () => {
    const tracker = createKernelFaultTracker({ clock: () => 0 });
    tracker.add("NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.", false);
    const { gpus } = applyKernelFaults([gpuAt(0, "00000000:06:00.0")], tracker.faults());
    expect(gpus[0]!.healthProblems[0]!.message).toBe(
      "Xid 79 (GPU has fallen off the bus) on 00000000:06:00.0: action reboot; 1 record since 1970-01-01T00:00:00.000Z; evidence: NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.",
    );
  });

  it("folds a burst of 100 Xid 13 lines into one fault and one event", () => {
    const tracker = createKernelFaultTracker({ clock: () => 5 });
    const line = FAULT_CASES[0]!.lines[0]!;
    const events = Array.from({ length: 100 }, () => tracker.add(line, true)).flat();
    expect(events).toHaveLength(1);
    expect(tracker.faults()).toMatchObject([{ code: 13, count: 100, action: "restart-engine" }]);
  });

  it("dedupes the fallen-off-bus message against the Xid 79 of the same GPU (open-gpu-kernel-modules#1151)", () => {
    const tracker = createKernelFaultTracker({ clock: () => 5 });
    for (const line of [
      "NVRM: GPU at PCI:0000:06:00: GPU-0b6b7808-c002-f593-ac86-cd8e57757b94",
      "NVRM: GPU Board Serial Number: 0",
      "NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.",
      "NVRM: GPU 0000:06:00.0: GPU has fallen off the bus.",
      "NVRM: GPU 0000:06:00.0: GPU serial number is 0.",
      "NVRM: kgspRcAndNotifyAllChannels_IMPL: RC all channels for critical error 79.",
    ]) {
      tracker.add(line, false);
    }
    expect(tracker.faults()).toMatchObject([
      { kind: "xid", code: 79, count: 1, pciBusId: "00000000:06:00.0" },
    ]);
    expect(tracker.stats()).toMatchObject({ records: 6, deduped: 1, faultRecords: 1 });
  });

  it("reads the single-line fallen-off-bus message alone as a fault of its own kind", () => {
    const tracker = createKernelFaultTracker({ clock: () => 5 });
    tracker.add("NVRM: GPU 0000:06:00.0: GPU has fallen off the bus.", false);
    expect(tracker.faults()).toMatchObject([
      {
        kind: "fallen-off-bus",
        code: 79,
        action: "reboot",
        description: "GPU has fallen off the bus",
      },
    ]);
  });

  it("times a kmsg record from boot time, keeps its seq and the boot id", () => {
    const bootId = "0b6b7808-c002-f593-ac86-cd8e57757b94";
    const tracker = createKernelFaultTracker({ clock: () => 0, bootTimeMs: 1_000_000, bootId });
    // KDOC header grammar (§1.1, `4,` = kernel warning) around a verbatim §1.3 message.
    tracker.add(
      "4,42,219470994,-;NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.",
      false,
    );
    expect(tracker.faults()).toMatchObject([
      {
        code: 48,
        seq: 42,
        bootId,
        firstSeenUnixMs: 1_000_000 + 219_471,
        lastSeenUnixMs: 1_219_471,
      },
    ]);
  });

  it("never lets a user-space record (facility 1) forge a fault", () => {
    const tracker = createKernelFaultTracker({ clock: () => 0 });
    // PRIO 12 = facility 1 (user) <<3 | 4: what `echo … > /dev/kmsg` produces (KDOC).
    expect(
      tracker.add("12,5,6,-;NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.", true),
    ).toEqual([]);
    expect(tracker.faults()).toEqual([]);
    expect(tracker.stats().ignoredFacility).toBe(1);
  });

  it("turns a fault that reaches no GPU into a node problem, never dropping it", () => {
    const tracker = createKernelFaultTracker({ clock: () => 0 });
    tracker.add(FAULT_CASES[3]!.lines[0]!, false); // Xid 48 on 07
    tracker.add(FAULT_CASES[7]!.lines[0]!, false); // Xid 79 on 06: node-wide
    const onOther = applyKernelFaults([gpuAt(0, OTHER_BUS)], tracker.faults());
    expect(onOther.gpus[0]!.healthy).toBe(false); // the node-wide Xid 79
    expect(onOther.problems.map((p) => [p.code, p.message.slice(0, 20)])).toEqual([
      [ProblemCodes.gpuFault, "Xid 48 (Double Bit E"],
    ]);
    expect(onOther.problems[0]!.message).toContain("no GPU of this node has that PCI address");
    const none = applyKernelFaults([], tracker.faults());
    expect(none.problems).toHaveLength(2);
    expect(none.problems[1]!.message).toContain("this node reports no GPU to attach it to");
  });

  it("keeps existing health problems and faults, and returns untouched GPUs as they were", () => {
    const sick: Gpu = {
      ...gpuAt(0, "00000000:07:00.0"),
      healthy: false,
      healthProblems: [
        { code: ProblemCodes.gpuEccUncorrected, source: "nvidia-smi", message: "x" },
      ],
    };
    const fine = gpuAt(1, OTHER_BUS);
    const tracker = createKernelFaultTracker({ clock: () => 0 });
    tracker.add(FAULT_CASES[3]!.lines[0]!, false);
    const { gpus } = applyKernelFaults([sick, fine], tracker.faults());
    expect(gpus[0]!.healthProblems.map((p) => p.code)).toEqual([
      ProblemCodes.gpuEccUncorrected,
      ProblemCodes.gpuFault,
    ]);
    expect(gpus[1]).toBe(fine);
  });

  it("bounds evidence to 512 characters", () => {
    expect(boundEvidence("x".repeat(512))).toHaveLength(512);
    const cut = boundEvidence("x".repeat(2000));
    expect(cut).toHaveLength(MAX_FAULT_EVIDENCE_CHARS);
    expect(cut.endsWith("…")).toBe(true);
  });

  it("property: arbitrary text never throws and never yields a fault", () => {
    const text = fc.oneof(
      fc.string({ unit: "binary" }),
      fc.string({ unit: "grapheme-ascii" }),
      fc.uint8Array().map((bytes) => new TextDecoder().decode(bytes)),
    );
    fc.assert(
      fc.property(fc.array(fc.tuple(text, fc.boolean()), { maxLength: 20 }), (records) => {
        const tracker = createKernelFaultTracker({ clock: () => 0, maxRecordChars: 64 });
        for (const [record, live] of records) expect(tracker.add(record, live)).toEqual([]);
        expect(tracker.faults()).toEqual([]);
      }),
      { numRuns: 1_000 },
    );
  });
});

describe("applyKernelFaults stays within the control plane's limits", () => {
  // 100 distinct actionable codes on one GPU; evidence is the verbatim Xid 48 line (§1.3).
  const evidence = FAULT_CASES[3]!.lines[0]!;
  const bus = "00000000:07:00.0";
  const many: GpuFault[] = Array.from({ length: 100 }, (_, i) => ({
    kind: "xid",
    code: 1_000 + i,
    action: i === 0 ? "reboot" : "reset-gpu",
    pciBusId: i === 0 ? OTHER_BUS : bus,
    count: 1,
    firstSeenUnixMs: i,
    lastSeenUnixMs: i,
    evidence,
    description: "Unknown Xid (not in llmgw's catalog)",
  }));

  it("attaches 32 faults and 4 health problems per GPU, most severe then most recent", () => {
    const { gpus, problems } = applyKernelFaults([gpuAt(0, bus)], many);
    expect(problems).toEqual([]);
    const gpu = gpus[0]!;
    expect(gpu.healthy).toBe(false);
    // The reboot (oldest, node-wide), then the 31 most recent.
    expect(gpu.faults!.map((f) => f.code)).toEqual([
      1_000,
      ...Array.from({ length: 31 }, (_, i) => 1_069 + i),
    ]);
    const health = gpu.healthProblems.filter((p) => p.code === ProblemCodes.gpuFault);
    expect(health).toHaveLength(4);
    expect(health.slice(0, 3).map((p) => p.message.slice(0, 10))).toEqual([
      "Xid 1000 (",
      "Xid 1098 (",
      "Xid 1099 (",
    ]);
    expect(health[3]!.message).toMatch(
      /^… and 97 more kernel-log faults take this GPU out: xid-1097 00000000:07:00\.0 reset-gpu, .*, …$/,
    );
  });

  it("turns at most 16 unattached faults into node problems, the last one counting the rest", () => {
    const { problems } = applyKernelFaults([], many);
    expect(problems).toHaveLength(16);
    expect(problems[0]!.message).toMatch(/^Xid 1000 .*this node reports no GPU to attach it to\)$/);
    expect(problems[15]!.message).toMatch(
      /^… and 85 more kernel-log faults that reach no GPU of this node: xid-1085 /,
    );
  });
});

describe("a fault seen again inside its burst window", () => {
  // Verbatim §1.3 lines: Xid 48 (reset-gpu) and Xid 13 (restart-engine).
  const XID_48 =
    "NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.";
  const XID_13 =
    "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter";

  it("says so (once a second at most) when the fault takes a GPU out, so a cleared fault is reported again at once", () => {
    let now = 1_000_000;
    const tracker = createKernelFaultTracker({ clock: () => now });
    expect(tracker.add(XID_48, true).map((e) => e.kind)).toEqual(["opened"]);
    now += 500;
    expect(tracker.add(XID_48, true)).toEqual([]);
    now += 600;
    const [again] = tracker.add(XID_48, true);
    expect(again?.kind).toBe("seen-again");
    expect(again?.fault.count).toBe(3);
    expect(again?.fault.lastSeenUnixMs).toBe(now);
    now += 200;
    expect(tracker.add(XID_48, true)).toEqual([]);
    // The backlog (not live) and a restart-engine fault never produce it.
    now += 5_000;
    expect(tracker.add(XID_48, false)).toEqual([]);
    expect(tracker.add(XID_13, true).map((e) => e.kind)).toEqual(["opened"]);
    now += 5_000;
    expect(tracker.add(XID_13, true)).toEqual([]);
  });
});

describe("an event's pid", () => {
  it("is the pid of the record behind it, so a later burst names its own process", () => {
    // Verbatim §1.3 (driver format): Xid 94 from pid 7194 (MIG) and from pid 7062.
    const first =
      "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No";
    const later =
      "NVRM: Xid (PCI:0000:01:00): 94, pid=7062, Contained: CE User Channel (0x9). RST: No, D-RST: No";
    let now = 0;
    const tracker = createKernelFaultTracker({ clock: () => now, windowMs: 1_000 });
    expect(tracker.add(first, true).map((e) => [e.kind, e.pid])).toEqual([["opened", 7194]]);
    now += 5_000; // a quiet window: a new burst of the same fault
    expect(tracker.add(later, true).map((e) => [e.kind, e.pid])).toEqual([["opened", 7062]]);
  });
});

describe("a text log printing the ring buffer again (no kmsg seq to tell)", () => {
  // Verbatim §1.3 lines: Xid 31 (restart-engine) and Xid 120 (reset-gpu) with dmesg stamps, and
  // the syslog Xid 48 with both a wall-clock and a monotonic stamp.
  const XID_31 =
    "[  365.969681] NVRM: Xid (PCI:0000:01:00): 31, pid=13705, name=UnrealEditor, channel 0x0000000c, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC2 GPCCLIENT_PROP_0 faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ";
  const XID_120 =
    "[605633.376794] NVRM: Xid (PCI:0000:06:00): 120, GSP task exception: store access page fault (cause:0xf) @ pc:0x13ebd80, partition:2#0, task:3";
  const XID_48 =
    "Dec  2 11:38:47 worker4 kernel: [  219.470994] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.";
  const NOISE = "[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).";

  it.each([
    ["dmesg", XID_31, undefined],
    ["dmesg, boot time known", XID_31, 1_000_000],
    ["syslog", XID_48, undefined],
  ])(
    "skips a %s record read again ten minutes later: no event, same count and times",
    (_, line, bootTimeMs) => {
      let now = 1_700_000_000_000;
      const tracker = createKernelFaultTracker({
        clock: () => now,
        ...(bootTimeMs === undefined ? {} : { bootTimeMs }),
      });
      expect(tracker.add(line, true).map((e) => e.kind)).toEqual(["opened"]);
      tracker.add(NOISE, true);
      const before = tracker.faults();
      now += 10 * 60_000; // `dmesg -w` restarted and printed the whole ring again
      expect(tracker.add(line, true)).toEqual([]);
      expect(tracker.add(NOISE, true)).toEqual([]);
      expect(tracker.faults()).toEqual(before);
      expect(tracker.faults()[0]!.count).toBe(1);
      expect(tracker.stats()).toMatchObject({ faultRecords: 1, replayed: 2 });
    },
  );

  it("a record below the highest stamp read still counts (a new boot's stamps restart near 0) but is not live", () => {
    const tracker = createKernelFaultTracker({ clock: () => 5 });
    expect(tracker.add(XID_120, false).map((e) => [e.kind, e.live])).toEqual([["opened", false]]);
    expect(tracker.add(XID_31, true).map((e) => [e.kind, e.fault.code, e.live])).toEqual([
      ["opened", 31, false],
    ]);
    expect(tracker.faults().map((f) => [f.code, f.count])).toEqual([
      [120, 1],
      [31, 1],
    ]);
  });

  it("after a reboot, a file's earlier boot neither acts nor keeps this boot's records from acting", () => {
    // kern.log read at start, ten minutes after a reboot: the earlier boot ran a week, so its
    // stamps are far above this boot's; this boot's own backlog; then a new record, live.
    let now = 1_700_000_000_000;
    const tracker = createKernelFaultTracker({ clock: () => now, bootTimeMs: now - 600_000 });
    expect(tracker.add(XID_120, false).map((e) => e.live)).toEqual([false]);
    expect(tracker.add(XID_31, false).map((e) => e.live)).toEqual([false]);
    now += 120_000;
    const next = "[  719.000001] NVRM: Xid (PCI:0000:02:00): 31, pid=1, name=python3, channel 0x2";
    expect(tracker.add(next, true).map((e) => [e.fault.code, e.live])).toEqual([[31, true]]);
    // An earlier boot's record is never live, even in a file the watcher reads as new.
    const old = "[604800.000001] NVRM: Xid (PCI:0000:03:00): 31, pid=1, name=python3, channel 0x2";
    expect(tracker.add(old, true).map((e) => [e.fault.code, e.live])).toEqual([[31, false]]);
  });

  it("a record past the highest stamp read is live", () => {
    const tracker = createKernelFaultTracker({ clock: () => 5 });
    tracker.add(XID_31, false);
    expect(tracker.add(XID_120, true).map((e) => [e.kind, e.fault.code, e.live])).toEqual([
      ["opened", 120, true],
    ]);
  });

  it("skips the continuation lines of a replayed multi-line record", () => {
    // §1.3, NVSentinel#155: the R570 fallen-off-bus record as dmesg prints it.
    const r570 = [
      "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
      "               NVRM: (PCI ID: 10de:26b5) installed in this system has",
      "               NVRM: fallen off the bus and is not responding to commands.",
    ];
    const tracker = createKernelFaultTracker({ clock: () => 5 });
    expect(r570.flatMap((l) => tracker.add(l, false)).map((e) => e.kind)).toEqual(["opened"]);
    expect(r570.flatMap((l) => tracker.add(l, true))).toEqual([]);
    expect(tracker.faults()).toMatchObject([{ kind: "fallen-off-bus", count: 1 }]);
  });
});

describe("a text log holding several boots (plain dmesg: since-boot stamps, no wall clock)", () => {
  // §1.1 kmsg records (KDOC, GPUD kmsg.1.log) as `dmesg` prints them: TS_US as `[%5lu.%06lu] `,
  // then the text. The same kernel prints the same first lines at each boot.
  const HOST_BRIDGE =
    "[    0.424069] pci_root PNP0A03:00: host bridge window [io  0x0000-0x0cf7] (ignored)";
  const NET = "[    5.140900] NET: Registered protocol family 10";
  const NVSWITCH = "[  206.764307] nvidia-nvswitch2: open (major=510)";
  const LINK = "[  227.986636] IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready";
  // §1.3 dmesg lines, verbatim: Xid 31 (restart-engine), Xid 120 and 149 (reset-gpu), and the
  // R570 fallen-off-bus record (reboot) with its indented continuation lines.
  const XID_31 =
    "[  365.969681] NVRM: Xid (PCI:0000:01:00): 31, pid=13705, name=UnrealEditor, channel 0x0000000c, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC2 GPCCLIENT_PROP_0 faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ";
  const PROBE = "[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).";
  const XID_120 =
    "[605633.376794] NVRM: Xid (PCI:0000:06:00): 120, GSP task exception: store access page fault (cause:0xf) @ pc:0x13ebd80, partition:2#0, task:3";
  const XID_149 =
    "[171167.620236] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)";
  const R570 = [
    "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
    "               NVRM: (PCI ID: 10de:26b5) installed in this system has",
    "               NVRM: fallen off the bus and is not responding to commands.",
  ];
  const NOW = 1_700_000_000_000;
  const DAY_MS = 86_400_000;
  const trackerUp = (uptimeMs: number, windowMs?: number) => {
    const boot = NOW - uptimeMs;
    const tracker = createKernelFaultTracker({
      clock: () => NOW,
      bootTimeMs: boot,
      ...(windowMs === undefined ? {} : { windowMs }),
    });
    return { tracker, boot };
  };
  const seen = (events: KernelFaultEvent[]) => events.map((e) => [e.fault.code, e.live]);

  it.each<[string, string[], string[], number]>([
    [
      "an unread fault record inside the stamps the earlier boot covered",
      [HOST_BRIDGE, NET, NVSWITCH, XID_31, PROBE, XID_120],
      [HOST_BRIDGE, NET, NVSWITCH, LINK, ...R570],
      30 * DAY_MS,
    ],
    [
      "the stamps passing the earlier boot's last line without printing it again",
      [HOST_BRIDGE, NET, XID_31, PROBE],
      [HOST_BRIDGE, NET, NVSWITCH, LINK],
      30 * DAY_MS,
    ],
    [
      "a stamp past this boot's uptime in the earlier boot (a boundary at once)",
      [HOST_BRIDGE, NET, NVSWITCH, XID_31, PROBE, XID_120],
      [HOST_BRIDGE, NET, NVSWITCH, LINK, ...R570],
      3 * DAY_MS,
    ],
  ])(
    "dates the earlier boot's Xid at a small stamp before this boot and acts on this boot's next one; told by %s",
    (_, earlierBoot, thisBoot, uptimeMs) => {
      const { tracker, boot } = trackerUp(uptimeMs);
      // The agent starts after the reboot and reads the file: its backlog, never live.
      const backlog = [...earlierBoot, ...thisBoot].flatMap((l) => tracker.add(l, false));
      expect(backlog.filter((e) => e.fault.code === 31).map((e) => e.live)).toEqual([false]);
      // This boot's next record, appended: live, though its stamp is below the earlier boot's.
      expect(seen(tracker.add(XID_149, true))).toEqual([[149, true]]);
      const faults = tracker.faults();
      const xid31 = faults.find((f) => f.code === 31)!;
      // The earlier boot's record happened before this boot began (not 366 s after it).
      expect([xid31.firstSeenUnixMs, xid31.lastSeenUnixMs]).toEqual([boot, boot]);
      expect(faults.find((f) => f.code === 149)!.firstSeenUnixMs).toBe(boot + 171_167_620);
      const fallen = faults.find((f) => f.kind === "fallen-off-bus");
      if (thisBoot.includes(R570[0]!)) expect(fallen!.firstSeenUnixMs).toBe(boot + 1_843_308);
      expect(tracker.stats().bootBoundaries).toBe(1);
    },
  );

  it("this boot's first record of a fault the earlier boot had opens a new burst, live", () => {
    // A one-hour burst window, so the earlier boot's record (dated at this boot's start) and
    // this boot's, 219 s later, would otherwise be one burst: no event, no engine restart.
    const { tracker, boot } = trackerUp(30 * DAY_MS, 3_600_000);
    for (const line of [HOST_BRIDGE, NET, XID_31, PROBE, HOST_BRIDGE, NET]) {
      tracker.add(line, false);
    }
    // dmesg's stamp (§1.3's `[  219.470994]`) on the verbatim §1.3 Xid 31 message of GPU 01:00.
    const again =
      "[  219.470994] NVRM: Xid (PCI:0000:01:00): 31, Ch 0000005a, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_1 faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ";
    expect(tracker.add(again, true).map((e) => [e.kind, e.fault.code, e.live])).toEqual([
      ["opened", 31, true],
    ]);
    expect(tracker.faults()).toMatchObject([
      { code: 31, count: 2, firstSeenUnixMs: boot, lastSeenUnixMs: boot + 219_471 },
    ]);
  });

  it.each<[string, string[], number]>([
    // The earlier boot ran past this boot's uptime: told by its stamps at once.
    ["its stamps past this boot's uptime", [HOST_BRIDGE, NET, XID_120, ...R570], 3 * DAY_MS],
    // Every stamp within this boot's uptime: told by the boundary (the unread R570 record).
    ["the boundary after it", [HOST_BRIDGE, NET, NVSWITCH, PROBE, XID_149, XID_120], 30 * DAY_MS],
  ])(
    "an earlier boot's faults are reported but take no GPU out and drain no node; told by %s",
    (_, earlierBoot, uptimeMs) => {
      const { tracker, boot } = trackerUp(uptimeMs);
      const thisBoot = [HOST_BRIDGE, NET, NVSWITCH, LINK, ...R570];
      // With the R570 of the first case in the earlier boot, this boot's own R570 below has
      // another GPU: the §1.3 message for bus b4 instead of b3.
      const own = thisBoot.map((l) => l.replace("0000:b3:00.0", "0000:b4:00.0"));
      for (const line of [...earlierBoot, ...own]) tracker.add(line, false);
      const earlier = tracker.faults().filter((f) => f.firstSeenUnixMs === boot);
      // Xid 120 (reset-gpu), Xid 149 (reset-gpu) or the R570 fallen-off-bus record (reboot):
      // counted and visible, marked as an earlier boot's, acting on nothing.
      expect(earlier.map((f) => [f.kind, f.code, f.action, f.count])).toEqual(
        earlierBoot.includes(XID_149)
          ? [
              ["xid", 149, "ignore", 1],
              ["xid", 120, "ignore", 1],
            ]
          : [
              ["xid", 120, "ignore", 1],
              ["fallen-off-bus", 79, "ignore", 1],
            ],
      );
      expect(earlier.map((f) => f.description)).toEqual(
        earlier.map(() =>
          expect.stringMatching(
            /\(earlier boot: catalog action (reset-gpu|reboot), not taken on this boot; the reboot reset the GPU\)$/,
          ),
        ),
      );
      expect(earlier.every((f) => f.bootId === undefined)).toBe(true);
      // This boot's fallen-off-bus record (bus b4) keeps its action.
      expect(
        tracker
          .faults()
          .filter((f) => f.pciBusId === "00000000:B4:00.0")
          .map((f) => f.action),
      ).toEqual(["reboot"]);
      const gpus = [
        gpuAt(0, "00000000:06:00.0"),
        gpuAt(1, "00000000:B3:00.0"),
        gpuAt(2, "00000009:01:00.0"),
      ];
      const before = applyKernelFaults(gpus, earlier);
      expect(before.gpus.map((g) => g.healthy)).toEqual([true, true, true]);
      expect(before.gpus.map((g) => g.faults?.length ?? 0)).toEqual(
        earlierBoot.includes(XID_149) ? [1, 0, 1] : [1, 1, 0],
      );
      expect(before.problems).toEqual([]);
      expect(tracker.stats().earlierBootFaults).toBe(2);
      // This boot's own Xid 120 on that GPU: the fault acts again, dated from its stamp.
      const again = "[ 1900.000001] NVRM: Xid (PCI:0000:06:00): 120, GSP task exception";
      expect(tracker.add(again, true).map((e) => [e.kind, e.fault.action, e.live])).toEqual([
        ["opened", "reset-gpu", true],
      ]);
      const xid120 = tracker.faults().find((f) => f.code === 120)!;
      expect([xid120.action, xid120.count, xid120.lastSeenUnixMs]).toEqual([
        "reset-gpu",
        2,
        boot + 1_900_000,
      ]);
      expect(applyKernelFaults(gpus, [xid120]).gpus.map((g) => g.healthy)).toEqual([
        false,
        true,
        true,
      ]);
      expect(tracker.stats().earlierBootFaults).toBe(1);
    },
  );

  it("a single boot, printed again by a restarted `dmesg -w`, has no boundary: dated and live as before", () => {
    const { tracker, boot } = trackerUp(30 * DAY_MS);
    const start = [HOST_BRIDGE, NET, NVSWITCH, LINK];
    // R570 is stored 0.13 s behind the record above it: printk may store records a little out
    // of time order (two CPUs), which is no step back to a new boot.
    const later = [XID_31, PROBE, ...R570];
    const events = [
      ...start.flatMap((l) => tracker.add(l, false)),
      // `dmesg -w` restarted: the ring from its oldest record again (no fault record in it to
      // tell: its last line does), then new records…
      ...[...start, ...later].flatMap((l) => tracker.add(l, true)),
      // …and restarted again.
      ...[...start, ...later, XID_120].flatMap((l) => tracker.add(l, true)),
    ];
    expect(events.map((e) => [e.fault.kind, e.fault.code, e.fault.firstSeenUnixMs])).toEqual([
      ["xid", 31, boot + 365_970],
      ["fallen-off-bus", 79, boot + 1_843_308],
      ["xid", 120, boot + 605_633_377],
    ]);
    expect(events.filter((e) => e.fault.kind === "xid").map((e) => e.live)).toEqual([true, true]);
    expect(tracker.faults().map((f) => [f.code, f.count, f.lastSeenUnixMs])).toEqual([
      [31, 1, boot + 365_970],
      [79, 1, boot + 1_843_308],
      [120, 1, boot + 605_633_377],
    ]);
    expect(tracker.stats()).toMatchObject({ replayed: 3, bootBoundaries: 0 });
  });
});

describe("a kmsg-format log holding several boots (records saved from /dev/kmsg: seq and TS_US restart)", () => {
  // §1.1 records, verbatim: the KDOC example (with its key/value lines) and GPUD's kmsg.1.log
  // capture. The same kernel logs the same first records, same seq and stamp, at each boot.
  const HOST_BRIDGE = [
    "7,160,424069,-;pci_root PNP0A03:00: host bridge window [io  0x0000-0x0cf7] (ignored)",
    " SUBSYSTEM=acpi",
    " DEVICE=+acpi:PNP0A03:00",
  ];
  const NET = "6,339,5140900,-;NET: Registered protocol family 10";
  const NVSWITCH = "6,3964,206764307,-;nvidia-nvswitch2: open (major=510)";
  const LINK = "6,3973,227986636,-;IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready";
  // The KDOC header grammar (§1.1; seq numbers chosen in order, `4,` warning, `3,` err) around
  // verbatim §1.3 messages at the stamps dmesg printed for them there: Xid 31 (restart-engine),
  // the probe message (no fault), Xid 120 and 149 (reset-gpu), and the single-line
  // fallen-off-bus message (reboot) at the R570 record's stamp.
  const XID_31 =
    "4,4100,365969681,-;NVRM: Xid (PCI:0000:01:00): 31, pid=13705, name=UnrealEditor, channel 0x0000000c, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC2 GPCCLIENT_PROP_0 faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ";
  const PROBE = "3,4120,1843439662,-;NVRM: The NVIDIA probe routine failed for 1 device(s).";
  const XID_120 =
    "4,9000,605633376794,-;NVRM: Xid (PCI:0000:06:00): 120, GSP task exception: store access page fault (cause:0xf) @ pc:0x13ebd80, partition:2#0, task:3";
  const FALLEN = "3,4050,1843308145,-;NVRM: GPU 0000:06:00.0: GPU has fallen off the bus.";
  const XID_149 =
    "4,4300,171167620236,-;NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)";
  const NOW = 1_700_000_000_000;
  const DAY_MS = 86_400_000;
  const BOOT_ID = "0b6b7808-c002-f593-ac86-cd8e57757b94";
  const trackerUp = (uptimeMs: number) => {
    const boot = NOW - uptimeMs;
    const tracker = createKernelFaultTracker({
      clock: () => NOW,
      bootTimeMs: boot,
      bootId: BOOT_ID,
    });
    return { tracker, boot };
  };

  it.each<[string, string[], string[], number]>([
    [
      "an unread fault record at a seq the earlier boot covered",
      [...HOST_BRIDGE, NET, NVSWITCH, XID_31, PROBE, XID_120],
      [...HOST_BRIDGE, NET, NVSWITCH, LINK, FALLEN],
      30 * DAY_MS,
    ],
    [
      "the seqs passing the earlier boot's last record without printing it again",
      [...HOST_BRIDGE, NET, XID_31, PROBE],
      [...HOST_BRIDGE, NET, NVSWITCH, LINK],
      30 * DAY_MS,
    ],
    [
      "a stamp past this boot's uptime in the earlier boot (a boundary at once)",
      [...HOST_BRIDGE, NET, NVSWITCH, XID_31, PROBE, XID_120],
      [...HOST_BRIDGE, NET, NVSWITCH, LINK, FALLEN],
      3 * DAY_MS,
    ],
  ])(
    "the earlier boot's faults move before this boot and take nothing out; this boot's act; told by %s",
    (_, earlierBoot, thisBoot, uptimeMs) => {
      const { tracker, boot } = trackerUp(uptimeMs);
      // A file of both boots read at agent start: its backlog, never live.
      const backlog = [...earlierBoot, ...thisBoot].flatMap((l) => tracker.add(l, false));
      expect(backlog.every((e) => !e.live)).toBe(true);
      // This boot's next record: live, though its seq and stamp are below the earlier boot's.
      expect(tracker.add(XID_149, true).map((e) => [e.fault.code, e.live])).toEqual([[149, true]]);
      const faults = tracker.faults();
      const earlier = faults.filter((f) => f.firstSeenUnixMs === boot);
      expect(earlier.map((f) => [f.code, f.action, f.lastSeenUnixMs, f.bootId])).toEqual(
        earlierBoot.includes(XID_120)
          ? [
              [31, "ignore", boot, undefined],
              [120, "ignore", boot, undefined],
            ]
          : [[31, "ignore", boot, undefined]],
      );
      expect(earlier[0]!.description).toBe(
        `GPU memory page fault ${earlierBootNote("restart-engine")}`,
      );
      const own = faults.filter((f) => f.firstSeenUnixMs !== boot);
      expect(own.map((f) => [f.kind, f.action, f.firstSeenUnixMs, f.bootId])).toEqual([
        ...(thisBoot.includes(FALLEN)
          ? [["fallen-off-bus", "reboot", boot + 1_843_308, BOOT_ID]]
          : []),
        ["xid", "reset-gpu", boot + 171_167_620, BOOT_ID],
      ]);
      expect(tracker.stats()).toMatchObject({
        bootBoundaries: 1,
        earlierBootFaults: earlier.length,
      });
    },
  );

  it("a lone kmsg record past the uptime reckoned from the wall clock stays this boot's: only a boundary of seqs tells an earlier boot", () => {
    // /dev/kmsg holds this boot alone; the uptime (clock less boot time) falls short of its
    // stamps when the wall clock stepped back after the boot time was read.
    const { tracker } = trackerUp(3 * DAY_MS);
    expect(tracker.add(XID_120, true).map((e) => [e.fault.code, e.live])).toEqual([[120, false]]);
    expect(tracker.faults().map((f) => [f.action, f.bootId])).toEqual([["reset-gpu", BOOT_ID]]);
    expect(tracker.stats()).toMatchObject({ bootBoundaries: 0, earlierBootFaults: 0 });
  });

  it("a single boot, read again by a reader that reopened /dev/kmsg, has no boundary: dated, live and acting as before", () => {
    const { tracker, boot } = trackerUp(30 * DAY_MS);
    const start = [...HOST_BRIDGE, NET, NVSWITCH, LINK];
    const later = [XID_31, PROBE];
    const events = [
      ...start.flatMap((l) => tracker.add(l, false)),
      // Reopened, /dev/kmsg starts at its oldest record again (no fault record in it to tell:
      // the earlier read's last record does), then new records…
      ...[...start, ...later].flatMap((l) => tracker.add(l, true)),
      // …and reopened again.
      ...[...start, ...later, XID_120].flatMap((l) => tracker.add(l, true)),
    ];
    expect(events.map((e) => [e.fault.code, e.live, e.fault.firstSeenUnixMs])).toEqual([
      [31, true, boot + 365_970],
      [120, true, boot + 605_633_377],
    ]);
    expect(tracker.faults().map((f) => [f.code, f.action, f.count, f.seq, f.bootId])).toEqual([
      [31, "restart-engine", 1, 4100, BOOT_ID],
      [120, "reset-gpu", 1, 9000, BOOT_ID],
    ]);
    expect(tracker.stats()).toMatchObject({ replayed: 2, bootBoundaries: 0, earlierBootFaults: 0 });
  });
});

describe("recordTimeMs: a record's time comes from the record where it says", () => {
  const NOW = Date.UTC(2025, 2, 1); // 2025-03-01
  const BOOT = NOW - 86_400_000;
  it.each<[string, string, number | undefined, number]>([
    // §1.1 kmsg record (KDOC grammar, GPUD capture): boot time + TS_US.
    ["kmsg", "6,3964,206764307,-;nvidia-nvswitch2: open (major=510)", BOOT, BOOT + 206_764],
    [
      "dmesg [secs.usec]",
      "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
      BOOT,
      BOOT + 1_843_308,
    ],
    // Past this boot's uptime (one day): an earlier boot's record, which happened before it.
    [
      "dmesg stamp of an earlier boot",
      "[605633.376794] NVRM: Xid (PCI:0000:06:00): 120, GSP task exception: store access page fault (cause:0xf) @ pc:0x13ebd80, partition:2#0, task:3",
      BOOT,
      BOOT,
    ],
    [
      "dmesg, boot time unknown",
      "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
      undefined,
      NOW,
    ],
    // Syslog: local time, the year that does not put it in the future; its wall clock wins.
    [
      "syslog",
      "Dec  2 11:38:47 worker4 kernel: [  219.470994] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.",
      BOOT,
      new Date(2024, 11, 2, 11, 38, 47).getTime(),
    ],
    [
      "journalctl -k",
      "Feb 14 05:03:41 000-000-00000-1-gpu-1 kernel: mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link INIT",
      undefined,
      new Date(2025, 1, 14, 5, 3, 41).getTime(),
    ],
    [
      "dmesg -T",
      "[Sun Feb 23 16:24:18 2025] NVRM: GPU Board Serial Number: 1650124014249",
      BOOT,
      new Date(2025, 1, 23, 16, 24, 18).getTime(),
    ],
    [
      "dmesg --time-format=iso",
      "kern  :warn  : 2025-01-21T04:41:44,283302+00:00 NVRM: Xid (PCI:0000:38:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Global Exception on (GPC 8, TPC 5, SM 1): Multiple Warp Errors",
      BOOT,
      Date.UTC(2025, 0, 21, 4, 41, 44, 283),
    ],
    ["no stamp", "NVRM: GPU Board Serial Number: 0", BOOT, NOW],
  ])("%s", (_, line, bootTimeMs, expected) => {
    const record = parseKmsgRecord(line)!;
    expect(recordTimeMs(record, line, NOW, bootTimeMs)).toBe(expected);
  });

  it("takes a syslog date that would lie more than a day ahead as last year's", () => {
    const line = "Dec  2 11:38:47 worker4 kernel: x";
    expect(parseWallClockMs(line, new Date(2025, 11, 3).getTime())).toBe(
      new Date(2025, 11, 2, 11, 38, 47).getTime(),
    );
    expect(parseWallClockMs(line, new Date(2025, 10, 14).getTime())).toBe(
      new Date(2024, 11, 2, 11, 38, 47).getTime(),
    );
    expect(parseWallClockMs("Feb 30 11:38:47 worker4 kernel: x", 0)).toBeUndefined();
  });
});
