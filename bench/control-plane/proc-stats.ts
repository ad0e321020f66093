/**
 * Reading another process's CPU time and memory from Linux `/proc`, so the control plane can
 * be measured from outside while the load generator shares the machine with it.
 */
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";

/** CPU time and memory of one process at one instant. */
export interface ProcSample {
  /** `performance.now()`-style wall clock of the sample, ms. */
  readonly atMs: number;
  /** utime + stime, seconds. */
  readonly cpuSeconds: number;
  /** VmRSS, bytes. */
  readonly rssBytes: number;
  /** VmHWM (peak RSS), bytes. */
  readonly peakRssBytes: number;
}

/** `getconf CLK_TCK` (the unit of utime/stime in /proc/<pid>/stat); 100 when unknown. */
export function clockTicksPerSecond(): number {
  try {
    const n = Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim());
    return Number.isFinite(n) && n > 0 ? n : 100;
  } catch {
    return 100;
  }
}

/**
 * utime + stime in seconds from the text of `/proc/<pid>/stat`. The command name (field 2)
 * may hold spaces and parentheses, so fields are counted from the last `)`.
 */
export function parseProcStatCpuSeconds(text: string, ticksPerSecond: number): number {
  const close = text.lastIndexOf(")");
  if (close === -1) throw new Error(`not a /proc/<pid>/stat line: ${text.slice(0, 80)}`);
  // After ") ": field 3 (state) is index 0, so utime (field 14) is 11 and stime (15) is 12.
  const fields = text
    .slice(close + 2)
    .trim()
    .split(/\s+/);
  const utime = Number(fields[11]);
  const stime = Number(fields[12]);
  if (!Number.isFinite(utime) || !Number.isFinite(stime)) {
    throw new Error(`no utime/stime in /proc/<pid>/stat: ${text.slice(0, 80)}`);
  }
  return (utime + stime) / ticksPerSecond;
}

/** A `Vm*:` line of `/proc/<pid>/status` in bytes (`VmRSS:  123 kB`); undefined when absent. */
export function parseProcStatusBytes(text: string, key: string): number | undefined {
  const m = new RegExp(`^${key}:\\s+(\\d+)\\s+kB`, "m").exec(text);
  return m ? Number(m[1]) * 1024 : undefined;
}

/** Samples CPU time and memory of `pid` now. Throws when the process is gone. */
export function sampleProc(pid: number, ticksPerSecond: number, nowMs: number): ProcSample {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  return {
    atMs: nowMs,
    cpuSeconds: parseProcStatCpuSeconds(stat, ticksPerSecond),
    rssBytes: parseProcStatusBytes(status, "VmRSS") ?? 0,
    peakRssBytes: parseProcStatusBytes(status, "VmHWM") ?? 0,
  };
}

/** Average cores used between two samples (CPU seconds per wall second). */
export function coresBetween(a: ProcSample, b: ProcSample): number {
  const wallS = (b.atMs - a.atMs) / 1000;
  return wallS > 0 ? (b.cpuSeconds - a.cpuSeconds) / wallS : 0;
}
