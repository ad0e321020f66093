import {
  appendFileSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  renameSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { startControlPlane } from "@llmgw/control-plane";
import { ProblemCodes, simulateInventory } from "@llmgw/discovery";
import { type FakeNvidiaSmiRule, writeFakeNvidiaSmi } from "@llmgw/discovery/testing";
import { silentLogger } from "@llmgw/supervisor";
import { RecordingLogger } from "@llmgw/supervisor/testing";
import { afterEach, describe, expect, it } from "vitest";
import { simReplicaAssignment } from "../test/assignments.js";
import { kernelLogPath, parseAgentConfig } from "./config.js";
import { isAgentError } from "./errors.js";
import { probeAddress, type RunningAgent, startAgent, withInventoryFacts } from "./run.js";

describe("probeAddress", () => {
  it.each([
    ["10.0.0.5", "10.0.0.5"],
    ["127.0.0.1", "127.0.0.1"],
    // Wildcard binds accept loopback, and a probe cannot connect to the wildcard itself.
    ["0.0.0.0", "127.0.0.1"],
    ["::", "::1"],
    ["[::]", "::1"],
    ["fd00::5", "fd00::5"],
    ["[fd00::5]", "fd00::5"],
  ])("an engine bound to %s is probed at %s", (bind, probe) => {
    expect(probeAddress(bind)).toBe(probe);
  });
});

describe("kernelLogPath", () => {
  it.each([
    [{}, "/dev/kmsg"],
    [{ simulate: "2xh100-80g" }, undefined],
    [{ simulate: "2xh100-80g", kernelLog: "/tmp/k.log" }, "/tmp/k.log"],
    [{ kernelLog: "off" }, undefined],
    [{ kernelLog: "/var/log/kern.log" }, "/var/log/kern.log"],
  ])("%j → %s", (config, expected) => {
    expect(kernelLogPath(config)).toBe(expected);
  });

  it("refuses an empty --kernel-log", () => {
    expect(() =>
      parseAgentConfig({
        controlPlaneUrl: "http://127.0.0.1:9",
        joinToken: "j".repeat(20),
        stateDir: "/tmp/x",
        kernelLog: "",
      }),
    ).toThrow('kernelLog: must be a path or "off"');
  });
});

// Verbatim lines from shared/reference/health-formats.md §1.3 (dxvk#1027, the driver's Xid 94
// format comment, open-gpu-kernel-modules#1151). A simulated GPU i sits at PCI bus i+1, so
// `PCI:0000:01:00` is GPU 0 and `PCI:0000:06:00` GPU 5.
const XID_31_GPU0 =
  "[  365.969681] NVRM: Xid (PCI:0000:01:00): 31, pid=13705, name=UnrealEditor, channel 0x0000000c, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC2 GPCCLIENT_PROP_0 faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ";
const XID_94_GPU0 =
  "NVRM: Xid (PCI:0000:01:00): 94, pid=7062, Contained: CE User Channel (0x9). RST: No, D-RST: No";
const XID_79_GPU5 = "NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.";
// §1.3 verbatim but for its PCI id (bus dc → the simulated GPU 0's 01); pid 1818990 is gone.
const XID_45_GPU0 =
  "kernel: NVRM: Xid (PCI:0000:01:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149";

/** Assigns one sim replica ("m-0") to GPU 0 and waits for its engine; returns its status. */
async function runSimReplicaOnGpu0(running: RunningAgent) {
  await running.manager.apply([simReplicaAssignment()]);
  const status = () => running.manager.statuses()[0];
  await expect.poll(() => status()?.pid, { timeout: 10_000 }).toBeGreaterThan(0);
  return status;
}

describe("startAgent with a kernel log", () => {
  const dirs: string[] = [];
  let agent: RunningAgent | undefined;
  afterEach(async () => {
    await agent?.close({ stopEngines: true });
    agent = undefined;
    for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
  });

  it("applies boot-time faults, restarts engines only for a live restart-engine Xid, and takes GPUs out for an Xid 79", async () => {
    const stateDir = mkdtempSync(path.join(tmpdir(), "llmgw-run-kernel-log-"));
    dirs.push(stateDir);
    const log = path.join(stateDir, "kern.log");
    writeFileSync(log, `${XID_31_GPU0}\n`);
    agent = await startAgent(
      parseAgentConfig({
        // Nothing listens there: the channel keeps retrying, which this test does not need.
        controlPlaneUrl: "http://127.0.0.1:9",
        joinToken: "j".repeat(20),
        stateDir,
        simulate: "6xh100-80g",
        kernelLog: log,
        engines: { simCommand: [process.execPath, "-e", "setInterval(() => {}, 1000)", "--"] },
      }),
      {
        logger: silentLogger,
        probes: { probe: async () => "ready", scrapeLoad: async () => ({}) },
        baseEnv: { PATH: process.env.PATH ?? "/usr/bin:/bin" },
        secretEnv: {},
        agentVersion: "0.0.0-test",
        kernelLog: { pollMs: 10 },
      },
    );
    const running = agent;
    // The boot-time Xid 31 is in the very first inventory; restart-engine leaves health alone.
    const gpu0 = () => running.inventory().gpus[0]!;
    expect(gpu0().faults?.map((f) => [f.code, f.action])).toEqual([[31, "restart-engine"]]);
    expect(gpu0().healthy).toBe(true);

    const status = await runSimReplicaOnGpu0(running);
    const firstPid = status()!.pid;

    // A live Xid 94 burst (two records) on GPU 0, logged for the engine's own pid (the §1.3
    // line with its pid replaced): one restart through the crash path.
    const ownXid94 = XID_94_GPU0.replace("pid=7062", `pid=${firstPid}`);
    appendFileSync(log, `${ownXid94}\n${ownXid94}\n`);
    await expect
      .poll(() => [status()?.restarts, status()?.pid !== firstPid && status()?.pid !== undefined], {
        timeout: 15_000,
      })
      .toEqual([1, true]);
    expect(running.kernelLog?.faults().map((f) => [f.code, f.count])).toEqual([
      [31, 1],
      [94, 2],
    ]);

    // Xid 79 reboots the node: every GPU unhealthy, with the evidence.
    appendFileSync(log, `${XID_79_GPU5}\n`);
    await expect.poll(() => running.inventory().gpus.filter((g) => g.healthy).length).toBe(0);
    const problem = gpu0().healthProblems.find((p) => p.code === ProblemCodes.gpuFault);
    expect(problem?.message).toContain("Xid 79 (GPU has fallen off the bus) on 00000000:06:00.0");
    expect(problem?.message).toContain(`evidence: ${XID_79_GPU5}`);
    expect(status()?.restarts).toBe(1);
  }, 40_000);

  it("restarts engines only for an Xid whose pid is an engine's or its worker's, never another program's", async () => {
    const stateDir = mkdtempSync(path.join(tmpdir(), "llmgw-run-kernel-log-"));
    dirs.push(stateDir);
    const log = path.join(stateDir, "kern.log");
    writeFileSync(log, "");
    const logger = new RecordingLogger();
    agent = await startAgent(
      parseAgentConfig({
        controlPlaneUrl: "http://127.0.0.1:9",
        joinToken: "j".repeat(20),
        stateDir,
        simulate: "1xh100-80g",
        kernelLog: log,
        // An engine with one worker process, as vLLM and SGLang run theirs.
        engines: {
          simCommand: [
            process.execPath,
            "-e",
            "require('node:child_process').spawn('sleep', ['60'], { stdio: 'ignore' }); setInterval(() => {}, 1000)",
            "--",
          ],
        },
      }),
      {
        logger,
        probes: { probe: async () => "ready", scrapeLoad: async () => ({}) },
        baseEnv: { PATH: process.env.PATH ?? "/usr/bin:/bin" },
        secretEnv: {},
        agentVersion: "0.0.0-test",
        kernelLog: { pollMs: 10 },
      },
    );
    const running = agent;
    const status = await runSimReplicaOnGpu0(running);
    const enginePid = status()!.pid as number;
    const childrenOf = (pid: number) => {
      try {
        return readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").trim();
      } catch {
        return "";
      }
    };
    await expect.poll(() => childrenOf(enginePid), { timeout: 10_000 }).toMatch(/^\d+$/);
    const workerPid = Number(childrenOf(enginePid));

    // The §1.3 Xid 94 with its pid replaced by this test runner's, a live process that is no
    // engine of llmgw's (another program sharing the GPU). Nothing restarts.
    appendFileSync(log, `${XID_94_GPU0.replace("pid=7062", `pid=${process.pid}`)}\n`);
    await expect
      .poll(() => logger.lines.map((l) => l.message), { timeout: 10_000 })
      .toContain(
        `kernel log: xid-94 (Contained memory error) names pid ${process.pid}, which is not an engine llmgw runs; its engines are not restarted`,
      );
    // An Xid 45 from a process that is gone: the teardown a stopped process leaves. Nothing.
    appendFileSync(log, `${XID_45_GPU0}\n`);
    await expect
      .poll(() => logger.lines.map((l) => l.message), { timeout: 10_000 })
      .toContain(
        "kernel log: xid-45 (Preemptive cleanup, due to previous errors) names pid 1818990, which is gone (Xid 45 is the teardown a stopped process leaves); its engines are not restarted",
      );
    expect([status()?.restarts, status()?.pid]).toEqual([0, enginePid]);

    // The §1.3 Xid 31 with its pid replaced by the engine's worker's: one restart.
    appendFileSync(log, `${XID_31_GPU0.replace("pid=13705", `pid=${workerPid}`)}\n`);
    await expect
      .poll(
        () => [status()?.restarts, status()?.pid !== enginePid && status()?.pid !== undefined],
        {
          timeout: 15_000,
        },
      )
      .toEqual([1, true]);
  }, 40_000);

  it("reports an unreadable kernel log as a node problem and keeps running", async () => {
    const stateDir = mkdtempSync(path.join(tmpdir(), "llmgw-run-kernel-log-"));
    dirs.push(stateDir);
    const missing = path.join(stateDir, "missing.log");
    agent = await startAgent(
      parseAgentConfig({
        controlPlaneUrl: "http://127.0.0.1:9",
        joinToken: "j".repeat(20),
        stateDir,
        simulate: "1xh100-80g",
        kernelLog: missing,
      }),
      {
        logger: silentLogger,
        probes: { probe: async () => "ready", scrapeLoad: async () => ({}) },
        baseEnv: {},
        secretEnv: {},
        agentVersion: "0.0.0-test",
      },
    );
    expect(agent.inventory().problems.map((p) => p.code)).toContain(
      ProblemCodes.kernelLogUnreadable,
    );
    expect(agent.inventory().problems.find((p) => p.source === "kernel-log")?.message).toContain(
      `${missing} (ENOENT)`,
    );
  });

  it("watches nothing on a simulated node unless told to", async () => {
    const stateDir = mkdtempSync(path.join(tmpdir(), "llmgw-run-kernel-log-"));
    dirs.push(stateDir);
    agent = await startAgent(
      parseAgentConfig({
        controlPlaneUrl: "http://127.0.0.1:9",
        joinToken: "j".repeat(20),
        stateDir,
        simulate: "1xh100-80g",
      }),
      {
        logger: silentLogger,
        probes: { probe: async () => "ready", scrapeLoad: async () => ({}) },
        baseEnv: {},
        secretEnv: {},
        agentVersion: "0.0.0-test",
      },
    );
    expect(agent.kernelLog).toBeUndefined();
  });
});

/**
 * A real control plane on loopback (200 ms heartbeats) and an agent joined to it, both closed
 * by the returned `close`. `config` is merged over the joining settings.
 */
async function agentWithControlPlane(
  dir: string,
  config: Omit<
    Parameters<typeof parseAgentConfig>[0],
    "controlPlaneUrl" | "joinToken" | "stateDir"
  >,
  deps: { kernelLog?: { pollMs: number; bootTimeMs?: number } } = {},
) {
  const cp = await startControlPlane({
    dataDir: path.join(dir, "cp"),
    listen: "127.0.0.1:0",
    controlListen: "127.0.0.1:0",
    heartbeatIntervalMs: 200,
  });
  const agent = await startAgent(
    parseAgentConfig({
      controlPlaneUrl: cp.controlUrl,
      joinToken: cp.joinToken,
      stateDir: path.join(dir, "agent"),
      ...config,
    }),
    {
      logger: silentLogger,
      probes: { probe: async () => "ready", scrapeLoad: async () => ({}) },
      baseEnv: {},
      secretEnv: {},
      agentVersion: "0.0.0-test",
      ...deps,
    },
  );
  await expect.poll(() => agent.channelState(), { timeout: 10_000 }).toBe("connected");
  return {
    cp,
    agent,
    close: async () => {
      // Not a leave: the control plane goes too, and its single node has nowhere to drain to.
      await agent.close({ stopEngines: true, leaveTimeoutMs: 0 });
      await cp.close();
    },
  };
}

describe("startAgent reading a kern.log after a reboot", () => {
  const dirs: string[] = [];
  const closers: (() => Promise<void>)[] = [];
  afterEach(async () => {
    for (const close of closers.splice(0).reverse()) await close();
    for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
  });

  it("reports the earlier boot's Xid 48 and Xid 79 but keeps the GPUs and node in service; this boot's Xid 48 takes its GPU out", async () => {
    const dir = mkdtempSync(path.join(tmpdir(), "llmgw-run-reboot-"));
    dirs.push(dir);
    // §1.3 (gpu-operator#1146, open-gpu-kernel-modules#1151) with dmesg stamps of a boot that
    // ran a week, on the simulated GPUs 0 and 1; this boot is ten minutes old.
    const XID_48 =
      "NVRM: Xid (PCI:0000:01:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.";
    const log = path.join(dir, "kern.log");
    writeFileSync(
      log,
      `[604800.000001] ${XID_48}\n[605633.376794] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.\n`,
    );
    const { cp, agent, close } = await agentWithControlPlane(
      dir,
      { simulate: "2xh100-80g", kernelLog: log, readingsIntervalMs: 50 },
      { kernelLog: { pollMs: 10, bootTimeMs: Date.now() - 600_000 } },
    );
    closers.push(close);
    const gpus = () => agent.inventory().gpus;
    expect(gpus().map((g) => g.faults?.map((f) => [f.code, f.action]))).toEqual([
      [[48, "ignore"]],
      [[79, "ignore"]],
    ]);
    expect(gpus()[0]!.faults?.[0]?.description).toBe(
      "Double Bit ECC Error (earlier boot: catalog action reset-gpu, not taken on this boot; the reboot reset the GPU)",
    );
    expect(gpus().map((g) => g.healthy)).toEqual([true, true]);
    expect(agent.kernelLog?.stats().earlierBootFaults).toBe(2);
    const cpHealthy = () => cp.cluster.listNodes()[0]?.gpuReadings.map((r) => r.healthy);
    await expect.poll(cpHealthy, { timeout: 10_000 }).toEqual([true, true]);

    // This boot's own Xid 48 on GPU 0 acts as ever.
    appendFileSync(log, `[  599.000001] ${XID_48}\n`);
    await expect
      .poll(() => gpus().map((g) => g.healthy), { timeout: 10_000 })
      .toEqual([false, true]);
    await expect.poll(cpHealthy, { timeout: 10_000 }).toEqual([false, true]);
  }, 40_000);
});

describe("startAgent on a real node whose nvidia-smi stops answering", () => {
  const dirs: string[] = [];
  const closers: (() => Promise<void>)[] = [];
  afterEach(async () => {
    for (const close of closers.splice(0).reverse()) await close();
    for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
  });

  // The real H100 idle row of formats.md §1.3 in the nounits projection discovery's fixture
  // query-gpu-h100-idle.txt uses: a driver that answers only these twelve cells.
  const H100_IDLE =
    "0, GPU-00000000-0000-0000-0000-000000000000, NVIDIA H100 80GB HBM3, 81559, 0, 00000000:00:09.0, 9.0, 0, 41, 69.85, Disabled, 0\n";
  // health-formats.md §2.5: on stdout, exit 255 (gpustack#2078).
  const NVML_FAILED = "Failed to initialize NVML: Unknown Error\n";

  it("keeps reporting its GPU, unhealthy with nvidia-smi's own problem, so an Xid 79 still lands on it", async () => {
    const dir = mkdtempSync(path.join(tmpdir(), "llmgw-run-smi-"));
    dirs.push(dir);
    const smi = path.join(dir, "bin", "nvidia-smi");
    /** Swaps the fake in with one rename, so a read in flight never runs a half-written script. */
    const answer = async (name: string, rules: FakeNvidiaSmiRule[]) => {
      mkdirSync(path.dirname(smi), { recursive: true });
      renameSync(await writeFakeNvidiaSmi(path.join(dir, name), rules), smi);
    };
    await answer("healthy", [{ when: ["--query-gpu"], stdout: H100_IDLE }]);
    const log = path.join(dir, "kern.log");
    writeFileSync(log, "");
    const { cp, agent, close } = await agentWithControlPlane(
      dir,
      {
        nvidiaSmiPath: smi,
        sysfsRoot: path.join(dir, "no-sysfs"),
        kernelLog: log,
        readingsIntervalMs: 50,
        advertiseAddress: "127.0.0.1",
      },
      { kernelLog: { pollMs: 10 } },
    );
    closers.push(close);
    expect(agent.inventory().gpus.map((g) => [g.index, g.healthy])).toEqual([[0, true]]);
    const events = (kind: string) =>
      cp.cluster.events
        .list()
        .filter((e) => e.kind === kind)
        .map((e) => e.message);

    // NVML cannot start: readings come back with no GPU rows at all.
    await answer("nvml", [{ when: ["--query-gpu"], stdout: NVML_FAILED, exitCode: 255 }]);
    await expect
      .poll(() => events("gpu.health"), { timeout: 10_000 })
      .toEqual([
        expect.stringMatching(
          /^GPU 0 on \S+ is now unhealthy: GPU 0 \(GPU-00000000-0000-0000-0000-000000000000\) could not be read: nvidia-smi --query-gpu failed \(exit 255\): Failed to initialize NVML: Unknown Error: .*; its last reading \(\S+\) is reported$/,
        ),
      ]);

    // The GPU fell off the bus: the kernel log's Xid 79 has a GPU to attach to.
    appendFileSync(log, `${XID_79_GPU5}\n`);
    await expect
      .poll(() => events("gpu.fault"), { timeout: 10_000 })
      .toEqual([expect.stringMatching(/^GPU 0 on \S+: Xid 79 \(reboot: out of service/)]);
  }, 30_000);
});

describe("startAgent with RDMA port health", () => {
  const dirs: string[] = [];
  const closers: (() => Promise<void>)[] = [];
  afterEach(async () => {
    for (const close of closers.splice(0).reverse()) await close();
    for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
  });

  /** One IB port's sysfs files (health-formats.md §3.1 shapes: `<n>: <NAME>\n`, counters). */
  function writePort(root: string, state: "4: ACTIVE" | "1: DOWN", linkDowned: number) {
    const dir = path.join(root, "mlx5_0", "ports", "1");
    mkdirSync(path.join(dir, "counters"), { recursive: true });
    writeFileSync(path.join(dir, "state"), `${state}\n`);
    writeFileSync(
      path.join(dir, "phys_state"),
      state === "1: DOWN" ? "2: Polling\n" : "5: LinkUp\n",
    );
    writeFileSync(path.join(dir, "rate"), "400 Gb/sec (4X NDR)\n");
    writeFileSync(path.join(dir, "link_layer"), "InfiniBand\n");
    writeFileSync(path.join(dir, "counters", "link_downed"), `${linkDowned}\n`);
    writeFileSync(path.join(dir, "counters", "symbol_error"), "0\n");
  }

  it("a port that went down reaches the control plane in a heartbeat, on its fabric, as unhealthy", async () => {
    const dir = mkdtempSync(path.join(tmpdir(), "llmgw-run-ports-"));
    dirs.push(dir);
    const sysfs = path.join(dir, "sys-class-infiniband");
    writePort(sysfs, "4: ACTIVE", 0);
    const { cp, close } = await agentWithControlPlane(dir, {
      // The simulated fabric's first port is mlx5_0/1, the device the tree above holds.
      simulate: "1xh100-80g@ib-a",
      sysfsRoot: sysfs,
      portHealthIntervalMs: 50,
    });
    closers.push(close);

    // A drop and recovery between two reads: link_downed +1 while the port reads ACTIVE,
    // which the default thresholds take as unhealthy on any increase (health-formats.md §3.3).
    writePort(sysfs, "4: ACTIVE", 1);
    await expect
      .poll(
        () =>
          cp.cluster.events
            .list()
            .filter((e) => e.kind === "port.health")
            .map((e) => e.message),
        { timeout: 10_000 },
      )
      .toEqual([
        expect.stringMatching(
          /^port mlx5_0\/1 \(fabric ib-a\) on .* is now unhealthy: .*link_downed rose by 1/,
        ),
      ]);
  }, 30_000);
});

describe("--port-thresholds", () => {
  const base = {
    controlPlaneUrl: "http://127.0.0.1:9",
    joinToken: "j".repeat(20),
    stateDir: "/tmp/x",
  };
  it("accepts thresholds over the defaults and refuses an unknown key by name at start", () => {
    expect(parseAgentConfig({ ...base, portThresholds: '{"flapCount":5}' }).portThresholds).toBe(
      '{"flapCount":5}',
    );
    expect(() => parseAgentConfig({ ...base, portThresholds: '{"flapcount":5}' })).toThrow(
      /portThresholds: .*flapcount/,
    );
    expect(() => parseAgentConfig({ ...base, portThresholds: "{" })).toThrow(
      /portThresholds: .*not JSON/,
    );
  });
});

describe("agent errors carry stable codes", () => {
  it("bad configuration is LLMGW_AGENT_CONFIG_INVALID", () => {
    const error = (() => {
      try {
        parseAgentConfig({ controlPlaneUrl: "ftp://x", joinToken: "short", stateDir: "" });
      } catch (e) {
        return e;
      }
    })();
    expect(isAgentError(error) && error.code).toBe("LLMGW_AGENT_CONFIG_INVALID");
  });
});

describe("withInventoryFacts", () => {
  it("reports every fabric port a read no longer finds as unhealthy, so an empty read is not 'no news'", () => {
    const inventory = simulateInventory("2xh100-80g@ib-a", { hostname: "n", nowMs: 0 });
    const [mlx0] = inventory.fabrics[0]!.ports;
    // The RDMA tree vanished: the monitor read nothing at all.
    const gone = withInventoryFacts([], inventory, "/sys/class/infiniband");
    expect(gone.map((p) => [p.device, p.health?.healthy, p.health?.problems[0]?.code])).toEqual([
      ["mlx5_0", false, ProblemCodes.sysfsUnreadable],
      ["mlx5_1", false, ProblemCodes.sysfsUnreadable],
    ]);
    expect(gone[0]?.health?.problems[0]?.message).toBe(
      "port mlx5_0/1 is no longer under /sys/class/infiniband (its device is gone, or the RDMA tree cannot be read)",
    );
    // A port read live keeps discovery's facts and takes the read's state and health.
    const live = withInventoryFacts(
      [{ device: "mlx5_0", port: 1, linkLayer: "infiniband", state: "DOWN", physState: "Polling" }],
      inventory,
      "/sys/class/infiniband",
    );
    expect(live[0]).toMatchObject({ ...mlx0, state: "DOWN", physState: "Polling" });
    expect(live.map((p) => p.device)).toEqual(["mlx5_0", "mlx5_1"]);
  });
});
