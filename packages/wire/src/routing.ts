import { create } from "@bufbuild/protobuf";
import {
  BudgetPeriod as BudgetPeriodProto,
  type EngineLoad,
  type KeyGrant as KeyGrantProto,
  PriorityClass as PriorityClassProto,
  RoutedReplicaState as ReplicaStateProto,
  type RoutedModel as RoutedModelProto,
  type RoutedReplica as RoutedReplicaProto,
  RoutingPolicy as RoutingPolicyProto,
  type TenantGrant as TenantGrantProto,
  type TokenBudget as TokenBudgetProto,
  type WatchRoutingResponse,
  WatchRoutingResponseSchema,
} from "@llmgw/proto";
import {
  type BudgetPeriod,
  ENGINE_CACHE_ISOLATION,
  type EngineCacheIsolation,
  type KeyGrant,
  type PriorityClass,
  type PromptTokenizerKind,
  type ReplicaLoad,
  type RoutedModel,
  type RoutedReplica,
  type RoutedReplicaState,
  RouterError,
  type RoutingMessage,
  type RoutingPolicy,
  TENANT_CACHE_ISOLATION,
  type TenantCacheIsolation,
  type TenantGrant,
  type TokenBudget,
  validateRoutingMessage,
} from "@llmgw/router";

/*
 * The one place where `@llmgw/router`'s plain routing messages (numbers, absent for "not
 * reported") and the wire `WatchRoutingResponse` (bigint, unset optionals) meet. Both ways run
 * `validateRoutingMessage`, so what a control plane sends is what a router accepts.
 */

const POLICY_BY_PROTO: Readonly<Record<number, RoutingPolicy>> = {
  [RoutingPolicyProto.LLMGW]: "llmgw",
  [RoutingPolicyProto.ROUND_ROBIN]: "round-robin",
  [RoutingPolicyProto.LEAST_LOADED]: "least-loaded",
};
const POLICY_TO_PROTO: Readonly<Record<RoutingPolicy, RoutingPolicyProto>> = {
  llmgw: RoutingPolicyProto.LLMGW,
  "round-robin": RoutingPolicyProto.ROUND_ROBIN,
  "least-loaded": RoutingPolicyProto.LEAST_LOADED,
};
const STATE_BY_PROTO: Readonly<Record<number, RoutedReplicaState>> = {
  [ReplicaStateProto.READY]: "ready",
  [ReplicaStateProto.DRAINING]: "draining",
};
const STATE_TO_PROTO: Readonly<Record<RoutedReplicaState, ReplicaStateProto>> = {
  ready: ReplicaStateProto.READY,
  draining: ReplicaStateProto.DRAINING,
};

const PRIORITY_BY_PROTO: Readonly<Record<number, PriorityClass>> = {
  [PriorityClassProto.CRITICAL]: "critical",
  [PriorityClassProto.STANDARD]: "standard",
  [PriorityClassProto.BATCH]: "batch",
};
const PRIORITY_TO_PROTO: Readonly<Record<PriorityClass, PriorityClassProto>> = {
  critical: PriorityClassProto.CRITICAL,
  standard: PriorityClassProto.STANDARD,
  batch: PriorityClassProto.BATCH,
};
const PERIOD_BY_PROTO: Readonly<Record<number, BudgetPeriod>> = {
  [BudgetPeriodProto.DAY]: "day",
  [BudgetPeriodProto.MONTH]: "month",
};
const PERIOD_TO_PROTO: Readonly<Record<BudgetPeriod, BudgetPeriodProto>> = {
  day: BudgetPeriodProto.DAY,
  month: BudgetPeriodProto.MONTH,
};

/**
 * A wire `PriorityClass` as its plain name; `UNSPECIFIED` (inherit) is undefined, and so is a
 * value this build does not know (`priorityClassFromProto(7) === undefined`): callers that
 * must refuse one check `value !== 0` themselves.
 */
export const priorityClassFromProto = (p: PriorityClassProto): PriorityClass | undefined =>
  PRIORITY_BY_PROTO[p];

