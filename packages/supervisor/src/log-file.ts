import {
  closeSync,
  fstatSync,
  mkdirSync,
  openSync,
  readSync,
  renameSync,
  statSync,
  truncateSync,
  writeSync,
} from "node:fs";
import { dirname } from "node:path";
import { StringDecoder } from "node:string_decoder";
import { SupervisorError } from "./errors.js";
import { LogTail } from "./log-tail.js";

const CHUNK_BYTES = 64 * 1024;

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
   * Opens (creating) `path` for append; existing content is kept. With `prefillTail` (used
   * when adopting) the tail starts with the file's last bytes instead of empty.
   */
  constructor(path: string, limits: LogFileLimits, options: { prefillTail?: boolean } = {}) {
    this.path = path;
    this.limits = limits;
    this.tail = new LogTail(limits.tailMaxLines, limits.tailMaxBytes);
    mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
    const fd = openSync(path, "a", 0o600);
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
      return openSync(this.path, "a", 0o600);
    } catch (cause) {
      throw new SupervisorError(
        "LLMGW_SUPERVISOR_SPAWN_FAILED",
        `cannot open log file ${this.path}`,
        { cause },
      );
    }
  }

  /** Writes a supervisor note into the log (e.g. "exited with code 1"). */
  note(line: string): void {
    const fd = openSync(this.path, "a", 0o600);
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
      size = statSync(this.path).size;
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
      fd = openSync(this.path, "r");
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
      let size = statSync(this.path).size;
      if (size > this.#offset) this.#readRange(size);
      const dst = openSync(tmp, "w", 0o600);
      try {
        let room = slack;
        copyRange(this.path, dst, Math.max(0, size - (this.limits.maxFileBytes - slack)), size);
        // The engine keeps appending while we copy. Catch up with small deltas until the size
        // holds still, then truncate at once: only bytes written between that last stat and
        // the truncate (microseconds) can be lost; a writer that never pauses loses a little.
        for (let attempt = 0; attempt < 50; attempt++) {
          const now = statSync(this.path).size;
          if (now === size) break;
          this.#readRange(now);
          const take = Math.min(room, now - size);
          if (take > 0) copyRange(this.path, dst, now - take, now);
          room -= take;
          size = now;
        }
        truncateSync(this.path, 0);
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
  const src = openSync(path, "r");
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
