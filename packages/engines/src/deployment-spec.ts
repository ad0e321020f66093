/**
 * The deployment spec: what an operator asks for, as one zod schema that mirrors
 * `llmgw.v1.Deployment` (proto/llmgw/v1/deployment.proto) field for field in camelCase.
 * Every string that can reach an engine's argv or environment is validated here, once.
 */
import { NCCL_ENV_KEYS } from "@llmgw/nccl-env";
import { z } from "zod";
import {
  allowEngineEnvHint,
  ENGINE_ENV_ALLOWED,
  ENGINE_ENV_NAME,
  type EngineEnvDenyReason,
  engineEnvNeverAllowedReason,
} from "./engine-env.js";
import { type DeploymentSpecIssue, EnginesError } from "./errors.js";
import { ENGINE_API_KEY_ENV_NAMES, SECRET_ENV_NAMES } from "./launch-spec.js";
import { LLAMACPP_OWNED_LONG, LLAMACPP_OWNED_SHORT } from "./llamacpp-flags.js";

/** Engines llmgw can launch. */
export const ENGINES = ["vllm", "sglang", "llamacpp", "sim"] as const;
/** An engine name; see {@link ENGINES}. */
export type EngineName = (typeof ENGINES)[number];

/** How the router picks a replica: prefix affinity bounded by load (default), or plain policies. */
export const ROUTING_POLICIES = ["llmgw", "round-robin", "least-loaded"] as const;

/** Engines that publish KV-cache events in vLLM's format (`kvEvents`). */
export const KV_EVENT_ENGINES: ReadonlySet<EngineName> = new Set(["vllm", "sglang", "sim"]);
/** A routing policy name; see {@link ROUTING_POLICIES}. */
export type RoutingPolicy = (typeof ROUTING_POLICIES)[number];

/**
 * Flags llmgw sets itself, per engine (long forms with dashes; `_` spellings and argparse
 * abbreviations are caught by {@link ownedFlagIn}). `extraArgs` may not set any of them.
 */
