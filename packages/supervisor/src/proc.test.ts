import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import {
  listGroupMembers,
  parseProcStat,
  readCmdlineFingerprint,
  readGroupMembers,
  readProcStat,
} from "./proc.js";

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

describe("readGroupMembers", () => {
  // A /proc tree in a temp dir: group 100's leader exited (a zombie with no other thread),
  // worker 101 runs, 102's main thread exited while thread 103 still holds its files, 104 is
  // stuck in an uninterruptible call, 105 is a zombie with no task dir left (reaped meanwhile),
  // and 200 belongs to another group.
  const root = mkdtempSync(join(tmpdir(), "llmgw-proc-"));
  afterAll(() => rmSync(root, { recursive: true, force: true }));
  const processes: { pid: number; state: string; pgrp: number; threads: number[] }[] = [
    { pid: 100, state: "Z", pgrp: 100, threads: [100] },
    { pid: 101, state: "S", pgrp: 100, threads: [101, 110] },
    { pid: 102, state: "Z", pgrp: 100, threads: [102, 103] },
    { pid: 104, state: "D", pgrp: 100, threads: [104] },
    { pid: 105, state: "Z", pgrp: 100, threads: [] },
    { pid: 200, state: "S", pgrp: 200, threads: [200] },
  ];
  for (const p of processes) {
    mkdirSync(join(root, String(p.pid)));
    writeFileSync(join(root, String(p.pid), "stat"), stat(p.pid, "engine", p.state, 1, p.pgrp));
    for (const tid of p.threads)
      mkdirSync(join(root, String(p.pid), "task", String(tid)), { recursive: true });
  }

  it("lists what runs or still exits, not zombies that are their last thread", () => {
    expect(readGroupMembers(100, root)).toEqual([
      { pid: 101, state: "S", startTime: "123456" },
      { pid: 102, state: "Z", startTime: "123456" },
      { pid: 104, state: "D", startTime: "123456" },
    ]);
    expect(listGroupMembers(100, root)).toEqual([101, 102, 104]);
  });

  it.each([
    { name: "another group", pgid: 200, pids: [200] },
    { name: "a group with no process", pgid: 300, pids: [] },
  ])("$name", ({ pgid, pids }) => {
    expect(listGroupMembers(pgid, root)).toEqual(pids);
  });

  it("finds nothing under a procfs root that does not exist", () => {
    expect(readGroupMembers(100, join(root, "missing"))).toEqual([]);
  });
});
