/**
 * A router's copy of the routing state, fed by {@link RoutingMessage}s: it answers the hot path
 * as a {@link RouteTable} and an {@link ApiKeyStore}, and hands back a snapshot to persist.
 *
 * Contract (the implementation and its tests live here):
 * - a snapshot replaces everything; a delta applies only on exactly `version - 1` of the same
 *   epoch (older or equal: `ignored`; a gap or another epoch: `resync`); load and keepalives
 *   never bump `version` nor rebuild resolutions: load is written into the projected replica
 *   routes in place;
 * - an upserted replica without `apiKey` keeps the key already held for that replica id;
 * - a `draining` replica is projected as `draining` (routed to by no one, its requests in
 *   flight left to finish) and may name a model the state does not list: a deleted deployment's
 *   model goes at once while its replicas drain. Such a replica is held (see
 *   {@link RoutingState.drainingReplicaIds}) but in no resolution;
 * - each router's share: a replica's `capacity` and a key's `rpm`/`tpm`/`maxConcurrency` are
 *   divided by `routers` (at least 1 each), and so are a tenant's; budgets are cluster-wide
 *   and not divided (routers learn each other's use from usage reports);
 * - a key's tenant is projected onto the key (`ApiKeyInfo.tenant`, the same object for every
 *   key of a tenant); a key naming a tenant the state does not hold gets that tenant without
 *   limits, weight 1; a key's priority is its own, else its tenant's, else absent (standard);
 * - load older than `loadStaleMs` is left out of the projection (absent, never 0), its age
 *   judged on the router's own clock: control-plane times (`loadReportedAtMs`, `reportedAtMs`)
 *   are moved onto it by an offset learnt from each message's `sentAtMs` (see
 *   {@link RoutingState.clockOffsetMs}), so a router whose clock is off the control plane's
 *   ages load right.
 */
import type { ApiKeyInfo, ApiKeyStore, TenantInfo } from "./api-keys.js";
import { ENGINE_CACHE_ISOLATION, TENANT_CACHE_ISOLATION } from "./cache-isolation.js";
import { checkRange, RouterError } from "./errors.js";
import type {
  PromptTokenizerKind,
  ReplicaLoad,
  ReplicaRouteState,
  RouteResolution,
  RouteTable,
  RoutingPolicy,
} from "./route-table.js";
import type {
  BudgetPeriod,
  KeyGrant,
  LoadUpdate,
  PriorityClass,
  ReplicaLoadSample,
  RoutedModel,
  RoutedReplica,
  RoutedReplicaState,
  RoutingDelta,
  RoutingMessage,
  RoutingSnapshot,
  TenantGrant,
  TokenBudget,
} from "./routing-messages.js";

/** Inputs of `createRoutingState`. */
export interface RoutingStateOptions {
  /** Lower-case hex sha256 of a secret (this package does no I/O and has no crypto). */
  readonly hashSecret: (secret: string) => string;
  /** Load read longer ago than this (ms) counts as unreported. Default 10 000. */
  readonly loadStaleMs?: number;
  /**
   * The router's wall clock, epoch ms. Default `Date.now`. It need not agree with the control
   * plane's: load is aged through {@link RoutingState.clockOffsetMs}.
   */
  readonly now?: () => number;
}

/** What applying one message did. */
export type ApplyResult = "applied" | "ignored" | "resync";

/** A router's routing state. */
export interface RoutingState {
  /**
   * Applies one message heard at `heardAtMs` (default now; a state file passes the time it
   * was last heard, its `lastHeardAtMs`). `resync`: drop the feed and reconnect for a snapshot.
   */
  apply(message: RoutingMessage, heardAtMs?: number): ApplyResult;
  /** The route table the handler reads; `version` bumps on membership changes only. */
  readonly routeTable: RouteTable;
  /** Key grants by hash, limits already divided by the router count. */
  readonly apiKeys: ApiKeyStore;
  /**
   * The held state as a snapshot (current load included), or undefined before the first. Its
   * `sentAtMs` is {@link lastHeardAtMs} on the control plane's clock (`lastHeardAtMs -
   * clockOffsetMs`), so `apply(snapshot, lastHeardAtMs)` later, on a fresh state, restores the
   * offset, and load ages exactly as it would have in this one.
   */
  snapshot(): RoutingSnapshot | undefined;
  /** Undefined before the first snapshot. */
  readonly epoch: string | undefined;
  /** 0 before the first snapshot. */
  readonly version: number;
  /** Routers sharing the cluster (≥ 1). */
  readonly routers: number;
  /** When a message was last applied or ignored (epoch ms); undefined before any. */
  readonly lastHeardAtMs: number | undefined;
  /**
   * The router's clock minus the control plane's, as estimated (ms; 0 before the first
   * snapshot): the least `heardAtMs - sentAtMs` of the last {@link CLOCK_OFFSET_WINDOW}
   * snapshots, deltas and keepalives, the snapshot that opens a stream starting afresh. It
   * includes the fastest delivery of those messages, so load counts as read that much later.
   */
  readonly clockOffsetMs: number;
  /**
   * Ids of the replicas held as `draining`, sorted, whatever model they name (listed or not).
   * The same array until the next membership change. Empty before the first snapshot.
   */
  readonly drainingReplicaIds: readonly string[];
  /** Called after each membership change (snapshot or delta applied), not after load. */
  onMembershipChange(listener: () => void): () => void;
}

/** Default of {@link RoutingStateOptions.loadStaleMs}. */
export const DEFAULT_LOAD_STALE_MS = 10_000;

/**
 * Messages whose `heardAtMs - sentAtMs` the clock offset is the least of. Delivery delay only
 * ever adds to that difference (a stalled event loop, a backlog in the socket), so the least
 * of a few is the clock difference plus the fastest delivery, and one late message does not
 * make every load look younger; a few, so a stepped clock is followed within that many
 * messages (a step that lowers the difference at once). A keepalive every 2 s: 8 s at most.
 */
