import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  createExecFileRunner,
  GPU_QUERY_FIELDS,
  type GpuQueryContext,
  queryNvidiaGpus,
} from "../src/index.js";
import {
  type FakeNvidiaSmiRule,
  stripFixtureComments,
  writeFakeNvidiaSmi,
} from "../src/testing/index.js";

const fixture = async (name: string) =>
  stripFixtureComments(await readFile(new URL(`./fixtures/${name}`, import.meta.url), "utf8"));

const H100 = (index: number, used = 0, extra = "0, 41, 69.85, Disabled, 0") =>
  `${index}, GPU-${index}0000000-0000-0000-0000-000000000000, NVIDIA H100 80GB HBM3, 81559, ${used}, 00000000:0${index}:00.0, 9.0, ${extra}\n`;

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "llmgw-smi-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

async function run(rules: FakeNvidiaSmiRule[], overrides: Partial<GpuQueryContext> = {}) {
  const nvidiaSmiPath = await writeFakeNvidiaSmi(dir, rules);
  return queryNvidiaGpus({
    runner: createExecFileRunner(),
    nvidiaSmiPath,
    timeoutMs: 10_000,
    managedPids: new Set(),
    ...overrides,
  });
}

async function calls(): Promise<string[][]> {
  const text = await readFile(join(dir, "calls.log"), "utf8");
  return text
    .trim()
    .split("\n")
    .map((l) => l.split(" "));
}

