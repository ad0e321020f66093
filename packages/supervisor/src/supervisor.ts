import { spawn } from "node:child_process";
import { closeSync } from "node:fs";
import {
  type Clock,
  type SupervisorLogger,
  silentLogger,
  sleep,
  systemClock,
  type TimerHandle,
} from "./clock.js";
import { SupervisorError } from "./errors.js";
import { CappedLogFile } from "./log-file.js";
import {
  type PidRecord,
  readPidFile,
  removePidFile,
  validateReplicaId,
  writePidFile,
} from "./pid-file.js";
import {
  checkProcessIdentity,
  type GroupMember,
  type ProcessIdentity,
  readGroupMembers,
  readProcessIdentity,
} from "./proc.js";
import { hashProcessSpec, type ProcessSpec, validateProcessSpec } from "./process-spec.js";
import { resolveExecutable } from "./resolve-executable.js";

/** Partial supervisor options; see {@link resolveSupervisorOptions} for defaults. */
export interface SupervisorOptions {
  /** Directory of the pid files (created 0700). Required. */
  stateDir: string;
  clock?: Clock;
  logger?: SupervisorLogger;
  /** Log file cap before rotation to `.1`. Default 16 MiB. */
  logMaxFileBytes?: number;
  /** In-memory tail bounds. Defaults 200 lines, 64 KiB. */
  tailMaxLines?: number;
  tailMaxBytes?: number;
  /** How often the log file is read and capped. Default 500 ms. */
  logPollIntervalMs?: number;
  /** How often an adopted (non-child) process is checked for exit. Default 500 ms. */
  adoptPollIntervalMs?: number;
  /** How often a stopping group is re-scanned. Default 50 ms. */
  stopPollIntervalMs?: number;
  /**
   * How long to wait after SIGKILL for every process of the group to be gone; past it, stop
   * throws `LLMGW_SUPERVISOR_STOP_FAILED` naming the survivors (a process in an uninterruptible
   * call, state `D`, dies only once that call returns). Default 5000 ms.
   */
  killWaitMs?: number;
  /** Default grace between the stop signal and SIGKILL. Default 30 000 ms. */
  defaultStopGraceMs?: number;
  /** Root of procfs (tests only). Default `/proc`. */
  procRoot?: string;
  /**
   * PATH-style directories a bare `argv[0]` is looked up in (absolute entries only). Set it
   * to the caller's own PATH whenever a spec's `env` is shaped by someone else: by default
   * the spec's own `env.PATH` is used, as spawn would, so that env would choose the program.
   */
  searchPath?: string;
}

/** Complete, validated supervisor options. */
export interface ResolvedSupervisorOptions {
  readonly stateDir: string;
  readonly clock: Clock;
  readonly logger: SupervisorLogger;
  readonly logMaxFileBytes: number;
  readonly tailMaxLines: number;
  readonly tailMaxBytes: number;
  readonly logPollIntervalMs: number;
  readonly adoptPollIntervalMs: number;
  readonly stopPollIntervalMs: number;
  readonly killWaitMs: number;
  readonly defaultStopGraceMs: number;
  readonly procRoot: string;
  readonly searchPath: string | undefined;
}

/** Validates options once and fills defaults. Throws `LLMGW_SUPERVISOR_INVALID_OPTIONS`. */
export function resolveSupervisorOptions(options: SupervisorOptions): ResolvedSupervisorOptions {
  if (typeof options.stateDir !== "string" || options.stateDir === "") {
    throw new SupervisorError(
      "LLMGW_SUPERVISOR_INVALID_OPTIONS",
      `stateDir must be a directory path, got ${JSON.stringify(options.stateDir)}`,
    );
  }
  const resolved: ResolvedSupervisorOptions = {
    stateDir: options.stateDir,
    clock: options.clock ?? systemClock,
    logger: options.logger ?? silentLogger,
    logMaxFileBytes: options.logMaxFileBytes ?? 16 * 1024 * 1024,
    tailMaxLines: options.tailMaxLines ?? 200,
    tailMaxBytes: options.tailMaxBytes ?? 64 * 1024,
    logPollIntervalMs: options.logPollIntervalMs ?? 500,
    adoptPollIntervalMs: options.adoptPollIntervalMs ?? 500,
    stopPollIntervalMs: options.stopPollIntervalMs ?? 50,
    killWaitMs: options.killWaitMs ?? 5000,
    defaultStopGraceMs: options.defaultStopGraceMs ?? 30_000,
    procRoot: options.procRoot ?? "/proc",
    searchPath: options.searchPath,
  };
  for (const key of [
    "logMaxFileBytes",
    "tailMaxLines",
    "tailMaxBytes",
    "logPollIntervalMs",
    "adoptPollIntervalMs",
    "stopPollIntervalMs",
    "killWaitMs",
    "defaultStopGraceMs",
  ] as const) {
    const value = resolved[key];
    if (!Number.isFinite(value) || value <= 0) {
      throw new SupervisorError(
        "LLMGW_SUPERVISOR_INVALID_OPTIONS",
        `${key} must be a finite number > 0, got ${String(value)}`,
      );
    }
  }
  return resolved;
}