export const CLOCK_OFFSET_WINDOW = 4;

/**
 * What one routing message, and the state it builds, may hold. The control plane is trusted,
 * but its stream is outside input: past these a message is refused whole
 * (`LLMGW_ROUTER_ROUTING_INVALID`) and the state stays as it was.
 */
export const ROUTING_LIMITS = {
  /** Served models held (and listed in one message). */
  maxModels: 100_000,
  maxReplicas: 100_000,
  maxKeys: 100_000,
  maxTenants: 100_000,
  /** Token budgets of one tenant or key. */
  maxBudgets: 32,
  /** Largest tenant weight (the smallest is 1). */
  maxTenantWeight: 1_000,
  /** Routers sharing the cluster. */
  maxRouters: 10_000,
  /** Ids and names: model, deployment, replica and key ids, key names. */
  maxNameChars: 256,
  maxEpochChars: 128,
  maxUrlChars: 2048,
  maxApiKeyChars: 4096,
  maxCapacity: 1_000_000,
  /** GPUs of one replica, all ranks together. */
  maxGpus: 65_536,
  /** rpm, tpm and maxConcurrency of a key (the proto's uint32). */
  maxKeyLimit: 4_294_967_295,
  /** Engine-reported running and waiting requests. */
  maxLoadRequests: 1_000_000_000,
  /** Largest KV-cache capacity, in tokens, a load report may carry. */
  maxKvCacheTokens: 2 ** 40,
  maxKeepaliveIntervalMs: 3_600_000,
  /** Timestamps are epoch ms within what a `Date` holds. */
  maxEpochMs: 8_640_000_000_000_000,
} as const;

const TOKENIZERS: ReadonlySet<string> = new Set<PromptTokenizerKind>(["sim", "vllm"]);
const POLICIES: ReadonlySet<string> = new Set<RoutingPolicy>([
  "llmgw",
  "round-robin",
  "least-loaded",
]);
const REPLICA_STATES: ReadonlySet<string> = new Set<RoutedReplicaState>(["ready", "draining"]);
const PRIORITY_CLASSES: ReadonlySet<string> = new Set<PriorityClass>([
  "critical",
  "standard",
  "batch",
]);
const BUDGET_PERIODS: ReadonlySet<string> = new Set<BudgetPeriod>(["day", "month"]);
const SHA256_HEX = /^[0-9a-f]{64}$/;

const fail = (kind: string, path: string, rule: string): never => {
  throw new RouterError("LLMGW_ROUTER_ROUTING_INVALID", `routing ${kind}: ${path} ${rule}`);
};

/** A short echo of a bad value (strings cut, so a huge one never lands in a log line). */
const show = (value: unknown): string => {
  if (typeof value === "string") {
    return value.length > 64
      ? `${JSON.stringify(value.slice(0, 64))}… (${value.length} chars)`
      : JSON.stringify(value);
  }
  if (typeof value === "number" || typeof value === "boolean" || typeof value === "bigint")
    return String(value);
  return value === null ? "null" : typeof value;
};

/** A finite number in [min, max] (absent counts as good: the field is optional). */
const absentOrIn = (v: unknown, min: number, max: number): boolean =>
  v === undefined || (typeof v === "number" && Number.isFinite(v) && v >= min && v <= max);

/**
 * Whether a load sample passes every check {@link MessageChecker} makes of it (name, load
 * fields, timestamp), answered without allocating; false sends it through those checks.
 */
function goodLoadSample(s: ReplicaLoadSample): boolean {
  if (typeof s !== "object" || s === null) return false;
  const { replicaId, load, reportedAtMs } = s;
  return (
    typeof replicaId === "string" &&
    replicaId.length >= 1 &&
    replicaId.length <= ROUTING_LIMITS.maxNameChars &&
    typeof load === "object" &&
    load !== null &&
    absentOrIn(load.running, 0, ROUTING_LIMITS.maxLoadRequests) &&
    absentOrIn(load.waiting, 0, ROUTING_LIMITS.maxLoadRequests) &&
    absentOrIn(load.kvCacheUsage, 0, 1) &&
    absentOrIn(load.prefixCacheHitRate, 0, 1) &&
    absentOrIn(load.kvCacheTokens, 0, ROUTING_LIMITS.maxKvCacheTokens) &&
    typeof reportedAtMs === "number" &&
    Number.isInteger(reportedAtMs) &&
    reportedAtMs >= 0 &&
    reportedAtMs <= ROUTING_LIMITS.maxEpochMs
  );
}

/** Checks one routing message; the error names the field (`replicas[3].capacity`). */
class MessageChecker {
  constructor(readonly kind: string) {}

  string(path: string, value: unknown, min: number, max: number, secret = false): void {
    if (typeof value !== "string" || value.length < min || value.length > max) {
      const got =
        typeof value !== "string" ? show(value) : secret ? `${value.length} chars` : show(value);
      fail(this.kind, path, `must be a string of ${min}..${max} characters, got ${got}`);
    }
  }

  name(path: string, value: unknown): void {
    this.string(path, value, 1, ROUTING_LIMITS.maxNameChars);
  }

  integer(path: string, value: unknown, min: number, max: number): void {
    if (typeof value !== "number" || !Number.isInteger(value) || value < min || value > max) {
      fail(this.kind, path, `must be an integer in [${min}, ${max}], got ${show(value)}`);
    }
  }

  number(path: string, value: unknown, min: number, max: number): void {
    if (typeof value !== "number" || !Number.isFinite(value) || value < min || value > max) {
      fail(this.kind, path, `must be a finite number in [${min}, ${max}], got ${show(value)}`);
    }
  }

