/**
 * Adapts the router's {@link RouterMetricsSink} calls to the `llmgw_router_*` Prometheus handles
 * of `@llmgw/metrics-collector` (families and label sets are defined there; this file only
 * translates names and bounds label values), and registers the router's own state families, read
 * at scrape time ({@link registerRoutingStateMetrics}).
 */
import {
  type AdmissionRejectReason,
  boundLabelValue,
  type UpstreamErrorKind as PromUpstreamErrorKind,
  ROUTER_STATE_FAMILIES,
  type RouterEndpoint,
  type RouterMetrics,
} from "@llmgw/metrics-collector";
import type {
  LimitReason,
  RejectionReason,
  RouterMetricsSink,
  UpstreamErrorKind,
} from "@llmgw/router";
import type { Metric, Registry } from "prom-client";

const ENDPOINT: Readonly<Record<string, RouterEndpoint>> = {
  "/v1/chat/completions": "chat_completions",
  "/v1/completions": "completions",
  "/v1/embeddings": "embeddings",
  "/v1/models": "models",
};

const UPSTREAM_KIND: Readonly<Record<UpstreamErrorKind, PromUpstreamErrorKind>> = {
  connect: "connect",
  timeout: "timeout",
  reset_before_response: "reset",
  reset_mid_body: "stream_aborted",
  status_5xx: "http_5xx",
  // No family value of its own yet: a refused engine key is a broken router↔engine contract.
  key_refused: "protocol",
};

const LIMIT_REASONS: ReadonlySet<RejectionReason> = new Set<LimitReason>([
  "key-rpm",
  "key-tpm",
  "key-concurrency",
  "key-budget",
  "tenant-rpm",
  "tenant-tpm",
  "tenant-concurrency",
  "tenant-budget",
]);

const ADMISSION: Partial<Record<RejectionReason, AdmissionRejectReason>> = {
  queue_full: "queue_full",
  queue_timeout: "queue_timeout",
  shed: "shed",
  no_ready_replica: "no_ready_replica",
  model_loading: "model_loading",
  unknown_model: "model_not_found",
  body_too_large: "body_too_large",
  invalid_request: "invalid_request",
};

const AUTH = {
  missing_key: "missing",
  unauthorized: "invalid",
  forbidden_model: "model_not_allowed",
} as const;

/** Model label: the router passes `""` before a model is known (unknown names stay unbounded). */
const modelLabel = (model: string): string => (model === "" ? "other" : model);
const endpointLabel = (path: string): RouterEndpoint => ENDPOINT[path] ?? "other";

/**
 * A cache of values made on first use of a key (label values here, from bounded sets), emptied
 * when it reaches `maxKeys`.
 */
function memo<V>(make: (key: string) => V, maxKeys = Number.POSITIVE_INFINITY): (key: string) => V {
  const cache = new Map<string, V>();
  return (key) => {
    let value = cache.get(key);
    if (value === undefined) {
      if (cache.size >= maxKeys) cache.clear();
      value = make(key);
      cache.set(key, value);
    }
    return value;
  };
}

/**
 * A {@link RouterMetricsSink} writing into the handles made by `createRouterMetrics(registry)`.
 * The series a proxied request touches (about 14 updates) are bound once per model, endpoint
 * and status (and replica, for the in-flight gauge), so recording one is a lookup by an existing
 * key and some arithmetic. The other series with a `replica` label (errors, circuit) stay
 * unbound: they change rarely.
 */