/** A plain priority class for the wire; undefined (inherit) is `UNSPECIFIED`. */
export const priorityClassToProto = (p: PriorityClass | undefined): PriorityClassProto =>
  p === undefined ? PriorityClassProto.UNSPECIFIED : PRIORITY_TO_PROTO[p];

/** A plain budget period for the wire. */
export const budgetPeriodToProto = (p: BudgetPeriod): BudgetPeriodProto => PERIOD_TO_PROTO[p];

/** A wire `BudgetPeriod` as its plain name; `UNSPECIFIED` or unknown: undefined. */
export const budgetPeriodFromProto = (p: BudgetPeriodProto): BudgetPeriod | undefined =>
  PERIOD_BY_PROTO[p];

/** A plain token budget for the wire (a `TokenBudget` init); all models: empty `model`. */
export const tokenBudgetToProto = (b: TokenBudget) => ({
  period: PERIOD_TO_PROTO[b.period],
  model: b.model ?? "",
  tokens: BigInt(b.tokens),
});

const fail = (kind: string, path: string, rule: string): never => {
  throw new RouterError("LLMGW_ROUTER_ROUTING_INVALID", `routing ${kind}: ${path} ${rule}`);
};

const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);

/** A wire 64-bit integer as a number; past `Number.MAX_SAFE_INTEGER` it would lose digits. */
const safe = (kind: string, path: string, v: bigint): number => {
  if (v < 0n || v > MAX_SAFE) {
    fail(kind, path, `must be an integer in [0, ${Number.MAX_SAFE_INTEGER}], got ${v}`);
  }
  return Number(v);
};

/** Engine load from the wire; absent fields stay absent (an unreported reading is not 0). */
export function engineLoadFromProto(l: EngineLoad): ReplicaLoad {
  // Field by field rather than spread: routers convert thousands of these a second.
  const out: { -readonly [K in keyof ReplicaLoad]: ReplicaLoad[K] } = {};
  if (l.running !== undefined) out.running = l.running;
  if (l.waiting !== undefined) out.waiting = l.waiting;
  if (l.kvCacheUsage !== undefined) out.kvCacheUsage = l.kvCacheUsage;
  if (l.prefixCacheHitRate !== undefined) out.prefixCacheHitRate = l.prefixCacheHitRate;
  if (l.kvCacheTokens !== undefined) out.kvCacheTokens = l.kvCacheTokens;
  return out;
}

function modelFromProto(kind: string, path: string, m: RoutedModelProto): RoutedModel {
  const policy = POLICY_BY_PROTO[m.routingPolicy];
  if (policy === undefined) {
    fail(
      kind,
      `${path}.policy`,
      `must be one of llmgw, round-robin, least-loaded, got ${m.routingPolicy}`,
    );
  }
  return {
    name: m.name,
    deployment: m.deployment,
    policy: policy as RoutingPolicy,
    loading: m.loading,
    ...(m.tokenizer === "" ? {} : { tokenizer: m.tokenizer as PromptTokenizerKind }),
    ...(m.enginePriority ? { enginePriority: true } : {}),
    // A value this release does not know (a newer control plane's) is "not known": the router
    // then isolates both ways, which every engine takes.
    ...(ENGINE_CACHE_ISOLATION.includes(m.cacheIsolation as EngineCacheIsolation)
      ? { cacheIsolation: m.cacheIsolation as EngineCacheIsolation }
      : {}),
  };
}

function replicaFromProto(kind: string, path: string, r: RoutedReplicaProto): RoutedReplica {
  const state = STATE_BY_PROTO[r.state];
  if (state === undefined)
    fail(kind, `${path}.state`, `must be one of ready, draining, got ${r.state}`);
  return {
    id: r.id,
    model: r.model,
    deployment: r.deployment,
    baseUrl: r.baseUrl,
    state: state as RoutedReplicaState,
    capacity: r.capacity,
    ...(r.engineApiKey === undefined ? {} : { apiKey: r.engineApiKey }),
    ...(r.kvEventsUrl === "" ? {} : { kvEventsUrl: r.kvEventsUrl }),
    ...(r.gpus === 0 ? {} : { gpus: r.gpus }),
    ...(r.load === undefined ? {} : { load: engineLoadFromProto(r.load) }),
    ...(r.loadReportedAtUnixMs === undefined
      ? {}
      : { loadReportedAtMs: safe(kind, `${path}.loadReportedAtMs`, r.loadReportedAtUnixMs) }),
  };
}