export const OWNED_FLAGS: Readonly<Record<EngineName, readonly string[]>> = {
  vllm: [
    "--model",
    "--host",
    "--port",
    "--uds",
    "--served-model-name",
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--data-parallel-size",
    "--nnodes",
    "--node-rank",
    "--master-addr",
    "--master-port",
    "--headless",
    "--gpu-memory-utilization",
    "--max-model-len",
    "--quantization",
    "--kv-cache-dtype",
    "--dtype",
    "--download-dir",
    "--trust-remote-code",
    "--distributed-executor-backend",
    "--api-key",
    // A YAML file of arguments (owned ones included), Python loaded by path or import name,
    // host files served, TLS and the URL root the router and probes rely on.
    "--config",
    "--tool-parser-plugin",
    "--middleware",
    "--worker-extension-cls",
    "--logits-processors",
    // Lets a request body name any importable callable, with its arguments, for the server to
    // build (`logits_processors: [{qualname, args, kwargs}]`, vLLM's protocol.py): code run by
    // every API caller.
    "--logits-processor-pattern",
    "--allowed-local-media-path",
    "--ssl-keyfile",
    "--ssl-certfile",
    "--ssl-ca-certs",
    "--root-path",
    "--hf-token",
    // Weights, tokenizers and configs from a path or repo of the deployment's choosing, past
    // --model-root (a tokenizer repo with trust-remote-code is a download of code): tokenizer,
    // HF config, LoRA adapters (per modality and QLoRA ones too), a draft model, generation
    // config, loader extras (tensorizer URIs), and the chat template, which may be a host file.
    "--tokenizer",
    "--hf-config-path",
    "--lora-modules",
    "--speculative-config",
    "--generation-config",
    "--model-loader-extra-config",
    "--chat-template",
    "--default-mm-loras",
    "--qlora-adapter-name-or-path",
    // Python by import name or path: parser plugins, worker and scheduler classes, KV/EC
    // connector modules, and a logging config (dictConfig imports handler classes).
    "--reasoning-parser-plugin",
    "--worker-cls",
    "--scheduler-cls",
    "--kv-transfer-config",
    "--ec-transfer-config",
    "--log-config-file",
    // Files written where the deployment says (compile dumps and caches, profiles), hosts the
    // engine connects to with request data (tool servers, the `demo` one runs model code, OTLP).
    "--compilation-config",
    "--profiler-config",
    "--tool-server",
    "--otlp-traces-endpoint",
    // Where the engine publishes its KV-cache events: the agent's to choose (kvEvents).
    "--kv-events-config",
  ],
  sglang: [
    "--model-path",
    "--model",
    "--host",
    "--port",
    "--served-model-name",
    "--tensor-parallel-size",
    "--tp-size",
    "--tp",
    "--pipeline-parallel-size",
    "--pp-size",
    "--pp",
    "--data-parallel-size",
    "--dp-size",
    "--dp",
    "--nnodes",
    "--node-rank",
    "--dist-init-addr",
    "--nccl-init-addr",
    "--mem-fraction-static",
    "--context-length",
    "--quantization",
    "--kv-cache-dtype",
    "--dtype",
    "--download-dir",
    "--trust-remote-code",
    "--enable-metrics",
    "--base-gpu-id",
    "--gpu-id-step",
    "--api-key",
    // As for vLLM: an argument file, TLS.
    "--config",
    "--ssl-keyfile",
    "--ssl-certfile",
    "--ssl-ca-certs",
    "--admin-api-key",
    // Weights, tokenizers and templates from a path or repo past --model-root, or from another
    // host (a remote instance's weights, loader extras).
    "--tokenizer-path",
    "--lora-paths",
    "--speculative-draft-model-path",
    "--speculative-token-map",
    "--chat-template",
    "--completion-template",
    "--model-loader-extra-config",
    "--remote-instance-weight-loader-seed-instance-ip",
    "--decrypted-config-file",
    "--decrypted-draft-config-file",
    "--modelopt-checkpoint-restore-path",
    "--init-expert-location",
    // Code: request bodies carry serialized callables once custom logit processors are on
    // (SGLang keeps it off for that reason), a weight loader by import path, a storage
    // backend module named in its extra config.
    "--enable-custom-logit-processor",
    // Lets each request's own `priority` order SGLang's queue. The router sets `priority` only
    // for engines it knows to schedule by it (vLLM, see scheduling-policy.ts): on SGLang a key
    // holder would choose its own place in the queue, past llmgw's priority classes.
    "--enable-priority-scheduling",
    "--custom-weight-loader",
    "--hicache-storage-backend-extra-config",
    // Files written where the deployment says, and hosts sent request data.
    "--file-storage-path",
    "--crash-dump-folder",
    "--debug-tensor-dump-output-folder",
    "--debug-tensor-dump-input-file",
    "--export-metrics-to-file-dir",
    "--modelopt-checkpoint-save-path",
    "--modelopt-export-path",
    "--tool-server",
    "--otlp-traces-endpoint",
    "--kv-events-config",
  ],
  // Whole alias groups from the pinned llama-server's --help (see llamacpp-flags.ts).
  llamacpp: LLAMACPP_OWNED_LONG,
  sim: [
    "--model",
    "--served-model-name",
    "--host",
    "--port",
    "--max-model-len",
    "--nnodes",
    "--node-rank",
    "--dist-init-addr",
    "--kv-events-config",
  ],
};

/**
 * Single-dash short flags llmgw owns, per engine (`-tp 8`, `-tp=8` and, for argparse engines,
 * `-tp8` and prefixes such as `-t` are refused; see {@link ownedFlagIn}).
 */
export const OWNED_SHORT_FLAGS: Readonly<Record<EngineName, readonly string[]>> = {
  // vLLM's short forms (vllm/engine/arg_utils.py): `-cc` --compilation-config, `-sc`
  // --speculative-config, `-n` --nnodes, `-r` --node-rank. `-O` was --compilation-config's
  // until 0.11 and is still the key of its dotted form (`-O.cache_dir x`); newer releases also
  // read `-O3` as --optimization-level, which stays free under its long name.
  vllm: ["-tp", "-pp", "-dp", "-q", "-cc", "-sc", "-n", "-r", "-O"],
  sglang: [],
  llamacpp: LLAMACPP_OWNED_SHORT,
  sim: [],
};

