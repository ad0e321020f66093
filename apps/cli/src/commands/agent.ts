import path from "node:path";
import { fileURLToPath } from "node:url";
import {
  type AgentConfigInput,
  createEngineProbes,
  parseAgentConfig,
  startAgent,
} from "@llmgw/agent";
import { findLlamaServer } from "@llmgw/engine-sim";
import { type Command, parseCommandArgs, UsageError } from "../command.js";
import { createConsoleLogger } from "../logger.js";
import { plainHttpToOtherHosts } from "../plain-http.js";
import { LLMGW_VERSION } from "../version.js";
import { parseFabricNames } from "./agent-inventory.js";

const USAGE = `Usage: llmgw agent --control-plane URL --join-token T [options]

Runs the node agent: discovers GPUs and fabrics, registers with the control plane, and
launches and supervises the engines it is assigned. Engines keep running when the agent
stops or loses the control plane; a restarted agent adopts them.

Options:
  --control-plane URL[,URL…] control listener of the control plane (env LLMGW_CONTROL_PLANE);
                            several instances sharing a PostgreSQL store, comma-separated:
                            the agent follows the leader
  --join-token T            join token from 'llmgw control-plane token'; prefer the env
                            LLMGW_JOIN_TOKEN (an environment file): argv is visible in ps
  --state-dir DIR           identity, pid files, replica records, engine logs
                            (default /var/lib/llmgw/agent, env LLMGW_STATE_DIR)
  --nvidia-smi PATH         nvidia-smi binary (default: nvidia-smi on PATH)
  --amd-smi PATH            amd-smi binary, for AMD GPUs (default: amd-smi on PATH)
  --rocm-smi PATH           rocm-smi binary, used when amd-smi is missing or fails
                            (default: rocm-smi on PATH)
  --sysfs-root DIR          RDMA class tree (default /sys/class/infiniband)
  --simulate SPEC           simulated node, e.g. "8xh100-80g@ib-a" (no real GPUs used)
  --kernel-log PATH         where NVIDIA Xid/SXid faults are read: /dev/kmsg (default on a
                            real node), a file or a FIFO; "off" disables it (the default on
                            a --simulate node)
  --port-thresholds JSON    RDMA port-health thresholds over the defaults, e.g.
                            '{"flapCount":5,"counters":{"symbol_error":{"maxIncrease":120,"windowS":3600}}}'
  --node-name NAME          name to register with (default: host name)
  --advertise-address ADDR  address peers and the router use to reach this node's engines
  --engine-bind-address ADDR  address engines listen on (default: the advertise address;
                            0.0.0.0 when that address is not local, e.g. behind NAT)
  --kv-listen HOST:PORT     where routers watch the KV-cache blocks of replicas that publish
                            events (kvEvents deployments); "off": none (default: the engine
                            bind address, a free port)
  --fabric-name DEV=ID      name the fabric of an RDMA device (repeatable)
  --stop-engines            stop engines when the agent exits (default: leave them running);
                            first the node leaves the cluster: its replicas move elsewhere and
                            drain, so no request fails
  --leave-timeout S         with --stop-engines, wait at most S seconds for that drain, then
                            stop what is left (default 600; 0: no drain, stop at once;
                            env LLMGW_LEAVE_TIMEOUT)
  --relaunch-failed S       launch a replica afresh, on a new port, S seconds after its
                            restarts gave up (5 quick crashes) or its engine could not be
                            spawned; doubling per try up to 30 minutes; 0: never
                            (default 60; env LLMGW_RELAUNCH_FAILED)
  --llama-server PATH       llama.cpp server binary (default: the cached build, else PATH)
  --vllm-command CMD        argv prefix for vLLM, space-separated (default "vllm serve")
  --sglang-command CMD      argv prefix for SGLang (default "python3 -m sglang.launch_server")
  --hf-home DIR             HF_HOME for engines; HF_TOKEN is read from the environment
  --offline                 weights are pre-staged: engines run with HF_HUB_OFFLINE=1
  --allow-engine-env NAME[,NAME...]
                            deployment env variables engines on this node may receive beyond
                            the built-in tuning list (repeatable; env LLMGW_ALLOW_ENGINE_ENV)
  --model-root DIR          a deployment whose model is a local path must resolve inside DIR
                            (env LLMGW_MODEL_ROOT)
  --allow-trust-remote-code let deployments with trustRemoteCode run here: the engine then
                            runs the model repository's Python (env LLMGW_ALLOW_TRUST_REMOTE_CODE=1)
  --load-interval MS        scrape each engine's /metrics and report changed load to the
                            control plane this often (100..60000, default 500)
`;

