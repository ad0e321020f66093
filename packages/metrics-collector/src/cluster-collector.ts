import { Counter, type Gauge, type Registry } from "prom-client";
import {
  buildClusterSeries,
  type ClusterSeries,
  LabelCache,
  sampleLabels,
} from "./cluster-series.js";
import {
  joinExposition,
  type LentExposition,
  renderClusterBytes,
  renderClusterChunksYielding,
  renderClusterText,
  renderEmptyClusterText,
  unlentExposition,
} from "./cluster-text.js";
import type { ClusterView } from "./cluster-view.js";
import { MetricsCollectorError } from "./errors.js";
import { CLUSTER_FAMILIES, isViewFamily } from "./families.js";
import {
  GPU_READING_REJECT_REASONS,
  type GpuReadingLimits,
  type GpuReadingSanitized,
  type GpuReadingValidation,
  resolveGpuReadingLimits,
  sanitizeGpuReading,
  validateGpuReading,
} from "./gpu-reading.js";
import { DEFAULT_LABEL_VALUE_MAX_LENGTH } from "./labels.js";

/** Options of {@link createClusterCollector}; every field optional. */
export interface ClusterCollectorOptions {
  /** Longest label value; longer ones are cut. Default 128. */
  labelValueMaxLength?: number;
  /** Where rejected readings and view failures are reported. Default: nowhere. */
  log?: (message: string) => void;
  /** Plausibility bounds for heartbeat readings (see `GpuReadingLimits`). */
  readingLimits?: GpuReadingLimits;
  /**
   * How the cluster gauge families reach a scrape. `"registry"` (default, compatible):
   * registered on the registry as prom-client custom collectors, so `registry.metrics()`
   * includes them. `"text"` (fast, what {@link createMetricsEndpoint} is for): not registered;
   * `renderClusterMetrics()` writes them directly, about half the CPU at fleet scale
   * (bench/metrics). The two counters are on the registry either way.
   */
  exposition?: ClusterExposition;
}

/** Where the cluster gauge families are rendered: by prom-client, or directly as text. */
export type ClusterExposition = "registry" | "text";

/** {@link ClusterCollectorOptions} with defaults applied. */
export interface ResolvedClusterCollectorOptions {
  readonly labelValueMaxLength: number;
  readonly log: (message: string) => void;
  readonly readingLimits: GpuReadingLimits;
  readonly exposition: ClusterExposition;
}

/**
 * Applies defaults and validates.
 * @throws MetricsCollectorError `LLMGW_METRICS_COLLECTOR_INVALID_OPTION`.
 */
export function resolveClusterCollectorOptions(
  options: ClusterCollectorOptions = {},
): ResolvedClusterCollectorOptions {
  const labelValueMaxLength = options.labelValueMaxLength ?? DEFAULT_LABEL_VALUE_MAX_LENGTH;
  if (!Number.isInteger(labelValueMaxLength) || labelValueMaxLength < 8) {
    throw new MetricsCollectorError(
      "LLMGW_METRICS_COLLECTOR_INVALID_OPTION",
      `labelValueMaxLength must be an integer >= 8, got ${String(labelValueMaxLength)}`,
    );
  }
  const readingLimits = resolveGpuReadingLimits({ labelValueMaxLength, ...options.readingLimits });
  const exposition = options.exposition ?? "registry";
  if (exposition !== "registry" && exposition !== "text") {
    throw new MetricsCollectorError(
      "LLMGW_METRICS_COLLECTOR_INVALID_OPTION",
      `exposition must be "registry" or "text", got ${JSON.stringify(exposition)}`,
    );
  }
  return { labelValueMaxLength, log: options.log ?? (() => {}), readingLimits, exposition };
}