/** How the group leader ended. `code`/`signal` are unknown (null) for adopted processes. */
export interface ProcessExit {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly atMs: number;
}

/** Outcome of {@link ProcessHandle.stop}. */
export interface ExitReport {
  /** Exit code of the group leader (null when killed by a signal or when adopted). */
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
  /** The grace period ran out before the group was gone. */
  readonly timedOut: boolean;
  /** SIGKILL was sent to the group. */
  readonly forced: boolean;
  /** From the stop request until no process of the group was left. */
  readonly durationMs: number;
}

/** Stop overrides; defaults come from the process spec, then the supervisor. */
export interface StopOptions {
  signal?: NodeJS.Signals;
  graceMs?: number;
}

/** A running (spawned or adopted) engine process group. */
export interface ProcessHandle {
  readonly replicaId: string;
  readonly pid: number;
  readonly pgid: number;
  /** True when this supervisor adopted the process instead of spawning it. */
  readonly adopted: boolean;
  readonly specHash: string;
  readonly logFile: string;
  /** When this supervisor spawned or adopted it. */
  readonly startedAtMs: number;
  /** Resolves once the group leader has exited (never rejects). */
  readonly exited: Promise<ProcessExit>;
  /** The leader's exit, once known. */
  exit(): ProcessExit | undefined;
  /** The bounded log tail, oldest line first (reads the file up to date first). */
  tail(): string[];
  /**
   * Signals the whole group, waits up to the grace for every process of it to be gone, then
   * SIGKILLs the group and waits up to `killWaitMs` more. Resolves only once the leader has
   * exited and no process of the group runs or is still exiting ({@link readGroupMembers}):
   * their files, listening sockets included, are closed, so their ports can be bound again.
   * Processes that left the group (`setsid`, `setpgid`) are neither signalled nor waited for.
   * Once the leader exited (a crash, or this stop), the group is ours only while a process
   * seen in it since, same pid and start time, is still in it; once none is, the group id may
   * belong to another group, so stop resolves without signalling anything. An adopted
   * leader's exit is seen up to `adoptPollIntervalMs` late. Concurrent calls share one stop.
   * Throws `LLMGW_SUPERVISOR_STOP_FAILED`, naming each survivor and its state, if processes
   * outlive SIGKILL by `killWaitMs`; the ports they hold are not free then, and a later call
   * signals the group and waits again while one of them is left.
   */
  stop(options?: StopOptions): Promise<ExitReport>;
}

/** Outcome of {@link Supervisor.adopt}. */
export type AdoptionReport =
  | { readonly kind: "none" }
  | { readonly kind: "adopted"; readonly handle: ProcessHandle }
  /** Live and ours, but started from another spec: the caller replaces it deliberately. */
  | {
      readonly kind: "spec-changed";
      readonly handle: ProcessHandle;
      readonly recordedSpecHash: string;
      readonly expectedSpecHash: string;
    }
  /** Pid file removed; the process it named is gone (or the file was unreadable). */
  | { readonly kind: "stale"; readonly reason: string }
  /** Pid file removed; its pid now belongs to an unrelated process, which was NOT signalled. */
  | { readonly kind: "pid-reused"; readonly pid: number; readonly reason: string };