export function createPrometheusRouterMetricsSink(m: RouterMetrics): RouterMetricsSink {
  const perModel = memo((model: string) => {
    const one = { model };
    return {
      timeToFirstToken: m.timeToFirstToken.series(one),
      interChunk: m.interChunk.series(one),
      promptTokens: m.promptTokens.series(one),
      completionTokens: m.completionTokens.series(one),
      cachedPromptTokens: m.cachedPromptTokens.series(one),
      inFlight: m.inFlight.series(one),
      replicasAvailable: m.replicasAvailable.series(one),
      chosenScore: m.chosenScore.series(one),
      prefixHitRatio: m.prefixHitRatio.series(one),
      prefixHitRequests: m.prefixHitRequests.series(one),
      /**
       * Keyed by replica id. A bound series outlives `forgetReplica` (it re-creates the series
       * when next set), so the cache only needs a bound on replicas that came and went.
       */
      replicaInFlight: memo((replica) => m.replicaInFlight.series({ model, replica }), 1024),
      routingDecision: {
        inline: m.routingDecision.series({ model, path: "inline" }),
        pool: m.routingDecision.series({ model, path: "pool" }),
      },
      /** Keyed by endpoint label. */
      requestDuration: memo((endpoint) =>
        m.requestDuration.series({ model, endpoint: endpoint as RouterEndpoint }),
      ),
      /** Keyed by `endpoint code`. */
      requests: memo((key) => {
        const [endpoint, code] = key.split(" ") as [RouterEndpoint, string];
        return m.requests.series({ model, endpoint, code });
      }),
      /** Keyed by `endpoint direction`. */
      bytes: memo((key) => {
        const [endpoint, direction] = key.split(" ") as [RouterEndpoint, "in" | "out"];
        return m.bytes.series({ model, endpoint, direction });
      }),
    };
  });
  const scoringTasks = {
    inline: m.scoringTasks.series({ path: "inline" }),
    pool: m.scoringTasks.series({ path: "pool" }),
  };
  return {
    requestFinished(e) {
      const series = perModel(modelLabel(e.model));
      const endpoint = endpointLabel(e.endpoint);
      series.requests(`${endpoint} ${e.status}`).inc();
      series.requestDuration(endpoint).observe(e.seconds);
    },
    firstByte: (model, seconds) => perModel(modelLabel(model)).timeToFirstToken.observe(seconds),
    interChunk: (model, seconds) => perModel(modelLabel(model)).interChunk.observe(seconds),
    tokens(model, kind, count) {
      const series = perModel(modelLabel(model));
      (kind === "prompt"
        ? series.promptTokens
        : kind === "completion"
          ? series.completionTokens
          : series.cachedPromptTokens
      ).inc(count);
    },
    prefixPrediction: (model, source, outcome) =>
      m.prefixPredictions.inc({ model: modelLabel(model), source, outcome }),
    hint: (model, source) => m.affinityHints.inc({ model: modelLabel(model), source }),
    bytes(model, endpoint, direction, count) {
      perModel(modelLabel(model))
        .bytes(`${endpointLabel(endpoint)} ${direction}`)
        .inc(count);
    },
    inFlight: (model, delta) => perModel(modelLabel(model)).inFlight.inc(delta),
    replicaInFlight: (model, replica, value) =>
      perModel(modelLabel(model)).replicaInFlight(replica).set(value),
    replicaGone: (model, replica) => m.forgetReplica(modelLabel(model), replica),
    replicasAvailable: (model, count) => perModel(modelLabel(model)).replicasAvailable.set(count),
    queueDepth: (model, depth) => m.queueDepth.set({ model: modelLabel(model) }, depth),
    queueWait: (model, seconds, outcome) =>
      m.queueWait.observe({ model: modelLabel(model), outcome }, seconds),
    rejected(model, reason, keyName) {
      if (LIMIT_REASONS.has(reason)) {
        m.rateLimited.inc({ key_name: boundLabelValue(keyName ?? "", 64), limit: reason });
        return;
      }
      if (reason === "missing_key" || reason === "unauthorized" || reason === "forbidden_model") {
        m.authFailures.inc({ reason: AUTH[reason] });
        return;
      }
      const admission = ADMISSION[reason];
      if (admission !== undefined)
        m.admissionRejections.inc({ model: modelLabel(model), reason: admission });
    },
    upstreamError: (model, replica, kind) =>
      m.upstreamErrors.inc({ model: modelLabel(model), replica, kind: UPSTREAM_KIND[kind] }),
    retry: (model) => m.retries.inc({ model: modelLabel(model) }),
    circuitState(model, replica, state) {
      const to = state === "half-open" ? "half_open" : state;
      m.setCircuitState(modelLabel(model), replica, to);
      m.circuitTransitions.inc({ model: modelLabel(model), replica, to });
    },
    decision(e) {
      const model = modelLabel(e.model);
      const series = perModel(model);
      scoringTasks[e.mode].inc();
      series.routingDecision[e.mode].observe(e.seconds);
      if (e.replicaId === "") return;
      series.chosenScore.observe(e.score);
      if (e.chainLength > 0) series.prefixHitRatio.observe(e.prefixBlocks / e.chainLength);
      if (e.prefixBlocks > 0) series.prefixHitRequests.inc();
      if (e.missingLoadSignals) m.routingFallbacks.inc({ model, reason: "missing_load_signals" });
      if (e.preciseFallback !== undefined)
        m.routingFallbacks.inc({ model, reason: e.preciseFallback });
    },
    clientDisconnect: (model, phase) =>
      m.clientDisconnects.inc({ model: modelLabel(model), phase }),
    // Pool utilisation is sampled at scrape time through `handler.workerPool()`.
    poolUtilization() {},
  };
}

