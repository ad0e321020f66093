import { createHash } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { SupervisorError } from "./errors.js";

/** The fields of `/proc/<pid>/stat` the supervisor uses. */
export interface ProcStat {
  readonly pid: number;
  /** Executable name as the kernel reports it (may contain spaces and parentheses). */
  readonly comm: string;
  /** One-letter state; `Z` is a zombie (dead, not yet reaped). */
  readonly state: string;
  readonly ppid: number;
  /** Process group id (field 5). */
  readonly pgrp: number;
  /** Start time in clock ticks after boot (field 22); with the pid it identifies a process. */
  readonly startTime: string;
}

/**
 * Parses the text of `/proc/<pid>/stat`. The comm field (2) is wrapped in parentheses and may
 * itself contain spaces and parentheses, so fields after it are located from the LAST `)`.
 * Returns `undefined` for text that does not have the expected shape.
 */
export function parseProcStat(text: string): ProcStat | undefined {
  const open = text.indexOf("(");
  const close = text.lastIndexOf(")");
  if (open <= 0 || close < open) return undefined;
  const pid = Number(text.slice(0, open).trim());
  const comm = text.slice(open + 1, close);
  // Fields 3.. follow "<pid> (<comm>) ".
  const rest = text
    .slice(close + 1)
    .trim()
    .split(/\s+/);
  const state = rest[0];
  const ppid = Number(rest[1]);
  const pgrp = Number(rest[2]);
  const startTime = rest[19]; // field 22 = rest index 22 - 3
  if (!Number.isInteger(pid) || pid <= 0 || state === undefined || startTime === undefined)
    return undefined;
  if (!Number.isInteger(ppid) || !Number.isInteger(pgrp) || !/^\d+$/.test(startTime))
    return undefined;
  return { pid, comm, state, ppid, pgrp, startTime };
}

/** Reads `/proc/<pid>/stat`; `undefined` when the process does not exist (or is unreadable). */
export function readProcStat(pid: number, procRoot = "/proc"): ProcStat | undefined {
  try {
    return parseProcStat(readFileSync(`${procRoot}/${pid}/stat`, "utf8"));
  } catch {
    return undefined;
  }
}

/** sha256 (hex) of the raw bytes of `/proc/<pid>/cmdline`; `undefined` when unreadable or empty. */
export function readCmdlineFingerprint(pid: number, procRoot = "/proc"): string | undefined {
  try {
    const raw = readFileSync(`${procRoot}/${pid}/cmdline`);
    if (raw.length === 0) return undefined; // zombies and kernel threads
    return createHash("sha256").update(raw).digest("hex");
  } catch {
    return undefined;
  }
}

/** The identity a pid file records: enough to tell the same process from a reused pid. */
export interface ProcessIdentity {
  readonly pid: number;
  readonly pgid: number;
  readonly startTime: string;
  readonly cmdlineSha256: string;
}

/** Reads the identity of a live process. Throws `LLMGW_SUPERVISOR_PROC_UNREADABLE`. */
export function readProcessIdentity(pid: number, procRoot = "/proc"): ProcessIdentity {
  const stat = readProcStat(pid, procRoot);
  const cmdlineSha256 = readCmdlineFingerprint(pid, procRoot);
  if (stat === undefined || cmdlineSha256 === undefined || stat.state === "Z") {
    throw new SupervisorError(
      "LLMGW_SUPERVISOR_PROC_UNREADABLE",
      `cannot read ${procRoot}/${pid}/stat and cmdline (process gone or not Linux)`,
    );
  }
  return { pid, pgid: stat.pgrp, startTime: stat.startTime, cmdlineSha256 };
}

/** Why a recorded identity does not match the live process with that pid. */
export type IdentityCheck =
  | { readonly kind: "match" }
  | { readonly kind: "gone" }
  | { readonly kind: "reused"; readonly reason: string };

/** Compares a recorded identity with what `/proc` says about that pid now. */
export function checkProcessIdentity(expected: ProcessIdentity, procRoot = "/proc"): IdentityCheck {
  const stat = readProcStat(expected.pid, procRoot);
  if (stat === undefined || stat.state === "Z") return { kind: "gone" };
  if (stat.startTime !== expected.startTime) {
    return {
      kind: "reused",
      reason: `start time ${stat.startTime} ≠ recorded ${expected.startTime}`,
    };
  }
  const cmdline = readCmdlineFingerprint(expected.pid, procRoot);
  if (cmdline !== expected.cmdlineSha256) {
    return { kind: "reused", reason: "command line fingerprint differs from the recorded one" };
  }
  return { kind: "match" };
}

/** A process of a group that is not gone yet (see {@link readGroupMembers}). */
export interface GroupMember {
  readonly pid: number;
  /**
   * One-letter state of its main thread. `Z`: the main thread exited while other threads of
   * the process still run or exit; `D`: in an uninterruptible call (a driver, a stuck mount),
   * where even SIGKILL waits until the call returns.
   */
  readonly state: string;
  /** Start time in clock ticks after boot; with the pid it identifies the process. */
  readonly startTime: string;
}

/**
 * The processes of group `pgid` that are not gone yet, from a scan of `/proc/<pid>/stat`:
 * every one that runs, sleeps or is still exiting. A zombie counts as gone only once it is
 * its last thread: a process's main thread reads as a zombie as soon as it exited, while its
 * other threads, which share its file table and so its listening sockets, may still run or
 * exit. A zombie that is its last thread holds no files any more, and whether anyone reaps it
 * (its parent, or an init that may reap orphans seconds late) does not matter here. In pid
 * order.
 */
export function readGroupMembers(pgid: number, procRoot = "/proc"): GroupMember[] {
  const members: GroupMember[] = [];
  let entries: string[];
  try {
    entries = readdirSync(procRoot);
  } catch {
    return members;
  }
  for (const entry of entries) {
    if (!/^\d+$/.test(entry)) continue;
    const stat = readProcStat(Number(entry), procRoot);
    if (stat === undefined || stat.pgrp !== pgid) continue;
    if (stat.state === "Z" && !hasOtherThreads(stat.pid, procRoot)) continue;
    members.push({ pid: stat.pid, state: stat.state, startTime: stat.startTime });
  }
  return members.sort((a, b) => a.pid - b.pid);
}

/** Pids of the processes of group `pgid` that are not gone yet ({@link readGroupMembers}). */
export function listGroupMembers(pgid: number, procRoot = "/proc"): number[] {
  return readGroupMembers(pgid, procRoot).map((member) => member.pid);
}

/** Whether `/proc/<pid>/task` lists a thread besides the main one (it lists them until released). */
function hasOtherThreads(pid: number, procRoot: string): boolean {
  try {
    return readdirSync(`${procRoot}/${pid}/task`).some((tid) => tid !== String(pid));
  } catch {
    return false; // reaped meanwhile
  }
}