/**
 * Environment variables llmgw sets (GPU selection, NCCL/Gloo network choice, rendezvous) or
 * that carry secrets, which belong in the agent's environment file, never in a deployment.
 */
export const OWNED_ENV = [
  "CUDA_VISIBLE_DEVICES",
  "CUDA_DEVICE_ORDER",
  // ROCm's GPU selection (AMD GPUs); GPU_DEVICE_ORDINAL is ROCclr's, which HIP also reads.
  "HIP_VISIBLE_DEVICES",
  "ROCR_VISIBLE_DEVICES",
  "GPU_DEVICE_ORDINAL",
  ...NCCL_ENV_KEYS,
  "VLLM_HOST_IP",
  "VLLM_PORT",
  "MASTER_ADDR",
  "MASTER_PORT",
  ...SECRET_ENV_NAMES,
  ...ENGINE_API_KEY_ENV_NAMES,
  "HF_HOME",
  "HF_HUB_OFFLINE",
  "TRANSFORMERS_OFFLINE",
  "LD_PRELOAD",
  "LD_AUDIT",
] as const;

const OWNED_ENV_REASONS: Readonly<Record<string, EngineEnvDenyReason>> = Object.fromEntries(
  OWNED_ENV.map((key) => [
    key,
    (SECRET_ENV_NAMES as readonly string[]).includes(key)
      ? "secret"
      : key.startsWith("LD_")
        ? "code"
        : "owned",
  ]),
);

/**
 * Why a deployment may never set `key` (llmgw sets it, it is a secret, or it loads code or
 * picks executables; see `engine-env.ts`), or undefined when a node may allow it.
 */
export function engineEnvRefusal(key: string): string | undefined {
  return engineEnvNeverAllowedReason(key, OWNED_ENV_REASONS);
}

/**
 * The deployment variables a node refuses to pass: neither on {@link ENGINE_ENV_ALLOWED} nor in
 * the operator's `extraAllowed`, or never allowed at all. Each entry names the variable and
 * says why or how to allow it. Empty when the whole env may run.
 */
export function refusedEngineEnv(
  env: Readonly<Record<string, string>>,
  extraAllowed: ReadonlySet<string> = new Set(),
): string[] {
  const out: string[] = [];
  for (const key of Object.keys(env).sort()) {
    const never = ENGINE_ENV_NAME.test(key)
      ? engineEnvRefusal(key)
      : `does not match ${ENGINE_ENV_NAME.source}`;
    if (never !== undefined) out.push(`${key} ${never}`);
    else if (!Object.hasOwn(ENGINE_ENV_ALLOWED, key) && !extraAllowed.has(key)) {
      out.push(
        `${key} is not on this node's engine environment allow-list; ${allowEngineEnvHint(key)}`,
      );
    }
  }
  return out;
}

// Letters, digits and `/ . _ - : + @`: enough for HF ids ("org/model"), paths, GGUF files and
// tags, and nothing a shell or argparse would read as syntax. No leading "-" (flag injection).
const ARGV_VALUE = /^[A-Za-z0-9._/:+@][A-Za-z0-9._/:+@-]*$/;
const DNS_LABEL = /^[a-z0-9]([a-z0-9-]*[a-z0-9])?$/;
const ENV_KEY = ENGINE_ENV_NAME;
const MAX_ENV_VARS = 256;
const MAX_ENV_KEY = 256;
// C0 controls and DEL: a NUL cannot be passed to exec at all, newlines forge log lines.
const CONTROL = /[\u0000-\u001f\u007f]/;

/** An argv-safe value such as a model id, path, served name or dtype. */
function argvValue(what: string, max = 1024) {
  return z
    .string()
    .min(1, `${what} must not be empty`)
    .max(max, `${what} must be at most ${max} characters`)
    .regex(
      ARGV_VALUE,
      `${what} may contain only letters, digits and / . _ - : + @, and must not start with "-"`,
    );
}

/**
 * A whole number in [min, max]; accepts a decimal string or bigint too (protobuf JSON writes
 * uint64 as strings, protobuf-es uses bigint). Typed so callers see `number | string | bigint`
 * as the input rather than zod's `unknown` for a preprocess step.
 */
