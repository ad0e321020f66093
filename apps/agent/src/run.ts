import { realpath } from "node:fs/promises";
import path from "node:path";
import { create } from "@bufbuild/protobuf";
import {
  applyKernelFaults,
  createPortHealthMonitor,
  DEFAULT_SYSFS_ROOT,
  faultWord,
  type Gpu,
  type GpuFault,
  type KernelFaultEvent,
  type KernelLogWatcher,
  type KernelLogWatcherOptions,
  type NodeInventory,
  type Port,
  type Problem,
  ProblemCodes,
  parsePortThresholds,
  parseXid,
  pciBusKey,
  readBootId,
  readGpuReadings,
  watchKernelLog,
} from "@llmgw/discovery";
import { startKvCacheServer } from "@llmgw/kv-events";
import { ProblemSchema } from "@llmgw/proto";
import { createSupervisor, type SupervisorLogger, systemClock } from "@llmgw/supervisor";
import { gpuReadingToProto, inventoryToProto, portToProto } from "@llmgw/wire";
import { type AgentConfig, kernelLogPath } from "./config.js";
import { type ChannelState, ControlChannel } from "./control-channel.js";
import { engineProcessOf } from "./engine-pids.js";
import { AgentError } from "./errors.js";
import { createGpuReadingMemory, loadGpuMemory, saveGpuMemory } from "./gpu-readings.js";
import { collectInventory } from "./inventory.js";
import { createLeaveUndo, DesiredReplicas, type LeaveReport, leaveCluster } from "./leave.js";
import { LoadReporter } from "./load-reporter.js";
import { type EngineProbes, RELAUNCH_DEFAULTS, ReplicaManager } from "./replica-manager.js";
import { prepareStateDir } from "./state-dir.js";

/** Things the agent needs from its process that the CLI provides (no globals in here). */
export interface AgentDeps {
  readonly logger: SupervisorLogger;
  readonly probes: EngineProbes;
  /** Environment engines start from (PATH, HOME, …). */
  readonly baseEnv: Readonly<Record<string, string>>;
  /** Secrets from the agent's environment (HF_TOKEN…), passed to engines only. */
  readonly secretEnv: Readonly<Record<string, string>>;
  readonly agentVersion: string;
  /** The agent's user id (`process.getuid()`): its state dirs must be its own. Omitted: not checked. */
  readonly uid?: number;
  /** Watcher settings beyond the path (tests shorten `pollMs`, inject the clock). */
  readonly kernelLog?: Omit<KernelLogWatcherOptions, "path" | "onChange" | "follow">;
  /** Monotonic milliseconds for port-health rates and windows (tests drive it). */
  readonly portClock?: () => number;
}

/** A running agent. */
export interface RunningAgent {
  readonly inventory: () => NodeInventory;
  readonly channelState: () => ChannelState;
  readonly nodeId: () => string | undefined;
  readonly manager: ReplicaManager;
  /** The kernel-log watcher; undefined when the node watches none (`--kernel-log off`, simulated). */
  readonly kernelLog: KernelLogWatcher | undefined;
  /** Resolves when the agent stopped. */
  readonly done: Promise<void>;
  /**
   * Stops the agent. Engines keep running unless `stopEngines` (or the config's
   * `stopEngines`) asks otherwise, so an agent restart never restarts a serving model. One
   * that stops them leaves the cluster first ({@link leaveCluster}): the control plane moves
   * its replicas elsewhere and drains them while the agent keeps heartbeating, for at most
   * `leaveTimeoutMs` (default the config's), then what is left stops. Resolves with how the
   * leave went; undefined when engines keep running. A second call waits for the first.
   */
  close(options?: CloseOptions): Promise<LeaveReport | undefined>;
}

/** Options of {@link RunningAgent.close}. */
export interface CloseOptions {
  readonly stopEngines?: boolean;
  /** Overrides the config's `leaveTimeoutMs`; 0 stops engines without leaving first. */
  readonly leaveTimeoutMs?: number;
  /** Aborted to end the leave at once (the CLI's second signal); engines then stop. */
  readonly interrupt?: AbortSignal;
}