  epochMs(path: string, value: unknown): void {
    this.integer(path, value, 0, ROUTING_LIMITS.maxEpochMs);
  }

  list(path: string, value: unknown, max: number): readonly unknown[] {
    if (!Array.isArray(value)) return fail(this.kind, path, `must be a list, got ${show(value)}`);
    if (value.length > max)
      fail(this.kind, path, `holds ${value.length} entries, more than ${max}`);
    return value;
  }

  names(path: string, value: unknown, max: number): void {
    const list = this.list(path, value, max);
    for (let i = 0; i < list.length; i++) this.name(`${path}[${i}]`, list[i]);
  }

  model(path: string, m: RoutedModel): void {
    this.name(`${path}.name`, m.name);
    this.name(`${path}.deployment`, m.deployment);
    this.oneOf(`${path}.policy`, m.policy, [...POLICIES]);
    if (typeof m.loading !== "boolean")
      fail(this.kind, `${path}.loading`, `must be a boolean, got ${show(m.loading)}`);
    if (m.tokenizer !== undefined) this.oneOf(`${path}.tokenizer`, m.tokenizer, [...TOKENIZERS]);
    if (m.enginePriority !== undefined && typeof m.enginePriority !== "boolean")
      fail(this.kind, `${path}.enginePriority`, `must be a boolean, got ${show(m.enginePriority)}`);
    if (m.cacheIsolation !== undefined)
      this.oneOf(`${path}.cacheIsolation`, m.cacheIsolation, ENGINE_CACHE_ISOLATION);
  }

  /** Fails unless `value` is one of `allowed`. */
  oneOf(path: string, value: unknown, allowed: readonly string[]): void {
    if (!allowed.includes(value as string))
      fail(this.kind, path, `must be one of ${allowed.join(", ")}, got ${show(value)}`);
  }

  httpUrl(path: string, url: string): void {
    this.string(path, url, 1, ROUTING_LIMITS.maxUrlChars);
    let protocol: string | undefined;
    try {
      protocol = new URL(url).protocol;
    } catch {}
    if (protocol !== "http:" && protocol !== "https:") {
      fail(this.kind, path, `must be an http(s) URL, got ${show(url)}`);
    }
  }

  replica(path: string, r: RoutedReplica): void {
    this.name(`${path}.id`, r.id);
    this.name(`${path}.model`, r.model);
    this.name(`${path}.deployment`, r.deployment);
    // The handler opens a connection pool on `new URL(baseUrl).origin`: a bad URL must stop
    // here, not throw in the hot path.
    this.httpUrl(`${path}.baseUrl`, r.baseUrl);
    if (!REPLICA_STATES.has(r.state as string)) {
      fail(this.kind, `${path}.state`, `must be one of ready, draining, got ${show(r.state)}`);
    }
    this.integer(`${path}.capacity`, r.capacity, 1, ROUTING_LIMITS.maxCapacity);
    if (r.apiKey !== undefined) {
      this.string(`${path}.apiKey`, r.apiKey, 1, ROUTING_LIMITS.maxApiKeyChars, true);
    }
    if (r.kvEventsUrl !== undefined) this.httpUrl(`${path}.kvEventsUrl`, r.kvEventsUrl);
    if (r.gpus !== undefined) this.integer(`${path}.gpus`, r.gpus, 1, ROUTING_LIMITS.maxGpus);
    if ((r.load === undefined) !== (r.loadReportedAtMs === undefined)) {
      fail(this.kind, path, "must carry load and loadReportedAtMs together or neither");
    }
    if (r.load !== undefined) this.load(`${path}.load`, r.load);
    if (r.loadReportedAtMs !== undefined)
      this.epochMs(`${path}.loadReportedAtMs`, r.loadReportedAtMs);
  }

  load(path: string, l: ReplicaLoad): void {
    if (typeof l !== "object" || l === null)
      fail(this.kind, path, `must be an object, got ${show(l)}`);
    if (l.running !== undefined)
      this.number(`${path}.running`, l.running, 0, ROUTING_LIMITS.maxLoadRequests);
    if (l.waiting !== undefined)
      this.number(`${path}.waiting`, l.waiting, 0, ROUTING_LIMITS.maxLoadRequests);
    if (l.kvCacheUsage !== undefined) this.number(`${path}.kvCacheUsage`, l.kvCacheUsage, 0, 1);
    if (l.prefixCacheHitRate !== undefined) {
      this.number(`${path}.prefixCacheHitRate`, l.prefixCacheHitRate, 0, 1);
    }
    if (l.kvCacheTokens !== undefined) {
      this.number(`${path}.kvCacheTokens`, l.kvCacheTokens, 0, ROUTING_LIMITS.maxKvCacheTokens);
    }
  }

  key(path: string, k: KeyGrant): void {
    this.name(`${path}.id`, k.id);
    this.string(`${path}.name`, k.name, 0, ROUTING_LIMITS.maxNameChars);
    if (typeof k.secretSha256 !== "string" || !SHA256_HEX.test(k.secretSha256)) {
      fail(
        this.kind,
        `${path}.secretSha256`,
        `must be 64 lower-case hex digits, got ${show(k.secretSha256)}`,
      );
    }
    if (k.models !== undefined) this.names(`${path}.models`, k.models, ROUTING_LIMITS.maxModels);
    for (const limit of ["rpm", "tpm", "maxConcurrency"] as const) {
      if (k[limit] !== undefined)
        this.integer(`${path}.${limit}`, k[limit], 1, ROUTING_LIMITS.maxKeyLimit);
    }
    if (k.tenant !== undefined) this.name(`${path}.tenant`, k.tenant);
    if (k.budgets !== undefined) this.budgets(`${path}.budgets`, k.budgets);
    if (k.priority !== undefined) this.priority(`${path}.priority`, k.priority);
  }