function priorityFromProto(kind: string, path: string, p: PriorityClassProto) {
  if (p === PriorityClassProto.UNSPECIFIED) return undefined;
  const name = PRIORITY_BY_PROTO[p];
  if (name === undefined)
    fail(kind, path, `must be one of critical, standard, batch or unset, got ${p}`);
  return name;
}

/** Budgets from the wire; an empty list comes back absent (both mean none). */
function budgetsFromProto(
  kind: string,
  path: string,
  list: readonly TokenBudgetProto[],
): { budgets?: TokenBudget[] } {
  if (list.length === 0) return {};
  return {
    budgets: list.map((b, i) => {
      const period = PERIOD_BY_PROTO[b.period];
      if (period === undefined)
        fail(kind, `${path}[${i}].period`, `must be one of day, month, got ${b.period}`);
      return {
        period: period as BudgetPeriod,
        ...(b.model === "" ? {} : { model: b.model }),
        tokens: safe(kind, `${path}[${i}].tokens`, b.tokens),
      };
    }),
  };
}

/** Empty `models` means all, the same as absent: it comes back absent. */
function keyFromProto(kind: string, path: string, k: KeyGrantProto): KeyGrant {
  const priority = priorityFromProto(kind, `${path}.priority`, k.priority);
  return {
    id: k.id,
    name: k.name,
    secretSha256: k.secretSha256,
    ...(k.models.length === 0 ? {} : { models: k.models }),
    ...(k.requestsPerMinute === undefined ? {} : { rpm: k.requestsPerMinute }),
    ...(k.tokensPerMinute === undefined ? {} : { tpm: k.tokensPerMinute }),
    ...(k.maxConcurrency === undefined ? {} : { maxConcurrency: k.maxConcurrency }),
    ...(k.tenant === "" ? {} : { tenant: k.tenant }),
    ...budgetsFromProto(kind, `${path}.budgets`, k.budgets),
    ...(priority === undefined ? {} : { priority }),
  };
}

function tenantFromProto(kind: string, path: string, t: TenantGrantProto): TenantGrant {
  const priority = priorityFromProto(kind, `${path}.priority`, t.priority);
  return {
    name: t.name,
    ...(t.requestsPerMinute === undefined ? {} : { rpm: t.requestsPerMinute }),
    ...(t.tokensPerMinute === undefined ? {} : { tpm: t.tokensPerMinute }),
    ...(t.maxConcurrency === undefined ? {} : { maxConcurrency: t.maxConcurrency }),
    ...budgetsFromProto(kind, `${path}.budgets`, t.budgets),
    ...(priority === undefined ? {} : { priority }),
    weight: t.weight,
    ...(t.createdAtUnixMs === 0n
      ? {}
      : { createdAtMs: safe(kind, `${path}.createdAtMs`, t.createdAtUnixMs) }),
    // A word from a later control plane asks for isolation this router cannot name: the
    // strictest it has, never less than asked.
    ...(t.cacheIsolation === ""
      ? {}
      : {
          cacheIsolation: TENANT_CACHE_ISOLATION.includes(t.cacheIsolation as TenantCacheIsolation)
            ? (t.cacheIsolation as TenantCacheIsolation)
            : "key",
        }),
  };
}

/**
 * Wire `WatchRoutingResponse` → plain {@link RoutingMessage}, checked with
 * `validateRoutingMessage` (bounded counts and strings, finite numbers, KV usage and hit rate
 * in [0, 1], running and waiting ≥ 0, capacity ≥ 1, known policies and states). Unset optionals
 * stay absent; a key's empty `models` comes back absent (both mean all models).
 * @throws RouterError `LLMGW_ROUTER_ROUTING_INVALID` naming the field (plain names, e.g.
 *   `replicas[2].capacity`), for an unset `message`, an unknown enum, a 64-bit number past
 *   `Number.MAX_SAFE_INTEGER`, a load sample without load, or anything the validator refuses.
 */
