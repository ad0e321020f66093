import { type ChildProcess, spawn } from "node:child_process";
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import fc from "fast-check";
import { afterEach, describe, expect, it } from "vitest";
import { engineProcessOf, isManagedProcess, parseProcStat } from "./engine-pids.js";

const children: ChildProcess[] = [];
const dirs: string[] = [];
afterEach(() => {
  for (const child of children.splice(0)) {
    // Each child leads its own group (detached), like a supervised engine: end the group.
    if (child.pid !== undefined && child.exitCode === null) {
      try {
        process.kill(-child.pid, "SIGKILL");
      } catch {}
    }
  }
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

/** Starts `sh -c script` as its own process group and session leader (as the supervisor does). */
function startGroup(script: string, file = "/bin/sh"): ChildProcess {
  const child = spawn(file, file === "/bin/sh" ? ["-c", script] : [], {
    detached: true,
    stdio: "ignore",
  });
  children.push(child);
  return child;
}

/** The pids of `pid`'s children, from the kernel's own list. */
function childrenOf(pid: number): number[] {
  try {
    return readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8")
      .trim()
      .split(/\s+/)
      .filter(Boolean)
      .map(Number);
  } catch {
    return [];
  }
}

describe("parseProcStat", () => {
  it("reads this process's own /proc/self/stat", () => {
    const stat = parseProcStat(readFileSync("/proc/self/stat", "utf8"));
    expect(stat).toEqual({
      pid: process.pid,
      ppid: process.ppid,
      pgrp: expect.any(Number),
      session: expect.any(Number),
    });
  });

  it("reads past a command name with spaces and parentheses (a real script named so)", async () => {
    const dir = mkdtempSync(path.join(tmpdir(), "llmgw-stat-"));
    dirs.push(dir);
    const script = path.join(dir, "x) (y 1 2");
    writeFileSync(script, "#!/bin/sh\nsleep 30\n");
    chmodSync(script, 0o755);
    const child = startGroup("", script);
    const pid = child.pid as number;
    await expect
      .poll(() => readFileSync(`/proc/${pid}/stat`, "utf8"), { timeout: 5_000 })
      .toContain("(x) (y 1 2)");
    expect(parseProcStat(readFileSync(`/proc/${pid}/stat`, "utf8"))).toEqual({
      pid,
      ppid: process.pid,
      pgrp: pid,
      session: pid,
    });
  });

  it.each(["", "12", "12 (sh", "x (sh) S 1 2 3", "12 (sh) S", "12 (sh) S 1 2"])(
    "%j is not a stat line",
    (text) => {
      expect(parseProcStat(text)).toBeUndefined();
    },
  );

  it("never throws on arbitrary text", () => {
    fc.assert(
      fc.property(fc.string({ maxLength: 5_000 }), (text) => {
        parseProcStat(text);
      }),
    );
  });
});

describe("isManagedProcess on real processes", () => {
  it("an engine, its worker in its group, and a worker in a session of its own are managed; others are not", async () => {
    // An engine with a worker in its group and a grandchild that started its own session.
    const engine = startGroup("sleep 30 & setsid sh -c 'sleep 30' & wait");
    const enginePid = engine.pid as number;
    await expect.poll(() => childrenOf(enginePid).length, { timeout: 5_000 }).toBe(2);
    const sessionOf = (pid: number) =>
      parseProcStat(readFileSync(`/proc/${pid}/stat`, "utf8"))?.session;
    // One child in the engine's session, one (after setsid) in a session of its own.
    await expect
      .poll(() => childrenOf(enginePid).map((pid) => sessionOf(pid) === enginePid), {
        timeout: 5_000,
      })
      .toEqual(expect.arrayContaining([true, false]));
    const [worker, setsidWorker] = childrenOf(enginePid).sort(
      (a, b) => Number(sessionOf(a) !== enginePid) - Number(sessionOf(b) !== enginePid),
    ) as [number, number];
    const managed = new Set([enginePid]);
    expect(await isManagedProcess(enginePid, managed)).toBe(true);
    expect(await isManagedProcess(worker, managed)).toBe(true);
    expect(await isManagedProcess(setsidWorker, managed)).toBe(true);

    // Not ours: the test runner, another process group, a pid that does not exist.
    const other = startGroup("sleep 30");
    expect(await isManagedProcess(process.pid, managed)).toBe(false);
    expect(await isManagedProcess(other.pid as number, managed)).toBe(false);
    expect(await isManagedProcess(4_194_304 + 1, managed)).toBe(false);
    // Whose, when it matters: a live stranger is foreign, a pid past the kernel's maximum is gone.
    expect(await engineProcessOf(worker, managed)).toBe("managed");
    expect(await engineProcessOf(process.pid, managed)).toBe("foreign");
    expect(await engineProcessOf(other.pid as number, managed)).toBe("foreign");
    expect(await engineProcessOf(4_194_304 + 1, managed)).toBe("gone");
  });

  it("an exited engine's pid is not managed once the agent no longer lists it", async () => {
    const engine = startGroup("exit 0");
    const pid = engine.pid as number;
    await new Promise((resolve) => engine.once("exit", resolve));
    expect(await isManagedProcess(pid, new Set())).toBe(false);
  });

  it("an unreadable /proc is not managed, never a throw", async () => {
    expect(await isManagedProcess(12345, new Set([1]), { procRoot: "/nonexistent" })).toBe(false);
    expect(await engineProcessOf(12345, new Set([1]), { procRoot: "/nonexistent" })).toBe("gone");
  });
});
