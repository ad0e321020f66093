import { mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import {
  buildGpu,
  type CommandResult,
  classifyNvidiaSmiFailure,
  type Gpu,
  type GpuQueryRow,
  type Problem,
  ProblemCodes,
} from "@llmgw/discovery";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  createGpuReadingMemory,
  type GpuRead,
  loadGpuMemory,
  saveGpuMemory,
} from "./gpu-readings.js";

// The H100 rows of formats.md §1.3 (idle: 0 %, 0 MiB, 41 °C, 69.85 W; load: 100 %, 19818 MiB,
// 59 °C, 631.95 W) with the PCIe health tokens of health-formats.md §2.1 (gen 5 of 5, x16 of
// 16). A second GPU gets its own uuid and bus like discovery's tests; "degraded" lowers the
// link generation to 4 under load, as discovery's own PCIe rows do (no capture of a degraded
// link under load was found).
const T0 = Date.UTC(2025, 0, 21, 4, 41, 44);
const uuid = (i: number) => `GPU-${i}0000000-0000-0000-0000-000000000000`;
const pci = (i: number) => `00000000:0${i}:09.0`;
function gpu(index: number, state: "idle" | "load" | "degraded" = "idle"): Gpu {
  const busy = state !== "idle";
  const row: GpuQueryRow = {
    index,
    uuid: uuid(index),
    name: "NVIDIA H100 80GB HBM3",
    memoryTotalMiB: 81559,
    memoryUsedMiB: busy ? 19818 : 0,
    pciBusId: pci(index),
    computeCapability: "9.0",
    eccUncorrectedErrors: 0,
    temperatureCelsius: busy ? 59 : 41,
    powerWatts: busy ? 631.95 : 69.85,
    migMode: "Disabled",
    utilizationPercent: busy ? 100 : 0,
    health: {
      pcieLinkGenCurrent: state === "degraded" ? 4 : 5,
      pcieLinkGenMax: 5,
      pcieLinkWidthCurrent: 16,
      pcieLinkWidthMax: 16,
    },
  };
  return buildGpu(row, [], new Set());
}

const failed = (result: Partial<CommandResult>): Problem =>
  classifyNvidiaSmiFailure(
    "nvidia-smi",
    "--query-gpu",
    { exitCode: undefined, stdout: "", stderr: "", timedOut: false, notFound: false, ...result },
    10_000,
  ) as Problem;
const TIMEOUT = failed({ timedOut: true });
// health-formats.md §2.5: stdout, exit 255 (gpustack#2078).
const NVML = failed({ stdout: "Failed to initialize NVML: Unknown Error\n", exitCode: 255 });

/** What a row asserts of each GPU reported: index, healthy, and its problems' codes. */
type Seen = [index: number, healthy: boolean, codes: string[]];
const seen = (gpus: readonly Gpu[]): Seen[] =>
  gpus.map((g) => [g.index, g.healthy, g.healthProblems.map((p) => p.code)]);

interface Row {
  readonly name: string;
  /** Reads folded in one minute apart, from T0. */
  readonly reads: readonly GpuRead[];
  /** What the last read reports. */
  readonly expected: readonly Seen[];
  /** Exact messages of the last read's problems, per GPU index. */
  readonly messages?: Readonly<Record<number, readonly string[]>>;
}

const at = (minutes: number) => new Date(T0 + minutes * 60_000).toISOString();
const PCIE_MESSAGE = `GPU 1 (${uuid(1)}) PCIe link runs at gen 4 x16 below its max gen 5 x16 while 100% busy: check the slot, riser and cabling (reseat the GPU)`;