/**
 * Starts, watches, stops and adopts engine process groups. The only place in llmgw that
 * imports `node:child_process` for long-lived processes.
 */
export class Supervisor {
  readonly options: ResolvedSupervisorOptions;
  readonly #running = new Map<string, ProcessHandle>();

  constructor(options: SupervisorOptions) {
    this.options = resolveSupervisorOptions(options);
  }

  /** The live handle of `replicaId`, if this supervisor holds one. */
  get(replicaId: string): ProcessHandle | undefined {
    return this.#running.get(replicaId);
  }

  /**
   * Spawns `spec` in a new process group with stdout/stderr on its log file, writes the pid
   * file and starts tailing. Throws `LLMGW_SUPERVISOR_SPAWN_FAILED` (with `cause`) when the
   * executable cannot be started, `LLMGW_SUPERVISOR_ALREADY_RUNNING` if the replica is live.
   */
  async launch(replicaId: string, spec: ProcessSpec): Promise<ProcessHandle> {
    validateReplicaId(replicaId);
    validateProcessSpec(spec);
    this.#assertFree(replicaId);
    const o = this.options;
    const argv0 = spec.argv[0]!;
    const executable = resolveExecutable(argv0, o.searchPath ?? spec.env.PATH ?? "");
    const log = new CappedLogFile(spec.logFile, this.#logLimits());
    const fd = log.openForChild();
    const specHash = spec.specHash ?? hashProcessSpec(spec);
    let child: ReturnType<typeof spawn>;
    try {
      // The resolved path is what runs; argv[0] stays as given (process lists, fingerprints).
      child = spawn(executable, spec.argv.slice(1), {
        argv0,
        detached: true,
        stdio: ["ignore", fd, fd],
        env: { ...spec.env },
        ...(spec.cwd === undefined ? {} : { cwd: spec.cwd }),
      });
    } catch (cause) {
      closeSync(fd);
      throw new SupervisorError("LLMGW_SUPERVISOR_SPAWN_FAILED", `cannot spawn ${spec.argv[0]}`, {
        cause,
      });
    }
    const exitInfo = new Promise<ProcessExit>((resolve) => {
      child.once("exit", (code, signal) => resolve({ code, signal, atMs: o.clock.now() }));
    });
    try {
      await new Promise<void>((resolve, reject) => {
        child.once("spawn", () => resolve());
        child.once("error", reject);
      });
    } catch (cause) {
      throw new SupervisorError(
        "LLMGW_SUPERVISOR_SPAWN_FAILED",
        `cannot spawn ${spec.argv[0]} for replica ${replicaId}: ${(cause as Error).message}`,
        { cause },
      );
    } finally {
      closeSync(fd);
    }
    child.on("error", () => {}); // later errors (e.g. kill on a dead pid) are reported via exit
    const pid = child.pid!;
    const readIdentity = (): ProcessIdentity | undefined => {
      try {
        return readProcessIdentity(pid, o.procRoot);
      } catch {
        return undefined; // not readable yet, or exited already (the exit handler reports it)
      }
    };
    let identity = readIdentity();
    // spawn returns once the child's exec has begun, but the kernel lays out the new program's
    // arguments a moment later: until then /proc/<pid>/cmdline is empty, and on a busy machine
    // that moment is long enough to miss (the pid file was then never written). Wait for it.
    for (let i = 0; identity === undefined && i < 100 && isRunning(child); i++) {
      await new Promise((resolve) => setTimeout(resolve, 2));
      identity = readIdentity();
    }
    if (identity !== undefined) {
      writePidFile(o.stateDir, {
        version: 1,
        replicaId,
        ...identity,
        specHash,
        logFile: spec.logFile,
        ...(spec.stopSignal === undefined ? {} : { stopSignal: spec.stopSignal }),
        ...(spec.stopGraceMs === undefined ? {} : { stopGraceMs: spec.stopGraceMs }),
        writtenAtMs: o.clock.now(),
      });
    }
    o.logger.info("process spawned", { replicaId, pid, argv0: spec.argv[0] });
    const handle = new GroupHandle({
      supervisor: this,
      replicaId,
      pid,
      pgid: pid,
      adopted: false,
      specHash,
      log,
      exited: exitInfo,
      defaults: spec,
    });
    this.#track(handle);
    return handle;
  }

  /**
   * Looks for a process a previous supervisor left behind for `replicaId`. A live process
   * whose start time and command-line fingerprint match the pid file is adopted and watched
   * by polling `/proc` (this supervisor is not its parent). A pid whose start time or
   * command line differ was reused: the file is removed and the process is never signalled.
   */
  async adopt(replicaId: string, expectedSpecHash: string): Promise<AdoptionReport> {
    validateReplicaId(replicaId);
    this.#assertFree(replicaId);
    const o = this.options;
    const read = readPidFile(o.stateDir, replicaId);
    if (read.kind === "missing") return { kind: "none" };
    if (read.kind === "invalid") {
      removePidFile(o.stateDir, replicaId);
      o.logger.warn("removed invalid pid file", { replicaId, reason: read.reason });
      return { kind: "stale", reason: `invalid pid file: ${read.reason}` };
    }
    const record = read.record;
    const check = checkProcessIdentity(record, o.procRoot);
    if (check.kind === "gone") {
      removePidFile(o.stateDir, replicaId);
      o.logger.info("removed stale pid file", { replicaId, pid: record.pid });
      return { kind: "stale", reason: `process ${record.pid} is gone` };
    }
    if (check.kind === "reused") {
      removePidFile(o.stateDir, replicaId);
      o.logger.warn("pid reused by an unrelated process; not adopting", {
        replicaId,
        pid: record.pid,
        reason: check.reason,
      });
      return { kind: "pid-reused", pid: record.pid, reason: check.reason };
    }
    const handle = this.#adoptRecord(record);
    this.#track(handle);
    o.logger.info("process adopted", { replicaId, pid: record.pid });
    if (record.specHash !== expectedSpecHash) {
      return { kind: "spec-changed", handle, recordedSpecHash: record.specHash, expectedSpecHash };
    }
    return { kind: "adopted", handle };
  }

  /**
   * Stops the process a previous supervisor left running for `replicaId`, for a caller that
   * will not adopt it (a replica it refuses to run): only when it is still the process its
   * pid file names (start time and command line, as {@link adopt} checks; a reused pid is
   * never signalled), through its process group with the stop settings its launcher
   * recorded. Resolves to undefined when there was none. Throws as {@link adopt} does, and
   * `LLMGW_SUPERVISOR_STOP_FAILED` as {@link ProcessHandle.stop} does.
   */
  async stopLeftover(replicaId: string): Promise<ExitReport | undefined> {
    // No spec hash is empty: a live process of ours comes back as `spec-changed`.
    const report = await this.adopt(replicaId, "");
    if (report.kind !== "adopted" && report.kind !== "spec-changed") return undefined;
    this.options.logger.warn("stopping a process left running that is not adopted", {
      replicaId,
      pid: report.handle.pid,
    });
    return report.handle.stop();
  }

  #adoptRecord(record: PidRecord): GroupHandle {
    const o = this.options;
    const log = new CappedLogFile(record.logFile, this.#logLimits(), { prefillTail: true });
    let resolveExit!: (exit: ProcessExit) => void;
    const exited = new Promise<ProcessExit>((resolve) => {
      resolveExit = resolve;
    });
    const watch = (): void => {
      if (checkProcessIdentity(record, o.procRoot).kind !== "match") {
        resolveExit({ code: null, signal: null, atMs: o.clock.now() });
        return;
      }
      o.clock.setTimer(watch, o.adoptPollIntervalMs);
    };
    o.clock.setTimer(watch, o.adoptPollIntervalMs);
    return new GroupHandle({
      supervisor: this,
      replicaId: record.replicaId,
      pid: record.pid,
      pgid: record.pgid,
      adopted: true,
      specHash: record.specHash,
      log,
      exited,
      defaults: { stopSignal: record.stopSignal, stopGraceMs: record.stopGraceMs },
      identity: record,
    });
  }

  #assertFree(replicaId: string): void {
    if (this.#running.has(replicaId)) {
      throw new SupervisorError(
        "LLMGW_SUPERVISOR_ALREADY_RUNNING",
        `replica ${replicaId} already has a live process in this supervisor`,
      );
    }
  }

