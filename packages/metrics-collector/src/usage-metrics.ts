import { Counter, type Registry } from "prom-client";
import { MetricsCollectorError } from "./errors.js";
import { type FamilySpec, USAGE_FAMILIES } from "./families.js";
import { boundLabelValue, DEFAULT_LABEL_VALUE_MAX_LENGTH } from "./labels.js";

/** What one stored batch adds for one tenant and model. */
export interface UsageSample {
  readonly requests: number;
  readonly promptTokens: number;
  /** Cached prompt tokens of the {@link cachedReported} requests. */
  readonly cachedTokens: number;
  /** Requests whose engine reported its cached tokens; 0: none known. */
  readonly cachedReported: number;
  readonly completionTokens: number;
  readonly gpuMs: number;
  readonly estimatedRequests: number;
  readonly refusedUsage: number;
}

/** Options of {@link createUsageMetrics}. */
export interface UsageMetricsOptions {
  /**
   * Distinct (tenant, model) pairs kept apart; later pairs count under `tenant="other",
   * model="other"`. Default 10 000.
   */
  readonly maxSeries?: number;
}

/** Handles on the `llmgw_usage_*` families (`USAGE_FAMILIES`). */
export interface UsageMetrics {
  /**
   * Adds one stored batch's sums for `tenant` ("" for keys without one, shown `(none)`) and
   * `model`. The caller bounds both to known names (e.g. `boundModelLabel`); values are cut to
   * the label bound here, and pairs past `maxSeries` fold into `other`.
   */
  add(tenant: string, model: string, sample: UsageSample): void;
}

/** `tenant` label of usage by keys without a tenant (not a tenant name: those have no parens). */
export const NO_TENANT_LABEL = "(none)";

function spec(name: string): FamilySpec {
  const found = USAGE_FAMILIES.find((f) => f.name === name);
  if (found === undefined) throw new Error(`unknown usage family ${name}`);
  return found;
}

/**
 * Registers the usage families on `registry` (never the global one). A family registers with
 * its `# HELP`/`# TYPE` lines before any usage, so dashboards find it on a fresh control plane.
 * @throws MetricsCollectorError `LLMGW_METRICS_COLLECTOR_ALREADY_REGISTERED` when one is
 *   already registered there.
 */
export function createUsageMetrics(
  registry: Registry,
  options: UsageMetricsOptions = {},
): UsageMetrics {
  const maxSeries = options.maxSeries ?? 10_000;
  if (!Number.isInteger(maxSeries) || maxSeries < 1)
    throw new MetricsCollectorError(
      "LLMGW_METRICS_COLLECTOR_INVALID_OPTION",
      `maxSeries must be a whole number ≥ 1 (got ${maxSeries})`,
    );
  for (const f of USAGE_FAMILIES) {
    if (registry.getSingleMetric(f.name) !== undefined)
      throw new MetricsCollectorError(
        "LLMGW_METRICS_COLLECTOR_ALREADY_REGISTERED",
        `metric family ${f.name} is already registered on this registry`,
      );
  }
  const counter = <L extends string>(name: string) => {
    const s = spec(name);
    return new Counter<L>({
      name: s.name,
      help: s.help,
      labelNames: s.labelNames as readonly L[],
      registers: [registry],
    });
  };
  const requests = counter<"tenant" | "model">("llmgw_usage_requests_total");
  const tokens = counter<"tenant" | "model" | "type">("llmgw_usage_tokens_total");
  const gpuSeconds = counter<"tenant" | "model">("llmgw_usage_gpu_seconds_total");
  const estimated = counter<"tenant" | "model">("llmgw_usage_estimated_requests_total");
  const refused = counter<"tenant" | "model">("llmgw_usage_refused_total");
  const seen = new Set<string>();
  return {
    add(tenant, model, s) {
      let labels = {
        tenant:
          tenant === "" ? NO_TENANT_LABEL : boundLabelValue(tenant, DEFAULT_LABEL_VALUE_MAX_LENGTH),
        model: boundLabelValue(model, DEFAULT_LABEL_VALUE_MAX_LENGTH),
      };
      const pair = `${labels.tenant}\u0000${labels.model}`;
      if (!seen.has(pair)) {
        if (seen.size >= maxSeries) labels = { tenant: "other", model: "other" };
        else seen.add(pair);
      }
      requests.inc(labels, s.requests);
      tokens.inc({ ...labels, type: "prompt" }, s.promptTokens);
      // Absent is not zero: no cached series until an engine reported its cached tokens.
      if (s.cachedReported > 0) tokens.inc({ ...labels, type: "cached" }, s.cachedTokens);
      tokens.inc({ ...labels, type: "completion" }, s.completionTokens);
      gpuSeconds.inc(labels, s.gpuMs / 1000);
      estimated.inc(labels, s.estimatedRequests);
      refused.inc(labels, s.refusedUsage);
    },
  };
}
