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
  /** Memory a lent block came back in, kept for the next {@link lend}. */
  #spare: Buffer | undefined;

  constructor(capacityBytes = 64 * 1024) {
    this.#buf = Buffer.allocUnsafe(capacityBytes);
  }

  /** Empties the writer, keeping its memory for the next scrape. */
  reset(): void {
    this.#length = 0;
  }

  /**
   * Hands over what was written, without copying it, for a response to send; the writer goes
   * on empty, in the memory a previous lend gave back (or new memory). Pass the result to
   * {@link giveBack} once the bytes are sent (a socket may still read them until then). A
   * block never given back is only garbage. Copying a fleet's 6.7 MB into one fresh buffer
   * instead cost ~40 ms a scrape on these VMs (page faults on new memory, bench/control-plane).
   */
  lend(): LentBlock {
    const memory = this.#buf;
    const block = { bytes: memory.subarray(0, this.#length), memory };
    this.#buf = this.#spare ?? Buffer.allocUnsafe(memory.length);
    this.#spare = undefined;
    this.#length = 0;
    return block;
  }

  /** Takes back a block of {@link lend}: its memory is the next lend's. */
  giveBack(block: LentBlock): void {
    if (block.memory === this.#buf) return;
    if (this.#spare === undefined || this.#spare.length < block.memory.length)
      this.#spare = block.memory;
  }

  /** Appends `s` as UTF-8. */
  write(s: string): void {
    // UTF-8 takes at most 3 bytes per UTF-16 code unit.
    this.#reserve(s.length * 3);
    this.#length += this.#buf.write(s, this.#length, "utf8");
  }

  /** Appends `bytes` as they are (lines this writer or another rendered earlier). */
  writeBytes(bytes: Uint8Array): void {
    this.#reserve(bytes.length);
    this.#buf.set(bytes, this.#length);
    this.#length += bytes.length;
  }

  /**
   * Appends `prefix`, then `value` (ASCII only: a formatted number), then a newline, with no
   * string built or encoded: the path of 40k reading lines a scrape.
   */
  writeLine(prefix: Uint8Array, value: string): void {
    this.#reserve(prefix.length + value.length + 1);
    const buf = this.#buf;
    let at = this.#length;
    buf.set(prefix, at);
    at += prefix.length;
    for (let i = 0; i < value.length; i++) buf[at++] = value.charCodeAt(i);
    buf[at++] = 0x0a;
    this.#length = at;
  }

  /** A copy of what was written from byte `start` on (it outlives the next reset). */
  copyFrom(start: number): Buffer {
    return Buffer.from(this.#buf.subarray(start, this.#length));
  }

  #reserve(bytes: number): void {
    if (this.#length + bytes <= this.#buf.length) return;
    const bigger = Buffer.allocUnsafe(Math.max(this.#buf.length * 2, this.#length + bytes));
    this.#buf.copy(bigger, 0, 0, this.#length);
    this.#buf = bigger;
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

/** What {@link LineWriter.lend} hands over: `bytes` are a view of `memory`. */
export interface LentBlock {
  readonly bytes: Buffer;
  readonly memory: Buffer;
}
