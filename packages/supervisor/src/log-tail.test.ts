import { describe, expect, it } from "vitest";
import { LogTail } from "./log-tail.js";

describe("LogTail", () => {
  it.each([
    {
      name: "keeps complete lines",
      maxLines: 10,
      maxBytes: 100,
      input: ["a\nb\n"],
      lines: ["a", "b"],
    },
    {
      name: "joins chunks split mid-line",
      maxLines: 10,
      maxBytes: 100,
      input: ["he", "llo\nwor", "ld\n"],
      lines: ["hello", "world"],
    },
    {
      name: "shows a pending partial line",
      maxLines: 10,
      maxBytes: 100,
      input: ["a\nb"],
      lines: ["a", "b"],
    },
    {
      name: "drops oldest beyond maxLines",
      maxLines: 2,
      maxBytes: 100,
      input: ["1\n2\n3\n4\n"],
      lines: ["3", "4"],
    },
    {
      name: "drops oldest beyond maxBytes",
      maxLines: 100,
      maxBytes: 6,
      input: ["aaa\nbbb\nccc\n"],
      lines: ["bbb", "ccc"],
    },
    {
      name: "keeps the end of an over-long line",
      maxLines: 10,
      maxBytes: 4,
      input: ["abcdefgh\n"],
      lines: ["efgh"],
    },
    {
      name: "strips CR of CRLF",
      maxLines: 10,
      maxBytes: 100,
      input: ["a\r\nb\r\n"],
      lines: ["a", "b"],
    },
  ])("$name", ({ maxLines, maxBytes, input, lines }) => {
    const tail = new LogTail(maxLines, maxBytes);
    for (const chunk of input) tail.push(chunk);
    expect(tail.lines()).toEqual(lines);
  });

  it("stays bounded under a long stream", () => {
    const tail = new LogTail(50, 1000);
    for (let i = 0; i < 100_000; i++) tail.push(`line ${i}\n`);
    expect(tail.lines()).toHaveLength(50);
    expect(tail.lines().at(-1)).toBe("line 99999");
    expect(Buffer.byteLength(tail.text())).toBeLessThanOrEqual(1000 + 50);
  });

  it("rejects non-positive bounds", () => {
    expect(() => new LogTail(0, 10)).toThrow(
      "log tail bounds must be positive integers, got maxLines=0 maxBytes=10",
    );
  });
});
