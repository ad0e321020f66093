import type { PrometheusSample } from "./prometheus.js";

/** Engine families whose `/metrics` names are understood. */
export type EngineKind = "vllm" | "sglang" | "llamacpp";

/**
 * Load signals of one engine. A field is absent when the engine did not report it — never
 * 0 in its place.
 */
export interface EngineLoad {
  /** Requests being executed. */
  readonly running?: number;
  /** Requests queued. */
  readonly waiting?: number;
  /** KV-cache (token pool) usage, 0–1. */
  readonly kvCacheUsage?: number;
  /** Prefix-cache hit rate, 0–1. */
  readonly prefixCacheHitRate?: number;
  /** KV-cache capacity in tokens (what a router may assume the prefix cache can hold). */
  readonly kvCacheTokens?: number;
}

const PREFIX: Record<EngineKind, string> = {
  vllm: "vllm:",
  sglang: "sglang:",
  llamacpp: "llamacpp:",
};

/** The engine kind whose metric prefix appears first in `samples`, if any. */
export function detectEngineKind(samples: readonly PrometheusSample[]): EngineKind | undefined {
  for (const sample of samples) {
    for (const kind of Object.keys(PREFIX) as EngineKind[]) {
      if (sample.name.startsWith(PREFIX[kind])) return kind;
    }
  }
  return undefined;
}

/**
 * Maps parsed `/metrics` samples of vLLM, SGLang or llama.cpp to {@link EngineLoad}.
 *
 * Gauges present on several series (data-parallel engines, TP ranks) are aggregated with
 * **max**. vLLM's prefix hit rate is Σhits / Σqueries over the counter series (a ratio that
 * per-rank duplicates do not skew), absent when queries are absent or 0. vLLM's renamed
 * metrics are read with the current name first: `kv_cache_usage_perc` then
 * `gpu_cache_usage_perc`; `prefix_cache_*` then `gpu_prefix_cache_*`, with or without
 * `_total`, then the V0 `gpu_prefix_cache_hit_rate` gauge. Non-finite values are ignored.
 * `engine` defaults to {@link detectEngineKind}.
 */
export function extractEngineLoad(
  samples: readonly PrometheusSample[],
  engine?: EngineKind,
): EngineLoad {
  const kind = engine ?? detectEngineKind(samples);
  const byName = new Map<string, number[]>();
  for (const sample of samples) {
    if (!Number.isFinite(sample.value) || sample.value < 0) continue;
    const values = byName.get(sample.name);
    if (values === undefined) byName.set(sample.name, [sample.value]);
    else values.push(sample.value);
  }
  const max = (...names: string[]): number | undefined => {
    for (const name of names) {
      const values = byName.get(name);
      // A loop, not Math.max(...values): an engine may report 100k+ series of one gauge,
      // past what a call's arguments can hold.
      if (values !== undefined) return values.reduce((a, b) => Math.max(a, b));
    }
    return undefined;
  };
  const sum = (...names: string[]): number | undefined => {
    for (const name of names) {
      const values = byName.get(name);
      if (values !== undefined) return values.reduce((a, b) => a + b, 0);
    }
    return undefined;
  };
  let load: Record<string, number | undefined>;
  switch (kind) {
    case "vllm": {
      const queries = sum(
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_queries",
        "vllm:gpu_prefix_cache_queries_total",
        "vllm:gpu_prefix_cache_queries",
      );
      const hits = sum(
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_hits",
        "vllm:gpu_prefix_cache_hits_total",
        "vllm:gpu_prefix_cache_hits",
      );
      const rate =
        queries !== undefined && queries > 0 && hits !== undefined
          ? Math.min(1, hits / queries)
          : queries === undefined
            ? max("vllm:gpu_prefix_cache_hit_rate")
            : undefined;
      load = {
        running: max("vllm:num_requests_running"),
        waiting: max("vllm:num_requests_waiting"),
        kvCacheUsage: max("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        prefixCacheHitRate: rate,
        kvCacheTokens: vllmKvCacheTokens(samples),
      };
      break;
    }
    case "sglang":
      load = {
        running: max("sglang:num_running_reqs"),
        waiting: max("sglang:num_queue_reqs"),
        kvCacheUsage: max("sglang:token_usage"),
        prefixCacheHitRate: max("sglang:cache_hit_rate"),
        kvCacheTokens: max("sglang:max_total_num_tokens"),
      };
      break;
    case "llamacpp":
      load = {
        running: max("llamacpp:requests_processing"),
        waiting: max("llamacpp:requests_deferred"),
        kvCacheUsage: max("llamacpp:kv_cache_usage_ratio"),
      };
      break;
    default:
      load = {};
  }
  return Object.fromEntries(
    Object.entries(load).filter(([field, v]) => v !== undefined && inRange(field, v)),
  ) as EngineLoad;
}

/** Largest believable value of each load field; every field is ≥ 0. */
const LOAD_FIELD_MAX: Readonly<Record<string, number>> = {
  running: 1_000_000,
  waiting: 1_000_000,
  kvCacheUsage: 1,
  prefixCacheHitRate: 1,
  kvCacheTokens: 2 ** 40,
};

/**
 * vLLM's KV capacity in tokens: `vllm:cache_config_info` is an info gauge whose labels are the
 * engine's `CacheConfig` fields as strings, `num_gpu_blocks` × `block_size` of them (the
 * largest over series: one per engine of a data-parallel group). Absent when either label is
 * missing or not a positive integer (`None` before the engine profiled its memory).
 */
function vllmKvCacheTokens(samples: readonly PrometheusSample[]): number | undefined {
  let best: number | undefined;
  for (const s of samples) {
    if (s.name !== "vllm:cache_config_info") continue;
    const blocks = Number(s.labels.num_gpu_blocks);
    const size = Number(s.labels.block_size);
    if (!Number.isSafeInteger(blocks) || !Number.isSafeInteger(size) || blocks <= 0 || size <= 0)
      continue;
    best = Math.max(best ?? 0, blocks * size);
  }
  return best;
}

/**
 * Engine output is outside input: a reading that is not a finite number within its range (a
 * NaN, a negative queue, a KV usage of 1.5) is left out — unreported, never passed on to poison
 * every router's scoring, and never a reason for the control plane to refuse the whole report.
 */
function inRange(field: string, value: number): boolean {
  return Number.isFinite(value) && value >= 0 && value <= (LOAD_FIELD_MAX[field] ?? 0);
}
