/**
 * Which environment variables a deployment may hand an engine.
 *
 * A deployment's `env` reaches a process the agent starts (often as root), so an open list
 * is a way in: `PATH` picks the executable, `LD_PRELOAD`/`PYTHONPATH`/`NODE_OPTIONS`/
 * `NCCL_NET_PLUGIN`/`VLLM_PLUGINS` load code, `HF_ENDPOINT` sends `HF_TOKEN` to another host.
 * So there are three tiers:
 *
 * - {@link ENGINE_ENV_ALLOWED}: documented tuning variables of the engines and their runtimes
 *   (vLLM `vllm/envs.py`, SGLang's environment reference, NCCL, PyTorch, OpenMP, CUDA) that
 *   take a number, a flag or a backend name — none loads code, names a file or picks a host.
 * - {@link isEngineEnvNeverAllowed}: names llmgw sets itself (GPU selection, NCCL network,
 *   rendezvous, API keys), secrets, and names that load code or choose executables. Refused by
 *   the spec schema everywhere, and not even the operator's `--allow-engine-env` admits them.
 * - everything else (unknown names, paths, URLs such as `HF_ENDPOINT` for an internal mirror):
 *   syntactically accepted by the spec schema, refused when the launch spec is built unless
 *   the node's operator listed the name (`llmgw agent --allow-engine-env NAME`).
 *
 * Why the agent, not the control plane, decides the third tier: the node runs the process, its
 * operator owns the risk, and only the agent knows its own extension. The control plane parses
 * with the same schema and cannot know which nodes allowed what, so it refuses only the names
 * no node may allow; a replica placed on a node that does not allow a name fails there, with
 * a message naming the variable and the flag.
 */

/** Why a variable is on {@link ENGINE_ENV_ALLOWED}: the component that reads it. */
export type EngineEnvGroup =
  | "vllm"
  | "sglang"
  | "nccl"
  | "torch"
  | "cuda"
  | "threads"
  | "hub"
  | "llamacpp";

/**
 * Variables any deployment may set, each with the component that reads it. Every value is a
 * number, a boolean or a name from a fixed set in the reading code; anything that names a
 * path, a URL, a plugin or a library is left out on purpose (e.g. `VLLM_PLUGINS`,
 * `VLLM_NCCL_SO_PATH`, `VLLM_LOGGING_CONFIG_PATH`, `VLLM_USAGE_STATS_SERVER`,
 * `VLLM_ALLOW_INSECURE_SERIALIZATION`, `VLLM_SERVER_DEV_MODE`, `VLLM_ALLOW_RUNTIME_LORA_UPDATING`,
 * `NCCL_NET_PLUGIN`, `NCCL_TUNER_PLUGIN`, `NCCL_TOPO_FILE`, `NCCL_DEBUG_FILE`,
 * `SGLANG_LOGGING_CONFIG_PATH`, `HF_ENDPOINT`, `TRITON_CACHE_DIR`).
 */
