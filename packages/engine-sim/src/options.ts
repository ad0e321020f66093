import { parseArgs } from "node:util";
import { EngineSimError } from "./errors.js";
import {
  type ResolvedTimingModelOptions,
  resolveTimingModelOptions,
  type TimingModelOptions,
} from "./timing-model.js";

/** Which real engine's startup, health and metrics the simulator imitates. */
export type EngineSimMimic = "vllm" | "sglang";

/** Faults injected on demand (all off by default). */
export interface EngineSimFaults {
  /** Exit during loading with an error line instead of becoming ready. */
  failLoad?: boolean;
  /** Crash (close every socket, exit non-zero) once N inference requests have been answered. */
  crashAfterRequests?: number;
  /** After N inference requests, accept further ones but never answer them (0: hang from the start). */
  hangAfterRequests?: number;
  /** Fraction (0–1) of inference requests answered with a 500, chosen by the seeded PRNG. */
  errorRate?: number;
  /** Extra delay per decode step, ms (every stream slows down by this per token). */
  slowTokenMs?: number;
  /** Crash when any stream has sent this many tokens (dies mid-stream). */
  dieMidStreamAfterTokens?: number;
}

/** {@link EngineSimFaults} resolved; `null` means the fault is off. */
export interface ResolvedEngineSimFaults {
  readonly failLoad: boolean;
  readonly crashAfterRequests: number | null;
  readonly hangAfterRequests: number | null;
  readonly errorRate: number;
  readonly slowTokenMs: number;
  readonly dieMidStreamAfterTokens: number | null;
}

/**
 * KV-cache events, as vLLM's `--kv-events-config` (`KVEventsConfig`, vllm/config/kv_events.py)
 * names them in camelCase, plus the event encoding. The sim's publisher always binds its
 * endpoints (vLLM binds for `*`, `::`, `ipc://`, `inproc://` and connects otherwise).
 */
export interface EngineSimKvEventsOptions {
  /** Default false: no events. */
  enableKvCacheEvents?: boolean;
  /** `"zmq"` (the default once enabled) or `"null"` (no events). */
  publisher?: "zmq" | "null";
  /** PUB endpoint. Default `tcp://*:5557`; port 0 picks a free one. */
  endpoint?: string;
  /** Replay ROUTER endpoint; none by default. */
  replayEndpoint?: string | null;
  /** First frame of every message. Default "". */
  topic?: string;
  /** Batches kept for replay. Default 10 000. */
  bufferSteps?: number;
  /** `"tagged"` (vLLM ≥ 0.26, the default) or `"positional"` (earlier vLLM, SGLang). */
  encoding?: "tagged" | "positional";
}

/** {@link EngineSimKvEventsOptions} of an engine that publishes. */
export interface ResolvedEngineSimKvEvents {
  readonly endpoint: string;
  readonly replayEndpoint: string | undefined;
  readonly topic: string;
  readonly bufferSteps: number;
  readonly encoding: "tagged" | "positional";
}

