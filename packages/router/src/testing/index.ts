/** Test doubles of `@llmgw/router` (real implementations, not mocks). */
import type { RouterMetricsSink } from "../metrics-sink.js";

export { createManualRoutingFeed, type ManualRoutingFeed } from "./routing-feed.js";

/** One recorded sink call: the method name and its arguments. */
export interface RecordedMetric {
  readonly method: keyof RouterMetricsSink;
  readonly args: readonly unknown[];
}

/** A {@link RouterMetricsSink} that records every call, in order. */
export interface RecordingRouterMetrics extends RouterMetricsSink {
  readonly calls: RecordedMetric[];
  /** Arguments of every call to `method`. */
  of(method: keyof RouterMetricsSink): (readonly unknown[])[];
}

/** Creates a {@link RecordingRouterMetrics}. */
export function createRecordingRouterMetrics(): RecordingRouterMetrics {
  const calls: RecordedMetric[] = [];
  const rec =
    (method: keyof RouterMetricsSink) =>
    (...args: unknown[]): void => {
      calls.push({ method, args });
    };
  return {
    calls,
    of: (method) => calls.filter((c) => c.method === method).map((c) => c.args),
    requestFinished: rec("requestFinished"),
    firstByte: rec("firstByte"),
    interChunk: rec("interChunk"),
    tokens: rec("tokens"),
    bytes: rec("bytes"),
    inFlight: rec("inFlight"),
    replicaInFlight: rec("replicaInFlight"),
    replicaGone: rec("replicaGone"),
    replicasAvailable: rec("replicasAvailable"),
    queueDepth: rec("queueDepth"),
    queueWait: rec("queueWait"),
    rejected: rec("rejected"),
    upstreamError: rec("upstreamError"),
    retry: rec("retry"),
    circuitState: rec("circuitState"),
    decision: rec("decision"),
    prefixPrediction: rec("prefixPrediction"),
    hint: rec("hint"),
    clientDisconnect: rec("clientDisconnect"),
    poolUtilization: rec("poolUtilization"),
  };
}