function count(
  min: number,
  max = Number.MAX_SAFE_INTEGER,
): z.ZodType<number, number | string | bigint> {
  return z.preprocess(
    (v) =>
      typeof v === "string" && /^\d+$/.test(v) ? Number(v) : typeof v === "bigint" ? Number(v) : v,
    z.int().min(min).max(max),
  ) as unknown as z.ZodType<number, number | string | bigint>;
}

/**
 * Returns the owned flag an extra argument would set, or undefined when it is free. Catches
 * `--flag value`, `--flag=value`, `_` spellings (`--tensor_parallel_size`, accepted by vLLM's
 * parser) and, for the argparse engines, prefix abbreviations (`--tensor-par` →
 * `--tensor-parallel-size`); llama.cpp matches whole names only.
 */
export function ownedFlagIn(engine: EngineName, arg: string): string | undefined {
  if (arg.startsWith("--")) {
    let flag = (arg.split("=", 1)[0] ?? arg).replaceAll("_", "-");
    // vLLM's parser turns `--compilation-config.cache_dir x` into `--compilation-config
    // '{"cache_dir": "x"}'` (FlexibleArgumentParser): a dotted name sets the flag before its dot.
    if (engine === "vllm") flag = flag.split(".", 1)[0] ?? flag;
    if (flag === "--") return undefined;
    // argparse (vLLM, SGLang) expands unambiguous prefixes; llama.cpp looks names
    // up exactly, so there `--grammar` is its own option, not a prefix of `--grammar-file`.
    const prefix = engine !== "llamacpp";
    return OWNED_FLAGS[engine].find(
      (owned) => owned === flag || (prefix && owned.startsWith(flag)),
    );
  }
  // "-1" or "-0.5" is a negative number value, not a flag.
  if (arg.startsWith("-") && arg.length > 1 && !/^-\d/.test(arg)) {
    let flag = arg.split("=", 1)[0] ?? arg;
    // As for long flags, vLLM reads `-sc.model x` as `-sc '{"model": "x"}'`.
    if (engine === "vllm") flag = flag.split(".", 1)[0] ?? flag;
    // A lone "-" is a positional argument to argparse.
    if (flag === "-") return undefined;
    // argparse (vLLM, SGLang) reads "-q8" as "-q 8" (refused for longer names too), and expands
    // an unambiguous prefix of a single-dash option as it does for `--` ones: "-c" is "-cc",
    // "-s" is "-sc". llama.cpp matches names exactly, so there "-ctk" is its own flag, not
    // "-c tk".
    const argparse = engine !== "llamacpp";
    return OWNED_SHORT_FLAGS[engine].find(
      (owned) => flag === owned || (argparse && (flag.startsWith(owned) || owned.startsWith(flag))),
    );
  }
  return undefined;
}

