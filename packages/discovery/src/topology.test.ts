import { readFileSync } from "node:fs";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { parseTopology } from "./topology.js";

const fixture = (name: string) =>
  readFileSync(new URL(`../test/fixtures/${name}`, import.meta.url), "utf8");

describe("parseTopology", () => {
  it("single-GPU H200 VM: tabs, ANSI header, ' X ', double tab before GPU NUMA ID", () => {
    const { value, problems } = parseTopology(fixture("topo-h200-single.txt"));
    expect(problems).toEqual([]);
    expect(value).toEqual({
      gpuLinks: [],
      gpuNics: [],
      gpuAffinity: [{ gpu: 0, cpuAffinity: "0-23", numaNode: 0 }],
    });
  });

  it("8×H100 + 8 NICs (sglang#30401, tabs turned to spaces)", () => {
    const { value, problems } = parseTopology(fixture("topo-8xh100-spaces.txt"));
    expect(problems).toEqual([]);
    // rows GPU0, GPU1, GPU4 are in the capture
    expect(value.gpuAffinity).toEqual([
      { gpu: 0, cpuAffinity: "0-47,96-143", numaNode: 0 },
      { gpu: 1, cpuAffinity: "0-47,96-143", numaNode: 0 },
      { gpu: 4, cpuAffinity: "48-95,144-191", numaNode: 1 },
    ]);
    expect(value.gpuLinks).toContainEqual({ gpuA: 0, gpuB: 7, path: "NV18", nvlinks: 18 });
    expect(value.gpuLinks.filter((l) => l.gpuA === 4).map((l) => l.gpuB)).toEqual([5, 6, 7]);
    expect(value.gpuNics.filter((n) => n.gpu === 4)).toEqual([
      { gpu: 4, nic: "mlx5_0", path: "SYS" },
      { gpu: 4, nic: "mlx5_1", path: "SYS" },
      { gpu: 4, nic: "mlx5_2", path: "SYS" },
      { gpu: 4, nic: "mlx5_3", path: "SYS" },
      { gpu: 4, nic: "mlx5_4", path: "PIX" },
      { gpu: 4, nic: "mlx5_5", path: "NODE" },
      { gpu: 4, nic: "mlx5_6", path: "NODE" },
      { gpu: 4, nic: "mlx5_7", path: "NODE" },
    ]);
  });

  it("the same matrix with real tabs, ANSI header and a bonded NIC legend", () => {
    const text = [
      "\t\x1b[4mGPU0\tGPU1\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m",
      "GPU0\t X \tNV12\tPXB\tSYS\t0-31\t0\t\tN/A",
      "GPU1\tNV12\t X \tSYS\tPIX\t32-63\t1\t\tN/A",
      "NIC0\tPXB\tSYS\t X \tSYS",
      "NIC1\tSYS\tPIX\tSYS\t X ",
      "",
      "NIC Legend:",
      "",
      "  NIC0: mlx5_3",
      "  NIC1: mlx5_bond_0",
    ].join("\n");
    const { value } = parseTopology(text);
    expect(value.gpuLinks).toEqual([{ gpuA: 0, gpuB: 1, path: "NV12", nvlinks: 12 }]);
    expect(value.gpuNics).toEqual([
      { gpu: 0, nic: "mlx5_3", path: "PXB" },
      { gpu: 0, nic: "mlx5_bond_0", path: "SYS" },
      { gpu: 1, nic: "mlx5_3", path: "SYS" },
      { gpu: 1, nic: "mlx5_bond_0", path: "PIX" },
    ]);
    expect(value.gpuAffinity).toEqual([
      { gpu: 0, cpuAffinity: "0-31", numaNode: 0 },
      { gpu: 1, cpuAffinity: "32-63", numaNode: 1 },
    ]);
  });

  it.each([
    ["", "empty output"],
    [
      "ERROR: Option -m is missing its value. Please run 'nvidia-smi -h' for help.",
      "Windows Git-Bash",
    ],
  ])("%j (%s) is a problem, not an exception", (text) => {
    const { value, problems } = parseTopology(text);
    expect(value.gpuLinks).toEqual([]);
    expect(problems.map((p) => p.code)).toEqual(["LLMGW_DISCOVERY_TOPOLOGY_FAILED"]);
  });

  it("never throws on arbitrary text", () => {
    fc.assert(
      fc.property(fc.string({ unit: "binary" }), (text) => {
        parseTopology(text);
        parseTopology(`\tGPU0\tGPU1\n${text}`);
      }),
    );
  });
});