/**
 * Composes discovery, the supervisor, the replica manager and the control channel. Adopts
 * engines a previous agent left running before the first heartbeat, so they are reported
 * (and kept) rather than relaunched.
 */
export async function startAgent(config: AgentConfig, deps: AgentDeps): Promise<RunningAgent> {
  const { logger } = deps;
  await prepareStateDir(config.stateDir, deps.uid);
  const modelRoot =
    config.modelRoot === undefined ? undefined : await resolveModelRoot(config.modelRoot);
  const abort = new AbortController();
  const hostname = config.nodeName;
  const discoveryOptions = {
    nvidiaSmiPath: config.nvidiaSmiPath,
    amdSmiPath: config.amdSmiPath,
    rocmSmiPath: config.rocmSmiPath,
    sysfsRoot: config.sysfsRoot,
    fabricNames: config.fabricNames,
    agentVersion: deps.agentVersion,
    ...(hostname ? { hostname } : {}),
  };
  // Every read of the GPUs goes through this memory: a GPU a read lacks (nvidia-smi hung, NVML
  // failed) stays reported, unhealthy, and a PCIe link seen degraded under load stays so.
  // The memory's latches (PCIe degraded, NVLinks once active) survive an agent restart within
  // one boot: restarting the agent must not clear a fault.
  const gpuMemoryFile = path.join(config.stateDir, "gpu-memory.json");
  const bootId = readBootId();
  const gpuMemory = createGpuReadingMemory(loadGpuMemory(gpuMemoryFile, bootId));
  let savedGpuMemory = JSON.stringify(gpuMemory.snapshot());
  const persistGpuMemory = () => {
    const now = JSON.stringify(gpuMemory.snapshot());
    if (bootId === undefined || now === savedGpuMemory) return;
    try {
      saveGpuMemory(gpuMemoryFile, bootId, gpuMemory.snapshot());
      savedGpuMemory = now;
    } catch (error) {
      logger.warn("cannot save the GPU latches; they hold until the agent restarts", {
        file: gpuMemoryFile,
        error: (error as Error).message,
      });
    }
  };
  const discover = async (managedPids: Iterable<number>): Promise<NodeInventory> => {
    const found = await collectInventory({
      ...discoveryOptions,
      ...(config.simulate ? { simulate: config.simulate } : {}),
      managedPids,
    });
    const gpus = gpuMemory.observe(found, found.collectedAtUnixMs);
    persistGpuMemory();
    return { ...found, gpus };
  };

  // Started before the first discovery, so the registration inventory already carries every
  // fault logged since boot.
  const logPath = kernelLogPath(config);
  let onKernelFault: (event: KernelFaultEvent) => void = () => {};
  const watcher =
    logPath === undefined
      ? undefined
      : watchKernelLog({
          // Faults that take a GPU out survive an agent restart after the kernel's ring
          // buffer dropped their records (same boot only; kmsg only).
          stateFile: path.join(config.stateDir, "kernel-faults.json"),
          ...deps.kernelLog,
          path: logPath,
          onChange: (e) => onKernelFault(e),
        });
  if (watcher !== undefined) {
    await boundedWait(watcher.caughtUp, KERNEL_LOG_CATCH_UP_MS);
    const faults = watcher.faults();
    if (faults.length > 0) {
      logger.warn(`kernel log ${logPath}: ${faults.length} fault(s) since boot`, {
        faults: faults.map((f) => `${faultWord(f)} ${f.pciBusId} ${f.action}`),
      });
    }
  }
  /** GPUs and node problems with the kernel log's faults and problems applied. */
  const withKernelFaults = (
    gpus: readonly Gpu[],
    problems: readonly Problem[],
  ): { gpus: Gpu[]; problems: Problem[] } => {
    if (watcher === undefined) return { gpus: [...gpus], problems: [...problems] };
    const applied = applyKernelFaults(gpus, watcher.faults());
    return {
      gpus: applied.gpus,
      problems: [...problems, ...watcher.problems(), ...applied.problems],
    };
  };

  // What discovery read (no kernel-log faults); the views below are derived from it.
  let discovered: NodeInventory;
  try {
    discovered = await discover([]);
  } catch (error) {
    await watcher?.close();
    throw error;
  }
  let rawReadings: readonly Gpu[] = discovered.gpus;
  let rawReadingProblems: readonly Problem[] = discovered.problems;
  const faultedInventory = (): NodeInventory => {
    const applied = withKernelFaults(discovered.gpus, discovered.problems);
    return { ...discovered, gpus: applied.gpus, problems: applied.problems };
  };
  let inventory = faultedInventory();
  for (const p of inventory.problems) {
    logger.warn(`discovery: ${p.message}`, { code: p.code, source: p.source });
  }
  // A simulated node is a demo or test on one machine: its engines are reached on loopback.
  const advertiseAddress =
    config.advertiseAddress ??
    (config.simulate ? "127.0.0.1" : (inventory.addresses[0] ?? "127.0.0.1"));
  // Engines listen where the router reaches them, not on every interface; an operator behind
  // NAT (advertised address not local) binds 0.0.0.0 instead.
  const bindAddress = config.engineBindAddress ?? config.engines.bindHost ?? advertiseAddress;
  // Engines are looked up on the agent's own PATH, never through the child env a deployment
  // helped shape.
  const supervisor = createSupervisor({
    stateDir: path.join(config.stateDir, "pids"),
    logger,
    searchPath: deps.baseEnv.PATH ?? "",
  });
  const manager = new ReplicaManager({
    supervisor,
    stateDir: config.stateDir,
    inventory: () => inventory,
    nodeConfig: { ...config.engines, bindHost: bindAddress },
    probes: deps.probes,
    baseEnv: deps.baseEnv,
    secretEnv: deps.secretEnv,
    logger,
    probeIntervalMs: config.probeIntervalMs,
    probeTimeoutMs: config.probeTimeoutMs,
    defaultLoadingDeadlineMs: config.defaultLoadingDeadlineMs,
    localAddress: probeAddress(bindAddress),
    ...(modelRoot === undefined ? {} : { modelRoot }),
    allowTrustRemoteCode: config.allowTrustRemoteCode,
    relaunch: { ...RELAUNCH_DEFAULTS, firstDelayMs: config.relaunchFailedMs },
  });
  // Precise routing: the KV-cache blocks of replicas that publish events, for routers.
  const kvServer =
    config.kvListen === "off"
      ? undefined
      : await startKvCacheServer({
          registry: manager.kvFeeds(),
          ...kvListenAddress(config.kvListen, bindAddress),
        });
  manager.setKvEventsPort(kvServer?.port);
  const adopted = await manager.adoptPrevious();
  if (adopted.length > 0) logger.info(`adopted ${adopted.length} running engine(s)`, { adopted });

  let readings: readonly Gpu[] = inventory.gpus;
  let readingProblems: readonly Problem[] = inventory.problems;
  /** Re-derives every view from the raw readings and the kernel log's faults now. */
  const recompute = () => {
    inventory = faultedInventory();
    const applied = withKernelFaults(rawReadings, rawReadingProblems);
    readings = applied.gpus;
    readingProblems = applied.problems;
  };
  const refreshReadings = async () => {
    // A simulated node's readings never change, but its kernel-log view may.
    if (!config.simulate) {
      const report = await readGpuReadings({
        ...discoveryOptions,
        managedPids: manager.managedPids(),
      });
      rawReadings = gpuMemory.observe(report, Date.now());
      persistGpuMemory();
      rawReadingProblems = report.problems;
    }
    recompute();
  };
  const readingsTimer = setInterval(() => {
    refreshReadings().catch((error: unknown) =>
      logger.warn("reading GPUs failed", { error: (error as Error).message }),
    );
  }, config.readingsIntervalMs);
  readingsTimer.unref();

  // RDMA port health: state and error counters every portHealthIntervalMs, judged over time
  // (flaps, rates, saturated counters). A simulated node reads the host's tree only when
  // --sysfs-root names one explicitly, like the kernel log.
  const portMonitor =
    config.simulate !== undefined && config.sysfsRoot === DEFAULT_SYSFS_ROOT
      ? undefined
      : createPortHealthMonitor({
          sysfsRoot: config.sysfsRoot,
          ...(config.portThresholds === undefined
            ? {}
            : { thresholds: parsePortThresholds(config.portThresholds) }),
          ...(deps.portClock === undefined ? {} : { clock: deps.portClock }),
        });
  let livePorts: readonly Port[] = [];
  let portProblems: readonly Problem[] = [];
  const refreshPorts = async () => {
    if (portMonitor === undefined) return;
    const report = await portMonitor.read();
    const wasUnhealthy = new Set(
      livePorts.filter((p) => p.health?.healthy === false).map((p) => `${p.device}/${p.port}`),
    );
    livePorts = withInventoryFacts(report.ports, inventory, config.sysfsRoot);
    portProblems = report.problems;
    const newlyBad = livePorts.filter(
      (p) => p.health?.healthy === false && !wasUnhealthy.has(`${p.device}/${p.port}`),
    );
    for (const p of newlyBad) {
      logger.warn(`RDMA port ${p.device}/${p.port} is unhealthy`, {
        problems: p.health?.problems.map((x) => x.message) ?? [],
      });
    }
    // Like a GPU fault, a port going bad is worth a heartbeat now: the control plane takes
    // the multi-node replicas over that fabric off this node.
    if (newlyBad.length > 0) beatSoon();
  };
  // The channel is built below; until then there is no heartbeat to hurry.
  let beatSoon = () => {};
  const portsTimer = setInterval(() => {
    refreshPorts().catch((error: unknown) =>
      logger.warn("reading RDMA ports failed", { error: (error as Error).message }),
    );
  }, config.portHealthIntervalMs);
  portsTimer.unref();
  await refreshPorts().catch(() => {});

  // A leave the previous agent began (its marker) ends once this one heartbeats.
  const leaveUndo = await createLeaveUndo({
    setLeaving: () => channel.setLeaving(false),
    stateDir: config.stateDir,
    logger,
  });
  const desired = new DesiredReplicas();
  const channel: ControlChannel = new ControlChannel(
    {
      controlPlaneUrl: config.controlPlaneUrl,
      joinToken: config.joinToken,
      stateDir: config.stateDir,
      advertiseAddress,
      initialBackoffMs: config.initialBackoffMs,
      maxBackoffMs: config.maxBackoffMs,
      callTimeoutMs: config.callTimeoutMs,
    },
    {
      inventory: async () => {
        discovered = await discover(manager.managedPids());
        rawReadings = discovered.gpus;
        rawReadingProblems = discovered.problems;
        recompute();
        return inventoryToProto(inventory);
      },
      snapshot: async () => ({
        gpus: readings.map(gpuReadingToProto),
        replicas: manager.statuses(),
        engineCredentials: manager.engineCredentials(),
        problems: [...readingProblems, ...portProblems].map((p) => create(ProblemSchema, { ...p })),
        ports: livePorts.map(portToProto),
      }),
      applyDesired: async (response) => {
        await manager.apply(response.assignments);
        desired.noteApplied(response.assignments.length);
      },
      onHeartbeat: () => leaveUndo.afterHeartbeat(),
      onState: (state, detail) => {
        const log = state === "connected" || state === "stopped" ? logger.info : logger.warn;
        log.call(logger, `control channel ${state}: ${detail}`, {});
      },
    },
  );
  beatSoon = () => channel.beatSoon();
  // Engine load goes to the control plane right after each scrape round (ReportLoad), besides
  // riding on every heartbeat; the control plane may ask for another interval.
  const loadReporter: LoadReporter = new LoadReporter({
    sink: channel,
    samples: () => manager.loadSamples(),
    logger,
    intervalMs: config.loadScrapeIntervalMs,
    onInterval: (ms) => manager.startLoadScraping(ms, () => loadReporter.reportChanges()),
  });
  manager.startLoadScraping(config.loadScrapeIntervalMs, () => loadReporter.reportChanges());
  const done = channel.run(abort.signal);

  /**
   * Restarts the engines on the fault's GPU — unless its record names a process that is not
   * one of llmgw's engines or their workers: another user's program broke its own context,
   * not ours, and the engine llmgw just stopped logs an Xid 45 for its torn-down channel under
   * its old pid (restarting again for that would loop). A record without a pid restarts them.
   */
  const restartEnginesFor = async (fault: GpuFault, recordPid: number | undefined) => {
    // The record's own pid; the fault's evidence is only the record that opened it.
    const pid = recordPid ?? parseXid(fault.evidence)?.pid;
    const what = `${faultWord(fault)} (${fault.description})`;
    const whose = pid === undefined ? undefined : await engineProcessOf(pid, manager.managedPids());
    // Another program's fault is not our engines' (it shares the GPU: MIG or a foreign job).
    // A pid that is gone usually was a worker the fault killed, so the engine is broken — except
    // for Xid 45, the channel teardown a stopped process leaves behind (our own restart logs
    // one): that one never restarts the engine llmgw just started in its place.
    const skip =
      whose === "foreign" || (whose === "gone" && fault.kind === "xid" && fault.code === 45);
    if (skip) {
      logger.warn(
        `kernel log: ${what} names pid ${pid}, which ${whose === "foreign" ? "is not an engine llmgw runs" : "is gone (Xid 45 is the teardown a stopped process leaves)"}; its engines are not restarted`,
        { evidence: fault.evidence },
      );
      return;
    }
    const key = pciBusKey(fault.pciBusId);
    for (const gpu of rawReadings) {
      if (pciBusKey(gpu.pciBusId) !== key) continue;
      manager.restartReplicasOnGpu(gpu.index, `${what} on GPU ${gpu.index}: ${fault.evidence}`);
    }
  };

  // A fault is worth an out-of-band report: the views are recomputed and the next heartbeat
  // goes now. Only a live record restarts engines; the boot-time backlog (read above, before
  // this is set) and a re-opened log's backlog never do.
  onKernelFault = (event) => {
    const { fault } = event;
    recompute();
    channel.beatSoon();
    // A record folded into a known fault: its lastSeen moved (it counts again after a clear).
    if (event.kind === "seen-again") return;
    logger.warn(
      `kernel log: ${faultWord(fault)} on ${fault.pciBusId} (${fault.description}): ${event.kind === "opened" ? "fault" : `action ${event.previousAction} →`} ${fault.action}`,
      { live: event.live, count: fault.count, evidence: fault.evidence },
    );
    if (!event.live || fault.action !== "restart-engine") return;
    restartEnginesFor(fault, event.pid).catch((error: unknown) =>
      logger.warn("kernel log: cannot restart the engines", { error: (error as Error).message }),
    );
  };

  const close = async (options: CloseOptions): Promise<LeaveReport | undefined> => {
    const stopEngines = options.stopEngines ?? config.stopEngines;
    // The undo of an earlier leave must not land after this leave.
    await leaveUndo.stop();
    const leave = stopEngines
      ? await leaveCluster({
          setLeaving: (signal) => channel.setLeaving(true, signal),
          beatSoon: () => channel.beatSoon(),
          desired,
          stateDir: config.stateDir,
          nodeId: channel.nodeId,
          timeoutMs: options.leaveTimeoutMs ?? config.leaveTimeoutMs,
          ...(options.interrupt === undefined ? {} : { interrupt: options.interrupt }),
          clock: systemClock,
          logger,
        })
      : undefined;
    abort.abort();
    clearInterval(readingsTimer);
    clearInterval(portsTimer);
    onKernelFault = () => {};
    await watcher?.close();
    await done;
    await loadReporter.close();
    await manager.close(stopEngines);
    await kvServer?.close();
    return leave;
  };
  let closing: Promise<LeaveReport | undefined> | undefined;
  return {
    inventory: () => inventory,
    channelState: () => channel.state,
    nodeId: () => channel.nodeId,
    manager,
    kernelLog: watcher,
    done,
    close(options = {}) {
      closing ??= close(options);
      return closing;
    },
  };
}

