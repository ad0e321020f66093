/**
 * The engine adapter contract: (deployment, placement of one rank, ports, node, node config)
 * → {@link LaunchSpec}, plain data the supervisor spawns. Nothing here starts a process.
 */
import type { DeploymentSpec, EngineName } from "./deployment-spec.js";
import { EnginesError } from "./errors.js";
import type { LaunchNode } from "./inventory.js";

/** Where one rank of a replica runs. */
export interface LaunchPlacement {
  /** 0-based node rank; rank 0 serves the API. */
  readonly rank: number;
  /** Nodes in the replica (1 = single node). */
  readonly nnodes: number;
  /** Address rank ≥ 1 use to reach rank 0 (IP or host name); required when nnodes > 1. */
  readonly rank0Address?: string;
  /** Rendezvous port on rank 0 (vLLM `--master-port`, SGLang/sim `--dist-init-addr`); required when nnodes > 1. */
  readonly rendezvousPort?: number;
  /** GPU indices on this node, nvidia-smi order. Empty for CPU engines. */
  readonly gpuIndices: readonly number[];
  /** Fabric shared by all ranks; required when nnodes > 1. */
  readonly fabricId?: string;
}

/** Ports the agent allocated for this rank. */
export interface LaunchPorts {
  /** The OpenAI-compatible API port (rank 0; SGLang/sim ranks ≥ 1 get it for their health stub). */
  readonly api: number;
}

/**
 * How engines are run on this node: node configuration, never deployment data. Secrets are
 * not here: the agent adds {@link SECRET_ENV_NAMES} from its environment file at spawn time
 * and never logs them.
 */
export interface NodeEngineConfig {
  /** argv prefix for vLLM; default `["vllm", "serve"]`. */
  readonly vllmCommand?: readonly string[];
  /** argv prefix for SGLang; default `["python3", "-m", "sglang.launch_server"]`. */
  readonly sglangCommand?: readonly string[];
  /** llama-server binary; default `"llama-server"` (on PATH). */
  readonly llamacppBinary?: string;
  /** argv prefix for the simulated engine; default `["llmgw", "engine-sim"]`. */
  readonly simCommand?: readonly string[];
  /** Weights cache passed as `--download-dir` (vLLM, SGLang). */
  readonly downloadDir?: string;
  /** `HF_HOME` for Python engines. */
  readonly hfHome?: string;
  /** Weights are pre-staged: sets `HF_HUB_OFFLINE=1`. Default false. */
  readonly offline?: boolean;
  /**
   * Address engines bind; default `"0.0.0.0"`. The agent always sets it: the node's advertise
   * address unless the operator overrides it, so an engine is not reachable on every interface.
   */
  readonly bindHost?: string;
  /** llama.cpp `-t`; default 1. */
  readonly llamacppThreads?: number;
  /** llama.cpp `-np` (parallel slots); default 4. */
  readonly llamacppParallel?: number;
  /** Interface for NCCL bootstrap and Gloo; default the fabric port's netdev. */
  readonly socketIfname?: string;
  /** Grace between SIGTERM and SIGKILL; default 30 000 ms (Python engines), 10 000 (llama.cpp), 5 000 (sim). */
  readonly stopGraceMs?: number;
  /** Working directory for engines; default inherited. */
  readonly cwd?: string;
  /**
   * Deployment variables this node allows beyond the built-in list (`ENGINE_ENV_ALLOWED`):
   * the operator's `--allow-engine-env`. Names llmgw never allows (owned, secrets, code
   * loaders, `PATH`) are refused with `LLMGW_ENGINES_INVALID_CONFIG`. Default none.
   */
  readonly allowedEngineEnv?: readonly string[];
}

/** {@link NodeEngineConfig} with every default applied. */
export interface ResolvedNodeEngineConfig {
  readonly commands: Readonly<Record<EngineName, readonly string[]>>;
  readonly downloadDir: string | undefined;
  readonly hfHome: string | undefined;
  readonly offline: boolean;
  readonly bindHost: string;
  readonly llamacppThreads: number;
  readonly llamacppParallel: number;
  readonly socketIfname: string | undefined;
  readonly stopGraceMs: Readonly<Record<EngineName, number>>;
  readonly cwd: string | undefined;
  readonly allowedEngineEnv: ReadonlySet<string>;
}

