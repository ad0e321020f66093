export {
  type AbortSignalLike,
  type AdmissionController,
  type AdmissionKey,
  type AdmissionOptions,
  type AdmissionOutcome,
  type AdmissionRejection,
  createAdmissionController,
  defaultCriticalPrefillReserve,
} from "./admission.js";
export {
  analyzeByParsing,
  analyzeByScanning,
  analyzeRequestBody,
  type BodyAnalysis,
  SCAN_THRESHOLD_BYTES,
} from "./analyze.js";
export {
  type ApiKeyInfo,
  type ApiKeyStore,
  createInMemoryApiKeyStore,
  type InMemoryApiKeyStore,
  type TenantInfo,
} from "./api-keys.js";
export {
  type BlockHashOptions,
  DEFAULT_BLOCK_BYTES,
  DEFAULT_MAX_BLOCKS,
  hashPromptBlocks,
  hashPromptPieces,
  type PromptKeys,
  promptKeys,
  quarterTail,
} from "./block-hash.js";
export { appendMembers } from "./body-rewrite.js";
export { type BufferPool, createBufferPool, POOLED_MIN_BYTES } from "./buffer-pool.js";
export {
  CACHE_ISOLATION_MODES,
  type CacheIsolation,
  cacheIsolationStrictness,
  ENGINE_CACHE_ISOLATION,
  type EngineCacheIsolation,
  ISOLATED_SALT_PREFIX,
  isolatedSalt,
  isolationMembers,
  isolationScope,
  TENANT_CACHE_ISOLATION,
  type TenantCacheIsolation,
} from "./cache-isolation.js";
export { type Clock, createManualClock, type ManualClock, systemClock } from "./clock.js";
export { CriticalPrefills } from "./critical-prefills.js";
export { isRouterError, RouterError, type RouterErrorCode } from "./errors.js";
export {
  completionTokenLimit,
  DEFAULT_COMPLETION_TOKEN_ESTIMATE,
  extractRequestFeatures,
  type FeatureErrorReason,
  type FeatureResult,
  HINT_FIELDS,
  type HintSource,
  MAX_CACHE_SALT_LENGTH,
  MAX_HINT_LENGTH,
  type RequestFeatures,
  type RequestHint,
  type StreamUsage,
  streamUsageOf,
} from "./features.js";
export { createInFlightCounters, type InFlightCounters } from "./in-flight.js";
export {
  createLimiter,
  type Limiter,
  type LimiterOptions,
  type LimitLease,
  type LimitNever,
  type LimitOutcome,
  type LimitReason,
  type LimitRefusal,
  MAX_SETTLED_TOKENS,
} from "./limits.js";
export {
  type DecisionEvent,
  noopRouterMetrics,
  type PreciseFallbackReason,
  type PrefixPredictionOutcome,
  type RejectionReason,
  type RequestEvent,
  type RouterMetricsSink,
  type UpstreamErrorKind,
} from "./metrics-sink.js";
export {
  createReplicaPicker,
  type DispatchOutcome,
  PEER_PREFILL_MAX_MS,
  type PeerDispatch,
  type PickDecision,
  type PickRequest,
  type ReplicaPicker,
  type ReplicaPickerOptions,
} from "./picker.js";
export {
  type BlockFeedResult,
  type BlockFeedUpdate,
  createPreciseIndex,
  MAX_PRECISE_KEYS,
  type PreciseIndex,
  type PreciseReplicaState,
} from "./precise-index.js";
export { createPrefixIndex, type PrefixIndex, type PrefixIndexOptions } from "./prefix-index.js";
export {
  chainAnchor,
  DEFAULT_RENDEZVOUS_ANCHOR_BLOCKS,
  rendezvousOrder,
  rendezvousWeight,
  replicaSeed,
} from "./rendezvous.js";
export {
  type CircuitState,
  createReplicaHealth,
  type ReplicaHealth,
  type ReplicaHealthOptions,
} from "./replica-health.js";
export {
  createRequestAnalyzer,
  type RequestAnalysis,
  type RequestAnalyzer,
  type RequestAnalyzerOptions,
  type RequestAnalyzerPoolOptions,
} from "./request-analyzer.js";
export {
  createStaticRouteTable,
  type PromptTokenizerKind,
  type ReplicaLoad,
  type ReplicaRoute,
  type ReplicaRouteState,
  type RouteResolution,
  type RouteTable,
  type RoutingPolicy,
  type StaticRouteTable,
} from "./route-table.js";
export type {
  BudgetPeriod,
  InFlightReport,
  KeyGrant,
  LoadUpdate,
  PriorityClass,
  ReplicaLoadSample,
  RoutedModel,
  RoutedReplica,
  RoutedReplicaState,
  RoutingDelta,
  RoutingFeed,
  RoutingKeepalive,
  RoutingMessage,
  RoutingSnapshot,
  TenantGrant,
  TokenBudget,
} from "./routing-messages.js";
export {
  type ApplyResult,
  createRoutingState,
  DEFAULT_LOAD_STALE_MS,
  ROUTING_LIMITS,
  type RoutingState,
  type RoutingStateOptions,
  validateRoutingMessage,
} from "./routing-state.js";
export {
  DEFAULT_SCORING_WEIGHTS,
  type RankedCandidate,
  type Ranking,
  type ResolvedScoringOptions,
  rankCandidates,
  resolveScoringOptions,
  type ScoringCandidate,
  type ScoringOptions,
  type ScoringWeights,
} from "./scoring.js";
export { StepPhase } from "./step-phase.js";
export {
  type AnswerUsage,
  EventEndCounter,
  MAX_REPORTED_TOKENS,
  readAnswerUsage,
  readUsageCount,
  USAGE_MEMBER_CHARS,
  UsageEventFilter,
  type UsageField,
  UsageReader,
} from "./usage.js";
export {
  type BudgetStanding,
  GpuShares,
  MAX_USAGE_BATCH_RECORDS,
  type RequestUsage,
  type UsageAnswer,
  type UsageBatch,
  type UsageEntry,
  UsageLedger,
  type UsageLedgerOptions,
} from "./usage-ledger.js";
