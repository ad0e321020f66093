// The I/O shell around the pure kernel-log tracker (kernel-log.ts): opens `/dev/kmsg` (or a
// `--kernel-log` file or FIFO), reads it from the start of the kernel's buffer, follows it, and
// reports what it could not read as problems. Transport facts: shared/reference/health-formats.md
// §1.1 and the kernel's Documentation/ABI/testing/dev-kmsg.
import {
  closeSync,
  constants,
  fchmodSync,
  fstatSync,
  fsyncSync,
  openSync,
  readFileSync,
  readSync,
  renameSync,
  statSync,
  unlinkSync,
  writeSync,
} from "node:fs";
import { uptime } from "node:os";
import { StringDecoder } from "node:string_decoder";
import { DiscoveryError } from "./errors.js";
import {
  compareFaultUrgency,
  createKernelFaultTracker,
  DEFAULT_MAX_RECORD_CHARS,
  isRestorableFault,
  isUnhealthyFault,
  type KernelFaultEvent,
  type KernelFaultTracker,
  type KernelFaultTrackerStats,
} from "./kernel-log.js";
import { ProblemCodes, problem } from "./problem-codes.js";
import type { GpuFault, Problem } from "./types.js";

/** Where the kernel log is read by default. */
export const DEFAULT_KERNEL_LOG_PATH = "/dev/kmsg";
/** Where the boot id is read by default. */
export const DEFAULT_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id";

/** User-facing options of {@link watchKernelLog}; see {@link resolveKernelLogWatcherOptions}. */
export interface KernelLogWatcherOptions {
  /** `/dev/kmsg` (default), a regular file (read from the start, appends followed) or a FIFO. */
  readonly path?: string;
  /** Unix ms. Default `Date.now`. */
  readonly clock?: () => number;
  /**
   * Unix ms of boot, to turn kmsg `TS_US` and dmesg `[secs.usec]` stamps (µs since boot) into
   * wall time (see `recordTimeMs`). Default `/proc/stat`'s `btime`, else `clock() - os.uptime()`
   * at creation (the kernel's timestamps exclude suspend; servers don't).
   */
  readonly bootTimeMs?: number;
  /**
   * Boot id stamped on faults. Default: read from `bootIdPath` when `path` is a character
   * device (kmsg); a regular file or FIFO may come from another boot, so it gets none. `null`:
   * never.
   */
  readonly bootId?: string | null;
  /** Default {@link DEFAULT_BOOT_ID_PATH}. */
  readonly bootIdPath?: string;
  /** Wait after the log had nothing new, before reading again. Default 200 ms. */
  readonly pollMs?: number;
  /** Wait before trying again to open a log that could not be opened or read. Default 10 000 ms. */
  readonly retryMs?: number;
  /** Burst window of the fault aggregator. Default 60 000 ms. */
  readonly windowMs?: number;
  /** Faults kept (the least recently seen is forgotten first). Default 1024. */
  readonly maxFaults?: number;
  /** Longest line or record parsed, in characters; longer ones are cut and counted. Default 16 384. */
  readonly maxRecordChars?: number;
  /**
   * Called when a fault opens (or opens a new burst) or its action changes, with whether the
   * record was read live or from the backlog. A throwing listener is ignored.
   */
  readonly onChange?: (event: KernelFaultEvent) => void;
  /** False: read to the end once and stop (see {@link readKernelLogFaults}). Default true. */
  readonly follow?: boolean;
  /**
   * Where faults that take a GPU out (reset-gpu, drain-node, reboot) are saved, so that they
   * survive an agent restart after the kernel's ring buffer dropped their records. Written
   * whenever they change (owner-only 0600, through a temporary file and an atomic rename, at
   * most {@link MAX_SAVED_FAULTS} faults), stamped with the boot id. Once the log was read at
   * start, faults saved under the same boot id that the log no longer holds come back
   * (described as restored; their events are never live, so no engine restarts over them); a
   * file from another boot, or without a boot id, is discarded (overwritten). A file that
   * cannot be read or is corrupt is a `LLMGW_DISCOVERY_KERNEL_LOG_STATE_FAILED` problem and a
   * fresh start, never a throw. Only `/dev/kmsg` (a character device) has a boot id: for a
   * regular file or FIFO, or when the boot id is unknown, this option does nothing. Default:
   * none (faults live as long as the log holds them).
   */
  readonly stateFile?: string;
}