/** What a process needs to become ready. */
export interface LaunchReadiness {
  readonly healthPath: string;
  readonly modelsPath: string;
  /** The id `/v1/models` must list: the served model name. */
  readonly expectedModelId: string;
}

/** Everything the supervisor needs to run one rank. Pure data. */
export interface LaunchSpec {
  readonly engine: EngineName;
  readonly rank: number;
  /** argv[0] is the executable; never run through a shell. */
  readonly argv: readonly string[];
  /** Variables to set on top of the agent's own (secrets are added by the agent, not here). */
  readonly env: Readonly<Record<string, string>>;
  /**
   * Variable through which the agent hands this rank's engine its API key (see
   * {@link ENGINE_API_KEY_ENV}); the key itself is never in a launch spec or argv. Undefined on
   * ranks that serve no API and for engines that take a key only on argv (SGLang).
   */
  readonly apiKeyEnv?: string;
  readonly cwd?: string;
  /** API port on rank 0; undefined on ranks that serve no API. */
  readonly apiPort?: number;
  /** The endpoint the engine publishes its KV-cache events on (see `kvEventsEndpoint`). */
  readonly kvEventsEndpoint?: string;
  /** Undefined for ranks with nothing to probe (vLLM headless, SGLang/sim workers). */
  readonly readiness: LaunchReadiness | undefined;
  readonly metricsPath: string;
  readonly stopSignal: "SIGTERM";
  readonly stopGraceMs: number;
  /** Why the NCCL/Gloo variables are what they are (empty when none were set). */
  readonly reasons: readonly string[];
}

/** Input of {@link EngineAdapter.buildLaunchSpec}. */
export interface BuildLaunchSpecInput {
  /** A validated spec (see `parseDeploymentSpec`). */
  readonly deployment: DeploymentSpec;
  readonly placement: LaunchPlacement;
  readonly ports: LaunchPorts;
  readonly node: LaunchNode;
  readonly nodeConfig?: NodeEngineConfig;
  /**
   * Where a `kvEvents` deployment's serving rank publishes its KV-cache events: a local
   * endpoint the agent picked, e.g. `ipc:///var/lib/llmgw/kv/r1.ipc` (ipc binds, as vLLM does
   * for `ipc://`, and never leaves the node: events carry the prompts' token ids).
   */
  readonly kvEventsEndpoint?: string;
  /**
   * `"report"`: the deployment's env names that no deployment may set (its policy refusal,
   * which `parseDeploymentSpec`'s `policy: "report"` gave) are not refused here, so that the
   * launch spec of a process an older release launched from it can be rebuilt, to adopt that
   * process. Never for a launch. Default `"enforce"`.
   */
  readonly policy?: "enforce" | "report";
}

/** One engine's rules for turning a deployment into a process. */
export interface EngineAdapter {
  readonly engine: EngineName;
  /** @throws EnginesError `LLMGW_ENGINES_INVALID_LAUNCH`, `…_UNSUPPORTED`, `…_INVALID_CONFIG`, `…_NCCL_ENV`. */
  buildLaunchSpec(input: BuildLaunchSpecInput): LaunchSpec;
}

/**
 * Variables holding secrets. The agent adds them from its environment file when it spawns an
 * engine; they never appear in a `LaunchSpec`, argv, logs or the control plane.
 */
export const SECRET_ENV_NAMES = ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"] as const;

/**
 * Where each engine reads the API key it demands on its OpenAI routes, when not given
 * `--api-key` on argv: vLLM's `VLLM_API_KEY` (vllm/envs.py; `/health` and `/metrics` stay open),
 * llama-server's `LLAMA_API_KEY` (common/arg.cpp; only `/health` stays open, so probes and
 * scrapes send the key), the simulated engine's `LLMGW_ENGINE_API_KEY`. SGLang has none: it
 * takes `--api-key` on argv only, where any local user could read it, so it runs without a key
 * (bound to the bind address all the same).
 */
export const ENGINE_API_KEY_ENV: Readonly<Record<EngineName, string | undefined>> = {
  vllm: "VLLM_API_KEY",
  sglang: undefined,
  llamacpp: "LLAMA_API_KEY",
  sim: "LLMGW_ENGINE_API_KEY",
};