  tenant(path: string, t: TenantGrant): void {
    this.name(`${path}.name`, t.name);
    for (const limit of ["rpm", "tpm", "maxConcurrency"] as const) {
      if (t[limit] !== undefined)
        this.integer(`${path}.${limit}`, t[limit], 1, ROUTING_LIMITS.maxKeyLimit);
    }
    if (t.budgets !== undefined) this.budgets(`${path}.budgets`, t.budgets);
    if (t.priority !== undefined) this.priority(`${path}.priority`, t.priority);
    this.integer(`${path}.weight`, t.weight, 1, ROUTING_LIMITS.maxTenantWeight);
    if (t.createdAtMs !== undefined)
      this.integer(`${path}.createdAtMs`, t.createdAtMs, 1, Number.MAX_SAFE_INTEGER);
    if (t.cacheIsolation !== undefined)
      this.oneOf(`${path}.cacheIsolation`, t.cacheIsolation, TENANT_CACHE_ISOLATION);
  }

  tenants(path: string, value: readonly TenantGrant[]): void {
    const list = this.list(path, value, ROUTING_LIMITS.maxTenants) as readonly TenantGrant[];
    for (let i = 0; i < list.length; i++) this.tenant(`${path}[${i}]`, list[i] as TenantGrant);
    this.unique(path, list, (t) => t.name, "name");
  }

  budgets(path: string, value: readonly TokenBudget[]): void {
    const list = this.list(path, value, ROUTING_LIMITS.maxBudgets) as readonly TokenBudget[];
    for (let i = 0; i < list.length; i++) {
      const b = list[i] as TokenBudget;
      if (typeof b !== "object" || b === null)
        fail(this.kind, `${path}[${i}]`, `must be an object, got ${show(b)}`);
      if (!BUDGET_PERIODS.has(b.period))
        fail(this.kind, `${path}[${i}].period`, `must be one of day, month, got ${show(b.period)}`);
      if (b.model !== undefined) this.name(`${path}[${i}].model`, b.model);
      this.integer(`${path}[${i}].tokens`, b.tokens, 1, Number.MAX_SAFE_INTEGER);
    }
    // "day", "month:llama-3-8b": as `llmgw tenants create --budget` spells them.
    this.unique(
      path,
      list,
      (b) => (b.model === undefined ? b.period : `${b.period}:${b.model}`),
      "period and model",
    );
  }

  priority(path: string, value: PriorityClass): void {
    if (!PRIORITY_CLASSES.has(value))
      fail(this.kind, path, `must be one of critical, standard, batch, got ${show(value)}`);
  }

  models(path: string, value: readonly RoutedModel[]): void {
    const list = this.list(path, value, ROUTING_LIMITS.maxModels) as readonly RoutedModel[];
    for (let i = 0; i < list.length; i++) this.model(`${path}[${i}]`, list[i] as RoutedModel);
    this.unique(path, list, (m) => m.name, "name");
  }

  replicas(path: string, value: readonly RoutedReplica[]): void {
    const list = this.list(path, value, ROUTING_LIMITS.maxReplicas) as readonly RoutedReplica[];
    for (let i = 0; i < list.length; i++) this.replica(`${path}[${i}]`, list[i] as RoutedReplica);
    this.unique(path, list, (r) => r.id, "id");
  }

  keys(path: string, value: readonly KeyGrant[]): void {
    const list = this.list(path, value, ROUTING_LIMITS.maxKeys) as readonly KeyGrant[];
    for (let i = 0; i < list.length; i++) this.key(`${path}[${i}]`, list[i] as KeyGrant);
    this.unique(path, list, (k) => k.id, "id");
  }

  unique<T>(path: string, list: readonly T[], idOf: (item: T) => string, field: string): void {
    const seen = new Set<string>();
    for (let i = 0; i < list.length; i++) {
      const id = idOf(list[i] as T);
      if (seen.has(id)) fail(this.kind, `${path}[${i}].${field}`, `repeats ${show(id)}`);
      seen.add(id);
    }
  }
}

/**
 * Checks one routing message against {@link ROUTING_LIMITS} and the field rules (known kinds,
 * policies and states, integers where counts, finite numbers, KV usage and hit rate in [0, 1],
 * load with its timestamp, no id twice in one list). `@llmgw/wire` runs it on what it decodes;
 * {@link RoutingState.apply} runs it on every message, so an in-process feed is held to the
 * same bounds.
 * @throws RouterError `LLMGW_ROUTER_ROUTING_INVALID` naming the field.
 */