describe("queryNvidiaGpus against a fake nvidia-smi executable", () => {
  it("healthy 2×H100: classes, bytes, and the exact query it ran", async () => {
    const { gpus, problems } = await run([
      { when: ["--query-gpu"], stdout: H100(0) + H100(1, 19818, "0, 59, 631.95, Disabled, 100") },
    ]);
    expect(problems).toEqual([]);
    expect(gpus.map((g) => [g.index, g.gpuClass, g.healthy, g.utilizationPercent])).toEqual([
      [0, "h100-80g", true, 0],
      [1, "h100-80g", true, 100],
    ]);
    expect(gpus[1]?.memoryUsedBytes).toBe(19818 * 1024 * 1024);
    expect(gpus[1]?.unmanagedMemoryBytes).toBe(0);
    const all = await calls();
    expect(all[0]).toEqual([
      "--query-gpu=index,uuid,name,memory.total,memory.used,pci.bus_id,compute_cap,ecc.errors.uncorrected.volatile.total,temperature.gpu,power.draw,mig.mode.current,utilization.gpu,remapped_rows.pending,remapped_rows.failure,remapped_rows.correctable,remapped_rows.uncorrectable,retired_pages.single_bit_ecc.count,retired_pages.double_bit.count,retired_pages.pending,clocks_event_reasons.active,pcie.link.gen.gpucurrent,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,gpu_recovery_action",
      "--format=csv,noheader,nounits",
    ]);
    // Compute apps and NVLink run side by side, so their order is not fixed.
    expect(
      all
        .slice(1)
        .map((c) => c.join(" ").split("=")[0])
        .sort(),
    ).toEqual(["--query-compute-apps", "nvlink -s"]);
  });

  it("nvidia-smi missing (ENOENT): one not-found problem, no GPUs", async () => {
    const { gpus, problems } = await run([], { nvidiaSmiPath: join(dir, "no-such-nvidia-smi") });
    expect(gpus).toEqual([]);
    expect(problems.map((p) => p.code)).toEqual(["LLMGW_DISCOVERY_NVIDIA_SMI_NOT_FOUND"]);
    expect(problems[0]?.message).toContain("nvidia-smi not found");
  });

  it("nvidia-smi hanging: killed after timeoutMs and reported", async () => {
    const started = Date.now();
    const { gpus, problems } = await run([{ when: [], sleepMs: 60_000 }], { timeoutMs: 1_500 });
    expect(Date.now() - started).toBeLessThan(30_000);
    expect(gpus).toEqual([]);
    expect(problems.map((p) => p.code)).toEqual(["LLMGW_DISCOVERY_NVIDIA_SMI_TIMEOUT"]);
    expect(problems[0]?.message).toContain("did not finish within 1500 ms");
  });

  it("exit 2 on unknown optional fields (R470): retried without them, GPUs kept", async () => {
    const { gpus, problems } = await run([
      {
        when: ["utilization.gpu"],
        stdout: 'Field "utilization.gpu" is not a valid field to query.\n\n',
        exitCode: 2,
      },
      {
        when: ["compute_cap"],
        stdout: 'Field "compute_cap" is not a valid field to query.\n\n',
        exitCode: 2,
      },
      {
        when: ["--query-gpu"],
        stdout:
          "0, GPU-aa, NVIDIA A100-SXM4-80GB, 81251, 5, 00000000:07:00.0, 0, 30, 60.00, Disabled\n",
      },
    ]);
    expect(gpus).toHaveLength(1);
    expect(gpus[0]).toMatchObject({
      gpuClass: "a100-80g",
      temperatureCelsius: 30,
      eccUncorrectedErrors: 0,
    });
    expect(gpus[0]?.computeCapability).toBeUndefined();
    expect(gpus[0]?.utilizationPercent).toBeUndefined();
    expect(problems.map((p) => p.message)).toEqual([
      'this nvidia-smi does not know "utilization.gpu"; queried without it (value unreported)',
      'this nvidia-smi does not know "compute_cap"; queried without it (value unreported)',
    ]);
    expect((await calls()).filter((c) => c[0]?.startsWith("--query-gpu"))).toHaveLength(3);
  });

  it("exit 2 on a required field: no GPUs and a clear problem (no endless retry)", async () => {
    const { gpus, problems } = await run([
      {
        when: ["--query-gpu"],
        stdout: 'Field "mig.mode.current" is not a valid field to query.\n\n',
        exitCode: 2,
      },
    ]);
    expect(gpus).toEqual([]);
    expect(problems.map((p) => p.code)).toEqual(["LLMGW_DISCOVERY_NVIDIA_SMI_FIELD_UNSUPPORTED"]);
    expect((await calls()).length).toBe(1);
  });

  it("exit 15 on a lost GPU: per-GPU -i queries keep the others, the lost one is marked", async () => {
    const lost =
      "Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost. Reboot the system to recover this GPU\n";
    const { gpus, problems } = await run([
      { when: ["-i 0 "], stdout: H100(0) },
      { when: ["-i 1 "], stdout: lost, exitCode: 15 },
      { when: ["-i 2 "], stdout: H100(2) },
      { when: ["-i "], stdout: "No devices were found\n", exitCode: 6 },
      { when: ["--query-gpu"], stdout: lost, exitCode: 15 },
    ]);
    expect(gpus.map((g) => [g.index, g.lost, g.healthy])).toEqual([
      [0, false, true],
      [1, true, false],
      [2, false, true],
    ]);
    expect(gpus[1]).toMatchObject({ pciBusId: "00000000:02:00.0", uuid: "" });
    expect(gpus[1]?.healthProblems.map((p) => p.code)).toEqual(["LLMGW_DISCOVERY_GPU_LOST"]);
    expect(problems.map((p) => p.code)).toEqual(["LLMGW_DISCOVERY_GPU_LOST"]);
    expect(problems[0]?.message).toContain("GPU is lost. Reboot the system");
  });

  it("exit 255 'Unknown Error' on every -i: stops at the repeated bus id", async () => {
    const { gpus } = await run([
      {
        when: [],
        stdout: "Unable to determine the device handle for GPU0000:17:00.0: Unknown Error\n",
        exitCode: 255,
      },
    ]);
    expect(gpus.map((g) => [g.index, g.lost, g.pciBusId])).toEqual([[0, true, "00000000:17:00.0"]]);
    expect((await calls()).length).toBe(3);
  });

  it.each([
    [
      18,
      "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 535.161\n",
      "LLMGW_DISCOVERY_NVIDIA_SMI_DRIVER_MISMATCH",
    ],
    [
      9,
      "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\n",
      "LLMGW_DISCOVERY_NVIDIA_SMI_DRIVER_NOT_LOADED",
    ],
    [6, "No devices were found\n", "LLMGW_DISCOVERY_NVIDIA_SMI_FAILED"],
  ])("exit %i is a distinct problem", async (exitCode, stdout, code) => {
    const { gpus, problems } = await run([{ when: [], stdout, exitCode }]);
    expect(gpus).toEqual([]);
    expect(problems.map((p) => p.code)).toEqual([code]);
    expect(problems[0]?.message).toContain(stdout.split("\n")[0]);
  });

  it("health: ECC errors, MIG, unmanaged processes (managed pids excluded); [N/A]/[Unknown Error] unset", async () => {
    const { gpus, problems } = await run(
      [
        {
          when: ["--query-gpu"],
          stdout:
            H100(0, 4000, "3, 41, 69.85, Disabled, 0") +
            H100(1, 11125, "0, 53, 433.78, Enabled, [N/A]") +
            H100(2, 20000, "[Unknown Error], [Not Supported], , Disabled, 50"),
        },
        {
          when: ["--query-compute-apps"],
          stdout:
            "GPU-20000000-0000-0000-0000-000000000000, 11327, /root/tools/memhog, 2566\n" +
            "GPU-20000000-0000-0000-0000-000000000000, 4242, python3 -m vllm, 15000\n" +
            "GPU-00000000-0000-0000-0000-000000000000, 4243, python3 -m vllm, 4000\n",
        },
      ],
      { managedPids: new Set([4242, 4243]) },
    );
    expect(problems).toEqual([]);
    const [g0, g1, g2] = gpus;
    expect(g0?.healthProblems.map((p) => p.code)).toEqual(["LLMGW_DISCOVERY_GPU_ECC_UNCORRECTED"]);
    expect(g0?.unmanagedMemoryBytes).toBe(0);
    expect(g1).toMatchObject({ migEnabled: true, healthy: false });
    expect(g1?.utilizationPercent).toBeUndefined();
    expect(g2?.healthProblems.map((p) => p.message)).toEqual([
      "GPU 2 (GPU-20000000-0000-0000-0000-000000000000) has memory held by processes llmgw does not manage: /root/tools/memhog (pid 11327, 2566 MiB)",
    ]);
    expect(g2?.unmanagedMemoryBytes).toBe(2566 * 1024 * 1024);
    expect(g2?.eccUncorrectedErrors).toBeUndefined();
    expect(g2?.temperatureCelsius).toBeUndefined();
    expect(g2?.powerWatts).toBeUndefined();
  });

  it("Windows process names with spaces and backslashes are reported intact", async () => {
    const { gpus } = await run([
      {
        when: ["--query-gpu"],
        stdout:
          "0, GPU-00000000-0000-0000-0000-000000000000, NVIDIA GeForce RTX 2080 SUPER, 8192, 1296, 00000000:0C:00.0, 7.5, [N/A], 45, 97.43, [N/A], 7\r\n",
      },
      {
        when: ["--query-compute-apps"],
        stdout:
          "GPU-00000000-0000-0000-0000-000000000000, 9912, C:\\Program Files\\Mozilla Firefox\\firefox.exe, [N/A]\r\n",
      },
    ]);
    expect(gpus[0]?.gpuClass).toBe("rtx2080super-8g");
    expect(gpus[0]?.unmanagedMemoryBytes).toBeUndefined();
    expect(gpus[0]?.healthProblems[0]?.message).toContain(
      "C:\\Program Files\\Mozilla Firefox\\firefox.exe (pid 9912, unreported)",
    );
  });

  it("a truncated row is skipped with a problem; the complete rows survive", async () => {
    const { gpus, problems } = await run([
      {
        when: ["--query-gpu"],
        stdout: `${H100(0)}1, GPU-10000000-0000-0000-0000-000000000000, NVIDIA H100 80`,
      },
    ]);
    expect(gpus.map((g) => g.index)).toEqual([0]);
    expect(problems.map((p) => p.code)).toEqual(["LLMGW_DISCOVERY_GPU_ROW_INVALID"]);
  });

  it("compute-apps failing is a problem, GPU readings are kept", async () => {
    const { gpus, problems } = await run([
      { when: ["--query-compute-apps"], stdout: "Unknown Error\n", exitCode: 255 },
      { when: ["--query-gpu"], stdout: H100(0) },
    ]);
    expect(gpus).toHaveLength(1);
    expect(gpus[0]?.unmanagedMemoryBytes).toBeUndefined();
    expect(problems.map((p) => p.code)).toEqual(["LLMGW_DISCOVERY_COMPUTE_APPS_FAILED"]);
  });
});

