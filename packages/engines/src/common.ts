/** Helpers shared by the engine adapters (not exported from the package). */
import { buildNcclEnv, isNcclEnvError } from "@llmgw/nccl-env";
import {
  type EngineName,
  engineEnvRefusal,
  engineSupportsMultiNode,
  refusedEngineEnv,
} from "./deployment-spec.js";
import { ENGINE_ENV_NAME } from "./engine-env.js";
import { EnginesError } from "./errors.js";
import { buildGpuVisibilityEnv } from "./gpu-visibility.js";
import {
  type BuildLaunchSpecInput,
  ENGINE_API_KEY_ENV,
  isSafeHost,
  type LaunchSpec,
  type ResolvedNodeEngineConfig,
  resolveNodeEngineConfig,
} from "./launch-spec.js";

/** Checked placement facts every adapter uses. */
export interface CheckedLaunch {
  readonly config: ResolvedNodeEngineConfig;
  readonly multiNode: boolean;
  /** `host:port` of rank 0's rendezvous, IPv6 in brackets; undefined on one node. */
  readonly rendezvous:
    | { readonly host: string; readonly port: number; readonly hostPort: string }
    | undefined;
}

/**
 * Validates placement and ports; throws `LLMGW_ENGINES_INVALID_LAUNCH` / `…_UNSUPPORTED` (a
 * multi-node placement for an engine {@link engineSupportsMultiNode} refuses).
 */
export function checkLaunch(input: BuildLaunchSpecInput): CheckedLaunch {
  const { placement, ports, deployment } = input;
  const invalid = (what: string, value: unknown): never => {
    throw new EnginesError(
      "LLMGW_ENGINES_INVALID_LAUNCH",
      `${what} (got ${JSON.stringify(value)})`,
    );
  };
  const config = resolveNodeEngineConfig(input.nodeConfig);
  for (const name of config.allowedEngineEnv) {
    const refusal = ENGINE_ENV_NAME.test(name) ? engineEnvRefusal(name) : "is not a variable name";
    if (refusal !== undefined) {
      throw new EnginesError(
        "LLMGW_ENGINES_INVALID_CONFIG",
        `nodeConfig.allowedEngineEnv cannot allow ${JSON.stringify(name)}: it ${refusal}`,
      );
    }
  }
  // The enforcement point for deployment env: the schema (also run by the control plane) only
  // refuses what no node may allow; what this node allows is known here, at launch. With
  // `policy: "report"` (to adopt, never to launch) what no node may allow is the schema's.
  const refused = refusedEngineEnv(
    input.policy === "report"
      ? Object.fromEntries(
          Object.entries(deployment.env).filter(
            ([key]) => ENGINE_ENV_NAME.test(key) && engineEnvRefusal(key) === undefined,
          ),
        )
      : deployment.env,
    config.allowedEngineEnv,
  );
  if (refused.length > 0) {
    throw new EnginesError(
      "LLMGW_ENGINES_ENV_NOT_ALLOWED",
      `deployment env refused on this node: ${refused.join("; ")}`,
    );
  }
  if (!Number.isInteger(placement.nnodes) || placement.nnodes < 1)
    invalid("placement.nnodes must be ≥ 1", placement.nnodes);
  if (
    !Number.isInteger(placement.rank) ||
    placement.rank < 0 ||
    placement.rank >= placement.nnodes
  ) {
    invalid(`placement.rank must be in [0, ${placement.nnodes - 1}]`, placement.rank);
  }
  if (!isPort(ports.api)) invalid("ports.api must be a TCP port 1-65535", ports.api);
  const seen = new Set<number>();
  for (const gpu of placement.gpuIndices) {
    if (!Number.isInteger(gpu) || gpu < 0 || seen.has(gpu))
      invalid("placement.gpuIndices must be distinct indices ≥ 0", placement.gpuIndices);
    seen.add(gpu);
  }
  const multiNode = placement.nnodes > 1;
  if (!multiNode) return { config, multiNode, rendezvous: undefined };
  if (!engineSupportsMultiNode(deployment.engine)) {
    throw new EnginesError(
      "LLMGW_ENGINES_UNSUPPORTED",
      `${deployment.engine} cannot run one replica across nodes (asked for ${placement.nnodes})`,
    );
  }
  const host = placement.rank0Address;
  if (host === undefined || !isSafeHost(host)) {
    invalid("placement.rank0Address must be an IP address or host name when nnodes > 1", host);
  }
  const port = placement.rendezvousPort;
  if (port === undefined || !isPort(port))
    invalid("placement.rendezvousPort must be a TCP port when nnodes > 1", port);
  const h = host as string;
  const p = port as number;
  return {
    config,
    multiNode,
    rendezvous: { host: h, port: p, hostPort: h.includes(":") ? `[${h}]:${p}` : `${h}:${p}` },
  };
}

/** How the adapter wants GPUs exposed. */
export interface EnvOptions {
  readonly python: boolean;
  /** Multi-node groups get NCCL/Gloo settings (also the sim, so gang tests see real values). */
  readonly nccl: boolean;
}

/**
 * Environment of one rank: engine defaults < deployment env (checked by {@link checkLaunch}
 * against the node's allow-list) < llmgw's GPU selection, cache settings and NCCL/Gloo
 * network choice.
 */
