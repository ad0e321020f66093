import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { isDiscoveryError } from "./errors.js";
import { deriveGpuClass } from "./gpu-class.js";
import { parseSimulateSpec, SIMULATED_GPU_MODELS, simulateInventory } from "./simulate.js";

describe("parseSimulateSpec", () => {
  it.each([
    ["8xh100-80g@ib-a", { groups: [{ count: 8, gpuClass: "h100-80g" }], fabric: "ib-a" }],
    [
      "2xh100-80g,1xl40s-45g",
      {
        groups: [
          { count: 2, gpuClass: "h100-80g" },
          { count: 1, gpuClass: "l40s-45g" },
        ],
      },
    ],
    ["2xH100", { groups: [{ count: 2, gpuClass: "h100-80g" }] }],
    [" 1 x A100-40G ", { groups: [{ count: 1, gpuClass: "a100-40g" }] }],
    [
      "4xfoo-12g@roce:10.0.0.0/24",
      { groups: [{ count: 4, gpuClass: "foo-12g" }], fabric: "roce:10.0.0.0/24" },
    ],
  ])("%j", (spec, expected) => {
    expect(parseSimulateSpec(spec)).toEqual(expected);
  });

  it.each([
    ["", "no GPU groups"],
    ["8h100", '"8h100" is not <count>x<class>'],
    ["0xh100-80g", "must be at least 1"],
    ["2xa100", 'unknown GPU class "a100"'],
    ["2xbanana", 'unknown GPU class "banana"'],
    ["2xh100-80g@", 'fabric id ""'],
    ["2000xh100-80g", "more than 1024 GPUs"],
  ])("%j is refused: %s", (spec, why) => {
    let caught: unknown;
    try {
      parseSimulateSpec(spec);
    } catch (error) {
      caught = error;
    }
    expect(isDiscoveryError(caught)).toBe(true);
    expect((caught as Error & { code: string }).code).toBe("LLMGW_DISCOVERY_INVALID_SIMULATE_SPEC");
    expect((caught as Error).message).toContain(why);
  });
});

describe("parseSimulateSpec on arbitrary text", () => {
  it("returns a spec or throws a DiscoveryError, nothing else", () => {
    fc.assert(
      fc.property(
        fc.oneof(fc.string(), fc.stringMatching(/^\d{1,3}x[a-z0-9]{1,6}(-\d{1,3}g)?(@.{0,8})?$/)),
        (text) => {
          try {
            const spec = parseSimulateSpec(text);
            expect(spec.groups.length).toBeGreaterThan(0);
          } catch (error) {
            expect(isDiscoveryError(error)).toBe(true);
          }
        },
      ),
    );
  });
});

describe("simulateInventory", () => {
  it.each(Object.entries(SIMULATED_GPU_MODELS))(
    "known class %s round-trips through deriveGpuClass",
    (gpuClass, model) => {
      expect(deriveGpuClass(model.name, model.memoryTotalMiB)).toBe(gpuClass);
    },
  );

  it("8xh100-80g@ib-a: realistic GPUs, one IB port per GPU, simulated", () => {
    const inv = simulateInventory("8xh100-80g@ib-a", {
      hostname: "gpu-01",
      agentVersion: "1.2.3",
      nowMs: 42,
    });
    expect(inv).toMatchObject({
      hostname: "gpu-01",
      agentVersion: "1.2.3",
      simulated: true,
      collectedAtUnixMs: 42,
    });
    expect(inv.gpus).toHaveLength(8);
    expect(inv.gpus[0]).toMatchObject({
      index: 0,
      name: "NVIDIA H100 80GB HBM3",
      gpuClass: "h100-80g",
      memoryTotalBytes: 81559 * 1024 * 1024,
      computeCapability: "9.0",
      healthy: true,
      lost: false,
    });
    expect(inv.gpus[0]?.uuid).toMatch(
      /^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/,
    );
    expect(new Set(inv.gpus.map((g) => g.uuid)).size).toBe(8);
    expect(inv.fabrics).toHaveLength(1);
    expect(inv.fabrics[0]).toMatchObject({
      id: "ib-a",
      linkLayer: "infiniband",
      idSource: "configured",
    });
    expect(inv.fabrics[0]?.ports.map((p) => p.device)).toEqual([
      "mlx5_0",
      "mlx5_1",
      "mlx5_2",
      "mlx5_3",
      "mlx5_4",
      "mlx5_5",
      "mlx5_6",
      "mlx5_7",
    ]);
  });

  it("uuids are deterministic per hostname and index", () => {
    const a = simulateInventory("2xl4-23g", { hostname: "a" });
    expect(simulateInventory("2xl4-23g", { hostname: "a" }).gpus.map((g) => g.uuid)).toEqual(
      a.gpus.map((g) => g.uuid),
    );
    expect(simulateInventory("2xl4-23g", { hostname: "b" }).gpus[0]?.uuid).not.toBe(
      a.gpus[0]?.uuid,
    );
  });

  it("mixed classes keep indices running; no @fabric means a single-node island", () => {
    const inv = simulateInventory("2xh100-80g,1xl40s-45g");
    expect(inv.gpus.map((g) => [g.index, g.gpuClass])).toEqual([
      [0, "h100-80g"],
      [1, "h100-80g"],
      [2, "l40s-45g"],
    ]);
    expect(inv.fabrics).toEqual([]);
    expect(inv.problems).toEqual([]);
  });

  it("an unknown <model>-<N>g class gets N GiB and no compute capability", () => {
    const gpu = simulateInventory("1xfoo-12g").gpus[0];
    expect(gpu).toMatchObject({ gpuClass: "foo-12g", memoryTotalBytes: 12 * 1024 ** 3 });
    expect(gpu?.computeCapability).toBeUndefined();
  });
});
