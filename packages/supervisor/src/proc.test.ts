import { describe, expect, it } from "vitest";
import { listGroupMembers, parseProcStat, readCmdlineFingerprint, readProcStat } from "./proc.js";

// Field 22 (starttime) is the 20th field after "pid (comm)".
function stat(
  pid: number,
  comm: string,
  state = "S",
  ppid = 1,
  pgrp = pid,
  start = "123456",
): string {
  const after = [
    state,
    ppid,
    pgrp,
    pgrp,
    0,
    -1,
    4194560,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    0,
    20,
    0,
    1,
    0,
    start,
    1000,
    10,
  ];
  return `${pid} (${comm}) ${after.join(" ")}\n`;
}

describe("parseProcStat", () => {
  it.each([
    { name: "plain comm", text: stat(42, "node"), comm: "node" },
    { name: "comm with spaces", text: stat(42, "my engine"), comm: "my engine" },
    { name: "comm with parens", text: stat(42, "a) b (c"), comm: "a) b (c" },
    { name: "comm ending in ') 1 2'", text: stat(42, "x) 1 2"), comm: "x) 1 2" },
  ])("$name", ({ text, comm }) => {
    expect(parseProcStat(text)).toEqual({
      pid: 42,
      comm,
      state: "S",
      ppid: 1,
      pgrp: 42,
      startTime: "123456",
    });
  });

  it.each([
    ["", "empty"],
    ["42 node S 1 42", "no parens"],
    ["42 (node) S 1 42 42", "truncated"],
    ["x (node) S 1 42 42 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 77 1 1", "bad pid"],
  ])("returns undefined for %j (%s)", (text) => {
    expect(parseProcStat(text)).toBeUndefined();
  });

  it("reads this process from /proc", () => {
    const self = readProcStat(process.pid);
    expect(self?.pid).toBe(process.pid);
    expect(self?.startTime).toMatch(/^\d+$/);
    expect(readCmdlineFingerprint(process.pid)).toMatch(/^[0-9a-f]{64}$/);
    expect(listGroupMembers(self!.pgrp)).toContain(process.pid);
  });

  it("returns undefined for a pid that does not exist", () => {
    expect(readProcStat(2 ** 30)).toBeUndefined();
    expect(readCmdlineFingerprint(2 ** 30)).toBeUndefined();
  });
});
