/**
 * Adapts the router's {@link RouterMetricsSink} calls to the `llmgw_router_*` Prometheus handles
 * of `@llmgw/metrics-collector` (families and label sets are defined there; this file only
 * translates names and bounds label values).
 */
import {
  type AdmissionRejectReason,
  boundLabelValue,
  type UpstreamErrorKind as PromUpstreamErrorKind,
  type RouterEndpoint,
  type RouterMetrics,
} from "@llmgw/metrics-collector";
import type { RejectionReason, RouterMetricsSink, UpstreamErrorKind } from "@llmgw/router";

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
};

const ADMISSION: Partial<Record<RejectionReason, AdmissionRejectReason>> = {
  queue_full: "queue_full",
  queue_timeout: "queue_timeout",
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

/** A {@link RouterMetricsSink} writing into the handles made by `createRouterMetrics(registry)`. */
export function createPrometheusRouterMetricsSink(m: RouterMetrics): RouterMetricsSink {
  return {
    requestFinished(e) {
      const labels = { model: modelLabel(e.model), endpoint: endpointLabel(e.endpoint) };
      m.requests.inc({ ...labels, code: String(e.status) });
      m.requestDuration.observe(labels, e.seconds);
    },
    firstByte: (model, seconds) =>
      m.timeToFirstToken.observe({ model: modelLabel(model) }, seconds),
    interChunk: (model, seconds) => m.interChunk.observe({ model: modelLabel(model) }, seconds),
    tokens(model, kind, count) {
      (kind === "prompt" ? m.promptTokens : m.completionTokens).inc(
        { model: modelLabel(model) },
        count,
      );
    },
    bytes(model, endpoint, direction, count) {
      m.bytes.inc(
        { model: modelLabel(model), endpoint: endpointLabel(endpoint), direction },
        count,
      );
    },
    inFlight: (model, delta) => m.inFlight.inc({ model: modelLabel(model) }, delta),
    replicaInFlight: (model, replica, value) =>
      m.replicaInFlight.set({ model: modelLabel(model), replica }, value),
    replicasAvailable: (model, count) =>
      m.replicasAvailable.set({ model: modelLabel(model) }, count),
    queueDepth: (model, depth) => m.queueDepth.set({ model: modelLabel(model) }, depth),
    queueWait: (model, seconds, outcome) =>
      m.queueWait.observe({ model: modelLabel(model), outcome }, seconds),
    rejected(model, reason, keyName) {
      if (reason === "rpm" || reason === "tpm" || reason === "concurrency") {
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
      m.scoringTasks.inc({ path: e.mode });
      m.routingDecision.observe({ model, path: e.mode }, e.seconds);
      if (e.replicaId === "") return;
      m.chosenScore.observe({ model }, e.score);
      if (e.chainLength > 0) m.prefixHitRatio.observe({ model }, e.prefixBlocks / e.chainLength);
      if (e.prefixBlocks > 0) m.prefixHitRequests.inc({ model });
      if (e.missingLoadSignals) m.routingFallbacks.inc({ model, reason: "missing_load_signals" });
    },
    clientDisconnect: (model, phase) =>
      m.clientDisconnects.inc({ model: modelLabel(model), phase }),
    // Pool utilisation is sampled at scrape time through `handler.workerPool()`.
    poolUtilization() {},
  };
}