  #track(handle: GroupHandle): void {
    this.#running.set(handle.replicaId, handle);
    void handle.exited.then((exit) => {
      this.options.logger.info("process exited", {
        replicaId: handle.replicaId,
        pid: handle.pid,
        code: exit.code,
        signal: exit.signal,
      });
      if (this.#running.get(handle.replicaId) === handle) this.#running.delete(handle.replicaId);
      // Only remove the file if it still describes this process (a relaunch may have replaced it).
      const read = readPidFile(this.options.stateDir, handle.replicaId);
      if (read.kind === "ok" && read.record.pid === handle.pid) {
        removePidFile(this.options.stateDir, handle.replicaId);
      }
    });
  }

  #logLimits() {
    const o = this.options;
    return {
      maxFileBytes: o.logMaxFileBytes,
      tailMaxLines: o.tailMaxLines,
      tailMaxBytes: o.tailMaxBytes,
    };
  }
}

/** Creates a {@link Supervisor}. */
export function createSupervisor(options: SupervisorOptions): Supervisor {
  return new Supervisor(options);
}

interface GroupHandleInit {
  supervisor: Supervisor;
  replicaId: string;
  pid: number;
  pgid: number;
  adopted: boolean;
  specHash: string;
  log: CappedLogFile;
  exited: Promise<ProcessExit>;
  defaults: Pick<ProcessSpec, "stopSignal" | "stopGraceMs">;
  identity?: ProcessIdentity;
}

