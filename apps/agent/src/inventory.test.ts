import {
  applyKernelFaults,
  createKernelFaultTracker,
  type Gpu,
  type NodeInventory,
  ProblemCodes,
} from "@llmgw/discovery";
import { inventoryToProto } from "@llmgw/wire";
import { describe, expect, it } from "vitest";
import { collectInventory, formatInventoryTable, inventoryToJson } from "./inventory.js";

const GIB = 1024 ** 3;

/** A node with one healthy GPU with every reading, one lost GPU with none, and a DOWN port. */
const inventory: NodeInventory = {
  hostname: "gpu-07",
  addresses: ["10.0.0.7"],
  agentVersion: "0.1.0",
  simulated: false,
  host: { cpuCount: 96, memoryBytes: 1024 * GIB, os: "Linux", osRelease: "6.8.0", arch: "x64" },
  gpus: [
    {
      index: 0,
      uuid: "GPU-0",
      name: "NVIDIA H100 80GB HBM3",
      gpuClass: "h100-80g",
      pciBusId: "00000000:00:09.0",
      memoryTotalBytes: 81559 * 1024 * 1024,
      memoryUsedBytes: 0,
      computeCapability: "9.0",
      migEnabled: false,
      utilizationPercent: 0,
      eccUncorrectedErrors: 0,
      temperatureCelsius: 41,
      powerWatts: 69.85,
      healthy: true,
      healthProblems: [],
      lost: false,
    },
    {
      index: 1,
      uuid: "",
      name: "",
      pciBusId: "00000000:02:00.0",
      migEnabled: false,
      healthy: false,
      healthProblems: [
        { code: "LLMGW_DISCOVERY_GPU_LOST", message: "GPU 1 lost", source: "nvidia-smi" },
      ],
      lost: true,
    },
  ],
  fabrics: [
    {
      id: "roce:10.0.1.0/24",
      linkLayer: "roce",
      idSource: "derived",
      ports: [
        {
          device: "rocep193s0f0",
          port: 1,
          linkLayer: "roce",
          state: "ACTIVE",
          physState: "LinkUp",
          rateGbps: 200,
          netdev: "ens1f0np0",
          gidIndex: 3,
          ipv4: "10.0.1.7",
        },
      ],
    },
  ],
  inactivePorts: [
    { device: "mlx5_2", port: 1, linkLayer: "infiniband", state: "DOWN", physState: "Disabled" },
  ],
  topology: {
    gpuLinks: [{ gpuA: 0, gpuB: 1, path: "NV18", nvlinks: 18 }],
    gpuNics: [],
    gpuAffinity: [],
  },
  problems: [{ code: "LLMGW_DISCOVERY_GPU_LOST", message: "GPU 1 lost", source: "nvidia-smi" }],
  collectedAtUnixMs: 1_700_000_000_000,
};

describe("inventoryToJson", () => {
  const json = JSON.parse(inventoryToJson(inventory));

  it("is lowerCamelCase protobuf JSON with uint64 as strings", () => {
    expect(json.hostname).toBe("gpu-07");
    expect(json.collectedAtUnixMs).toBe("1700000000000");
    expect(json.gpus[0]).toMatchObject({
      index: 0,
      uuid: "GPU-0",
      gpuClass: "h100-80g",
      memoryTotalBytes: String(81559 * 1024 * 1024),
      memoryUsedBytes: "0",
      computeCapability: "9.0",
      utilizationPercent: 0,
      eccUncorrectedErrors: "0",
      healthy: true,
      healthProblems: [],
    });
    expect(json.fabrics[0]).toEqual({
      id: "roce:10.0.1.0/24",
      linkLayer: "roce",
      idSource: "derived",
      ports: [
        {
          device: "rocep193s0f0",
          port: 1,
          linkLayer: "roce",
          state: "ACTIVE",
          physState: "LinkUp",
          rateGbps: 200,
          netdev: "ens1f0np0",
          gidIndex: 3,
          ipv4: "10.0.1.7",
        },
      ],
    });
    expect(json.problems).toEqual([
      { code: "LLMGW_DISCOVERY_GPU_LOST", message: "GPU 1 lost", source: "nvidia-smi" },
    ]);
  });

  it("unreported readings are absent, never 0; healthy=false is present", () => {
    const lost = json.gpus[1];
    for (const key of [
      "memoryTotalBytes",
      "memoryUsedBytes",
      "computeCapability",
      "utilizationPercent",
      "eccUncorrectedErrors",
      "temperatureCelsius",
      "powerWatts",
      "unmanagedMemoryBytes",
    ]) {
      expect(lost, key).not.toHaveProperty(key);
    }
    expect(lost).toMatchObject({ index: 1, healthy: false, lost: true });
    expect(json).not.toHaveProperty("driverVersion");
  });

  it("the wire inventory uses bigint for uint64", () => {
    const msg = inventoryToProto(inventory);
    expect(msg.gpus[0]?.memoryTotalBytes).toBe(BigInt(81559 * 1024 * 1024));
    expect(msg.gpus[1]?.memoryTotalBytes).toBeUndefined();
    expect(msg.host?.memoryBytes).toBe(BigInt(1024 * GIB));
  });
});