const objectSchema = z.strictObject({
  /** DNS label, at most 63 characters. */
  name: z
    .string()
    .max(63, "name must be at most 63 characters")
    .regex(DNS_LABEL, "name must be a DNS label: lower-case letters, digits and inner '-'"),
  /** Hugging Face id, a path on the node, or a GGUF file (llama.cpp). */
  model: argvValue("model"),
  /** The model id clients send; defaults to `name`. */
  servedModelName: argvValue("servedModelName", 256).optional(),
  engine: z.enum(ENGINES),
  /** e.g. "h100-80g"; undefined (or "") means any class. */
  gpuClass: z
    .string()
    .regex(/^([a-z0-9]+-[0-9]+g)?$/, 'gpuClass must look like "h100-80g"')
    .optional()
    .transform((v) => (v === "" ? undefined : v)),
  tensorParallel: count(1, 1024).default(1),
  pipelineParallel: count(1, 1024).default(1),
  replicas: count(0, 100_000).default(1),
  quantization: argvValue("quantization", 64).optional(),
  kvCacheDtype: argvValue("kvCacheDtype", 64).optional(),
  maxModelLen: count(1, 1 << 30).optional(),
  /** Fraction of each GPU's memory the engine may use, (0, 1]. */
  gpuMemoryUtilization: z.number().gt(0).lte(1).optional(),
  /** Declared size of the weights in bytes, checked against class memory before launch. */
  modelSizeBytes: count(0).optional(),
  /** Appended after llmgw's own flags; may not set an owned flag (see {@link OWNED_FLAGS}). */
  extraArgs: z
    .array(
      z
        .string()
        .max(4096)
        .refine((s) => !CONTROL.test(s), "must not contain control characters"),
    )
    .max(256)
    .default([]),
  /**
   * Bounded like `extraArgs` (at most {@link MAX_ENV_VARS} variables, checked with the
   * policy rules in {@link ruleIssues}): the control plane stores the spec and sends it in
   * every assignment, and the agent hands each variable to a process.
   */
  env: z.record(z.string(), z.string().max(32_768)).default({}),
  routingPolicy: z.enum(ROUTING_POLICIES).default("llmgw"),
  priority: z.int().min(-1_000_000).max(1_000_000).default(0),
  allowPreemption: z.boolean().default(false),
  loadingDeadlineSeconds: count(1, 7 * 24 * 3600).optional(),
  revision: count(0).default(0),
  dtype: argvValue("dtype", 64).optional(),
  trustRemoteCode: z.boolean().default(false),
  /** Restrict multi-node replicas to this fabric id. */
  fabric: z
    .string()
    .min(1)
    .max(256)
    .refine((s) => !CONTROL.test(s), "must not contain control characters")
    .optional(),
  maxConcurrencyPerReplica: count(1, 1_000_000).optional(),
  nodesPerReplica: count(1, 1024).optional(),
  /** GPUs per replica for engines that may run without GPUs (llama.cpp); default 0. */
  gpusPerReplica: count(0, 1024).optional(),
  /**
   * Rolling updates: replicas of the new revision started above `replicas` while the old
   * ones still serve; absent: 1 ({@link rolloutLimits}).
   */
  maxSurge: count(0, 100_000).optional(),
  /** Ready replicas a rolling update or a drain may take away at once; absent: 0. */
  maxUnavailable: count(0, 100_000).optional(),
  /** How long a leaving replica may finish its in-flight requests; absent: 300 s. */
  drainTimeoutSeconds: count(1, 24 * 3600).optional(),
  /**
   * The engine publishes its KV-cache events (vLLM, SGLang, sim: `--kv-events-config`) to its
   * agent, which serves each replica's blocks to routers for precise prefix routing.
   */
  kvEvents: z.boolean().default(false),
});

/** A problem {@link ruleIssues} finds in a well-typed spec. */
interface RuleIssue {
  readonly path: readonly (string | number)[];
  readonly message: string;
  /**
   * A policy rule: what a deployment may set on a node (owned flags in `extraArgs`, env
   * names and their tiers, the bounds on env). Each release tightens these as engines grow
   * flags that run code or read files, so a spec an older release stored may break one of
   * them; the rest (the fields' shapes, the rules between fields) keep their meaning across
   * releases. See {@link ParseDeploymentSpecOptions.policy}.
   */
  readonly policy: boolean;
}

/**
 * The rules across the fields of a spec whose fields have their types: policy ones (see
 * {@link RuleIssue.policy}) only with `policy`, in the order their fields come.
 */
