import { isDiscoveryError, parsePortThresholds } from "@llmgw/discovery";
import { ENGINE_ENV_NAME, engineEnvRefusal } from "@llmgw/engines";
import { z } from "zod";
import { AgentError } from "./errors.js";
import {
  DEFAULT_LOAD_INTERVAL_MS,
  MAX_LOAD_INTERVAL_MS,
  MIN_LOAD_INTERVAL_MS,
} from "./load-reporter.js";

/** A variable name the operator may add to the engine env allow-list. */
const allowableEnvName = z
  .string()
  .regex(ENGINE_ENV_NAME, `must be an environment variable name (${ENGINE_ENV_NAME.source})`)
  .superRefine((name, ctx) => {
    const refusal = engineEnvRefusal(name);
    if (refusal !== undefined) {
      ctx.addIssue({ code: "custom", message: `${name} cannot be allowed: it ${refusal}` });
    }
  });

/** Default of `leaveTimeoutMs` (`--leave-timeout 600`). */
export const DEFAULT_LEAVE_TIMEOUT_MS = 600_000;
/** Longest `leaveTimeoutMs`: a day (a drain longer than that is an operator's, not a stop's). */
export const MAX_LEAVE_TIMEOUT_MS = 86_400_000;
const LEAVE_TIMEOUT_RANGE = `must be 0..${MAX_LEAVE_TIMEOUT_MS / 1000} seconds (--leave-timeout)`;

/** Longest `relaunchFailedMs`: a day. */
export const MAX_RELAUNCH_FAILED_MS = 86_400_000;
const RELAUNCH_FAILED_RANGE = `must be 0..${MAX_RELAUNCH_FAILED_MS / 1000} seconds (--relaunch-failed)`;

/**
 * `llmgw agent` configuration, validated once here (flags and environment are mapped onto
 * this shape by the CLI). Durations are milliseconds.
 */
