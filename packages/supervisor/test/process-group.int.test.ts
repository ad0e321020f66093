import { readFileSync, statSync } from "node:fs";
import {
  createSupervisor,
  isSupervisorError,
  listGroupMembers,
  pidFilePath,
} from "@llmgw/supervisor";
import { afterEach, describe, expect, it } from "vitest";
import {
  engineSpec,
  grandchildren,
  isAlive,
  listeningSockets,
  portOpen,
  tempDir,
  waitFor,
} from "./helpers.js";

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const cleanup of cleanups.splice(0)) cleanup();
});

function setup() {
  const { dir, cleanup } = tempDir("llmgw-sup-");
  const supervisor = createSupervisor({
    stateDir: `${dir}/state`,
    logPollIntervalMs: 50,
    stopPollIntervalMs: 20,
  });
  const pgids: number[] = [];
  cleanups.push(() => {
    for (const pgid of pgids) {
      try {
        process.kill(-pgid, "SIGKILL");
      } catch {}
    }
    cleanup();
  });
  return { dir, supervisor, pgids };
}

describe("process groups", () => {
  it("stop leaves no process of the group alive, grandchildren and their ports included", async () => {
    const { dir, supervisor, pgids } = setup();
    const handle = await supervisor.launch("gc", engineSpec(dir, "gc", ["--grandchildren", "3"]));
    pgids.push(handle.pgid);
    expect(handle.pgid).toBe(handle.pid);
    const kids = await waitFor("3 grandchildren", () => {
      const found = grandchildren(handle.tail());
      return found.length === 3 ? found : undefined;
    });
    for (const kid of kids) expect(await portOpen(kid.port)).toBe(true);
    const sockets = kids.flatMap((kid) => listeningSockets(kid.port));
    for (const kid of kids) expect(listeningSockets(kid.port)).not.toEqual([]);
    expect(listGroupMembers(handle.pgid).sort()).toEqual(
      [handle.pid, ...kids.map((k) => k.pid)].sort(),
    );

    const report = await handle.stop();

    expect(report).toMatchObject({ code: 0, signal: null, timedOut: false, forced: false });
    expect(listGroupMembers(handle.pgid)).toEqual([]);
    for (const kid of kids) expect(isAlive(kid.pid)).toBe(false);
    // The sockets they listened on close, though not always by the time each pid reads as a
    // zombie: seen once in CI, one grandchild's socket still listening just after stop. The
    // likely cause: a thread-group leader reads as a zombie while its other threads (a Node
    // process has several), which share its files, are still exiting. Their port numbers may
    // be another test's by now (CI runs tests side by side): another socket on them is no leak.
    await waitFor(
      "the grandchildren's listening sockets to close",
      () =>
        kids.every((kid) => listeningSockets(kid.port).every((s) => !sockets.includes(s))) ||
        undefined,
      5_000,
    );
    expect(() => statSync(pidFilePath(`${dir}/state`, "gc"))).toThrow();
    expect(handle.tail()).toContain("engine got SIGTERM");
  });

  it("a leader that ignores SIGTERM is killed after the grace", async () => {
    const { dir, supervisor, pgids } = setup();
    const handle = await supervisor.launch(
      "stubborn",
      engineSpec(dir, "stubborn", ["--ignore-term"], { stopGraceMs: 300 }),
    );
    pgids.push(handle.pgid);
    await waitFor("engine up", () => handle.tail().some((l) => l.startsWith("engine ")));

    const report = await handle.stop();

    expect(report).toMatchObject({ code: null, signal: "SIGKILL", timedOut: true, forced: true });
    expect(report.durationMs).toBeGreaterThanOrEqual(300);
    expect(isAlive(handle.pid)).toBe(false);
    expect(handle.tail()).toContain("engine ignoring SIGTERM");
  });

  it("grandchildren that ignore SIGTERM are killed after the grace even when the leader obeys", async () => {
    const { dir, supervisor, pgids } = setup();
    const spec = engineSpec(
      dir,
      "gcstub",
      ["--grandchildren", "2", "--grandchildren-ignore-term"],
      { stopGraceMs: 300 },
    );
    const handle = await supervisor.launch("gcstub", spec);
    pgids.push(handle.pgid);
    const kids = await waitFor("2 grandchildren", () => {
      const found = grandchildren(handle.tail());
      return found.length === 2 ? found : undefined;
    });

    const report = await handle.stop();

    expect(report).toMatchObject({ code: 0, timedOut: true, forced: true });
    expect(listGroupMembers(handle.pgid)).toEqual([]);
    for (const kid of kids) expect(isAlive(kid.pid)).toBe(false);
  });

  it("writes an owner-only pid file describing the process", async () => {
    const { dir, supervisor, pgids } = setup();
    const handle = await supervisor.launch("pf", engineSpec(dir, "pf", []));
    pgids.push(handle.pgid);
    const path = pidFilePath(`${dir}/state`, "pf");
    expect(statSync(path).mode & 0o777).toBe(0o600);
    expect(statSync(`${dir}/state`).mode & 0o777).toBe(0o700);
    const record = JSON.parse(readFileSync(path, "utf8"));
    expect(record).toMatchObject({
      version: 1,
      replicaId: "pf",
      pid: handle.pid,
      pgid: handle.pid,
      specHash: handle.specHash,
    });
    await handle.stop();
  });

  it("reports a missing executable as LLMGW_SUPERVISOR_SPAWN_FAILED", async () => {
    const { dir, supervisor } = setup();
    const error = await supervisor
      .launch("nope", { argv: ["/nonexistent/engine"], env: {}, logFile: `${dir}/nope.log` })
      .catch((e: unknown) => e);
    expect(isSupervisorError(error)).toBe(true);
    expect((error as { code: string }).code).toBe("LLMGW_SUPERVISOR_SPAWN_FAILED");
    expect((error as Error).message).toBe(
      "cannot spawn /nonexistent/engine for replica nope: spawn /nonexistent/engine ENOENT",
    );
  });

  it("refuses a second launch of a live replica", async () => {
    const { dir, supervisor, pgids } = setup();
    const handle = await supervisor.launch("dup", engineSpec(dir, "dup", []));
    pgids.push(handle.pgid);
    await expect(supervisor.launch("dup", engineSpec(dir, "dup", []))).rejects.toThrow(
      "replica dup already has a live process in this supervisor",
    );
    await handle.stop();
  });
});