/** Most faults a `stateFile` holds (the most severe, then most recently seen). */
export const MAX_SAVED_FAULTS = 256;
/** Largest `stateFile` read back; a bigger one is corrupt. */
export const MAX_STATE_FILE_BYTES = 1024 * 1024;

/** {@link KernelLogWatcherOptions} with every default filled in. */
export interface ResolvedKernelLogWatcherOptions {
  readonly path: string;
  readonly clock: () => number;
  readonly bootTimeMs: number;
  readonly bootId: string | undefined;
  readonly pollMs: number;
  readonly retryMs: number;
  readonly windowMs: number;
  readonly maxFaults: number;
  readonly maxRecordChars: number;
  readonly onChange: ((event: KernelFaultEvent) => void) | undefined;
  readonly follow: boolean;
  readonly stateFile: string | undefined;
}

/**
 * Validates once and fills defaults. Throws `DiscoveryError` `LLMGW_DISCOVERY_INVALID_OPTION`
 * naming the option and echoing its value. Reads the boot id (see
 * {@link KernelLogWatcherOptions.bootId}); a boot id that cannot be read is left unknown.
 */
export function resolveKernelLogWatcherOptions(
  options: KernelLogWatcherOptions = {},
): ResolvedKernelLogWatcherOptions {
  const path = options.path ?? DEFAULT_KERNEL_LOG_PATH;
  if (typeof path !== "string" || path === "" || path.includes("\0")) {
    throw new DiscoveryError(
      "LLMGW_DISCOVERY_INVALID_OPTION",
      `kernel log path must be a non-empty path, got ${JSON.stringify(path)}`,
    );
  }
  const stateFile = options.stateFile;
  if (
    stateFile !== undefined &&
    (typeof stateFile !== "string" || stateFile === "" || stateFile.includes("\0"))
  ) {
    throw new DiscoveryError(
      "LLMGW_DISCOVERY_INVALID_OPTION",
      `kernel log option stateFile must be a non-empty path, got ${JSON.stringify(stateFile)}`,
    );
  }
  const positive = (name: string, value: number | undefined, fallback: number): number => {
    const v = value ?? fallback;
    if (!Number.isSafeInteger(v) || v <= 0) {
      throw new DiscoveryError(
        "LLMGW_DISCOVERY_INVALID_OPTION",
        `kernel log option ${name} must be a positive integer, got ${String(value)}`,
      );
    }
    return v;
  };
  const clock = options.clock ?? Date.now;
  const bootTimeMs = options.bootTimeMs ?? readBootTimeMs() ?? clock() - uptime() * 1000;
  if (!Number.isFinite(bootTimeMs)) {
    throw new DiscoveryError(
      "LLMGW_DISCOVERY_INVALID_OPTION",
      `kernel log option bootTimeMs must be a finite number, got ${String(options.bootTimeMs)}`,
    );
  }
  let bootId: string | undefined;
  if (typeof options.bootId === "string") bootId = options.bootId;
  else if (options.bootId === undefined && isCharacterDevice(path)) {
    bootId = readBootId(options.bootIdPath ?? DEFAULT_BOOT_ID_PATH);
  }
  return {
    path,
    clock,
    bootTimeMs,
    bootId,
    pollMs: positive("pollMs", options.pollMs, 200),
    retryMs: positive("retryMs", options.retryMs, 10_000),
    windowMs: positive("windowMs", options.windowMs, 60_000),
    maxFaults: positive("maxFaults", options.maxFaults, 1024),
    maxRecordChars: positive("maxRecordChars", options.maxRecordChars, DEFAULT_MAX_RECORD_CHARS),
    onChange: options.onChange,
    follow: options.follow ?? true,
    stateFile,
  };
}

