import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { discoverNode, readGpuReadings } from "../src/index.js";
import { writeFakeNvidiaSmi, writeTree } from "../src/testing/index.js";

const fixture = (name: string) => readFile(new URL(`./fixtures/${name}`, import.meta.url), "utf8");
/** An AMD fixture's JSON without its `#` provenance header. */
const amdFixture = async (name: string) =>
  (await fixture(name))
    .split("\n")
    .filter((line) => !line.startsWith("#"))
    .join("\n");

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "llmgw-discover-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe("discoverNode", () => {
  it("composes GPUs, topology, fabrics and host facts from a fake nvidia-smi and sysfs", async () => {
    const nvidiaSmiPath = await writeFakeNvidiaSmi(join(dir, "bin"), [
      { when: ["--query-gpu"], stdout: await fixture("query-gpu-h100-idle.txt") },
      { when: ["--query-compute-apps"], stdout: "" },
      { when: ["topo", "-m"], stdout: await fixture("topo-h200-single.txt") },
      { when: ["--version"], stdout: await fixture("nvidia-smi-version-590.txt") },
    ]);
    const sysfsRoot = join(dir, "infiniband");
    await writeTree(sysfsRoot, {
      "mlx5_0/ports/1/state": "4: ACTIVE\n",
      "mlx5_0/ports/1/phys_state": "5: LinkUp\n",
      "mlx5_0/ports/1/link_layer": "InfiniBand\n",
      "mlx5_0/ports/1/rate": "400 Gb/sec (4X NDR)\n",
      "mlx5_0/ports/1/sm_lid": "0x1\n",
      "mlx5_0/ports/1/gids/0": "fe80:0000:0000:0000:506b:4b03:00f5:ce9c\n",
    });
    const inv = await discoverNode({
      nvidiaSmiPath,
      sysfsRoot,
      hostname: "node-a",
      agentVersion: "9.9.9",
      clock: () => 1234,
      fabricNames: { mlx5_0: "ib-a" },
    });
    expect(inv).toMatchObject({
      hostname: "node-a",
      agentVersion: "9.9.9",
      simulated: false,
      collectedAtUnixMs: 1234,
      driverVersion: "590.48.01",
    });
    expect(inv.problems).toEqual([]);
    expect(inv.gpus.map((g) => g.gpuClass)).toEqual(["h100-80g"]);
    expect(inv.topology.gpuAffinity).toEqual([{ gpu: 0, cpuAffinity: "0-23", numaNode: 0 }]);
    expect(inv.fabrics.map((f) => [f.id, f.idSource, f.ports[0]?.rateGbps])).toEqual([
      ["ib-a", "configured", 400],
    ]);
    expect(inv.host.cpuCount).toBeGreaterThan(0);
    expect(inv.host.memoryBytes).toBeGreaterThan(0);
  });

  it("this GPU-less machine shape: nvidia-smi missing, no sysfs → empty inventory, one problem", async () => {
    const inv = await discoverNode({
      nvidiaSmiPath: join(dir, "missing-nvidia-smi"),
      amdSmiPath: join(dir, "missing-amd-smi"),
      rocmSmiPath: join(dir, "missing-rocm-smi"),
      sysfsRoot: join(dir, "no-infiniband"),
    });
    expect(inv.gpus).toEqual([]);
    expect(inv.fabrics).toEqual([]);
    expect(inv.topology).toEqual({ gpuLinks: [], gpuNics: [], gpuAffinity: [] });
    expect(inv.problems.map((p) => p.code)).toEqual(["LLMGW_DISCOVERY_NVIDIA_SMI_NOT_FOUND"]);
  });

  it("topology failure is a problem, GPUs stay", async () => {
    const nvidiaSmiPath = await writeFakeNvidiaSmi(join(dir, "bin"), [
      { when: ["--query-gpu"], stdout: await fixture("query-gpu-l40s.txt") },
      {
        when: ["topo"],
        stdout: "ERROR: Option -m is missing its value. Please run 'nvidia-smi -h' for help.\n",
        exitCode: 255,
      },
    ]);
    const inv = await discoverNode({ nvidiaSmiPath, sysfsRoot: join(dir, "none") });
    expect(inv.gpus.map((g) => g.gpuClass)).toEqual(["l40s-45g"]);
    expect(inv.driverVersion).toBeUndefined();
    expect(inv.problems.map((p) => p.code)).toEqual(["LLMGW_DISCOVERY_TOPOLOGY_FAILED"]);
  });

  it("readGpuReadings reruns only the GPU queries (no topo)", async () => {
    const bin = join(dir, "bin");
    const nvidiaSmiPath = await writeFakeNvidiaSmi(bin, [
      { when: ["--query-gpu"], stdout: await fixture("query-gpu-h100-mig.txt") },
    ]);
    const { gpus, problems } = await readGpuReadings({ nvidiaSmiPath });
    expect(problems).toEqual([]);
    expect(gpus[0]).toMatchObject({
      migEnabled: true,
      healthy: false,
      memoryUsedBytes: 11125 * 1024 * 1024,
    });
    const calls = (await readFile(join(bin, "calls.log"), "utf8")).trim().split("\n");
    // Compute apps and `nvlink -s` run side by side after the GPU query: order them.
    expect(calls.map((c) => c.split("=")[0]).sort()).toEqual([
      "--query-compute-apps",
      "--query-gpu",
      "nvlink -s",
    ]);
  });
});

