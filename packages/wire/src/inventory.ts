import { create } from "@bufbuild/protobuf";
import type * as plain from "@llmgw/discovery";
import {
  type Gpu,
  type GpuFault,
  GpuFaultSchema,
  type GpuHealthReadings,
  GpuHealthReadingsSchema,
  type GpuReading,
  GpuReadingSchema,
  GpuSchema,
  type NodeInventory,
  NodeInventorySchema,
  type Port,
  type PortHealth,
  PortHealthSchema,
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

const NO_PROBLEMS: readonly plain.Problem[] = Object.freeze([]);

/** Wire problem → plain. */
export function problemFromProto(p: Problem): plain.Problem {
  return { code: p.code, message: p.message, source: p.source };
}

const FAULT_KINDS: ReadonlySet<string> = new Set(["xid", "sxid", "fallen-off-bus"]);
const FAULT_ACTIONS: ReadonlySet<string> = new Set([
  "ignore",
  "restart-engine",
  "reset-gpu",
  "drain-node",
  "reboot",
]);

/** Wire health readings → plain; every unset optional stays undefined. */
export function healthReadingsFromProto(h: GpuHealthReadings): plain.GpuHealthReadings {
  return {
    remappedRowsPending: h.remappedRowsPending,
    remappedRowsFailure: h.remappedRowsFailure,
    remappedRowsCorrectable: num(h.remappedRowsCorrectable),
    remappedRowsUncorrectable: num(h.remappedRowsUncorrectable),
    retiredPagesSingleBit: num(h.retiredPagesSingleBit),
    retiredPagesDoubleBit: num(h.retiredPagesDoubleBit),
    retiredPagesPending: h.retiredPagesPending,
    clocksEventReasonsActive: num(h.clocksEventReasonsActive),
    pcieLinkGenCurrent: h.pcieLinkGenCurrent,
    pcieLinkGenMax: h.pcieLinkGenMax,
    pcieLinkWidthCurrent: h.pcieLinkWidthCurrent,
    pcieLinkWidthMax: h.pcieLinkWidthMax,
    nvlinksTotal: h.nvlinksTotal,
    nvlinksInactive: h.nvlinksInactive,
    recoveryAction: h.recoveryAction,
    eccDeferredErrors: num(h.eccDeferredErrors),
  };
}

export function healthReadingsToProto(h: plain.GpuHealthReadings): GpuHealthReadings {
  return create(GpuHealthReadingsSchema, {
    ...h,
    remappedRowsCorrectable: big(h.remappedRowsCorrectable),
    remappedRowsUncorrectable: big(h.remappedRowsUncorrectable),
    retiredPagesSingleBit: big(h.retiredPagesSingleBit),
    retiredPagesDoubleBit: big(h.retiredPagesDoubleBit),
    clocksEventReasonsActive: big(h.clocksEventReasonsActive),
    eccDeferredErrors: big(h.eccDeferredErrors),
  });
}

/** Wire fault → plain; an unknown kind or action (a newer agent) reads as the strictest. */
export function gpuFaultFromProto(f: GpuFault): plain.GpuFault {
  return {
    kind: (FAULT_KINDS.has(f.kind) ? f.kind : "xid") as plain.GpuFault["kind"],
    code: f.code,
    action: (FAULT_ACTIONS.has(f.action) ? f.action : "reset-gpu") as plain.FaultAction,
    pciBusId: f.pciBusId,
    count: f.count,
    firstSeenUnixMs: Number(f.firstSeenUnixMs),
    lastSeenUnixMs: Number(f.lastSeenUnixMs),
    evidence: f.evidence,
    description: f.description,
    bootId: f.bootId,
    seq: num(f.seq),
  };
}

export function gpuFaultToProto(f: plain.GpuFault): GpuFault {
  return create(GpuFaultSchema, {
    ...f,
    firstSeenUnixMs: BigInt(Math.round(f.firstSeenUnixMs)),
    lastSeenUnixMs: BigInt(Math.round(f.lastSeenUnixMs)),
    seq: big(f.seq),
  });
}

function portHealthFromProto(h: PortHealth): plain.PortHealth {
  return {
    healthy: h.healthy,
    problems: h.problems.map(problemFromProto),
    flaps: h.flaps,
    flapWindowS: h.flapWindowS,
    counters: h.counters.map((c) => ({
      name: c.name,
      value: num(c.value),
      ratePerSecond: c.ratePerSecond,
      saturated: c.saturated,
    })),
  };
}

function portHealthToProto(h: plain.PortHealth): PortHealth {
  return create(PortHealthSchema, {
    healthy: h.healthy,
    problems: h.problems.map((p) => ({ ...p })),
    flaps: h.flaps,
    flapWindowS: h.flapWindowS,
    counters: h.counters.map((c) => ({ ...c, value: big(c.value) })),
  });
}

/** Wire port → plain port. */
export function portFromProto(p: Port): plain.Port {
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
    health: p.health === undefined ? undefined : portHealthFromProto(p.health),
  };
}

