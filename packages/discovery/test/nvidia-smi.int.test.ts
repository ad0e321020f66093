import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { createExecFileRunner, type GpuQueryContext, queryNvidiaGpus } from "../src/index.js";
import { type FakeNvidiaSmiRule, writeFakeNvidiaSmi } from "../src/testing/index.js";

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
    expect((await calls())[0]).toEqual([
      "--query-gpu=index,uuid,name,memory.total,memory.used,pci.bus_id,compute_cap,ecc.errors.uncorrected.volatile.total,temperature.gpu,power.draw,mig.mode.current,utilization.gpu",
      "--format=csv,noheader,nounits",
    ]);
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