/** User-facing options of the simulated engine; see the README for every default. */
export interface EngineSimOptions {
  /** Model path or id, as given to a real engine. Required. */
  model: string;
  /** Name in `/v1/models`, request `model` fields and metric labels. Default: `model`. */
  servedModelName?: string;
  /** Bind address. Default 127.0.0.1. */
  host?: string;
  /**
   * Key every `/v1/*` request must carry as `Authorization: Bearer <key>` (401 otherwise);
   * `/health` and `/metrics` stay open, as in vLLM. Default: none, everything open.
   */
  apiKey?: string;
  /** API port; 0 picks a free one. Default 8000. */
  port?: number;
  /** Context length (prompt + output tokens). Default 8192. */
  maxModelLen?: number;
  /**
   * vLLM `--enable-prompt-tokens-details`: answers carry
   * `usage.prompt_tokens_details.cached_tokens`, and (as in vLLM) only when the prefix cache
   * served some of the prompt. Default false: no `prompt_tokens_details` at all.
   */
  enablePromptTokensDetails?: boolean;
  /** Default "vllm". */
  mimic?: EngineSimMimic;
  /** Seconds with the port closed while "weights load" (real seconds, not scaled). Default 0. */
  loadSeconds?: number;
  /** SGLang mode: seconds of 503 on `/health` after the port opens (warm-up). Default 0.5. */
  warmupSeconds?: number;
  /** Seed of every pseudo-random choice. Default 0. */
  seed?: number;
  /** Multi-node: number of ranks. Default 1. */
  nnodes?: number;
  /** Multi-node: this rank. Default 0. */
  nodeRank?: number;
  /** Multi-node: rank 0's rendezvous address `host:port` (required when nnodes > 1). */
  distInitAddr?: string;
  /** How long ranks wait for each other, s. Default 120. */
  distTimeoutSeconds?: number;
  /** Speeds up simulated time: 10 makes every step 10× shorter in real time. Default 1. */
  timeScale?: number;
  /** Timing model knobs. */
  timing?: TimingModelOptions;
  /** Shortest natural output, tokens (before `max_tokens`). Default 16. */
  minOutputTokens?: number;
  /** Longest natural output, tokens (before `max_tokens`). Default 256. */
  maxOutputTokens?: number;
  /** Largest accepted request body, bytes. Default 4 MiB. */
  maxBodyBytes?: number;
  /** Dimension of `/v1/embeddings` vectors. Default 64. */
  embeddingDim?: number;
  faults?: EngineSimFaults;
  /** KV-cache events over ZMQ, as vLLM publishes them. Default: off. */
  kvEvents?: EngineSimKvEventsOptions;
  /** Receives each log line (no trailing newline). Default: dropped. */
  log?: (line: string) => void;
}

/** {@link EngineSimOptions} with defaults applied, validated once. */
export interface ResolvedEngineSimOptions {
  readonly model: string;
  readonly servedModelName: string;
  readonly host: string;
  readonly apiKey: string | undefined;
  readonly port: number;
  readonly maxModelLen: number;
  readonly enablePromptTokensDetails: boolean;
  readonly mimic: EngineSimMimic;
  readonly loadMs: number;
  readonly warmupMs: number;
  readonly seed: number;
  readonly nnodes: number;
  readonly nodeRank: number;
  readonly distInitAddr: { readonly host: string; readonly port: number } | undefined;
  readonly distTimeoutMs: number;
  readonly timeScale: number;
  readonly timing: ResolvedTimingModelOptions;
  readonly minOutputTokens: number;
  readonly maxOutputTokens: number;
  readonly maxBodyBytes: number;
  readonly embeddingDim: number;
  readonly faults: ResolvedEngineSimFaults;
  /** Undefined when KV events are off. */
  readonly kvEvents: ResolvedEngineSimKvEvents | undefined;
  readonly log: (line: string) => void;
}

function invalid(message: string): EngineSimError {
  return new EngineSimError("LLMGW_ENGINE_SIM_INVALID_OPTION", message);
}

function int(name: string, value: number, min: number, max = Number.MAX_SAFE_INTEGER): number {
  if (!Number.isInteger(value) || value < min || value > max) {
    throw invalid(`${name} must be an integer in [${min}, ${max}], got ${String(value)}`);
  }
  return value;
}

function nonNeg(name: string, value: number, max = Number.POSITIVE_INFINITY): number {
  if (!Number.isFinite(value) || value < 0 || value > max) {
    throw invalid(`${name} must be a number in [0, ${max}], got ${String(value)}`);
  }
  return value;
}

/** Parses `host:port` (IPv6 as `[addr]:port`). */
export function parseHostPort(text: string): { host: string; port: number } {
  const m = /^(?:\[([^\]]+)\]|([^:]+)):(\d{1,5})$/.exec(text);
  const port = m ? Number(m[3]) : Number.NaN;
  if (!m || port < 1 || port > 65535) {
    throw invalid(`distInitAddr must be host:port, got ${JSON.stringify(text)}`);
  }
  return { host: m[1] ?? m[2] ?? "", port };
}