export function routingMessageFromProto(res: WatchRoutingResponse): RoutingMessage {
  const m = res.message;
  let message: RoutingMessage;
  switch (m.case) {
    case "snapshot": {
      const s = m.value;
      const kind = "snapshot";
      message = {
        kind,
        epoch: s.epoch,
        version: safe(kind, "version", s.version),
        models: s.models.map((x, i) => modelFromProto(kind, `models[${i}]`, x)),
        replicas: s.replicas.map((x, i) => replicaFromProto(kind, `replicas[${i}]`, x)),
        keys: s.keys.map((x, i) => keyFromProto(kind, `keys[${i}]`, x)),
        ...(s.tenants.length === 0
          ? {}
          : { tenants: s.tenants.map((x, i) => tenantFromProto(kind, `tenants[${i}]`, x)) }),
        routers: s.routers,
        sentAtMs: safe(kind, "sentAtMs", s.sentAtUnixMs),
      };
      break;
    }
    case "delta": {
      const d = m.value;
      const kind = "delta";
      message = {
        kind,
        epoch: d.epoch,
        version: safe(kind, "version", d.version),
        upsertedModels: d.upsertedModels.map((x, i) =>
          modelFromProto(kind, `upsertedModels[${i}]`, x),
        ),
        removedModels: d.removedModels,
        upsertedReplicas: d.upsertedReplicas.map((x, i) =>
          replicaFromProto(kind, `upsertedReplicas[${i}]`, x),
        ),
        removedReplicas: d.removedReplicas,
        upsertedKeys: d.upsertedKeys.map((x, i) => keyFromProto(kind, `upsertedKeys[${i}]`, x)),
        removedKeys: d.removedKeys,
        ...(d.upsertedTenants.length === 0
          ? {}
          : {
              upsertedTenants: d.upsertedTenants.map((x, i) =>
                tenantFromProto(kind, `upsertedTenants[${i}]`, x),
              ),
            }),
        ...(d.removedTenants.length === 0 ? {} : { removedTenants: d.removedTenants }),
        ...(d.routers === undefined ? {} : { routers: d.routers }),
        sentAtMs: safe(kind, "sentAtMs", d.sentAtUnixMs),
      };
      break;
    }
    case "load": {
      const kind = "load";
      message = {
        kind,
        epoch: m.value.epoch,
        samples: m.value.samples.map((s, i) => {
          if (s.load === undefined) fail(kind, `samples[${i}].load`, "must be set");
          const at = s.reportedAtUnixMs;
          return {
            replicaId: s.replicaId,
            load: engineLoadFromProto(s.load as EngineLoad),
            // The path is built only for a bad one (thousands of samples a second).
            reportedAtMs:
              at >= 0n && at <= MAX_SAFE
                ? Number(at)
                : safe(kind, `samples[${i}].reportedAtMs`, at),
          };
        }),
      };
      break;
    }
    case "keepalive": {
      const k = m.value;
      const kind = "keepalive";
      message = {
        kind,
        epoch: k.epoch,
        version: safe(kind, "version", k.version),
        sentAtMs: safe(kind, "sentAtMs", k.sentAtUnixMs),
        intervalMs: k.intervalMs,
      };
      break;
    }
    default:
      return fail(
        "message",
        "message",
        "must be one of snapshot, delta, load, keepalive, got none",
      );
  }
  validateRoutingMessage(message);
  return message;
}