/** What {@link createClusterCollector} returns. */
export interface ClusterCollector {
  /** Names of every cluster family (gauges and counters), in catalogue order. */
  readonly families: readonly string[];
  /** Whether the gauge families are on the registry or rendered by {@link renderClusterMetrics}. */
  readonly exposition: ClusterExposition;
  /**
   * The cluster gauge families as Prometheus text (0.0.4), rendered from the view now, with a
   * trailing newline; per family byte-equal to what the registry path writes. Reads the view
   * once. A view that throws yields the families' header lines only (logged, counted in
   * `llmgw_cluster_view_errors_total`). Meant for `"text"` exposition, where
   * `registry.metrics()` lacks these families; {@link createMetricsEndpoint} joins the two.
   * Returns `""` after `unregister()`.
   */
  renderClusterMetrics(): string;
  /** {@link renderClusterMetrics} as UTF-8 bytes (cheaper when the caller sends bytes). */
  renderClusterMetricsBytes(): Buffer;
  /**
   * {@link renderClusterMetricsBytes} in slices of at most about 5 ms with a turn of the event
   * loop between them, for a server that must keep answering (heartbeats) during a scrape.
   * Scrapes that arrive while one renders share its result. Same bytes; never rejects.
   */
  renderClusterMetricsBytesYielding(): Promise<Buffer>;
  /**
   * {@link renderClusterMetricsBytesYielding} as chunks lent from the render's buffers, for a
   * server to write as they are (no 6.7 MB join at fleet size); release them once sent.
   * Scrapes that arrive while one renders share its chunks; their memory is reused once every
   * sharer released. Never rejects.
   */
  renderClusterMetricsChunksYielding(): Promise<LentExposition>;
  /**
   * {@link validateGpuReading} with this collector's limits; a refusal is logged with its
   * reason and counted in `llmgw_gpu_readings_rejected_total{reason}`. For heartbeat ingest.
   */
  validateGpuReading(raw: unknown, context?: string): GpuReadingValidation;
  /** {@link sanitizeGpuReading} with this collector's limits; each dropped field is logged and counted. */
  sanitizeGpuReading(raw: unknown, context?: string): GpuReadingSanitized;
  /** Removes every family of this collector from the registry. */
  unregister(): void;
}

/**
 * Registers the cluster families (`CLUSTER_FAMILIES`) on `registry` as custom collectors
 * (`exposition: "registry"`, the default), or only its two counters (`exposition: "text"`,
 * gauges then rendered by `renderClusterMetrics()`; serve with {@link createMetricsEndpoint}).
 * Nothing runs between scrapes: each scrape reads `view` once (memoised for that scrape
 * across every family) and emits only the samples present, so a reading nobody reported is
 * a missing series, never 0. A view that throws never breaks the scrape: the cluster families
 * are empty for that scrape, the failure is logged and `llmgw_cluster_view_errors_total`
 * counts it.
 *
 * @throws MetricsCollectorError `LLMGW_METRICS_COLLECTOR_ALREADY_REGISTERED` when one of the
 *   families already exists on the registry; `…_INVALID_OPTION` for bad options.
 */