/** Resolves {@link EngineSimKvEventsOptions}; undefined when events are off. */
export function resolveKvEventsOptions(
  options: EngineSimKvEventsOptions | undefined,
): ResolvedEngineSimKvEvents | undefined {
  if (!options?.enableKvCacheEvents) return undefined;
  const publisher = options.publisher ?? "zmq";
  if (publisher !== "zmq" && publisher !== "null") {
    throw invalid(`kvEvents.publisher must be "zmq" or "null", got ${JSON.stringify(publisher)}`);
  }
  if (publisher === "null") return undefined;
  const encoding = options.encoding ?? "tagged";
  if (encoding !== "tagged" && encoding !== "positional") {
    throw invalid(
      `kvEvents.encoding must be "tagged" or "positional", got ${JSON.stringify(encoding)}`,
    );
  }
  const endpoint = options.endpoint ?? "tcp://*:5557";
  const endpoints: [string, unknown][] = [["endpoint", endpoint]];
  if (options.replayEndpoint != null) endpoints.push(["replayEndpoint", options.replayEndpoint]);
  for (const [name, value] of endpoints) {
    if (typeof value !== "string" || !/^(tcp|ipc|inproc):\/\/./.test(value)) {
      throw invalid(
        `kvEvents.${name} must be a tcp://, ipc:// or inproc:// endpoint, got ${JSON.stringify(value)}`,
      );
    }
  }
  if (options.topic !== undefined && typeof options.topic !== "string") {
    throw invalid(`kvEvents.topic must be a string, got ${JSON.stringify(options.topic)}`);
  }
  return Object.freeze({
    endpoint,
    replayEndpoint: options.replayEndpoint ?? undefined,
    topic: options.topic ?? "",
    bufferSteps: int("kvEvents.bufferSteps", options.bufferSteps ?? 10_000, 0),
    encoding,
  });
}

/**
 * Parses vLLM's `--kv-events-config` JSON (snake_case keys of `KVEventsConfig`) into
 * {@link EngineSimKvEventsOptions}. `hwm` and `max_queue_size` are accepted and ignored;
 * any other key is refused, as vLLM's config refuses unknown fields.
 */
export function parseKvEventsConfig(text: string): EngineSimKvEventsOptions {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (error) {
    throw invalid(
      `--kv-events-config must be JSON: ${error instanceof Error ? error.message : String(error)}`,
    );
  }
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) {
    throw invalid(`--kv-events-config must be a JSON object, got ${JSON.stringify(text)}`);
  }
  const keys: Record<string, keyof EngineSimKvEventsOptions | null> = {
    enable_kv_cache_events: "enableKvCacheEvents",
    publisher: "publisher",
    endpoint: "endpoint",
    replay_endpoint: "replayEndpoint",
    topic: "topic",
    buffer_steps: "bufferSteps",
    hwm: null,
    max_queue_size: null,
  };
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(raw)) {
    if (!(key in keys))
      throw invalid(`--kv-events-config has an unknown key ${JSON.stringify(key)}`);
    const name = keys[key];
    if (name) out[name] = value;
  }
  if (out.enableKvCacheEvents !== undefined && typeof out.enableKvCacheEvents !== "boolean") {
    throw invalid(
      `--kv-events-config enable_kv_cache_events must be a boolean, got ${JSON.stringify(out.enableKvCacheEvents)}`,
    );
  }
  return out as EngineSimKvEventsOptions;
}