export const ENGINE_ENV_ALLOWED: Readonly<Record<string, EngineEnvGroup>> = {
  // vLLM (vllm/envs.py): kernel and backend choices, timeouts, logging level, telemetry off.
  VLLM_ATTENTION_BACKEND: "vllm",
  VLLM_FLASH_ATTN_VERSION: "vllm",
  VLLM_USE_TRITON_FLASH_ATTN: "vllm",
  VLLM_USE_FLASHINFER_SAMPLER: "vllm",
  VLLM_FLASHINFER_FORCE_TENSOR_CORES: "vllm",
  VLLM_USE_FLASHINFER_MOE_FP8: "vllm",
  VLLM_USE_FLASHINFER_MOE_FP4: "vllm",
  VLLM_USE_DEEP_GEMM: "vllm",
  VLLM_USE_CUDNN_PREFILL: "vllm",
  VLLM_MLA_DISABLE: "vllm",
  VLLM_MARLIN_USE_ATOMIC_ADD: "vllm",
  VLLM_FUSED_MOE_CHUNK_SIZE: "vllm",
  VLLM_ENABLE_FUSED_MOE_ACTIVATION_CHUNKING: "vllm",
  VLLM_MOE_DP_CHUNK_SIZE: "vllm",
  VLLM_MAX_TOKENS_PER_EXPERT_FP4_MOE: "vllm",
  VLLM_ALL2ALL_BACKEND: "vllm",
  VLLM_KV_CACHE_LAYOUT: "vllm",
  VLLM_DISABLED_KERNELS: "vllm",
  VLLM_PP_LAYER_PARTITION: "vllm",
  VLLM_USE_V1: "vllm",
  VLLM_ENABLE_V1_MULTIPROCESSING: "vllm",
  VLLM_V1_OUTPUT_PROC_CHUNK_SIZE: "vllm",
  VLLM_WORKER_MULTIPROC_METHOD: "vllm",
  VLLM_USE_STANDALONE_COMPILE: "vllm",
  VLLM_DISABLE_COMPILE_CACHE: "vllm",
  VLLM_ALLOW_LONG_MAX_MODEL_LEN: "vllm",
  VLLM_SKIP_P2P_CHECK: "vllm",
  VLLM_ENGINE_ITERATION_TIMEOUT_S: "vllm",
  VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS: "vllm",
  VLLM_RPC_TIMEOUT: "vllm",
  VLLM_HTTP_TIMEOUT_KEEP_ALIVE: "vllm",
  VLLM_IMAGE_FETCH_TIMEOUT: "vllm",
  VLLM_VIDEO_FETCH_TIMEOUT: "vllm",
  VLLM_AUDIO_FETCH_TIMEOUT: "vllm",
  VLLM_TOOL_PARSE_REGEX_TIMEOUT_SECONDS: "vllm",
  VLLM_KEEP_ALIVE_ON_ENGINE_DEATH: "vllm",
  VLLM_SLEEP_WHEN_IDLE: "vllm",
  VLLM_MM_INPUT_CACHE_GIB: "vllm",
  VLLM_XGRAMMAR_CACHE_MB: "vllm",
  VLLM_MSGPACK_ZERO_COPY_THRESHOLD: "vllm",
  VLLM_MQ_MAX_CHUNK_BYTES_MB: "vllm",
  VLLM_CPU_KVCACHE_SPACE: "vllm",
  VLLM_CPU_OMP_THREADS_BIND: "vllm",
  VLLM_COMPUTE_NANS_IN_LOGITS: "vllm",
  VLLM_LOGGING_LEVEL: "vllm",
  VLLM_LOGGING_PREFIX: "vllm",
  VLLM_LOG_STATS_INTERVAL: "vllm",
  VLLM_LOG_BATCHSIZE_INTERVAL: "vllm",
  VLLM_RINGBUFFER_WARNING_INTERVAL: "vllm",
  VLLM_NO_DEPRECATION_WARNING: "vllm",
  VLLM_NO_USAGE_STATS: "vllm",
  VLLM_DO_NOT_TRACK: "vllm",
  DO_NOT_TRACK: "vllm",
  // SGLang (docs/references/environment_variables): compile, affinity, timeouts.
  SGLANG_ENABLE_TORCH_COMPILE: "sglang",
  SGLANG_ENABLE_TORCH_INFERENCE_MODE: "sglang",
  SGLANG_SET_CPU_AFFINITY: "sglang",
  SGLANG_DISABLE_REQUEST_LOGGING: "sglang",
  SGLANG_HEALTH_CHECK_TIMEOUT: "sglang",
  SGLANG_FORWARD_UNKNOWN_TOOLS: "sglang",
  SGLANG_REQ_WAITING_TIMEOUT: "sglang",
  SGLANG_REQ_RUNNING_TIMEOUT: "sglang",
  SGLANG_EPLB_HEATMAP_COLLECTION_INTERVAL: "sglang",
  SGL_ENABLE_JIT_DEEPGEMM: "sglang",
  // NCCL tuning (NCCL's environment-variable reference); the network choice is llmgw's.
  NCCL_DEBUG: "nccl",
  NCCL_DEBUG_SUBSYS: "nccl",
  NCCL_P2P_LEVEL: "nccl",
  NCCL_P2P_DISABLE: "nccl",
  NCCL_SHM_DISABLE: "nccl",
  NCCL_MIN_NCHANNELS: "nccl",
  NCCL_MAX_NCHANNELS: "nccl",
  NCCL_MIN_CTAS: "nccl",
  NCCL_MAX_CTAS: "nccl",
  NCCL_NTHREADS: "nccl",
  NCCL_BUFFSIZE: "nccl",
  NCCL_ALGO: "nccl",
  NCCL_PROTO: "nccl",
  NCCL_CUMEM_ENABLE: "nccl",
  NCCL_NVLS_ENABLE: "nccl",
  NCCL_CROSS_NIC: "nccl",
  NCCL_NET_GDR_LEVEL: "nccl",
  NCCL_NET_GDR_READ: "nccl",
  NCCL_IB_TIMEOUT: "nccl",
  NCCL_IB_RETRY_CNT: "nccl",
  NCCL_IB_QPS_PER_CONNECTION: "nccl",
  NCCL_IB_SPLIT_DATA_ON_QPS: "nccl",
  NCCL_IB_PCI_RELAXED_ORDERING: "nccl",
  NCCL_IB_ADAPTIVE_ROUTING: "nccl",
  NCCL_LAUNCH_MODE: "nccl",
  NCCL_IGNORE_CPU_AFFINITY: "nccl",
  NCCL_ASYNC_ERROR_HANDLING: "nccl",
  // PyTorch: allocator and distributed error handling.
  PYTORCH_CUDA_ALLOC_CONF: "torch",
  PYTORCH_ALLOC_CONF: "torch",
  TORCH_NCCL_ASYNC_ERROR_HANDLING: "torch",
  TORCH_NCCL_BLOCKING_WAIT: "torch",
  TORCH_NCCL_AVOID_RECORD_STREAMS: "torch",
  TORCH_NCCL_ENABLE_MONITORING: "torch",
  TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC: "torch",
  TORCH_DISTRIBUTED_DEBUG: "torch",
  // CUDA runtime.
  CUDA_LAUNCH_BLOCKING: "cuda",
  CUDA_DEVICE_MAX_CONNECTIONS: "cuda",
  CUDA_MODULE_LOADING: "cuda",
  // Thread pools.
  OMP_NUM_THREADS: "threads",
  MKL_NUM_THREADS: "threads",
  OPENBLAS_NUM_THREADS: "threads",
  RAYON_NUM_THREADS: "threads",
  TOKENIZERS_PARALLELISM: "threads",
  // Hugging Face hub client: timeouts and output only (never the endpoint or cache paths).
  HF_HUB_ENABLE_HF_TRANSFER: "hub",
  HF_HUB_DOWNLOAD_TIMEOUT: "hub",
  HF_HUB_ETAG_TIMEOUT: "hub",
  HF_HUB_DISABLE_PROGRESS_BARS: "hub",
  HF_HUB_DISABLE_TELEMETRY: "hub",
  // llama.cpp/ggml CUDA tuning.
  GGML_CUDA_ENABLE_UNIFIED_MEMORY: "llamacpp",
};