class GroupHandle implements ProcessHandle {
  readonly replicaId: string;
  readonly pid: number;
  readonly pgid: number;
  readonly adopted: boolean;
  readonly specHash: string;
  readonly logFile: string;
  readonly startedAtMs: number;
  readonly exited: Promise<ProcessExit>;
  readonly #o: ResolvedSupervisorOptions;
  readonly #log: CappedLogFile;
  readonly #defaults: GroupHandleInit["defaults"];
  readonly #identity: ProcessIdentity | undefined;
  #exit: ProcessExit | undefined;
  #stopping: Promise<ExitReport> | undefined;
  #pollTimer: TimerHandle | undefined;
  #gone = false;
  /** Since the leader exited: the group's members at the last scan that found it ours. */
  #known: readonly GroupMember[] | undefined;

  constructor(init: GroupHandleInit) {
    this.#o = init.supervisor.options;
    this.replicaId = init.replicaId;
    this.pid = init.pid;
    this.pgid = init.pgid;
    this.adopted = init.adopted;
    this.specHash = init.specHash;
    this.logFile = init.log.path;
    this.#log = init.log;
    this.#defaults = init.defaults;
    this.#identity = init.identity;
    this.startedAtMs = this.#o.clock.now();
    this.exited = init.exited.then((exit) => {
      this.#exit = exit;
      this.#pollTimer?.cancel();
      this.#log.poll();
      // The first scan since the leader exited: it remembers who is in the group now.
      this.#groupGone();
      return exit;
    });
    this.#schedulePoll();
  }

  exit(): ProcessExit | undefined {
    return this.#exit;
  }

  tail(): string[] {
    this.#log.poll();
    return this.#log.tail.lines();
  }