function ruleIssues(spec: z.output<typeof objectSchema>, policy: boolean): RuleIssue[] {
  const out: RuleIssue[] = [];
  const add = (path: RuleIssue["path"], message: string, isPolicy = false): void => {
    if (policy || !isPolicy) out.push({ path, message, policy: isPolicy });
  };
  // zod 4 may run this even when other fields failed: only trust what is well-typed.
  if (!(ENGINES as readonly unknown[]).includes(spec.engine)) return out;
  if (!Array.isArray(spec.extraArgs) || typeof spec.env !== "object" || spec.env === null) {
    return out;
  }
  spec.extraArgs.forEach((arg, i) => {
    if (typeof arg !== "string") return;
    const owned = ownedFlagIn(spec.engine, arg);
    if (owned !== undefined) {
      add(
        ["extraArgs", i],
        `${JSON.stringify(shownArg(arg))} would set ${owned}, which llmgw owns for ${spec.engine}`,
        true,
      );
    }
  });
  const envEntries = Object.entries(spec.env);
  if (policy && envEntries.length > MAX_ENV_VARS) {
    // One issue, not one per variable of an env of any size.
    add(["env"], `env may set at most ${MAX_ENV_VARS} variables`, true);
  } else {
    for (const [key, value] of envEntries) {
      if (key.length > MAX_ENV_KEY) {
        add(["env", key], `env key must be at most ${MAX_ENV_KEY} characters`, true);
      } else if (!ENV_KEY.test(key)) {
        add(["env", key], `env key must match ${ENV_KEY.source}`, true);
      } else {
        const refusal = engineEnvRefusal(key);
        if (refusal !== undefined) {
          add(["env", key], `${key} ${refusal}; no deployment may set it`, true);
        }
      }
      if (typeof value === "string" && CONTROL.test(value)) {
        add(["env", key], "env value must not contain control characters");
      }
    }
  }
  if (spec.engine === "llamacpp" && (spec.tensorParallel > 1 || spec.pipelineParallel > 1)) {
    add(
      [spec.tensorParallel > 1 ? "tensorParallel" : "pipelineParallel"],
      "llamacpp runs one process per replica: tensorParallel and pipelineParallel must be 1",
    );
  }
  if (
    spec.engine === "llamacpp" &&
    spec.nodesPerReplica !== undefined &&
    spec.nodesPerReplica > 1
  ) {
    add(["nodesPerReplica"], "llamacpp cannot span nodes");
  }
  if (spec.maxSurge === 0 && spec.maxUnavailable === 0) {
    add(
      ["maxSurge"],
      "maxSurge and maxUnavailable are both 0: a rolling update could neither add a replica nor take one away",
    );
  }
  if (spec.kvEvents === true && !KV_EVENT_ENGINES.has(spec.engine)) {
    add(
      ["kvEvents"],
      `kvEvents needs an engine that publishes KV-cache events (vllm, sglang, sim); ${spec.engine} does not`,
    );
  }
  if (spec.gpusPerReplica !== undefined && spec.engine !== "llamacpp") {
    const tpPp = spec.tensorParallel * spec.pipelineParallel;
    if (spec.gpusPerReplica !== tpPp) {
      add(
        ["gpusPerReplica"],
        `gpusPerReplica is for llamacpp; ${spec.engine} uses tensorParallel × pipelineParallel = ${tpPp}`,
      );
    }
  }
  return out;
}

/** The spec schema with the rules of {@link ruleIssues}, its policy ones or not. */
function specSchema(policy: boolean) {
  return objectSchema
    .superRefine((spec, ctx) => {
      for (const issue of ruleIssues(spec, policy)) {
        ctx.addIssue({ code: "custom", path: [...issue.path], message: issue.message });
      }
    })
    .transform((spec) => ({ ...spec, servedModelName: spec.servedModelName ?? spec.name }));
}

/**
 * The deployment spec schema (zod 4). Parsing fills defaults: tensorParallel/pipelineParallel/
 * replicas 1, servedModelName = name, routingPolicy "llmgw", priority 0, revision 0, extraArgs
 * [], env {}, trustRemoteCode/allowPreemption false. Unknown keys are refused (typos fail loud).
 */
export const deploymentSpecSchema = specSchema(true);

/** {@link deploymentSpecSchema} without its policy rules (`policy: "report"`). */
const shapeSchema = specSchema(false);

/** A validated deployment spec with defaults filled. */
export type DeploymentSpec = z.infer<typeof deploymentSpecSchema>;

/**
 * Spec fields that do not change how an engine runs (scheduling, routing, limits, the
 * lifecycle): two specs that differ only in these run the same process, so neither the control
 * plane (no rolling update) nor an agent (no restart) replaces a replica for them.
 */
export const NOT_LAUNCHED_FIELDS: readonly (keyof DeploymentSpec)[] = [
  "replicas",
  "revision",
  "routingPolicy",
  "priority",
  "allowPreemption",
  "maxConcurrencyPerReplica",
  "loadingDeadlineSeconds",
  "maxSurge",
  "maxUnavailable",
  "drainTimeoutSeconds",
];