const rows: Row[] = [
  {
    name: "every GPU read: reported as read",
    reads: [{ gpus: [gpu(0), gpu(1)], problems: [] }],
    expected: [
      [0, true, []],
      [1, true, []],
    ],
  },
  {
    name: "nvidia-smi timed out: each GPU from its last reading, unhealthy, with the timeout",
    reads: [
      { gpus: [gpu(0), gpu(1, "load")], problems: [] },
      { gpus: [], problems: [TIMEOUT] },
    ],
    expected: [
      [0, false, [ProblemCodes.nvidiaSmiTimeout]],
      [1, false, [ProblemCodes.nvidiaSmiTimeout]],
    ],
    messages: {
      0: [
        `GPU 0 (${uuid(0)}) could not be read: nvidia-smi --query-gpu did not finish within 10000 ms and was killed (hung driver?); its last reading (${at(0)}) is reported`,
      ],
    },
  },
  {
    name: "Failed to initialize NVML: the last reading (not an older one) with NVML's problem",
    reads: [
      { gpus: [gpu(0)], problems: [] },
      { gpus: [gpu(0, "load")], problems: [] },
      { gpus: [], problems: [NVML] },
      { gpus: [], problems: [NVML] },
    ],
    expected: [[0, false, [ProblemCodes.nvidiaSmiFailed]]],
    messages: {
      0: [
        `GPU 0 (${uuid(0)}) could not be read: nvidia-smi --query-gpu failed (exit 255): Failed to initialize NVML: Unknown Error: no GPU can be read; check the kernel log for Xid 79 (fallen off the bus) and the device nodes, then reboot; its last reading (${at(1)}) is reported`,
      ],
    },
  },
  {
    name: "one GPU missing from an answer that names no failure: GPU lost",
    reads: [
      { gpus: [gpu(0), gpu(1)], problems: [] },
      { gpus: [gpu(0)], problems: [] },
    ],
    expected: [
      [0, true, []],
      [1, false, [ProblemCodes.gpuLost]],
    ],
    messages: {
      1: [
        `GPU 1 (${uuid(1)}) is missing from nvidia-smi's latest answer; its last reading (${at(0)}) is reported`,
      ],
    },
  },
  {
    name: "a GPU that reads again is itself again",
    reads: [
      { gpus: [gpu(0)], problems: [] },
      { gpus: [], problems: [TIMEOUT] },
      { gpus: [gpu(0)], problems: [] },
    ],
    expected: [[0, true, []]],
  },
  {
    name: "a lost row (no uuid) stands for its GPU by bus id; the GPU is not reported twice",
    reads: [
      { gpus: [gpu(0)], problems: [] },
      { gpus: [{ ...gpu(0), uuid: "", name: "", lost: true, healthy: false }], problems: [] },
    ],
    expected: [[0, false, []]],
  },
  {
    name: "PCIe degraded under load is latched: the idle GPU stays unhealthy, saying when it was seen",
    reads: [
      { gpus: [gpu(0, "load"), gpu(1, "degraded")], problems: [] },
      { gpus: [gpu(0), gpu(1)], problems: [] },
      { gpus: [gpu(0), gpu(1)], problems: [] },
    ],
    expected: [
      [0, true, []],
      [1, false, [ProblemCodes.gpuPcieDegraded]],
    ],
    messages: {
      1: [
        `${PCIE_MESSAGE} (seen under load at ${at(0)}; it holds until the node reboots, as fixing a link takes)`,
      ],
    },
  },
  {
    name: "PCIe degraded again: the live problem, not two of them",
    reads: [
      { gpus: [gpu(1, "degraded")], problems: [] },
      { gpus: [gpu(1)], problems: [] },
      { gpus: [gpu(1, "degraded")], problems: [] },
    ],
    expected: [[1, false, [ProblemCodes.gpuPcieDegraded]]],
    messages: { 1: [PCIE_MESSAGE] },
  },
  {
    name: "a latched GPU that then cannot be read carries both problems",
    reads: [
      { gpus: [gpu(1, "degraded")], problems: [] },
      { gpus: [], problems: [TIMEOUT] },
    ],
    expected: [[1, false, [ProblemCodes.gpuPcieDegraded, ProblemCodes.nvidiaSmiTimeout]]],
  },
];

describe("createGpuReadingMemory", () => {
  it.each(rows)("$name", (row) => {
    const memory = createGpuReadingMemory();
    let out: Gpu[] = [];
    row.reads.forEach((read, i) => {
      out = memory.observe(read, T0 + i * 60_000);
    });
    expect(seen(out)).toEqual(row.expected);
    for (const [index, messages] of Object.entries(row.messages ?? {})) {
      expect(
        out.find((g) => g.index === Number(index))?.healthProblems.map((p) => p.message),
      ).toEqual(messages);
    }
  });

  it("nothing accumulates: a GPU unread for many reads has one problem of each kind", () => {
    const memory = createGpuReadingMemory();
    memory.observe({ gpus: [gpu(1, "degraded")], problems: [] }, T0);
    let out: Gpu[] = [];
    for (let i = 1; i <= 50; i++) out = memory.observe({ gpus: [], problems: [TIMEOUT] }, T0 + i);
    expect(seen(out)).toEqual([
      [1, false, [ProblemCodes.gpuPcieDegraded, ProblemCodes.nvidiaSmiTimeout]],
    ]);
  });

  it("a huge tool message is cut, so the heartbeat stays under the control plane's 1,024 characters", () => {
    const memory = createGpuReadingMemory();
    memory.observe({ gpus: [gpu(0)], problems: [] }, T0);
    const huge = { ...NVML, message: "x".repeat(10_000) };
    const [unread] = memory.observe({ gpus: [], problems: [huge] }, T0);
    expect(unread?.healthProblems[0]?.message.length).toBeLessThan(1_024);
  });

  it("never throws and never drops a GPU it has seen, whatever the reads", () => {
    const arbitraryGpu = fc
      .record({
        index: fc.integer({ min: 0, max: 7 }),
        state: fc.constantFrom("idle", "load", "degraded" as const),
        lostUuid: fc.boolean(),
      })
      .map(({ index, state, lostUuid }) => {
        const g = gpu(index, state as "idle");
        return lostUuid ? { ...g, uuid: "", lost: true, healthy: false } : g;
      });
    const arbitraryRead = fc.record({
      gpus: fc.uniqueArray(arbitraryGpu, { selector: (g) => g.index, maxLength: 8 }),
      problems: fc.subarray([TIMEOUT, NVML]),
    });
    fc.assert(
      fc.property(fc.array(arbitraryRead, { maxLength: 6 }), (reads) => {
        const memory = createGpuReadingMemory();
        const everSeen = new Set<number>();
        for (const [i, read] of reads.entries()) {
          for (const g of read.gpus) everSeen.add(g.index);
          const out = memory.observe(read, T0 + i);
          expect(new Set(out.map((g) => g.index))).toEqual(everSeen);
        }
      }),
    );
  });
});