export function createClusterCollector(
  registry: Registry,
  view: ClusterView,
  options?: ClusterCollectorOptions,
): ClusterCollector {
  const resolved = resolveClusterCollectorOptions(options);
  for (const spec of CLUSTER_FAMILIES) {
    if (registry.getSingleMetric(spec.name) !== undefined) {
      throw new MetricsCollectorError(
        "LLMGW_METRICS_COLLECTOR_ALREADY_REGISTERED",
        `metric family ${spec.name} is already registered on this registry`,
      );
    }
  }

  let memo: ClusterSeries | undefined;
  const labelCache = new LabelCache();
  let viewErrors: Counter | undefined;
  const viewFailed = (error: unknown) => {
    viewErrors?.inc();
    resolved.log(`cluster view failed during scrape; cluster families empty: ${String(error)}`);
  };
  const series = (): ClusterSeries => {
    if (memo === undefined) {
      try {
        memo = buildClusterSeries(view, resolved.labelValueMaxLength, labelCache);
      } catch (error) {
        memo = new Map();
        viewFailed(error);
      }
      // Every family's collect hook runs synchronously within one registry.metrics() call;
      // dropping the memo on the next microtask makes it live for exactly one scrape.
      queueMicrotask(() => {
        memo = undefined;
      });
    }
    return memo;
  };

  let rejected: Counter<string> | undefined;
  const families: string[] = [];
  const registered: string[] = [];
  for (const spec of CLUSTER_FAMILIES) {
    families.push(spec.name);
    if (isViewFamily(spec) && resolved.exposition === "text") continue;
    registered.push(spec.name);
    if (!isViewFamily(spec)) {
      const counter = new Counter({
        name: spec.name,
        help: spec.help,
        labelNames: [...spec.labelNames],
        registers: [registry],
      });
      if (spec.name === "llmgw_gpu_readings_rejected_total") rejected = counter;
      if (spec.name === "llmgw_cluster_view_errors_total") viewErrors = counter;
      continue;
    }
    const name = spec.name;
    const help = spec.help;
    // A custom collector rather than a prom-client Gauge: the samples are rebuilt from the
    // view on every scrape anyway, and skipping the Gauge's per-sample label hashing (and
    // rendering each node's and GPU's labels once, cached by identity) is what keeps
    // 1,000 nodes × 8 GPUs cheap (bench/metrics). Absent readings simply have no sample.
    const head = {
      name,
      help,
      type: spec.type as "gauge" | "counter",
      aggregator: "omit" as const,
    };
    const family = {
      ...head,
      labelNames: [...spec.labelNames],
      // Text exposition (registry.metrics()): samples as built.
      getForPromString: async () => ({ ...head, values: series().get(name) ?? [] }),
      // getMetricsAsJSON(): plain full label sets.
      get: async () => ({
        ...head,
        values: (series().get(name) ?? []).map((s) => ({
          labels: sampleLabels(s),
          value: s.value,
        })),
      }),
      reset: () => {},
    };
    registry.registerMetric(family as unknown as Gauge);
  }
  for (const reason of GPU_READING_REJECT_REASONS) rejected?.inc({ reason }, 0);

  const ctx = (context: string | undefined) => (context === undefined ? "" : ` (${context})`);
  let unregistered = false;
  // Its own cache: a synchronous render may run while a yielding one is paused.
  const yieldingCache = new LabelCache();
  /** The yielding render under way, and how many scrapes hold its chunks. */
  let rendering: { readonly lent: Promise<LentExposition>; holders: number } | undefined;
  const chunksYielding = (): Promise<LentExposition> => {
    if (unregistered) return Promise.resolve(unlentExposition(Buffer.alloc(0)));
    let shared = rendering;
    if (shared === undefined) {
      const lent = renderClusterChunksYielding(view, resolved.labelValueMaxLength, yieldingCache)
        .catch((error: unknown) => {
          viewFailed(error);
          return unlentExposition(Buffer.from(renderEmptyClusterText(), "utf8"));
        })
        .finally(() => {
          rendering = undefined;
        });
      shared = { lent, holders: 0 };
      rendering = shared;
    }
    // Counted now, before any sharer can receive the chunks and release them.
    const mine = shared;
    mine.holders += 1;
    return mine.lent.then((lent) => {
      let held = true;
      return {
        chunks: lent.chunks,
        byteLength: lent.byteLength,
        release() {
          if (!held) return;
          held = false;
          mine.holders -= 1;
          if (mine.holders === 0) lent.release();
        },
      };
    });
  };
  return {
    families,
    exposition: resolved.exposition,
    renderClusterMetrics() {
      if (unregistered) return "";
      try {
        return renderClusterText(view, resolved.labelValueMaxLength, labelCache);
      } catch (error) {
        viewFailed(error);
        return renderEmptyClusterText();
      }
    },
    renderClusterMetricsBytes() {
      if (unregistered) return Buffer.alloc(0);
      try {
        return renderClusterBytes(view, resolved.labelValueMaxLength, labelCache);
      } catch (error) {
        viewFailed(error);
        return Buffer.from(renderEmptyClusterText(), "utf8");
      }
    },
    renderClusterMetricsBytesYielding: async () => joinExposition(await chunksYielding()),
    renderClusterMetricsChunksYielding: chunksYielding,
    validateGpuReading(raw, context) {
      const result = validateGpuReading(raw, resolved.readingLimits);
      if (!result.ok) {
        rejected?.inc({ reason: result.reason });
        resolved.log(`GPU reading rejected${ctx(context)}: ${result.reason}: ${result.message}`);
      }
      return result;
    },
    sanitizeGpuReading(raw, context) {
      const result = sanitizeGpuReading(raw, resolved.readingLimits);
      for (const problem of result.dropped) {
        rejected?.inc({ reason: problem.reason });
        resolved.log(
          `GPU reading field dropped${ctx(context)}: ${problem.reason}: ${problem.message}`,
        );
      }
      return result;
    },
    unregister() {
      unregistered = true;
      for (const name of registered) registry.removeSingleMetric(name);
    },
  };
}
