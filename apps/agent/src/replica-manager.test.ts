import { mkdtempSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { create } from "@bufbuild/protobuf";
import {
  applyKernelFaults,
  createKernelFaultTracker,
  type Problem,
  ProblemCodes,
  simulateInventory,
} from "@llmgw/discovery";
import { OWNED_SHORT_FLAGS, parseDeploymentSpecOrThrow } from "@llmgw/engines";
import { createKvEventPublisher } from "@llmgw/kv-events";
import { type ReplicaAssignment, ReplicaAssignmentSchema, ReplicaState } from "@llmgw/proto";
import { createSupervisor, silentLogger } from "@llmgw/supervisor";
import { holdPortOnceFree } from "@llmgw/supervisor/testing";
import { deploymentSpecToProto } from "@llmgw/wire";
import { afterEach, describe, expect, it } from "vitest";
import { simReplicaAssignment } from "../test/assignments.js";
import {
  RELAUNCH_DEFAULTS,
  ReplicaManager,
  type ReplicaManagerOptions,
  relaunchDelayMs,
} from "./replica-manager.js";

const dirs: string[] = [];
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

/** A fresh directory `llmgw-replica-<name>-…`, removed after the test. */
function tempDir(name: string): string {
  const dir = mkdtempSync(path.join(tmpdir(), `llmgw-replica-${name}-`));
  dirs.push(dir);
  return dir;
}

function manager(extra: Partial<ReplicaManagerOptions> = {}) {
  const stateDir = tempDir("manager");
  const node = simulateInventory("1xh100-80g", { hostname: "node-a" });
  return new ReplicaManager({
    supervisor: createSupervisor({ stateDir: path.join(stateDir, "pids") }),
    stateDir,
    inventory: () => node,
    nodeConfig: {},
    probes: {
      probe: async () => "ready",
      scrapeLoad: async () => ({}),
    },
    baseEnv: {},
    secretEnv: {},
    logger: silentLogger,
    probeIntervalMs: 1000,
    probeTimeoutMs: 1000,
    defaultLoadingDeadlineMs: 60_000,
    localAddress: "127.0.0.1",
    ...extra,
  });
}

/** Replica m-0 of a simulated-engine deployment on GPU 0. */
const _assignment = () => simReplicaAssignment();

/** Polls `check` every 10 ms until it gives a value; fails naming `what` after 15 s. */
async function until<T>(
  what: string,
  check: () => T | undefined | false | Promise<T | undefined | false>,
): Promise<T> {
  const deadline = Date.now() + 15_000;
  for (;;) {
    const value = await check();
    if (value !== undefined && value !== false) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** A logger that keeps the fields of each warning, to read a refusal's code from. */
function recordingLogger() {
  const warnings: Readonly<Record<string, unknown>>[] = [];
  return {
    warnings,
    logger: { info: () => {}, warn: (_: string, fields = {}) => void warnings.push(fields) },
  };
}

/** An assignment the node cannot run: GPU 3 on a one-GPU node. */
function impossible(revision: bigint) {
  const deployment = deploymentSpecToProto(
    parseDeploymentSpecOrThrow({ name: "m", model: "org/model", engine: "sim" }),
  );
  deployment.revision = revision;
  return create(ReplicaAssignmentSchema, {
    replicaId: "m-0",
    rank: 0,
    gpuIndices: [3],
    deployment,
  });
}

describe("ReplicaManager", () => {
  it("reports an assignment it cannot run as FAILED without launching, until it is withdrawn", async () => {
    const m = manager();
    await m.apply([impossible(1n)]);
    const [status] = m.statuses();
    expect(status).toMatchObject({ replicaId: "m-0", state: ReplicaState.FAILED, revision: 1n });
    expect(status?.message).toContain("LLMGW_ENGINES_GPU_NOT_FOUND");
    expect(m.managedPids().size).toBe(0);

    await m.apply([impossible(2n)]);
    expect(m.statuses()).toMatchObject([{ state: ReplicaState.FAILED, revision: 2n }]);

    await m.apply([]);
    expect(m.statuses()).toEqual([]);
    await m.close(true);
  });
});

describe("ReplicaManager: error codes of a FAILED replica", () => {
  const simAssignment = (deployment = true) =>
    create(ReplicaAssignmentSchema, {
      replicaId: "m-0",
      rank: 0,
      gpuIndices: [0],
      ...(deployment
        ? {
            deployment: deploymentSpecToProto(
              parseDeploymentSpecOrThrow({ name: "m", model: "org/model", engine: "sim" }),
            ),
          }
        : {}),
    });

  it.each([
    [
      "an assignment without a deployment",
      {},
      simAssignment(false),
      "LLMGW_AGENT_ASSIGNMENT_REFUSED",
      "assignment carries no deployment",
    ],
    [
      "a launch the engines' check refuses",
      {},
      impossible(1n),
      "LLMGW_AGENT_ASSIGNMENT_REFUSED",
      "LLMGW_ENGINES_GPU_NOT_FOUND: GPU 3 is not in node-a's inventory",
    ],
    [
      "an engine that cannot be spawned",
      { nodeConfig: { simCommand: ["/nonexistent/llmgw-engine"] } },
      simAssignment(),
      "LLMGW_AGENT_LAUNCH_FAILED",
      "launch failed: cannot spawn /nonexistent/llmgw-engine",
    ],
  ])("%s is logged with a stable code", async (_, extra, assignment, code, message) => {
    const { warnings, logger } = recordingLogger();
    const m = manager({ ...extra, logger });
    await m.apply([assignment]);
    const [status] = m.statuses();
    expect(status?.state).toBe(ReplicaState.FAILED);
    expect(status?.message).toContain(message);
    expect(warnings).toMatchObject([{ replicaId: "m-0", code }]);
    expect(m.managedPids().size).toBe(0);
    await m.close(true);
  });
});

describe("ReplicaManager: the launch check after a kernel-log fault", () => {
  /**
   * health-formats.md §1.3, verbatim but for its PCI id: `PCI:0000:06:00` rewritten to the
   * simulated GPU 0's bus (`00000000:01:00.0` in simulate.ts).
   */
  const XID_79 = "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.";

  /** node-a's GPU 0 with the Xid 79 applied, and `extra` problems beside it. */
  function faultedNode(extra: Problem[] = []) {
    const base = simulateInventory("1xh100-80g", { hostname: "node-a" });
    const tracker = createKernelFaultTracker({ clock: () => 1_700_000_000_000 });
    tracker.add(XID_79, true);
    const gpus = base.gpus.map((g) =>
      extra.length === 0 ? g : { ...g, healthy: false, healthProblems: extra },
    );
    return { ...base, gpus: applyKernelFaults(gpus, tracker.faults()).gpus };
  }

  const run = (node: ReturnType<typeof faultedNode>) =>
    manager({
      inventory: () => node,
      nodeConfig: {
        simCommand: [process.execPath, "-e", "setInterval(() => {}, 1000)", "--"],
        bindHost: "127.0.0.1",
      },
      baseEnv: { PATH: process.env.PATH ?? "/usr/bin:/bin" },
    });

  // The control plane alone knows whether an operator cleared the fault; it placed the
  // replica, so the agent launches it.
  it("launches on a GPU whose only problem is a kernel-log fault", async () => {
    const node = faultedNode();
    expect(node.gpus[0]).toMatchObject({ healthy: false, lost: false });
    const m = run(node);
    await m.apply([simReplicaAssignment()]);
    await expect.poll(() => m.statuses()[0]?.pid, { timeout: 10_000 }).toBeGreaterThan(0);
    expect(m.statuses()[0]?.state).not.toBe(ReplicaState.FAILED);
    await m.close(true);
  });

  it("still refuses a GPU with another health problem beside the fault", async () => {
    const ecc = {
      code: ProblemCodes.gpuEccUncorrected,
      message: "2 uncorrected ECC errors",
      source: "nvidia-smi",
    };
    const m = run(faultedNode([ecc]));
    await m.apply([simReplicaAssignment()]);
    const [status] = m.statuses();
    expect(status?.state).toBe(ReplicaState.FAILED);
    expect(status?.message).toMatch(
      /^LLMGW_ENGINES_GPU_UNHEALTHY: GPU 0 .* is unhealthy: 2 uncorrected ECC errors$/,
    );
    expect(m.managedPids().size).toBe(0);
    await m.close(true);
  });
});

describe("ReplicaManager: engine API keys", () => {
  // A stand-in engine: `node -e <idle> -- <the sim adapter's flags>`; probes are faked.
  const idleEngine = [process.execPath, "-e", "setInterval(() => {}, 1000)", "--"];

  function keyedManager(stateDir: string) {
    const node = simulateInventory("1xh100-80g", { hostname: "node-a" });
    return new ReplicaManager({
      supervisor: createSupervisor({ stateDir: path.join(stateDir, "pids") }),
      stateDir,
      inventory: () => node,
      nodeConfig: { simCommand: idleEngine, bindHost: "127.0.0.1" },
      probes: { probe: async () => "ready", scrapeLoad: async () => ({}) },
      baseEnv: { PATH: process.env.PATH ?? "/usr/bin:/bin" },
      secretEnv: {},
      logger: silentLogger,
      probeIntervalMs: 50,
      probeTimeoutMs: 1000,
      defaultLoadingDeadlineMs: 60_000,
      localAddress: "127.0.0.1",
    });
  }

  const record = (stateDir: string) => path.join(stateDir, "replicas", "m-0.json");
  const pidOf = (m: ReplicaManager) => m.statuses()[0]?.pid;

  it("draws a key per engine process, hands it over by environment, rotates it on restart, and a restarted agent adopts it", async () => {
    const stateDir = tempDir("keys");
    const m = keyedManager(stateDir);
    await m.apply([simReplicaAssignment()]);
    const pid = await until("the engine to run", () => pidOf(m));
    const [credential] = m.engineCredentials();
    expect(credential?.replicaId).toBe("m-0");
    const key = credential!.apiKey;
    expect(key).toMatch(/^llmgw-engine-[A-Za-z0-9_-]{43}$/);
    expect(readFileSync(`/proc/${pid}/environ`, "utf8").split("\0")).toContain(
      `LLMGW_ENGINE_API_KEY=${key}`,
    );
    expect(readFileSync(`/proc/${pid}/cmdline`, "utf8")).not.toContain(key);
    // The replica record keeps the key for adoption, owner-only; statuses never carry it.
    expect(statSync(record(stateDir)).mode & 0o777).toBe(0o600);
    expect(JSON.parse(readFileSync(record(stateDir), "utf8")).engineApiKey).toBe(key);
    expect(
      JSON.stringify(m.statuses(), (_, v) => (typeof v === "bigint" ? String(v) : v)),
    ).not.toContain(key);

    process.kill(pid, "SIGKILL");
    const restarted = await until("a restarted engine", () => {
      const next = pidOf(m);
      return next !== undefined && next !== pid && next;
    });
    const rotated = m.engineCredentials()[0]?.apiKey;
    expect(rotated).not.toBe(key);
    expect(readFileSync(`/proc/${restarted}/environ`, "utf8").split("\0")).toContain(
      `LLMGW_ENGINE_API_KEY=${rotated}`,
    );
    expect(JSON.parse(readFileSync(record(stateDir), "utf8")).engineApiKey).toBe(rotated);

    await m.close(false); // the engine keeps running for the next agent
    const next = keyedManager(stateDir);
    expect(await next.adoptPrevious()).toEqual(["m-0"]);
    expect(pidOf(next)).toBe(restarted);
    expect(next.engineCredentials()).toMatchObject([{ replicaId: "m-0", apiKey: rotated }]);
    await next.close(true);
  });
  it("empties a kvEvents replica's block feed when its engine dies, before the new one publishes", async () => {
    const stateDir = tempDir("kv-restart");
    const m = keyedManager(stateDir);
    const assignment = simReplicaAssignment();
    assignment.deployment!.kvEvents = true;
    await m.apply([assignment]);
    const pid = await until("the engine to run", () => pidOf(m));
    // The stand-in engine publishes nothing: the test publishes on the endpoint it was given.
    const argv = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
    const config = argv[argv.indexOf("--kv-events-config") + 1] ?? "{}";
    const endpoint = (JSON.parse(config) as { endpoint?: string }).endpoint;
    expect(endpoint).toMatch(/^ipc:\/\//);
    const pub = await createKvEventPublisher({ endpoint: endpoint as string });
    try {
      const feed = m.kvFeeds().get("m-0")?.feed;
      expect(feed).toBeDefined();
      const stored = {
        type: "BlockStored" as const,
        blockHashes: [1n],
        tokenIds: [1, 2, 3, 4],
        blockSize: 4,
      };
      await until("the engine's block in the feed", async () => {
        await pub.publish([stored]);
        return feed!.snapshot().added.length === 1;
      });
      const epoch = feed!.stats().epoch;

      process.kill(pid, "SIGKILL");
      await until("a restarted engine", () => {
        const next = pidOf(m);
        return next !== undefined && next !== pid;
      });
      // Nothing was published since: only the agent can have told the feed.
      expect(feed!.snapshot()).toMatchObject({ added: [], snapshot: true });
      expect(feed!.stats().epoch).not.toBe(epoch);
    } finally {
      await pub.close();
      await m.close(true);
    }
  });

  it("keeps the engine on a change engines never see (a scale, a routing change), replaces it on one they do", async () => {
    const stateDir = tempDir("same-launch");
    const m = keyedManager(stateDir);
    const at = (fields: Record<string, unknown>, revision: bigint) => {
      const a = simReplicaAssignment();
      a.deployment = deploymentSpecToProto(
        parseDeploymentSpecOrThrow({ name: "m", model: "org/model", engine: "sim", ...fields }),
      );
      a.deployment.revision = revision;
      return a;
    };
    await m.apply([at({}, 1n)]);
    const pid = await until("the engine to run", () => pidOf(m));
    await m.apply([at({ replicas: 4, routingPolicy: "round-robin", maxSurge: 2 }, 2n)]);
    expect(pidOf(m)).toBe(pid);
    expect(m.statuses()[0]?.revision).toBe(2n);
    // The record a restarted agent adopts from has the new assignment.
    expect(JSON.parse(readFileSync(record(stateDir), "utf8")).assignment).toContain('"replicas":4');
    await m.apply([
      at({ replicas: 4, routingPolicy: "round-robin", extraArgs: ["--seed", "3"] }, 3n),
    ]);
    const replaced = await until("the replacement engine", () => {
      const next = pidOf(m);
      return next !== undefined && next !== pid && next;
    });
    expect(replaced).not.toBe(pid);
    await m.close(true);
  });
});

describe("ReplicaManager: a failed replica is launched afresh", () => {
  /** An engine that serves HTTP on its `--host`/`--port`, and exits 1 when it cannot listen. */
  const httpEngine = [
    process.execPath,
    "-e",
    `const arg = (n) => process.argv[process.argv.indexOf(n) + 1];
     require("node:http").createServer((_, res) => res.end("ok")).listen(Number(arg("--port")), arg("--host"));`,
    "--",
  ];
  /** An engine that exits at once. */
  const crashingEngine = [process.execPath, "-e", "process.exit(1)", "--"];

  function relaunchingManager(engine: string[], extra: Partial<ReplicaManagerOptions> = {}) {
    return manager({
      nodeConfig: { simCommand: engine, bindHost: "127.0.0.1" },
      // A real probe: ready once the engine answers on the port it was given.
      probes: {
        probe: async (baseUrl) => {
          try {
            return (await fetch(`${baseUrl}/health`)).ok ? "ready" : "starting";
          } catch {
            return "starting";
          }
        },
        scrapeLoad: async () => ({}),
      },
      baseEnv: { PATH: process.env.PATH ?? "/usr/bin:/bin" },
      probeIntervalMs: 50,
      // Gives up at the second quick failure, after a 1 s wait.
      restartPolicy: { initialDelayMs: 1000, maxQuickFailures: 2 },
      relaunch: { firstDelayMs: 200, maxDelayMs: 400, stableMs: 60_000 },
      ...extra,
    });
  }

  /** The engine of m-0 once ready (and not `previousPid`). */
  const readyEngine = (m: ReplicaManager, previousPid?: number) =>
    until("the engine to be ready", () => {
      const s = m.statuses()[0];
      return s?.state === ReplicaState.READY && s.pid !== previousPid && s;
    });

  /**
   * Kills the ready engine and takes its port before the supervisor's restart (1 s later):
   * the restart fails to listen, and the restart policy gives up. Resolves the failed status
   * and the port's holder.
   */
  async function failReady(m: ReplicaManager, ready: { pid?: number; apiPort?: number }) {
    process.kill(ready.pid as number, "SIGKILL");
    const squatter = await holdPortOnceFree(ready.apiPort as number);
    const failed = await until("the replica to fail", () => {
      const s = m.statuses()[0];
      return s?.state === ReplicaState.FAILED && s;
    });
    return { failed, squatter };
  }

  it("relaunches on a new port when its own port was taken while it restarted", async () => {
    const m = relaunchingManager(httpEngine);
    await m.apply([simReplicaAssignment()]);
    const first = await readyEngine(m);
    const port = first.apiPort as number;
    const { failed, squatter } = await failReady(m, first);
    try {
      expect(failed.message).toMatch(/; the agent launches it afresh at \d{4}-\d\d-\d\dT/);
      const relaunched = await readyEngine(m, first.pid);
      expect(relaunched.apiPort).not.toBe(port);
      expect(await (await fetch(`http://127.0.0.1:${relaunched.apiPort}/health`)).text()).toBe(
        "ok",
      );
      // The kill's restart and the relaunch.
      expect(relaunched.restarts).toBe(2);
    } finally {
      squatter.close();
      await m.close(true);
    }
  });

  it("backs off between relaunches, and stops relaunching a replica that was withdrawn", async () => {
    const relaunches: number[] = [];
    const attempts: unknown[] = [];
    const logger = {
      info: () => {},
      warn: (message: string, fields: Record<string, unknown> = {}) => {
        if (message !== "launching a failed replica afresh") return;
        relaunches.push(Date.now());
        attempts.push(fields.attempt);
      },
    };
    const m = relaunchingManager(crashingEngine, { logger });
    const started = Date.now();
    await m.apply([simReplicaAssignment()]);
    await until("three relaunches", () => relaunches.length >= 3);
    // Each try: a crash, 1 s, a crash (given up), then 200, 400, 400 ms (the cap).
    const gaps = relaunches.map((at, i) => at - (i === 0 ? started : (relaunches[i - 1] ?? 0)));
    expect(gaps[0]).toBeGreaterThanOrEqual(1000 + 200);
    expect(gaps[1]).toBeGreaterThanOrEqual(1000 + 400);
    expect(gaps[2]).toBeGreaterThanOrEqual(1000 + 400);
    expect(attempts.slice(0, 3)).toEqual([1, 2, 3]);
    await until("the replica to fail again", () => m.statuses()[0]?.state === ReplicaState.FAILED);
    await m.apply([]);
    expect(m.statuses()).toEqual([]);
    const seen = relaunches.length;
    // Longer than the largest delay: a relaunch still scheduled would have run.
    await new Promise((r) => setTimeout(r, 600));
    expect(relaunches.length).toBe(seen);
    await m.close(true);
  });

  it("launches again an engine that could not be spawned, once its program exists", async () => {
    const bin = tempDir("bin");
    const program = path.join(bin, "engine");
    const m = relaunchingManager([program, "-e", "setInterval(() => {}, 1000)", "--"], {
      probes: { probe: async () => "ready", scrapeLoad: async () => ({}) },
    });
    await m.apply([simReplicaAssignment()]);
    const refused = m.statuses()[0];
    expect(refused?.state).toBe(ReplicaState.FAILED);
    expect(refused?.message).toMatch(
      /^launch failed: cannot spawn .*engine.*; the agent launches it afresh at \d{4}-/,
    );
    // The program is installed meanwhile (here: node itself, under that name).
    symlinkSync(process.execPath, program);
    const running = await until("the engine to run", () => {
      const s = m.statuses()[0];
      return s?.state === ReplicaState.READY && s;
    });
    expect(readFileSync(`/proc/${running.pid}/cmdline`, "utf8")).toContain("setInterval");
    expect(running.restarts).toBe(1);
    await m.close(true);
  });

  it("a restarted agent reports a record it cannot launch again FAILED, adopts the rest, and launches it later", async () => {
    const stateDir = tempDir("adopt");
    const bin = tempDir("bin");
    const program = path.join(bin, "engine");
    symlinkSync(process.execPath, program);
    const node = simulateInventory("2xh100-80g", { hostname: "node-a" });
    const agent = (extra: Partial<ReplicaManagerOptions> = {}) =>
      relaunchingManager([program, "-e", "setInterval(() => {}, 1000)", "--"], {
        stateDir,
        supervisor: createSupervisor({ stateDir: path.join(stateDir, "pids") }),
        inventory: () => node,
        probes: { probe: async () => "ready", scrapeLoad: async () => ({}) },
        ...extra,
      });
    const served = simReplicaAssignment();
    // Sorted before m-0: the records after it must still be adopted.
    const unlaunchable = simReplicaAssignment();
    unlaunchable.replicaId = "a-0";
    unlaunchable.gpuIndices = [1];
    const stateOf = (m: ReplicaManager, id: string) => m.statuses().find((s) => s.replicaId === id);

    // The previous agent leaves m-0 running and a record of a-0, whose program is gone (as
    // after a reboot with a mount not back). It neither restarts nor relaunches anything.
    const previous = agent({
      restartPolicy: { maxQuickFailures: 1 },
      relaunch: { firstDelayMs: 0, maxDelayMs: 0, stableMs: 0 },
    });
    await previous.apply([served]);
    const pid = await until("m-0 to be ready", () => {
      const s = stateOf(previous, "m-0");
      return s?.state === ReplicaState.READY && s.pid;
    });
    rmSync(program);
    await previous.apply([unlaunchable, served]);
    expect(stateOf(previous, "a-0")?.state).toBe(ReplicaState.FAILED);
    await previous.close(false);

    const next = agent();
    try {
      expect(await next.adoptPrevious()).toEqual(["m-0"]);
      expect(stateOf(next, "m-0")).toMatchObject({ state: ReplicaState.READY, pid });
      const refused = stateOf(next, "a-0");
      expect(refused?.state).toBe(ReplicaState.FAILED);
      expect(refused?.message).toMatch(
        /^launch failed: cannot spawn .*engine.*; the agent launches it afresh at \d{4}-/,
      );
      // The program is back: the relaunch scheduled at adoption runs it.
      symlinkSync(process.execPath, program);
      const running = await until("a-0 to run", () => {
        const s = stateOf(next, "a-0");
        return s?.state === ReplicaState.READY && s;
      });
      expect(running.restarts).toBe(1);
    } finally {
      await next.close(true);
      await previous.close(true); // m-0, should the next agent not have adopted it
    }
  });

  it("a withdrawn replica that could not be launched leaves no record for a restarted agent", async () => {
    const stateDir = tempDir("withdrawn");
    const bin = tempDir("bin");
    const program = path.join(bin, "engine");
    const agent = () =>
      relaunchingManager([program, "-e", "setInterval(() => {}, 1000)", "--"], {
        stateDir,
        supervisor: createSupervisor({ stateDir: path.join(stateDir, "pids") }),
        probes: { probe: async () => "ready", scrapeLoad: async () => ({}) },
        relaunch: { firstDelayMs: 0, maxDelayMs: 0, stableMs: 0 },
      });
    const previous = agent();
    await previous.apply([simReplicaAssignment()]);
    expect(previous.statuses()[0]?.state).toBe(ReplicaState.FAILED);
    await previous.apply([]);
    expect(previous.statuses()).toEqual([]);
    await previous.close(false);

    // The program is back by the time the next agent starts: a record left would launch it.
    symlinkSync(process.execPath, program);
    const next = agent();
    try {
      expect(await next.adoptPrevious()).toEqual([]);
      expect(next.statuses()).toEqual([]);
    } finally {
      await next.close(true);
    }
  });

  it("starts the backoff over once a relaunched replica served for stableMs", async () => {
    const m = relaunchingManager(httpEngine, {
      relaunch: { firstDelayMs: 200, maxDelayMs: 3200, stableMs: 400 },
    });
    await m.apply([simReplicaAssignment()]);
    /** The wait the failed status announces: its relaunch time less when it failed. */
    const announcedDelay = (s: { message: string; stateSinceUnixMs?: bigint }) =>
      Date.parse(/launches it afresh at (\S+)$/.exec(s.message)?.[1] ?? "") -
      Number(s.stateSinceUnixMs);
    const ready = await readyEngine(m);
    const first = await failReady(m, ready);
    expect(announcedDelay(first.failed)).toBeGreaterThanOrEqual(200);
    expect(announcedDelay(first.failed)).toBeLessThan(400);
    first.squatter.close();
    // Relaunched (try 1) and ready for longer than stableMs, then failed again: 200 ms again,
    // where a replica that did not serve that long waits 400.
    const relaunched = await readyEngine(m, ready.pid);
    await new Promise((r) => setTimeout(r, 500));
    const again = await failReady(m, relaunched);
    try {
      expect(announcedDelay(again.failed)).toBeGreaterThanOrEqual(200);
      expect(announcedDelay(again.failed)).toBeLessThan(400);
    } finally {
      again.squatter.close();
      await m.close(true);
    }
  });

  it("a replica record that cannot be written fails the launch, and is tried again", async () => {
    const stateDir = tempDir("records");
    const m = relaunchingManager(httpEngine, { stateDir });
    // A record that cannot be written, as on a full disk: a file where its directory goes.
    const records = path.join(stateDir, "replicas");
    writeFileSync(records, "");
    await m.apply([simReplicaAssignment()]);
    const refused = m.statuses()[0];
    expect(refused?.state).toBe(ReplicaState.FAILED);
    expect(refused?.message).toMatch(/^launch failed: .*; the agent launches it afresh at /);
    expect(m.managedPids().size).toBe(0);
    rmSync(records);
    await until("the engine to be ready", () => m.statuses()[0]?.state === ReplicaState.READY);
    expect(statSync(path.join(records, "m-0.json")).isFile()).toBe(true);
    await m.close(true);
  });

  it("doubles the wait up to its cap", () => {
    const delays = [0, 1, 2, 5, 6, 40].map((n) => relaunchDelayMs(RELAUNCH_DEFAULTS, n));
    expect(delays).toEqual([60_000, 120_000, 240_000, 1_800_000, 1_800_000, 1_800_000]);
    expect(relaunchDelayMs({ firstDelayMs: 5000, maxDelayMs: 1000, stableMs: 0 }, 3)).toBe(5000);
  });
});

/** A stand-in engine: `node -e <idle> -- <the sim adapter's flags>`. */
const IDLE_ENGINE = [process.execPath, "-e", "setInterval(() => {}, 1000)", "--"];

/** A manager of {@link IDLE_ENGINE}s in `stateDir`. */
function idleAgent(stateDir: string, extra: Partial<ReplicaManagerOptions> = {}) {
  return manager({
    stateDir,
    supervisor: createSupervisor({ stateDir: path.join(stateDir, "pids") }),
    nodeConfig: { simCommand: IDLE_ENGINE, bindHost: "127.0.0.1" },
    baseEnv: { PATH: process.env.PATH ?? "/usr/bin:/bin" },
    probeIntervalMs: 50,
    ...extra,
  });
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

/**
 * A previous agent launches m-0 from `assignment` and leaves it running, gone as if its
 * process ended (it neither restarts nor relaunches what it left); the engine's pid.
 */
async function leftRunning(
  stateDir: string,
  assignment: ReplicaAssignment,
  extra: Partial<ReplicaManagerOptions> = {},
) {
  const previous = idleAgent(stateDir, {
    restartPolicy: { maxQuickFailures: 1 },
    relaunch: { firstDelayMs: 0, maxDelayMs: 0, stableMs: 0 },
    ...extra,
  });
  await previous.apply([assignment]);
  const pid = await until("the engine to be ready", () => {
    const s = previous.statuses()[0];
    return s?.state === ReplicaState.READY && s.pid;
  });
  await previous.close(false);
  return pid;
}

describe("ReplicaManager: adopting an engine whose spec this release refuses", () => {
  const agent = (stateDir: string, extra: Partial<ReplicaManagerOptions> = {}) =>
    idleAgent(stateDir, {
      restartPolicy: { initialDelayMs: 100 },
      relaunch: { firstDelayMs: 100, maxDelayMs: 100, stableMs: 60_000 },
      ...extra,
    });

  /** m-0 with `extraArgs` and `fields`, as the release that accepted it parsed it. */
  function withArgs(extraArgs: string[], fields: Record<string, unknown> = {}) {
    const a = simReplicaAssignment();
    a.deployment = deploymentSpecToProto(
      parseDeploymentSpecOrThrow({
        name: "m",
        model: "org/model",
        engine: "sim",
        extraArgs,
        ...fields,
      }),
    );
    return a;
  }

  /**
   * Runs `during` with the sim engine's `-x` owned, as a release that took the flag over
   * after an older one accepted it would.
   */
  async function whileOwned<T>(during: () => Promise<T>): Promise<T> {
    const owned = OWNED_SHORT_FLAGS.sim as string[];
    owned.push("-x");
    try {
      return await during();
    } finally {
      owned.splice(owned.indexOf("-x"), 1);
    }
  }

  const previousAgent = (stateDir: string, assignment = withArgs(["-x", "1"]), extra = {}) =>
    leftRunning(stateDir, assignment, extra);

  it("adopts and supervises it, says so, and reports it failed instead of launching it when it exits", async () => {
    const stateDir = tempDir("refused");
    // What the control plane stored, as the older release that accepted it parsed it.
    const stored = withArgs(["-x", "1"]);
    const pid = await previousAgent(stateDir, stored);
    await whileOwned(async () => {
      const warned: { message: string; fields: Record<string, unknown> }[] = [];
      const launched: unknown[] = [];
      const logger = {
        info: (message: string) => {
          if (message === "process spawned") launched.push(message);
        },
        warn: (message: string, fields: Record<string, unknown> = {}) =>
          void warned.push({ message, fields }),
      };
      const next = agent(stateDir, {
        supervisor: createSupervisor({ stateDir: path.join(stateDir, "pids"), logger }),
        logger,
      });
      try {
        expect(await next.adoptPrevious()).toEqual(["m-0"]);
        const [adopted] = next.statuses();
        expect(adopted).toMatchObject({ state: ReplicaState.READY, pid, adopted: true });
        expect(adopted?.message).toContain('"-x" would set -x, which llmgw owns for sim');
        expect(next.managedPids()).toEqual(new Set([pid]));
        const said = warned.filter((w) => String(w.fields.error).includes('"-x" would set -x'));
        expect(said).toHaveLength(1);
        expect(said[0]?.fields).toMatchObject({
          replicaId: "m-0",
          code: "LLMGW_ENGINES_INVALID_SPEC",
        });

        // The control plane keeps sending the unchanged assignment: nothing changes.
        await next.apply([stored]);
        expect(next.statuses()[0]).toMatchObject({ state: ReplicaState.READY, pid });

        process.kill(pid, "SIGKILL");
        const failed = await until("the replica to fail", () => {
          const s = next.statuses()[0];
          return s?.state === ReplicaState.FAILED && s;
        });
        expect(failed.message).toContain('"-x" would set -x, which llmgw owns for sim');
        expect(failed.message).not.toContain("launches it afresh");
        // Longer than the restart and relaunch delays: neither ran.
        await new Promise((r) => setTimeout(r, 600));
        expect(next.statuses()[0]?.state).toBe(ReplicaState.FAILED);
        expect(next.managedPids().size).toBe(0);
        expect(launched).toEqual([]);

        // The corrected spec is an ordinary launch.
        await next.apply([withArgs([])]);
        const corrected = await until("the corrected engine", () => {
          const s = next.statuses()[0];
          return s?.state === ReplicaState.READY && s;
        });
        expect(corrected.pid).not.toBe(pid);
        expect(corrected.message).not.toContain("owns");
      } finally {
        await next.close(true);
        // An engine left orphaned (what this test guards against) must not outlive it.
        if (alive(pid)) process.kill(-pid, "SIGKILL");
      }
    });
  });

  it("stops, and launches nothing for, an engine of a refused spec started from another launch spec", async () => {
    const stateDir = tempDir("refused");
    const stored = withArgs(["-x", "1"]);
    const pid = await previousAgent(stateDir, stored);
    await whileOwned(async () => {
      // This release launches sim otherwise: the engine running is not what the spec gives.
      const next = agent(stateDir, {
        nodeConfig: {
          simCommand: [...IDLE_ENGINE.slice(0, -1), "--", "--new"],
          bindHost: "127.0.0.1",
        },
      });
      try {
        expect(await next.adoptPrevious()).toEqual([]);
        expect(alive(pid)).toBe(false);
        const [failed] = next.statuses();
        expect(failed?.state).toBe(ReplicaState.FAILED);
        expect(failed?.message).toMatch(/^no running process to adopt; this release refuses/);
        expect(failed?.message).toContain('"-x" would set -x, which llmgw owns for sim');
        await next.apply([stored]);
        await new Promise((r) => setTimeout(r, 300));
        expect(next.statuses()[0]?.state).toBe(ReplicaState.FAILED);
        expect(next.managedPids().size).toBe(0);
      } finally {
        await next.close(true);
        if (alive(pid)) process.kill(-pid, "SIGKILL");
      }
    });
  });
});

describe("ReplicaManager: an engine left running for a replica the agent refuses", () => {
  const agent = (stateDir: string, extra: Partial<ReplicaManagerOptions> = {}) =>
    idleAgent(stateDir, {
      restartPolicy: { maxQuickFailures: 1 },
      relaunch: { firstDelayMs: 0, maxDelayMs: 0, stableMs: 0 },
      ...extra,
    });
  const trusting = () => {
    const a = simReplicaAssignment();
    a.deployment = deploymentSpecToProto(
      parseDeploymentSpecOrThrow({
        name: "m",
        model: "org/model",
        engine: "sim",
        trustRemoteCode: true,
      }),
    );
    return a;
  };
  const trustingLeftRunning = (stateDir: string) =>
    leftRunning(stateDir, trusting(), { allowTrustRemoteCode: true });

  it("stops it when the replica is refused at adoption, and leaves nothing when it is withdrawn", async () => {
    const stateDir = tempDir("orphan");
    const pid = await trustingLeftRunning(stateDir);
    // The operator took --allow-trust-remote-code away before restarting the agent.
    const next = agent(stateDir);
    try {
      expect(await next.adoptPrevious()).toEqual([]);
      const [refused] = next.statuses();
      expect(refused?.state).toBe(ReplicaState.FAILED);
      expect(refused?.message).toContain("--allow-trust-remote-code");
      await until("the engine left running to be stopped", () => !alive(pid));
      await next.apply([]);
      expect(next.statuses()).toEqual([]);
      expect(await next.adoptPrevious()).toEqual([]);
    } finally {
      await next.close(true);
      if (alive(pid)) process.kill(-pid, "SIGKILL");
    }
  });

  it("stops it when its record cannot be read", async () => {
    const stateDir = tempDir("orphan");
    const pid = await trustingLeftRunning(stateDir);
    writeFileSync(path.join(stateDir, "replicas", "m-0.json"), "{not json");
    const next = agent(stateDir);
    try {
      expect(await next.adoptPrevious()).toEqual([]);
      await until("the engine left running to be stopped", () => !alive(pid));
      expect(next.statuses()).toEqual([]);
    } finally {
      await next.close(true);
      if (alive(pid)) process.kill(-pid, "SIGKILL");
    }
  });
});