/** True when replicas of `a` and of `b` run the same engine the same way. */
export function sameLaunch(a: DeploymentSpec, b: DeploymentSpec): boolean {
  return launchKey(a) === launchKey(b);
}

/** `spec` without {@link NOT_LAUNCHED_FIELDS}, keys (and env) sorted, as JSON. */
function launchKey(spec: DeploymentSpec): string {
  const skip = new Set<string>(NOT_LAUNCHED_FIELDS);
  const entries = Object.entries(spec)
    .filter(([k, v]) => !skip.has(k) && v !== undefined)
    .sort(([x], [y]) => x.localeCompare(y));
  // Env order means nothing.
  const env = Object.entries(spec.env).sort(([x], [y]) => x.localeCompare(y));
  return JSON.stringify(entries.map(([k, v]) => (k === "env" ? [k, env] : [k, v])));
}

/** Replicas a rolling update starts above the count when absent from the spec. */
export const DEFAULT_MAX_SURGE = 1;
/** Ready replicas a rolling update or drain may take away when absent from the spec. */
export const DEFAULT_MAX_UNAVAILABLE = 0;
/** Seconds a leaving replica may finish its in-flight requests when absent from the spec. */
export const DEFAULT_DRAIN_TIMEOUT_SECONDS = 300;

/**
 * A spec's lifecycle limits with defaults applied. They are not filled in by parsing, so a
 * spec stored before they existed compares equal to the same spec applied again.
 */
export function rolloutLimits(spec: DeploymentSpec): {
  maxSurge: number;
  maxUnavailable: number;
  drainTimeoutMs: number;
} {
  return {
    maxSurge: spec.maxSurge ?? DEFAULT_MAX_SURGE,
    maxUnavailable: spec.maxUnavailable ?? DEFAULT_MAX_UNAVAILABLE,
    drainTimeoutMs: (spec.drainTimeoutSeconds ?? DEFAULT_DRAIN_TIMEOUT_SECONDS) * 1000,
  };
}
/** What callers may pass in (defaults optional; uint64 fields may be decimal strings). */
export type DeploymentSpecInput = z.input<typeof deploymentSpecSchema>;

/** Result of {@link parseDeploymentSpec}. */
export type ParseDeploymentSpecResult =
  | {
      readonly ok: true;
      readonly spec: DeploymentSpec;
      /**
       * Only with `policy: "report"`: the error a parse that enforces the policy rules gives
       * this spec (`LLMGW_ENGINES_INVALID_SPEC`, one issue per rule broken); absent when the
       * spec passes them.
       */
      readonly refused?: EnginesError;
    }
  | { readonly ok: false; readonly error: EnginesError };

/** Options of {@link parseDeploymentSpec}. */
export interface ParseDeploymentSpecOptions {
  /**
   * `"enforce"` (default): a spec that breaks a policy rule (an owned flag in `extraArgs`, an
   * env name no deployment may set, more env than the bounds allow) fails to parse, like any
   * other invalid spec. Everything a deployment author hands in is parsed so.
   *
   * `"report"`: for specs an older release of llmgw accepted and stored. A spec whose only
   * problems are policy ones parses, with those problems as {@link ParseDeploymentSpecResult}'s
   * `refused`: a stricter release can then load it as stored (and refuse to launch it) instead
   * of failing on it. Anything else wrong (a field of the wrong type or shape, an unknown
   * field, a rule between fields) still fails, with every issue, policy ones included.
   */
  readonly policy?: "enforce" | "report";
}

/**
 * Validates untrusted input (parsed JSON/YAML, an RPC message converted to plain data).
 * Never throws; on failure the error has code `LLMGW_ENGINES_INVALID_SPEC` and one issue per
 * bad field, each naming the field and echoing the value that was refused, short of what may
 * be a secret (see {@link DeploymentSpecIssue.value}).
 */
