import { describe, expect, it } from "vitest";
import { detectEngineKind, type EngineKind, extractEngineLoad } from "./engine-load.js";
import { parsePrometheusText } from "./prometheus.js";

const m = 'model_name="google/gemma-3-4b-it"';

describe("extractEngineLoad", () => {
  it.each<{ name: string; engine?: EngineKind; text: string; load: object }>([
    {
      name: "vLLM V1 current names (formats.md §4.6 sample)",
      text: `vllm:num_requests_running{engine="0",${m}} 0.0
vllm:num_requests_waiting{engine="0",${m}} 2.0
vllm:kv_cache_usage_perc{engine="0",${m}} 0.0
vllm:prefix_cache_queries_total{engine="0",${m}} 123362.0
vllm:prefix_cache_hits_total{engine="0",${m}} 61216.0
vllm:prefix_cache_queries_created{engine="0",${m}} 1.7592e+09`,
      load: { running: 0, waiting: 2, kvCacheUsage: 0, prefixCacheHitRate: 61216 / 123362 },
    },
    {
      name: "vLLM KV capacity from cache_config_info (num_gpu_blocks × block_size, max over engines)",
      text: `vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="27264",${m}} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="27000",${m}} 1.0
vllm:kv_cache_usage_perc{engine="0",${m}} 0.1`,
      load: { kvCacheUsage: 0.1, kvCacheTokens: 27264 * 16 },
    },
    {
      name: "vLLM cache_config_info before profiling (num_gpu_blocks None): capacity unreported",
      text: `vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="None",${m}} 1.0
vllm:num_requests_running{engine="0",${m}} 1.0`,
      load: { running: 1 },
    },
    {
      name: "SGLang KV capacity from max_total_num_tokens",
      text: `sglang:token_usage{model_name="m"} 0.5
sglang:max_total_num_tokens{model_name="m"} 812345.0`,
      load: { kvCacheUsage: 0.5, kvCacheTokens: 812345 },
    },
    {
      name: "vLLM renamed (deprecated) names: gpu_cache_usage_perc, gpu_prefix_cache_*_total",
      text: `vllm:num_requests_running{${m}} 3.0
vllm:gpu_cache_usage_perc{${m}} 0.25
vllm:gpu_prefix_cache_queries_total{${m}} 100.0
vllm:gpu_prefix_cache_hits_total{${m}} 40.0`,
      load: { running: 3, kvCacheUsage: 0.25, prefixCacheHitRate: 0.4 },
    },
    {
      name: "vLLM both names present (hidden metrics shown): current name wins",
      text: `vllm:kv_cache_usage_perc{engine="0",${m}} 0.5
vllm:gpu_cache_usage_perc{engine="0",${m}} 0.9`,
      load: { kvCacheUsage: 0.5 },
    },
    {
      name: "readings out of range are left out, the others kept (outside input)",
      text: `vllm:num_requests_running{${m}} -1
vllm:num_requests_waiting{${m}} NaN
vllm:kv_cache_usage_perc{${m}} 1.5
vllm:gpu_prefix_cache_hit_rate{${m}} 0.3`,
      load: { prefixCacheHitRate: 0.3 },
    },
    {
      name: "an absurd queue length is left out",
      text: `vllm:num_requests_running{${m}} 2
vllm:num_requests_waiting{${m}} 1e9`,
      load: { running: 2 },
    },
    {
      name: "vLLM counters without _total suffix",
      text: `vllm:prefix_cache_queries{${m}} 10
vllm:prefix_cache_hits{${m}} 5`,
      load: { prefixCacheHitRate: 0.5 },
    },
    {
      name: "vLLM V0 hit-rate gauge when counters are absent",
      text: `vllm:gpu_prefix_cache_hit_rate{${m}} 0.7`,
      load: { prefixCacheHitRate: 0.7 },
    },
    {
      name: "vLLM prefix hit rate absent when queries are 0",
      text: `vllm:prefix_cache_queries_total{engine="0",${m}} 0.0
vllm:prefix_cache_hits_total{engine="0",${m}} 0.0`,
      load: {},
    },
    {
      name: "vLLM prefix hit rate absent when queries are missing but hits present",
      text: `vllm:prefix_cache_hits_total{engine="0",${m}} 10.0`,
      load: {},
    },
    {
      name: "vLLM data-parallel engines: gauges max, hit rate Σhits/Σqueries, label order irrelevant",
      text: `vllm:num_requests_running{engine="0",${m}} 4.0
vllm:num_requests_running{${m},engine="1"} 7.0
vllm:kv_cache_usage_perc{engine="0",${m}} 0.2
vllm:kv_cache_usage_perc{${m},engine="1"} 0.6
vllm:prefix_cache_queries_total{engine="0",${m}} 100.0
vllm:prefix_cache_hits_total{engine="0",${m}} 90.0
vllm:prefix_cache_queries_total{${m},engine="1"} 300.0
vllm:prefix_cache_hits_total{${m},engine="1"} 10.0`,
      load: { running: 7, kvCacheUsage: 0.6, prefixCacheHitRate: 0.25 },
    },
    {
      name: "SGLang TP=8 sample (formats.md §4.6) plus running and hit rate",
      text: `# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="glm-5.3",tp_rank="0"} 3.0
sglang:token_usage{engine_type="unified",model_name="glm-5.3",tp_rank="0"} 0.42
sglang:num_running_reqs{engine_type="unified",model_name="glm-5.3",tp_rank="0"} 12.0
sglang:cache_hit_rate{engine_type="unified",model_name="glm-5.3",tp_rank="0"} 0.31`,
      load: { running: 12, waiting: 3, kvCacheUsage: 0.42, prefixCacheHitRate: 0.31 },
    },
    {
      name: "SGLang per-rank duplicates with --enable-metrics-for-all-schedulers: max",
      text: `sglang:token_usage{model_name="g",tp_rank="0"} 0.4
sglang:token_usage{tp_rank="1",model_name="g"} 0.45`,
      load: { kvCacheUsage: 0.45 },
    },
    {
      name: "llama.cpp (llamacpp:* names)",
      text: `# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 6886
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0`,
      load: { running: 1, waiting: 0 },
    },
    {
      name: "llama.cpp older build with kv_cache_usage_ratio",
      text: "llamacpp:kv_cache_usage_ratio 0.125\nllamacpp:requests_processing 0",
      load: { running: 0, kvCacheUsage: 0.125 },
    },
    {
      name: "nothing reported → everything absent, never 0",
      text: "process_cpu_seconds_total 3.2",
      load: {},
    },
    { name: "NaN gauge is absent", text: 'vllm:kv_cache_usage_perc{engine="0"} NaN', load: {} },
    {
      name: "explicit engine ignores other families",
      engine: "sglang",
      text: "vllm:num_requests_running 5\nsglang:num_running_reqs 2",
      load: { running: 2 },
    },
  ])("$name", ({ text, engine, load }) => {
    expect(extractEngineLoad(parsePrometheusText(text), engine)).toEqual(load);
  });

  it("takes the largest of 150,000 series of one gauge (past what a call's arguments hold)", () => {
    const lines = Array.from(
      { length: 150_000 },
      (_, i) => `vllm:num_requests_running{i="${i}"} ${i % 7}`,
    );
    lines.push("vllm:kv_cache_usage_perc 0.5");
    expect(extractEngineLoad(parsePrometheusText(lines.join("\n")))).toEqual({
      running: 6,
      kvCacheUsage: 0.5,
    });
  });

  it.each([
    ["vllm:num_requests_running 1", "vllm"],
    ["python_gc_objects_collected_total 1\nsglang:token_usage 0.1", "sglang"],
    ["llamacpp:requests_processing 1", "llamacpp"],
    ["up 1", undefined],
  ])("detects the engine of %j", (text, kind) => {
    expect(detectEngineKind(parsePrometheusText(text))).toBe(kind);
  });
});