/** What kind of file the watcher reads. */
export type KernelLogSource = "kmsg" | "file" | "fifo";

/** Counters of a {@link KernelLogWatcher}. */
export interface KernelLogWatcherStats extends KernelFaultTrackerStats {
  /** What the open log is; undefined while it cannot be opened. */
  source: KernelLogSource | undefined;
  /**
   * kmsg `EPIPE` bursts, plus one when the first record read was not seq 0: the ring buffer
   * overwrote records before they were read.
   */
  overruns: number;
  /** Records lost in those overruns, from the sequence-number gaps (from 0 for the first record). */
  lostRecords: number;
  /** A regular file was truncated or replaced (rotated) and read again from its start. */
  restarts: number;
  /** Times the log could not be opened or read. */
  failures: number;
  /** Times the `stateFile` was written. */
  stateWrites: number;
}

/** A running kernel-log watcher (see {@link watchKernelLog}). */
export interface KernelLogWatcher {
  readonly path: string;
  /** Faults read so far, in the order first seen; they stay until the watcher closes. */
  faults(): GpuFault[];
  /**
   * Node problems now: `LLMGW_DISCOVERY_KERNEL_LOG_UNREADABLE` while the log cannot be read
   * (faults unknown, not absent), `LLMGW_DISCOVERY_KERNEL_LOG_OVERRUN` once records were lost
   * (ring buffer) or faults were forgotten (`maxFaults`), and
   * `LLMGW_DISCOVERY_KERNEL_LOG_STATE_FAILED` when the `stateFile` could not be read (for the
   * watcher's life) or the last write failed.
   */
  problems(): Problem[];
  stats(): KernelLogWatcherStats;
  /** Resolves once the initial content (the kernel's buffer since boot) was read, or opening it failed. */
  readonly caughtUp: Promise<void>;
  /** Stops reading and closes the file. Idempotent. */
  close(): Promise<void>;
}

// Larger than the kernel's biggest kmsg record (CONSOLE_EXT_LOG_MAX, 8 KiB): a read into a
// smaller buffer fails with EINVAL and does not advance.
const KMSG_BUFFER_BYTES = 16 * 1024;
const STREAM_BUFFER_BYTES = 64 * 1024;
// Work done per turn of the event loop before yielding (a big backlog must not starve the agent).
const KMSG_RECORDS_PER_TURN = 2048;
const STREAM_CHUNKS_PER_TURN = 16;
const KMSG_SEQ = /^\d{1,20},(\d{1,20}),/;

/**
 * Watches the kernel log for NVIDIA Xid / SXid / fallen-off-bus records and keeps them as GPU
 * faults. `/dev/kmsg` is opened non-blocking and read one record per `read()` from the start of
 * the kernel's ring buffer (a fault since boot still counts); at its end (`EAGAIN`) the watcher
 * waits `pollMs` (kmsg wakes no `fs.watch`, and a non-blocking `readSync` costs one syscall, so
 * polling at 5 Hz is cheaper than a thread-pool read per record). `EPIPE` (records overwritten)
 * is counted and reported with the number lost. A regular file is read from the start and
 * followed; a truncation or a new file at the path (rotation) starts it over. A FIFO is read as
 * a stream. Only kernel-facility records count (see {@link createKernelFaultTracker}).
 *
 * A log that cannot be opened or read (EACCES, EPERM, ENOENT, …) is a node problem naming the
 * path and errno, retried every `retryMs`; never a throw, never a silent "healthy".
 *
 * @throws DiscoveryError only for invalid options.
 */
