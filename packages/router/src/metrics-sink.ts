/**
 * What the router reports, as calls on a small interface. The control plane adapts it to its
 * Prometheus families (`llmgw_router_*`); this package never touches a registry.
 */
import type { AdmissionRejection } from "./admission.js";
import type { HintSource } from "./features.js";
import type { LimitReason } from "./limits.js";
import type { CircuitState } from "./replica-health.js";
import type { RoutingPolicy } from "./route-table.js";

/** Why a request was answered without reaching an engine. */
export type RejectionReason =
  | AdmissionRejection
  | LimitReason
  | "missing_key"
  | "unauthorized"
  | "forbidden_model"
  | "unknown_model"
  | "no_ready_replica"
  | "model_loading"
  | "invalid_request"
  | "body_too_large";

/** Kinds of upstream failure. */
export type UpstreamErrorKind =
  | "connect"
  | "timeout"
  | "reset_before_response"
  | "reset_mid_body"
  | "status_5xx"
  /** The engine answered 401 to the router's engine key (it restarted with a new one). */
  | "key_refused";

/** {@link RouterMetricsSink.prefixPrediction}'s outcomes. */
export type PrefixPredictionOutcome = "hit" | "miss" | "false_hit" | "missed_hit";

/** One routing decision. */
export interface DecisionEvent {
  readonly model: string;
  readonly policy: RoutingPolicy;
  readonly replicaId: string;
  /** Time spent analysing + scoring, in seconds. */
  readonly seconds: number;
  readonly score: number;
  /** Leading blocks of the prompt the chosen replica held. */
  readonly prefixBlocks: number;
  readonly chainLength: number;
  readonly affinityVoided: boolean;
  /** Scored without engine load signals for some candidate (router-side numbers only). */
  readonly missingLoadSignals: boolean;
  /** Where the body was analysed. */
  readonly mode: "inline" | "pool";
  /** Why a deployment with KV-event feeds was routed on the approximate index, if it was. */
  readonly preciseFallback?: PreciseFallbackReason;
}

/**
 * Why precise mode could not match a request (see `llmgw_router_routing_fallbacks_total`):
 * `kv_events_not_synced`, a replica's feed is not fresh; `unsupported_request`, the request
 * cannot be keyed as its engine keys it (the tokenizer does not take it, or it gives a
 * `cache_salt`, whose blocks the feeds leave out); `tokenizer_failed`, tokenizing it failed.
 */
export type PreciseFallbackReason =
  | "kv_events_not_synced"
  | "unsupported_request"
  | "tokenizer_failed";

/** A finished request. */
export interface RequestEvent {
  readonly model: string;
  readonly endpoint: string;
  readonly status: number;
  readonly stream: boolean;
  readonly seconds: number;
}

/** Router measurements; every method must be cheap and must not throw. */
export interface RouterMetricsSink {
  /** Every answered request (status 499 when the client left first). `endpoint` is the URL path. */
  requestFinished(event: RequestEvent): void;
  /** Time from request arrival to the first response body byte. */
  firstByte(model: string, seconds: number): void;
  /** Gap between consecutive streamed chunks. */
  interChunk(model: string, seconds: number): void;
  /**
   * Token counts read from the engine's `usage`; `cached`: its prompt tokens served from the
   * engine's prefix cache (`prompt_tokens_details.cached_tokens`).
   */
  tokens(model: string, kind: "prompt" | "completion" | "cached", count: number): void;
  /**
   * How the router's prefix model fared on a request whose engine reported its cached tokens:
   * `hit` / `miss` when they agree, `false_hit` when the router expected a cached prefix the
   * engine did not have, `missed_hit` when the engine had one the router did not expect.
   */
  prefixPrediction(
    model: string,
    source: "precise" | "approximate",
    outcome: PrefixPredictionOutcome,
  ): void;
  /** A request routed by its affinity hint, by where the hint came from. */
  hint(model: string, source: HintSource): void;
  /** Body bytes: `in` from clients, `out` to clients. */
  bytes(model: string, endpoint: string, direction: "in" | "out", count: number): void;
  inFlight(model: string, delta: number): void;
  replicaInFlight(model: string, replicaId: string, value: number): void;
  /** The replica left the route table: drop its per-replica series. */
  replicaGone(model: string, replicaId: string): void;
  /** Routable replicas of a model, as seen by the latest request. */
  replicasAvailable(model: string, count: number): void;
  queueDepth(model: string, depth: number): void;
  queueWait(
    model: string,
    seconds: number,
    outcome: "admitted" | "timed_out" | "cancelled" | "shed",
  ): void;
  /** A refusal; `keyName` is set for per-key limit refusals. Unknown models come as `""`. */
  rejected(model: string, reason: RejectionReason, keyName?: string): void;
  upstreamError(model: string, replicaId: string, kind: UpstreamErrorKind): void;
  retry(model: string): void;
  circuitState(model: string, replicaId: string, state: CircuitState): void;
  decision(event: DecisionEvent): void;
  clientDisconnect(model: string, phase: "queued" | "before_first_byte" | "streaming"): void;
  /** Active pool tasks ÷ task slots, after each pool task starts. */
  poolUtilization(ratio: number): void;
}

/** A sink that drops everything. */
export const noopRouterMetrics: RouterMetricsSink = {
  requestFinished() {},
  firstByte() {},
  interChunk() {},
  tokens() {},
  bytes() {},
  inFlight() {},
  replicaInFlight() {},
  replicaGone() {},
  replicasAvailable() {},
  queueDepth() {},
  queueWait() {},
  rejected() {},
  upstreamError() {},
  retry() {},
  circuitState() {},
  decision() {},
  prefixPrediction() {},
  hint() {},
  clientDisconnect() {},
  poolUtilization() {},
};
