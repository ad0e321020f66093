import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import {
  createSupervisedReplica,
  createSupervisor,
  hashProcessSpec,
  listGroupMembers,
  type ProcessSpec,
  pidFilePath,
  readPidFile,
  readProcessIdentity,
  writePidFile,
} from "@llmgw/supervisor";
import { afterEach, describe, expect, it } from "vitest";
import { engineSpec, fixtureEngine, isAlive, tempDir, waitFor } from "./helpers.js";

const host = fileURLToPath(new URL("./fixtures/supervisor-host.ts", import.meta.url));
const repoRoot = fileURLToPath(new URL("../../../", import.meta.url));

const cleanups: (() => void | Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

function killGroupLater(pgid: number): void {
  cleanups.push(() => {
    try {
      process.kill(-pgid, "SIGKILL");
    } catch {}
  });
}

/** Starts a supervisor in a child node process; resolves with the engine it launched. */
async function launchInHost(stateDir: string, replicaId: string, spec: ProcessSpec) {
  const grace =
    spec.stopGraceMs === undefined ? {} : { LLMGW_TEST_STOP_GRACE_MS: String(spec.stopGraceMs) };
  const child: ChildProcess = spawn(
    process.execPath,
    [
      "--conditions=@llmgw/source",
      "--import",
      "tsx",
      host,
      stateDir,
      replicaId,
      spec.logFile,
      ...spec.argv,
    ],
    { cwd: repoRoot, stdio: ["ignore", "pipe", "inherit"], env: { ...process.env, ...grace } },
  );
  cleanups.push(() => {
    child.kill("SIGKILL");
  });
  let out = "";
  child.stdout!.on("data", (chunk: Buffer) => {
    out += chunk.toString();
  });
  const line = await waitFor(
    "host to print the engine pid",
    () => (out.includes("\n") ? out.split("\n")[0] : undefined),
    30_000,
  );
  const engine = JSON.parse(line!) as { pid: number; specHash: string };
  killGroupLater(engine.pid);
  return { child, engine };
}

describe("orphan adoption", () => {
  it("a new supervisor adopts the engine of a SIGKILLed one instead of relaunching it", async () => {
    const { dir, cleanup } = tempDir("llmgw-adopt-");
    cleanups.push(cleanup);
    const stateDir = `${dir}/state`;
    const spec = engineSpec(dir, "r1", ["--lines", "2"]);
    const { child, engine } = await launchInHost(stateDir, "r1", spec);
    expect(engine.specHash).toBe(hashProcessSpec(spec));
    await waitFor("engine output", () => readFileSync(spec.logFile, "utf8").includes("line 1"));

    child.kill("SIGKILL");
    await waitFor("host gone", () => child.exitCode !== null || child.signalCode !== null);
    expect(isAlive(engine.pid)).toBe(true);

    const supervisor = createSupervisor({
      stateDir,
      adoptPollIntervalMs: 50,
      stopPollIntervalMs: 20,
    });
    const replica = createSupervisedReplica({
      supervisor,
      replicaId: "r1",
      spec,
      probe: async () => "ready",
      probeIntervalMs: 50,
    });
    await replica.start({ adopt: true });
    expect(replica.handle?.pid).toBe(engine.pid);
    expect(replica.handle?.adopted).toBe(true);
    expect(replica.handle?.tail()).toContain("line 1");
    // Probed before start returns: the new agent's first heartbeat says ready, so routers
    // never drop a serving engine for a probe interval.
    expect(replica.state).toBe("ready");

    const report = await replica.stop();
    expect(report).toMatchObject({ code: null, signal: null, forced: false, timedOut: false });
    expect(isAlive(engine.pid)).toBe(false);
    expect(listGroupMembers(engine.pid)).toEqual([]);
    expect(readPidFile(stateDir, "r1")).toEqual({ kind: "missing" });
  }, 60_000);

  it("stops an adopted engine with the spec's grace, not the supervisor default", async () => {
    const { dir, cleanup } = tempDir("llmgw-adopt-");
    cleanups.push(cleanup);
    const stateDir = `${dir}/state`;
    const spec = engineSpec(dir, "r3", ["--ignore-term"], { stopGraceMs: 300 });
    const { child, engine } = await launchInHost(stateDir, "r3", spec);
    await waitFor("engine up", () => readFileSync(spec.logFile, "utf8").includes("up"));
    child.kill("SIGKILL");
    await waitFor("host gone", () => child.exitCode !== null || child.signalCode !== null);

    const supervisor = createSupervisor({
      stateDir,
      adoptPollIntervalMs: 50,
      stopPollIntervalMs: 20,
      defaultStopGraceMs: 60_000,
    });
    const replica = createSupervisedReplica({
      supervisor,
      replicaId: "r3",
      spec,
      probe: async () => "ready",
      probeIntervalMs: 50,
    });
    await replica.start({ adopt: true });
    expect(replica.handle?.adopted).toBe(true);

    const report = await replica.stop();
    expect(report).toMatchObject({ forced: true, timedOut: true });
    expect(report?.durationMs).toBeLessThan(10_000);
    expect(isAlive(engine.pid)).toBe(false);
  }, 60_000);

  it("an adopted handle stops with the grace its launcher recorded, without being told", async () => {
    const { dir, cleanup } = tempDir("llmgw-adopt-");
    cleanups.push(cleanup);
    const stateDir = `${dir}/state`;
    const spec = engineSpec(dir, "r4", ["--ignore-term"], { stopGraceMs: 300 });
    const { child, engine } = await launchInHost(stateDir, "r4", spec);
    await waitFor("engine up", () => readFileSync(spec.logFile, "utf8").includes("up"));
    const recorded = readPidFile(stateDir, "r4");
    expect(recorded.kind === "ok" && recorded.record.stopGraceMs).toBe(300);
    child.kill("SIGKILL");
    await waitFor("host gone", () => child.exitCode !== null || child.signalCode !== null);

    const supervisor = createSupervisor({
      stateDir,
      adoptPollIntervalMs: 50,
      stopPollIntervalMs: 20,
      defaultStopGraceMs: 60_000,
    });
    const report = await supervisor.adopt("r4", hashProcessSpec(spec));
    expect(report.kind).toBe("adopted");
    if (report.kind !== "adopted") return;
    const stopped = await report.handle.stop();
    expect(stopped).toMatchObject({ forced: true, timedOut: true });
    expect(stopped.durationMs).toBeLessThan(10_000);
    expect(isAlive(engine.pid)).toBe(false);
  }, 60_000);

  it("reports spec-changed for a live process launched from another spec; the replica replaces it", async () => {
    const { dir, cleanup } = tempDir("llmgw-adopt-");
    cleanups.push(cleanup);
    const stateDir = `${dir}/state`;
    const oldSpec = engineSpec(dir, "r2", ["--lines", "1"]);
    const { child, engine } = await launchInHost(stateDir, "r2", oldSpec);
    child.kill("SIGKILL");

    const newSpec = engineSpec(dir, "r2", ["--lines", "5"]);
    const supervisor = createSupervisor({
      stateDir,
      adoptPollIntervalMs: 50,
      stopPollIntervalMs: 20,
    });
    const report = await supervisor.adopt("r2", hashProcessSpec(newSpec));
    expect(report.kind).toBe("spec-changed");
    if (report.kind !== "spec-changed") return;
    expect(report.handle.pid).toBe(engine.pid);
    expect(report.recordedSpecHash).toBe(hashProcessSpec(oldSpec));
    await report.handle.stop();
    expect(isAlive(engine.pid)).toBe(false);

    const replica = createSupervisedReplica({
      supervisor,
      replicaId: "r2",
      spec: newSpec,
      probe: async () => "ready",
      probeIntervalMs: 50,
    });
    await replica.start({ adopt: true });
    expect(replica.handle?.adopted).toBe(false);
    expect(replica.handle?.pid).not.toBe(engine.pid);
    await replica.stop();
  }, 60_000);

  it("adoptOnly: adopts, and fails with its reason instead of launching, now or after an exit", async () => {
    const { dir, cleanup } = tempDir("llmgw-adopt-");
    cleanups.push(cleanup);
    const stateDir = `${dir}/state`;
    const spec = engineSpec(dir, "r5", ["--lines", "1"]);
    const { child, engine } = await launchInHost(stateDir, "r5", spec);
    child.kill("SIGKILL");
    await waitFor("host gone", () => child.exitCode !== null || child.signalCode !== null);

    const supervisor = createSupervisor({ stateDir, adoptPollIntervalMs: 50 });
    const replica = (replicaId: string) =>
      createSupervisedReplica({
        supervisor,
        replicaId,
        spec: { ...spec, logFile: `${dir}/logs/${replicaId}.log` },
        probe: async () => "ready",
        probeIntervalMs: 50,
        restartPolicy: { initialDelayMs: 10 },
        adoptOnly: "refused",
      });
    const adopted = replica("r5");
    await adopted.start({ adopt: true });
    expect(adopted.handle).toMatchObject({ pid: engine.pid, adopted: true });
    expect(adopted.state).toBe("ready");
    process.kill(engine.pid, "SIGKILL");
    await waitFor("the replica to fail", () => adopted.state === "failed");
    expect(adopted.failure?.reason).toBe("exited unexpectedly (code=null signal=null); refused");
    await new Promise((r) => setTimeout(r, 200));
    expect(adopted.state).toBe("failed");
    expect(supervisor.get("r5")).toBeUndefined();

    const nothing = replica("r6");
    await nothing.start({ adopt: true });
    expect(nothing.state).toBe("failed");
    expect(nothing.failure?.reason).toBe("no running process to adopt; refused");
    expect(nothing.handle).toBeUndefined();
    expect(readPidFile(stateDir, "r6")).toEqual({ kind: "missing" });
  }, 60_000);

  it("stopLeftover stops the live process a pid file names through its group, and finds none after", async () => {
    const { dir, cleanup } = tempDir("llmgw-adopt-");
    cleanups.push(cleanup);
    const stateDir = `${dir}/state`;
    const spec = engineSpec(dir, "r7", ["--lines", "1"]);
    const { child, engine } = await launchInHost(stateDir, "r7", spec);
    child.kill("SIGKILL");
    await waitFor("host gone", () => child.exitCode !== null || child.signalCode !== null);
    const supervisor = createSupervisor({ stateDir, stopPollIntervalMs: 20 });
    const report = await supervisor.stopLeftover("r7");
    expect(report).toMatchObject({ forced: false });
    expect(isAlive(engine.pid)).toBe(false);
    expect(listGroupMembers(engine.pid)).toEqual([]);
    expect(readPidFile(stateDir, "r7")).toEqual({ kind: "missing" });
    expect(await supervisor.stopLeftover("r7")).toBeUndefined();
  }, 60_000);

  it.each([
    { name: "different start time", tamper: { startTime: "1" } },
    { name: "different command line", tamper: { cmdlineSha256: "0".repeat(64) } },
  ])("never adopts or signals an unrelated live process ($name)", async ({ tamper }) => {
    const { dir, cleanup } = tempDir("llmgw-adopt-");
    cleanups.push(cleanup);
    const stateDir = `${dir}/state`;
    const unrelated = spawn(process.execPath, [fixtureEngine], { detached: true, stdio: "ignore" });
    killGroupLater(unrelated.pid!);
    await waitFor("unrelated process", () => {
      try {
        return readProcessIdentity(unrelated.pid!).cmdlineSha256 !== undefined;
      } catch {
        return false;
      }
    });
    const identity = readProcessIdentity(unrelated.pid!);
    writePidFile(stateDir, {
      version: 1,
      replicaId: "victim",
      ...identity,
      ...tamper,
      specHash: "s",
      logFile: `${dir}/victim.log`,
      writtenAtMs: 0,
    });
    const supervisor = createSupervisor({ stateDir });

    const report = await supervisor.adopt("victim", "s");

    expect(report.kind).toBe("pid-reused");
    expect(isAlive(unrelated.pid!)).toBe(true);
    expect(readPidFile(stateDir, "victim")).toEqual({ kind: "missing" });
    const replica = createSupervisedReplica({
      supervisor,
      replicaId: "victim",
      spec: { argv: ["/bin/true"], env: {}, logFile: `${dir}/victim.log`, specHash: "s" },
      probe: async () => "starting",
    });
    await replica.start({ adopt: true });
    expect(replica.handle?.pid).not.toBe(unrelated.pid);
    await replica.stop();
    expect(isAlive(unrelated.pid!)).toBe(true);
  });

  it.each([
    {
      name: "a dead pid",
      content: (p: object) => JSON.stringify({ ...p, pid: 2 ** 22 - 1, pgid: 2 ** 22 - 1 }),
      reason: `process ${2 ** 22 - 1} is gone`,
    },
    { name: "garbage", content: () => "{", reason: "invalid pid file: not JSON" },
  ])("cleans a stale pid file ($name)", async ({ content, reason }) => {
    const { dir, cleanup } = tempDir("llmgw-adopt-");
    cleanups.push(cleanup);
    const stateDir = `${dir}/state`;
    const base = {
      version: 1 as const,
      replicaId: "old",
      pid: 2,
      pgid: 2,
      startTime: "1",
      cmdlineSha256: "x",
      specHash: "s",
      logFile: `${dir}/old.log`,
      writtenAtMs: 0,
    };
    writePidFile(stateDir, base);
    writeFileSync(pidFilePath(stateDir, "old"), content(base));
    const report = await createSupervisor({ stateDir }).adopt("old", "s");
    expect(report).toEqual({ kind: "stale", reason });
    expect(readPidFile(stateDir, "old")).toEqual({ kind: "missing" });
  });
});