/** Why a variable is in {@link ENGINE_ENV_NEVER_ALLOWED}. */
export type EngineEnvDenyReason = "owned" | "secret" | "code" | "exec" | "trust";

const DENY_TEXT: Readonly<Record<EngineEnvDenyReason, string>> = {
  owned: "is set by llmgw",
  secret: "is a secret that belongs in the agent's environment file",
  code: "makes the engine load code from a path or module the deployment chooses",
  exec: "chooses which executables or configuration files the engine runs",
  trust: "decides which TLS certificates the engine trusts",
};

/**
 * Names nobody may set, not even through the operator's `--allow-engine-env` (exact names;
 * see {@link ENGINE_ENV_NEVER_ALLOWED_PATTERNS} for families). Owned and secret names are
 * added by `deployment-spec.ts` from the lists llmgw fills them from.
 */
export const ENGINE_ENV_NEVER_ALLOWED: Readonly<Record<string, EngineEnvDenyReason>> = {
  PATH: "exec",
  HOME: "exec",
  // Compilers Triton, torch.compile and JIT extensions run; config files read at startup
  // (OpenSSL's can load engine modules, NCCL's sets any NCCL variable, the owned ones too).
  CC: "exec",
  CXX: "exec",
  OPENSSL_CONF: "code",
  NCCL_CONF_FILE: "exec",
  // A CA bundle of the deployment's choosing lets a look-alike Hub receive HF_TOKEN.
  REQUESTS_CA_BUNDLE: "trust",
  CURL_CA_BUNDLE: "trust",
  SHELL: "exec",
  IFS: "exec",
  XDG_CONFIG_HOME: "exec",
  VLLM_CONFIG_ROOT: "exec",
  BASH_ENV: "code",
  ENV: "code",
  SHELLOPTS: "code",
  PS4: "code",
  GCONV_PATH: "code",
  PERL5LIB: "code",
  PERL5OPT: "code",
  PERLLIB: "code",
  RUBYOPT: "code",
  RUBYLIB: "code",
  VLLM_NCCL_SO_PATH: "code",
  VLLM_CUDART_SO_PATH: "code",
  VLLM_LOGGING_CONFIG_PATH: "code",
  VLLM_ALLOW_INSECURE_SERIALIZATION: "code",
  VLLM_TRACE_FUNCTION: "code",
  SGLANG_LOGGING_CONFIG_PATH: "code",
  VLLM_HOST_IP: "owned",
  VLLM_PORT: "owned",
  SGLANG_HOST_IP: "owned",
  SGLANG_PORT: "owned",
};

