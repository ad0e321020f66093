import { spawnSync } from "node:child_process";
import { mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import {
  createSupervisor,
  isSupervisorError,
  listGroupMembers,
  type ProcessSpec,
  pidFilePath,
  readProcStat,
  type SupervisorOptions,
} from "@llmgw/supervisor";
import { afterEach, describe, expect, it } from "vitest";
import {
  bindPort,
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

// The fixture's thread-listener.py grandchildren need python3 (with ctypes) and the exit(2)
// syscall number of this architecture, which it knows for x86_64 and aarch64 only.
const hasPython3 =
  ["x64", "arm64"].includes(process.arch) &&
  spawnSync("python3", ["-c", "import ctypes"]).status === 0;

function setup(options: Partial<SupervisorOptions> = {}) {
  const { dir, cleanup } = tempDir("llmgw-sup-");
  const supervisor = createSupervisor({
    stateDir: `${dir}/state`,
    logPollIntervalMs: 50,
    stopPollIntervalMs: 20,
    ...options,
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
  /** Launches the fixture engine with `count` grandchildren; resolves once each holds a port. */
  const launchWithGrandchildren = async (
    name: string,
    count: number,
    flags: string[] = [],
    extra: Partial<ProcessSpec> = {},
  ) => {
    const args = ["--grandchildren", String(count), ...flags];
    const handle = await supervisor.launch(name, engineSpec(dir, name, args, extra));
    pgids.push(handle.pgid);
    const kids = await waitFor(`${count} grandchildren`, () => {
      const found = grandchildren(handle.tail());
      return found.length === count ? found : undefined;
    });
    return { handle, kids };
  };
  return { dir, supervisor, pgids, launchWithGrandchildren };
}

/**
 * Launches the fixture engine with `flags` under a fake /proc (`procRoot`) that shows, in its
 * group, a worker stuck in an uninterruptible call (state D, which cannot be made on purpose)
 * since tick 77; the engine itself is real. SIGKILL is waited for 300 ms.
 */
async function launchWithStuckWorker(name: string, flags: string[]) {
  const fake = tempDir("llmgw-proc-");
  cleanups.push(fake.cleanup);
  const { dir, supervisor, pgids } = setup({ procRoot: fake.dir, killWaitMs: 300 });
  const handle = await supervisor.launch(name, engineSpec(dir, name, flags));
  pgids.push(handle.pgid);
  await waitFor("engine up", () => handle.tail().some((l) => l.startsWith("engine ")));
  showProcess(fake.dir, { pid: STUCK_PID, state: "D", pgid: handle.pgid, start: 77 });
  return { proc: fake.dir, handle };
}

/**
 * Waits until the engine's group-squatter.py left its group (`--group-squatter`); resolves to
 * its pid, killed after the test.
 */
async function awaitSquatter(handle: { tail(): string[] }): Promise<number> {
  const squatter = await waitFor("the squatter", () => {
    const line = handle.tail().find((l) => l.startsWith("squatter "));
    return line === undefined ? undefined : Number(line.split(" ")[1]);
  });
  cleanups.push(() => {
    try {
      process.kill(squatter, "SIGKILL");
    } catch {}
  });
  return squatter;
}

/** A pid above any real one (pid_max is at most 2^22). */
const STUCK_PID = 4194305;

/** Shows one single-threaded process in the fake /proc at `root`. */
function showProcess(
  root: string,
  p: { pid: number; state: string; pgid: number; start: number },
): void {
  mkdirSync(`${root}/${p.pid}/task/${p.pid}`, { recursive: true });
  writeFileSync(
    `${root}/${p.pid}/stat`,
    `${p.pid} (engine worker) ${p.state} 1 ${p.pgid} ${p.pgid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 ${p.start} 0 0\n`,
  );
}

describe("process groups", () => {
  it("stop leaves no process of the group alive, grandchildren and their ports included", async () => {
    const { dir, launchWithGrandchildren } = setup();
    const { handle, kids } = await launchWithGrandchildren("gc", 3);
    expect(handle.pgid).toBe(handle.pid);
    for (const kid of kids) expect(await portOpen(kid.port)).toBe(true);
    const sockets = kids.flatMap((kid) => listeningSockets(kid.port));
    for (const kid of kids) expect(listeningSockets(kid.port)).not.toEqual([]);
    expect(listGroupMembers(handle.pgid).sort()).toEqual(
      [handle.pid, ...kids.map((k) => k.pid)].sort(),
    );

    const report = await handle.stop();

    // Read at once: stop waits until no process of the group holds a file. Their port numbers
    // may be another test's by now (CI runs tests side by side): another socket is no leak.
    const stillListening = kids.flatMap((kid) => listeningSockets(kid.port));
    expect(stillListening.filter((socket) => sockets.includes(socket))).toEqual([]);
    expect(report).toMatchObject({ code: 0, signal: null, timedOut: false, forced: false });
    expect(listGroupMembers(handle.pgid)).toEqual([]);
    for (const kid of kids) expect(isAlive(kid.pid)).toBe(false);
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
    const { launchWithGrandchildren } = setup();
    const { handle, kids } = await launchWithGrandchildren(
      "gcstub",
      2,
      ["--grandchildren-ignore-term"],
      { stopGraceMs: 300 },
    );

    const report = await handle.stop();

    expect(await Promise.all(kids.map((kid) => bindPort(kid.port)))).toEqual(["bound", "bound"]);
    expect(report).toMatchObject({ code: 0, timedOut: true, forced: true });
    expect(report.durationMs).toBeGreaterThanOrEqual(300);
    expect(listGroupMembers(handle.pgid)).toEqual([]);
    for (const kid of kids) expect(isAlive(kid.pid)).toBe(false);
  });

  it("stop waits for grandchildren that close their ports after the leader exited", async () => {
    const { launchWithGrandchildren } = setup();
    const { handle, kids } = await launchWithGrandchildren("linger", 2, [
      "--grandchildren-linger",
      "500",
    ]);

    const report = await handle.stop();

    expect(await Promise.all(kids.map((kid) => bindPort(kid.port)))).toEqual(["bound", "bound"]);
    expect(report).toMatchObject({ code: 0, signal: null, timedOut: false, forced: false });
    expect(report.durationMs).toBeGreaterThanOrEqual(500);
    expect(handle.tail()).toContain("engine got SIGTERM");
  });

  it.skipIf(!hasPython3)(
    "stop waits for a grandchild that reads as a zombie while another thread holds its port",
    async () => {
      const { launchWithGrandchildren } = setup();
      const { handle, kids } = await launchWithGrandchildren("thread", 1, [
        "--grandchildren-thread-linger",
        "800",
      ]);
      const kid = kids[0]!;
      const sockets = listeningSockets(kid.port);
      expect(sockets).not.toEqual([]);

      let settled = false;
      const stopping = handle.stop().finally(() => {
        settled = true;
      });
      // What stop once took for gone: the leader reaped, the grandchild's main thread exited.
      await waitFor("the grandchild's main thread to exit", () => {
        return handle.exit() !== undefined && readProcStat(kid.pid)?.state === "Z";
      });
      expect(listeningSockets(kid.port)).toEqual(sockets);
      expect(settled).toBe(false);
      const report = await stopping;

      expect(await bindPort(kid.port)).toBe("bound");
      expect(report).toMatchObject({ code: 0, signal: null, timedOut: false, forced: false });
      expect(report.durationMs).toBeGreaterThanOrEqual(800);
      expect(listGroupMembers(handle.pgid)).toEqual([]);
    },
  );

  it("a process that outlives SIGKILL fails the stop after killWaitMs; a later stop waits while it is left", async () => {
    const { proc, handle } = await launchWithStuckWorker("stuck", []);

    const started = Date.now();
    const error = await handle.stop({ graceMs: 200 }).catch((e: unknown) => e);

    expect(Date.now() - started).toBeGreaterThanOrEqual(500);
    expect(isSupervisorError(error)).toBe(true);
    expect((error as { code: string }).code).toBe("LLMGW_SUPERVISOR_STOP_FAILED");
    expect((error as Error).message).toBe(
      `process group ${handle.pgid} of replica stuck survived SIGKILL for 300 ms: pids ${STUCK_PID} (state D)`,
    );
    expect(isAlive(handle.pid)).toBe(false);

    let settled = false;
    const retry = handle.stop().finally(() => {
      settled = true;
    });
    await new Promise((r) => setTimeout(r, 200));
    expect(settled).toBe(false);
    rmSync(`${proc}/${STUCK_PID}`, { recursive: true });
    const report = await retry;

    expect(report).toMatchObject({ code: 0, signal: null, timedOut: false, forced: false });
    expect(report.durationMs).toBeGreaterThanOrEqual(200);
  });

  it.skipIf(!hasPython3).each([
    { reuse: "its pid, started later", pid: STUCK_PID, start: 78 },
    { reuse: "another pid", pid: STUCK_PID + 1, start: 77 },
  ])(
    "a later stop signals nothing once the survivors are gone and a process with $reuse holds the group id",
    async ({ pid, start }) => {
      const { proc, handle } = await launchWithStuckWorker("reused", ["--group-squatter"]);
      const squatter = await awaitSquatter(handle);
      await expect(handle.stop({ graceMs: 200 })).rejects.toThrow("survived SIGKILL");
      expect(isAlive(handle.pid)).toBe(false);
      expect(readProcStat(squatter)?.pgrp).toBe(squatter);

      // The survivor is gone; a live process in the group that stop has not seen takes its
      // place, in the fake /proc as an unrelated process, in the real one as the squatter.
      rmSync(`${proc}/${STUCK_PID}`, { recursive: true });
      showProcess(proc, { pid, state: "S", pgid: handle.pgid, start });
      process.kill(squatter, "SIGUSR1");
      await waitFor(
        "the squatter in the group",
        () => readProcStat(squatter)?.pgrp === handle.pgid,
      );
      const outcome = await handle.stop({ graceMs: 200 }).catch((e: unknown) => e);

      expect(isAlive(squatter)).toBe(true);
      expect(readProcStat(squatter)?.pgrp).toBe(handle.pgid);
      expect(outcome).toMatchObject({ code: 0, signal: null, timedOut: false, forced: false });
    },
  );

  it.skipIf(!hasPython3)(
    "a crashed engine whose grandchildren exited is not signalled once a stranger holds its group id",
    async () => {
      const { launchWithGrandchildren } = setup();
      const { handle, kids } = await launchWithGrandchildren("crashed", 1, ["--group-squatter"]);
      const squatter = await awaitSquatter(handle);
      process.kill(handle.pid, "SIGKILL");
      await handle.exited;
      process.kill(kids[0]!.pid, "SIGKILL");
      await waitFor("the group to empty", () => listGroupMembers(handle.pgid).length === 0);

      // A live process in the group that the leader's exit did not see: as a process of an
      // unrelated group that reused the id would be.
      process.kill(squatter, "SIGUSR1");
      await waitFor(
        "the squatter in the group",
        () => readProcStat(squatter)?.pgrp === handle.pgid,
      );
      const report = await handle.stop({ graceMs: 200 });

      expect(isAlive(squatter)).toBe(true);
      expect(readProcStat(squatter)?.pgrp).toBe(handle.pgid);
      expect(report).toMatchObject({
        code: null,
        signal: "SIGKILL",
        timedOut: false,
        forced: false,
      });
    },
  );

  it("stop waits for the grandchildren a crashed engine left behind", async () => {
    const { launchWithGrandchildren } = setup();
    const { handle, kids } = await launchWithGrandchildren("orphans", 2, [
      "--grandchildren-linger",
      "500",
    ]);
    process.kill(handle.pid, "SIGKILL");
    await handle.exited;
    for (const kid of kids) expect(isAlive(kid.pid)).toBe(true);

    const report = await handle.stop();

    expect(await Promise.all(kids.map((kid) => bindPort(kid.port)))).toEqual(["bound", "bound"]);
    expect(report).toMatchObject({ code: null, signal: "SIGKILL", timedOut: false, forced: false });
    expect(report.durationMs).toBeGreaterThanOrEqual(500);
    expect(listGroupMembers(handle.pgid)).toEqual([]);
  });

  it("after a crash, stop waits for a descendant forked since, seen while a process seen before lives", async () => {
    const { proc, handle } = await launchWithStuckWorker("forked", []);
    process.kill(handle.pid, "SIGKILL");
    await handle.exited;
    // Seen when the leader's exit was: the worker. Forked by it since: a process at STUCK_PID + 1.
    showProcess(proc, { pid: STUCK_PID + 1, state: "S", pgid: handle.pgid, start: 90 });

    let settled = false;
    const stopping = handle.stop({ graceMs: 5000 }).finally(() => {
      settled = true;
    });
    await new Promise((r) => setTimeout(r, 100));
    rmSync(`${proc}/${STUCK_PID}`, { recursive: true });
    await new Promise((r) => setTimeout(r, 200));
    expect(settled).toBe(false);
    rmSync(`${proc}/${STUCK_PID + 1}`, { recursive: true });
    const report = await stopping;

    expect(report).toMatchObject({ code: null, signal: "SIGKILL", timedOut: false, forced: false });
    expect(report.durationMs).toBeGreaterThanOrEqual(300);
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
