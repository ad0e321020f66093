import {
  closeSync,
  constants,
  fstatSync,
  ftruncateSync,
  lstatSync,
  mkdirSync,
  openSync,
  readSync,
  renameSync,
  writeSync,
} from "node:fs";
import { dirname } from "node:path";
import { StringDecoder } from "node:string_decoder";
import { isSupervisorError, SupervisorError } from "./errors.js";
import { LogTail } from "./log-tail.js";

const CHUNK_BYTES = 64 * 1024;

// O_NOFOLLOW: the agent often runs as root, so a symlink planted where a log file goes would
// make it append to (or truncate, or read into a tail it reports) any file on the host.
// O_NONBLOCK keeps a planted FIFO from hanging the open; it is harmless on regular files.
const APPEND_FLAGS =
  constants.O_WRONLY |
  constants.O_APPEND |
  constants.O_CREAT |
  constants.O_NOFOLLOW |
  constants.O_NONBLOCK;
const READ_FLAGS = constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK;
const REPLACE_FLAGS =
  constants.O_WRONLY |
  constants.O_CREAT |
  constants.O_TRUNC |
  constants.O_NOFOLLOW |
  constants.O_NONBLOCK;

/**
 * Opens a log file without following a symlink and checks it is a plain file with one link
 * (a hard link to another file would be written through just the same). Throws
 * `LLMGW_SUPERVISOR_UNSAFE_LOG_FILE` naming the path and what was found there.
 */
export function openLogFile(path: string, flags: number = APPEND_FLAGS): number {
  let fd: number;
  try {
    fd = openSync(path, flags, 0o600);
  } catch (cause) {
    const code = (cause as NodeJS.ErrnoException).code;
    if (code === "ELOOP" || code === "ENXIO") {
      throw new SupervisorError(
        "LLMGW_SUPERVISOR_UNSAFE_LOG_FILE",
        `refusing log file ${path}: it is a ${code === "ELOOP" ? "symbolic link" : "FIFO or device"}, not a plain file`,
        { cause },
      );
    }
    throw cause;
  }
  const stat = fstatSync(fd);
  if (!stat.isFile() || stat.nlink > 1) {
    closeSync(fd);
    throw new SupervisorError(
      "LLMGW_SUPERVISOR_UNSAFE_LOG_FILE",
      `refusing log file ${path}: ${stat.isFile() ? `it has ${stat.nlink} hard links` : "it is not a plain file"}`,
    );
  }
  return fd;
}

/** Bounds of one replica's log file and its in-memory tail. */
export interface LogFileLimits {
  /** The log file is rotated once it exceeds this size; one `.1` keeps ≤ this many bytes. */
  readonly maxFileBytes: number;
  /** In-memory tail: at most this many lines … */
  readonly tailMaxLines: number;
  /** … and at most this many bytes. */
  readonly tailMaxBytes: number;
}

/**
 * A per-replica log file that the engine writes through an inherited file descriptor
 * (`O_APPEND`, never a pipe to the agent) and that the supervisor reads incrementally.
 *
 * {@link poll} reads the bytes appended since the last poll into a bounded {@link LogTail}
 * and enforces the size cap: when the file is larger than `maxFileBytes` (or larger than half
 * of it and unchanged since the previous poll), its last bytes (≤ `maxFileBytes`) are copied
 * to `<file>.1` and the file is truncated to zero. Because the
 * engine's descriptor has `O_APPEND`, its next write lands at the new end. Bytes written
 * between the read and the truncation are lost (a few at most); a flood larger than the
 * tail between two polls is skipped, not read, so memory and CPU stay flat.
 */
export class CappedLogFile {
  readonly path: string;
  readonly limits: LogFileLimits;
  readonly tail: LogTail;
  #offset: number;
  #lastSize = -1;
  #decoder = new StringDecoder("utf8");

  /**
   * Opens (creating, 0600) `path` for append; existing content is kept. With `prefillTail`
   * (used when adopting) the tail starts with the file's last bytes instead of empty. Throws
   * `LLMGW_SUPERVISOR_UNSAFE_LOG_FILE` when `path` is a symlink, FIFO or hard link.
   */
  constructor(path: string, limits: LogFileLimits, options: { prefillTail?: boolean } = {}) {
    this.path = path;
    this.limits = limits;
    this.tail = new LogTail(limits.tailMaxLines, limits.tailMaxBytes);
    mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
    const fd = openLogFile(path);
    try {
      const size = fstatSync(fd).size;
      this.#offset = options.prefillTail === true ? Math.max(0, size - limits.tailMaxBytes) : size;
    } finally {
      closeSync(fd);
    }
  }