/** What the routing-state gauges read at scrape time. */
export interface RoutingStateSample {
  /** Seconds since a control plane was last heard; undefined: never (the series is absent). */
  readonly stateAgeSeconds: number | undefined;
  /** Membership version held (0 before the first snapshot). */
  readonly stateVersion: number;
  /** 1 while a routing stream (or the in-process feed) is attached, else 0. */
  readonly controlPlaneConnected: number;
  /** Routers sharing the cluster: this router admits 1/routers of each capacity and limit. */
  readonly routers: number;
  /** 1 when the router isolates prefix caches (`cacheIsolation` tenant or key), else 0. */
  readonly cacheIsolation: number;
  /** 1 while it refuses requests past `--max-state-age`, else 0; undefined without one (absent). */
  readonly stateStale: number | undefined;
  /**
   * Usage batches the control plane refused for good, set aside (see usage-reporter.ts);
   * undefined on a router that records no usage (the series is absent).
   */
  readonly usageBatchesRefused: number | undefined;
  /** The requests in them; undefined as {@link usageBatchesRefused} is. */
  readonly usageRequestsRefused: number | undefined;
}

/** How each state family reads its sample; names, types and help come from the catalogue. */
const READERS: Readonly<Record<string, (s: RoutingStateSample) => number | undefined>> = {
  llmgw_router_state_age_seconds: (s) => s.stateAgeSeconds,
  llmgw_router_state_version: (s) => s.stateVersion,
  llmgw_router_control_plane_connected: (s) => s.controlPlaneConnected,
  llmgw_router_routers: (s) => s.routers,
  llmgw_router_cache_isolation: (s) => s.cacheIsolation,
  llmgw_router_state_stale: (s) => s.stateStale,
  llmgw_router_usage_batches_refused_total: (s) => s.usageBatchesRefused,
  llmgw_router_usage_requests_refused_total: (s) => s.usageRequestsRefused,
};

/** The router's own state families (`ROUTER_STATE_FAMILIES` in `@llmgw/metrics-collector`). */
export const ROUTING_STATE_FAMILIES = ROUTER_STATE_FAMILIES.map((spec) => {
  const read = READERS[spec.name];
  if (read === undefined) throw new Error(`no reader for router state family ${spec.name}`);
  return { name: spec.name, help: spec.help, type: spec.type, read };
});

/**
 * Registers the router's state families on `registry` (gauges, and the usage reporter's
 * counters, which only ever grow), each read from `sample()` at scrape time. Custom collectors,
 * not prom-client Gauges: an unlabelled Gauge always exposes a value, and a state age never
 * heard must be a missing series, not 0.
 */
export function registerRoutingStateMetrics(
  registry: Registry,
  sample: () => RoutingStateSample,
): void {
  for (const { name, help, type, read } of ROUTING_STATE_FAMILIES) {
    const family = {
      name,
      help,
      type,
      aggregator: "omit" as const,
      labelNames: [],
      get: async () => {
        const v = read(sample());
        const values = v !== undefined && Number.isFinite(v) ? [{ labels: {}, value: v }] : [];
        return { name, help, type, aggregator: "omit" as const, values };
      },
      reset: () => {},
    };
    registry.registerMetric(family as unknown as Metric);
  }
}