/** The variables of {@link ENGINE_API_KEY_ENV}: llmgw sets them, a deployment never does. */
export const ENGINE_API_KEY_ENV_NAMES = [
  "VLLM_API_KEY",
  "LLAMA_API_KEY",
  "LLMGW_ENGINE_API_KEY",
] as const;

const DEFAULT_COMMANDS: Readonly<Record<EngineName, readonly string[]>> = {
  vllm: ["vllm", "serve"],
  sglang: ["python3", "-m", "sglang.launch_server"],
  llamacpp: ["llama-server"],
  sim: ["llmgw", "engine-sim"],
};
const DEFAULT_GRACE_MS: Readonly<Record<EngineName, number>> = {
  vllm: 30_000,
  sglang: 30_000,
  llamacpp: 10_000,
  sim: 5_000,
};
const SAFE_HOST = /^[A-Za-z0-9._:-]+$/;

/** An IP address or host name that cannot be read as a flag (bind host, rendezvous address). */
export function isSafeHost(value: string): boolean {
  return SAFE_HOST.test(value) && !value.startsWith("-");
}

/**
 * Applies defaults and validates node configuration once.
 * @throws EnginesError `LLMGW_ENGINES_INVALID_CONFIG` naming the option and echoing the value.
 */
export function resolveNodeEngineConfig(config: NodeEngineConfig = {}): ResolvedNodeEngineConfig {
  const bad = (option: string, value: unknown, why: string): never => {
    throw new EnginesError(
      "LLMGW_ENGINES_INVALID_CONFIG",
      `nodeConfig.${option} ${why} (got ${JSON.stringify(value)})`,
    );
  };
  const command = (
    option: string,
    value: readonly string[] | undefined,
    fallback: readonly string[],
  ) => {
    if (value === undefined) return fallback;
    if (value.length === 0 || value.some((part) => part === "" || part.includes("\u0000"))) {
      bad(option, value, "must be a non-empty argv prefix without empty or NUL parts");
    }
    return [...value];
  };
  const path = (option: string, value: string | undefined) => {
    if (
      value !== undefined &&
      (value === "" || value.startsWith("-") || /[\u0000-\u001f]/.test(value))
    ) {
      bad(option, value, "must be a path that does not start with '-'");
    }
    return value;
  };
  const whole = (option: string, value: number | undefined, fallback: number, min: number) => {
    if (value === undefined) return fallback;
    if (!Number.isInteger(value) || value < min) bad(option, value, `must be an integer ≥ ${min}`);
    return value;
  };
  const bindHost = config.bindHost ?? "0.0.0.0";
  if (!isSafeHost(bindHost)) bad("bindHost", bindHost, "must be an IP address or host name");
  if (config.socketIfname !== undefined && !/^[A-Za-z0-9_.-]+$/.test(config.socketIfname)) {
    bad("socketIfname", config.socketIfname, "must be an interface name");
  }
  const llamacppBinary = path("llamacppBinary", config.llamacppBinary);
  const grace = config.stopGraceMs;
  if (grace !== undefined) whole("stopGraceMs", grace, 0, 0);
  return {
    commands: {
      vllm: command("vllmCommand", config.vllmCommand, DEFAULT_COMMANDS.vllm),
      sglang: command("sglangCommand", config.sglangCommand, DEFAULT_COMMANDS.sglang),
      llamacpp: llamacppBinary === undefined ? DEFAULT_COMMANDS.llamacpp : [llamacppBinary],
      sim: command("simCommand", config.simCommand, DEFAULT_COMMANDS.sim),
    },
    downloadDir: path("downloadDir", config.downloadDir),
    hfHome: path("hfHome", config.hfHome),
    offline: config.offline ?? false,
    bindHost,
    llamacppThreads: whole("llamacppThreads", config.llamacppThreads, 1, 1),
    llamacppParallel: whole("llamacppParallel", config.llamacppParallel, 4, 1),
    socketIfname: config.socketIfname,
    stopGraceMs:
      grace === undefined
        ? DEFAULT_GRACE_MS
        : { vllm: grace, sglang: grace, llamacpp: grace, sim: grace },
    cwd: path("cwd", config.cwd),
    // Which names may be allowed at all is checked where the owned lists live (checkLaunch).
    allowedEngineEnv: new Set(config.allowedEngineEnv ?? []),
  };
}
