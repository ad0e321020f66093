import { Histogram, type Registry } from "prom-client";
import { MetricsCollectorError } from "./errors.js";
import { CONTROL_PLANE_FAMILIES } from "./families.js";

/** Handles on the `llmgw_control_plane_*` families (`CONTROL_PLANE_FAMILIES`). */
export interface ControlPlaneMetrics {
  /** One reconcile took `seconds`. */
  reconciled(seconds: number): void;
}

/**
 * Registers the control plane's own families on `registry` (never the global one).
 * @throws MetricsCollectorError `LLMGW_METRICS_COLLECTOR_ALREADY_REGISTERED` when one is
 *   already registered there.
 */
export function createControlPlaneMetrics(registry: Registry): ControlPlaneMetrics {
  for (const f of CONTROL_PLANE_FAMILIES) {
    if (registry.getSingleMetric(f.name) !== undefined)
      throw new MetricsCollectorError(
        "LLMGW_METRICS_COLLECTOR_ALREADY_REGISTERED",
        `metric family ${f.name} is already registered on this registry`,
      );
  }
  const [reconcile] = CONTROL_PLANE_FAMILIES as [(typeof CONTROL_PLANE_FAMILIES)[number]];
  const reconcileSeconds = new Histogram({
    name: reconcile.name,
    help: reconcile.help,
    buckets: [...(reconcile.buckets ?? [])],
    registers: [registry],
  });
  return {
    reconciled(seconds) {
      reconcileSeconds.observe(seconds);
    },
  };
}
