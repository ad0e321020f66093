import { describe, expect, it } from "vitest";
import { Histogram, type MetricsState, renderSglangMetrics, renderVllmMetrics } from "./metrics.js";
import type { TimingSnapshot } from "./timing-model.js";

const snapshot: TimingSnapshot = {
  running: 3,
  waiting: 1,
  kvUsage: 0.25,
  cachedFreeBlocks: 0,
  totalBlocks: 100,
  prefixQueryTokens: 123362,
  prefixHitTokens: 61216,
  promptTokens: 500,
  generationTokens: 900,
  preemptions: 0,
  steps: 10,
};

function state(): MetricsState {
  const ttft = new Histogram([0.1, 1]);
  ttft.observe(0.05);
  ttft.observe(0.5);
  ttft.observe(5);
  return {
    servedModelName: "google/gemma-3-4b-it",
    snapshot,
    ttft,
    itl: new Histogram([0.01]),
    success: { stop: 2, length: 1, abort: 0 },
    genThroughput: 12.5,
    blockSizeTokens: 16,
  };
}

describe("metrics exposition", () => {
  it("writes vLLM names with sorted engine/model_name labels and float values (formats.md §4.6)", () => {
    const text = renderVllmMetrics(state());
    for (const line of [
      "# TYPE vllm:num_requests_running gauge",
      "# TYPE vllm:prompt_tokens_total counter",
      'vllm:num_requests_running{engine="0",model_name="google/gemma-3-4b-it"} 3.0',
      'vllm:num_requests_waiting{engine="0",model_name="google/gemma-3-4b-it"} 1.0',
      'vllm:kv_cache_usage_perc{engine="0",model_name="google/gemma-3-4b-it"} 0.25',
      'vllm:prefix_cache_queries_total{engine="0",model_name="google/gemma-3-4b-it"} 123362.0',
      'vllm:prefix_cache_hits_total{engine="0",model_name="google/gemma-3-4b-it"} 61216.0',
      'vllm:prompt_tokens_total{engine="0",model_name="google/gemma-3-4b-it"} 500.0',
      'vllm:generation_tokens_total{engine="0",model_name="google/gemma-3-4b-it"} 900.0',
      'vllm:request_success_total{engine="0",finished_reason="stop",model_name="google/gemma-3-4b-it"} 2.0',
      'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="google/gemma-3-4b-it"} 1.0',
      'vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="google/gemma-3-4b-it"} 2.0',
      'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="google/gemma-3-4b-it"} 3.0',
      'vllm:time_to_first_token_seconds_count{engine="0",model_name="google/gemma-3-4b-it"} 3.0',
      "# TYPE vllm:inter_token_latency_seconds histogram",
    ]) {
      expect(text.split("\n")).toContain(line);
    }
  });

  it("writes SGLang names", () => {
    const lines = renderSglangMetrics(state()).split("\n");
    expect(lines).toContain(
      'sglang:num_running_reqs{model_name="google/gemma-3-4b-it",tp_rank="0"} 3.0',
    );
    expect(lines).toContain(
      'sglang:num_queue_reqs{model_name="google/gemma-3-4b-it",tp_rank="0"} 1.0',
    );
    expect(lines).toContain(
      'sglang:token_usage{model_name="google/gemma-3-4b-it",tp_rank="0"} 0.25',
    );
    expect(lines).toContain(
      'sglang:gen_throughput{model_name="google/gemma-3-4b-it",tp_rank="0"} 12.5',
    );
    expect(lines.find((l) => l.startsWith("sglang:cache_hit_rate{"))).toMatch(/ 0\.496\d+$/);
  });

  it("escapes label values", () => {
    const text = renderVllmMetrics({ ...state(), servedModelName: 'a"b\\c' });
    expect(text).toContain('model_name="a\\"b\\\\c"');
  });
});