export function watchKernelLog(options: KernelLogWatcherOptions = {}): KernelLogWatcher {
  const o = resolveKernelLogWatcherOptions(options);
  const tracker = createKernelFaultTracker({
    clock: o.clock,
    bootTimeMs: o.bootTimeMs,
    windowMs: o.windowMs,
    maxFaults: o.maxFaults,
    maxRecordChars: o.maxRecordChars,
    ...(o.bootId === undefined ? {} : { bootId: o.bootId }),
  });
  const own = { restarts: 0, failures: 0, truncated: 0 };
  let fd: number | undefined;
  let source: KernelLogSource | undefined;
  let inode: number | undefined;
  let position = 0;
  let decoder = new StringDecoder("utf8");
  let partial = "";
  let discarding = false;
  const sequence = createKmsgSequence(o.path);
  const state = createFaultState(o, tracker);
  // Records of the current opening are live once it caught up (or when it opened a rotated
  // file, whose content is new); the backlog of a first or re-opening is not. A text log has no
  // kmsg seq: the tracker skips a stamped record read before and never calls one at or below
  // the highest stamp read live, so a rotated file or a restarted `dmesg -w` that prints the
  // ring again acts on nothing old. A file holding several boots (even one whose next boot is
  // appended while it is followed) is split by the tracker at its boot boundaries.
  let live = false;
  let unreadable: Problem | undefined;
  let timer: NodeJS.Timeout | undefined;
  let immediate: NodeJS.Immediate | undefined;
  let closed = false;
  let resolveCaughtUp!: () => void;
  const caughtUp = new Promise<void>((resolve) => {
    resolveCaughtUp = resolve;
  });
  const kmsgBuffer = Buffer.allocUnsafe(KMSG_BUFFER_BYTES);
  const streamBuffer = Buffer.allocUnsafe(STREAM_BUFFER_BYTES);

  const emit = (events: readonly KernelFaultEvent[]) => {
    if (o.onChange === undefined) return;
    for (const event of events) {
      try {
        o.onChange(event);
      } catch {
        // a listener must not stop the watcher
      }
    }
  };

  const schedule = (delayMs: number | "now") => {
    if (closed) return;
    if (delayMs === "now") {
      immediate = setImmediate(tick);
    } else {
      timer = setTimeout(tick, delayMs);
      timer.unref();
    }
  };

  const closeFd = () => {
    if (fd === undefined) return;
    try {
      closeSync(fd);
    } catch {
      // already gone
    }
    fd = undefined;
  };

  const fail = (error: unknown, doing: "open" | "read") => {
    closeFd();
    source = undefined;
    own.failures++;
    const code = (error as NodeJS.ErrnoException).code ?? (error as Error).message;
    const hint =
      code === "EACCES" || code === "EPERM"
        ? "; reading /dev/kmsg needs root or CAP_SYSLOG when kernel.dmesg_restrict=1"
        : "";
    const retry = o.follow ? `; retrying every ${o.retryMs / 1000} s` : "";
    unreadable = problem(
      ProblemCodes.kernelLogUnreadable,
      "kernel-log",
      `cannot ${doing} the kernel log ${o.path} (${code}): GPU faults it would report (Xid, SXid, fallen off the bus) are unknown, not absent${hint}${retry}`,
    );
    resolveCaughtUp();
  };

  const open = (rotated: boolean): boolean => {
    let opened: number | undefined;
    try {
      opened = openSync(o.path, constants.O_RDONLY | constants.O_NONBLOCK);
      const st = fstatSync(opened);
      const kind: KernelLogSource | undefined = st.isCharacterDevice()
        ? "kmsg"
        : st.isFIFO()
          ? "fifo"
          : st.isFile()
            ? "file"
            : undefined;
      if (kind === undefined) {
        throw Object.assign(new Error("not a character device, FIFO or regular file"), {
          code: "EINVAL",
        });
      }
      // Reopening the same regular file (after a read error) resumes where it stopped, so its
      // records are not folded in twice; a new file starts at 0.
      if (kind !== "file" || inode !== st.ino) {
        position = 0;
        partial = "";
        discarding = false;
        decoder = new StringDecoder("utf8");
      }
      fd = opened;
      source = kind;
      inode = st.ino;
      unreadable = undefined;
      live = rotated;
      return true;
    } catch (error) {
      if (opened !== undefined && fd !== opened) {
        try {
          closeSync(opened);
        } catch {
          // nothing to do
        }
      }
      fail(error, "open");
      return false;
    }
  };

  const caughtUpNow = () => {
    live = true;
    // Restore before the first save, once the log's own faults are known; only kmsg has a boot.
    if (source === "kmsg") emit(state.restore());
    resolveCaughtUp();
  };

  const handleKmsg = (text: string) => {
    const seqMatch = KMSG_SEQ.exec(text);
    const seq = seqMatch ? Number(seqMatch[1]) : undefined;
    if (seq !== undefined && !sequence.accept(seq)) return;
    emit(tracker.add(text, live));
  };

  const handleLines = (text: string) => {
    const parts = (partial + text).split("\n");
    partial = parts.pop() ?? "";
    for (const line of parts) {
      if (discarding) {
        discarding = false; // the rest of a line already cut
        continue;
      }
      emit(tracker.add(line, live));
    }
    if (partial.length > o.maxRecordChars) {
      own.truncated++;
      emit(tracker.add(partial.slice(0, o.maxRecordChars), live));
      partial = "";
      discarding = true;
    }
  };

  const flushPartial = () => {
    const rest = partial + decoder.end();
    partial = "";
    if (rest !== "" && !discarding) emit(tracker.add(rest, live));
    discarding = false;
  };

  /** Reads kmsg records until EAGAIN or the turn's budget. */
  const drainKmsg = (): "more" | "idle" | "failed" => {
    for (let i = 0; i < KMSG_RECORDS_PER_TURN; i++) {
      let n: number;
      try {
        n = readSync(fd!, kmsgBuffer, 0, kmsgBuffer.length, null);
      } catch (error) {
        const code = (error as NodeJS.ErrnoException).code;
        if (code === "EAGAIN" || code === "EWOULDBLOCK") return "idle";
        if (code === "EINTR") continue;
        if (code === "EPIPE") {
          sequence.epipe();
          continue;
        }
        fail(error, "read");
        return "failed";
      }
      if (n === 0) return "idle";
      handleKmsg(kmsgBuffer.toString("utf8", 0, n));
    }
    return "more";
  };

  /** Reads a regular file or FIFO until its end or the turn's budget. */
  const drainStream = (): "more" | "idle" | "failed" => {
    for (let i = 0; i < STREAM_CHUNKS_PER_TURN; i++) {
      let n: number;
      try {
        n = readSync(
          fd!,
          streamBuffer,
          0,
          streamBuffer.length,
          source === "file" ? position : null,
        );
      } catch (error) {
        const code = (error as NodeJS.ErrnoException).code;
        if (code === "EAGAIN" || code === "EWOULDBLOCK") return "idle";
        if (code === "EINTR") continue;
        fail(error, "read");
        return "failed";
      }
      if (n === 0) {
        if (source === "file" && restartFileIfReplaced()) continue;
        return "idle"; // end of file, or a FIFO without a writer for now
      }
      position += n;
      handleLines(decoder.write(streamBuffer.subarray(0, n)));
    }
    return "more";
  };

  /** At the end of a regular file: start over if it was truncated or replaced. */
  const restartFileIfReplaced = (): boolean => {
    try {
      if (fstatSync(fd!).size < position) {
        own.restarts++;
        position = 0;
        partial = "";
        discarding = false;
        decoder = new StringDecoder("utf8");
        return true;
      }
      const current = statSync(o.path);
      if (current.ino !== inode) {
        flushPartial();
        own.restarts++;
        closeFd();
        return open(true);
      }
    } catch {
      // The path is gone for now (mid-rotation): keep the old file until a new one appears.
    }
    return false;
  };

  function tick(): void {
    timer = undefined;
    immediate = undefined;
    if (closed) return;
    if (fd === undefined && !open(false)) {
      if (o.follow) schedule(o.retryMs);
      return;
    }
    const outcome = source === "kmsg" ? drainKmsg() : drainStream();
    state.saveIfChanged();
    if (outcome === "more") {
      schedule("now");
      return;
    }
    if (outcome === "failed") {
      if (o.follow) schedule(o.retryMs);
      return;
    }
    if (!o.follow) {
      flushPartial();
      caughtUpNow();
      return;
    }
    caughtUpNow();
    schedule(o.pollMs);
  }

  tick();

  return {
    path: o.path,
    faults: () => tracker.faults(),
    problems: () =>
      [unreadable, sequence.problem(), ...tracker.problems(), ...state.problems()].filter(
        (p): p is Problem => p !== undefined,
      ),
    stats: () => {
      const t = tracker.stats();
      return {
        ...t,
        truncated: t.truncated + own.truncated,
        source,
        overruns: sequence.overruns(),
        lostRecords: sequence.lostRecords(),
        restarts: own.restarts,
        failures: own.failures,
        stateWrites: state.writes(),
      };
    },
    caughtUp,
    async close() {
      if (closed) return;
      closed = true;
      if (timer !== undefined) clearTimeout(timer);
      if (immediate !== undefined) clearImmediate(immediate);
      closeFd();
      resolveCaughtUp();
    },
  };
}