/** Plain port → wire port (registration and the heartbeat's live port list). */
export function portToProto(p: plain.Port): Port {
  return create(PortSchema, {
    ...p,
    health: p.health === undefined ? undefined : portHealthToProto(p.health),
  });
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
    vendor: g.vendor === "amd" ? "amd" : g.vendor === "nvidia" ? "nvidia" : undefined,
    health: g.health === undefined ? undefined : healthReadingsFromProto(g.health),
    // No faults reads as absent, like an inventory from before faults existed.
    ...(g.faults.length === 0 ? {} : { faults: g.faults.map(gpuFaultFromProto) }),
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
    vendor: g.vendor ?? "",
    health: g.health === undefined ? undefined : healthReadingsToProto(g.health),
    faults: (g.faults ?? []).map(gpuFaultToProto),
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

/**
 * The key a kernel-log fault is folded under and cleared by: `kind:pciBusId:code`, as the
 * agent's aggregator (`createXidAggregator`) folds records.
 */
export function gpuFaultKey(f: {
  readonly kind: string;
  readonly pciBusId: string;
  readonly code: number;
}): string {
  return `${f.kind}:${f.pciBusId}:${f.code}`;
}

/** Actions under which a GPU keeps serving: the fault is reported, never acted on. */
const SERVING_ACTIONS: ReadonlySet<string> = new Set(["ignore", "restart-engine"]);

/**
 * Whether a fault takes its GPU out of service: `reset-gpu`, `drain-node`, `reboot`, and any
 * action this build does not know (a newer agent's: fail closed).
 */
export function faultIsActionable(f: { readonly action: string }): boolean {
  return !SERVING_ACTIONS.has(f.action);
}

/**
 * Faults an operator declared dealt with (`ClearGpuFaults`), for one GPU: fault key (see
 * {@link gpuFaultKey}) → the `lastSeenUnixMs` the fault had when it was cleared.
 */
export type ClearedFaults = ReadonlyMap<string, number>;

/**
 * Whether `fault` still counts against its GPU: actionable, and not cleared, or seen again
 * (a later `lastSeenUnixMs`: a new record) since it was cleared. Never by time alone.
 */
export function faultCounts(
  fault: {
    readonly kind: string;
    readonly pciBusId: string;
    readonly code: number;
    readonly action: string;
    readonly lastSeenUnixMs: bigint | number;
  },
  cleared?: ClearedFaults,
): boolean {
  if (!faultIsActionable(fault)) return false;
  const clearedAt = cleared?.get(gpuFaultKey(fault));
  return clearedAt === undefined || Number(fault.lastSeenUnixMs) > clearedAt;
}

/** Whether an operator's clear covers `fault` now (it has not been seen again since). */
export function faultCleared(
  fault: {
    readonly kind: string;
    readonly pciBusId: string;
    readonly code: number;
    readonly lastSeenUnixMs: bigint | number;
  },
  cleared?: ClearedFaults,
): boolean {
  const clearedAt = cleared?.get(gpuFaultKey(fault));
  return clearedAt !== undefined && Number(fault.lastSeenUnixMs) <= clearedAt;
}

/** The agent's problem code that stands for kernel-log faults (see `ProblemCodes.gpuFault`). */
const GPU_FAULT_PROBLEM = "LLMGW_DISCOVERY_GPU_FAULT";

/** Why a GPU is or is not usable, as the control plane decides it (see {@link gpuHealthVerdict}). */
export interface GpuHealthVerdict {
  readonly healthy: boolean;
  readonly lost: boolean;
  /** The agent's health problems other than kernel-log faults (those are `faults`). */
  readonly problems: readonly plain.Problem[];
  /** Actionable kernel-log faults that still count (not cleared, or seen again since). */
  readonly faults: readonly plain.GpuFault[];
}

/** The verdict of a GPU with nothing against it, shared (verdicts are never changed). */
const SOUND: GpuHealthVerdict = Object.freeze({
  healthy: true,
  lost: false,
  problems: Object.freeze([]) as readonly plain.Problem[],
  faults: Object.freeze([]) as readonly plain.GpuFault[],
});

const NO_FAULTS: readonly plain.GpuFault[] = Object.freeze([]);

/**
 * The one health rule for a GPU, used for placement, reconcile, metrics and views. From the
 * latest heartbeat reading, else from registration, the GPU is unhealthy when it is lost, has
 * any health problem that is not a kernel-log fault, or has an actionable fault
 * ({@link faultCounts}) that an operator has not cleared. The agent's own `healthy` flag is
 * not trusted on its own for faults (an operator's clear overrides it), but a `healthy: false`
 * with no problem and no fault to explain it still reads as unhealthy (fail closed). So does a
 * fault problem without any fault record: there is nothing to clear.
 */
export function gpuHealthVerdict(
  gpu: plain.Gpu,
  reading: plain.GpuReading | undefined,
  cleared?: ClearedFaults,
): GpuHealthVerdict {
  const source = reading ?? gpu;
  const all = source.faults ?? NO_FAULTS;
  // Every reading of a sound GPU (every heartbeat, every scrape): nothing to filter.
  if (!source.lost && source.healthy && source.healthProblems.length === 0 && all.length === 0)
    return SOUND;
  const faults = all.filter((f) => faultCounts(f, cleared));
  const problems = source.healthProblems.filter(
    (p) => p.code !== GPU_FAULT_PROBLEM || all.length === 0,
  );
  const unexplained = !source.healthy && source.healthProblems.length === 0 && all.length === 0;
  return {
    healthy: !source.lost && problems.length === 0 && faults.length === 0 && !unexplained,
    lost: source.lost,
    problems,
    faults,
  };
}

/** A GPU's effective health (see {@link gpuHealthVerdict}). */
export function gpuHealthy(
  gpu: plain.Gpu,
  reading: plain.GpuReading | undefined,
  cleared?: ClearedFaults,
): boolean {
  return gpuHealthVerdict(gpu, reading, cleared).healthy;
}

/** Wire reading → plain; every unset optional stays undefined, no faults reads as absent. */
export function gpuReadingFromProto(r: GpuReading): plain.GpuReading {
  return {
    index: r.index,
    uuid: r.uuid,
    memoryUsedBytes: num(r.memoryUsedBytes),
    utilizationPercent: r.utilizationPercent,
    eccUncorrectedErrors: num(r.eccUncorrectedErrors),
    temperatureCelsius: r.temperatureCelsius,
    powerWatts: r.powerWatts,
    healthy: r.healthy,
    healthProblems:
      r.healthProblems.length === 0 ? NO_PROBLEMS : r.healthProblems.map(problemFromProto),
    unmanagedMemoryBytes: num(r.unmanagedMemoryBytes),
    lost: r.lost,
    health: r.health === undefined ? undefined : healthReadingsFromProto(r.health),
    ...(r.faults.length === 0 ? {} : { faults: r.faults.map(gpuFaultFromProto) }),
  };
}

/** Plain GPU or reading → the live reading sent with every heartbeat. */
export function gpuReadingToProto(g: plain.GpuReading): GpuReading {
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
    health: g.health === undefined ? undefined : healthReadingsToProto(g.health),
    faults: (g.faults ?? []).map(gpuFaultToProto),
  });
}