/** Applies defaults and validates; throws `LLMGW_ENGINE_SIM_INVALID_OPTION` naming the option. */
export function resolveEngineSimOptions(options: EngineSimOptions): ResolvedEngineSimOptions {
  if (typeof options.model !== "string" || options.model === "") {
    throw invalid("model is required");
  }
  const mimic = options.mimic ?? "vllm";
  if (mimic !== "vllm" && mimic !== "sglang") {
    throw invalid(`mimic must be "vllm" or "sglang", got ${JSON.stringify(mimic)}`);
  }
  const nnodes = int("nnodes", options.nnodes ?? 1, 1, 1024);
  const nodeRank = int("nodeRank", options.nodeRank ?? 0, 0, nnodes - 1);
  if (nnodes > 1 && !options.distInitAddr)
    throw invalid("distInitAddr is required when nnodes > 1");
  const timing = resolveTimingModelOptions({
    ...options.timing,
    extraStepMs: (options.timing?.extraStepMs ?? 0) + (options.faults?.slowTokenMs ?? 0),
  });
  const maxModelLen = int("maxModelLen", options.maxModelLen ?? 8192, 2);
  if (maxModelLen > timing.kvCacheTokens) {
    throw invalid(
      `maxModelLen (${maxModelLen}) is larger than the KV cache (${timing.kvCacheTokens} tokens)`,
    );
  }
  const minOutputTokens = int("minOutputTokens", options.minOutputTokens ?? 16, 1);
  const maxOutputTokens = int(
    "maxOutputTokens",
    options.maxOutputTokens ?? Math.max(256, minOutputTokens),
    minOutputTokens,
  );
  const f = options.faults ?? {};
  // Length only: the value is a secret and never echoed.
  if (options.apiKey !== undefined && !/^[\x21-\x7e]{1,512}$/.test(options.apiKey)) {
    throw invalid(
      `apiKey must be 1-512 printable ASCII characters without spaces (got ${options.apiKey.length} characters)`,
    );
  }
  return Object.freeze({
    model: options.model,
    servedModelName: options.servedModelName || options.model,
    host: options.host ?? "127.0.0.1",
    apiKey: options.apiKey,
    port: int("port", options.port ?? 8000, 0, 65535),
    maxModelLen,
    enablePromptTokensDetails: options.enablePromptTokensDetails === true,
    mimic,
    loadMs: nonNeg("loadSeconds", options.loadSeconds ?? 0) * 1000,
    warmupMs: nonNeg("warmupSeconds", options.warmupSeconds ?? 0.5) * 1000,
    seed: int("seed", options.seed ?? 0, 0, 2 ** 32 - 1),
    nnodes,
    nodeRank,
    distInitAddr: options.distInitAddr ? parseHostPort(options.distInitAddr) : undefined,
    distTimeoutMs: nonNeg("distTimeoutSeconds", options.distTimeoutSeconds ?? 120) * 1000,
    timeScale:
      options.timeScale !== undefined && options.timeScale <= 0
        ? (() => {
            throw invalid(`timeScale must be > 0, got ${options.timeScale}`);
          })()
        : nonNeg("timeScale", options.timeScale ?? 1),
    timing,
    minOutputTokens,
    maxOutputTokens,
    maxBodyBytes: int("maxBodyBytes", options.maxBodyBytes ?? 4 * 1024 * 1024, 1),
    embeddingDim: int("embeddingDim", options.embeddingDim ?? 64, 1, 65536),
    faults: Object.freeze({
      failLoad: f.failLoad ?? false,
      crashAfterRequests:
        f.crashAfterRequests === undefined
          ? null
          : int("crashAfterRequests", f.crashAfterRequests, 1),
      hangAfterRequests:
        f.hangAfterRequests === undefined ? null : int("hangAfterRequests", f.hangAfterRequests, 0),
      errorRate: nonNeg("errorRate", f.errorRate ?? 0, 1),
      slowTokenMs: nonNeg("slowTokenMs", f.slowTokenMs ?? 0),
      dieMidStreamAfterTokens:
        f.dieMidStreamAfterTokens === undefined
          ? null
          : int("dieMidStreamAfterTokens", f.dieMidStreamAfterTokens, 1),
    }),
    kvEvents: resolveKvEventsOptions(options.kvEvents),
    log: options.log ?? (() => {}),
  });
}