/**
 * Sequence-number bookkeeping of one kmsg reader: records read again after a reopen (the device
 * starts at its oldest record) are skipped, and each burst of `EPIPE` (the ring buffer overwrote
 * records before they were read) is one overrun whose size the next record's seq gap tells.
 */
export interface KmsgSequence {
  /** A read failed with EPIPE. */
  epipe(): void;
  /** A record with this seq was read; false when it was read before (skip it). */
  accept(seq: number): boolean;
  overruns(): number;
  lostRecords(): number;
  /** `LLMGW_DISCOVERY_KERNEL_LOG_OVERRUN` once an overrun happened. */
  problem(): Problem | undefined;
}

/** Creates a {@link KmsgSequence} for the log at `path` (named in the problem). */
export function createKmsgSequence(path: string): KmsgSequence {
  let lastSeq: number | undefined;
  let pending = false;
  let overruns = 0;
  let lost = 0;
  let report: Problem | undefined;
  return {
    epipe() {
      if (!pending) overruns++;
      pending = true;
    },
    accept(seq) {
      if (!Number.isSafeInteger(seq)) return true;
      if (lastSeq !== undefined && seq <= lastSeq) return false;
      if (lastSeq === undefined) {
        // kmsg numbers records from 0 at boot and a reader starts at the oldest one held: a
        // first record past 0 means the ring buffer wrapped before llmgw read it (an EPIPE
        // before the first record is the same loss).
        if (seq > 0) {
          if (!pending) overruns++;
          lost += seq;
          report = problem(
            ProblemCodes.kernelLogOverrun,
            "kernel-log",
            `records 0..${seq - 1} were overwritten before llmgw read them; faults in them are unknown (${path}: the kernel's ring buffer wrapped before the watcher started)`,
          );
        }
        pending = false;
      } else if (pending) {
        pending = false;
        const gap = seq - lastSeq - 1;
        lost += gap;
        const range = `${gap} record(s) (seq ${lastSeq + 1}–${seq - 1})`;
        report = problem(
          ProblemCodes.kernelLogOverrun,
          "kernel-log",
          `the kernel's ring buffer overwrote ${range} before ${path} was read; faults among them are unknown (${overruns} overrun(s), ${lost} record(s) lost since the watcher started)`,
        );
      }
      lastSeq = seq;
      return true;
    },
    overruns: () => overruns,
    lostRecords: () => lost,
    problem: () => report,
  };
}