export function buildEnv(
  input: BuildLaunchSpecInput,
  checked: CheckedLaunch,
  options: EnvOptions,
): { env: Record<string, string>; reasons: string[] } {
  const env: Record<string, string> = {};
  if (options.python) env.PYTHONUNBUFFERED = "1";
  Object.assign(env, input.deployment.env);
  Object.assign(env, buildGpuVisibilityEnv(input.node, input.placement.gpuIndices));
  if (options.python) {
    if (checked.config.hfHome !== undefined) env.HF_HOME = checked.config.hfHome;
    if (checked.config.offline) env.HF_HUB_OFFLINE = "1";
  }
  let reasons: string[] = [];
  if (options.nccl) {
    try {
      const nccl = buildNcclEnv({
        fabrics: input.node.fabrics,
        chosenFabricId: input.placement.fabricId,
        rankGpus: input.placement.gpuIndices,
        topology: input.node.topology,
        multiNode: checked.multiNode,
        socketIfname: checked.config.socketIfname,
      });
      Object.assign(env, nccl.env);
      reasons = [...nccl.reasons];
    } catch (error) {
      if (isNcclEnvError(error)) {
        throw new EnginesError(
          "LLMGW_ENGINES_NCCL_ENV",
          `rank ${input.placement.rank} on ${input.node.hostname}: ${error.message}`,
          {
            cause: error,
          },
        );
      }
      throw error;
    }
  }
  return { env, reasons };
}

/**
 * SGLang-style rendezvous flags (`--nnodes --node-rank --dist-init-addr host:port`) for a
 * multi-node rank; nothing on one node. The simulated engine takes the same flags.
 */
export function distInitArgs(input: BuildLaunchSpecInput, checked: CheckedLaunch): string[] {
  if (checked.rendezvous === undefined) return [];
  const { placement } = input;
  return [
    "--nnodes",
    String(placement.nnodes),
    "--node-rank",
    String(placement.rank),
    "--dist-init-addr",
    checked.rendezvous.hostPort,
  ];
}

/**
 * The parts of a {@link LaunchSpec} every adapter fills the same way: environment (see
 * {@link buildEnv}), working dir, the API port, API key variable and readiness checks on
 * serving ranks, `/metrics`, SIGTERM and the engine's grace.
 */
export function finishLaunchSpec(
  engine: EngineName,
  input: BuildLaunchSpecInput,
  checked: CheckedLaunch,
  argv: string[],
  options: EnvOptions & { readonly serving: boolean },
): LaunchSpec {
  const { env, reasons } = buildEnv(input, checked, options);
  const { config } = checked;
  const apiKeyEnv = options.serving ? ENGINE_API_KEY_ENV[engine] : undefined;
  return {
    engine,
    rank: input.placement.rank,
    argv,
    env,
    ...(apiKeyEnv === undefined ? {} : { apiKeyEnv }),
    ...(config.cwd === undefined ? {} : { cwd: config.cwd }),
    ...(options.serving ? { apiPort: input.ports.api } : {}),
    ...(kvEventsEndpointOf(input, options.serving) === undefined
      ? {}
      : { kvEventsEndpoint: input.kvEventsEndpoint }),
    readiness: options.serving
      ? {
          healthPath: "/health",
          modelsPath: "/v1/models",
          expectedModelId: input.deployment.servedModelName,
        }
      : undefined,
    metricsPath: "/metrics",
    stopSignal: "SIGTERM",
    stopGraceMs: config.stopGraceMs[engine],
    reasons,
  };
}

/** The KV-events endpoint of a serving rank of a `kvEvents` deployment; else undefined. */
function kvEventsEndpointOf(input: BuildLaunchSpecInput, serving: boolean): string | undefined {
  return serving && input.deployment.kvEvents ? input.kvEventsEndpoint : undefined;
}

/**
 * `--kv-events-config` for a serving rank of a `kvEvents` deployment (vLLM's `KVEventsConfig`
 * JSON; SGLang and the simulator take the same), publishing on the agent's endpoint; nothing
 * otherwise. A `kvEvents` deployment launched without an endpoint is a bug of the caller.
 */
export function kvEventsArgs(input: BuildLaunchSpecInput, serving: boolean): string[] {
  if (!serving || !input.deployment.kvEvents) return [];
  const endpoint = input.kvEventsEndpoint;
  if (endpoint === undefined || !/^(ipc|tcp):\/\/\S{1,200}$/.test(endpoint)) {
    throw new EnginesError(
      "LLMGW_ENGINES_INVALID_LAUNCH",
      `kvEvents needs the agent's event endpoint (ipc:// or tcp://), got ${JSON.stringify(endpoint)}`,
    );
  }
  return [
    "--kv-events-config",
    JSON.stringify({ enable_kv_cache_events: true, publisher: "zmq", endpoint, topic: "" }),
  ];
}

/** `[flag, value]` when value is set, else nothing. */
export function opt(flag: string, value: string | number | undefined): string[] {
  return value === undefined ? [] : [flag, String(value)];
}

function isPort(value: unknown): boolean {
  return typeof value === "number" && Number.isInteger(value) && value >= 1 && value <= 65_535;
}