/** Help text of the `engine-sim` command line (shared by `llmgw engine-sim` and the test bin). */
export const ENGINE_SIM_USAGE = `Usage: llmgw engine-sim --model NAME [--port P] [options]

A simulated OpenAI-compatible inference engine (vLLM or SGLang flavoured) for scale, timing
and fault tests. Logs go to stdout like a real engine's.

Engine flags (as the engine adapter emits them):
  --model M                     model path or id (required)
  --served-model-name NAME      name in /v1/models and requests (default: --model)
  --host H                      bind address (default 127.0.0.1)
                                $LLMGW_ENGINE_API_KEY, when set, is the key every /v1/*
                                request must send as Authorization: Bearer (never a flag:
                                argv is readable by every local user)
  --port P                      API port, 0 = any free port (default 8000)
  --max-model-len N             context length in tokens (default 8192)
  --enable-prompt-tokens-details  report usage.prompt_tokens_details.cached_tokens (only
                                when > 0, as vLLM; default off)
  --mimic vllm|sglang           startup, /health and /metrics flavour (default vllm)
  --load-seconds S              port stays closed while "loading" (default 0)
  --warmup-seconds S            sglang: /health answers 503 for S after opening (default 0.5)
  --seed N                      seed of all pseudo-random output (default 0)
  --nnodes N --node-rank R --dist-init-addr HOST:PORT
                                multi-node: ranks >= 1 join rank 0 over TCP
  --dist-timeout-seconds S      how long ranks wait for each other (default 120)

Timing model (defaults: an 8B model on one H100):
  --time-scale F                run simulated time F times faster (default 1)
  --prefill-tps N               prefill tokens per second (default 10000)
  --decode-step-ms MS           decode step at batch 1 (default 12)
  --decode-step-ms-per-seq MS   extra step time per extra sequence (default 0.14)
  --max-num-seqs N              running sequences at most (default 256)
  --max-num-batched-tokens N    token budget per step (default 8192)
  --kv-cache-tokens N           KV cache capacity in tokens (default 400000)
  --block-size N                tokens per KV / prefix-cache block (default 16)
  --min-output-tokens N         shortest natural answer (default 16)
  --max-output-tokens N         longest natural answer (default 256)
  --max-body-bytes N            request body limit (default 4194304)
  --embedding-dim N             /v1/embeddings dimension (default 64)

Faults:
  --fail-load                   exit non-zero during loading with an error line
  --crash-after-requests N      exit non-zero once N inference requests were answered
  --hang-after-requests N       answer N inference requests, then accept but never answer
                                (0 = hang from the start; /health keeps answering 200)
  --error-rate F                answer a fraction F of inference requests with 500
  --slow-token-ms MS            add MS to every decode step (slow streams)
  --die-mid-stream-after-tokens N  exit non-zero once any stream has sent N tokens

KV-cache events (as vLLM):
  --kv-events-config JSON       e.g. '{"enable_kv_cache_events":true,"publisher":"zmq",
                                "endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558",
                                "topic":"kv@host:port@model","buffer_steps":10000}'
  --kv-events-encoding tagged|positional
                                event form: tagged maps (vLLM >= 0.26, default) or
                                positional arrays (earlier vLLM, SGLang)
`;

function num(flag: string, text: string | undefined): number | undefined {
  if (text === undefined) return undefined;
  const value = Number(text);
  if (text.trim() === "" || !Number.isFinite(value)) {
    throw invalid(`--${flag} expects a number, got ${JSON.stringify(text)}`);
  }
  return value;
}

/**
 * Parses the `engine-sim` flags (see {@link ENGINE_SIM_USAGE}) into options, on top of
 * `fromEnvironment` (what the caller read from the environment: the API key). Throws
 * `LLMGW_ENGINE_SIM_INVALID_OPTION` for unknown flags and bad values; `help` is true for
 * `--help`.
 */