export function validateRoutingMessage(message: RoutingMessage): void {
  if (typeof message !== "object" || message === null) {
    fail("message", "message", `must be an object, got ${show(message)}`);
  }
  const c = new MessageChecker(typeof message.kind === "string" ? message.kind : "message");
  switch (message.kind) {
    case "snapshot":
      c.string("epoch", message.epoch, 1, ROUTING_LIMITS.maxEpochChars);
      c.integer("version", message.version, 0, Number.MAX_SAFE_INTEGER);
      c.models("models", message.models);
      c.replicas("replicas", message.replicas);
      c.keys("keys", message.keys);
      if (message.tenants !== undefined) c.tenants("tenants", message.tenants);
      c.integer("routers", message.routers, 1, ROUTING_LIMITS.maxRouters);
      c.epochMs("sentAtMs", message.sentAtMs);
      return;
    case "delta":
      c.string("epoch", message.epoch, 1, ROUTING_LIMITS.maxEpochChars);
      c.integer("version", message.version, 1, Number.MAX_SAFE_INTEGER);
      c.models("upsertedModels", message.upsertedModels);
      c.names("removedModels", message.removedModels, ROUTING_LIMITS.maxModels);
      c.replicas("upsertedReplicas", message.upsertedReplicas);
      c.names("removedReplicas", message.removedReplicas, ROUTING_LIMITS.maxReplicas);
      c.keys("upsertedKeys", message.upsertedKeys);
      c.names("removedKeys", message.removedKeys, ROUTING_LIMITS.maxKeys);
      if (message.upsertedTenants !== undefined)
        c.tenants("upsertedTenants", message.upsertedTenants);
      if (message.removedTenants !== undefined)
        c.names("removedTenants", message.removedTenants, ROUTING_LIMITS.maxTenants);
      if (message.routers !== undefined) {
        c.integer("routers", message.routers, 1, ROUTING_LIMITS.maxRouters);
      }
      c.epochMs("sentAtMs", message.sentAtMs);
      return;
    case "load": {
      c.string("epoch", message.epoch, 1, ROUTING_LIMITS.maxEpochChars);
      const samples = c.list("samples", message.samples, ROUTING_LIMITS.maxReplicas);
      for (let i = 0; i < samples.length; i++) {
        const s = samples[i] as ReplicaLoadSample;
        // Thousands a second from a busy fleet: a good sample is checked without building
        // a single path string; a bad one goes through the checks that name its field.
        if (goodLoadSample(s)) continue;
        if (typeof s !== "object" || s === null)
          fail(c.kind, `samples[${i}]`, `must be an object, got ${show(s)}`);
        c.name(`samples[${i}].replicaId`, s.replicaId);
        c.load(`samples[${i}].load`, s.load);
        c.epochMs(`samples[${i}].reportedAtMs`, s.reportedAtMs);
      }
      return;
    }
    case "keepalive":
      c.string("epoch", message.epoch, 1, ROUTING_LIMITS.maxEpochChars);
      c.integer("version", message.version, 0, Number.MAX_SAFE_INTEGER);
      c.epochMs("sentAtMs", message.sentAtMs);
      c.integer("intervalMs", message.intervalMs, 1, ROUTING_LIMITS.maxKeepaliveIntervalMs);
      return;
    default:
      fail(
        "message",
        "kind",
        `must be one of snapshot, delta, load, keepalive, got ${show((message as { kind?: unknown }).kind)}`,
      );
  }
}

/** A projected replica route; `load` is rewritten in place, everything else once per version. */
interface ProjectedRoute {
  readonly id: string;
  readonly baseUrl: string;
  readonly state: ReplicaRouteState;
  readonly capacity: number;
  load: ReplicaLoad | undefined;
  readonly apiKey: string | undefined;
  readonly authorization: string | undefined;
  readonly kvEventsUrl: string | undefined;
  readonly gpus: number | undefined;
}

/** One replica as held: membership (key kept), the newest load heard, and its projection. */
interface HeldReplica {
  /** Without load; `apiKey` is the one the router holds. */
  readonly replica: RoutedReplica;
  load: ReplicaLoad | undefined;
  loadReportedAtMs: number | undefined;
  route: ProjectedRoute;
}

/** Size of `current` after removing `removed` and upserting `upserted` (ids). */
const sizeAfter = (
  current: ReadonlyMap<string, unknown>,
  removed: readonly string[],
  upserted: readonly string[],
): number => {
  let size = current.size;
  const gone = new Set<string>();
  for (const id of removed) if (current.has(id) && !gone.has(id)) gone.add(id);
  size -= gone.size;
  for (const id of upserted) if (!current.has(id) || gone.has(id)) size += 1;
  return size;
};

/**
 * Creates a {@link RoutingState}: the router's copy of the routing state, applied message by
 * message (see the contract above) and projected for the handler.
 *
 * - `routeTable.resolve` answers from a map of resolutions rebuilt only for the models a
 *   membership change touched (all of them on a snapshot or a router-count change); the
 *   `ReplicaRoute` objects are built at that time too, `authorization` included.
 * - A `LoadUpdate` writes each sample into its replica's existing route object (the picker
 *   reads `replica.load` at pick time): no new object, no version bump, no listener called.
 *   A sample older than the one held is dropped, so a late message never rolls load back.
 * - Staleness: each route object carries load only while it is younger than `loadStaleMs`.
 *   Rather than a clock read per replica per pick, the state keeps the earliest expiry among
 *   projected loads; `resolve()` reads the clock once and, when that expiry has passed, sweeps
 *   every route and clears expired load. Sweeps are spaced at least `loadStaleMs / 20` apart,
 *   so a load may outlive `loadStaleMs` by up to 5% (500 ms at the default), and a steady
 *   stream of fresh load costs one sweep per `loadStaleMs` or so. All of this runs on the
 *   control plane's clock (the router's `now` less {@link RoutingState.clockOffsetMs}), so a
 *   load keeps the timestamp it came with; {@link RoutingState.snapshot} saves it with the
 *   offset, and a restarted router ages it the same.
 * - `lastHeardAtMs` moves on every message applied or ignored (both came from a live control
 *   plane holding this epoch: the state is confirmed current), never on a resync or a
 *   refused (invalid) message.
 * @throws RouterError `LLMGW_ROUTER_INVALID_OPTIONS` for a `loadStaleMs` out of [1, 86 400 000].
 */