/**
 * Live port readings with the facts only discovery reads (netdev, GUID, GID, PCI id, NUMA)
 * taken from the inventory's port of the same device and number, so the control plane can put
 * each live port on its fabric. A fabric port the read no longer finds (its device vanished,
 * or the whole RDMA tree did) is reported unhealthy rather than left out: an empty list would
 * read as "no port health here" and keep the registered, healthy snapshot.
 */
export function withInventoryFacts(
  live: readonly Port[],
  inventory: NodeInventory,
  sysfsRoot: string,
): Port[] {
  const known = new Map<string, Port>();
  for (const p of [...inventory.fabrics.flatMap((f) => f.ports), ...inventory.inactivePorts]) {
    known.set(`${p.device}/${p.port}`, p);
  }
  const read = new Set(live.map((p) => `${p.device}/${p.port}`));
  const merged = live.map((p): Port => {
    const facts = known.get(`${p.device}/${p.port}`);
    return facts === undefined
      ? p
      : {
          ...facts,
          state: p.state,
          physState: p.physState,
          linkLayer: p.linkLayer,
          ...(p.rateGbps === undefined ? {} : { rateGbps: p.rateGbps }),
          ...(p.health === undefined ? {} : { health: p.health }),
        };
  });
  const gone = inventory.fabrics
    .flatMap((f) => f.ports)
    .filter((p) => !read.has(`${p.device}/${p.port}`))
    .map(
      (p): Port => ({
        ...p,
        state: "",
        physState: "",
        health: {
          healthy: false,
          problems: [
            {
              code: ProblemCodes.sysfsUnreadable,
              source: "sysfs",
              message: `port ${p.device}/${p.port} is no longer under ${sysfsRoot} (its device is gone, or the RDMA tree cannot be read)`,
            },
          ],
          flaps: 0,
          flapWindowS: 0,
          counters: [],
        },
      }),
    );
  // A port on two fabrics is listed once.
  const unique = gone.filter(
    (p, i) => gone.findIndex((q) => q.device === p.device && q.port === p.port) === i,
  );
  return [...merged, ...unique];
}