export function parseDeploymentSpec(
  input: unknown,
  options: ParseDeploymentSpecOptions = {},
): ParseDeploymentSpecResult {
  if (options.policy === "report") {
    const shaped = shapeSchema.safeParse(input);
    // A spec wrong in other ways too: every issue, as the enforcing parse finds them.
    if (!shaped.success) return parseDeploymentSpec(input);
    const refused = ruleIssues(shaped.data, true).filter((i) => i.policy);
    if (refused.length === 0) return { ok: true, spec: shaped.data };
    return {
      ok: true,
      spec: shaped.data,
      refused: invalidSpecError(refused.map((i) => specIssue(input, i.path, i.message))),
    };
  }
  const result = deploymentSpecSchema.safeParse(input);
  if (result.success) return { ok: true, spec: result.data };
  const issues: DeploymentSpecIssue[] = result.error.issues.flatMap((i) =>
    i.code === "unrecognized_keys"
      ? i.keys.map((key) =>
          specIssue(input, [...i.path, key], "unknown field (not in llmgw.v1.Deployment)"),
        )
      : [specIssue(input, i.path, i.message)],
  );
  return { ok: false, error: invalidSpecError(issues) };
}

/** One issue as {@link parseDeploymentSpec} reports it: what may be a secret left out. */
function specIssue(
  input: unknown,
  path: readonly PropertyKey[],
  message: string,
): DeploymentSpecIssue {
  const field = formatPath(path);
  if (path[0] === "env") return { field, message };
  const value = valueAt(input, path);
  return { field, message, value: path[0] === "extraArgs" ? shownArg(value) : value };
}

/** `LLMGW_ENGINES_INVALID_SPEC` listing `issues`. */
function invalidSpecError(issues: DeploymentSpecIssue[]): EnginesError {
  const summary = issues
    .map(
      (i) =>
        `${i.field || "(spec)"}: ${i.message}${"value" in i ? ` (got ${preview(i.value)})` : ""}`,
    )
    .join("; ");
  return new EnginesError("LLMGW_ENGINES_INVALID_SPEC", `invalid deployment spec: ${summary}`, {
    issues,
  });
}

/** Like {@link parseDeploymentSpec} but throws the `LLMGW_ENGINES_INVALID_SPEC` error. */
export function parseDeploymentSpecOrThrow(input: unknown): DeploymentSpec {
  const result = parseDeploymentSpec(input);
  if (!result.ok) throw result.error;
  return result.spec;
}

/**
 * GPUs one replica needs: tensorParallel × pipelineParallel for vllm, sglang and sim (sim
 * simulates its GPUs); for llamacpp the optional `gpusPerReplica`, default 0 (CPU).
 */
export function deploymentGpusPerReplica(
  spec: Pick<DeploymentSpec, "engine" | "tensorParallel" | "pipelineParallel" | "gpusPerReplica">,
): number {
  if (spec.engine === "llamacpp") return spec.gpusPerReplica ?? 0;
  return spec.tensorParallel * spec.pipelineParallel;
}

/** True when the engine can run one replica across several nodes. */
export function engineSupportsMultiNode(engine: EngineName): boolean {
  return engine !== "llamacpp";
}

function formatPath(path: readonly PropertyKey[]): string {
  let out = "";
  for (const part of path) {
    if (typeof part === "number") out += `[${part}]`;
    else out += out === "" ? String(part) : `.${String(part)}`;
  }
  return out;
}

function valueAt(input: unknown, path: readonly PropertyKey[]): unknown {
  let cur: unknown = input;
  for (const part of path) {
    if (typeof cur !== "object" || cur === null) return undefined;
    cur = (cur as Record<PropertyKey, unknown>)[part];
  }
  return cur;
}

/** An extra argument as a refusal may show it: `--flag=value` as `--flag=…` (it may be a key). */
function shownArg<T>(arg: T): T | string {
  if (typeof arg !== "string" || !arg.startsWith("-")) return arg;
  const at = arg.indexOf("=");
  return at < 0 ? arg : `${arg.slice(0, at)}=…`;
}

function preview(value: unknown): string {
  if (value === undefined) return "nothing";
  const text = typeof value === "bigint" ? `${value}` : (JSON.stringify(value) ?? String(value));
  return text.length > 120 ? `${text.slice(0, 117)}...` : text;
}