  /** Opens an `O_APPEND` descriptor to hand to a child as stdout/stderr; the caller closes it. */
  openForChild(): number {
    try {
      return openLogFile(this.path);
    } catch (cause) {
      if (isSupervisorError(cause)) throw cause;
      throw new SupervisorError(
        "LLMGW_SUPERVISOR_SPAWN_FAILED",
        `cannot open log file ${this.path}`,
        { cause },
      );
    }
  }

  /** Writes a supervisor note into the log (e.g. "exited with code 1"). */
  note(line: string): void {
    let fd: number;
    try {
      fd = openLogFile(this.path);
    } catch {
      return; // a note is best effort; launch reports an unsafe file
    }
    try {
      writeSync(fd, `[llmgw-supervisor] ${line}\n`);
    } finally {
      closeSync(fd);
    }
    this.poll();
  }

  /** Reads newly appended bytes into the tail and rotates when over the cap. Never throws. */
  poll(): void {
    let size: number;
    try {
      size = lstatSync(this.path).size;
    } catch {
      return;
    }
    if (size < this.#offset) {
      // Truncated by someone else: start over from the beginning.
      this.#offset = 0;
      this.#decoder = new StringDecoder("utf8");
    }
    if (size > this.#offset) this.#readRange(size);
    // Truncating under an active writer can drop the bytes of that instant, so rotate early
    // (past half the cap) only while the writer is idle, and by force only past the cap.
    const idle = size === this.#lastSize;
    this.#lastSize = size;
    if (size > this.limits.maxFileBytes || (idle && size > this.limits.maxFileBytes / 2)) {
      this.#rotate();
      this.#lastSize = -1;
    }
  }

  #readRange(size: number): void {
    let fd: number;
    try {
      fd = openLogFile(this.path, READ_FLAGS);
    } catch {
      return;
    }
    try {
      let position = this.#offset;
      const window = this.limits.tailMaxBytes * 2 + CHUNK_BYTES;
      if (size - position > window) {
        position = size - window;
        this.#decoder = new StringDecoder("utf8");
        this.tail.push("\n");
      }
      const buffer = Buffer.allocUnsafe(CHUNK_BYTES);
      while (position < size) {
        const n = readSync(fd, buffer, 0, Math.min(CHUNK_BYTES, size - position), position);
        if (n <= 0) break;
        this.tail.push(this.#decoder.write(buffer.subarray(0, n)));
        position += n;
      }
      this.#offset = position;
    } finally {
      closeSync(fd);
    }
  }

  #rotate(): void {
    const rotated = `${this.path}.1`;
    const tmp = `${rotated}.tmp`;
    const slack = Math.min(CHUNK_BYTES, Math.floor(this.limits.maxFileBytes / 4));
    try {
      let size = lstatSync(this.path).size;
      if (size > this.#offset) this.#readRange(size);
      const dst = openLogFile(tmp, REPLACE_FLAGS);
      try {
        let room = slack;
        copyRange(this.path, dst, Math.max(0, size - (this.limits.maxFileBytes - slack)), size);
        // The engine keeps appending while we copy. Catch up with small deltas until the size
        // holds still, then truncate at once: only bytes written between that last stat and
        // the truncate (microseconds) can be lost; a writer that never pauses loses a little.
        for (let attempt = 0; attempt < 50; attempt++) {
          const now = lstatSync(this.path).size;
          if (now === size) break;
          this.#readRange(now);
          const take = Math.min(room, now - size);
          if (take > 0) copyRange(this.path, dst, now - take, now);
          room -= take;
          size = now;
        }
        const fd = openLogFile(this.path);
        try {
          ftruncateSync(fd, 0);
        } finally {
          closeSync(fd);
        }
      } finally {
        closeSync(dst);
      }
      renameSync(tmp, rotated);
      // The rest of a half-read line, if any, was cut by the truncate: end it here.
      this.tail.endPartialLine();
      this.#offset = 0;
      this.#decoder = new StringDecoder("utf8");
    } catch {
      // Rotation is best effort; the next poll retries.
    }
  }
}

function copyRange(path: string, dst: number, from: number, to: number): void {
  const src = openLogFile(path, READ_FLAGS);
  try {
    const buffer = Buffer.allocUnsafe(CHUNK_BYTES);
    let position = from;
    while (position < to) {
      const n = readSync(src, buffer, 0, Math.min(CHUNK_BYTES, to - position), position);
      if (n <= 0) break;
      writeSync(dst, buffer, 0, n);
      position += n;
    }
  } finally {
    closeSync(src);
  }
}