/** Engine load for the wire (an `EngineLoad` init); absent fields stay unset. */
export const engineLoadToProto = (l: ReplicaLoad) => ({
  running: l.running,
  waiting: l.waiting,
  kvCacheUsage: l.kvCacheUsage,
  prefixCacheHitRate: l.prefixCacheHitRate,
  kvCacheTokens: l.kvCacheTokens,
});
const modelToProto = (m: RoutedModel) => ({
  name: m.name,
  deployment: m.deployment,
  routingPolicy: POLICY_TO_PROTO[m.policy],
  loading: m.loading,
  tokenizer: m.tokenizer ?? "",
  enginePriority: m.enginePriority ?? false,
  cacheIsolation: m.cacheIsolation ?? "",
});
const replicaToProto = (r: RoutedReplica) => ({
  id: r.id,
  model: r.model,
  deployment: r.deployment,
  baseUrl: r.baseUrl,
  state: STATE_TO_PROTO[r.state],
  capacity: r.capacity,
  engineApiKey: r.apiKey,
  kvEventsUrl: r.kvEventsUrl ?? "",
  gpus: r.gpus ?? 0,
  load: r.load === undefined ? undefined : engineLoadToProto(r.load),
  loadReportedAtUnixMs: r.loadReportedAtMs === undefined ? undefined : BigInt(r.loadReportedAtMs),
});
const keyToProto = (k: KeyGrant) => ({
  id: k.id,
  name: k.name,
  secretSha256: k.secretSha256,
  models: k.models === undefined ? [] : [...k.models],
  requestsPerMinute: k.rpm,
  tokensPerMinute: k.tpm,
  maxConcurrency: k.maxConcurrency,
  tenant: k.tenant ?? "",
  budgets: (k.budgets ?? []).map(tokenBudgetToProto),
  priority: priorityClassToProto(k.priority),
});
const tenantToProto = (t: TenantGrant) => ({
  name: t.name,
  requestsPerMinute: t.rpm,
  tokensPerMinute: t.tpm,
  maxConcurrency: t.maxConcurrency,
  budgets: (t.budgets ?? []).map(tokenBudgetToProto),
  priority: priorityClassToProto(t.priority),
  weight: t.weight,
  createdAtUnixMs: BigInt(t.createdAtMs ?? 0),
  cacheIsolation: t.cacheIsolation ?? "",
});

/**
 * Plain {@link RoutingMessage} → wire `WatchRoutingResponse`. The message is checked first
 * with `validateRoutingMessage`, so a control plane never sends what routers refuse (and a
 * version past `Number.MAX_SAFE_INTEGER`, which a router could not compare, never leaves).
 * Absent optionals stay unset.
 * @throws RouterError `LLMGW_ROUTER_ROUTING_INVALID` naming the field.
 */
export function routingMessageToProto(m: RoutingMessage): WatchRoutingResponse {
  validateRoutingMessage(m);
  switch (m.kind) {
    case "snapshot":
      return create(WatchRoutingResponseSchema, {
        message: {
          case: "snapshot",
          value: {
            epoch: m.epoch,
            version: BigInt(m.version),
            models: m.models.map(modelToProto),
            replicas: m.replicas.map(replicaToProto),
            keys: m.keys.map(keyToProto),
            tenants: (m.tenants ?? []).map(tenantToProto),
            routers: m.routers,
            sentAtUnixMs: BigInt(m.sentAtMs),
          },
        },
      });
    case "delta":
      return create(WatchRoutingResponseSchema, {
        message: {
          case: "delta",
          value: {
            epoch: m.epoch,
            version: BigInt(m.version),
            upsertedModels: m.upsertedModels.map(modelToProto),
            removedModels: [...m.removedModels],
            upsertedReplicas: m.upsertedReplicas.map(replicaToProto),
            removedReplicas: [...m.removedReplicas],
            upsertedKeys: m.upsertedKeys.map(keyToProto),
            removedKeys: [...m.removedKeys],
            upsertedTenants: (m.upsertedTenants ?? []).map(tenantToProto),
            removedTenants: [...(m.removedTenants ?? [])],
            routers: m.routers,
            sentAtUnixMs: BigInt(m.sentAtMs),
          },
        },
      });
    case "load":
      return create(WatchRoutingResponseSchema, {
        message: {
          case: "load",
          value: {
            epoch: m.epoch,
            samples: m.samples.map((s) => ({
              replicaId: s.replicaId,
              load: engineLoadToProto(s.load),
              reportedAtUnixMs: BigInt(s.reportedAtMs),
            })),
          },
        },
      });
    case "keepalive":
      return create(WatchRoutingResponseSchema, {
        message: {
          case: "keepalive",
          value: {
            epoch: m.epoch,
            version: BigInt(m.version),
            sentAtUnixMs: BigInt(m.sentAtMs),
            intervalMs: m.intervalMs,
          },
        },
      });
  }
}