export function createRoutingState(options: RoutingStateOptions): RoutingState {
  const { hashSecret } = options;
  const loadStaleMs = checkRange(
    "loadStaleMs",
    options.loadStaleMs ?? DEFAULT_LOAD_STALE_MS,
    1,
    86_400_000,
  );
  const now = options.now ?? Date.now;
  const sweepSpacingMs = Math.max(1, Math.floor(loadStaleMs / 20));

  let epoch: string | undefined;
  let version = 0;
  let routers = 1;
  let lastHeardAtMs: number | undefined;
  /** `heardAtMs - sentAtMs` of the latest messages (≤ CLOCK_OFFSET_WINDOW), oldest first. */
  let offsetSamples: number[] = [];
  /** The least of `offsetSamples`: local clock minus the control plane's. */
  let offsetMs = 0;
  let models = new Map<string, RoutedModel>();
  let replicas = new Map<string, HeldReplica>();
  /** Served model name → ids of its replicas. */
  let byModel = new Map<string, Set<string>>();
  let keys = new Map<string, KeyGrant>();
  let tenants = new Map<string, TenantGrant>();
  let resolutions = new Map<string, RouteResolution>();
  let keysByHash = new Map<string, ApiKeyInfo>();
  let readyModels: string[] | undefined;
  let draining: readonly string[] | undefined;
  let tableVersion = 0;
  /** Earliest time a projected load may turn stale; Infinity when none is projected. */
  let nextSweepAtMs = Number.POSITIVE_INFINITY;
  const tableListeners = new Set<(version: number) => void>();
  const membershipListeners = new Set<() => void>();

  const share = (value: number): number => Math.max(1, Math.floor(value / routers));

  /**
   * Now on the control plane's clock. Load times stay as the control plane stamped them (they
   * order samples and are saved as they came); their expiry is compared with this, so a new
   * offset needs no pass over the replicas.
   */
  const cpNow = (): number => now() - offsetMs;

  /** Takes `heard - sentAt` into the offset; `fresh` (a snapshot) drops the older samples. */
  const learnOffset = (heard: number, sentAt: number, fresh: boolean): void => {
    if (fresh) offsetSamples = [];
    offsetSamples.push(heard - sentAt);
    if (offsetSamples.length > CLOCK_OFFSET_WINDOW) offsetSamples.shift();
    offsetMs = Math.min(...offsetSamples);
  };

  const project = (h: HeldReplica, t: number): ProjectedRoute => {
    const r = h.replica;
    let load: ReplicaLoad | undefined;
    if (h.load !== undefined && h.loadReportedAtMs !== undefined) {
      const expiresAtMs = h.loadReportedAtMs + loadStaleMs;
      if (expiresAtMs > t) {
        load = h.load;
        if (expiresAtMs < nextSweepAtMs) nextSweepAtMs = expiresAtMs;
      }
    }
    return {
      id: r.id,
      baseUrl: r.baseUrl,
      state: r.state,
      capacity: share(r.capacity),
      load,
      apiKey: r.apiKey,
      authorization: r.apiKey === undefined ? undefined : `Bearer ${r.apiKey}`,
      kvEventsUrl: r.kvEventsUrl,
      gpus: r.gpus,
    };
  };

  const sweep = (t: number): void => {
    let next = Number.POSITIVE_INFINITY;
    for (const h of replicas.values()) {
      if (h.route.load === undefined || h.loadReportedAtMs === undefined) continue;
      const expiresAtMs = h.loadReportedAtMs + loadStaleMs;
      if (expiresAtMs <= t) h.route.load = undefined;
      else if (expiresAtMs < next) next = expiresAtMs;
    }
    nextSweepAtMs = next === Number.POSITIVE_INFINITY ? next : Math.max(next, t + sweepSpacingMs);
  };

  /**
   * The replica as held: the message's fields, the key kept, the newer of the two loads. The
   * held load's time is moved by `shiftMs` first (onto another control plane's clock).
   */
  const hold = (r: RoutedReplica, previous: HeldReplica | undefined, shiftMs = 0): HeldReplica => {
    const apiKey = r.apiKey ?? previous?.replica.apiKey;
    const replica: RoutedReplica = {
      id: r.id,
      model: r.model,
      deployment: r.deployment,
      baseUrl: r.baseUrl,
      state: r.state,
      capacity: r.capacity,
      ...(apiKey === undefined ? {} : { apiKey }),
      ...(r.kvEventsUrl === undefined ? {} : { kvEventsUrl: r.kvEventsUrl }),
      ...(r.gpus === undefined ? {} : { gpus: r.gpus }),
    };
    let load = previous?.load;
    let loadReportedAtMs = previous?.loadReportedAtMs;
    if (loadReportedAtMs !== undefined && shiftMs !== 0) {
      // Kept within what a snapshot may carry, so snapshot() stays valid to reload.
      loadReportedAtMs = Math.min(
        ROUTING_LIMITS.maxEpochMs,
        Math.max(0, Math.round(loadReportedAtMs + shiftMs)),
      );
    }
    if (
      r.load !== undefined &&
      r.loadReportedAtMs !== undefined &&
      (loadReportedAtMs === undefined || r.loadReportedAtMs >= loadReportedAtMs)
    ) {
      load = r.load;
      loadReportedAtMs = r.loadReportedAtMs;
    }
    // `route` is set by the projection that follows every hold.
    return { replica, load, loadReportedAtMs, route: undefined as unknown as ProjectedRoute };
  };

  const index = (h: HeldReplica): void => {
    let ids = byModel.get(h.replica.model);
    if (ids === undefined) {
      ids = new Set();
      byModel.set(h.replica.model, ids);
    }
    ids.add(h.replica.id);
  };
  const unindex = (h: HeldReplica): void => {
    const ids = byModel.get(h.replica.model);
    if (ids === undefined) return;
    ids.delete(h.replica.id);
    if (ids.size === 0) byModel.delete(h.replica.model);
  };

  const resolveModel = (name: string): void => {
    const model = models.get(name);
    if (model === undefined) {
      resolutions.delete(name);
      return;
    }
    const ids = byModel.get(name);
    const routes: ProjectedRoute[] = [];
    if (ids !== undefined) {
      // By id: the same order on every router and after every rebuild.
      for (const id of [...ids].sort()) routes.push((replicas.get(id) as HeldReplica).route);
    }
    resolutions.set(name, {
      deployment: model.deployment,
      policy: model.policy,
      replicas: routes,
      loading: model.loading,
      ...(model.tokenizer === undefined ? {} : { tokenizer: model.tokenizer }),
      ...(model.enginePriority === true ? { enginePriority: true } : {}),
      ...(model.cacheIsolation === undefined ? {} : { cacheIsolation: model.cacheIsolation }),
    });
  };

  const tenantInfo = (t: TenantGrant): TenantInfo => {
    const info: { -readonly [K in keyof TenantInfo]: TenantInfo[K] } = {
      name: t.name,
      weight: t.weight,
    };
    if (t.rpm !== undefined) info.rpm = share(t.rpm);
    if (t.tpm !== undefined) info.tpm = share(t.tpm);
    if (t.maxConcurrency !== undefined) info.maxConcurrency = share(t.maxConcurrency);
    if (t.budgets !== undefined && t.budgets.length > 0) info.budgets = t.budgets;
    if (t.createdAtMs !== undefined) info.createdAtMs = t.createdAtMs;
    if (t.cacheIsolation !== undefined) info.cacheIsolation = t.cacheIsolation;
    return info;
  };
  const grantInfo = (g: KeyGrant, tenantInfos: Map<string, TenantInfo>): ApiKeyInfo => {
    const info: { -readonly [K in keyof ApiKeyInfo]: ApiKeyInfo[K] } = { id: g.id, name: g.name };
    if (g.models !== undefined && g.models.length > 0) info.models = g.models;
    if (g.rpm !== undefined) info.rpm = share(g.rpm);
    if (g.tpm !== undefined) info.tpm = share(g.tpm);
    if (g.maxConcurrency !== undefined) info.maxConcurrency = share(g.maxConcurrency);
    if (g.budgets !== undefined && g.budgets.length > 0) info.budgets = g.budgets;
    if (g.tenant !== undefined) {
      let tenant = tenantInfos.get(g.tenant);
      if (tenant === undefined) {
        // Not (yet) granted: the key is still its tenant's for fair share and usage.
        tenant = { name: g.tenant, weight: 1, ungranted: true };
        tenantInfos.set(g.tenant, tenant);
      }
      info.tenant = tenant;
    }
    const priority =
      g.priority ?? (g.tenant === undefined ? undefined : tenants.get(g.tenant)?.priority);
    if (priority !== undefined) info.priority = priority;
    return info;
  };
  const rebuildKeys = (): void => {
    const tenantInfos = new Map<string, TenantInfo>();
    for (const t of tenants.values()) tenantInfos.set(t.name, tenantInfo(t));
    const next = new Map<string, ApiKeyInfo>();
    for (const g of keys.values()) next.set(g.secretSha256, grantInfo(g, tenantInfos));
    keysByHash = next;
  };

  const rebuildAll = (): void => {
    const t = cpNow();
    nextSweepAtMs = Number.POSITIVE_INFINITY;
    for (const h of replicas.values()) h.route = project(h, t);
    resolutions = new Map();
    for (const name of models.keys()) resolveModel(name);
    rebuildKeys();
  };

  const changed = (): void => {
    tableVersion += 1;
    readyModels = undefined;
    draining = undefined;
    for (const listener of [...tableListeners]) listener(tableVersion);
    for (const listener of [...membershipListeners]) listener();
  };

  const applySnapshot = (m: RoutingSnapshot, heard: number): void => {
    const previousOffsetMs = offsetMs;
    learnOffset(heard, m.sentAtMs, true);
    // Another epoch may be another control plane, on another clock: the load held from the
    // old one is re-stamped on the new one's clock (the same instant on the router's) before
    // it is compared with the snapshot's. Within an epoch the clock is the same one.
    const shiftMs = epoch !== undefined && m.epoch !== epoch ? previousOffsetMs - offsetMs : 0;
    const nextReplicas = new Map<string, HeldReplica>();
    for (const r of m.replicas) nextReplicas.set(r.id, hold(r, replicas.get(r.id), shiftMs));
    models = new Map(m.models.map((model) => [model.name, model]));
    replicas = nextReplicas;
    byModel = new Map();
    for (const h of replicas.values()) index(h);
    keys = new Map(m.keys.map((k) => [k.id, k]));
    tenants = new Map((m.tenants ?? []).map((t) => [t.name, t]));
    epoch = m.epoch;
    version = m.version;
    routers = m.routers;
    rebuildAll();
  };

  const applyDelta = (m: RoutingDelta, heard: number): void => {
    const kind = "delta";
    const upsertedIds = m.upsertedReplicas.map((r) => r.id);
    if (
      sizeAfter(
        models,
        m.removedModels,
        m.upsertedModels.map((x) => x.name),
      ) > ROUTING_LIMITS.maxModels
    ) {
      fail(kind, "upsertedModels", `would hold more than ${ROUTING_LIMITS.maxModels} models`);
    }
    if (sizeAfter(replicas, m.removedReplicas, upsertedIds) > ROUTING_LIMITS.maxReplicas) {
      fail(kind, "upsertedReplicas", `would hold more than ${ROUTING_LIMITS.maxReplicas} replicas`);
    }
    if (
      sizeAfter(
        keys,
        m.removedKeys,
        m.upsertedKeys.map((k) => k.id),
      ) > ROUTING_LIMITS.maxKeys
    ) {
      fail(kind, "upsertedKeys", `would hold more than ${ROUTING_LIMITS.maxKeys} keys`);
    }
    const upsertedTenants = m.upsertedTenants ?? [];
    const removedTenants = m.removedTenants ?? [];
    if (
      sizeAfter(
        tenants,
        removedTenants,
        upsertedTenants.map((t) => t.name),
      ) > ROUTING_LIMITS.maxTenants
    ) {
      fail(kind, "upsertedTenants", `would hold more than ${ROUTING_LIMITS.maxTenants} tenants`);
    }
    learnOffset(heard, m.sentAtMs, false);
    const touched = new Set<string>();
    for (const name of m.removedModels) if (models.delete(name)) touched.add(name);
    for (const model of m.upsertedModels) {
      models.set(model.name, model);
      touched.add(model.name);
    }
    for (const id of m.removedReplicas) {
      const h = replicas.get(id);
      if (h === undefined) continue;
      replicas.delete(id);
      unindex(h);
      touched.add(h.replica.model);
    }
    const upserted: HeldReplica[] = [];
    for (const r of m.upsertedReplicas) {
      const previous = replicas.get(r.id);
      if (previous !== undefined) {
        unindex(previous);
        touched.add(previous.replica.model);
      }
      const h = hold(r, previous);
      replicas.set(r.id, h);
      index(h);
      touched.add(r.model);
      upserted.push(h);
    }
    for (const id of m.removedKeys) keys.delete(id);
    for (const k of m.upsertedKeys) keys.set(k.id, k);
    for (const name of removedTenants) tenants.delete(name);
    for (const t of upsertedTenants) tenants.set(t.name, t);
    epoch = m.epoch;
    version = m.version;
    if (m.routers !== undefined && m.routers !== routers) {
      // Every capacity and every key limit is a share of the router count.
      routers = m.routers;
      rebuildAll();
      return;
    }
    const t = cpNow();
    for (const h of upserted) h.route = project(h, t);
    for (const name of touched) resolveModel(name);
    if (
      m.removedKeys.length > 0 ||
      m.upsertedKeys.length > 0 ||
      removedTenants.length > 0 ||
      upsertedTenants.length > 0
    ) {
      rebuildKeys();
    }
  };

  const applyLoad = (m: LoadUpdate): void => {
    // A LoadUpdate carries no send time: it is aged with the offset the stream taught last.
    const t = cpNow();
    for (const s of m.samples) {
      const h = replicas.get(s.replicaId);
      if (h === undefined) continue;
      if (h.loadReportedAtMs !== undefined && s.reportedAtMs < h.loadReportedAtMs) continue;
      h.load = s.load;
      h.loadReportedAtMs = s.reportedAtMs;
      const expiresAtMs = s.reportedAtMs + loadStaleMs;
      if (expiresAtMs > t) {
        h.route.load = s.load;
        if (expiresAtMs < nextSweepAtMs) nextSweepAtMs = expiresAtMs;
      } else {
        h.route.load = undefined;
      }
    }
  };

  const routeTable: RouteTable = {
    resolve(modelName) {
      if (nextSweepAtMs !== Number.POSITIVE_INFINITY) {
        const t = cpNow();
        if (t >= nextSweepAtMs) sweep(t);
      }
      return resolutions.get(modelName);
    },
    models() {
      if (readyModels === undefined) {
        readyModels = [];
        for (const [name, r] of resolutions) {
          if (r.replicas.some((replica) => replica.state === "ready")) readyModels.push(name);
        }
        readyModels.sort();
      }
      return readyModels.slice();
    },
    get version() {
      return tableVersion;
    },
    subscribe(listener) {
      tableListeners.add(listener);
      return () => {
        tableListeners.delete(listener);
      };
    },
  };

  const apiKeys: ApiKeyStore = {
    verify: (secret) => (keysByHash.size === 0 ? undefined : keysByHash.get(hashSecret(secret))),
  };

  return {
    apply(message, heardAtMs) {
      validateRoutingMessage(message);
      const heard = heardAtMs ?? now();
      let result: ApplyResult;
      if (message.kind === "snapshot") {
        applySnapshot(message, heard);
        changed();
        result = "applied";
      } else if (epoch === undefined || message.epoch !== epoch) {
        return "resync";
      } else if (message.kind === "delta") {
        if (message.version <= version) {
          // Sent by the control plane of this epoch, even when old: its send time is good.
          learnOffset(heard, message.sentAtMs, false);
          result = "ignored";
        } else if (message.version !== version + 1) return "resync";
        else {
          applyDelta(message, heard);
          changed();
          result = "applied";
        }
      } else if (message.kind === "load") {
        applyLoad(message);
        result = "applied";
      } else {
        // A keepalive ahead of the version held means a delta went missing.
        if (message.version > version) return "resync";
        learnOffset(heard, message.sentAtMs, false);
        result = message.version < version ? "ignored" : "applied";
      }
      lastHeardAtMs = heard;
      return result;
    },
    routeTable,
    apiKeys,
    snapshot() {
      if (epoch === undefined) return undefined;
      const held: RoutedReplica[] = [];
      for (const h of replicas.values()) {
        held.push(
          h.load === undefined || h.loadReportedAtMs === undefined
            ? h.replica
            : { ...h.replica, load: h.load, loadReportedAtMs: h.loadReportedAtMs },
        );
      }
      return {
        kind: "snapshot",
        epoch,
        version,
        models: [...models.values()],
        replicas: held,
        keys: [...keys.values()],
        ...(tenants.size === 0 ? {} : { tenants: [...tenants.values()] }),
        routers,
        sentAtMs: Math.min(
          ROUTING_LIMITS.maxEpochMs,
          Math.max(0, Math.round((lastHeardAtMs ?? now()) - offsetMs)),
        ),
      };
    },
    get epoch() {
      return epoch;
    },
    get version() {
      return version;
    },
    get routers() {
      return routers;
    },
    get lastHeardAtMs() {
      return lastHeardAtMs;
    },
    get clockOffsetMs() {
      return offsetMs;
    },
    get drainingReplicaIds() {
      if (draining === undefined) {
        const ids: string[] = [];
        for (const [id, h] of replicas) if (h.replica.state === "draining") ids.push(id);
        draining = ids.sort();
      }
      return draining;
    },
    onMembershipChange(listener) {
      membershipListeners.add(listener);
      return () => {
        membershipListeners.delete(listener);
      };
    },
  };
}
