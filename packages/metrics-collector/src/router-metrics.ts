import type { Gauge, Registry } from "prom-client";
import { MetricsCollectorError } from "./errors.js";
import { CIRCUIT_STATES, type FamilySpec, ROUTER_FAMILIES } from "./families.js";
import { HotCounter, HotGauge, HotHistogram } from "./hot-families.js";

/** `endpoint` label values. */
export type RouterEndpoint = "chat_completions" | "completions" | "embeddings" | "models" | "other";
/** `reason` values of `llmgw_router_admission_rejections_total`. */
export type AdmissionRejectReason =
  | "queue_full"
  | "queue_timeout"
  /** A queued batch request that made room for one of a higher class. */
  | "shed"
  | "no_ready_replica"
  | "model_loading"
  | "model_not_found"
  | "body_too_large"
  | "invalid_request";
/** `kind` values of `llmgw_router_upstream_errors_total`. */
export type UpstreamErrorKind =
  | "connect"
  | "timeout"
  | "reset"
  | "http_5xx"
  | "stream_aborted"
  | "protocol";
/** Circuit-breaker state of a replica. */
export type CircuitState = (typeof CIRCUIT_STATES)[number];
/** `outcome` values of `llmgw_router_queue_wait_seconds`. */
export type QueueOutcome = "admitted" | "timed_out" | "cancelled" | "shed";
/** `phase` values of `llmgw_router_client_disconnects_total`. */
export type DisconnectPhase = "queued" | "before_first_byte" | "streaming";
/** `reason` values of `llmgw_router_auth_failures_total`. */
export type AuthFailureReason = "missing" | "invalid" | "model_not_allowed";
/** `reason` values of `llmgw_router_routing_fallbacks_total`. */
export type RoutingFallbackReason = "missing_load_signals" | "stale_load_signals";
/** `path` values: scored inline on the main thread or in the worker pool. */
export type ScoringPath = "inline" | "pool";

/**
 * Typed handles on every router family (`ROUTER_FAMILIES`, documented in docs/metrics.md).
 * Label values must come from bounded sets: `model` through `boundModelLabel`, `replica` from
 * deployed replicas, `key_name` through `boundLabelValue`, the rest from the unions above.
 */
export interface RouterMetrics {
  readonly requests: HotCounter<"model" | "endpoint" | "code">;
  readonly requestDuration: HotHistogram<"model" | "endpoint">;
  readonly timeToFirstToken: HotHistogram<"model">;
  readonly interChunk: HotHistogram<"model">;
  readonly promptTokens: HotCounter<"model">;
  readonly completionTokens: HotCounter<"model">;
  readonly inFlight: HotGauge<"model">;
  readonly replicaInFlight: HotGauge<"model" | "replica">;
  readonly queueDepth: HotGauge<"model">;
  readonly queueWait: HotHistogram<"model" | "outcome">;
  readonly admissionRejections: HotCounter<"model" | "reason">;
  readonly upstreamErrors: HotCounter<"model" | "replica" | "kind">;
  readonly retries: HotCounter<"model">;
  readonly cachedPromptTokens: HotCounter<"model">;
  readonly prefixPredictions: HotCounter<"model" | "source" | "outcome">;
  readonly affinityHints: HotCounter<"model" | "source">;
  readonly circuitState: HotGauge<"model" | "replica" | "state">;
  readonly circuitTransitions: HotCounter<"model" | "replica" | "to">;
  readonly routingDecision: HotHistogram<"model" | "path">;
  readonly chosenScore: HotHistogram<"model">;
  readonly prefixHitRatio: HotHistogram<"model">;
  readonly prefixHitRequests: HotCounter<"model">;
  readonly routingFallbacks: HotCounter<"model" | "reason">;
  readonly clientDisconnects: HotCounter<"model" | "phase">;
  readonly scoringTasks: HotCounter<"path">;
  readonly authFailures: HotCounter<"reason">;
  readonly rateLimited: HotCounter<"key_name" | "limit">;
  readonly replicasAvailable: HotGauge<"model">;
  readonly bytes: HotCounter<"model" | "endpoint" | "direction">;
  /** Sets the circuit state set of a replica: 1 for `state`, 0 for the other states. */
  setCircuitState(model: string, replica: string, state: CircuitState): void;
  /** Drops every per-replica series of a replica that no longer exists (keeps cardinality bounded). */
  forgetReplica(model: string, replica: string): void;
  /** Removes every router family from the registry. */
  unregister(): void;
}

/** Options of {@link createRouterMetrics}. */
export interface RouterMetricsOptions {
  /**
   * Sampled at scrape time into `llmgw_router_worker_pool_utilization_ratio` and
   * `…_queue_size` (e.g. from tinypool's `utilization` and `queueSize`). Omitted, throwing
   * or returning `undefined`: both series are missing from the scrape (never 0).
   */
  workerPool?: () => { utilizationRatio: number; queueSize: number } | undefined;
}

function spec(name: string): FamilySpec {
  const found = ROUTER_FAMILIES.find((f) => f.name === name);
  if (found === undefined) throw new Error(`unknown router family ${name}`);
  return found;
}

/**
 * Registers every router family on `registry` (never the global one) and returns typed handles.
 * @throws MetricsCollectorError `LLMGW_METRICS_COLLECTOR_ALREADY_REGISTERED` when a router
 *   family is already registered there.
 */