export const agentConfigSchema = z.object({
  /**
   * Base URL of the control plane's control listener, e.g. http://10.0.0.1:7070; several,
   * comma-separated, for control-plane instances sharing a PostgreSQL store (the agent
   * follows the leader).
   */
  controlPlaneUrl: z
    .string()
    .refine(
      (list) =>
        list.split(",").every((u) => z.url({ protocol: /^https?$/ }).safeParse(u.trim()).success),
      "expected an http:// or https:// URL, or several separated by commas",
    ),
  /** Join token from `llmgw control-plane token`. */
  joinToken: z
    .string()
    .min(16, "join token is too short (expected the value printed by `llmgw control-plane token`)"),
  /** Node identity, pid files, replica records and engine logs (created 0700). */
  stateDir: z.string().min(1),
  nvidiaSmiPath: z.string().min(1).default("nvidia-smi"),
  /** AMD GPUs: amd-smi, and rocm-smi when amd-smi is missing or fails. */
  amdSmiPath: z.string().min(1).default("amd-smi"),
  rocmSmiPath: z.string().min(1).default("rocm-smi"),
  sysfsRoot: z.string().min(1).default("/sys/class/infiniband"),
  /** `<count>x<class>[,…][@<fabric>]`: a simulated node instead of real discovery. */
  simulate: z.string().optional(),
  /** Name this node registers with (default: the host name); lets several simulated agents share one machine. */
  nodeName: z.string().min(1).max(253).optional(),
  /** Address other nodes and the router use to reach this node's engines. */
  advertiseAddress: z.string().min(1).optional(),
  /**
   * Address engines listen on (default: the advertise address, so an engine is not open on
   * every interface). `0.0.0.0` or `::` for NAT setups where the advertised address is not
   * local; probes then use loopback.
   */
  engineBindAddress: z
    .string()
    .regex(/^[A-Za-z0-9._:-]+$/, "must be an IP address or host name")
    .refine((v) => !v.startsWith("-"), "must be an IP address or host name")
    .optional(),
  /**
   * `--kv-listen HOST:PORT`: where routers watch the KV-cache blocks of this node's replicas
   * that publish events (`kvEvents` deployments); `off` serves none. Default: the engines'
   * bind address, a free port (reported to the control plane with each replica).
   */
  kvListen: z
    .union([
      z.literal("off"),
      z
        .string()
        .regex(
          /^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):\d{1,5}$/,
          "must be HOST:PORT or off (--kv-listen)",
        ),
    ])
    .optional(),
  /** Operator-named fabrics: RDMA device → fabric id. */
  fabricNames: z.record(z.string(), z.string()).default({}),
  /** Stop engines when the agent exits (default: leave them for the next agent to adopt). */
  stopEngines: z.boolean().default(false),
  /**
   * `--leave-timeout S` (ms here): with `stopEngines`, how long the agent waits at shutdown
   * for the control plane to move its replicas elsewhere and drain them (`SetLeaving`) before
   * it stops what is left. 0: no wait, engines stop at once as before. At most a day.
   */
  leaveTimeoutMs: z
    .number({ error: LEAVE_TIMEOUT_RANGE })
    .int(LEAVE_TIMEOUT_RANGE)
    .min(0, LEAVE_TIMEOUT_RANGE)
    .max(MAX_LEAVE_TIMEOUT_MS, LEAVE_TIMEOUT_RANGE)
    .default(DEFAULT_LEAVE_TIMEOUT_MS),
  /**
   * `--relaunch-failed S` (ms here): how long after its restart policy gave up (or its engine
   * could not be spawned) a replica is launched afresh on a new port, doubling per try up to
   * 30 minutes (or this, if longer); 0: never (it stays `failed` until its assignment
   * changes). Default a minute.
   */
  relaunchFailedMs: z
    .number({ error: RELAUNCH_FAILED_RANGE })
    .int(RELAUNCH_FAILED_RANGE)
    .min(0, RELAUNCH_FAILED_RANGE)
    .max(MAX_RELAUNCH_FAILED_MS, RELAUNCH_FAILED_RANGE)
    .default(60_000),
  engines: z
    .object({
      vllmCommand: z.array(z.string().min(1)).min(1).optional(),
      sglangCommand: z.array(z.string().min(1)).min(1).optional(),
      llamacppBinary: z.string().min(1).optional(),
      simCommand: z.array(z.string().min(1)).min(1).optional(),
      downloadDir: z.string().optional(),
      hfHome: z.string().optional(),
      offline: z.boolean().optional(),
      bindHost: z.string().optional(),
      llamacppThreads: z.number().int().positive().optional(),
      /**
       * Deployment env names this node allows beyond the built-in tuning list
       * (`--allow-engine-env`); names that load code, pick programs, or that llmgw sets are
       * refused here so the operator learns at start, not at the first launch.
       */
      allowedEngineEnv: z.array(allowableEnvName).optional(),
    })
    .default({}),
  /**
   * `--model-root`: when set, a deployment whose model is a local path must resolve (after
   * symlinks) inside this directory, or its replica fails on this node.
   */
  modelRoot: z
    .string()
    .refine((p) => p.startsWith("/"), "must be an absolute path")
    .optional(),
  /**
   * `--allow-trust-remote-code`: lets deployments with `trustRemoteCode` run here (the engine
   * then executes code from the model repository).
   */
  allowTrustRemoteCode: z.boolean().default(false),
  /**
   * `--kernel-log PATH`: where NVIDIA Xid/SXid faults are read (`/dev/kmsg`, a file or a FIFO);
   * `"off"` disables it. Absent: `/dev/kmsg` on a real node, off on a `--simulate` node (a dev
   * box's own kernel log must not leak into simulated GPUs). See {@link kernelLogPath}.
   */
  kernelLog: z
    .string()
    .min(1, 'must be a path or "off"')
    .refine((p) => p === "off" || !p.includes("\0"), 'must be a path or "off"')
    .optional(),
  /**
   * `--port-thresholds JSON`: RDMA port-health thresholds over the defaults
   * (`DEFAULT_PORT_THRESHOLDS` in @llmgw/discovery), validated at start so a typo stops the
   * agent with the key's name instead of silently judging ports by the defaults.
   */
  portThresholds: z
    .string()
    .superRefine((text, ctx) => {
      try {
        parsePortThresholds(text);
      } catch (error) {
        if (!isDiscoveryError(error)) throw error;
        ctx.addIssue({ code: "custom", message: error.message });
      }
    })
    .optional(),
  /** RDMA port state and error counters are read this often (thresholds are per second, not per read). */
  portHealthIntervalMs: z.number().int().positive().default(5_000),
  /** Discovery re-reads GPU readings this often. */
  readingsIntervalMs: z.number().int().positive().default(10_000),
  /**
   * `--load-interval MS`: each ready engine's `/metrics` is scraped this often, and what
   * changed is reported to the control plane right after (`ReportLoad`), so that routers see
   * engine load within a second. 100..60 000 ms.
   */
  loadScrapeIntervalMs: z
    .number({ error: "must be a whole number of milliseconds (--load-interval)" })
    .int("must be a whole number of milliseconds (--load-interval)")
    .min(
      MIN_LOAD_INTERVAL_MS,
      `must be ${MIN_LOAD_INTERVAL_MS}..${MAX_LOAD_INTERVAL_MS} ms (--load-interval)`,
    )
    .max(
      MAX_LOAD_INTERVAL_MS,
      `must be ${MIN_LOAD_INTERVAL_MS}..${MAX_LOAD_INTERVAL_MS} ms (--load-interval)`,
    )
    .default(DEFAULT_LOAD_INTERVAL_MS),
  probeIntervalMs: z.number().int().positive().default(1_000),
  probeTimeoutMs: z.number().int().positive().default(2_000),
  defaultLoadingDeadlineMs: z
    .number()
    .int()
    .positive()
    .default(30 * 60_000),
  callTimeoutMs: z.number().int().positive().default(5_000),
  initialBackoffMs: z.number().int().positive().default(500),
  // Short enough that agents are back within seconds of a control-plane restart (the router
  // answers 503 until they report their replicas again); jitter spreads the herd.
  maxBackoffMs: z.number().int().positive().default(4_000),
});

export type AgentConfigInput = z.input<typeof agentConfigSchema>;
export type AgentConfig = z.output<typeof agentConfigSchema>;

/** Parses and validates agent configuration; the error names every bad field. */
export function parseAgentConfig(input: AgentConfigInput): AgentConfig {
  const result = agentConfigSchema.safeParse(input);
  if (!result.success) {
    const details = result.error.issues
      .map((i) => `${i.path.join(".") || "config"}: ${i.message}`)
      .join("; ");
    throw new AgentError("LLMGW_AGENT_CONFIG_INVALID", `invalid agent configuration: ${details}`);
  }
  return result.data;
}

/** The kernel log used on a real node when `--kernel-log` is not given. */
export const DEFAULT_AGENT_KERNEL_LOG = "/dev/kmsg";

/**
 * The kernel log this agent watches, or undefined when it watches none: the configured path,
 * nothing for `"off"`, and by default `/dev/kmsg` on a real node and nothing on a simulated one.
 */
export function kernelLogPath(config: {
  readonly kernelLog?: string | undefined;
  readonly simulate?: string | undefined;
}): string | undefined {
  if (config.kernelLog === "off") return undefined;
  if (config.kernelLog !== undefined) return config.kernelLog;
  return config.simulate === undefined ? DEFAULT_AGENT_KERNEL_LOG : undefined;
}
