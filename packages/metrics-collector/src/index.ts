export {
  type ClusterCollector,
  type ClusterCollectorOptions,
  type ClusterExposition,
  createClusterCollector,
  type ResolvedClusterCollectorOptions,
  resolveClusterCollectorOptions,
} from "./cluster-collector.js";
export {
  buildClusterSeries,
  type CachedLabels,
  type ClusterSeries,
  escapeLabelValue,
  formatLabelPairs,
  type GpuCapacityState,
  gpuCapacityState,
  LabelCache,
  NO_LABELS,
  type Sample,
  type SeriesSink,
  sampleLabels,
  walkClusterSeries,
} from "./cluster-series.js";
export {
  CLUSTER_TEXT_FAMILIES,
  type LentExposition,
  renderClusterBytes,
  renderClusterText,
  renderEmptyClusterText,
} from "./cluster-text.js";
export type {
  ClusterView,
  DeploymentView,
  FabricView,
  GpuReadingView,
  GpuView,
  NodeState,
  NodeView,
  PortView,
  ReplicaState,
  ReplicaView,
  RouterView,
} from "./cluster-view.js";
export { type ControlPlaneMetrics, createControlPlaneMetrics } from "./control-plane-metrics.js";
export {
  isMetricsCollectorError,
  MetricsCollectorError,
  type MetricsCollectorErrorCode,
} from "./errors.js";
export {
  CIRCUIT_STATES,
  CLUSTER_FAMILIES,
  CONTROL_PLANE_FAMILIES,
  type FamilySpec,
  type FamilyType,
  GPU_STATES,
  LABEL_DOCS,
  NODE_STATES,
  REPLICA_STATES,
  ROUTER_FAMILIES,
  ROUTER_PEER_FAMILIES,
  ROUTER_STATE_FAMILIES,
  ROUTER_STATES,
  USAGE_FAMILIES,
} from "./families.js";
export {
  GPU_READING_REJECT_REASONS,
  type GpuReadingLimits,
  type GpuReadingProblem,
  type GpuReadingRejectReason,
  type GpuReadingSanitized,
  type GpuReadingValidation,
  type ResolvedGpuReadingLimits,
  resolveGpuReadingLimits,
  sanitizeGpuReading,
  type ValidGpuReading,
  validateGpuReading,
} from "./gpu-reading.js";
export type { HotCounter, HotGauge, HotHistogram } from "./hot-families.js";
export { boundLabelValue, boundModelLabel, DEFAULT_LABEL_VALUE_MAX_LENGTH } from "./labels.js";
export { METRICS_REFERENCE_MARKERS, renderMetricsReference } from "./metrics-doc.js";
export {
  createMetricsEndpoint,
  type MetricsEndpoint,
  type MetricsEndpointOptions,
} from "./metrics-endpoint.js";
export { createMetricsRegistry } from "./registry.js";
export {
  type AdmissionRejectReason,
  type AuthFailureReason,
  type CircuitState,
  createRouterMetrics,
  type DisconnectPhase,
  type QueueOutcome,
  type RouterEndpoint,
  type RouterMetrics,
  type RouterMetricsOptions,
  type RoutingFallbackReason,
  type ScoringPath,
  type UpstreamErrorKind,
} from "./router-metrics.js";
export {
  createUsageMetrics,
  NO_TENANT_LABEL,
  type UsageMetrics,
  type UsageMetricsOptions,
  type UsageSample,
} from "./usage-metrics.js";
