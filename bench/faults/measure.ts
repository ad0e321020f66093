/**
 * The pure half of the fault-to-drain benchmark: the kernel-log lines it writes, which
 * placements a fault takes out, and what the client's request records say about when routing
 * stopped. No processes, no clocks: `run.ts` feeds these with what it observed.
 */
import { classifyXid, type FaultAction, parseKmsgRecord, parseXid } from "@llmgw/discovery";
import { quantile } from "../lib/table.js";

/**
 * One real NVRM line per Xid code whose catalog action takes the GPU out, copied verbatim from
 * `/work/shared/reference/health-formats.md` §1.3 (prefixes and all: the watcher must strip
 * each kind). Only the PCI id is rewritten, by {@link faultLine}, to the simulated GPU's bus.
 * The Xid 95 line is the driver's own format string from the same section (quoted there as a
 * C string; the quotes are not part of the line).
 */
export const FAULT_LINES: ReadonlyMap<number, string> = new Map([
  [
    48,
    "Dec  2 11:38:47 worker4 kernel: [  219.470994] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.",
  ],
  [
    95,
    "NVRM: Xid (PCI:0000:01:00): 95, pid=7062, Uncontained: LTC TAG (0x2, 0x1). RST: Yes, D-RST: No",
  ],
  [
    119,
    "[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).",
  ],
  [
    120,
    "[605633.376794] NVRM: Xid (PCI:0000:06:00): 120, GSP task exception: store access page fault (cause:0xf) @ pc:0x13ebd80, partition:2#0, task:3",
  ],
  [
    64,
    "Dec  2 11:38:47 worker4 kernel: [  219.471050] NVRM: Xid (PCI:0000:07:00): 64, pid='<unknown>', name=<unknown>, Dynamic Page Retirement: Blacklisting failed.  Page should have been blacklisted on boot(0x00000000007fffa8).",
  ],
  [79, "NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus."],
]);

/** The order faults cycle through (the issue's list; 79 is node-wide). */
export const FAULT_CYCLE: readonly number[] = [48, 95, 119, 120, 64, 79];

/**
 * The real line for Xid `code` with its `PCI:dddd:bb:dd` rewritten to the GPU `pciBusId`
 * (nvidia-smi's form, `00000000:01:00.0`, as simulated GPUs report it): the kernel prints the
 * domain in 4 digits, lower-case hex, without the function digit. Throws for a code without a
 * line or a bus id that is not nvidia-smi's form (a bug in the benchmark, not an input).
 */
export function faultLine(code: number, pciBusId: string): string {
  const line = FAULT_LINES.get(code);
  if (line === undefined) throw new Error(`no real line for Xid ${code} in FAULT_LINES`);
  const match = /^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.[0-7]$/.exec(pciBusId);
  if (!match) throw new Error(`pciBusId must look like 00000000:01:00.0, got ${pciBusId}`);
  const [, domain = "", bus = "", device = ""] = match;
  const kernelId = `PCI:${`${domain.slice(-4)}:${bus}:${device}`.toLowerCase()}`;
  return line.replace(/PCI:[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}/, kernelId);
}

/** What discovery's own catalog does with `line` (undefined when it is not an Xid line). */
export function lineAction(line: string): FaultAction | undefined {
  const record = parseKmsgRecord(line);
  const xid = record === undefined ? undefined : parseXid(record.message);
  return xid === undefined ? undefined : classifyXid(xid);
}

/** True when the action takes every GPU of the node out, not just the one named. */
export function isNodeWideAction(action: FaultAction | undefined): boolean {
  return action === "drain-node" || action === "reboot";
}

/** A replica rank's place, as the admin API lists it. */
export interface RankPlace {
  readonly replicaId: string;
  readonly nodeId: string;
  readonly gpuIndices: readonly number[];
}

/** The GPUs one fault takes out: one GPU, or (`gpuIndex` undefined) the whole node. */
export interface FaultScope {
  readonly nodeId: string;
  readonly gpuIndex?: number;
}

