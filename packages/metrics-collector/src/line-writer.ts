import { isAscii } from "node:buffer";

/**
 * A growable, reusable UTF-8 byte buffer for one family's sample lines. Writing 76k sample
 * lines into off-heap bytes instead of keeping them as strings until the end of a scrape
 * matters: those strings would all survive V8's young generation and get copied (and, on a
 * loaded machine, wait on GC helper threads), which cost more than rendering (bench/metrics).
 */
export class LineWriter {
  #buf: Buffer;
  #length = 0;

  constructor(capacityBytes = 64 * 1024) {
    this.#buf = Buffer.allocUnsafe(capacityBytes);
  }

  /** Empties the writer, keeping its memory for the next scrape. */
  reset(): void {
    this.#length = 0;
  }

  /** Appends `s` as UTF-8. */
  write(s: string): void {
    // UTF-8 takes at most 3 bytes per UTF-16 code unit.
    const worst = s.length * 3;
    if (this.#length + worst > this.#buf.length) {
      const bigger = Buffer.allocUnsafe(Math.max(this.#buf.length * 2, this.#length + worst));
      this.#buf.copy(bigger, 0, 0, this.#length);
      this.#buf = bigger;
    }
    this.#length += this.#buf.write(s, this.#length, "utf8");
  }

  /** Bytes written since the last reset. */
  get length(): number {
    return this.#length;
  }

  /** What was written, as bytes (a view of the writer's memory, valid until the next write). */
  bytes(): Buffer {
    return this.#buf.subarray(0, this.#length);
  }

  /** What was written, as a string (latin1 decoding when all ASCII: same text, cheaper). */
  text(): string {
    const bytes = this.#buf.subarray(0, this.#length);
    return bytes.toString(isAscii(bytes) ? "latin1" : "utf8");
  }
}