export function createRouterMetrics(
  registry: Registry,
  options: RouterMetricsOptions = {},
): RouterMetrics {
  for (const f of ROUTER_FAMILIES) {
    if (registry.getSingleMetric(f.name) !== undefined) {
      throw new MetricsCollectorError(
        "LLMGW_METRICS_COLLECTOR_ALREADY_REGISTERED",
        `metric family ${f.name} is already registered on this registry`,
      );
    }
  }
  // Hot families, not prom-client's handles: every proxied request updates about 14 of them
  // (see hot-families.ts). The catalogue holds label names as plain strings; the handle types
  // below pin them.
  const base = <L extends string>(name: string) => {
    const s = spec(name);
    return { name: s.name, help: s.help, labelNames: s.labelNames as readonly L[] };
  };
  const counter = <L extends string>(name: string) => new HotCounter<L>(base<L>(name), registry);
  const gauge = <L extends string>(name: string) => new HotGauge<L>(base<L>(name), registry);
  const histogram = <L extends string>(name: string) =>
    new HotHistogram<L>({ ...base<L>(name), buckets: spec(name).buckets ?? [] }, registry);

  const pool = options.workerPool;
  const sample = () => {
    if (pool === undefined) return undefined;
    try {
      return pool();
    } catch {
      return undefined;
    }
  };
  // Custom collectors, not prom-client Gauges: an unlabelled Gauge always exposes 0, and a
  // pool nobody sampled must be a missing series, not an idle one.
  const sampled = (
    name: string,
    read: (s: { utilizationRatio: number; queueSize: number }) => number,
  ) => {
    const { help } = spec(name);
    const family = {
      name,
      help,
      type: "gauge" as const,
      aggregator: "omit" as const,
      labelNames: [],
      get: async () => {
        const s = sample();
        const v = s === undefined ? undefined : read(s);
        const values = v !== undefined && Number.isFinite(v) ? [{ labels: {}, value: v }] : [];
        return { name, help, type: "gauge" as const, aggregator: "omit" as const, values };
      },
      reset: () => {},
    };
    registry.registerMetric(family as unknown as Gauge);
  };
  sampled("llmgw_router_worker_pool_utilization_ratio", (s) => s.utilizationRatio);
  sampled("llmgw_router_worker_pool_queue_size", (s) => s.queueSize);

  const metrics = {
    requests: counter<"model" | "endpoint" | "code">("llmgw_router_requests_total"),
    requestDuration: histogram<"model" | "endpoint">("llmgw_router_request_duration_seconds"),
    timeToFirstToken: histogram<"model">("llmgw_router_time_to_first_token_seconds"),
    interChunk: histogram<"model">("llmgw_router_inter_chunk_seconds"),
    promptTokens: counter<"model">("llmgw_router_prompt_tokens_total"),
    completionTokens: counter<"model">("llmgw_router_completion_tokens_total"),
    inFlight: gauge<"model">("llmgw_router_requests_in_flight"),
    replicaInFlight: gauge<"model" | "replica">("llmgw_router_replica_requests_in_flight"),
    queueDepth: gauge<"model">("llmgw_router_queue_depth"),
    queueWait: histogram<"model" | "outcome">("llmgw_router_queue_wait_seconds"),
    admissionRejections: counter<"model" | "reason">("llmgw_router_admission_rejections_total"),
    upstreamErrors: counter<"model" | "replica" | "kind">("llmgw_router_upstream_errors_total"),
    retries: counter<"model">("llmgw_router_retries_total"),
    cachedPromptTokens: counter<"model">("llmgw_router_cached_prompt_tokens_total"),
    prefixPredictions: counter<"model" | "source" | "outcome">(
      "llmgw_router_prefix_predictions_total",
    ),
    affinityHints: counter<"model" | "source">("llmgw_router_affinity_hints_total"),
    circuitState: gauge<"model" | "replica" | "state">("llmgw_router_circuit_state"),
    circuitTransitions: counter<"model" | "replica" | "to">(
      "llmgw_router_circuit_transitions_total",
    ),
    routingDecision: histogram<"model" | "path">("llmgw_router_routing_decision_seconds"),
    chosenScore: histogram<"model">("llmgw_router_chosen_score"),
    prefixHitRatio: histogram<"model">("llmgw_router_prefix_hit_ratio"),
    prefixHitRequests: counter<"model">("llmgw_router_prefix_hit_requests_total"),
    routingFallbacks: counter<"model" | "reason">("llmgw_router_routing_fallbacks_total"),
    clientDisconnects: counter<"model" | "phase">("llmgw_router_client_disconnects_total"),
    scoringTasks: counter<"path">("llmgw_router_scoring_tasks_total"),
    authFailures: counter<"reason">("llmgw_router_auth_failures_total"),
    rateLimited: counter<"key_name" | "limit">("llmgw_router_rate_limited_total"),
    replicasAvailable: gauge<"model">("llmgw_router_replicas_available"),
    bytes: counter<"model" | "endpoint" | "direction">("llmgw_router_bytes_total"),
  };

  return {
    ...metrics,
    setCircuitState(model, replica, state) {
      for (const s of CIRCUIT_STATES)
        metrics.circuitState.set({ model, replica, state: s }, s === state ? 1 : 0);
    },
    forgetReplica(model, replica) {
      for (const family of [
        metrics.replicaInFlight,
        metrics.upstreamErrors,
        metrics.circuitState,
        metrics.circuitTransitions,
      ] as const) {
        family.removeWhere({ model, replica });
      }
    },
    unregister() {
      for (const f of ROUTER_FAMILIES) registry.removeSingleMetric(f.name);
    },
  };
}