/** True when the rank sits on a GPU the fault took out. */
export function inScope(rank: RankPlace, scope: FaultScope): boolean {
  if (rank.nodeId !== scope.nodeId) return false;
  return scope.gpuIndex === undefined || rank.gpuIndices.includes(scope.gpuIndex);
}

/** Ids of the replicas with a rank in scope (those the fault must take out of routing). */
export function replicasInScope(ranks: readonly RankPlace[], scope: FaultScope): string[] {
  return [...new Set(ranks.filter((r) => inScope(r, scope)).map((r) => r.replicaId))];
}

/** One client request as the load loops saw it (ms on the benchmark's clock). */
export interface RequestRecord {
  readonly startMs: number;
  readonly endMs: number;
  /** `x-llmgw-replica` of the answer; absent when the router named none (an error, a reset). */
  readonly replica?: string;
  readonly ok: boolean;
  /** Status and error code, or the client-side failure (`ECONNRESET`, `timeout`), when not ok. */
  readonly detail?: string;
}

/**
 * When routing to the faulted replicas stopped, as the client saw it: the send time of the
 * last request sent at or after `t0Ms` that a faulted replica answered, minus `t0Ms`; 0 when
 * none was sent after the fault was written. A lower bound on the true stop (it could have
 * stopped any time before the next request was sent), sharp to the loops' request spacing.
 *
 * A replacement may take the faulted replica's id (the scheduler reuses the lowest free
 * ordinal), and the `x-llmgw-replica` header cannot tell the two apart: `until` gives, per
 * id, when its replacement became READY (ms on the same clock), and requests sent from then
 * on are the replacement's. Before it, an answer under that id came from the faulted engine
 * (or from a replacement not yet READY, which is just as wrong).
 */
export function lastRoutedAfter(
  records: readonly RequestRecord[],
  replicaIds: readonly string[],
  t0Ms: number,
  until: ReadonlyMap<string, number> = new Map(),
): number {
  const ids = new Set(replicaIds);
  let last = 0;
  for (const r of records) {
    if (r.startMs < t0Ms || r.replica === undefined || !ids.has(r.replica)) continue;
    const replacedAt = until.get(r.replica);
    if (replacedAt !== undefined && r.startMs >= replacedAt) continue;
    last = Math.max(last, r.startMs - t0Ms);
  }
  return last;
}

/** Requests that failed while a fault was being handled, by detail. */
export interface WindowFailures {
  /** Requests in flight at some point of the window (sent before its end, ended after its start). */
  readonly requests: number;
  readonly failed: number;
  /** detail → count, most frequent first. */
  readonly byDetail: Record<string, number>;
}

/** The requests overlapping [fromMs, toMs] and those of them that failed. */
export function failuresInWindow(
  records: readonly RequestRecord[],
  fromMs: number,
  toMs: number,
): WindowFailures {
  const overlapping = records.filter((r) => r.startMs <= toMs && r.endMs >= fromMs);
  const counts = new Map<string, number>();
  for (const r of overlapping) {
    if (r.ok) continue;
    const key = r.detail ?? "unknown";
    counts.set(key, (counts.get(key) ?? 0) + 1);
  }
  const byDetail = Object.fromEntries([...counts].sort((a, b) => b[1] - a[1]));
  return {
    requests: overlapping.length,
    failed: [...counts.values()].reduce((a, b) => a + b, 0),
    byDetail,
  };
}

/** p50 / p90 / max of one column (nearest rank), undefined for no values. */
export interface Spread {
  readonly p50?: number;
  readonly p90?: number;
  readonly max?: number;
}

/** {@link Spread} of `values`, rounded to whole ms. */
export function spread(values: readonly number[]): Spread {
  const round = (v: number | undefined) => (v === undefined ? undefined : Math.round(v));
  const p50 = round(quantile(values, 0.5));
  const p90 = round(quantile(values, 0.9));
  const max = round(values.length === 0 ? undefined : Math.max(...values));
  return {
    ...(p50 === undefined ? {} : { p50 }),
    ...(p90 === undefined ? {} : { p90 }),
    ...(max === undefined ? {} : { max }),
  };
}
