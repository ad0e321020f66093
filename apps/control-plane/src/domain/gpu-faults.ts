import type { Gpu, GpuFault, GpuReading } from "@llmgw/discovery";
import {
  type ClearedFaults,
  faultCleared,
  type GpuHealthVerdict,
  gpuFaultKey,
  gpuHealthVerdict,
} from "@llmgw/wire";
import type { ClusterStore, FaultClearRecord } from "../store/types.js";

/** Cleared faults kept per GPU; beyond it the ones cleared at the oldest sighting go. */
export const FAULT_CLEARS_KEPT = 64;

/** Distinct fault keys remembered per GPU for "new fault" events and the fault counter. */
const FAULTS_REMEMBERED = 256;

/** A count of distinct faults seen on one GPU, by code, kind and action (for metrics). */
export interface FaultTally {
  readonly gpu: number;
  readonly code: number;
  readonly kind: string;
  readonly action: string;
  readonly count: number;
}

const NO_TALLIES: readonly FaultTally[] = Object.freeze([]);

/** "Xid 79", "SXid 12028", "fallen off the bus": a fault as an operator names it. */
export function faultName(f: { readonly kind: string; readonly code: number }): string {
  return f.kind === "sxid"
    ? `SXid ${f.code}`
    : f.kind === "fallen-off-bus"
      ? "fallen off the bus"
      : `Xid ${f.code}`;
}

/**
 * The control plane's memory of GPU kernel-log faults, one of `Cluster`'s parts: what
 * operators cleared (per GPU uuid, stored), which faults were announced already (per node
 * and GPU index, memory only: after a restart each current fault is announced once more),
 * and the tally of distinct faults per node that `/metrics` counts. The cluster asks it for
 * verdicts and for the faults to announce, and records the events itself.
 */
export class GpuFaults {
  /** GPU uuid → its cleared faults (fault key → lastSeenUnixMs when cleared). Stored. */
  readonly #cleared = new Map<string, Map<string, number>>();
  /** `nodeId/gpuIndex` → fault keys already announced (an event, one count in the tally). */
  readonly #announced = new Map<string, Set<string>>();
  /** Node id → `gpu/code/kind/action` → its tally. */
  readonly #tallies = new Map<string, Map<string, FaultTally>>();
  readonly #store: ClusterStore;
  readonly #log: ((line: string) => void) | undefined;

  /** Loads the stored clears of `store`, where later clears are written too. */
  constructor(store: ClusterStore, log?: (line: string) => void) {
    this.#store = store;
    this.#log = log;
    for (const c of store.listFaultClears()) {
      const byKey = this.#cleared.get(c.gpuUuid) ?? new Map<string, number>();
      byKey.set(c.faultKey, c.lastSeenUnixMs);
      this.#cleared.set(c.gpuUuid, byKey);
    }
  }

  /** The cleared faults of a GPU by uuid; undefined when none was ever cleared. */
  cleared(gpuUuid: string): ClearedFaults | undefined {
    // Without any clear, no lookup: hashing each freshly decoded GPU UUID is a verdict's
    // largest cost when a starting control plane judges 80,000 GPUs.
    return this.#cleared.size === 0 ? undefined : this.#cleared.get(gpuUuid);
  }

  /** The one health rule (see `gpuHealthVerdict`), with this GPU's cleared faults. */
  verdict(gpu: Gpu, reading: GpuReading | undefined): GpuHealthVerdict {
    return gpuHealthVerdict(gpu, reading, this.cleared(gpu.uuid));
  }

  /**
   * Of `faults` seen on GPU `gpu` of `nodeId`, those to announce: not announced before on
   * this GPU, or cleared and now seen again; one still covered by a clear is not. Each is
   * marked announced and counted in the node's tally (bounded: past {@link FAULTS_REMEMBERED}
   * distinct ones, new ones are logged, not counted).
   */
  takeNew(nodeId: string, gpu: Gpu, faults: readonly GpuFault[]): GpuFault[] {
    const gpuKey = `${nodeId}/${gpu.index}`;
    const cleared = this.#cleared.get(gpu.uuid);
    let announced = this.#announced.get(gpuKey);
    const out: GpuFault[] = [];
    for (const f of faults) {
      const key = gpuFaultKey(f);
      if (announced?.has(key) || faultCleared(f, cleared)) continue;
      if (!announced) {
        announced = new Set();
        this.#announced.set(gpuKey, announced);
      }
      announced.add(key);
      if (announced.size > FAULTS_REMEMBERED) {
        announced.delete(announced.values().next().value as string);
      }
      this.#tally(nodeId, gpu.index, f);
      out.push(f);
    }
    return out;
  }

  /**
   * Records `faults` of GPU `gpu` on `nodeId` cleared at `nowMs`, each up to its
   * `lastSeenUnixMs` (a later record counts again): store first, so a refused write changes
   * nothing, then memory; they may be announced again when seen again.
   */
  clear(nodeId: string, gpu: Gpu, faults: readonly GpuFault[], nowMs: number): void {
    const next = new Map(this.#cleared.get(gpu.uuid));
    for (const f of faults) {
      const key = gpuFaultKey(f);
      next.set(key, Math.max(next.get(key) ?? Number.NEGATIVE_INFINITY, Number(f.lastSeenUnixMs)));
    }
    // Bounded: the oldest sightings go first (a fault seen after them would count anyway).
    const kept = [...next].sort((a, b) => b[1] - a[1]).slice(0, FAULT_CLEARS_KEPT);
    const records: FaultClearRecord[] = kept.map(([faultKey, lastSeenUnixMs]) => ({
      gpuUuid: gpu.uuid,
      faultKey,
      lastSeenUnixMs,
      clearedAtMs: nowMs,
    }));
    this.#store.replaceFaultClears(gpu.uuid, records);
    this.#cleared.set(gpu.uuid, new Map(kept));
    const announced = this.#announced.get(`${nodeId}/${gpu.index}`);
    for (const f of faults) announced?.delete(gpuFaultKey(f));
  }

  /** The node's fault tallies (none: a shared empty list). */
  tallies(nodeId: string): readonly FaultTally[] {
    const tallies = this.#tallies.get(nodeId);
    return tallies === undefined || tallies.size === 0 ? NO_TALLIES : [...tallies.values()];
  }

  #tally(nodeId: string, gpu: number, f: GpuFault): void {
    let tallies = this.#tallies.get(nodeId);
    if (!tallies) {
      tallies = new Map();
      this.#tallies.set(nodeId, tallies);
    }
    const key = `${gpu}/${f.code}/${f.kind}/${f.action}`;
    const before = tallies.get(key);
    // A counter series per (GPU, code, kind, action): bounded, so an agent sending ever new
    // codes cannot grow every scrape; past the bound new ones are logged, not counted.
    if (!before && tallies.size >= FAULTS_REMEMBERED) {
      this.#log?.(
        `fault tally of node ${nodeId} is full; ${faultName(f)} on GPU ${gpu} not counted`,
      );
      return;
    }
    tallies.set(key, {
      gpu,
      code: f.code,
      kind: f.kind,
      action: f.action,
      count: (before?.count ?? 0) + 1,
    });
  }
}
