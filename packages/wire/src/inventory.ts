import { create } from "@bufbuild/protobuf";
import type * as plain from "@llmgw/discovery";
import {
  type Gpu,
  type GpuReading,
  GpuReadingSchema,
  GpuSchema,
  type NodeInventory,
  NodeInventorySchema,
  type Port,
  PortSchema,
  type Problem,
} from "@llmgw/proto";

/*
 * The one place where `@llmgw/discovery`'s plain inventory (numbers, undefined for "not
 * reported") and the wire `NodeInventory` (bigint, unset optionals) meet.
 */

const num = (v: bigint | undefined): number | undefined =>
  v === undefined ? undefined : Number(v);
const big = (v: number | undefined): bigint | undefined =>
  v === undefined ? undefined : BigInt(Math.round(v));

function problemFromProto(p: Problem): plain.Problem {
  return { code: p.code, message: p.message, source: p.source };
}

function portFromProto(p: Port): plain.Port {
  return {
    device: p.device,
    port: p.port,
    linkLayer: (["infiniband", "roce"].includes(p.linkLayer)
      ? p.linkLayer
      : "unknown") as plain.LinkLayer,
    state: p.state,
    physState: p.physState,
    rateGbps: p.rateGbps,
    netdev: p.netdev,
    gidIndex: p.gidIndex,
    numaNode: p.numaNode,
    guid: p.guid,
    subnetPrefix: p.subnetPrefix,
    smLid: p.smLid,
    ipv4: p.ipv4,
    pciBusId: p.pciBusId,
  };
}

function portToProto(p: plain.Port): Port {
  return create(PortSchema, { ...p });
}

/** Wire GPU → plain GPU. */
export function gpuFromProto(g: Gpu): plain.Gpu {
  return {
    index: g.index,
    uuid: g.uuid,
    name: g.name,
    gpuClass: g.gpuClass === "" ? undefined : g.gpuClass,
    pciBusId: g.pciBusId,
    memoryTotalBytes: num(g.memoryTotalBytes),
    computeCapability: g.computeCapability,
    migEnabled: g.migEnabled,
    memoryUsedBytes: num(g.memoryUsedBytes),
    utilizationPercent: g.utilizationPercent,
    eccUncorrectedErrors: num(g.eccUncorrectedErrors),
    temperatureCelsius: g.temperatureCelsius,
    powerWatts: g.powerWatts,
    healthy: g.healthy,
    healthProblems: g.healthProblems.map(problemFromProto),
    unmanagedMemoryBytes: num(g.unmanagedMemoryBytes),
    lost: g.lost,
  };
}

/** Plain GPU → wire GPU. */
export function gpuToProto(g: plain.Gpu): Gpu {
  return create(GpuSchema, {
    ...g,
    gpuClass: g.gpuClass ?? "",
    memoryTotalBytes: big(g.memoryTotalBytes),
    memoryUsedBytes: big(g.memoryUsedBytes),
    eccUncorrectedErrors: big(g.eccUncorrectedErrors),
    unmanagedMemoryBytes: big(g.unmanagedMemoryBytes),
    healthProblems: g.healthProblems.map((p) => ({ ...p })),
  });
}

/** Wire inventory → `@llmgw/discovery`'s plain `NodeInventory`. */
export function inventoryFromProto(inv: NodeInventory): plain.NodeInventory {
  return {
    hostname: inv.hostname,
    addresses: [...inv.addresses],
    agentVersion: inv.agentVersion,
    simulated: inv.simulated,
    host: {
      cpuCount: inv.host?.cpuCount ?? 0,
      memoryBytes: Number(inv.host?.memoryBytes ?? 0n),
      os: inv.host?.os ?? "",
      osRelease: inv.host?.osRelease ?? "",
      arch: inv.host?.arch ?? "",
    },
    gpus: inv.gpus.map(gpuFromProto),
    fabrics: inv.fabrics.map((f) => ({
      id: f.id,
      linkLayer: f.linkLayer === "roce" ? "roce" : "infiniband",
      ports: f.ports.map(portFromProto),
      idSource: f.idSource === "configured" ? "configured" : "derived",
    })),
    inactivePorts: inv.inactivePorts.map(portFromProto),
    topology: {
      gpuLinks: (inv.topology?.gpuLinks ?? []).map((l) => ({
        gpuA: l.gpuA,
        gpuB: l.gpuB,
        path: l.path,
        nvlinks: l.nvlinks,
      })),
      gpuNics: (inv.topology?.gpuNics ?? []).map((n) => ({ gpu: n.gpu, nic: n.nic, path: n.path })),
      gpuAffinity: (inv.topology?.gpuAffinity ?? []).map((a) => ({
        gpu: a.gpu,
        cpuAffinity: a.cpuAffinity,
        numaNode: a.numaNode,
      })),
    },
    problems: inv.problems.map(problemFromProto),
    driverVersion: inv.driverVersion,
    collectedAtUnixMs: Number(inv.collectedAtUnixMs),
  };
}

/** `@llmgw/discovery`'s plain `NodeInventory` → wire inventory (what an agent registers). */
export function inventoryToProto(inv: plain.NodeInventory): NodeInventory {
  return create(NodeInventorySchema, {
    hostname: inv.hostname,
    addresses: [...inv.addresses],
    agentVersion: inv.agentVersion,
    simulated: inv.simulated,
    host: { ...inv.host, memoryBytes: BigInt(Math.round(inv.host.memoryBytes)) },
    gpus: inv.gpus.map(gpuToProto),
    fabrics: inv.fabrics.map((f) => ({
      id: f.id,
      linkLayer: f.linkLayer,
      ports: f.ports.map(portToProto),
      idSource: f.idSource,
    })),
    inactivePorts: inv.inactivePorts.map(portToProto),
    topology: {
      gpuLinks: inv.topology.gpuLinks.map((l) => ({ ...l })),
      gpuNics: inv.topology.gpuNics.map((n) => ({ ...n })),
      gpuAffinity: inv.topology.gpuAffinity.map((a) => ({ ...a })),
    },
    problems: inv.problems.map((p) => ({ ...p })),
    driverVersion: inv.driverVersion,
    collectedAtUnixMs: BigInt(inv.collectedAtUnixMs),
  });
}

/** A GPU's health as of the latest reading, falling back to what registration said. */
export function gpuHealthy(gpu: Gpu, reading: GpuReading | undefined): boolean {
  if (reading === undefined) return gpu.healthy && !gpu.lost;
  return reading.healthy && !reading.lost;
}

/** Plain GPU (as discovery reads it) → the live reading sent with every heartbeat. */
export function gpuReadingToProto(g: plain.Gpu): GpuReading {
  return create(GpuReadingSchema, {
    index: g.index,
    uuid: g.uuid,
    memoryUsedBytes: big(g.memoryUsedBytes),
    utilizationPercent: g.utilizationPercent,
    eccUncorrectedErrors: big(g.eccUncorrectedErrors),
    temperatureCelsius: g.temperatureCelsius,
    powerWatts: g.powerWatts,
    healthy: g.healthy,
    healthProblems: g.healthProblems.map((p) => ({ ...p })),
    unmanagedMemoryBytes: big(g.unmanagedMemoryBytes),
    lost: g.lost,
  });
}