/** Variables engines inherit from the agent; everything else is set explicitly. */
const PASSTHROUGH_ENV = [
  "PATH",
  "HOME",
  "USER",
  "LOGNAME",
  "LANG",
  "LC_ALL",
  "TZ",
  "TMPDIR",
  "LD_LIBRARY_PATH",
  "PYTHONPATH",
  "VIRTUAL_ENV",
  "CUDA_HOME",
  "NODE_OPTIONS",
];

/**
 * `--leave-timeout` and `--relaunch-failed` seconds as milliseconds; NaN for anything but a decimal number (so "",
 * "10m" or "1e3" are refused by the config's validation instead of read as 0 or 1000 s).
 */
function secondsToMs(text: string): number {
  return /^\d+(\.\d+)?$/.test(text.trim()) ? Math.round(Number(text) * 1000) : Number.NaN;
}

/** The command that runs `llmgw` itself, for the simulated engine (`llmgw engine-sim`). */
export function selfCommand(): string[] {
  const main = process.argv[1] ?? fileURLToPath(new URL("./main.js", import.meta.url));
  return [process.execPath, path.resolve(main)];
}

export const command: Command = {
  name: "agent",
  summary: "run the node agent",
  usage: USAGE,
  async run(argv, io) {
    const { values } = parseCommandArgs(argv, {
      "control-plane": { type: "string" },
      "join-token": { type: "string" },
      "state-dir": { type: "string" },
      "nvidia-smi": { type: "string" },
      "amd-smi": { type: "string" },
      "rocm-smi": { type: "string" },
      "sysfs-root": { type: "string" },
      simulate: { type: "string" },
      "kernel-log": { type: "string" },
      "port-thresholds": { type: "string" },
      "node-name": { type: "string" },
      "advertise-address": { type: "string" },
      "engine-bind-address": { type: "string" },
      "kv-listen": { type: "string" },
      "fabric-name": { type: "string", multiple: true },
      "stop-engines": { type: "boolean" },
      "leave-timeout": { type: "string" },
      "relaunch-failed": { type: "string" },
      "llama-server": { type: "string" },
      "vllm-command": { type: "string" },
      "sglang-command": { type: "string" },
      "hf-home": { type: "string" },
      offline: { type: "boolean" },
      "allow-engine-env": { type: "string", multiple: true },
      "model-root": { type: "string" },
      "allow-trust-remote-code": { type: "boolean" },
      "load-interval": { type: "string" },
    });
    const controlPlaneUrl = values["control-plane"] ?? io.env.LLMGW_CONTROL_PLANE;
    const joinToken = values["join-token"] ?? io.env.LLMGW_JOIN_TOKEN;
    if (!controlPlaneUrl)
      throw new UsageError("--control-plane URL is required (or LLMGW_CONTROL_PLANE)");
    if (!joinToken) throw new UsageError("--join-token is required (or LLMGW_JOIN_TOKEN)");
    if (values["join-token"] !== undefined) {
      io.stderr.write(
        "llmgw agent: warning: --join-token puts the secret on the command line, where every local user can read it (ps, /proc); set LLMGW_JOIN_TOKEN in the agent's environment file instead\n",
      );
    }
    // The join token, then the node credential it is traded for, go as bearer headers.
    for (const url of plainHttpToOtherHosts(controlPlaneUrl.split(",").map((u) => u.trim())))
      io.stderr.write(
        `llmgw agent: warning: ${url} is plain HTTP to another host: the join token and the node's credential cross the network unencrypted; serve the control plane with --tls-cert/--tls-key and use https://\n`,
      );
    const allowedEngineEnv = [
      ...(io.env.LLMGW_ALLOW_ENGINE_ENV ?? "").split(","),
      ...(values["allow-engine-env"] ?? []).flatMap((v) => v.split(",")),
    ]
      .map((name) => name.trim())
      .filter((name) => name !== "");
    const modelRoot = values["model-root"] ?? io.env.LLMGW_MODEL_ROOT;
    const leaveTimeout = values["leave-timeout"] ?? io.env.LLMGW_LEAVE_TIMEOUT;
    const relaunchFailed = values["relaunch-failed"] ?? io.env.LLMGW_RELAUNCH_FAILED;
    const fabricNames = parseFabricNames(values["fabric-name"] ?? []);
    const llamaServer =
      values["llama-server"] ??
      io.env.LLMGW_LLAMA_SERVER ??
      findLlamaServer(io.env.LLMGW_CACHE_DIR ? { cacheDir: io.env.LLMGW_CACHE_DIR } : {});
    const input: AgentConfigInput = {
      controlPlaneUrl,
      joinToken,
      stateDir: values["state-dir"] ?? io.env.LLMGW_STATE_DIR ?? "/var/lib/llmgw/agent",
      ...(values["nvidia-smi"] ? { nvidiaSmiPath: values["nvidia-smi"] } : {}),
      ...(values["amd-smi"] ? { amdSmiPath: values["amd-smi"] } : {}),
      ...(values["rocm-smi"] ? { rocmSmiPath: values["rocm-smi"] } : {}),
      ...(values["sysfs-root"] ? { sysfsRoot: values["sysfs-root"] } : {}),
      ...(values.simulate ? { simulate: values.simulate } : {}),
      ...(values["kernel-log"] === undefined ? {} : { kernelLog: values["kernel-log"] }),
      ...(values["port-thresholds"] === undefined
        ? {}
        : { portThresholds: values["port-thresholds"] }),
      ...(values["node-name"] ? { nodeName: values["node-name"] } : {}),
      ...(values["advertise-address"] ? { advertiseAddress: values["advertise-address"] } : {}),
      ...(values["engine-bind-address"]
        ? { engineBindAddress: values["engine-bind-address"] }
        : {}),
      ...(values["kv-listen"] ? { kvListen: values["kv-listen"] } : {}),
      fabricNames,
      stopEngines: values["stop-engines"] ?? false,
      ...(leaveTimeout === undefined ? {} : { leaveTimeoutMs: secondsToMs(leaveTimeout) }),
      ...(relaunchFailed === undefined ? {} : { relaunchFailedMs: secondsToMs(relaunchFailed) }),
      ...(modelRoot ? { modelRoot } : {}),
      ...(values["load-interval"] === undefined
        ? {}
        : { loadScrapeIntervalMs: Number(values["load-interval"]) }),
      allowTrustRemoteCode:
        values["allow-trust-remote-code"] === true || io.env.LLMGW_ALLOW_TRUST_REMOTE_CODE === "1",
      engines: {
        simCommand: [...selfCommand(), "engine-sim"],
        ...(llamaServer ? { llamacppBinary: llamaServer } : {}),
        ...(values["vllm-command"] ? { vllmCommand: values["vllm-command"].split(/\s+/) } : {}),
        ...(values["sglang-command"]
          ? { sglangCommand: values["sglang-command"].split(/\s+/) }
          : {}),
        ...(values["hf-home"] ? { hfHome: values["hf-home"] } : {}),
        ...(values.offline ? { offline: true } : {}),
        ...(allowedEngineEnv.length > 0 ? { allowedEngineEnv } : {}),
      },
    };
    let config: ReturnType<typeof parseAgentConfig>;
    try {
      config = parseAgentConfig(input);
    } catch (error) {
      throw new UsageError((error as Error).message);
    }
    const logger = createConsoleLogger(io.stderr, "agent");
    const baseEnv: Record<string, string> = {};
    for (const name of PASSTHROUGH_ENV) {
      const value = io.env[name];
      if (value !== undefined) baseEnv[name] = value;
    }
    const secretEnv: Record<string, string> = {};
    for (const name of ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"]) {
      const value = io.env[name];
      if (value) secretEnv[name] = value;
    }
    const agent = await startAgent(config, {
      logger,
      probes: createEngineProbes(),
      baseEnv,
      secretEnv,
      agentVersion: LLMGW_VERSION,
      ...(process.getuid === undefined ? {} : { uid: process.getuid() }),
    });
    logger.info(`agent started for ${config.controlPlaneUrl}`, {
      stateDir: config.stateDir,
      simulated: Boolean(config.simulate),
    });
    await new Promise<void>((resolve) => {
      if (io.signal.aborted) resolve();
      io.signal.addEventListener("abort", () => resolve(), { once: true });
    });
    logger.info(
      config.stopEngines ? "stopping engines and exiting" : "exiting; engines keep running",
      {},
    );
    if (config.stopEngines && io.interrupt !== undefined) {
      io.interrupt.addEventListener(
        "abort",
        () => logger.warn("second signal: stopping engines now, without waiting for the drain", {}),
        { once: true },
      );
    }
    await agent.close(io.interrupt === undefined ? {} : { interrupt: io.interrupt });
    return 0;
  },
};
