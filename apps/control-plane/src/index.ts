export { inventoryFromProto, inventoryToProto } from "@llmgw/wire";
export { createClusterView } from "./cluster-view.js";
export {
  type ControlPlaneOptions,
  controlPlaneConfigSchema,
  type ResolvedControlPlaneOptions,
  resolveControlPlaneOptions,
} from "./config.js";
export {
  deploymentSpecFromProto,
  deploymentSpecToProto,
} from "./convert/deployment.js";
export { type ApiKeyInput, ApiKeys } from "./domain/api-keys.js";
export {
  type ApiKeyGrant,
  type Clock,
  Cluster,
  type ClusterOptions,
  DEFAULT_REPLICA_CAPACITY,
  type DesiredSet,
  type HeartbeatInput,
  type InventoryLookup,
  LOAD_REFRESH_MS,
  type RegisterInput,
  type RegisterResult,
  type ReplicaLoad,
  type ReplicaLoadReportInput,
  type RoutableReplica,
  type RoutingMembership,
} from "./domain/cluster.js";
export { EventLog } from "./domain/event-log.js";
export {
  type NodeLifecycleTiming,
  type NodeState,
  nextNodeState,
} from "./domain/node-lifecycle.js";
export {
  planReconcile,
  type ReconcileInput,
  type ReconcilePlan,
  type ScheduleFn,
} from "./domain/reconcile.js";
export { replicaLoadFromProto } from "./domain/replica-loads.js";
export { aggregateReplicaState, replicaStateName } from "./domain/replica-state.js";
export {
  type TenantInput,
  Tenants,
  type TokenBudgetInput,
  validateBudgets,
  validatePriority,
  validateTenantName,
} from "./domain/tenants.js";
export {
  DATA_DIR_FILES,
  type DataDir,
  hashSecret,
  initDataDir,
  readToken,
  type TokenKind,
} from "./domain/tokens.js";
export {
  type BudgetPeriodName,
  type BudgetSpec,
  type BudgetStandingData,
  budgetSpecs,
  ClusterUsage,
  type ClusterUsageOptions,
  MAX_USAGE_ROWS,
  type UsageReport,
  usageByTenantAndModel,
} from "./domain/usage.js";
export { ControlPlaneError, type ControlPlaneErrorCode, isControlPlaneError } from "./errors.js";
export {
  createRoutingPublisher,
  DEFAULT_MAX_QUEUED_MESSAGES,
  type RouterCount,
  type RoutingPublisher,
  type RoutingPublisherOptions,
  type RoutingPublisherStats,
  type RoutingSource,
  type RoutingStreamOptions,
  streamRoutingFeed,
} from "./routing/publisher.js";
export {
  createRouterRegistry,
  DEFAULT_MAX_ROUTERS,
  DISCONNECTED_ROUTERS_KEPT_MS,
  type RouterEntry,
  type RouterRegistration,
  type RouterRegistry,
  type RouterRegistryOptions,
  type RouterSession,
} from "./routing/router-registry.js";
export { type AgentFastPathOptions, createAgentFastPath } from "./rpc/agent-fast-path.js";
export type { AgentCalls, AgentStreams, ClientStreamSession } from "./rpc/agent-service.js";
export { ERROR_CODE_HEADER, toConnectError } from "./rpc/errors.js";
export {
  createRouterService,
  type RouterServiceDeps,
  validateWatchRoutingRequest,
  WATCH_ROUTING_LIMITS,
} from "./rpc/router-service.js";
export {
  budgetStandingToProto,
  GET_USAGE_LIMITS,
  REPORT_USAGE_LIMITS,
  usageReportToProto,
  usageRowToProto,
  validateGetUsageRequest,
  validateReportUsageRequest,
} from "./rpc/usage-requests.js";
export {
  CONTROL_PLANE_VERSION,
  type ControlPlane,
  type ControlPlaneDeps,
  type HttpHandler,
  IN_PROCESS_ROUTER_ID,
  type ShutdownReport,
  startControlPlane,
} from "./run.js";
export {
  type MigrateStoreOptions,
  type MigrateStoreReport,
  migrateStore,
  STORE_TABLES,
} from "./store/migrate-store.js";
export { MIGRATIONS } from "./store/migrations.js";
export { type LeaderLease, startLeaderLease } from "./store/postgres-lease.js";
export {
  openPostgresDatabase,
  openPostgresStore,
  redactStoreUrl,
} from "./store/postgres-store.js";
export {
  exportUsage,
  importUsage,
  openPostgresUsageStore,
  type PostgresUsageStoreOptions,
} from "./store/postgres-usage-store.js";
export {
  openSqliteStore,
  type SqliteStore,
  type SqliteStoreOptions,
} from "./store/sqlite-store.js";
export { createSqliteUsageStore } from "./store/sqlite-usage-store.js";
export type {
  ApiKeyRecord,
  ClusterStore,
  DeploymentRecord,
  EventRecord,
  EventSeverity,
  NodeRecord,
  PlacementRankRecord,
  PlacementRecord,
  PriorityClassName,
  ReplicaStatusRecord,
  TenantRecord,
  TokenBudgetRecord,
} from "./store/types.js";
export {
  bucketStart,
  buildUsageDeltas,
  DEFAULT_USAGE_RETENTION,
  monthStart,
  type UsageBatch,
  type UsageBucket,
  type UsageCounts,
  type UsageExport,
  type UsagePruneReport,
  type UsageQuery,
  type UsageRecordData,
  type UsageRetention,
  type UsageRollupDelta,
  type UsageRollupRow,
  type UsageStore,
} from "./store/usage-store.js";
export { parseTrustedProxies } from "./ui/proxy-trust.js";