describe("queryNvidiaGpus health readings (health-formats.md §2)", () => {
  const FIELDS = GPU_QUERY_FIELDS.map((f) => f.field);
  const at = (field: string) => FIELDS.indexOf(field);
  /** The reconstructed H100 idle row (see the fixture's header) with some cells replaced. */
  const h100Row = async (index: number, edits: Record<string, string> = {}) => {
    const cells = (await fixture("query-gpu-h100-idle-health.txt")).trim().split(", ");
    cells[0] = String(index);
    cells[1] = `GPU-${index}0000000-0000-0000-0000-000000000000`;
    cells[at("pci.bus_id")] = `00000000:0${index}:00.0`;
    for (const [field, value] of Object.entries(edits)) cells[at(field)] = value;
    return `${cells.join(", ")}\n`;
  };

  it("H100 idle with 18 NVLinks: every reading, healthy, no problems", async () => {
    const { gpus, problems } = await run([
      { when: ["--query-gpu"], stdout: await fixture("query-gpu-h100-idle-health.txt") },
      { when: ["nvlink", "-s"], stdout: await fixture("nvlink-status-h100.txt") },
    ]);
    expect(problems).toEqual([]);
    expect(gpus[0]).toMatchObject({ healthy: true, healthProblems: [] });
    expect(gpus[0]?.health).toEqual({
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
      nvlinksTotal: 18,
      nvlinksInactive: 0,
    });
  });

  it("a driver printing shorter rows (the real rows' trailing cells cut): every GPU kept", async () => {
    const { gpus, problems } = await run([
      {
        when: ["--query-gpu"],
        stdout:
          (await fixture("query-gpu-h100-idle.txt")) +
          (await fixture("query-gpu-h100-mig-health.txt")).replace(/^0, GPU-0/, "1, GPU-1"),
      },
    ]);
    expect(problems).toEqual([]);
    expect(gpus.map((g) => [g.index, g.health, g.migEnabled])).toEqual([
      [0, undefined, false],
      [1, undefined, true],
    ]);
  });

  const optional = GPU_QUERY_FIELDS.filter((f) => f.optional);
  it.each(optional.map((f) => f.field))(
    "%s unknown to this nvidia-smi (exit 2): GPU kept, that reading alone unreported",
    async (field) => {
      const spec = optional.find((f) => f.field === field);
      const full = (await fixture("query-gpu-h100-idle-health.txt")).trim().split(", ");
      const reject = (name: string): FakeNvidiaSmiRule => ({
        when: [name],
        stdout: `Field "${name}" is not a valid field to query.\n\n`,
        exitCode: 2,
      });
      const rules = [reject(field)];
      if (spec?.fallback !== undefined) rules.push(reject(spec.fallback));
      rules.push({
        when: ["--query-gpu"],
        stdout: `${full.filter((_, i) => i !== at(field)).join(", ")}\n`,
      });
      const { gpus, problems } = await run(rules);
      expect(gpus.map((g) => g.uuid)).toEqual(["GPU-00000000-0000-0000-0000-000000000000"]);
      expect(problems.map((p) => p.code)).toEqual(["LLMGW_DISCOVERY_NVIDIA_SMI_FIELD_UNSUPPORTED"]);
      expect(gpus[0]?.healthy).toBe(true);
      const queries = (await calls()).filter((c) => c[0]?.startsWith("--query-gpu"));
      expect(queries).toHaveLength(spec?.fallback === undefined ? 2 : 3);
      expect(queries.at(-1)?.[0]).not.toContain(field);
    },
  );

  it.each([
    [
      "clocks_event_reasons.active",
      "clocks_throttle_reasons.active",
      "clocksEventReasonsActive",
      1,
    ],
    ["pcie.link.gen.gpucurrent", "pcie.link.gen.current", "pcieLinkGenCurrent", 5],
  ])("%s unknown: its old name %s is asked instead, nothing lost", async (field, old, key, v) => {
    const row = await fixture("query-gpu-h100-idle-health.txt");
    const { gpus, problems } = await run([
      { when: [field], stdout: `Field "${field}" is not a valid field to query.\n\n`, exitCode: 2 },
      { when: [old], stdout: row },
    ]);
    expect(problems).toEqual([]);
    expect(gpus[0]?.health?.[key as "pcieLinkGenCurrent"]).toBe(v);
    const queries = (await calls()).filter((c) => c[0]?.startsWith("--query-gpu"));
    expect(queries.map((q) => q[0]?.includes(old))).toEqual([false, true]);
  });

  it("health problems say what is wrong and what to do; clock-event reasons never do", async () => {
    const { gpus, problems } = await run([
      {
        when: ["--query-gpu"],
        stdout:
          // `Pending : Yes` with `Uncorrectable Error : 4` is a real faulted pair (gpud#80, -q).
          (await h100Row(0, {
            "remapped_rows.pending": "Yes",
            "remapped_rows.uncorrectable": "4",
          })) +
          (await h100Row(1, { "remapped_rows.failure": "Yes" })) +
          (await h100Row(2, { "retired_pages.pending": "Yes" })) +
          // "Reset" is the one non-None -q spelling the reference has (§2.2, uncertain).
          (await h100Row(3, { gpu_recovery_action: "Reset" })) +
          // 0x40 HW thermal slowdown + 0x4 SW power cap: a reading, not a fault.
          (await h100Row(4, { "clocks_event_reasons.active": "0x0000000000000044" })),
      },
    ]);
    expect(problems).toEqual([]);
    expect(gpus.map((g) => [g.index, g.healthy, g.healthProblems.map((p) => p.message)])).toEqual([
      [
        0,
        false,
        [
          "GPU 0 (GPU-00000000-0000-0000-0000-000000000000) has a row remap pending: drain it and reset the GPU so the remap takes effect",
        ],
      ],
      [
        1,
        false,
        [
          "GPU 1 (GPU-10000000-0000-0000-0000-000000000000) failed to remap a row (memory it cannot repair): drain it and have the GPU serviced",
        ],
      ],
      [
        2,
        false,
        [
          "GPU 2 (GPU-20000000-0000-0000-0000-000000000000) has retired pages pending: drain it and reset the GPU (or reload the driver) to retire them",
        ],
      ],
      [
        3,
        false,
        [
          'GPU 3 (GPU-30000000-0000-0000-0000-000000000000) reports GPU recovery action "Reset": drain it and carry out that action before it serves again',
        ],
      ],
      [4, true, []],
    ]);
    expect(gpus.map((g) => g.healthProblems[0]?.code)).toEqual([
      "LLMGW_DISCOVERY_GPU_ROW_REMAP_PENDING",
      "LLMGW_DISCOVERY_GPU_ROW_REMAP_FAILURE",
      "LLMGW_DISCOVERY_GPU_RETIRED_PAGES_PENDING",
      "LLMGW_DISCOVERY_GPU_RECOVERY_ACTION",
      undefined,
    ]);
    expect(gpus[0]?.health?.remappedRowsUncorrectable).toBe(4);
    expect(gpus[4]?.health?.clocksEventReasonsActive).toBe(0x44);
  });

  // No capture shows a degraded link under load; these rows edit the real tokens (gen 5 of 5,
  // x16 of 16) to simulate one. Idle: §2.1's RTX 2080 reads gen 1 of 3 at idle, which is normal.
  it.each([
    [
      "gen below max at 100% busy",
      { "utilization.gpu": "100", "pcie.link.gen.gpucurrent": "4" },
      true,
    ],
    [
      "width below max at 50% busy",
      { "utilization.gpu": "50", "pcie.link.width.current": "8" },
      true,
    ],
    [
      "gen below max at 49% busy",
      { "utilization.gpu": "49", "pcie.link.gen.gpucurrent": "1" },
      false,
    ],
    ["idle, gen 1 of 5", { "utilization.gpu": "0", "pcie.link.gen.gpucurrent": "1" }, false],
    [
      "MIG (utilisation [N/A]), x8",
      { "utilization.gpu": "[N/A]", "pcie.link.width.current": "8" },
      false,
    ],
    ["full link at 100% busy", { "utilization.gpu": "100" }, false],
  ])("PCIe: %s → degraded %s", async (_, edits, degraded) => {
    const { gpus } = await run([{ when: ["--query-gpu"], stdout: await h100Row(0, edits) }]);
    expect(gpus[0]?.healthProblems.map((p) => p.code)).toEqual(
      degraded ? ["LLMGW_DISCOVERY_GPU_PCIE_DEGRADED"] : [],
    );
  });

  it("PCIe degraded message names both links and the load", async () => {
    const { gpus } = await run([
      {
        when: ["--query-gpu"],
        stdout: await h100Row(0, { "utilization.gpu": "100", "pcie.link.width.current": "8" }),
      },
    ]);
    expect(gpus[0]?.healthProblems[0]?.message).toBe(
      "GPU 0 (GPU-00000000-0000-0000-0000-000000000000) PCIe link runs at gen 5 x8 below its max gen 5 x16 while 100% busy: check the slot, riser and cabling (reseat the GPU)",
    );
  });

  it("NVLink: two <inactive> links (V100 capture, matched by index) make GPU 3 unhealthy", async () => {
    const { gpus, problems } = await run([
      { when: ["--query-gpu"], stdout: (await h100Row(0)) + (await h100Row(3)) },
      {
        when: ["nvlink", "-s"],
        stdout:
          (await fixture("nvlink-status-h100.txt")) +
          (await fixture("nvlink-status-v100-inactive.txt")),
      },
    ]);
    expect(problems).toEqual([]);
    expect(gpus.map((g) => [g.health?.nvlinksTotal, g.health?.nvlinksInactive])).toEqual([
      [18, 0],
      [6, 2],
    ]);
    expect(gpus[0]?.healthy).toBe(true);
    expect(gpus[1]?.healthProblems.map((p) => [p.code, p.message])).toEqual([
      [
        "LLMGW_DISCOVERY_GPU_NVLINK_INACTIVE",
        "GPU 3 (GPU-30000000-0000-0000-0000-000000000000) has 2 of 6 NVLinks inactive: check the fabric manager and the NVLink/NVSwitch state (nvidia-smi nvlink -s), then reset the GPU",
      ],
    ]);
  });

  it("NVLink: a GPU whose uuid the header names is never matched by index instead", async () => {
    const { gpus } = await run([
      { when: ["--query-gpu"], stdout: await h100Row(1) },
      // The header says GPU 0 … GPU-00000000-…; our GPU 1 has another uuid.
      { when: ["nvlink", "-s"], stdout: await fixture("nvlink-status-h100.txt") },
    ]);
    expect(gpus[0]?.health?.nvlinksTotal).toBeUndefined();
  });

  it.each([
    ["MIG refusal, exit 0", 0],
    ["MIG refusal, non-zero exit (code not captured)", 3],
  ])("NVLink: %s → no reading, no problem", async (_, exitCode) => {
    const { gpus, problems } = await run([
      { when: ["--query-gpu"], stdout: await h100Row(0) },
      {
        when: ["nvlink", "-s"],
        stdout: "Nvlink queries are not supported for Devices in MIG mode\n",
        exitCode,
      },
    ]);
    expect(problems).toEqual([]);
    expect(gpus[0]?.health?.nvlinksTotal).toBeUndefined();
    expect(gpus[0]?.healthy).toBe(true);
  });

  it("NVLink: a real failure is a node problem; readings unreported, never 'all active'", async () => {
    const { gpus, problems } = await run([
      { when: ["--query-gpu"], stdout: await h100Row(0) },
      {
        when: ["nvlink", "-s"],
        stdout: "Failed to initialize NVML: Unknown Error\n",
        exitCode: 255,
      },
    ]);
    expect(gpus.map((g) => [g.index, g.health?.nvlinksTotal])).toEqual([[0, undefined]]);
    expect(problems.map((p) => p.code)).toEqual(["LLMGW_DISCOVERY_NVIDIA_SMI_FAILED"]);
    expect(problems[0]?.message).toContain("nvidia-smi nvlink -s failed (exit 255)");
  });

  it("NVLink: a hung query is killed after the same timeout; GPUs kept", async () => {
    const { gpus, problems } = await run(
      [
        { when: ["--query-gpu"], stdout: await h100Row(0) },
        { when: ["nvlink", "-s"], sleepMs: 60_000 },
      ],
      { timeoutMs: 1_500 },
    );
    expect(gpus).toHaveLength(1);
    expect(problems.map((p) => p.message)).toEqual([
      "nvidia-smi nvlink -s did not finish within 1500 ms and was killed (hung driver?)",
    ]);
  });

  it("lost GPU, verbatim stdout of §2.5 (exit 15, GPU0000:C3, two spaces): others kept", async () => {
    const lost =
      "Unable to determine the device handle for GPU0000:C3:00.0: GPU is lost.  Reboot the system to recover this GPU\n";
    const { gpus, problems } = await run([
      { when: ["-i 0 ", "--query-gpu"], stdout: await h100Row(0) },
      {
        when: ["-i 0 ", "--query-compute-apps"],
        stdout: "GPU-00000000-0000-0000-0000-000000000000, 11345, ./gpu_burn, 15690\n",
      },
      { when: ["-i 1 "], stdout: lost, exitCode: 15 },
      { when: ["-i "], stdout: "No devices were found\n", exitCode: 6 },
      { when: [], stdout: lost, exitCode: 15 },
    ]);
    expect(gpus.map((g) => [g.index, g.lost, g.pciBusId])).toEqual([
      [0, false, "00000000:00:00.0"],
      [1, true, "00000000:C3:00.0"],
    ]);
    expect(gpus[0]?.health?.recoveryAction).toBe("None");
    // Compute apps fail as a whole too, so the healthy GPU is asked alone (`-i 0`).
    expect(gpus[0]?.unmanagedMemoryBytes).toBe(15690 * 1024 * 1024);
    // nvlink -s fails on the lost GPU too; that is the lost GPU, not a second problem.
    expect(problems.map((p) => p.message)).toEqual([
      "GPU 1 at 00000000:C3:00.0 cannot be queried (lost): GPU is lost.  Reboot the system to recover this GPU",
    ]);
    expect((await calls()).map((c) => c.slice(0, 3).join(" ").split("=")[0])).toContain(
      "-i 0 --query-compute-apps",
    );
  });

  it("'Failed to initialize NVML: Unknown Error' (exit 255, §2.5): a node problem, no probing", async () => {
    const { gpus, problems } = await run([
      { when: [], stdout: "Failed to initialize NVML: Unknown Error\n", exitCode: 255 },
    ]);
    expect(gpus).toEqual([]);
    expect(problems.map((p) => [p.code, p.message])).toEqual([
      [
        "LLMGW_DISCOVERY_NVIDIA_SMI_FAILED",
        "nvidia-smi --query-gpu failed (exit 255): Failed to initialize NVML: Unknown Error: no GPU can be read; check the kernel log for Xid 79 (fallen off the bus) and the device nodes, then reboot",
      ],
    ]);
    expect(await calls()).toHaveLength(1);
  });
});