/** The watcher's saved faults (see {@link KernelLogWatcherOptions.stateFile}). */
interface FaultState {
  /** Once, after the first catch-up of a kmsg log: loads the file, restores, saves. */
  restore(): KernelFaultEvent[];
  /** Saves when a record or an eviction may have changed the faults since the last save. */
  saveIfChanged(): void;
  problems(): Problem[];
  writes(): number;
}

/** What a `stateFile` holds (version 1). */
interface SavedFaults {
  version: 1;
  bootId: string;
  faults: GpuFault[];
}

function createFaultState(
  o: ResolvedKernelLogWatcherOptions,
  tracker: KernelFaultTracker,
): FaultState {
  const file = o.stateFile;
  const bootId = o.bootId;
  let started = false;
  let lastWritten: string | undefined;
  let lastMarker: string | undefined;
  let readProblem: Problem | undefined;
  let writeProblem: Problem | undefined;
  let writes = 0;

  const failure = (doing: "read" | "write", detail: string) =>
    problem(
      ProblemCodes.kernelLogStateFailed,
      "kernel-log",
      `cannot ${doing} the saved kernel-log faults ${file} (${detail}): faults that take a GPU out and that the kernel log no longer holds may be missing${doing === "read" ? "; starting afresh" : ""}`,
    );

  const load = (path: string, boot: string): GpuFault[] => {
    let text: string;
    let fd: number | undefined;
    try {
      fd = openSync(path, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
      const st = fstatSync(fd);
      if (!st.isFile()) {
        readProblem = failure("read", "not a regular file");
        return [];
      }
      if (st.size > MAX_STATE_FILE_BYTES) {
        readProblem = failure("read", `${st.size} bytes, more than ${MAX_STATE_FILE_BYTES}`);
        return [];
      }
      text = readFileSync(fd, "utf8");
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code ?? (error as Error).message;
      // No file yet: the first start of this agent, nothing to restore.
      if (code !== "ENOENT") readProblem = failure("read", code);
      return [];
    } finally {
      if (fd !== undefined) {
        try {
          closeSync(fd);
        } catch {
          // nothing to do
        }
      }
    }
    let saved: unknown;
    try {
      saved = JSON.parse(text);
    } catch {
      readProblem = failure("read", "not JSON");
      return [];
    }
    const shape = saved as Partial<SavedFaults> | null;
    if (
      typeof shape !== "object" ||
      shape === null ||
      shape.version !== 1 ||
      !Array.isArray(shape.faults) ||
      shape.faults.length > MAX_SAVED_FAULTS
    ) {
      readProblem = failure("read", `not a version 1 file of at most ${MAX_SAVED_FAULTS} faults`);
      return [];
    }
    // Saved in another boot (or without one): the GPUs were reset by the reboot. Discarded.
    if (shape.bootId !== boot) return [];
    const valid = shape.faults.filter(
      (f: unknown): f is GpuFault =>
        isRestorableFault(f) && (f.bootId === undefined || f.bootId === boot),
    );
    if (valid.length < shape.faults.length) {
      readProblem = failure(
        "read",
        `${shape.faults.length - valid.length} of ${shape.faults.length} saved faults are malformed and were skipped`,
      );
    }
    return valid.filter(isUnhealthyFault);
  };

  const save = (path: string, boot: string) => {
    const all = tracker.faults().filter(isUnhealthyFault);
    const kept = new Set([...all].sort(compareFaultUrgency).slice(0, MAX_SAVED_FAULTS));
    const body: SavedFaults = { version: 1, bootId: boot, faults: all.filter((f) => kept.has(f)) };
    const text = `${JSON.stringify(body)}\n`;
    if (text === lastWritten) return;
    const tmp = `${path}.tmp`;
    let fd: number | undefined;
    try {
      fd = openSync(
        tmp,
        constants.O_WRONLY | constants.O_CREAT | constants.O_TRUNC | constants.O_NOFOLLOW,
        0o600,
      );
      // The mode of open() applies only to a new file (and passes the umask).
      fchmodSync(fd, 0o600);
      const bytes = Buffer.from(text, "utf8");
      for (let at = 0; at < bytes.length; ) at += writeSync(fd, bytes, at, bytes.length - at);
      fsyncSync(fd);
      closeSync(fd);
      fd = undefined;
      renameSync(tmp, path);
      lastWritten = text;
      writes++;
      writeProblem = undefined;
    } catch (error) {
      if (fd !== undefined) {
        try {
          closeSync(fd);
        } catch {
          // nothing to do
        }
      }
      try {
        unlinkSync(tmp);
      } catch {
        // not created
      }
      const code = (error as NodeJS.ErrnoException).code ?? (error as Error).message;
      writeProblem = failure("write", code);
    }
  };

  const marker = () => {
    const t = tracker.stats();
    return `${t.faultRecords}:${t.evicted}:${t.restored}`;
  };

  return {
    restore() {
      if (started || file === undefined || bootId === undefined) return [];
      started = true;
      const events = tracker.restore(load(file, bootId));
      // Always: this also replaces a file from another boot.
      save(file, bootId);
      lastMarker = marker();
      return events;
    },
    saveIfChanged() {
      if (!started || file === undefined || bootId === undefined) return;
      const now = marker();
      // A failed write is retried with the next change, not on every poll.
      if (now === lastMarker) return;
      lastMarker = now;
      save(file, bootId);
    },
    problems: () => [readProblem, writeProblem].filter((p): p is Problem => p !== undefined),
    writes: () => writes,
  };
}

/** What {@link readKernelLogFaults} found. */
export interface KernelLogReport {
  readonly faults: GpuFault[];
  /** As {@link KernelLogWatcher.problems} (unreadable, overrun). */
  readonly problems: Problem[];
  readonly stats: KernelLogWatcherStats;
}

/**
 * Reads a kernel log once to its end and closes it (for `llmgw agent inventory`). Same parsing
 * and problems as {@link watchKernelLog}; a log that cannot be read is a problem, not a throw.
 */
export async function readKernelLogFaults(
  path: string,
  options: Omit<KernelLogWatcherOptions, "path" | "follow" | "onChange"> = {},
): Promise<KernelLogReport> {
  const watcher = watchKernelLog({ ...options, path, follow: false });
  await watcher.caughtUp;
  const report = { faults: watcher.faults(), problems: watcher.problems(), stats: watcher.stats() };
  await watcher.close();
  return report;
}

function isCharacterDevice(path: string): boolean {
  try {
    return statSync(path).isCharacterDevice();
  } catch {
    return false;
  }
}

/** The boot id, or undefined when it cannot be read or does not look like one. */
/**
 * This boot's id (`/proc/sys/kernel/random/boot_id`, lower-case), or undefined where the kernel
 * does not tell. State kept "for this boot" is keyed by it.
 */
export function readBootId(path: string = DEFAULT_BOOT_ID_PATH): string | undefined {
  try {
    const text = readFileSync(path, "utf8").trim();
    return /^[0-9a-fA-F-]{8,64}$/.test(text) ? text.toLowerCase() : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The kernel's boot time from `/proc/stat`'s `btime` (whole seconds since the epoch). Unlike
 * `now − uptime`, it reads the same in every agent run, so a kmsg record's time — and with it a
 * fault's `firstSeen`/`lastSeen`, which an operator's `gpu clear` is compared against — does not
 * move when the agent restarts and reads the buffer again. Undefined where /proc is absent.
 */
export function readBootTimeMs(statPath = "/proc/stat"): number | undefined {
  try {
    const match = /^btime (\d{1,12})$/m.exec(readFileSync(statPath, "utf8").slice(0, 65_536));
    return match ? Number(match[1]) * 1000 : undefined;
  } catch {
    return undefined;
  }
}