describe("discoverNode on AMD nodes (fake amd-smi / rocm-smi executables)", () => {
  const fakeAmdSmi = async (bin: string) =>
    writeFakeNvidiaSmi(bin, [
      { when: ["list", "--json"], stdout: await amdFixture("amd-smi-list-mi210.txt") },
      { when: ["static", "--json"], stdout: await amdFixture("amd-smi-static-mi350x.txt") },
      {
        when: ["metric", "--json"],
        stdout: await amdFixture("amd-smi-metric-radeon-gpu-data.txt"),
      },
    ]);

  it("an AMD-only node: amd-smi GPUs, no nvidia-smi problem, no topology run", async () => {
    const amdSmiPath = await fakeAmdSmi(join(dir, "amd"));
    const inv = await discoverNode({
      nvidiaSmiPath: join(dir, "missing-nvidia-smi"),
      amdSmiPath,
      rocmSmiPath: join(dir, "missing-rocm-smi"),
      sysfsRoot: join(dir, "none"),
    });
    expect(inv.problems).toEqual([]);
    expect(inv.topology).toEqual({ gpuLinks: [], gpuNics: [], gpuAffinity: [] });
    expect(inv.gpus.map((g) => [g.index, g.vendor, g.pciBusId, g.name, g.gpuClass])).toEqual([
      [0, "amd", "00000000:23:00.0", "AMD Instinct MI350X", "mi350x-30g"],
    ]);
    const calls = (await readFile(join(dir, "amd", "calls.log"), "utf8")).trim().split("\n");
    expect(calls.sort()).toEqual(["list --json", "metric --json", "static --json"]);
  });

  it("amd-smi missing: rocm-smi is the fallback, in discovery and in heartbeat readings", async () => {
    const rocmSmiPath = await writeFakeNvidiaSmi(join(dir, "rocm"), [
      {
        when: ["--showallinfo", "--json"],
        stdout: await amdFixture("amd-rocm-smi-phoenix3.txt"),
      },
    ]);
    const options = {
      nvidiaSmiPath: join(dir, "missing-nvidia-smi"),
      amdSmiPath: join(dir, "missing-amd-smi"),
      rocmSmiPath,
      sysfsRoot: join(dir, "none"),
    };
    const inv = await discoverNode(options);
    const readings = await readGpuReadings(options);
    for (const report of [inv, readings]) {
      expect(report.problems).toEqual([]);
      expect(report.gpus.map((g) => [g.index, g.vendor, g.pciBusId, g.name])).toEqual([
        [0, "amd", "00000000:C4:00.0", "Phoenix3"],
      ]);
    }
  });

  it("a node with both vendors: NVIDIA first, AMD numbered after the last NVIDIA index", async () => {
    const nvidiaSmiPath = await writeFakeNvidiaSmi(join(dir, "nv"), [
      { when: ["--query-gpu"], stdout: await fixture("query-gpu-h100-idle.txt") },
      { when: ["topo", "-m"], stdout: await fixture("topo-h200-single.txt") },
    ]);
    const amdSmiPath = await fakeAmdSmi(join(dir, "amd"));
    const options = { nvidiaSmiPath, amdSmiPath, sysfsRoot: join(dir, "none") };
    const inv = await discoverNode(options);
    const readings = await readGpuReadings(options);
    for (const gpus of [inv.gpus, readings.gpus]) {
      expect(gpus.map((g) => [g.index, g.vendor ?? "nvidia"])).toEqual([
        [0, "nvidia"],
        [1, "amd"],
      ]);
    }
    expect(inv.topology.gpuAffinity).toEqual([{ gpu: 0, cpuAffinity: "0-23", numaNode: 0 }]);
  });
});