describe("NVLinks", () => {
  /** GPU 0 as nvidia-smi reads it with `inactive` of its 12 links printed `<inactive>`. */
  const withLinks = (inactive: number): Gpu => {
    const g = gpu(0);
    const row: GpuQueryRow = {
      index: 0,
      uuid: g.uuid,
      name: g.name,
      memoryTotalMiB: 81559,
      memoryUsedMiB: 0,
      pciBusId: g.pciBusId,
      computeCapability: "9.0",
      eccUncorrectedErrors: 0,
      temperatureCelsius: 41,
      powerWatts: 69.85,
      migMode: "Disabled",
      utilizationPercent: 0,
    };
    return buildGpu(row, [], new Set(), [
      { index: 0, uuid: g.uuid, linksTotal: 12, linksInactive: inactive },
    ]);
  };

  it("all inactive from the start is a card without a bridge, not a fault; all going down after being up is", () => {
    // A PCIe card without an NVLink bridge reports every link down (NVIDIA/NVSentinel#1481).
    const bridgeless = createGpuReadingMemory();
    expect(seen(bridgeless.observe({ gpus: [withLinks(12)], problems: [] }, T0))).toEqual([
      [0, true, []],
    ]);
    // Some down among active ones: discovery's own problem.
    const memory = createGpuReadingMemory();
    expect(seen(memory.observe({ gpus: [withLinks(2)], problems: [] }, T0))).toEqual([
      [0, false, [ProblemCodes.gpuNvlinkInactive]],
    ]);
    // All down after 10 were active: only the agent's memory can tell.
    const [later] = memory.observe({ gpus: [withLinks(12)], problems: [] }, T0 + 60_000);
    expect(later?.healthy).toBe(false);
    expect(later?.healthProblems.map((p) => p.message)).toEqual([
      `GPU 0 (${uuid(0)}) has all 12 NVLinks inactive; 10 were active at ${at(0)}: check the fabric manager and the NVLink/NVSwitch state (nvidia-smi nvlink -s), then reset the GPU`,
    ]);
  });
});

describe("the latches across an agent restart", () => {
  const BOOT = "6cf3b8a0-3d0c-4f1e-9a57-0d6a2f1c2b11";
  it("come back from the state file in the same boot, and not after a reboot or from a bad file", () => {
    const dir = mkdtempSync(path.join(tmpdir(), "llmgw-gpu-memory-"));
    const file = path.join(dir, "gpu-memory.json");
    try {
      const first = createGpuReadingMemory();
      first.observe({ gpus: [gpu(1, "degraded")], problems: [] }, T0);
      saveGpuMemory(file, BOOT, first.snapshot());
      expect(statSync(file).mode & 0o777).toBe(0o600);

      // The agent restarts; the GPU idles (its link back at gen 5): still unhealthy.
      const again = createGpuReadingMemory(loadGpuMemory(file, BOOT));
      expect(seen(again.observe({ gpus: [gpu(1)], problems: [] }, T0 + 60_000))).toEqual([
        [1, false, [ProblemCodes.gpuPcieDegraded]],
      ]);
      // A reboot re-judges the link; a file that is not ours is ignored, never a throw.
      expect(loadGpuMemory(file, "another-boot")).toBeUndefined();
      expect(loadGpuMemory(file, undefined)).toBeUndefined();
      for (const junk of ["{", "[]", '{"bootId":1}', `{"bootId":"${BOOT}","pcie":[{"uuid":7}]}`]) {
        writeFileSync(file, junk);
        const loaded = loadGpuMemory(file, BOOT);
        expect(loaded?.pcie ?? []).toEqual([]);
      }
      expect(loadGpuMemory(path.join(dir, "absent.json"), BOOT)).toBeUndefined();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
