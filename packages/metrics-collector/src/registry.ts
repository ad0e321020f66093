import { Registry } from "prom-client";

/**
 * A fresh prom-client `Registry` (Prometheus text format), for callers that do not depend on
 * prom-client themselves (benchmarks, the CLI). Never the global registry.
 */
export function createMetricsRegistry(): Registry {
  return new Registry();
}