describe("formatInventoryTable", () => {
  const text = formatInventoryTable(inventory);
  const lines = text.split("\n");

  it("prints a GPU row with every column, unreported values as '-' never '0'", () => {
    expect(lines.find((l) => l.trimStart().startsWith("0 "))).toMatch(
      /^ {2}0 +NVIDIA H100 80GB HBM3 +h100-80g +0\.0 GiB \/ 79\.6 GiB +0% +41C +0 +ok$/,
    );
    expect(lines.find((l) => l.trimStart().startsWith("1 "))).toMatch(
      /^ {2}1 +- +- +- \/ - +- +- +- +lost$/,
    );
  });

  it("prints active and inactive ports, then problems", () => {
    expect(text).toMatch(
      /rocep193s0f0 +1 +roce:10\.0\.1\.0\/24 +RoCE +ACTIVE\/LinkUp +200 Gb\/s +ens1f0np0/,
    );
    expect(text).toMatch(/mlx5_2 +1 +- +IB +DOWN\/Disabled +- +-/);
    expect(text.indexOf("Problems (1)")).toBeGreaterThan(text.indexOf("Fabric ports (2)"));
    expect(text).toContain("LLMGW_DISCOVERY_GPU_LOST  GPU 1 lost");
  });
});

describe("formatInventoryTable: the HEALTH cell", () => {
  const healthy = inventory.gpus[0] as Gpu;
  /** The HEALTH cell (the row's last column) of a one-GPU table. */
  const cell = (gpu: Gpu) => {
    const row = formatInventoryTable({ ...inventory, gpus: [gpu] })
      .split("\n")
      .find((l) => l.trimStart().startsWith("0 "));
    return row?.split(/ +/).at(-1);
  };
  const withProblem = (code: string) =>
    cell({ ...healthy, healthy: false, healthProblems: [{ code, message: "m", source: "s" }] });

  it.each([
    [ProblemCodes.gpuEccUncorrected, "ecc-errors"],
    [ProblemCodes.gpuUnmanagedMemory, "foreign-processes"],
    [ProblemCodes.gpuMigEnabled, "mig"],
    [ProblemCodes.gpuLost, "lost"],
    [ProblemCodes.gpuRowRemapPending, "row-remap-pending"],
    [ProblemCodes.gpuRowRemapFailure, "row-remap-failed"],
    [ProblemCodes.gpuRetiredPagesPending, "pages-pending"],
    [ProblemCodes.gpuRecoveryAction, "recovery-action"],
    [ProblemCodes.gpuNvlinkInactive, "nvlink-inactive"],
    [ProblemCodes.gpuPcieDegraded, "pcie-degraded"],
    [ProblemCodes.gpuRasUncorrected, "ras-errors"],
    ["LLMGW_SOMETHING_NEW", "LLMGW_SOMETHING_NEW"],
  ])("%s reads %s", (code, word) => {
    expect(withProblem(code)).toBe(word);
  });

  it("names a kernel-log fault by itself, beside the other words", () => {
    // health-formats.md §1.3, verbatim but for its PCI id (rewritten to GPU 0's bus).
    const tracker = createKernelFaultTracker({ clock: () => 1_700_000_000_000 });
    tracker.add("NVRM: Xid (PCI:0000:00:09): 79, GPU has fallen off the bus.", true);
    const ecc = { code: ProblemCodes.gpuEccUncorrected, message: "m", source: "nvidia-smi" };
    const [gpu] = applyKernelFaults(
      [{ ...healthy, healthy: false, healthProblems: [ecc] }],
      tracker.faults(),
    ).gpus;
    expect(cell(gpu as Gpu)).toBe("ecc-errors,xid-79");
  });
});

describe("collectInventory", () => {
  it("simulates when asked, with the clock and version given", async () => {
    const inv = await collectInventory({
      simulate: "2xh100-80g@ib-a",
      agentVersion: "1.0.0",
      clock: () => 5,
      hostname: "s",
    });
    expect(inv).toMatchObject({
      simulated: true,
      agentVersion: "1.0.0",
      collectedAtUnixMs: 5,
      hostname: "s",
    });
    expect(inv.fabrics.map((f) => f.id)).toEqual(["ib-a"]);
  });

  it("discovers otherwise (no nvidia-smi at that path: a problem, not an error)", async () => {
    const inv = await collectInventory({
      nvidiaSmiPath: "/nonexistent/nvidia-smi",
      sysfsRoot: "/nonexistent",
    });
    expect(inv.simulated).toBe(false);
    expect(inv.problems.map((p) => p.code)).toEqual(["LLMGW_DISCOVERY_NVIDIA_SMI_NOT_FOUND"]);
  });
});
