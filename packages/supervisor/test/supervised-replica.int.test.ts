import { readFileSync, writeFileSync } from "node:fs";
import {
  createSupervisedReplica,
  createSupervisor,
  hashProcessSpec,
  listGroupMembers,
  type ProbeOutcome,
  type ProcessHandle,
  type ProcessSpec,
  type ReplicaTransition,
  Supervisor,
} from "@llmgw/supervisor";
import { ManualClock, RecordingLogger } from "@llmgw/supervisor/testing";
import { afterEach, describe, expect, it } from "vitest";
import { engineSpec, freePort, grandchildren, isAlive, tempDir, waitFor } from "./helpers.js";

const cleanups: (() => void | Promise<void>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

function setup(clock?: ManualClock) {
  const { dir, cleanup } = tempDir("llmgw-replica-");
  cleanups.push(cleanup);
  const logger = new RecordingLogger();
  const supervisor = createSupervisor({
    stateDir: `${dir}/state`,
    logger,
    logPollIntervalMs: 50,
    stopPollIntervalMs: 20,
    ...(clock === undefined ? {} : { clock }),
  });
  return { dir, supervisor, logger };
}

/**
 * A real supervisor that counts its launches and can hold the next spawned process back from
 * the replica until released, as a slow wait for /proc does.
 */
class SlowSupervisor extends Supervisor {
  launches = 0;
  settled = 0;
  #held: { spawned: (handle: ProcessHandle) => void; released: Promise<void> } | undefined;

  holdNext(): { spawned: Promise<ProcessHandle>; release: () => void } {
    let spawned: (handle: ProcessHandle) => void = () => {};
    let release: () => void = () => {};
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    const spawnedHandle = new Promise<ProcessHandle>((resolve) => {
      spawned = resolve;
    });
    this.#held = { spawned, released };
    return { spawned: spawnedHandle, release };
  }

  override async launch(replicaId: string, spec: ProcessSpec): Promise<ProcessHandle> {
    this.launches++;
    try {
      const handle = await super.launch(replicaId, spec);
      const held = this.#held;
      this.#held = undefined;
      if (held !== undefined) {
        held.spawned(handle);
        await held.released;
      }
      return handle;
    } finally {
      this.settled++;
    }
  }
}

function slowSetup() {
  const { dir, cleanup } = tempDir("llmgw-replica-");
  cleanups.push(cleanup);
  const supervisor = new SlowSupervisor({
    stateDir: `${dir}/state`,
    logger: new RecordingLogger(),
    logPollIntervalMs: 50,
    stopPollIntervalMs: 20,
  });
  return { dir, supervisor };
}

function record(replica: { subscribe(l: (t: ReplicaTransition) => void): () => void }) {
  const transitions: ReplicaTransition[] = [];
  replica.subscribe((t) => transitions.push(t));
  return transitions;
}

const path = (ts: readonly ReplicaTransition[]) => ts.map((t) => t.to);

describe("SupervisedReplica", () => {
  it("crash → restart with exponential backoff on an injected clock, then failed with the tail", async () => {
    const clock = new ManualClock();
    const { dir, supervisor, logger } = setup(clock);
    const replica = createSupervisedReplica({
      supervisor,
      replicaId: "crashy",
      spec: engineSpec(dir, "crashy", ["--lines", "2", "--exit-after", "50", "--exit-code", "3"]),
      probe: async () => "starting",
      restartPolicy: {
        initialDelayMs: 1000,
        factor: 2,
        maxDelayMs: 10_000,
        stablePeriodMs: 60_000,
        maxQuickFailures: 3,
      },
    });
    cleanups.push(async () => {
      await replica.stop();
    });
    const transitions = record(replica);

    await replica.start();
    await waitFor("first exit", () => replica.state === "exited");
    expect(transitions.at(-1)?.reason).toBe(
      "exited unexpectedly (code=3 signal=null); restarting in 1000 ms",
    );
    expect(clock.nextDelayMs()).toBe(1000);
    clock.advance(999);
    expect(replica.state).toBe("exited");
    clock.advance(1);
    await waitFor("second start", () => replica.state === "starting");

    await waitFor("second exit", () => replica.state === "exited");
    expect(transitions.at(-1)?.reason).toBe(
      "exited unexpectedly (code=3 signal=null); restarting in 2000 ms",
    );
    clock.advance(2000);
    await waitFor("third start", () => replica.state === "starting");

    await waitFor("failed", () => replica.state === "failed");
    expect(path(transitions)).toEqual([
      "starting",
      "exited",
      "starting",
      "exited",
      "starting",
      "exited",
      "failed",
    ]);
    expect(replica.failure?.reason).toBe(
      "restart policy gave up: 3 consecutive runs shorter than 60000 ms",
    );
    expect(replica.failure?.tail).toContain("engine exiting with 3");
    expect(replica.failure?.tail).toContain("line 1");
    expect(transitions.at(-1)?.tail).toEqual(replica.failure?.tail);
    expect(
      logger.lines.filter((l) => l.message.startsWith("replica ")).map((l) => l.message),
    ).toEqual([
      "replica exited → starting",
      "replica starting → exited",
      "replica exited → starting",
      "replica starting → exited",
      "replica exited → starting",
      "replica starting → exited",
      "replica exited → failed",
    ]);
  });

  it("a crashed leader's grandchildren are stopped before the replica restarts or fails", async () => {
    const { dir, supervisor } = setup();
    const replica = createSupervisedReplica({
      supervisor,
      replicaId: "orphans",
      spec: engineSpec(dir, "orphans", [
        "--grandchildren",
        "2",
        "--exit-after",
        "400",
        "--exit-code",
        "1",
      ]),
      probe: async () => "starting",
      probeIntervalMs: 50,
      restartPolicy: { maxQuickFailures: 1 },
    });
    cleanups.push(async () => {
      await replica.stop();
    });
    await replica.start();
    const handle = replica.handle!;
    cleanups.push(() => {
      try {
        process.kill(-handle.pgid, "SIGKILL");
      } catch {}
    });
    const kids = await waitFor("2 grandchildren", () => {
      const found = grandchildren(handle.tail());
      return found.length === 2 ? found : undefined;
    });
    await waitFor("failed", () => replica.state === "failed");
    expect(replica.failure?.reason).toBe(
      "restart policy gave up: 1 consecutive runs shorter than 60000 ms",
    );
    for (const kid of kids) expect(isAlive(kid.pid)).toBe(false);
    expect(listGroupMembers(handle.pgid)).toEqual([]);
  });

  it("starting → loading → ready against a real HTTP engine, then stop → exited", async () => {
    const { dir, supervisor } = setup();
    const port = await freePort();
    const readyFile = `${dir}/weights-loaded`;
    const probe = async (): Promise<ProbeOutcome> => {
      try {
        const health = await fetch(`http://127.0.0.1:${port}/health`, {
          signal: AbortSignal.timeout(1000),
        });
        if (!health.ok) return "starting";
        const models = (await (await fetch(`http://127.0.0.1:${port}/v1/models`)).json()) as {
          data: { id: string }[];
        };
        return models.data.some((m) => m.id === "m1") ? "ready" : "loading";
      } catch {
        return "starting";
      }
    };
    const replica = createSupervisedReplica({
      supervisor,
      replicaId: "http",
      spec: engineSpec(dir, "http", [
        "--port",
        String(port),
        "--model",
        "m1",
        "--ready-file",
        readyFile,
      ]),
      probe,
      probeIntervalMs: 50,
      loadingDeadlineMs: 20_000,
    });
    cleanups.push(async () => {
      await replica.stop();
    });
    const transitions = record(replica);
    await replica.start();
    await waitFor("loading", () => replica.state === "loading");
    writeFileSync(readyFile, "");
    await waitFor("ready", () => replica.state === "ready");
    const pid = replica.handle!.pid;
    const report = await replica.stop();
    expect(path(transitions)).toEqual(["starting", "loading", "ready", "stopping", "exited"]);
    expect(report).toMatchObject({ code: 0, forced: false });
    expect(isAlive(pid)).toBe(false);
  });

  it("launchEnv is drawn afresh for every launch and stays out of the spec hash", async () => {
    const { dir, supervisor } = setup();
    const spec = engineSpec(dir, "keyed", ["--lines", "1"]);
    let draws = 0;
    const replica = createSupervisedReplica({
      supervisor,
      replicaId: "keyed",
      spec,
      launchEnv: () => ({ PER_LAUNCH_SECRET: `secret-${++draws}` }),
      probe: async () => "ready",
      probeIntervalMs: 50,
      restartPolicy: { initialDelayMs: 10, maxQuickFailures: 5 },
    });
    cleanups.push(async () => {
      await replica.stop();
    });
    const environOf = (pid: number) =>
      readFileSync(`/proc/${pid}/environ`, "utf8")
        .split("\0")
        .filter((e) => e.startsWith("PER_"));
    await replica.start();
    const first = await waitFor("ready", () => replica.state === "ready" && replica.handle);
    expect(environOf(first.pid)).toEqual(["PER_LAUNCH_SECRET=secret-1"]);
    process.kill(first.pid, "SIGKILL");
    const second = await waitFor(
      "restarted and ready",
      () => replica.state === "ready" && replica.handle?.pid !== first.pid && replica.handle,
    );
    expect(environOf(second.pid)).toEqual(["PER_LAUNCH_SECRET=secret-2"]);
    // Adoption compares this hash: a rotated secret must not read as a changed spec.
    expect(replica.options.specHash).toBe(hashProcessSpec(spec));
    const nextAgent = createSupervisor({ stateDir: `${dir}/state`, logger: new RecordingLogger() });
    const adopted = await nextAgent.adopt("keyed", hashProcessSpec(spec));
    expect(adopted).toMatchObject({ kind: "adopted", handle: { pid: second.pid } });
  });

  it("release() leaves the process running, and restarts nothing once it exits", async () => {
    const { dir, supervisor } = setup();
    const spec = engineSpec(dir, "released", ["--lines", "1"]);
    const replica = createSupervisedReplica({
      supervisor,
      replicaId: "released",
      spec,
      probe: async () => "ready",
      probeIntervalMs: 20,
      restartPolicy: { initialDelayMs: 10, maxQuickFailures: 5 },
    });
    let launches = 0;
    const transitions = record(replica);
    replica.subscribe((t) => {
      if (t.to === "starting") launches++;
    });
    await replica.start();
    const handle = await waitFor("ready", () => replica.state === "ready" && replica.handle);
    replica.release();
    expect(isAlive(handle.pid)).toBe(true);
    // The next agent adopts it and stops it: the released replica must not bring it back.
    const nextAgent = createSupervisor({ stateDir: `${dir}/state`, logger: new RecordingLogger() });
    const adopted = await nextAgent.adopt("released", hashProcessSpec(spec));
    if (adopted.kind !== "adopted") throw new Error(`not adopted: ${adopted.kind}`);
    await adopted.handle.stop({ graceMs: 1000 });
    await waitFor("the process to be gone", () => !isAlive(handle.pid));
    const settled = transitions.length;
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect([launches, transitions.length - settled, replica.state]).toEqual([1, 0, "ready"]);
  });

  it("stop() while a crash restart is launching: nothing runs after it, no restart follows", async () => {
    const clock = new ManualClock(Date.now());
    const { dir, supervisor } = slowSetup();
    // As the agent's launchEnv, which persists the new key before the spawn: the second
    // launch (the restart) waits in it until released.
    let draws = 0;
    let restartLaunching: () => void = () => {};
    const inLaunchEnv = new Promise<void>((resolve) => {
      restartLaunching = resolve;
    });
    let release: () => void = () => {};
    const released = new Promise<void>((resolve) => {
      release = resolve;
    });
    const replica = createSupervisedReplica({
      supervisor,
      replicaId: "retired",
      spec: engineSpec(dir, "retired", []),
      launchEnv: async () => {
        if (++draws === 2) {
          restartLaunching();
          await released;
        }
        return { PER_LAUNCH_SECRET: `secret-${draws}` };
      },
      probe: async () => "ready",
      restartPolicy: { initialDelayMs: 1000, maxQuickFailures: 5 },
      clock,
    });
    cleanups.push(async () => {
      await replica.stop();
      await supervisor.get("retired")?.stop({ graceMs: 100 });
    });
    const transitions = record(replica);
    await replica.start();
    const first = replica.handle!;
    process.kill(first.pid, "SIGKILL");
    await waitFor("crash handled", () => replica.state === "exited");
    clock.advance(1000);
    await inLaunchEnv;

    const stopping = replica.stop();
    release();
    const report = await stopping;
    // Once the queue drains, the restart has spawned or given up; a spawn is then waited for.
    await new Promise((resolve) => setImmediate(resolve));
    await waitFor("launches settled", () => supervisor.settled === supervisor.launches);
    expect({
      report,
      state: replica.state,
      running: supervisor.get("retired"),
      launches: supervisor.launches,
      timers: clock.pending(),
      draws,
      transitions: path(transitions),
    }).toEqual({
      report: undefined,
      state: "exited",
      running: undefined,
      launches: 1,
      timers: 0,
      draws: 2,
      transitions: ["starting", "exited"],
    });
    // The supervisor's slot is free: the same replica id launches again.
    await replica.start();
    expect(replica.state).toBe("starting");
    expect(isAlive(replica.handle!.pid)).toBe(true);
  });

  it("stop() racing start(): the process spawned meanwhile is stopped, not attached", async () => {
    const { dir, supervisor } = slowSetup();
    const { spawned, release } = supervisor.holdNext();
    const replica = createSupervisedReplica({
      supervisor,
      replicaId: "raced",
      spec: engineSpec(dir, "raced", []),
      probe: async () => "ready",
      probeIntervalMs: 50,
    });
    cleanups.push(async () => {
      await replica.stop();
      await supervisor.get("raced")?.stop({ graceMs: 100 });
    });
    const transitions = record(replica);
    const starting = replica.start();
    const handle = await spawned;
    await waitFor("engine up", () => handle.tail().includes(`engine ${handle.pid} up`));

    const stopping = replica.stop();
    release();
    await starting;
    expect(await stopping).toMatchObject({ code: 0, signal: null, forced: false });
    expect(isAlive(handle.pid)).toBe(false);
    expect({
      state: replica.state,
      handle: replica.handle,
      running: supervisor.get("raced"),
      runs: replica.history.length,
      transitions: path(transitions),
    }).toEqual({
      state: "exited",
      handle: undefined,
      running: undefined,
      runs: 1,
      transitions: [],
    });
  });

  it.each([
    ["while its launchEnv runs", "launchEnv"],
    ["after the spawn, before the process is attached", "spawned"],
  ] as const)(
    "stop() %s, during a start from failed: exited, as from a start from exited",
    async (_, at) => {
      const { dir, supervisor } = slowSetup();
      let draws = 0;
      let inLaunchEnv: () => void = () => {};
      const secondDraw = new Promise<void>((resolve) => {
        inLaunchEnv = resolve;
      });
      let release: () => void = () => {};
      const released = new Promise<void>((resolve) => {
        release = resolve;
      });
      const replica = createSupervisedReplica({
        supervisor,
        replicaId: "relaunched",
        spec: engineSpec(dir, "relaunched", []),
        launchEnv: async () => {
          if (++draws === 2 && at === "launchEnv") {
            inLaunchEnv();
            await released;
          }
          return {};
        },
        probe: async () => "loading",
        probeIntervalMs: 50,
        loadingDeadlineMs: 300,
      });
      cleanups.push(async () => {
        await replica.stop();
        await supervisor.get("relaunched")?.stop({ graceMs: 100 });
      });
      await replica.start();
      await waitFor("failed", () => replica.state === "failed");
      const transitions = record(replica);

      const held = at === "spawned" ? supervisor.holdNext() : undefined;
      const starting = replica.start();
      if (held === undefined) await secondDraw;
      else await held.spawned;
      const stopping = replica.stop();
      (held?.release ?? release)();
      await starting;
      await stopping;
      expect({
        state: replica.state,
        failure: replica.failure,
        handle: replica.handle,
        running: supervisor.get("relaunched"),
        transitions: transitions.map((t) => `${t.from} → ${t.to}: ${t.reason}`),
      }).toEqual({
        state: "exited",
        failure: undefined,
        handle: undefined,
        running: undefined,
        transitions: ["failed → exited: stopped while starting"],
      });
    },
  );

  it("loading past the deadline → failed with the log tail, process stopped", async () => {
    const { dir, supervisor } = setup();
    const replica = createSupervisedReplica({
      supervisor,
      replicaId: "slow",
      spec: engineSpec(dir, "slow", ["--lines", "3"]),
      probe: async () => "loading",
      probeIntervalMs: 50,
      loadingDeadlineMs: 800,
    });
    cleanups.push(async () => {
      await replica.stop();
    });
    const transitions = record(replica);
    await replica.start();
    const pid = replica.handle!.pid;
    await waitFor("failed", () => replica.state === "failed");
    expect(path(transitions)).toEqual(["starting", "loading", "stopping", "failed"]);
    expect(replica.failure?.reason).toBe("not ready within the loading deadline of 800 ms");
    expect(replica.failure?.tail).toContain("line 2");
    expect(isAlive(pid)).toBe(false);
  });

  it("after ready, N consecutive failed probes → unhealthy (no restart), recovery → ready", async () => {
    const { dir, supervisor } = setup();
    let outcome: ProbeOutcome = "ready";
    let probes = 0;
    const replica = createSupervisedReplica({
      supervisor,
      replicaId: "flaky",
      spec: engineSpec(dir, "flaky", []),
      probe: async () => {
        probes++;
        if (outcome === "failed-probe") throw new Error("connection reset");
        return outcome;
      },
      probeIntervalMs: 20,
      unhealthyAfterFailures: 3,
    });
    cleanups.push(async () => {
      await replica.stop();
    });
    const transitions = record(replica);
    await replica.start();
    await waitFor("ready", () => replica.state === "ready");
    const pid = replica.handle!.pid;
    const before = probes;
    outcome = "failed-probe";
    await waitFor("unhealthy", () => replica.state === "unhealthy");
    expect(probes - before).toBeGreaterThanOrEqual(3);
    expect(transitions.at(-1)?.reason).toBe("3 consecutive failed probes (last: failed-probe)");
    outcome = "ready";
    await waitFor("recovered", () => replica.state === "ready");
    expect(replica.handle?.pid).toBe(pid);
    expect(path(transitions)).toEqual(["starting", "ready", "unhealthy", "ready"]);
  });
});
