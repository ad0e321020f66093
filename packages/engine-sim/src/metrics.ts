import type { TimingSnapshot } from "./timing-model.js";

/** Bucket bounds (seconds) of vLLM's TTFT histogram. */
export const TTFT_BUCKETS_S = [
  0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80,
  160, 640, 2560,
] as const;
/** Bucket bounds (seconds) of vLLM's inter-token-latency histogram. */
export const ITL_BUCKETS_S = [
  0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80,
] as const;

/** A fixed-bucket histogram, cumulative at render time. */
export class Histogram {
  readonly bounds: readonly number[];
  readonly counts: number[];
  sum = 0;
  count = 0;

  constructor(bounds: readonly number[]) {
    this.bounds = bounds;
    this.counts = bounds.map(() => 0);
  }

  /** Records one observation (seconds). */
  observe(value: number): void {
    this.sum += value;
    this.count += 1;
    const i = this.bounds.findIndex((b) => value <= b);
    if (i >= 0) this.counts[i] = (this.counts[i] ?? 0) + 1;
  }
}

/** What `/metrics` shows besides the timing snapshot. */
export interface MetricsState {
  readonly servedModelName: string;
  readonly snapshot: TimingSnapshot;
  readonly ttft: Histogram;
  readonly itl: Histogram;
  readonly success: Readonly<Record<"stop" | "length" | "abort", number>>;
  /** Generated tokens per second over the last few seconds (SGLang `gen_throughput`). */
  readonly genThroughput: number;
  /** Tokens per KV block (vLLM `cache_config_info`'s `block_size`). */
  readonly blockSizeTokens: number;
}

function num(value: number): string {
  if (Number.isInteger(value)) return `${value}.0`;
  return String(value);
}

function escapeLabel(value: string): string {
  return value.replace(/\\/g, "\\\\").replace(/\n/g, "\\n").replace(/"/g, '\\"');
}

function labelText(labels: Readonly<Record<string, string>>): string {
  const keys = Object.keys(labels).sort();
  return keys.map((k) => `${k}="${escapeLabel(labels[k] ?? "")}"`).join(",");
}

class Exposition {
  readonly lines: string[] = [];
  constructor(readonly labels: Readonly<Record<string, string>>) {}

  family(name: string, type: "gauge" | "counter" | "histogram", help: string): void {
    this.lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
  }

  sample(name: string, value: number, extra: Readonly<Record<string, string>> = {}): void {
    this.lines.push(`${name}{${labelText({ ...this.labels, ...extra })}} ${num(value)}`);
  }

  gauge(name: string, help: string, value: number): void {
    this.family(name, "gauge", help);
    this.sample(name, value);
  }

  /** prometheus_client's text format names a counter family with its `_total` suffix too. */
  counter(name: string, help: string, value: number): void {
    this.family(`${name}_total`, "counter", help);
    this.sample(`${name}_total`, value);
  }

  histogram(name: string, help: string, h: Histogram): void {
    this.family(name, "histogram", help);
    let cumulative = 0;
    h.bounds.forEach((bound, i) => {
      cumulative += h.counts[i] ?? 0;
      this.sample(`${name}_bucket`, cumulative, { le: num(bound) });
    });
    this.sample(`${name}_bucket`, h.count, { le: "+Inf" });
    this.sample(`${name}_count`, h.count);
    this.sample(`${name}_sum`, h.sum);
  }

  text(): string {
    return `${this.lines.join("\n")}\n`;
  }
}

/**
 * The vLLM V1 exposition (names from vLLM `loggers.py`, labels `engine="0"` and
 * `model_name`, sorted like prometheus_client writes them; counters end in `_total`).
 */
export function renderVllmMetrics(state: MetricsState): string {
  const s = state.snapshot;
  const e = new Exposition({ engine: "0", model_name: state.servedModelName });
  e.gauge("vllm:num_requests_running", "Number of requests in model execution batches.", s.running);
  e.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", s.waiting);
  e.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.kvUsage);
  // An info gauge: the engine's CacheConfig as labels (vLLM `log_metrics_info`), value 1.
  e.family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig");
  e.sample("vllm:cache_config_info", 1, {
    block_size: String(state.blockSizeTokens),
    enable_prefix_caching: "True",
    num_gpu_blocks: String(s.totalBlocks),
  });
  e.counter(
    "vllm:prefix_cache_queries",
    "Prefix cache queries, in terms of number of queried tokens.",
    s.prefixQueryTokens,
  );
  e.counter(
    "vllm:prefix_cache_hits",
    "Prefix cache hits, in terms of number of cached tokens.",
    s.prefixHitTokens,
  );
  e.counter(
    "vllm:num_preemptions",
    "Cumulative number of preemption from the engine.",
    s.preemptions,
  );
  e.counter("vllm:prompt_tokens", "Number of prefill tokens processed.", s.promptTokens);
  e.counter("vllm:generation_tokens", "Number of generation tokens processed.", s.generationTokens);
  e.family("vllm:request_success_total", "counter", "Count of successfully processed requests.");
  for (const reason of ["stop", "length", "abort"] as const) {
    e.sample("vllm:request_success_total", state.success[reason], { finished_reason: reason });
  }
  e.histogram(
    "vllm:time_to_first_token_seconds",
    "Histogram of time to first token in seconds.",
    state.ttft,
  );
  e.histogram(
    "vllm:inter_token_latency_seconds",
    "Histogram of inter-token latency in seconds.",
    state.itl,
  );
  return e.text();
}

/** The SGLang exposition (names from SGLang's collector; labels `model_name`, `tp_rank="0"`). */
export function renderSglangMetrics(state: MetricsState): string {
  const s = state.snapshot;
  const e = new Exposition({ model_name: state.servedModelName, tp_rank: "0" });
  e.gauge("sglang:num_running_reqs", "The number of running requests.", s.running);
  e.gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", s.waiting);
  e.gauge("sglang:token_usage", "The token usage.", s.kvUsage);
  e.gauge(
    "sglang:max_total_num_tokens",
    "Maximum total number of tokens in the KV cache pool.",
    s.totalBlocks * state.blockSizeTokens,
  );
  e.gauge(
    "sglang:cache_hit_rate",
    "The prefix cache hit rate.",
    s.prefixQueryTokens === 0 ? 0 : s.prefixHitTokens / s.prefixQueryTokens,
  );
  e.gauge("sglang:gen_throughput", "The generation throughput (token/s).", state.genThroughput);
  e.counter("sglang:prompt_tokens", "Number of prefill tokens processed.", s.promptTokens);
  e.counter(
    "sglang:generation_tokens",
    "Number of generation tokens processed.",
    s.generationTokens,
  );
  e.counter("sglang:cached_tokens", "Number of cached prompt tokens.", s.prefixHitTokens);
  e.counter(
    "sglang:num_requests",
    "Number of requests processed.",
    state.success.stop + state.success.length + state.success.abort,
  );
  e.histogram(
    "sglang:time_to_first_token_seconds",
    "Histogram of time to first token in seconds.",
    state.ttft,
  );
  e.histogram(
    "sglang:inter_token_latency_seconds",
    "Histogram of inter-token latency in seconds.",
    state.itl,
  );
  return e.text();
}
