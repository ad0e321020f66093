import { Registry } from "prom-client";
import type { ClusterCollector } from "./cluster-collector.js";
import { joinExposition, type LentExposition, unlentExposition } from "./cluster-text.js";
import { MetricsCollectorError } from "./errors.js";

/** Options of {@link createMetricsEndpoint}. */
export interface MetricsEndpointOptions {
  /** The registry holding the router families and the cluster counters. Text format 0.0.4 only. */
  readonly registry: Registry;
  /**
   * The cluster collector created on `registry`. With `exposition: "text"` its gauge families
   * are rendered and appended; with `"registry"` they are already in `registry.metrics()`
   * and nothing is appended. Omit for a control plane without cluster families.
   */
  readonly cluster?: ClusterCollector;
}

/** What a `/metrics` handler serves: one call per scrape. */
export interface MetricsEndpoint {
  /** The `content-type` header value (`text/plain; version=0.0.4; charset=utf-8`). */
  readonly contentType: string;
  /**
   * The whole exposition: the cluster gauge families (rendered first, so a view failure is
   * counted in this very scrape) after everything on the registry. Never throws because of
   * cluster state.
   */
  metrics(): Promise<string>;
  /**
   * {@link metrics} as UTF-8 bytes, for `res.end(body)`: the cluster part is never turned
   * into a string and back (bench/metrics, "bytes" rows). Same content. The cluster part is
   * rendered in slices with the event loop free between them
   * (`renderClusterMetricsBytesYielding`), so a server keeps answering during a scrape.
   */
  body(): Promise<Buffer>;
  /**
   * {@link body} as chunks to write one after the other, lent from the render's buffers
   * (at fleet size the cluster part is 6.7 MB: joining it into one buffer was a sixth of a
   * scrape's CPU). Release once the response is sent:
   *
   * ```ts
   * const out = await endpoint.exposition();
   * res.on("close", out.release);
   * res.writeHead(200, { "content-type": endpoint.contentType, "content-length": out.byteLength });
   * for (const chunk of out.chunks) res.write(chunk);
   * res.end();
   * ```
   */
  exposition(): Promise<LentExposition>;
}

/**
 * The fast `/metrics` path: `await registry.metrics()` (router families, cluster counters,
 * anything else registered) followed by `cluster.renderClusterMetrics()` (the 76k-sample
 * cluster gauges at fleet scale, rendered directly instead of by prom-client).
 *
 * ```ts
 * const cluster = createClusterCollector(registry, view, { exposition: "text" });
 * const endpoint = createMetricsEndpoint({ registry, cluster });
 * // GET /metrics
 * res.writeHead(200, { "content-type": endpoint.contentType }).end(await endpoint.body());
 * ```
 *
 * Registry default labels (`registry.setDefaultLabels`) are not applied to the text-rendered
 * families; add such labels as Prometheus target labels instead.
 * @throws MetricsCollectorError `LLMGW_METRICS_COLLECTOR_INVALID_OPTION` when the registry
 *   writes OpenMetrics and the cluster families are text-rendered (the text path writes
 *   Prometheus 0.0.4 only; appending it after OpenMetrics' `# EOF` would be invalid).
 */
export function createMetricsEndpoint(options: MetricsEndpointOptions): MetricsEndpoint {
  const { registry, cluster } = options;
  const text = cluster !== undefined && cluster.exposition === "text" ? cluster : undefined;
  if (text !== undefined && registry.contentType !== Registry.PROMETHEUS_CONTENT_TYPE) {
    throw new MetricsCollectorError(
      "LLMGW_METRICS_COLLECTOR_INVALID_OPTION",
      `registry content type must be ${Registry.PROMETHEUS_CONTENT_TYPE} with text-rendered cluster families, got ${registry.contentType}`,
    );
  }
  const exposition = async (): Promise<LentExposition> => {
    if (text === undefined) return unlentExposition(Buffer.from(await registry.metrics(), "utf8"));
    const cluster = await text.renderClusterMetricsChunksYielding();
    // Should this throw, the cluster chunks stay lent: only the next render's memory is new.
    const registryText = await registry.metrics();
    if (registryText.trim().length === 0) return cluster;
    const head = Buffer.from(`${registryText}\n`, "utf8");
    return {
      chunks: [head, ...cluster.chunks],
      byteLength: head.length + cluster.byteLength,
      release: cluster.release,
    };
  };
  return {
    contentType: registry.contentType,
    async metrics() {
      if (text === undefined) return registry.metrics();
      const clusterText = text.renderClusterMetrics();
      const registryText = await registry.metrics();
      // An empty registry renders "\n"; keep the exposition free of a leading blank line.
      return registryText.trim().length === 0 ? clusterText : `${registryText}\n${clusterText}`;
    },
    body: async () => joinExposition(await exposition()),
    exposition,
  };
}
