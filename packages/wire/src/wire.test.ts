import { create, toJson } from "@bufbuild/protobuf";
import { simulateInventory } from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import { DeploymentSchema, GpuReadingSchema, NodeInventorySchema } from "@llmgw/proto";
import { describe, expect, it } from "vitest";
import {
  deploymentSpecFromProto,
  deploymentSpecToProto,
  gpuHealthy,
  gpuReadingFromProto,
  gpuReadingToProto,
  inventoryFromProto,
  inventoryToProto,
  sameDeploymentSpec,
} from "./index.js";

describe("inventory", () => {
  it.each(["1xh100-80g", "8xh100-80g@ib-a", "2xh100-80g,1xl40s-45g@roce-1"])(
    "round-trips the simulated node %s unchanged",
    (spec) => {
      const inv = simulateInventory(spec, { hostname: "n1", nowMs: 1_700_000_000_000 });
      expect(inventoryFromProto(inventoryToProto(inv))).toEqual(JSON.parse(JSON.stringify(inv)));
    },
  );

  it("round-trips a heartbeat's reading, faults and health readings included", () => {
    const inv = simulateInventory("1xh100-80g", { hostname: "n1", nowMs: 1 });
    const gpu = inv.gpus[0];
    if (!gpu) throw new Error("no gpu");
    const live = {
      index: gpu.index,
      uuid: gpu.uuid,
      memoryUsedBytes: 2 ** 40,
      utilizationPercent: 37,
      temperatureCelsius: 61,
      healthy: false,
      healthProblems: [
        { code: "LLMGW_DISCOVERY_GPU_FAULT", message: "Xid 79", source: "kernel-log" },
      ],
      lost: false,
      health: { remappedRowsPending: true, pcieLinkWidthCurrent: 8 },
      faults: [
        {
          kind: "xid" as const,
          code: 79,
          action: "reset-gpu" as const,
          pciBusId: "00000000:06:00.0",
          count: 2,
          firstSeenUnixMs: 1_000,
          lastSeenUnixMs: 2_000,
          evidence: "NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.",
          description: "GPU has fallen off the bus",
        },
      ],
    };
    expect(gpuReadingFromProto(gpuReadingToProto(live))).toEqual(JSON.parse(JSON.stringify(live)));
    // Unset stays unset: no reading becomes 0 on its way through.
    const bare = gpuReadingFromProto(
      gpuReadingToProto({
        index: 0,
        uuid: gpu.uuid,
        healthy: true,
        healthProblems: [],
        lost: false,
      }),
    );
    expect(bare.memoryUsedBytes).toBeUndefined();
    expect(bare.utilizationPercent).toBeUndefined();
    expect(bare.health).toBeUndefined();
    expect(bare).not.toHaveProperty("faults");
  });

  it("keeps unreported readings absent on the wire, never 0", () => {
    const inv = simulateInventory("1xh100-80g", { hostname: "n1", nowMs: 1 });
    const gpu = inv.gpus[0];
    if (!gpu) throw new Error("no gpu");
    const bare = { ...gpu, utilizationPercent: undefined, memoryUsedBytes: undefined };
    const reading = toJson(GpuReadingSchema, gpuReadingToProto(bare)) as Record<string, unknown>;
    expect(reading).not.toHaveProperty("utilizationPercent");
    expect(reading).not.toHaveProperty("memoryUsedBytes");
    const json = toJson(NodeInventorySchema, inventoryToProto({ ...inv, gpus: [bare] })) as {
      gpus: Record<string, unknown>[];
    };
    expect(json.gpus[0]).not.toHaveProperty("utilizationPercent");
    expect(json.gpus[0]?.memoryTotalBytes).toBe(String(gpu.memoryTotalBytes));
  });
});

describe("gpuHealthy", () => {
  const gpu = simulateInventory("1xh100-80g", { hostname: "n1", nowMs: 1 }).gpus[0];
  if (!gpu) throw new Error("no gpu");

  it("falls back to registration until a reading arrives", () => {
    expect(gpuHealthy(gpu, undefined)).toBe(true);
    expect(gpuHealthy({ ...gpu, lost: true }, undefined)).toBe(false);
    expect(gpuHealthy({ ...gpu, healthy: false }, undefined)).toBe(false);
  });

  it("trusts the latest reading over registration", () => {
    const reading = gpuReadingFromProto(
      create(GpuReadingSchema, { index: 0, uuid: gpu.uuid, healthy: true }),
    );
    expect(gpuHealthy({ ...gpu, healthy: false }, reading)).toBe(true);
    expect(gpuHealthy(gpu, { ...reading, healthy: false })).toBe(false);
    expect(gpuHealthy(gpu, { ...reading, lost: true })).toBe(false);
  });
});

describe("deployment", () => {
  it("round-trips a validated spec", () => {
    const spec = parseDeploymentSpecOrThrow({
      name: "chat",
      model: "meta-llama/Llama-3.1-8B-Instruct",
      engine: "vllm",
      gpuClass: "h100-80g",
      tensorParallel: 8,
      replicas: 2,
      maxModelLen: 8192,
      modelSizeBytes: 16_000_000_000,
      env: { VLLM_LOGGING_LEVEL: "INFO" },
    });
    expect(deploymentSpecFromProto(deploymentSpecToProto(spec))).toEqual(spec);
  });

  it("compares specs ignoring the revision and the order of env keys, not env values", () => {
    const spec = (env: Record<string, string>, revision = 1) =>
      parseDeploymentSpecOrThrow({ name: "chat", model: "m", engine: "sim", env, revision });
    const a = spec({ A: "1", B: "2" });
    expect(sameDeploymentSpec(a, spec({ B: "2", A: "1" }, 7))).toBe(true);
    expect(sameDeploymentSpec(a, spec({ A: "1", B: "3" }))).toBe(false);
    expect(sameDeploymentSpec(a, spec({ A: "1" }))).toBe(false);
  });

  it("rejects a wire deployment the schema refuses, naming the field", () => {
    const bad = deploymentSpecToProto(
      parseDeploymentSpecOrThrow({ name: "chat", model: "m", engine: "sim" }),
    );
    bad.model = "--trust-remote-code";
    expect(() => deploymentSpecFromProto(bad)).toThrow(/model/);
    expect(toJson(DeploymentSchema, bad)).toMatchObject({ name: "chat" });
  });
});
