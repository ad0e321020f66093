import { readFile } from "node:fs/promises";
import path from "node:path";

/** The fields of `/proc/<pid>/stat` that tie a process to the ones above it. */
export interface ProcStat {
  readonly pid: number;
  readonly ppid: number;
  /** Process group id. */
  readonly pgrp: number;
  /** Session id. */
  readonly session: number;
}

/** Longest `/proc/<pid>/stat` read: the real line is a few hundred characters. */
const MAX_STAT_CHARS = 4_096;

/**
 * Parses one `/proc/<pid>/stat` line: `pid (comm) state ppid pgrp session …`. The command name
 * may itself hold spaces and parentheses, so the fields are read after its last `)`.
 *
 * @returns undefined for anything else. Never throws.
 */
export function parseProcStat(text: string): ProcStat | undefined {
  if (text.length > MAX_STAT_CHARS) return undefined;
  const open = text.indexOf(" (");
  const close = text.lastIndexOf(")");
  if (open <= 0 || close < open) return undefined;
  const pid = toPid(text.slice(0, open));
  const [, ppid, pgrp, session] = text
    .slice(close + 1)
    .trim()
    .split(/\s+/)
    .map(toPid);
  if (pid === undefined || ppid === undefined || pgrp === undefined || session === undefined) {
    return undefined;
  }
  return { pid, ppid, pgrp, session };
}

const toPid = (text: string): number | undefined =>
  /^\d{1,10}$/.test(text) ? Number(text) : undefined;

/** Options of {@link isManagedProcess}. */
export interface ManagedProcessOptions {
  /** Default `/proc`; tests may point elsewhere. */
  readonly procRoot?: string;
  /** Parents followed at most. Default 32. */
  readonly maxDepth?: number;
}

/** Whose process a pid is: one of llmgw's engines (or their workers), another's, or unknown. */
export type EngineProcess = "managed" | "foreign" | "gone";

/**
 * Whether `pid` is one of the `managed` engine pids or runs under one: the process itself, its
 * process group or session (the supervisor starts each engine as a group and session leader,
 * so its workers share them), or any parent up to `maxDepth` levels (a worker that started a
 * session of its own). Reads `/proc/<pid>/stat` along the way.
 *
 * `gone`: the pid (or a parent on the way) no longer exists, or `/proc` cannot be read — a
 * worker an Xid killed and its engine reaped, an engine llmgw just stopped, or an agent that
 * does not share the host's pid namespace. The caller decides what unknown means. Never throws.
 */
export async function engineProcessOf(
  pid: number,
  managed: ReadonlySet<number>,
  options: ManagedProcessOptions = {},
): Promise<EngineProcess> {
  const procRoot = options.procRoot ?? "/proc";
  const maxDepth = options.maxDepth ?? 32;
  let current = pid;
  for (let depth = 0; depth <= maxDepth; depth++) {
    if (managed.has(current)) return "managed";
    // pid 1 (init) and 0 (the kernel) are no engine's descendants.
    if (current <= 1) return "foreign";
    let text: string;
    try {
      text = await readFile(path.join(procRoot, String(current), "stat"), "utf8");
    } catch {
      return "gone";
    }
    const stat = parseProcStat(text.trimEnd());
    if (stat === undefined) return "gone";
    if (managed.has(stat.pgrp) || managed.has(stat.session)) return "managed";
    current = stat.ppid;
  }
  return "foreign";
}

/** {@link engineProcessOf} is `managed`; a pid that is gone is not (see there). */
export async function isManagedProcess(
  pid: number,
  managed: ReadonlySet<number>,
  options: ManagedProcessOptions = {},
): Promise<boolean> {
  return (await engineProcessOf(pid, managed, options)) === "managed";
}