export function parseEngineSimArgv(
  argv: readonly string[],
  fromEnvironment: Pick<EngineSimOptions, "apiKey"> = {},
): {
  options: EngineSimOptions;
  help: boolean;
} {
  const s = { type: "string" } as const;
  const b = { type: "boolean" } as const;
  let values: Record<string, string | boolean | undefined>;
  try {
    values = parseArgs({
      args: [...argv],
      strict: true,
      options: {
        help: { ...b, short: "h" },
        model: s,
        "served-model-name": s,
        host: s,
        port: s,
        "max-model-len": s,
        "enable-prompt-tokens-details": b,
        mimic: s,
        "load-seconds": s,
        "warmup-seconds": s,
        seed: s,
        nnodes: s,
        "node-rank": s,
        "dist-init-addr": s,
        "dist-timeout-seconds": s,
        "time-scale": s,
        "prefill-tps": s,
        "decode-step-ms": s,
        "decode-step-ms-per-seq": s,
        "max-num-seqs": s,
        "max-num-batched-tokens": s,
        "kv-cache-tokens": s,
        "block-size": s,
        "min-output-tokens": s,
        "max-output-tokens": s,
        "max-body-bytes": s,
        "embedding-dim": s,
        "fail-load": b,
        "crash-after-requests": s,
        "hang-after-requests": s,
        "error-rate": s,
        "slow-token-ms": s,
        "die-mid-stream-after-tokens": s,
        "kv-events-config": s,
        "kv-events-encoding": s,
      },
    }).values;
  } catch (error) {
    throw new EngineSimError(
      "LLMGW_ENGINE_SIM_INVALID_OPTION",
      error instanceof Error ? error.message : String(error),
      { cause: error },
    );
  }
  const str = (k: string): string | undefined => values[k] as string | undefined;
  const n = (k: string): number | undefined => num(k, str(k));
  if (values.help) return { options: { model: "" }, help: true };
  const model = str("model");
  if (!model) throw invalid("--model is required");
  const mimic = str("mimic");
  if (mimic !== undefined && mimic !== "vllm" && mimic !== "sglang") {
    throw invalid(`--mimic must be vllm or sglang, got ${JSON.stringify(mimic)}`);
  }
  const kvConfig = str("kv-events-config");
  const kvEncoding = str("kv-events-encoding");
  const kvEvents: EngineSimKvEventsOptions | undefined =
    kvConfig === undefined && kvEncoding === undefined
      ? undefined
      : {
          ...(kvConfig === undefined ? {} : parseKvEventsConfig(kvConfig)),
          ...(kvEncoding === undefined
            ? {}
            : { encoding: kvEncoding as EngineSimKvEventsOptions["encoding"] }),
        };
  const options: EngineSimOptions = {
    ...fromEnvironment,
    model,
    servedModelName: str("served-model-name"),
    host: str("host"),
    port: n("port"),
    maxModelLen: n("max-model-len"),
    ...(values["enable-prompt-tokens-details"] === true ? { enablePromptTokensDetails: true } : {}),
    mimic,
    loadSeconds: n("load-seconds"),
    warmupSeconds: n("warmup-seconds"),
    seed: n("seed"),
    nnodes: n("nnodes"),
    nodeRank: n("node-rank"),
    distInitAddr: str("dist-init-addr"),
    distTimeoutSeconds: n("dist-timeout-seconds"),
    timeScale: n("time-scale"),
    timing: {
      prefillTokensPerSecond: n("prefill-tps"),
      decodeStepMs: n("decode-step-ms"),
      decodeStepMsPerSeq: n("decode-step-ms-per-seq"),
      maxRunningSeqs: n("max-num-seqs"),
      maxBatchedTokens: n("max-num-batched-tokens"),
      kvCacheTokens: n("kv-cache-tokens"),
      blockSizeTokens: n("block-size"),
    },
    minOutputTokens: n("min-output-tokens"),
    maxOutputTokens: n("max-output-tokens"),
    maxBodyBytes: n("max-body-bytes"),
    embeddingDim: n("embedding-dim"),
    faults: {
      failLoad: values["fail-load"] === true,
      crashAfterRequests: n("crash-after-requests"),
      hangAfterRequests: n("hang-after-requests"),
      errorRate: n("error-rate"),
      slowTokenMs: n("slow-token-ms"),
      dieMidStreamAfterTokens: n("die-mid-stream-after-tokens"),
    },
    ...(kvEvents === undefined ? {} : { kvEvents }),
  };
  // Validate now so a bad flag fails before anything starts.
  resolveEngineSimOptions(options);
  return { options, help: false };
}