  stop(options: StopOptions = {}): Promise<ExitReport> {
    if (this.#stopping === undefined) {
      const stopping = this.#stop(options);
      this.#stopping = stopping;
      // Only success is latched: processes that outlived SIGKILL may be gone by a later call
      // (#members tells their leaving from the group id's reuse).
      stopping.catch(() => {
        if (this.#stopping === stopping) this.#stopping = undefined;
      });
    }
    return this.#stopping;
  }

  async #stop(options: StopOptions): Promise<ExitReport> {
    const o = this.#o;
    const clock = o.clock;
    const signal = options.signal ?? this.#defaults.stopSignal ?? "SIGTERM";
    const graceMs = options.graceMs ?? this.#defaults.stopGraceMs ?? o.defaultStopGraceMs;
    const started = clock.now();
    const gone = (): boolean => this.#groupGone();
    if (this.adopted && this.#exit === undefined && this.#identity !== undefined) {
      // Re-check right before signalling: never signal a group whose leader was replaced.
      if (checkProcessIdentity(this.#identity, o.procRoot).kind === "reused") {
        throw new SupervisorError(
          "LLMGW_SUPERVISOR_STOP_FAILED",
          `refusing to signal pid ${this.pid}: it no longer is the adopted process`,
        );
      }
    }
    let timedOut = false;
    let forced = false;
    if (!gone()) {
      o.logger.info("stopping process group", {
        replicaId: this.replicaId,
        pgid: this.pgid,
        signal,
        graceMs,
      });
      this.#signalGroup(signal);
      const deadline = started + graceMs;
      while (!gone() && clock.now() < deadline) await sleep(clock, o.stopPollIntervalMs);
      if (!gone()) {
        timedOut = true;
        forced = true;
        o.logger.warn("grace period over; killing process group", {
          replicaId: this.replicaId,
          pgid: this.pgid,
        });
        this.#signalGroup("SIGKILL");
        const killDeadline = clock.now() + o.killWaitMs;
        while (!gone() && clock.now() < killDeadline) await sleep(clock, o.stopPollIntervalMs);
        if (!gone()) {
          const survivors = this.#members()
            .map((m) => `${m.pid} (${m.state === "Z" ? "exiting" : `state ${m.state}`})`)
            .join(", ");
          throw new SupervisorError(
            "LLMGW_SUPERVISOR_STOP_FAILED",
            `process group ${this.pgid} of replica ${this.replicaId} survived SIGKILL for ${o.killWaitMs} ms: pids ${survivors || "(leader not reaped)"}`,
          );
        }
      }
    }
    const exit = await this.exited;
    const report: ExitReport = {
      code: exit.code,
      signal: exit.signal,
      timedOut,
      forced,
      durationMs: clock.now() - started,
    };
    this.#log.note(
      `stopped: code=${report.code} signal=${report.signal} forced=${forced} after ${report.durationMs} ms`,
    );
    return report;
  }

  /**
   * True once the leader exited and no process of the group runs or is still exiting
   * ({@link #members}). Latched: once the group was seen empty its id may be reused by an
   * unrelated process group, which must never be scanned or signalled as ours. Seen empty
   * also when only processes it never saw there are left (an engine that crashed, whose last
   * grandchildren exited before anyone stopped it, leaves its id free for reuse).
   */
  #groupGone(): boolean {
    if (this.#gone) return true;
    this.#gone = this.#exit !== undefined && this.#members().length === 0;
    return this.#gone;
  }

  /**
   * The processes of the group not gone yet ({@link readGroupMembers}; zombies that are their
   * last thread are gone, reaped or not). While the leader lives the group id is ours. Once it
   * exited (an engine crash, or a stop) the id stays ours only while a process we saw in the
   * group, same pid and start time, is still in it: a group id is not reused while a process
   * is left in the group, and a process keeps its group when it forks, so the others are its
   * descendants. Each scan that finds one of them remembers every member (descendants forked
   * since included); a scan that finds none finds no process of ours, whatever holds the id.
   */
  #members(): GroupMember[] {
    const members = readGroupMembers(this.pgid, this.#o.procRoot);
    if (this.#exit === undefined) return members;
    const known = this.#known;
    const ours =
      known === undefined ||
      members.some((m) => known.some((k) => k.pid === m.pid && k.startTime === m.startTime));
    if (!ours) return [];
    this.#known = members;
    return members;
  }

  #signalGroup(signal: NodeJS.Signals): void {
    if (this.#gone) return;
    try {
      process.kill(-this.pgid, signal);
    } catch (cause) {
      if ((cause as NodeJS.ErrnoException).code !== "ESRCH") {
        throw new SupervisorError(
          "LLMGW_SUPERVISOR_STOP_FAILED",
          `cannot signal group ${this.pgid}`,
          { cause },
        );
      }
    }
  }

  #schedulePoll(): void {
    this.#pollTimer = this.#o.clock.setTimer(() => {
      if (this.#exit !== undefined) return;
      this.#log.poll();
      this.#schedulePoll();
    }, this.#o.logPollIntervalMs);
  }
}

/** True while `child` has neither exited nor been killed by a signal. */
function isRunning(child: { exitCode: number | null; signalCode: string | null }): boolean {
  return child.exitCode === null && child.signalCode === null;
}
