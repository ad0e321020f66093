import { SupervisorError } from "./errors.js";

/**
 * Bounded in-memory tail of a byte stream, split into lines. Keeps at most `maxLines` lines
 * and `maxBytes` bytes (UTF-8, newline excluded); an over-long line keeps its last bytes.
 * Memory stays bounded whatever is pushed.
 */
export class LogTail {
  readonly maxLines: number;
  readonly maxBytes: number;
  #lines: string[] = [];
  #bytes = 0;
  #partial = "";

  constructor(maxLines: number, maxBytes: number) {
    if (
      !(Number.isInteger(maxLines) && maxLines > 0 && Number.isInteger(maxBytes) && maxBytes > 0)
    ) {
      throw new SupervisorError(
        "LLMGW_SUPERVISOR_INVALID_OPTIONS",
        `log tail bounds must be positive integers, got maxLines=${maxLines} maxBytes=${maxBytes}`,
      );
    }
    this.maxLines = maxLines;
    this.maxBytes = maxBytes;
  }

  /** Appends decoded text; complete lines enter the tail, a trailing partial line waits. */
  push(text: string): void {
    const parts = (this.#partial + text).split("\n");
    this.#partial = clipBytes(parts.pop() ?? "", this.maxBytes);
    for (const line of parts) this.#add(line.endsWith("\r") ? line.slice(0, -1) : line);
  }

  /** Turns a pending partial line into a complete one (its continuation is known lost). */
  endPartialLine(): void {
    if (this.#partial !== "") this.push("\n");
  }

  /** The retained lines, oldest first, including a pending partial line. */
  lines(): string[] {
    return this.#partial === "" ? [...this.#lines] : [...this.#lines, this.#partial];
  }

  /** The retained lines joined with newlines. */
  text(): string {
    return this.lines().join("\n");
  }

  #add(rawLine: string): void {
    const line = clipBytes(rawLine, this.maxBytes);
    this.#lines.push(line);
    this.#bytes += Buffer.byteLength(line);
    while (this.#lines.length > this.maxLines || this.#bytes > this.maxBytes) {
      const dropped = this.#lines.shift()!;
      this.#bytes -= Buffer.byteLength(dropped);
    }
  }
}

function clipBytes(line: string, maxBytes: number): string {
  if (line.length <= maxBytes / 4) return line;
  const buf = Buffer.from(line);
  if (buf.length <= maxBytes) return line;
  // Keep the end of the line: errors are usually at the end.
  return buf.subarray(buf.length - maxBytes).toString("utf8");
}