/**
 * Families nobody may set, with the reason: the dynamic loader (`LD_*`), interpreters' startup
 * hooks (`PYTHON*` — `PYTHONWARNINGS` imports the category's module, `PYTHONSTARTUP` runs a
 * file; `NODE_*` for the simulated engine), plugin and library selectors (`*_PLUGIN`,
 * `*_PLUGINS`, `*_SO_PATH`, `*_LIBRARY_PATH`), trust stores (`SSL_CERT_*`), Triton's tool
 * paths (`TRITON_*_PATH`), llama-server's flag mirror `LLAMA_ARG_*` and llmgw's own `LLMGW_*`.
 * On top of these, every `*_PATH`/`*_DIR`/`*_FILE`/`*_CONF` name not on
 * {@link ENGINE_ENV_ALLOWED} is never allowed. Proxies (`HTTPS_PROXY`) stay operator-allowable:
 * a proxy is a real operator need, and only the operator can vouch for one. llama-server reads any of its flags as `LLAMA_ARG_<FLAG>` (model,
 * hf-repo, host, …): the owned flags must not come in through that back door.
 */
export const ENGINE_ENV_NEVER_ALLOWED_PATTERNS: readonly {
  readonly pattern: RegExp;
  readonly reason: EngineEnvDenyReason;
}[] = [
  { pattern: /^LD_/, reason: "code" },
  { pattern: /^PYTHON/, reason: "code" },
  { pattern: /^NODE_/, reason: "code" },
  { pattern: /_PLUGINS?$/, reason: "code" },
  { pattern: /_PLUGIN_/, reason: "code" },
  { pattern: /_SO_PATH$/, reason: "code" },
  { pattern: /_LIBRARY_PATH$/, reason: "code" },
  { pattern: /^SSL_CERT_/, reason: "trust" },
  // Triton runs the ptxas/cuobjdump/nvdisasm these name.
  { pattern: /^TRITON_.*_PATH$/, reason: "exec" },
  { pattern: /^LLAMA_ARG_/, reason: "owned" },
  { pattern: /^LLMGW_/, reason: "owned" },
];

// Any other variable that names a path, directory, file or config file: a deployment must not
// choose what the engine reads or writes on the host, and the operator cannot vouch for every
// such name. Built-in allowed names (`PYTORCH_CUDA_ALLOC_CONF` takes key:value tuning) pass.
const FILE_NAME = /_(PATH|DIR|FILE|CONF)$/;

/** Shape of an environment variable name a deployment may write. */
export const ENGINE_ENV_NAME = /^[A-Z_][A-Z0-9_]*$/;

/**
 * Why `name` may never be set by a deployment (text for an error message), or undefined when
 * it may be allowed. `extraDenied` are exact names with their reasons (owned/secret lists).
 */
export function engineEnvNeverAllowedReason(
  name: string,
  extraDenied: Readonly<Record<string, EngineEnvDenyReason>> = {},
): string | undefined {
  const reason =
    extraDenied[name] ??
    ENGINE_ENV_NEVER_ALLOWED[name] ??
    ENGINE_ENV_NEVER_ALLOWED_PATTERNS.find((p) => p.pattern.test(name))?.reason ??
    (FILE_NAME.test(name) && !Object.hasOwn(ENGINE_ENV_ALLOWED, name) ? "exec" : undefined);
  return reason === undefined ? undefined : DENY_TEXT[reason];
}

/** The operator hint every refusal of an allowable name ends with. */
export function allowEngineEnvHint(name: string): string {
  return `an operator can allow it on a node with \`llmgw agent --allow-engine-env ${name}\` (or LLMGW_ALLOW_ENGINE_ENV=${name})`;
}