/**
 * How long the agent waits for the kernel log's initial content before its first discovery. A
 * log that keeps the watcher busy longer (a huge text file) is still read; its faults then
 * reach the control plane with a later heartbeat.
 */
const KERNEL_LOG_CATCH_UP_MS = 10_000;

/** Waits for `promise`, or `ms` at most (never rejects). */
async function boundedWait(promise: Promise<void>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    promise,
    new Promise<void>((resolve) => {
      timer = setTimeout(resolve, ms);
    }),
  ]);
  clearTimeout(timer);
}

/**
 * Where the agent's probes reach an engine bound to `bindAddress`: that address itself, or
 * loopback for the wildcard addresses (which accept loopback connections too).
 */
export function probeAddress(bindAddress: string): string {
  if (bindAddress === "0.0.0.0") return "127.0.0.1";
  if (bindAddress === "::" || bindAddress === "[::]") return "::1";
  return bindAddress.replace(/^\[(.*)\]$/, "$1");
}

/** `--model-root` after symlinks; a root that does not exist stops the agent with its name. */
async function resolveModelRoot(root: string): Promise<string> {
  try {
    return await realpath(root);
  } catch (error) {
    throw new AgentError(
      "LLMGW_AGENT_MODEL_ROOT_INVALID",
      `--model-root ${root} cannot be resolved: ${(error as NodeJS.ErrnoException).code ?? (error as Error).message}`,
    );
  }
}

/** Host and port of `--kv-listen` (default: the engines' bind address, any free port). */
function kvListenAddress(
  listen: string | undefined,
  bindAddress: string,
): { host: string; port: number } {
  if (listen === undefined) return { host: bindAddress.replace(/^\[|\]$/g, ""), port: 0 };
  const at = listen.lastIndexOf(":");
  return { host: listen.slice(0, at).replace(/^\[|\]$/g, ""), port: Number(listen.slice(at + 1)) };
}
