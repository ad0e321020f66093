import { spawnSync } from "node:child_process";
import { describe, expect, it } from "vitest";
import { isMetricsCollectorError } from "./errors.js";
import { createMetricsRegistry } from "./registry.js";
import { createUsageMetrics, type UsageSample } from "./usage-metrics.js";

const SAMPLE: UsageSample = {
  requests: 3,
  promptTokens: 300,
  cachedTokens: 100,
  cachedReported: 2,
  completionTokens: 90,
  gpuMs: 2_500,
  estimatedRequests: 1,
  refusedUsage: 2,
};

/** The sample lines of `text`, without HELP/TYPE. */
const samples = (text: string) => text.split("\n").filter((l) => l.startsWith("llmgw_"));

describe("createUsageMetrics", () => {
  it("adds each batch's sums per tenant and model, cumulative", async () => {
    const registry = createMetricsRegistry();
    const usage = createUsageMetrics(registry);
    usage.add("search", "chat", SAMPLE);
    usage.add("search", "chat", SAMPLE);
    usage.add("", "chat", { ...SAMPLE, requests: 1 });
    // No engine reported its cached tokens: no cached series, not a 0.
    usage.add("batch", "chat", { ...SAMPLE, cachedTokens: 0, cachedReported: 0 });
    expect(samples(await registry.metrics())).toEqual([
      'llmgw_usage_requests_total{tenant="search",model="chat"} 6',
      'llmgw_usage_requests_total{tenant="(none)",model="chat"} 1',
      'llmgw_usage_requests_total{tenant="batch",model="chat"} 3',
      'llmgw_usage_tokens_total{tenant="search",model="chat",type="prompt"} 600',
      'llmgw_usage_tokens_total{tenant="search",model="chat",type="cached"} 200',
      'llmgw_usage_tokens_total{tenant="search",model="chat",type="completion"} 180',
      'llmgw_usage_tokens_total{tenant="(none)",model="chat",type="prompt"} 300',
      'llmgw_usage_tokens_total{tenant="(none)",model="chat",type="cached"} 100',
      'llmgw_usage_tokens_total{tenant="(none)",model="chat",type="completion"} 90',
      'llmgw_usage_tokens_total{tenant="batch",model="chat",type="prompt"} 300',
      'llmgw_usage_tokens_total{tenant="batch",model="chat",type="completion"} 90',
      'llmgw_usage_gpu_seconds_total{tenant="search",model="chat"} 5',
      'llmgw_usage_gpu_seconds_total{tenant="(none)",model="chat"} 2.5',
      'llmgw_usage_gpu_seconds_total{tenant="batch",model="chat"} 2.5',
      'llmgw_usage_estimated_requests_total{tenant="search",model="chat"} 2',
      'llmgw_usage_estimated_requests_total{tenant="(none)",model="chat"} 1',
      'llmgw_usage_estimated_requests_total{tenant="batch",model="chat"} 1',
      'llmgw_usage_refused_total{tenant="search",model="chat"} 4',
      'llmgw_usage_refused_total{tenant="(none)",model="chat"} 2',
      'llmgw_usage_refused_total{tenant="batch",model="chat"} 2',
    ]);
  });

  it("folds (tenant, model) pairs past maxSeries into other, keeping those seen", async () => {
    const registry = createMetricsRegistry();
    const usage = createUsageMetrics(registry, { maxSeries: 2 });
    for (const tenant of ["a", "b", "c", "d", "a"]) usage.add(tenant, "chat", SAMPLE);
    const requests = samples(await registry.metrics()).filter((l) =>
      l.startsWith("llmgw_usage_requests_total"),
    );
    expect(requests).toEqual([
      'llmgw_usage_requests_total{tenant="a",model="chat"} 6',
      'llmgw_usage_requests_total{tenant="b",model="chat"} 3',
      'llmgw_usage_requests_total{tenant="other",model="other"} 6',
    ]);
  });

  it("registers its families before any usage, and only once per registry", async () => {
    const registry = createMetricsRegistry();
    createUsageMetrics(registry);
    expect(await registry.metrics()).toContain("# TYPE llmgw_usage_tokens_total counter");
    const error = (() => {
      try {
        createUsageMetrics(registry);
      } catch (e) {
        return e;
      }
    })();
    expect(isMetricsCollectorError(error) && error.code).toBe(
      "LLMGW_METRICS_COLLECTOR_ALREADY_REGISTERED",
    );
  });

  const promtool = spawnSync("promtool", ["--version"]).status === 0;
  it.skipIf(!promtool)("passes promtool check metrics (promtool present)", async () => {
    const registry = createMetricsRegistry();
    createUsageMetrics(registry).add("search", "chat", SAMPLE);
    const result = spawnSync("promtool", ["check", "metrics"], {
      input: await registry.metrics(),
      encoding: "utf8",
    });
    expect(`${result.stdout}${result.stderr}`.trim()).toBe("");
    expect(result.status).toBe(0);
  });
});
