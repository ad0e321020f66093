/**
 * One steady measurement window: the target's CPU (utime+stime deltas) and memory from /proc,
 * the fleet's client-side heartbeat latencies, and what the load generator itself cost and
 * how late its event loop ran (that lateness is inside every client-side latency).
 */
import { performance } from "node:perf_hooks";
import { loadAverage } from "../lib/children.js";
import { monitorLoopDelay } from "../lib/loop-delay.js";
import { quantile } from "../lib/table.js";
import type { Fleet } from "./fleet.js";
import { coresBetween, sampleProc } from "./proc-stats.js";

/** What one window measured. Latencies in ms; memory in MiB. */
export interface WindowResult {
  readonly windowS: number;
  readonly loadAverage: { readonly start: string; readonly end: string };
  readonly target: {
    readonly cpuCores: number;
    /** Target CPU time per heartbeat sent in the window, µs (load-independent-ish). */
    readonly cpuUsPerHeartbeat: number | undefined;
    readonly rssMiB: number;
    readonly peakRssMiB: number;
  };
  readonly heartbeats: {
    /** Heartbeats sent: calls answered plus messages written to heartbeat streams. */
    readonly count: number;
    /** Of them on streams (unanswered, so outside the latencies below). */
    readonly streamed: number;
    readonly perSecond: number;
    readonly errors: number;
    /** Every error kind seen so far in this fleet (Connect code or message) → count. */
    readonly errorKinds: Record<string, number>;
    readonly p50Ms: number | undefined;
    readonly p90Ms: number | undefined;
    readonly p99Ms: number | undefined;
    readonly maxMs: number | undefined;
  };
  readonly loadGenerator: {
    readonly cpuCores: number;
    readonly eventLoopDelayP99Ms: number;
    readonly eventLoopDelayMaxMs: number;
  };
}

const round = (n: number, digits = 2) => Number(n.toFixed(digits));
const roundOpt = (n: number | undefined, digits = 2) =>
  n === undefined ? undefined : round(n, digits);
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Measures `seconds` of steady heartbeating of `fleet` against the process `pid`. */
export async function measureWindow(
  fleet: Fleet,
  pid: number,
  ticksPerSecond: number,
  seconds: number,
): Promise<WindowResult> {
  const loadStart = loadAverage();
  const eld = monitorLoopDelay(10);
  const cpu0 = process.cpuUsage();
  const errors0 = fleet.counters.errors;
  const s0 = sampleProc(pid, ticksPerSecond, performance.now());
  fleet.startRecording();
  await sleep(seconds * 1000);
  const { latencies, streamed } = fleet.stopRecording();
  const beats = latencies.length + streamed;
  const s1 = sampleProc(pid, ticksPerSecond, performance.now());
  eld.disable();
  const cpu = process.cpuUsage(cpu0);
  const windowS = (s1.atMs - s0.atMs) / 1000;
  const cpuCores = coresBetween(s0, s1);
  return {
    windowS: round(windowS),
    loadAverage: { start: loadStart, end: loadAverage() },
    target: {
      cpuCores: round(cpuCores, 3),
      cpuUsPerHeartbeat:
        beats > 0 ? Math.round(((s1.cpuSeconds - s0.cpuSeconds) * 1e6) / beats) : undefined,
      rssMiB: round(s1.rssBytes / 2 ** 20, 1),
      peakRssMiB: round(s1.peakRssBytes / 2 ** 20, 1),
    },
    heartbeats: {
      count: beats,
      streamed,
      perSecond: round(beats / windowS, 1),
      errors: fleet.counters.errors - errors0,
      errorKinds: Object.fromEntries(fleet.counters.errorKinds),
      p50Ms: roundOpt(quantile(latencies, 0.5)),
      p90Ms: roundOpt(quantile(latencies, 0.9)),
      p99Ms: roundOpt(quantile(latencies, 0.99)),
      maxMs: roundOpt(latencies.length > 0 ? Math.max(...latencies) : undefined),
    },
    loadGenerator: {
      cpuCores: round((cpu.user + cpu.system) / 1e6 / windowS, 3),
      eventLoopDelayP99Ms: round(eld.percentileMs(99)),
      eventLoopDelayMaxMs: round(eld.maxMs()),
    },
  };
}
