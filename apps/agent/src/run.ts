import { realpath } from "node:fs/promises";
import path from "node:path";
import { create } from "@bufbuild/protobuf";
import { type NodeInventory, type Problem, readGpuReadings } from "@llmgw/discovery";
import { ProblemSchema } from "@llmgw/proto";
import { createSupervisor, type SupervisorLogger } from "@llmgw/supervisor";
import { gpuReadingToProto, inventoryToProto } from "@llmgw/wire";
import type { AgentConfig } from "./config.js";
import { type ChannelState, ControlChannel } from "./control-channel.js";
import { collectInventory } from "./inventory.js";
import { type EngineProbes, ReplicaManager } from "./replica-manager.js";
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
}

/** A running agent. */
export interface RunningAgent {
  readonly inventory: () => NodeInventory;
  readonly channelState: () => ChannelState;
  readonly nodeId: () => string | undefined;
  readonly manager: ReplicaManager;
  /** Resolves when the agent stopped. */
  readonly done: Promise<void>;
  /**
   * Stops the agent. Engines keep running unless `stopEngines` (or the config's
   * `stopEngines`) asks otherwise, so an agent restart never restarts a serving model.
   */
  close(options?: { stopEngines?: boolean }): Promise<void>;
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
  const discover = (managedPids: Iterable<number>): Promise<NodeInventory> =>
    collectInventory({
      ...discoveryOptions,
      ...(config.simulate ? { simulate: config.simulate } : {}),
      managedPids,
    });

  let inventory = await discover([]);
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
  });
  const adopted = await manager.adoptPrevious();
  if (adopted.length > 0) logger.info(`adopted ${adopted.length} running engine(s)`, { adopted });
  manager.startLoadScraping(config.loadScrapeIntervalMs);

  let readings = inventory.gpus;
  let readingProblems: readonly Problem[] = inventory.problems;
  const refreshReadings = async () => {
    if (config.simulate) return;
    const report = await readGpuReadings({
      ...discoveryOptions,
      managedPids: manager.managedPids(),
    });
    readings = report.gpus;
    readingProblems = report.problems;
  };
  const readingsTimer = setInterval(() => {
    refreshReadings().catch((error: unknown) =>
      logger.warn("reading GPUs failed", { error: (error as Error).message }),
    );
  }, config.readingsIntervalMs);
  readingsTimer.unref();

  const channel = new ControlChannel(
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
        inventory = await discover(manager.managedPids());
        readings = inventory.gpus;
        return inventoryToProto(inventory);
      },
      snapshot: async () => ({
        gpus: readings.map(gpuReadingToProto),
        replicas: manager.statuses(),
        engineCredentials: manager.engineCredentials(),
        problems: readingProblems.map((p) => create(ProblemSchema, { ...p })),
      }),
      applyDesired: async (response) => {
        await manager.apply(response.assignments);
      },
      onState: (state, detail) => {
        const log = state === "connected" || state === "stopped" ? logger.info : logger.warn;
        log.call(logger, `control channel ${state}: ${detail}`, {});
      },
    },
  );
  const done = channel.run(abort.signal);

  return {
    inventory: () => inventory,
    channelState: () => channel.state,
    nodeId: () => channel.nodeId,
    manager,
    done,
    async close(options = {}) {
      abort.abort();
      clearInterval(readingsTimer);
      await done;
      await manager.close(options.stopEngines ?? config.stopEngines);
    },
  };
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
    throw new Error(
      `--model-root ${root} cannot be resolved: ${(error as NodeJS.ErrnoException).code ?? (error as Error).message}`,
    );
  }
}
