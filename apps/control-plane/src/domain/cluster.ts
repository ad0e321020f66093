import { randomBytes } from "node:crypto";
import {
  type Gpu,
  type GpuFault,
  type GpuReading,
  isNodeWideFault,
  type NodeInventory,
  type Port,
  type Problem,
} from "@llmgw/discovery";
import {
  type DeploymentSpec,
  parseDeploymentSpec,
  rolloutLimits,
  sameLaunch,
  schedulesByPriority,
} from "@llmgw/engines";
import type {
  EngineCacheIsolation,
  InFlightReport,
  KeyGrant,
  PromptTokenizerKind,
  ReplicaLoadSample,
  RoutedModel,
  RoutedReplica,
  ReplicaLoad as RouterReplicaLoad,
  TenantGrant,
} from "@llmgw/router";
import type { SchedulerNode } from "@llmgw/scheduler";
import {
  type ClearedFaults,
  faultCleared,
  faultCounts,
  faultIsActionable,
  type GpuHealthVerdict,
  gpuFaultKey,
} from "@llmgw/wire";
import { deploymentSpecFromJson, sameDeploymentSpec } from "../convert/deployment.js";
import { inventoryFromRecord, inventoryRecord } from "../convert/inventory-record.js";
import { ControlPlaneError } from "../errors.js";
import type {
  AvoidedNodeRecord,
  ClusterStore,
  DeploymentRecord,
  NodeRecord,
  PlacementRankRecord,
  PlacementRecord,
  ReplicaStatusRecord,
  RolloutRecord,
} from "../store/types.js";
import {
  AGENT_LIMITS,
  gpuIndexProblem,
  portsWithinRange,
  validateAdvertiseAddress,
  validateGpuIndices,
} from "./agent-limits.js";
import { ApiKeys } from "./api-keys.js";
import { DrainTracker } from "./drains.js";
import { EventLog, isStoreFailure } from "./event-log.js";
import {
  DEFAULT_MOVE_FAILED_AFTER_MS,
  type DueReplica,
  FailingReplicas,
  periodText,
} from "./failing-replicas.js";
import { type FaultTally, faultName, GpuFaults } from "./gpu-faults.js";
import { type NodeState, nextNodeState } from "./node-lifecycle.js";
import { planReconcile, type ReplicaCondition, type ScheduleFn } from "./reconcile.js";
import { copyLoad, knownLoad, ReplicaLoads } from "./replica-loads.js";
import { aggregateRankStates, joinHostPort, replicaStateFromRecord } from "./replica-state.js";
import { type ReportOrder, ReportSessions, type ReportVerdict } from "./report-order.js";
import { SchedulerNodes } from "./scheduler-nodes.js";
import { Tenants } from "./tenants.js";
import { generateSecret, hashSecret, secretsEqual } from "./tokens.js";
import type {
  Assignment,
  ClassCapacityInfo,
  ClusterSummary,
  DeploymentInfo,
  NodeInfo,
  PlacedRankInfo,
  RankStatus,
  ReplicaInfo,
  RetirementInfo,
} from "./views.js";

/** Time source; tests inject a manual one. */
export interface Clock {
  now(): number;
}

/** Options of {@link createCluster}. */
export interface ClusterOptions {
  readonly store: ClusterStore;
  readonly schedule: ScheduleFn;
  readonly clock: Clock;
  readonly heartbeatIntervalMs: number;
  /** Silence before a node is unreachable. */
  readonly unreachableAfterMs: number;
  /** Further silence before an unreachable node is lost and its replicas move. */
  readonly nodeLostAfterMs: number;
  readonly rendezvousPortMin: number;
  readonly rendezvousPortMax: number;
  /** One line per state transition and decision. Default: silent. */
  readonly log?: (line: string) => void;
  /**
   * Runs reconciles caused by agents (joins, GPU health, failed replicas) later, coalesced:
   * a thousand agents re-registering after a restart then cost one scheduler run, not a
   * thousand. The control plane passes `setImmediate`; default: reconcile at once.
   * Operator changes always reconcile before they return.
   */
  readonly defer?: (run: () => void) => void;
  /**
   * Told how long each reconcile took, ms (`llmgw_control_plane_reconcile_duration_seconds`):
   * the scheduler's input, its plan, the store writes and the desired sets. The first one, in
   * the constructor, plans every node with the scheduler's caches cold (its input per node
   * is built as the node loads).
   */
  readonly onReconciled?: (ms: number) => void;
  /**
   * Nodes this control plane holds at most; a Register that would add one more is refused
   * with `LLMGW_CONTROL_PLANE_NODE_LIMIT`. The join token is shared, and every Register
   * without a held id makes a new node, so without a cap its holders could grow the node
   * list (and the metrics scraped from it) without end. Default {@link DEFAULT_MAX_NODES}.
   */
  readonly maxNodes?: number;
  /**
   * Active API keys at most; one more is refused with `LLMGW_CONTROL_PLANE_INVALID_ARGUMENT`.
   * Every router holds every key, and refuses a routing state of more than
   * `ROUTING_LIMITS.maxKeys`. Default and most: `ROUTING_LIMITS.maxKeys`.
   */
  readonly maxApiKeys?: number;
  /** How long an operator's {@link Cluster.resetNode} stays open. Default {@link RESET_OPEN_MS}. */
  readonly resetOpenMs?: number;
  /** Events kept in memory while the store fails. Default `UNWRITTEN_EVENTS_KEPT` (event-log.ts). */
  readonly unwrittenEventsKept?: number;
  /**
   * A follower's copy: the stored state as the leader left it, for reads only. Nothing is
   * placed or cleaned up on construction, and nodes keep the liveness the leader recorded
   * ({@link NodeRecord.state}). Its mutations throw from the (read-only) store.
   */
  readonly readOnly?: boolean;
  /**
   * Decoded inventories another `Cluster` over the same database holds (its
   * {@link Cluster.inventories}): a stored inventory with the same bytes is taken from there
   * instead of decoded again. A follower's copy hands its own to the next copy and to the term
   * it starts when it wins the lease: decoding is most of loading a large cluster.
   */
  readonly inventories?: InventoryLookup;
  /**
   * Ids of the routers connected now, the in-process one included: a draining replica stops
   * once each of them reported nothing in flight on it ({@link Cluster.reportInFlight}).
   * Default: none (drains wait for the settle time and the engine's own load).
   */
  readonly connectedRouters?: () => readonly string[];
  /**
   * How long a replica may keep failing (a streak of failures, each within 10 minutes of its
   * last turn to ready) before it moves to another node that can take it, ms; 0 never moves one.
   * Until then its agent relaunches it where it is. Default
   * {@link DEFAULT_MOVE_FAILED_AFTER_MS}; see failing-replicas.ts.
   */
  readonly moveFailedAfterMs?: number;
  /**
   * How long an in-progress rollout may have new-revision replicas that cannot be placed,
   * with none of them turning serving meanwhile, before it is rolled back to the spec of the
   * revision it came from (as a failed new revision is), ms; 0 never rolls one back for it.
   * Default {@link DEFAULT_ROLLOUT_PROGRESS_DEADLINE_MS}.
   */
  readonly rolloutProgressDeadlineMs?: number;
}

/** Default of {@link ClusterOptions.rolloutProgressDeadlineMs}: 10 minutes. */
export const DEFAULT_ROLLOUT_PROGRESS_DEADLINE_MS = 10 * 60_000;

/** A node's decoded inventory when its stored bytes are `bytes`, else undefined. */
export type InventoryLookup = (nodeId: string, bytes: Uint8Array) => NodeInventory | undefined;

/** What an agent registers with. */
export interface RegisterInput {
  readonly inventory: NodeInventory;
  readonly previousNodeId?: string;
  /** The credential issued with `previousNodeId`; needed to re-register an id still held. */
  readonly previousNodeCredential?: string;
  readonly advertiseAddress: string;
  readonly replicas: readonly RankStatus[];
  /** API keys of the engines already running on the node; see {@link HeartbeatInput}. */
  readonly engineCredentials?: readonly EngineCredentialInput[];
}

/** The API key of one replica's serving engine, as its agent reports it. */
export interface EngineCredentialInput {
  readonly replicaId: string;
  readonly apiKey: string;
}

/** What a registration grants. */
export interface RegisterResult {
  readonly nodeId: string;
  /** Shown once; only its hash is kept. */
  readonly nodeCredential: string;
  readonly heartbeatIntervalMs: number;
  /** True when the node kept an earlier identity (and with it its placements). */
  readonly rejoined: boolean;
}

/** What a heartbeat reports. */
export interface HeartbeatInput {
  readonly gpus: readonly GpuReading[];
  readonly replicas: readonly RankStatus[];
  readonly problems: readonly Problem[];
  /**
   * API keys of the node's serving engines (each process draws its own). Kept in memory only
   * and handed to routers on the replica's route; never stored, logged or shown.
   */
  readonly engineCredentials?: readonly EngineCredentialInput[];
  /**
   * Live state and health of every RDMA port; empty or absent when the agent does not read
   * port health, and then the registered ports stand.
   */
  readonly ports?: readonly Port[];
  /** The desired-set generation the agent last applied (absent: unknown, e.g. old agents). */
  readonly generationSeen?: bigint;
  /**
   * The heartbeat's place in its agent's order; absent (older agents): taken as it arrives.
   * See {@link ReportSessions}.
   */
  readonly order?: ReportOrder;
}

/** The node's full desired set. */
export interface DesiredSet {
  readonly generation: bigint;
  readonly assignments: readonly Assignment[];
  readonly heartbeatIntervalMs: number;
}

export type { ApiKeyGrant } from "./api-keys.js";

/**
 * Engine load signals of a replica's rank 0, as plain numbers; undefined = not reported. The
 * router's own type: one engine-load vocabulary from agent to router.
 */
export type ReplicaLoad = RouterReplicaLoad;

/** One replica's load as an agent sends it in `ReportLoad`. */
export interface ReplicaLoadReportInput {
  readonly replicaId: string;
  readonly load: ReplicaLoad;
  /**
   * When the agent read it from the engine (epoch ms, the agent's clock). Checked by the RPC;
   * orders one node's reports of a replica, never ages load: the agent's clock may be off (see
   * {@link Cluster.reportLoad}).
   */
  readonly scrapedAtMs: number;
}

/** What routers route by: see {@link Cluster.routingMembership}. */
export interface RoutingMembership {
  readonly models: RoutedModel[];
  readonly replicas: RoutedReplica[];
  readonly keys: KeyGrant[];
  readonly tenants: TenantGrant[];
}

export { LOAD_REFRESH_MS } from "./replica-loads.js";

/** A replica the router may send requests to. */
export interface RoutableReplica {
  readonly replicaId: string;
  readonly deployment: string;
  readonly model: string;
  /** `host:port` of rank 0's API. */
  readonly endpoint: string;
  readonly state: "ready";
  readonly load: ReplicaLoad;
  readonly routingPolicy: DeploymentSpec["routingPolicy"];
  /** Concurrent requests the router may send (deployment's maxConcurrencyPerReplica, default 64). */
  readonly capacity: number;
  /** The key rank 0's engine demands (`Authorization: Bearer`); undefined when it reported none. */
  readonly apiKey?: string;
  /** Where its agent serves its KV-cache blocks (a `kvEvents` deployment); else undefined. */
  readonly kvEventsUrl?: string;
}

/**
 * How routers may tokenize a `kvEvents` deployment's requests for precise routing, per engine:
 * the simulator's own tokenizer in-process, vLLM's `POST /tokenize`. SGLang's events are
 * served, but routers match them only approximately until a tokenizer for it exists.
 */
const TOKENIZER_OF: Readonly<Partial<Record<DeploymentSpec["engine"], PromptTokenizerKind>>> = {
  sim: "sim",
  vllm: "vllm",
};

/**
 * How each engine keeps a request's prefix cache apart when routers isolate caches: vLLM and
 * SGLang key their cache with `cache_salt` (SGLang took it before sgl-project/sglang#23300,
 * April 2026, but ignored it), as the simulator does; llama.cpp can only skip reuse for the
 * request (`cache_prompt: false`).
 */
const CACHE_ISOLATION_OF: Readonly<Record<DeploymentSpec["engine"], EngineCacheIsolation>> = {
  sim: "salt",
  vllm: "salt",
  sglang: "salt",
  llamacpp: "no-reuse",
};

/** Default {@link ClusterOptions.maxNodes}: ten times the largest fleet we plan for. */
export const DEFAULT_MAX_NODES = 10_000;

/**
 * How long a {@link Cluster.resetNode} lets the join token alone take the node: long enough
 * to restart the agent, short enough that a forgotten reset does not leave the node open to
 * every holder of the join token.
 */
export const RESET_OPEN_MS = 15 * 60_000;

/** The agent's problem code for kernel-log faults (`ProblemCodes.gpuFault`). */
const GPU_FAULT_PROBLEM = "LLMGW_DISCOVERY_GPU_FAULT";

export { FAULT_CLEARS_KEPT, type FaultTally, faultName } from "./gpu-faults.js";

/** One RDMA port as the control plane last heard of it. */
export interface PortSnapshot {
  readonly device: string;
  readonly port: number;
  /** Fabric ids the port belongs to by registration (empty: an inactive port). */
  readonly fabrics: readonly string[];
  /** Undefined when the agent did not read its health. */
  readonly healthy?: boolean;
  /** The first problem's message, when unhealthy. */
  readonly problem?: string;
}

/** Default router capacity per replica when a deployment does not set one. */
export const DEFAULT_REPLICA_CAPACITY = 64;

interface LiveNode {
  record: NodeRecord;
  inventory: NodeInventory;
  state: NodeState;
  stateSinceMs: number;
  lastSeenMs: number;
  lastHeartbeatMs?: number;
  readings: Map<number, GpuReading>;
  /**
   * Bumped whenever a GPU verdict or a fabric's trouble on this node may have changed (a
   * verdict flipped in a heartbeat, a port's trouble changed, a fault cleared): the
   * scheduler's view of the node is rebuilt only then ({@link Cluster.#schedulerNodes}).
   * A new inventory object counts on its own.
   */
  healthVersion: number;
  problems: Problem[];
  /** Latest ports: the heartbeat's when it sent any, else the registered ones. */
  ports: PortSnapshot[];
  /** Latest status per `${replicaId}#${rank}`. */
  statuses: Map<string, RankStatus>;
  /**
   * Engines of removed placements still reported under their replica id, by status key: the
   * scheduler reuses the lowest free id, so a replacement on the same node shares the key with
   * the engine being stopped. Statuses of that engine (same pid and start time) are not the new
   * placement's and are ignored until it is gone.
   */
  retired: Map<string, { pid: number; startedAtMs: number | undefined; generation: bigint }>;
  generation: bigint;
  fingerprint: string;
  /** Built when first asked for (`#assignmentsOf`), from {@link assignmentsFrom}. */
  assignments: readonly Assignment[] | undefined;
  /** What {@link assignments} are (to be) built from (see `#refreshDesiredSets`). */
  assignmentsFrom?: {
    readonly fingerprint: string;
    readonly inventory: NodeInventory;
    readonly specs: readonly DeploymentSpec[];
    readonly entries: readonly { p: PlacementRecord; rank: PlacementRankRecord }[];
  };
  /**
   * The credential hash before the last re-registration, still accepted by Register (never
   * by Heartbeat) until the new credential is first used: an agent whose Register answer
   * was lost on the way must be able to try again instead of needing an operator.
   */
  priorCredentialHash?: string;
  /** When a refused takeover of this id was last recorded as an event (at most one a minute). */
  refusedEventAtMs?: number;
  /** The order of its heartbeats: which ones are older than what was taken. */
  reports: ReportSessions;
  /** When a heartbeat left untaken as older was last logged (at most one line a minute). */
  outOfOrderLoggedAtMs?: number;
}

interface LiveDeployment {
  record: DeploymentRecord;
  spec: DeploymentSpec;
}

type ChangeListener = () => void;

const statusKey = (replicaId: string, rank: number) => `${replicaId}#${rank}`;

/** What the store keeps of a rank's status (see {@link ReplicaStatusRecord}). */
function statusRecord(nodeId: string, s: RankStatus): ReplicaStatusRecord {
  return {
    replicaId: s.replicaId,
    rank: s.rank,
    nodeId,
    state: s.state,
    ...(s.apiPort === undefined ? {} : { apiPort: s.apiPort }),
    stateSinceMs: s.stateSinceMs,
    specHash: s.specHash,
    revision: s.revision,
    ...(s.pid === undefined ? {} : { pid: s.pid }),
    ...(s.startedAtMs === undefined ? {} : { startedAtMs: s.startedAtMs }),
  };
}

/** True when `next` differs from `before` in a field the store keeps. */
function keptFieldsChanged(before: RankStatus | undefined, next: RankStatus): boolean {
  return (
    before === undefined ||
    before.state !== next.state ||
    before.apiPort !== next.apiPort ||
    before.stateSinceMs !== next.stateSinceMs ||
    before.specHash !== next.specHash ||
    before.revision !== next.revision ||
    before.pid !== next.pid ||
    before.startedAtMs !== next.startedAtMs
  );
}

const NO_LINES: readonly string[] = Object.freeze([]);

/** A rank 0 that reported no load: unknown, not zero. */
const UNKNOWN_LOAD: ReplicaLoad = Object.freeze({});

/** A stored status as the agent last reported it (without load, logs or message). */
function statusFromRecord(r: ReplicaStatusRecord): RankStatus | undefined {
  const state = replicaStateFromRecord(r.state);
  if (state === undefined) return undefined;
  return {
    replicaId: r.replicaId,
    rank: r.rank,
    state,
    ...(r.apiPort === undefined ? {} : { apiPort: r.apiPort }),
    stateSinceMs: r.stateSinceMs,
    specHash: r.specHash,
    revision: r.revision,
    ...(r.pid === undefined ? {} : { pid: r.pid }),
    ...(r.startedAtMs === undefined ? {} : { startedAtMs: r.startedAtMs }),
    restarts: 0,
    logTail: NO_LINES,
    message: "",
    adopted: false,
  };
}

/** A node as first known: nothing reported yet, generation seeded from the clock. */
function newLiveNode(
  record: NodeRecord,
  inventory: NodeInventory,
  state: NodeState,
  now: number,
): LiveNode {
  return {
    record,
    inventory,
    state,
    stateSinceMs: record.state === state ? (record.stateSinceMs ?? now) : now,
    lastSeenMs: now,
    readings: new Map(),
    healthVersion: 0,
    problems: [],
    ports: registeredPorts(inventory),
    statuses: new Map(),
    retired: new Map(),
    reports: new ReportSessions(),
    generation: BigInt(now),
    fingerprint: "",
    assignments: [],
  };
}

const portKey = (device: string, port: number) => `${device}/${port}`;

/** True when `p`'s rank `rank` is placed on node `nodeId`. */
function placedOn(p: PlacementRecord, rank: number, nodeId: string): boolean {
  return p.ranks.some((r) => r.rank === rank && r.nodeId === nodeId);
}

/**
 * The inventory's GPU with `index`: for every reading of every heartbeat, so the position
 * discovery lists it at is tried first.
 */
function inventoryGpu(inventory: NodeInventory, index: number): Gpu | undefined {
  const at = inventory.gpus[index];
  if (at?.index === index) return at;
  for (const g of inventory.gpus) if (g.index === index) return g;
  return undefined;
}

/** Fabric ids of each registered port, by `device/port`. */
function portFabrics(inventory: NodeInventory): Map<string, string[]> {
  const byPort = new Map<string, string[]>();
  for (const f of inventory.fabrics) {
    for (const p of f.ports) {
      const key = portKey(p.device, p.port);
      byPort.set(key, [...(byPort.get(key) ?? []), f.id]);
    }
  }
  return byPort;
}

function portSnapshot(p: Port, fabrics: ReadonlyMap<string, string[]>): PortSnapshot {
  const on = fabrics.get(portKey(p.device, p.port)) ?? [];
  // A fabric port (ACTIVE at registration) that is not ACTIVE now carries no NCCL traffic,
  // however calm its counters are: a port that went down and stays down never flaps.
  const down = on.length > 0 && p.state !== "" && p.state !== "ACTIVE";
  const healthy = down ? false : p.health?.healthy;
  const problem = down
    ? `port is ${p.state}${p.physState ? `/${p.physState}` : ""} (ACTIVE when the node registered)`
    : healthy === false
      ? (p.health?.problems[0]?.message ?? "unhealthy")
      : undefined;
  return {
    device: p.device,
    port: p.port,
    fabrics: on,
    ...(healthy === undefined ? {} : { healthy }),
    ...(problem === undefined ? {} : { problem }),
  };
}

/** The ports registration reported (fabric ports, then inactive ones), with their health. */
function registeredPorts(inventory: NodeInventory): PortSnapshot[] {
  const fabrics = portFabrics(inventory);
  const seen = new Set<string>();
  const out: PortSnapshot[] = [];
  for (const p of [...inventory.fabrics.flatMap((f) => f.ports), ...inventory.inactivePorts]) {
    const key = portKey(p.device, p.port);
    if (seen.has(key)) continue;
    seen.add(key);
    out.push(portSnapshot(p, fabrics));
  }
  return out;
}

/**
 * Fabrics a node may not be used on for multi-node replicas, each with why: a port on that
 * fabric reports unhealthy (flapping, error rates, a saturated counter).
 */
function troubledFabrics(ports: readonly PortSnapshot[]): Map<string, string> {
  const out = new Map<string, string>();
  for (const p of ports) {
    if (p.healthy !== false) continue;
    for (const f of p.fabrics) {
      if (!out.has(f))
        out.set(f, `port ${p.device}/${p.port} on fabric ${f} is unhealthy: ${p.problem}`);
    }
  }
  return out;
}

/** Replica ids in the order operators read them: `chat-2` before `chat-10`. */
const REPLICA_ID_ORDER = new Intl.Collator("en", { numeric: true }).compare;

/** The nodes of `ids` that `nodes` holds. */
function* nodesIn<T>(nodes: ReadonlyMap<string, T>, ids: Iterable<string>): Iterable<T> {
  for (const id of ids) {
    const node = nodes.get(id);
    if (node !== undefined) yield node;
  }
}

function nodeIdFor(hostname: string): string {
  const base =
    hostname
      .toLowerCase()
      .replace(/[^a-z0-9-]+/g, "-")
      .replace(/^-+|-+$/g, "")
      .slice(0, 40) || "node";
  return `${base}-${randomBytes(3).toString("hex")}`;
}

/**
 * The control plane's state and every rule that changes it: node registration, heartbeats
 * and lifecycle, deployments, placements (via the reconciler), API keys and events. Durable
 * parts go through the {@link ClusterStore}; live readings stay in memory. Synchronous: each
 * mutation reconciles before it returns, so callers (RPC handlers, tests) see the result.
 */
export class Cluster {
  readonly #o: ClusterOptions;
  readonly #nodes = new Map<string, LiveNode>();
  readonly #deployments = new Map<string, LiveDeployment>();
  readonly #placements = new Map<string, PlacementRecord>();
  /** Deployment name → revision → spec, for every revision some replica runs (and the current). */
  readonly #revisions = new Map<string, Map<number, DeploymentSpec>>();
  /** Ids of placements leaving (waiting or draining). */
  readonly #retiring = new Set<string>();
  /**
   * Deployments with lifecycle work under way (leaving replicas, or replicas of an older
   * revision): a replica state change there reconciles, since it may let a step go on.
   */
  #active = new Set<string>();
  readonly #drains: DrainTracker;
  /** Replicas that keep failing, and the nodes their deployments avoid for it. */
  readonly #failing: FailingReplicas;
  /** An avoidance the store refused: every one is written again at the next tick. */
  #avoidedUnsaved = false;
  /**
   * Set when a report changed the state of a replica of an {@link #active} deployment: the
   * heartbeat reconciles (deferred) once it has taken the whole report.
   */
  #lifecycleStep: string | undefined;
  readonly #unschedulable = new Map<
    string,
    { missing: number; reasons: readonly { code: string; message: string }[] }
  >();
  /**
   * In-progress rollouts whose new revision has had replicas that cannot be placed since
   * `sinceMs`, with `serving` of its replicas serving then (one more restarts the count): by
   * deployment name. `freeing` while an older replica drains: no count then (see
   * {@link #trackStalled}). Memory only: a new leader counts afresh from its first reconcile,
   * so a stalled rollout waits at most one more deadline.
   */
  readonly #stalled = new Map<
    string,
    { revision: number; sinceMs: number; serving: number; freeing: boolean }
  >();
  /** What happened, in the store's bounded log. */
  readonly events: EventLog;
  /** The API keys routers check. */
  readonly apiKeys: ApiKeys;
  /** The tenants that own keys, whose limits routers apply to all their keys together. */
  readonly tenants: Tenants;
  /** True when the last placement write failed: the store's placements are stale. */
  #placementsUnsaved = false;
  /** True when a replica status write failed: the store's statuses are stale until a tick. */
  #statusesUnsaved = false;
  /**
   * Nodes whose desired set may have changed since it was last built (placements added,
   * removed or revised on them), or all of them (a spec, an inventory or an address changed):
   * `#refreshDesiredSets` rebuilds only these.
   */
  #desiredDirty = new Set<string>();
  #desiredAllDirty = true;
  /** True when a node state write failed: written again at a tick. */
  #nodeStatesUnsaved = false;
  readonly #changeListeners = new Set<ChangeListener>();
  /** {@link onDesiredChange} listeners by node id. */
  readonly #desiredListeners = new Map<string, Set<() => void>>();
  #version = 0;
  #reconcilePending: string[] | undefined;
  /** Ids of revoked nodes, so their heartbeats get "revoked" rather than "unknown". */
  readonly #revokedIds = new Set<string>();
  readonly #routable = new Map<string, RoutableReplica[]>();
  /** Replica id → its serving engine's API key. Memory only: agents report them again. */
  readonly #engineKeys = new Map<string, string>();
  /**
   * Node id → the placed replicas whose rank 0 (the serving rank) it runs: whose engine keys
   * its heartbeats report (a heartbeat touches these, not every key of the cluster).
   */
  readonly #servedBy = new Map<string, Set<string>>();
  /** The {@link #routingMarks} that {@link #routable} and {@link #membership} were built at. */
  #routableVersion = -1;
  /**
   * Counts every change to what routers route by, at once (caches compare it); the public
   * {@link routingVersion} follows at the end of the operation, once per operation.
   */
  #routingMarks = 0;
  /**
   * Counts changes to the API key grants alone (created, revoked): they rebuild the keys of
   * the membership, never the replicas ({@link #membershipKeys}).
   */
  #keyMarks = 0;
  #routingVersion = 0;
  #routingDirty = false;
  readonly #routingListeners = new Set<ChangeListener>();
  /** Each placed replica's last engine load (rank 0's reports). */
  readonly #loads: ReplicaLoads;
  /** Models and replicas of the membership, without load, built at {@link #routableVersion}. */
  #membership: Omit<RoutingMembership, "keys" | "tenants"> | undefined;
  /** The key grants of the membership and the {@link #keyMarks} they were built at. */
  #membershipKeys: { readonly marks: number; readonly keys: readonly KeyGrant[] } | undefined;
  /** The tenant grants of the membership and the {@link #keyMarks} they were built at. */
  #membershipTenants:
    | { readonly marks: number; readonly tenants: readonly TenantGrant[] }
    | undefined;
  /** Cleared, announced and tallied GPU faults. */
  readonly #faults: GpuFaults;
  /**
   * Specs this release refuses, with why (the engines error's message): stored by an older
   * release whose validation let them through, read back with `deploymentSpecFromJson`. By
   * spec object, so that a current spec and the kept revision it is share the mark, and a
   * spec applied since (a new object, validated) has none.
   *
   * A deployment whose current spec is here is invalid: its placed replicas run on untouched
   * (no drain, no restart, no rolling update away from them, no move of a failing one), only a
   * loss removes one, and nothing is placed for it (no scale-up, no replacement), so no node is
   * handed this spec that does not run it already. Its status says why and what to do; applying
   * a corrected spec is an ordinary update (a rolling one) and clears the mark; deleting it works
   * as ever. A kept revision here is never the target of a rollback ({@link #rollBack}).
   */
  readonly #refused = new WeakMap<DeploymentSpec, string>();

  constructor(options: ClusterOptions) {
    this.#o = options;
    const now = options.clock.now();
    const store = options.store;
    this.#loads = new ReplicaLoads(options.log);
    this.#drains = new DrainTracker({
      now: () => options.clock.now(),
      connectedRouters: options.connectedRouters ?? (() => []),
    });
    for (const record of store.listDeployments()) {
      const { spec, refused } = deploymentSpecFromJson(
        record.specJson,
        `the stored deployment ${JSON.stringify(record.name)} in ${store.location}`,
      );
      if (refused !== undefined) this.#refused.set(spec, refused);
      this.#deployments.set(record.name, { record, spec });
      this.#keepRevision(spec);
    }
    this.#failing = this.#loadFailingReplicas(options.moveFailedAfterMs);
    for (const r of store.listDeploymentRevisions()) {
      if (this.#revisions.get(r.name)?.has(r.revision)) continue;
      const { spec, refused } = deploymentSpecFromJson(
        r.specJson,
        `revision ${r.revision} of the stored deployment ${JSON.stringify(r.name)} in ${store.location}`,
      );
      if (refused !== undefined) this.#refused.set(spec, refused);
      this.#keepRevision(spec);
    }
    for (const p of store.listPlacements()) {
      this.#placements.set(p.replicaId, p);
      this.#indexServing(p, true);
      if (p.retirement !== undefined) this.#retiring.add(p.replicaId);
    }
    this.#faults = new GpuFaults(store, options.log);
    this.events = new EventLog({
      store,
      clock: options.clock,
      log: options.log,
      unwrittenKept: options.unwrittenEventsKept,
    });
    this.apiKeys = new ApiKeys({
      store,
      clock: options.clock,
      events: this.events,
      log: options.log,
      maxApiKeys: options.maxApiKeys,
      onChange: () => {
        this.#routingChange("keys");
        this.#touch();
      },
      tenantExists: (name) => this.tenants.get(name) !== undefined,
    });
    this.tenants = new Tenants({
      store,
      clock: options.clock,
      events: this.events,
      activeKeys: (name) => this.apiKeys.activeKeysOf(name),
      // Tenants change with keys' cadence and never touch replicas: the same cheap path.
      onChange: () => {
        this.#routingChange("keys");
        this.#touch();
      },
    });
    for (const record of store.listNodes()) {
      if (record.revoked) {
        this.#revokedIds.add(record.id);
        continue;
      }
      let inventory: NodeInventory;
      try {
        inventory =
          options.inventories?.(record.id, record.inventory) ??
          inventoryFromRecord(record.inventory);
      } catch (cause) {
        throw new ControlPlaneError(
          "LLMGW_CONTROL_PLANE_STORE_CORRUPT",
          `the stored inventory of node ${record.id} in ${store.location} cannot be decoded`,
          { cause },
        );
      }
      // Not heard from since this control plane started: unreachable until its agent
      // heartbeats (its replicas stay placed), lost if it never does. A follower's copy
      // shows what the leader recorded.
      const state = options.readOnly ? (record.state ?? "unreachable") : "unreachable";
      const live = newLiveNode(record, inventory, state, now);
      this.#nodes.set(record.id, live);
      // The scheduler's view of the node, while its inventory was just decoded and is still
      // in the CPU's caches: read again for the first reconcile, scattered over the heap, the
      // same work took twice as long.
      if (!options.readOnly) this.#schedulerNodeOf(live);
    }
    this.#restoreStatuses();
    if (!options.readOnly) {
      this.#announceRefused();
      this.#reconcile("control plane started", { quietIfUnchanged: true });
    }
  }

  /**
   * One event per deployment with a spec this release refuses ({@link #refused}), as this
   * control plane starts leading: its current spec (the deployment is invalid), or a kept
   * revision that some replica still runs (it is not rolled back to).
   */
  #announceRefused(): void {
    for (const [name, byRevision] of this.#revisions) {
      const current = this.#deployments.get(name)?.spec;
      const why = current === undefined ? undefined : this.#refused.get(current);
      if (why !== undefined) {
        this.events.record("deployment.invalid", name, this.#invalidMessage(name, why), "error");
        this.#o.log?.(`deployment ${name} is invalid under this release: ${why}`);
        continue;
      }
      const kept = [...byRevision.values()]
        .filter((spec) => spec !== current && this.#refused.has(spec))
        .sort((a, b) => a.revision - b.revision);
      const first = kept[0];
      if (first === undefined) continue;
      this.events.record(
        "deployment.invalid",
        name,
        `revision${kept.length > 1 ? "s" : ""} ${kept.map((k) => k.revision).join(", ")} of ${name}, which replicas still run, ${kept.length > 1 ? "are" : "is"} refused by this release (${this.#refused.get(first)}): ${kept.length > 1 ? "they run" : "it runs"} until replaced, and no rollback goes back to ${kept.length > 1 ? "them" : "it"}`,
        "warning",
      );
    }
  }

  /** What an invalid deployment's status and event say: why, what happens, what to do. */
  #invalidMessage(name: string, why: string): string {
    return `the stored spec of ${name} (from an older release) is refused by this release: ${why}; its running replicas are left as they are, but none is placed, replaced, moved or updated for it until a corrected spec is applied ('llmgw deploy -f' with the flag or variable named above removed or changed), which updates it as any change does; 'llmgw undeploy ${name}' removes it`;
  }

  /**
   * The leader's {@link FailingReplicas} over the stored avoided nodes (those of deployments
   * that are gone deleted); a follower's reads them and writes nothing. Like placements, an
   * avoidance the store refuses is logged, kept in memory, and every avoidance is written
   * again at the next {@link tick} that finds the store writable.
   */
  #loadFailingReplicas(moveAfterMs: number | undefined): FailingReplicas {
    const { store, readOnly, log } = this.#o;
    const stored = store.listAvoidedNodes();
    const kept = stored.filter((r) => this.#deployments.has(r.deployment));
    const write = (what: string, fn: () => void) => {
      if (this.#avoidedUnsaved) return;
      try {
        fn();
      } catch (error) {
        if (!isStoreFailure(error)) throw error;
        this.#avoidedUnsaved = true;
        log?.(
          `${what} kept in memory only, written again every tick until the store takes writes: ${(error as Error).message}`,
        );
      }
    };
    const sink = readOnly
      ? undefined
      : {
          put: (r: AvoidedNodeRecord) =>
            write(`${r.deployment}'s avoidance of ${r.nodeId}`, () => store.putAvoidedNode(r)),
          delete: (deployment: string, nodeId: string) =>
            write(`the end of ${deployment}'s avoidance of ${nodeId}`, () =>
              store.deleteAvoidedNode(deployment, nodeId),
            ),
        };
    for (const r of stored) if (!kept.includes(r)) sink?.delete(r.deployment, r.nodeId);
    return new FailingReplicas(moveAfterMs ?? DEFAULT_MOVE_FAILED_AFTER_MS, kept, sink);
  }

  /** Writes every avoidance again, and deletes the stored ones memory no longer has. */
  #resaveAvoided(): void {
    const { store, log } = this.#o;
    const records = this.#failing.records();
    const key = (r: { deployment: string; nodeId: string }) => `${r.deployment}\u0000${r.nodeId}`;
    const kept = new Set(records.map(key));
    try {
      store.transaction(() => {
        for (const r of store.listAvoidedNodes())
          if (!kept.has(key(r))) store.deleteAvoidedNode(r.deployment, r.nodeId);
        for (const r of records) store.putAvoidedNode(r);
      });
    } catch (error) {
      if (!isStoreFailure(error)) throw error;
      return;
    }
    this.#avoidedUnsaved = false;
    log?.(`avoided nodes written again (${records.length})`);
  }

  /**
   * The decoded inventory of each node, by its stored bytes (see
   * {@link ClusterOptions.inventories}). Inventories are never changed in place (a
   * registration replaces one), so another `Cluster` may share them.
   */
  inventories(): InventoryLookup {
    return (nodeId, bytes) => {
      const node = this.#nodes.get(nodeId);
      return node !== undefined && Buffer.compare(node.record.inventory, bytes) === 0
        ? node.inventory
        : undefined;
    };
  }

  /**
   * Gives each node the statuses it last reported for its placed ranks, so that routers keep
   * the replicas that were ready before any agent has reported again. They hold until the
   * node reports otherwise or is declared lost. Stored statuses of placements or nodes that
   * are gone are deleted.
   */
  #restoreStatuses(): void {
    const now = this.#o.clock.now();
    const orphans: ReplicaStatusRecord[] = [];
    let restored = 0;
    for (const r of this.#o.store.listReplicaStatuses()) {
      const node = this.#nodes.get(r.nodeId);
      const status = statusFromRecord(r);
      if (!node || !status || !this.#placedHere(r.replicaId, r.rank, node)) {
        orphans.push(r);
        continue;
      }
      node.statuses.set(statusKey(r.replicaId, r.rank), status);
      if (status.state === "failed") this.#failing.failed(r.replicaId, r.nodeId, now);
      restored++;
    }
    if (this.#o.readOnly) return;
    if (restored > 0)
      this.#o.log?.(
        `restored the last reported status of ${restored} replica rank${restored === 1 ? "" : "s"}; each holds until its node reports again or is lost`,
      );
    this.#saveStatuses(
      [],
      orphans.map((r) => [r.replicaId, r.rank]),
    );
  }

  /**
   * Writes status changes. Like placements, a failing store (a full disk) does not fail the
   * heartbeat that brought them: the failure is logged and every status is written again at
   * the next {@link tick} that finds the store writable.
   */
  #saveStatuses(
    put: readonly ReplicaStatusRecord[],
    remove: readonly (readonly [string, number | undefined])[],
  ): void {
    if (this.#statusesUnsaved || put.length + remove.length === 0) return;
    try {
      this.#o.store.transaction(() => {
        for (const [replicaId, rank] of remove)
          this.#o.store.deleteReplicaStatuses(replicaId, rank);
        for (const r of put) this.#o.store.putReplicaStatus(r);
      });
    } catch (error) {
      if (!isStoreFailure(error)) throw error;
      this.#statusesUnsaved = true;
      this.#o.log?.(
        `replica statuses kept in memory only, written again at a tick once the store takes writes: ${(error as Error).message}`,
      );
    }
  }

  /** Makes the stored statuses equal to those in memory; true when that worked. */
  #resaveStatuses(): boolean {
    const want = new Map<string, ReplicaStatusRecord>();
    for (const node of this.#nodes.values()) {
      for (const [key, s] of node.statuses) {
        if (this.#placedHere(s.replicaId, s.rank, node))
          want.set(key, statusRecord(node.record.id, s));
      }
    }
    try {
      this.#o.store.transaction(() => {
        for (const r of this.#o.store.listReplicaStatuses()) {
          const kept = want.get(statusKey(r.replicaId, r.rank));
          if (kept?.nodeId !== r.nodeId) this.#o.store.deleteReplicaStatuses(r.replicaId, r.rank);
        }
        for (const r of want.values()) this.#o.store.putReplicaStatus(r);
      });
    } catch (error) {
      if (!isStoreFailure(error)) throw error;
      return false;
    }
    this.#statusesUnsaved = false;
    this.#o.log?.(`replica statuses written to the state store again (${want.size})`);
    return true;
  }

  // ---------------------------------------------------------------- agents

  /**
   * Registers a node (the caller checked the join token). A `previousNodeId` of a known,
   * non-revoked node keeps that identity and its placements, so an agent restart never
   * restarts engines; the credential is rotated either way. Keeping an identity needs its
   * current node credential (or an operator's {@link resetNode}): the join token is shared
   * by every agent, and node ids are public, so without the credential any holder of the
   * token could take over a live node's address and the prompts routed to it. Such a call
   * throws `LLMGW_CONTROL_PLANE_NODE_ID_TAKEN` and changes nothing. An unknown or revoked
   * `previousNodeId` gets a fresh id. An advertise address that is not an IP literal or a
   * DNS host name throws `LLMGW_CONTROL_PLANE_INVALID_ARGUMENT`.
   */
  register(input: RegisterInput): RegisterResult {
    const now = this.#o.clock.now();
    const advertiseAddress =
      input.advertiseAddress || input.inventory.addresses[0] || input.inventory.hostname;
    validateAdvertiseAddress(
      advertiseAddress,
      input.advertiseAddress
        ? "RegisterRequest.advertise_address"
        : input.inventory.addresses[0]
          ? "RegisterRequest.inventory.addresses[0] (no advertise_address given)"
          : "RegisterRequest.inventory.hostname (no advertise_address or addresses given)",
    );
    validateGpuIndices(input.inventory.gpus, "RegisterRequest.inventory.gpus");
    const previous = input.previousNodeId ? this.#nodes.get(input.previousNodeId) : undefined;
    const byReset = previous !== undefined && now < (previous.record.resetUntilMs ?? 0);
    const matched =
      previous && !byReset ? this.#requirePreviousCredential(previous, input, now) : undefined;
    if (!previous) this.#requireRoomForNode();
    const credential = generateSecret("llmgw-node-");
    const id = previous?.record.id ?? nodeIdFor(input.inventory.hostname);
    const record: NodeRecord = {
      id,
      hostname: input.inventory.hostname,
      credentialHash: hashSecret(credential),
      inventory: inventoryRecord(input.inventory),
      advertiseAddress,
      cordoned: previous?.record.cordoned ?? false,
      draining: previous?.record.draining ?? false,
      // Whose drain it is: an agent's own leave ends when an agent says it is back.
      ...(previous?.record.drainedBy === undefined ? {} : { drainedBy: previous.record.drainedBy }),
      revoked: false,
      registeredAtMs: previous?.record.registeredAtMs ?? now,
      state: "ready",
      stateSinceMs: previous?.state === "ready" ? previous.stateSinceMs : now,
    };
    this.#o.store.putNode(record);
    // Endpoints are the advertise address and the engine's port.
    if (previous && previous.record.advertiseAddress !== advertiseAddress) this.#routingChange();
    const live = previous ?? newLiveNode(record, input.inventory, "ready", now);
    // After a reset nothing older than this registration may register again. When the prior
    // credential matched, the agent never got the current one: it keeps the prior, so the
    // prior stays accepted however many answers in a row are lost.
    live.priorCredentialHash = byReset
      ? undefined
      : matched === "prior"
        ? previous?.priorCredentialHash
        : previous?.record.credentialHash;
    live.record = record;
    live.inventory = input.inventory;
    live.ports = registeredPorts(input.inventory);
    // Readings of GPUs the node no longer has (or whose index now names another GPU) go.
    for (const [index, reading] of live.readings) {
      const gpu = inventoryGpu(input.inventory, index);
      if (
        gpu === undefined ||
        (reading.uuid !== "" && gpu.uuid !== "" && reading.uuid !== gpu.uuid)
      )
        live.readings.delete(index);
    }
    live.lastSeenMs = now;
    this.#nodes.set(id, live);
    // Its inventory (GPU uuids) and address (rank 0 of gangs with other nodes) may be new.
    this.#desiredAllDirty = true;
    // A watch opened with the credential this one replaces must end.
    if (previous) this.#desiredChanged(id);
    this.#ingestStatuses(live, input.replicas);
    this.#ingestEngineKeys(live, input.engineCredentials ?? []);
    this.#ingestLoads(live, now);
    for (const gpu of input.inventory.gpus) {
      if (!live.readings.has(gpu.index) && gpu.faults !== undefined)
        this.#announceFaults(live, gpu, gpu.faults);
    }
    this.#setNodeState(live, "ready", now);
    const gpus = input.inventory.gpus.length;
    this.events.record(
      previous ? "node.rejoined" : "node.joined",
      id,
      `${input.inventory.hostname} ${previous ? (byReset ? "re-registered after a reset" : "re-registered") : "joined"} with ${gpus} GPU${gpus === 1 ? "" : "s"}${
        input.inventory.simulated ? " (simulated)" : ""
      } at ${advertiseAddress}`,
      "info",
    );
    this.#requestReconcile(`node ${id} joined`);
    this.#flushRouting();
    return {
      nodeId: id,
      nodeCredential: credential,
      heartbeatIntervalMs: this.#o.heartbeatIntervalMs,
      rejoined: !!previous,
    };
  }

  /** Throws `LLMGW_CONTROL_PLANE_NODE_LIMIT` when the cluster holds its most nodes. */
  #requireRoomForNode(): void {
    const max = this.#o.maxNodes ?? DEFAULT_MAX_NODES;
    if (this.#nodes.size < max) return;
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_NODE_LIMIT",
      `this control plane holds its most nodes (${max}); revoke nodes that are gone (llmgw nodes revoke NODE) or raise --max-nodes`,
    );
  }

  /**
   * Throws `LLMGW_CONTROL_PLANE_NODE_ID_TAKEN` unless `input` proves `node`'s credential;
   * says which of the node's credentials it proved.
   */
  #requirePreviousCredential(
    node: LiveNode,
    input: RegisterInput,
    now: number,
  ): "current" | "prior" {
    const presented = input.previousNodeCredential;
    if (presented) {
      const hash = hashSecret(presented);
      // Both compared, always: which one matched must not show in the timing.
      const current = secretsEqual(hash, node.record.credentialHash);
      const prior = secretsEqual(hash, node.priorCredentialHash ?? "");
      if (current) return "current";
      if (prior) return "prior";
    }
    const id = node.record.id;
    // An event, not just a log line, so operators see it; at most one a minute per node, so
    // that a caller repeating the attempt cannot push real events out of the bounded log.
    if (node.refusedEventAtMs === undefined || now - node.refusedEventAtMs >= 60_000) {
      node.refusedEventAtMs = now;
      this.events.record(
        "node.takeover_refused",
        id,
        `a Register from ${input.inventory.hostname} (advertising ${input.advertiseAddress || "no address"}) named node ${id} ${
          presented ? "with a wrong node credential" : "without its node credential"
        }; the node is unchanged`,
        "warning",
      );
    }
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_NODE_ID_TAKEN",
      `node ${id} is registered; re-joining it needs its node credential, or an operator's \`llmgw nodes reset ${id}\``,
    );
  }

  /**
   * Checks a node credential. Unknown and revoked nodes are refused with codes that tell the
   * agent to register again with the join token.
   */
  authenticateNode(nodeId: string, credential: string): string {
    const node = this.#nodes.get(nodeId);
    if (!node) {
      const revoked = this.#revokedIds.has(nodeId);
      throw new ControlPlaneError(
        revoked ? "LLMGW_CONTROL_PLANE_NODE_REVOKED" : "LLMGW_CONTROL_PLANE_NODE_UNKNOWN",
        revoked
          ? `node ${nodeId} was revoked by an operator; register again with the join token`
          : `node ${nodeId} is not known to this control plane; register again with the join token`,
      );
    }
    if (!secretsEqual(hashSecret(credential), node.record.credentialHash)) {
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_UNAUTHENTICATED",
        `wrong credential for node ${nodeId}; register again with the join token`,
      );
    }
    // The agent has the new credential: the one before it is retired.
    node.priorCredentialHash = undefined;
    return node.record.credentialHash;
  }

  /**
   * True while `credentialHash` (what {@link authenticateNode} returned) still authenticates
   * `nodeId`, without hashing again: for a stream whose first message passed. A node revoked,
   * or registered again with a new credential since, no longer matches.
   */
  stillAuthenticated(nodeId: string, credentialHash: string): boolean {
    return this.#nodes.get(nodeId)?.record.credentialHash === credentialHash;
  }

  /**
   * Takes a heartbeat (credential already checked) and returns the node's full desired set.
   * A heartbeat older than one already taken from the node (see {@link ReportSessions}) is
   * answered and changes nothing, not even when the node was last seen.
   */
  heartbeat(nodeId: string, input: HeartbeatInput): DesiredSet {
    const node = this.#nodes.get(nodeId);
    if (!node)
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_NODE_UNKNOWN",
        `node ${nodeId} is not known`,
      );
    const now = this.#o.clock.now();
    const verdict = node.reports.admit(input.order);
    if (verdict !== "taken") {
      this.#logOutOfOrder(node, input.order, verdict, now);
      return this.desiredSet(nodeId);
    }
    node.lastSeenMs = now;
    node.lastHeartbeatMs = now;
    let healthChanged = false;
    for (const reading of input.gpus) {
      const gpu = inventoryGpu(node.inventory, reading.index);
      // A reading of a GPU the inventory does not list is nobody's: not kept.
      if (!gpu) continue;
      const before = this.#faults.verdict(gpu, node.readings.get(reading.index)).healthy;
      node.readings.set(reading.index, reading);
      if (reading.faults !== undefined && reading.faults.length > 0)
        this.#announceFaults(node, gpu, reading.faults);
      const after = this.#faults.verdict(gpu, reading);
      if (before !== after.healthy) {
        healthChanged = true;
        this.#gpuHealthEvent(node, gpu, after);
      }
    }
    const portsChanged = this.#ingestPorts(node, input.ports ?? []);
    if (healthChanged || portsChanged) node.healthVersion++;
    node.problems = [...input.problems];
    const failed = this.#ingestStatuses(node, input.replicas, input.generationSeen);
    this.#ingestEngineKeys(node, input.engineCredentials ?? []);
    this.#ingestLoads(node, now);
    const wasState = node.state;
    this.#setNodeState(node, "ready", now);
    if (healthChanged || portsChanged) {
      // Not deferred: a GPU or port that went bad must leave the route table and the
      // desired sets now, and this heartbeat's answer already carries the drain.
      this.#reconcile(
        `heartbeat from ${nodeId}: ${healthChanged ? "GPU health" : "port health"} changed`,
      );
    } else if (failed || wasState === "lost" || this.#lifecycleStep !== undefined) {
      this.#requestReconcile(this.#lifecycleStep ?? `heartbeat from ${nodeId}`);
      this.#lifecycleStep = undefined;
    } else {
      this.#touch();
    }
    // A deferred reconcile has not touched yet; what this heartbeat changed is announced now.
    this.#flushRouting();
    return {
      generation: node.generation,
      assignments: this.#assignmentsOf(node),
      heartbeatIntervalMs: this.#o.heartbeatIntervalMs,
    };
  }

  /** Logs a heartbeat left untaken as older, at most one line a minute per node. */
  #logOutOfOrder(
    node: LiveNode,
    order: ReportOrder | undefined,
    verdict: Exclude<ReportVerdict, "taken">,
    now: number,
  ): void {
    if (node.outOfOrderLoggedAtMs !== undefined && now - node.outOfOrderLoggedAtMs < 60_000) return;
    node.outOfOrderLoggedAtMs = now;
    const current = node.reports.current;
    this.#o.log?.(
      `node ${node.record.id}: heartbeat ${order?.sequence} of agent session ${order?.sessionId} arrived after a newer one and was not taken (${
        verdict === "older"
          ? `heartbeat ${current?.sequence} of that session was taken already`
          : `session ${current?.sessionId} has replaced it`
      }); at most one such line a minute`,
    );
  }

  #gpuHealthEvent(node: LiveNode, gpu: Gpu, after: GpuHealthVerdict): void {
    const fault = after.faults[0];
    const why = after.lost
      ? "the GPU is lost"
      : (after.problems[0]?.message ??
        (fault
          ? `${faultName(fault)} (${fault.action}): ${fault.description || "kernel-log fault"}; evidence: ${fault.evidence}`
          : "the agent reports it unhealthy"));
    this.events.record(
      "gpu.health",
      node.record.id,
      `GPU ${gpu.index} on ${node.record.hostname} is now ${after.healthy ? "healthy" : `unhealthy: ${why}`}`,
      after.healthy ? "info" : "warning",
    );
  }

  /**
   * Announces each fault not announced before on this GPU (one `gpu.fault` event and one
   * count in the tally), and one that was cleared and is now seen again. A fault still
   * covered by a clear is neither.
   */
  #announceFaults(node: LiveNode, gpu: Gpu, faults: readonly GpuFault[]): void {
    for (const f of this.#faults.takeNew(node.record.id, gpu, faults)) {
      const actionable = faultIsActionable(f);
      this.events.record(
        "gpu.fault",
        node.record.id,
        `GPU ${gpu.index} on ${node.record.hostname}: ${faultName(f)} (${f.action}${
          actionable ? ": out of service until cleared" : ""
        }), ${f.count} record${f.count === 1 ? "" : "s"}${
          f.description ? `, ${f.description}` : ""
        }; evidence: ${f.evidence}`,
        actionable ? "error" : "info",
      );
    }
  }

  /**
   * Takes the heartbeat's ports (none: the registered ones stand), raises `port.health` for
   * each port whose verdict flipped, and says whether the fabrics the node may be used on
   * for multi-node replicas changed.
   */
  #ingestPorts(node: LiveNode, ports: readonly Port[]): boolean {
    if (ports.length === 0) return false;
    const fabrics = portFabrics(node.inventory);
    const before = new Map(node.ports.map((p) => [portKey(p.device, p.port), p]));
    const troubleBefore = [...troubledFabrics(node.ports).keys()].sort().join(",");
    node.ports = ports.map((p) => portSnapshot(p, fabrics));
    // A fabric port the agent no longer lists (the device vanished, or sysfs could not be
    // read) is as unusable as a down one: absent is not healthy.
    const listed = new Set(node.ports.map((p) => portKey(p.device, p.port)));
    for (const [key, on] of fabrics) {
      if (listed.has(key)) continue;
      const [device = "", port = "0"] = key.split("/");
      node.ports.push({
        device,
        port: Number(port),
        fabrics: on,
        healthy: false,
        problem: "port not reported by the agent (device gone, or its sysfs unreadable)",
      });
    }
    for (const p of node.ports) {
      const was = before.get(portKey(p.device, p.port))?.healthy;
      if (p.healthy === undefined || p.healthy === was) continue;
      // A first report of a healthy port is not news; an unhealthy one always is.
      if (was === undefined && p.healthy) continue;
      const on = p.fabrics.length > 0 ? ` (fabric ${p.fabrics.join(", ")})` : "";
      this.events.record(
        "port.health",
        node.record.id,
        `port ${p.device}/${p.port}${on} on ${node.record.hostname} is now ${
          p.healthy ? "healthy" : `unhealthy: ${p.problem}`
        }`,
        p.healthy ? "info" : "warning",
      );
    }
    return troubleBefore !== [...troubledFabrics(node.ports).keys()].sort().join(",");
  }

  /**
   * Applies the lifecycle rules at the current time, and retries store writes that failed
   * (events, placements); call periodically.
   */
  tick(): void {
    this.events.retry();
    if (this.#placementsUnsaved) this.#resavePlacements();
    if (this.#statusesUnsaved) this.#resaveStatuses();
    if (this.#nodeStatesUnsaved) this.#resaveNodeStates();
    if (this.#avoidedUnsaved) this.#resaveAvoided();
    const now = this.#o.clock.now();
    let lost = false;
    for (const node of this.#nodes.values()) {
      const next = nextNodeState(node.state, node.lastSeenMs, now, {
        unreachableAfterMs: this.#o.unreachableAfterMs,
        lostAfterMs: this.#o.nodeLostAfterMs,
      });
      if (next !== node.state) {
        this.#setNodeState(node, next, now);
        if (next === "lost") lost = true;
      }
    }
    if (lost) this.#reconcile("node lost");
    else if (this.#drainsDue()) this.#reconcile("replicas drained");
    else if (this.#failing.anyNewlyDue(now, (id) => this.#movable(id)))
      this.#reconcile("a replica keeps failing");
    else if ([...this.#stalled.keys()].some((name) => this.#stalledPast(name, now)))
      this.#reconcile("a rollout made no progress");
    this.#drains.prune();
  }

  #setNodeState(node: LiveNode, next: NodeState, now: number): void {
    if (node.state === next) return;
    const from = node.state;
    node.state = next;
    node.stateSinceMs = now;
    this.#saveNodeState(node);
    // Routers leave out the replicas with a rank on a lost node (see readyReplicas).
    if (from === "lost" || next === "lost") this.#routingChange();
    this.#touch();
    const silentS = ((now - node.lastSeenMs) / 1000).toFixed(1);
    const message =
      next === "ready"
        ? `${node.record.hostname} is ready again (was ${from})`
        : next === "unreachable"
          ? `${node.record.hostname} missed heartbeats for ${silentS}s; its replicas keep serving`
          : `${node.record.hostname} silent for ${silentS}s; its replicas are rescheduled`;
    this.events.record(
      `node.${next}`,
      node.record.id,
      message,
      next === "ready" ? "info" : next === "lost" ? "error" : "warning",
    );
  }

  /**
   * Records `node`'s liveness for followers to show. Like statuses, a failing store does not
   * fail the heartbeat or tick that changed it: every node's is written again at a tick.
   */
  #saveNodeState(node: LiveNode): void {
    if (node.record.state === node.state && node.record.stateSinceMs === node.stateSinceMs) return;
    node.record = { ...node.record, state: node.state, stateSinceMs: node.stateSinceMs };
    if (this.#nodeStatesUnsaved) return;
    try {
      this.#o.store.putNodeState(node.record.id, node.state, node.stateSinceMs);
    } catch (error) {
      if (!isStoreFailure(error)) throw error;
      this.#nodeStatesUnsaved = true;
      this.#o.log?.(
        `node states kept in memory only, written again at a tick once the store takes writes: ${(error as Error).message}`,
      );
    }
  }

  #resaveNodeStates(): void {
    try {
      this.#o.store.transaction(() => {
        for (const n of this.#nodes.values())
          this.#o.store.putNodeState(n.record.id, n.state, n.stateSinceMs);
      });
    } catch (error) {
      if (!isStoreFailure(error)) throw error;
      return;
    }
    this.#nodeStatesUnsaved = false;
  }

  /**
   * Replaces the engine keys of the replicas whose rank 0 (the serving rank) `node` runs with
   * what it reported; keys it reports for replicas served elsewhere are ignored, so a node
   * cannot hand routers a key for another node's engine.
   */
  #ingestEngineKeys(node: LiveNode, credentials: readonly EngineCredentialInput[]): void {
    const id = node.record.id;
    const before = new Map<string, string>();
    for (const replicaId of this.#servedBy.get(id) ?? []) {
      const key = this.#engineKeys.get(replicaId);
      if (key === undefined) continue;
      before.set(replicaId, key);
      this.#engineKeys.delete(replicaId);
    }
    let changed = false;
    for (const c of credentials) {
      if (c.apiKey === "" || this.#placements.get(c.replicaId)?.ranks[0]?.nodeId !== id) continue;
      this.#engineKeys.set(c.replicaId, c.apiKey);
      if (before.get(c.replicaId) !== c.apiKey) changed = true;
    }
    for (const replicaId of before.keys()) if (!this.#engineKeys.has(replicaId)) changed = true;
    if (changed) this.#routingChange();
  }

  /** Adds `p` to (or takes it from) the replicas its rank 0's node serves. */
  #indexServing(p: PlacementRecord, add: boolean): void {
    const nodeId = p.ranks[0]?.nodeId;
    if (nodeId === undefined) return;
    let served = this.#servedBy.get(nodeId);
    if (add) {
      if (served === undefined) {
        served = new Set();
        this.#servedBy.set(nodeId, served);
      }
      served.add(p.replicaId);
    } else if (served?.delete(p.replicaId) && served.size === 0) this.#servedBy.delete(nodeId);
  }

  /** True when `replicaId`'s rank `rank` is placed on `node` (its status counts). */
  #placedHere(replicaId: string, rank: number, node: LiveNode): boolean {
    const p = this.#placements.get(replicaId);
    return p !== undefined && placedOn(p, rank, node.record.id);
  }

  /**
   * Takes the load of the replicas whose rank 0 `node` runs from their accepted statuses
   * (absent there: unknown now), stamped `atMs`, ordered against the node's load reports by
   * the scrape it came from. A scrape time more than a day from this clock orders nothing (a
   * load report with one is refused; a heartbeat is not refused for it) and the load is taken
   * as it arrives.
   */
  #ingestLoads(node: LiveNode, atMs: number): void {
    for (const s of node.statuses.values()) {
      if (s.rank !== 0 || this.#placements.get(s.replicaId)?.ranks[0]?.nodeId !== node.record.id)
        continue;
      const scraped = s.loadScrapedAtMs;
      const scrapedAtMs =
        scraped !== undefined && Math.abs(scraped - atMs) <= AGENT_LIMITS.scrapedAtSkewMs
          ? scraped
          : undefined;
      this.#loads.apply(node.record.id, s.replicaId, s.load ?? UNKNOWN_LOAD, atMs, scrapedAtMs);
    }
  }

  /** Stores reported statuses; emits an event per state change; true when a rank newly failed. */
  #ingestStatuses(
    node: LiveNode,
    statuses: readonly RankStatus[],
    generationSeen?: bigint,
  ): boolean {
    const now = this.#o.clock.now();
    let newlyFailed = false;
    let routing = false;
    let stepped: string | undefined;
    const put: ReplicaStatusRecord[] = [];
    const remove: [string, number][] = [];
    const next = new Map<string, RankStatus>();
    const reported = new Set<string>();
    for (const raw of statuses) {
      const key = statusKey(raw.replicaId, raw.rank);
      reported.add(key);
      const placed = this.#placements.get(raw.replicaId);
      // A status of a replica (or rank) placed on another node says nothing about it: this
      // node does not run it, so it neither starts nor ends its failure streak, nor is kept.
      if (placed !== undefined && !placedOn(placed, raw.rank, node.record.id)) continue;
      const s = portsWithinRange(raw);
      const retired = node.retired.get(key);
      if (retired !== undefined) {
        // Once the agent has applied a desired set issued after the removal (or none was
        // issued), the engine it reports is its answer to that set: when the placement came
        // back unchanged the agent rightly kept the same engine.
        const answered =
          node.generation === retired.generation ||
          (generationSeen !== undefined && generationSeen > retired.generation);
        const sameEngine = s.pid === retired.pid && s.startedAtMs === retired.startedAtMs;
        if (sameEngine && !answered) continue;
        node.retired.delete(key);
      }
      const before = node.statuses.get(key);
      next.set(key, s);
      if (keptFieldsChanged(before, s) && this.#placedHere(s.replicaId, s.rank, node)) {
        put.push(statusRecord(node.record.id, s));
        // What routers see of a rank: its state (with the others', the replica's) and rank 0's port.
        if (before?.state !== s.state || before?.apiPort !== s.apiPort) routing = true;
      }
      if (before?.state === s.state) continue;
      if (placed === undefined) continue;
      // A replacement turning ready (or failing) may let a leaving replica go on.
      if (this.#active.has(placed.deployment)) stepped ??= `replica ${s.replicaId} ${s.state}`;
      const failedNow = s.state === "failed";
      if (failedNow) {
        newlyFailed = true;
        this.#failing.failed(s.replicaId, node.record.id, now);
      } else if (s.state === "ready") this.#failing.ready(s.replicaId, now);
      const tail =
        failedNow && s.logTail.length > 0
          ? `; last output: ${s.logTail.slice(-3).join(" | ")}`
          : "";
      this.events.record(
        "replica.state",
        s.replicaId,
        `rank ${s.rank} on ${node.record.hostname}: ${before ? before.state : "reported"} → ${s.state}${
          s.message ? ` (${s.message})` : ""
        }${tail}`,
        failedNow ? "error" : s.state === "unhealthy" || s.state === "exited" ? "warning" : "info",
      );
    }
    for (const [key, s] of node.statuses) {
      if (next.has(key) || !this.#placedHere(s.replicaId, s.rank, node)) continue;
      routing = true;
      remove.push([s.replicaId, s.rank]);
    }
    node.statuses = next;
    if (routing) this.#routingChange();
    // After the caller took the rest of the report (load, liveness): see #lifecycleStep.
    if (stepped !== undefined) this.#lifecycleStep = stepped;
    this.#saveStatuses(put, remove);
    // A retired engine the agent no longer reports is gone.
    for (const key of node.retired.keys()) if (!reported.has(key)) node.retired.delete(key);
    return newlyFailed;
  }

  // ---------------------------------------------------------------- deployments

  /** Creates or updates a deployment (spec already validated); bumps the revision on change. */
  applyDeployment(spec: DeploymentSpec): { status: DeploymentInfo; changed: boolean } {
    const now = this.#o.clock.now();
    const existing = this.#deployments.get(spec.name);
    if (existing && sameDeploymentSpec(existing.spec, spec)) {
      return { status: this.deploymentStatus(spec.name), changed: false };
    }
    // Only a change to how replicas run bumps the revision; a replica count change does not.
    const onlyScaled =
      existing !== undefined &&
      sameDeploymentSpec(existing.spec, { ...spec, replicas: existing.spec.replicas });
    // A name deleted while its replicas still drain keeps their revisions: a new deployment
    // of that name counts on from them, so no draining replica is handed the new spec.
    const kept = Math.max(0, ...(this.#revisions.get(spec.name)?.keys() ?? []));
    const revision = onlyScaled
      ? existing.spec.revision
      : Math.max(existing?.spec.revision ?? 0, kept) + 1;
    const next = { ...spec, revision };
    const wasInvalid = existing !== undefined && this.#refused.has(existing.spec);
    this.#putDeployment(next, existing?.record.createdAtMs ?? now, now, this.#rolloutFor(next));
    this.events.record(
      existing ? "deployment.updated" : "deployment.created",
      spec.name,
      `${existing ? "updated" : "created"} ${spec.name} (revision ${revision}): ${spec.replicas} × ${spec.engine} ${spec.model}${wasInvalid ? `; replaces revision ${existing.spec.revision}, which this release refused: ${spec.name} is valid again` : ""}`,
      "info",
    );
    this.#reconcile(`deployment ${spec.name} applied`);
    return { status: this.deploymentStatus(spec.name), changed: true };
  }

  /**
   * Sets a deployment's replica count. A count the spec schema refuses (over 100 000) throws
   * `LLMGW_CONTROL_PLANE_INVALID_ARGUMENT` naming `replicas`, and nothing changes.
   */
  scaleDeployment(name: string, replicas: number): DeploymentInfo {
    const existing = this.#requireDeployment(name);
    const refused = this.#refused.get(existing.spec);
    if (refused !== undefined && existing.spec.replicas !== replicas) {
      // A scale writes the spec back as this release accepts it, which it does not.
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
        `cannot scale ${name}: ${this.#invalidMessage(name, refused)}`,
      );
    }
    if (existing.spec.replicas !== replicas) {
      // Validated as apply validates: the store only ever holds specs that pass.
      const scaled = parseDeploymentSpec({ ...existing.spec, replicas });
      if (!scaled.ok) {
        throw new ControlPlaneError(
          "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
          `cannot scale ${name} to ${replicas} replicas: ${scaled.error.message}`,
          { cause: scaled.error },
        );
      }
      const now = this.#o.clock.now();
      // The revision counts changes to how replicas run; scaling restarts none of them.
      this.#putDeployment(scaled.spec, existing.record.createdAtMs, now, existing.record.rollout);
      this.events.record(
        "deployment.scaled",
        name,
        `scaled ${name} from ${existing.spec.replicas} to ${replicas} replicas`,
        "info",
      );
      this.#reconcile(`deployment ${name} scaled`);
    }
    return this.deploymentStatus(name);
  }

  /**
   * Lifts `name`'s avoidance of a node (id or hostname; of every node when undefined), after an
   * operator mended what made a replica fail there; its count of moves there starts again.
   * Returns the node ids that were avoided. Moves nothing: new replicas may go there again.
   */
  unavoid(name: string, nodeOrHost: string | undefined): string[] {
    this.#requireDeployment(name);
    const now = this.#o.clock.now();
    let nodeId: string | undefined;
    if (nodeOrHost !== undefined) {
      // A node revoked since is no longer known by hostname, only by its id.
      const avoided = this.#failing.avoidedBy(name, now).some((a) => a.nodeId === nodeOrHost);
      nodeId = avoided ? nodeOrHost : this.#requireNode(nodeOrHost).record.id;
    }
    const lifted = this.#failing.unavoid(name, nodeId, now);
    if (lifted.length > 0) {
      const names = lifted.map((id) => this.#nodes.get(id)?.record.hostname ?? id).join(", ");
      this.events.record(
        "deployment.unavoided",
        name,
        `${name} no longer avoids ${names}: lifted by an operator`,
        "info",
      );
      // A replica that stayed failing for want of a node it does not avoid may move now.
      this.#reconcile(`${name} no longer avoids ${names}`);
    }
    return lifted;
  }

  /**
   * Deletes a deployment: its model leaves the routers at once; its replicas drain (no new
   * requests, in-flight ones finish) and then leave their nodes.
   */
  deleteDeployment(name: string): void {
    this.#requireDeployment(name);
    this.#deployments.delete(name);
    // Its replicas still run their revisions' specs while they drain.
    this.#desiredAllDirty = true;
    this.#unschedulable.delete(name);
    this.#stalled.delete(name);
    this.#failing.deploymentGone(name);
    this.#o.store.deleteDeployment(name);
    this.#routingChange();
    this.events.record("deployment.deleted", name, `deleted ${name}`, "info");
    this.#reconcile(`deployment ${name} deleted`);
  }

  #putDeployment(
    spec: DeploymentSpec,
    createdAtMs: number,
    now: number,
    rollout: RolloutRecord | undefined,
  ): void {
    const specJson = JSON.stringify(spec);
    const record: DeploymentRecord = {
      name: spec.name,
      specJson,
      revision: spec.revision,
      createdAtMs,
      updatedAtMs: now,
      ...(rollout === undefined ? {} : { rollout }),
    };
    this.#o.store.transaction(() => {
      this.#o.store.putDeployment(record);
      this.#o.store.putDeploymentRevision({ name: spec.name, revision: spec.revision, specJson });
    });
    this.#deployments.set(spec.name, { record, spec });
    this.#keepRevision(spec);
    // Every assignment of it carries the spec.
    this.#desiredAllDirty = true;
    this.#routingChange();
  }

  #keepRevision(spec: DeploymentSpec): void {
    let byRevision = this.#revisions.get(spec.name);
    if (byRevision === undefined) {
      byRevision = new Map();
      this.#revisions.set(spec.name, byRevision);
    }
    byRevision.set(spec.revision, spec);
  }

  /** The spec replica `p` runs: its revision's, which is the current one unless it is older. */
  #specOf(p: PlacementRecord): DeploymentSpec | undefined {
    const current = this.#deployments.get(p.deployment)?.spec;
    if (current?.revision === p.revision) return current;
    return this.#revisions.get(p.deployment)?.get(p.revision);
  }

  /**
   * The rollout a new revision starts: in progress when replicas run an older revision that
   * launches engines differently (a rolling update follows); else the deployment's last one
   * (an update in progress going on to the new revision).
   */
  #rolloutFor(next: DeploymentSpec): RolloutRecord | undefined {
    const existing = this.#deployments.get(next.name);
    if (existing === undefined) return undefined;
    const from = existing.spec;
    // A replica waiting for its replacement still serves its older revision: it rolls too.
    const rolls = [...this.#placements.values()].some(
      (p) => p.deployment === next.name && p.retirement?.phase !== "draining",
    );
    const now = this.#o.clock.now();
    const last = existing.record.rollout;
    if (sameLaunch(from, next) && last?.state === "in-progress") {
      // A routing-only change mid-update: the update goes on, to this revision (whose
      // replicas a failure rolls back).
      return { ...last, toRevision: next.revision, updatedAtMs: now };
    }
    const { maxSurge, maxUnavailable } = rolloutLimits(next);
    if (last?.state === "in-progress") {
      // A new update mid-update goes on from the revision the first came from: the one that
      // served (the revision it replaces may never have placed a replica).
      return {
        state: "in-progress",
        fromRevision: last.fromRevision,
        toRevision: next.revision,
        message: `replacing ${from.replicas} replica(s) at revisions ${last.fromRevision}–${from.revision}, ${maxSurge + maxUnavailable} at a time`,
        startedAtMs: now,
        updatedAtMs: now,
      };
    }
    if (!rolls || sameLaunch(from, next)) return last;
    return {
      state: "in-progress",
      fromRevision: from.revision,
      toRevision: next.revision,
      message: `replacing ${from.replicas} replica(s) at revision ${from.revision}, ${maxSurge + maxUnavailable} at a time`,
      startedAtMs: now,
      updatedAtMs: now,
    };
  }

  #requireDeployment(name: string): LiveDeployment {
    const d = this.#deployments.get(name);
    if (!d) {
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_NOT_FOUND",
        `no deployment named ${JSON.stringify(name)}${this.#deployments.size ? `; known: ${[...this.#deployments.keys()].join(", ")}` : ""}`,
      );
    }
    return d;
  }

  /**
   * A deployment with its replicas' states, why some cannot be placed, which failed. An
   * invalid one ({@link #refused}) has `invalid`, also first among `unschedulable` (code
   * `LLMGW_CONTROL_PLANE_SPEC_REFUSED`), where every client shows a deployment's problems.
   */
  deploymentStatus(name: string): DeploymentInfo {
    const d = this.#requireDeployment(name);
    const replicas = this.#replicasOf(name);
    const why = this.#refused.get(d.spec);
    const invalid =
      why === undefined
        ? undefined
        : { code: "LLMGW_CONTROL_PLANE_SPEC_REFUSED", message: this.#invalidMessage(name, why) };
    const reasons = [
      ...(invalid === undefined ? [] : [invalid]),
      ...(this.#unschedulable.get(name)?.reasons ?? []),
    ];
    const failed = replicas
      .filter((r) => r.state === "failed")
      .map((r) => {
        const tail = r.ranks.find((k) => k.status?.state === "failed")?.status;
        return {
          code: "LLMGW_CONTROL_PLANE_REPLICA_FAILED",
          message: `replica ${r.replicaId} failed${tail?.message ? `: ${tail.message}` : ""}${
            tail && tail.logTail.length > 0 ? `\n${tail.logTail.slice(-10).join("\n")}` : ""
          }`,
        };
      });
    return {
      spec: d.spec,
      desiredReplicas: d.spec.replicas,
      readyReplicas: replicas.filter((r) => r.state === "ready").length,
      replicas,
      unschedulable: [...reasons.map((r) => ({ code: r.code, message: r.message })), ...failed],
      failed,
      avoided: this.#failing.avoidedBy(name, this.#o.clock.now()).map((a) => ({
        code: "LLMGW_CONTROL_PLANE_NODE_AVOIDED",
        message: `${this.#nodes.get(a.nodeId)?.record.hostname ?? a.nodeId} is avoided until ${new Date(a.untilMs).toISOString()}: a replica kept failing there and moved${a.moves > 1 ? ` (${a.moves} moves in a row)` : ""}; 'llmgw unavoid ${name} ${a.nodeId}' lifts it`,
      })),
      createdAtMs: d.record.createdAtMs,
      updatedAtMs: d.record.updatedAtMs,
      ...(d.record.rollout === undefined ? {} : { rollout: d.record.rollout }),
      ...(invalid === undefined ? {} : { invalid }),
    };
  }

  /** Every deployment's status, by name. */
  listDeployments(): DeploymentInfo[] {
    return [...this.#deployments.keys()].sort().map((n) => this.deploymentStatus(n));
  }

  /** Replicas, optionally of one deployment and/or on one node (id or hostname). */
  listReplicas(filter: { deployment?: string; node?: string } = {}): ReplicaInfo[] {
    // A deleted deployment's replicas still draining are its replicas (`undeploy --wait`).
    const { deployment } = filter;
    if (
      deployment &&
      !this.#deployments.has(deployment) &&
      ![...this.#placements.values()].some((p) => p.deployment === deployment)
    )
      this.#requireDeployment(deployment);
    const nodeId = filter.node ? this.#requireNode(filter.node).record.id : undefined;
    // One pass over the placements (every scrape of a moving cluster lists them all).
    const byDeployment = new Map<string, PlacementRecord[]>();
    for (const p of this.#placements.values()) {
      if (filter.deployment !== undefined && p.deployment !== filter.deployment) continue;
      if (nodeId !== undefined && !p.ranks.some((k) => k.nodeId === nodeId)) continue;
      const list = byDeployment.get(p.deployment);
      if (list === undefined) byDeployment.set(p.deployment, [p]);
      else list.push(p);
    }
    const names = filter.deployment ? [filter.deployment] : [...this.#deployments.keys()].sort();
    // Replicas of deleted deployments still draining are listed too.
    if (!filter.deployment) {
      const gone = [...byDeployment.keys()].filter((d) => !this.#deployments.has(d));
      names.push(...gone.sort());
    }
    return names.flatMap((n) => this.#replicaViews(byDeployment.get(n) ?? []));
  }

  #replicasOf(deployment: string): ReplicaInfo[] {
    return this.#replicaViews(
      [...this.#placements.values()].filter((p) => p.deployment === deployment),
    );
  }

  /** Views of `placements` (sorts them) in replica id order: chat-2 before chat-10. */
  #replicaViews(placements: PlacementRecord[]): ReplicaInfo[] {
    return placements
      .sort((a, b) => REPLICA_ID_ORDER(a.replicaId, b.replicaId))
      .map((p) => this.#replicaView(p));
  }

  /**
   * Forgets the statuses of a removed placement's engines and remembers which engines they
   * were, so that a replacement reusing the replica id on the same node is not taken for ready
   * (and routed to) on the word of the engine being stopped.
   */
  #retireStatuses(p: PlacementRecord): void {
    for (const rank of p.ranks) {
      const node = this.#nodes.get(rank.nodeId);
      const key = statusKey(p.replicaId, rank.rank);
      const status = node?.statuses.get(key);
      if (!node || !status) continue;
      node.statuses.delete(key);
      if (status.pid !== undefined) {
        node.retired.set(key, {
          pid: status.pid,
          startedAtMs: status.startedAtMs,
          generation: node.generation,
        });
      }
    }
  }

  #placedRank(p: PlacementRecord, rank: PlacementRecord["ranks"][number]): PlacedRankInfo {
    const status = this.#nodes.get(rank.nodeId)?.statuses.get(statusKey(p.replicaId, rank.rank));
    return {
      replicaId: p.replicaId,
      deployment: p.deployment,
      rank: rank.rank,
      nodeId: rank.nodeId,
      gpuIndices: rank.gpuIndices,
      ...(status === undefined ? {} : { status }),
    };
  }

  #replicaView(p: PlacementRecord): ReplicaInfo {
    const ranks = p.ranks.map((r) => this.#placedRank(p, r));
    const endpoint = this.#endpointOf(p);
    const retirement = this.#retirementView(p);
    return {
      replicaId: p.replicaId,
      deployment: p.deployment,
      revision: p.revision,
      state: aggregateRankStates(ranks.map((r) => r.status?.state)),
      ...(p.fabricId ? { fabricId: p.fabricId } : {}),
      ranks,
      ...(endpoint === undefined ? {} : { endpoint }),
      createdAtMs: p.createdAtMs,
      ...(retirement === undefined ? {} : { retirement }),
    };
  }

  #retirementView(p: PlacementRecord): RetirementInfo | undefined {
    const r = p.retirement;
    if (r === undefined) return undefined;
    const inFlight = this.#inFlightOf(p);
    return {
      reason: { code: r.code, message: r.message },
      phase: r.phase,
      sinceMs: r.sinceMs,
      ...(r.drainingSinceMs === undefined ? {} : { drainingSinceMs: r.drainingSinceMs }),
      ...(r.deadlineMs === undefined ? {} : { drainDeadlineMs: r.deadlineMs }),
      ...(inFlight === undefined ? {} : { inFlight }),
    };
  }

  #endpointOf(p: PlacementRecord): string | undefined {
    const rank0 = p.ranks[0];
    if (!rank0) return undefined;
    const node = this.#nodes.get(rank0.nodeId);
    const port = node?.statuses.get(statusKey(p.replicaId, 0))?.apiPort;
    // Statuses are checked as they arrive; one restored from an older store may not be.
    if (!node || port === undefined || port < 1 || port > 65_535) return undefined;
    return joinHostPort(node.record.advertiseAddress, port);
  }

  /** `http://` URL of the agent serving rank 0's KV-cache blocks, when it reported one. */
  #kvEventsUrlOf(p: PlacementRecord): string | undefined {
    const rank0 = p.ranks[0];
    if (!rank0) return undefined;
    const node = this.#nodes.get(rank0.nodeId);
    const port = node?.statuses.get(statusKey(p.replicaId, 0))?.kvEventsPort;
    if (!node || port === undefined || port === 0) return undefined;
    return `http://${joinHostPort(node.record.advertiseAddress, port)}`;
  }

  // ---------------------------------------------------------------- nodes

  #requireNode(nodeOrHost: string): LiveNode {
    const byId = this.#nodes.get(nodeOrHost);
    if (byId) return byId;
    const byHost = [...this.#nodes.values()].filter((n) => n.record.hostname === nodeOrHost);
    if (byHost.length === 1) return byHost[0] as LiveNode;
    if (byHost.length > 1) {
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
        `hostname ${nodeOrHost} matches ${byHost.length} nodes (${byHost.map((n) => n.record.id).join(", ")}); use a node id`,
      );
    }
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_NOT_FOUND",
      `no node with id or hostname ${JSON.stringify(nodeOrHost)}; see 'llmgw nodes'`,
    );
  }

  /** All (non-revoked) nodes, or those of them named in `only` (ids or hostnames). */
  listNodes(only?: readonly string[]): NodeInfo[] {
    const placed = this.#placedByNode();
    let nodes = [...this.#nodes.values()];
    if (only !== undefined && only.length > 0) {
      const names = new Set(only);
      nodes = nodes.filter((n) => names.has(n.record.id) || names.has(n.record.hostname));
    }
    return nodes.map((n) => this.#nodeView(n, placed));
  }

  /** One node by id or hostname. */
  getNode(nodeOrHost: string): NodeInfo {
    return this.#nodeView(this.#requireNode(nodeOrHost));
  }

  /** Stops new placements on a node; running replicas stay. */
  cordonNode(nodeOrHost: string): NodeInfo {
    const node = this.#requireNode(nodeOrHost);
    if (!node.record.cordoned) {
      this.#updateNodeRecord(node, { cordoned: true });
      this.events.record(
        "node.cordoned",
        node.record.id,
        `${node.record.hostname} cordoned: no new replicas`,
        "info",
      );
      this.#reconcile(`node ${node.record.id} cordoned`);
    }
    return this.#nodeView(node);
  }

  /** Clears cordon and drain. */
  uncordonNode(nodeOrHost: string): NodeInfo {
    const node = this.#requireNode(nodeOrHost);
    if (node.record.cordoned || node.record.draining) {
      this.#updateNodeRecord(node, { cordoned: false, draining: false, drainedBy: undefined });
      this.events.record(
        "node.uncordoned",
        node.record.id,
        `${node.record.hostname} uncordoned`,
        "info",
      );
      this.#reconcile(`node ${node.record.id} uncordoned`);
    }
    return this.#nodeView(node);
  }

  /** Cordons a node and moves its replicas elsewhere. */
  drainNode(nodeOrHost: string): NodeInfo {
    const node = this.#requireNode(nodeOrHost);
    if (!node.record.draining || node.record.drainedBy === "agent") {
      // An operator's drain outlasts the agent's own: its next start does not end it.
      this.#updateNodeRecord(node, { cordoned: true, draining: true, drainedBy: "operator" });
      this.events.record(
        "node.draining",
        node.record.id,
        `${node.record.hostname} draining: its replicas move elsewhere`,
        "info",
      );
      this.#reconcile(`node ${node.record.id} drained`);
    }
    return this.#nodeView(node);
  }

  /**
   * The agent of `nodeId` leaving with its engines (`SetLeaving`): `true` drains the node
   * (replacements first, then its replicas drain), unless already drained; `false`, when it
   * starts again, ends a drain its own leaving began, never an operator's. Returns the
   * replicas still placed on the node.
   */
  setNodeLeaving(nodeId: string, leaving: boolean): number {
    const node = this.#nodes.get(nodeId);
    if (node === undefined) {
      throw new ControlPlaneError("LLMGW_CONTROL_PLANE_NOT_FOUND", `no node with id ${nodeId}`);
    }
    if (leaving && !node.record.draining) {
      this.#updateNodeRecord(node, { cordoned: true, draining: true, drainedBy: "agent" });
      this.events.record(
        "node.leaving",
        nodeId,
        `${node.record.hostname}'s agent is stopping its engines: its replicas move elsewhere first`,
        "info",
      );
      this.#reconcile(`node ${nodeId} leaving`);
    } else if (!leaving && node.record.draining && node.record.drainedBy === "agent") {
      this.#updateNodeRecord(node, { cordoned: false, draining: false, drainedBy: undefined });
      this.events.record("node.back", nodeId, `${node.record.hostname}'s agent is back`, "info");
      this.#reconcile(`node ${nodeId} back`);
    }
    let placed = 0;
    for (const p of this.#placements.values())
      if (p.ranks.some((r) => r.nodeId === nodeId)) placed++;
    return placed;
  }

  /**
   * Lets the next Register naming this node within {@link ClusterOptions.resetOpenMs}
   * (default 15 minutes) take it with the join token alone, once, keeping its placements:
   * the way back for an agent whose saved credential no longer matches (a restored state
   * dir, a reinstalled host). Until then the node keeps working with its current
   * credential. Survives a control-plane restart; a reset not used in time lapses, so a
   * forgotten one does not leave the node to anyone holding the join token. Resetting again
   * restarts the window.
   */
  resetNode(nodeOrHost: string): void {
    const node = this.#requireNode(nodeOrHost);
    const openMs = this.#o.resetOpenMs ?? RESET_OPEN_MS;
    this.#updateNodeRecord(node, { resetUntilMs: this.#o.clock.now() + openMs });
    this.events.record(
      "node.reset",
      node.record.id,
      `${node.record.hostname} reset by an operator: the next Register naming ${node.record.id} in the next ${formatMinutes(openMs)} may take it with the join token alone`,
      "warning",
    );
    this.#touch();
  }

  /**
   * Declares the current kernel-log faults of one GPU dealt with (the operator reset or
   * replaced it): each is recorded with its `lastSeenUnixMs` in the store, per GPU uuid,
   * and stops counting against the GPU until the agent reports it with a later one (a new
   * record). Never done by a timeout. A reset is not observable from what agents report
   * (the kernel log keeps the old records until the next boot), hence this call; a reboot
   * is, because the agent reads only the new boot's log. Returns how many faults stopped
   * counting (0 when none did). The GPU serves again only if nothing else is wrong with it.
   * An unknown node or GPU index throws `LLMGW_CONTROL_PLANE_NOT_FOUND`.
   */
  clearGpuFaults(nodeOrHost: string, gpuIndex: number): number {
    const node = this.#requireNode(nodeOrHost);
    const gpu = node.inventory.gpus.find((g) => g.index === gpuIndex);
    if (!gpu) {
      const have = node.inventory.gpus.map((g) => g.index).join(", ");
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_NOT_FOUND",
        `node ${node.record.id} (${node.record.hostname}) has no GPU ${gpuIndex}; ${
          have ? `its GPUs: ${have}` : "it has no GPUs"
        }`,
      );
    }
    const own = this.#clearOn(node, gpu, () => true);
    // A node-wide fault (an Xid 79, a fatal SXid: the agent attaches it to every GPU) is one
    // fault: clearing it on one GPU clears it on the node's other GPUs too.
    const nodeWide = new Set(own.faults.filter((f) => isNodeWideFault(f)).map(gpuFaultKey));
    const others =
      nodeWide.size === 0
        ? []
        : node.inventory.gpus
            .filter((g) => g.index !== gpuIndex)
            .map((g) => this.#clearOn(node, g, (f) => nodeWide.has(gpuFaultKey(f))))
            .filter((r) => r.counting.length > 0);
    const alsoOn =
      others.length === 0 ? "" : ` (also on GPU ${others.map((r) => r.gpu.index).join(", ")})`;
    const { counting, after } = own;
    const still = after.healthy
      ? ""
      : `; it stays unhealthy: ${after.lost ? "the GPU is lost" : (after.problems[0]?.message ?? "faults remain")}`;
    this.events.record(
      "gpu.fault_cleared",
      node.record.id,
      `GPU ${gpuIndex} (${gpu.uuid}) on ${node.record.hostname}: ${
        counting.length === 0
          ? "no fault was counting"
          : `${counting.length} fault${counting.length === 1 ? "" : "s"} cleared by an operator (${counting
              .map(faultName)
              .join(", ")})${alsoOn}`
      }; a record seen after this counts again${still}`,
      "info",
    );
    const changed = [own, ...others].filter((r) => r.before.healthy !== r.after.healthy);
    for (const r of changed) this.#gpuHealthEvent(node, r.gpu, r.after);
    if (changed.length > 0) this.#reconcile(`GPU ${gpuIndex} on ${node.record.id} cleared`);
    else this.#touch();
    return counting.length;
  }

  /** Records a clear of `gpu`'s faults that `which` selects; store first, then memory. */
  #clearOn(node: LiveNode, gpu: Gpu, which: (f: GpuFault) => boolean) {
    const reading = node.readings.get(gpu.index);
    const faults = ((reading ?? gpu).faults ?? []).filter(which);
    const prior = this.#faults.cleared(gpu.uuid);
    const before = this.#faults.verdict(gpu, reading);
    const counting = faults.filter((f) => faultCounts(f, prior));
    // Store first (in `clear`): a refused write changes nothing.
    this.#faults.clear(node.record.id, gpu, faults, this.#o.clock.now());
    node.healthVersion++;
    return { gpu, faults, counting, before, after: this.#faults.verdict(gpu, reading) };
  }

  /** Forgets a node and revokes its credential; its replicas are rescheduled. */
  revokeNode(nodeOrHost: string): void {
    const node = this.#requireNode(nodeOrHost);
    this.#updateNodeRecord(node, { revoked: true });
    this.#nodes.delete(node.record.id);
    this.#revokedIds.add(node.record.id);
    this.#failing.nodeGone(node.record.id);
    this.#desiredChanged(node.record.id);
    this.#routingChange();
    this.events.record(
      "node.revoked",
      node.record.id,
      `${node.record.hostname} revoked; it must join again with the join token`,
      "warning",
    );
    this.#reconcile(`node ${node.record.id} revoked`);
  }

  #updateNodeRecord(
    node: LiveNode,
    patch: Partial<
      Pick<NodeRecord, "cordoned" | "draining" | "revoked" | "resetUntilMs" | "drainedBy">
    >,
  ): void {
    const record = { ...node.record, ...patch };
    // Store first: a refused write changes nothing.
    this.#o.store.putNode(record);
    node.record = record;
  }

  /** Placed ranks by node id, built once per listing instead of once per node. */
  #placedByNode(): Map<string, PlacedRankInfo[]> {
    const byNode = new Map<string, PlacedRankInfo[]>();
    for (const p of this.#placements.values()) {
      for (const r of p.ranks) {
        const list = byNode.get(r.nodeId) ?? [];
        list.push(this.#placedRank(p, r));
        byNode.set(r.nodeId, list);
      }
    }
    return byNode;
  }

  #nodeView(n: LiveNode, placedByNode?: ReadonlyMap<string, PlacedRankInfo[]>): NodeInfo {
    const placed = placedByNode
      ? (placedByNode.get(n.record.id) ?? [])
      : [...this.#placements.values()].flatMap((p) =>
          p.ranks.filter((r) => r.nodeId === n.record.id).map((r) => this.#placedRank(p, r)),
        );
    return {
      nodeId: n.record.id,
      hostname: n.record.hostname,
      state: n.state,
      cordoned: n.record.cordoned,
      draining: n.record.draining,
      inventory: n.inventory,
      gpuReadings: [...n.readings.values()].map((r) => this.#readingView(n, r)),
      ...(n.lastHeartbeatMs === undefined ? {} : { lastHeartbeatMs: n.lastHeartbeatMs }),
      registeredAtMs: n.record.registeredAtMs,
      advertiseAddress: n.record.advertiseAddress,
      problems: n.problems,
      placed,
    };
  }

  /**
   * A reading as the admin API shows it: `healthy` is the control plane's verdict (faults an
   * operator cleared no longer count), and cleared faults are left out of `faults`.
   */
  #readingView(n: LiveNode, r: GpuReading): GpuReading {
    const gpu = inventoryGpu(n.inventory, r.index);
    if (!gpu) return r;
    const all = r.faults ?? [];
    const cleared = this.#faults.cleared(gpu.uuid);
    const verdict = this.#faults.verdict(gpu, r);
    const faults = all.filter((f) => !faultCleared(f, cleared));
    if (verdict.healthy === r.healthy && faults.length === all.length) return r;
    // The agent's fault problem stands for faults; once none counts, it says nothing true.
    const healthProblems =
      verdict.faults.length > 0 || all.length === 0
        ? r.healthProblems
        : r.healthProblems.filter((p) => p.code !== GPU_FAULT_PROBLEM);
    return { ...r, healthy: verdict.healthy, faults, healthProblems };
  }

  // ---------------------------------------------------------------- reconciler

  /**
   * The scheduler's view of each node, rebuilt only when something it reads changed (state,
   * flags, inventory, a GPU's verdict, a fabric's trouble): the scheduler caches what it
   * derives per node object, so a reconcile after one node's event re-derives one node.
   */
  readonly #schedulerNodeCache = new Map<
    string,
    {
      readonly inventory: NodeInventory;
      readonly healthVersion: number;
      readonly node: SchedulerNode;
    }
  >();

  readonly #schedulerNodeParts = new SchedulerNodes();

  #schedulerNodes(): SchedulerNode[] {
    const out: SchedulerNode[] = [];
    for (const n of this.#nodes.values()) {
      const node = this.#schedulerNodeOf(n);
      if (node !== undefined) out.push(node);
    }
    if (this.#schedulerNodeCache.size > this.#nodes.size) {
      for (const id of this.#schedulerNodeCache.keys())
        if (!this.#nodes.has(id)) this.#schedulerNodeCache.delete(id);
    }
    return out;
  }

  /** Inventories already announced as unschedulable ({@link Cluster.#schedulerNodeOf}). */
  readonly #unschedulableInventories = new WeakSet<NodeInventory>();

  /**
   * The scheduler's view of `n`, from the cache while nothing it reads has changed; undefined
   * for a node whose GPU list the scheduler would refuse (stored before Register checked it):
   * left out of the scheduler's input, as a node that is gone (its replicas there go), rather
   * than failing every reconcile for every deployment. Announced once per inventory with a
   * `node.unschedulable` event.
   */
  #schedulerNodeOf(n: LiveNode): SchedulerNode | undefined {
    const cached = this.#schedulerNodeCache.get(n.record.id);
    if (
      cached?.inventory === n.inventory &&
      cached.healthVersion === n.healthVersion &&
      cached.node.state === n.state &&
      cached.node.cordoned === n.record.cordoned &&
      cached.node.draining === n.record.draining
    )
      return cached.node;
    const problem = gpuIndexProblem(n.inventory.gpus, "inventory.gpus");
    if (problem !== undefined) {
      if (!this.#unschedulableInventories.has(n.inventory)) {
        this.#unschedulableInventories.add(n.inventory);
        this.events.record(
          "node.unschedulable",
          n.record.id,
          `${n.record.hostname} is left out of scheduling: ${problem}; its agent must register again with a valid inventory`,
          "error",
        );
      }
      return undefined;
    }
    const node = this.#schedulerNodeParts.build({
      id: n.record.id,
      state: n.state,
      cordoned: n.record.cordoned,
      draining: n.record.draining,
      inventory: n.inventory,
      healthy: n.inventory.gpus.map(
        (g) => this.#faults.verdict(g, n.readings.get(g.index)).healthy,
      ),
      trouble: troubledFabrics(n.ports),
    });
    this.#schedulerNodeCache.set(n.record.id, {
      inventory: n.inventory,
      healthVersion: n.healthVersion,
      node,
    });
    return node;
  }

  /** Reconciles now, or once soon for every request made until then (see `defer`). */
  #requestReconcile(cause: string): void {
    const defer = this.#o.defer;
    if (!defer) {
      this.#reconcile(cause);
      return;
    }
    if (this.#reconcilePending) {
      this.#reconcilePending.push(cause);
      return;
    }
    this.#reconcilePending = [cause];
    defer(() => {
      const causes = this.#reconcilePending ?? [];
      this.#reconcilePending = undefined;
      try {
        this.#reconcile(
          causes.length === 1 ? (causes[0] as string) : `${causes.length} agent changes`,
        );
      } catch (error) {
        // Nothing awaits a deferred run; the next change or tick reconciles again.
        this.#o.log?.(`reconcile failed: ${(error as Error).message}`);
      }
    });
  }

  /** Runs the scheduler and applies the plan; then refreshes every node's desired set. */
  #reconcile(cause: string, opts: { quietIfUnchanged?: boolean } = {}): void {
    const started = performance.now();
    this.#plan(cause, opts);
    this.#o.onReconciled?.(performance.now() - started);
  }

  #plan(cause: string, opts: { quietIfUnchanged?: boolean }): void {
    const now = this.#o.clock.now();
    this.#rollBackRollouts(now);
    const specs = new Map<string, DeploymentSpec>();
    const frozen = new Set<string>();
    for (const [name, d] of this.#deployments) {
      specs.set(name, d.spec);
      if (this.#refused.has(d.spec)) frozen.add(name);
    }
    const due = this.#failing.due(now, (id) => this.#movable(id));
    const avoid = this.#failing.avoided(now);
    for (const d of due) {
      const deployment = this.#placements.get(d.replicaId)?.deployment as string;
      for (const nodeId of d.nodes) avoid.push({ deployment, nodeId });
    }
    const plan = planReconcile({
      deployments: specs,
      specOf: (name, revision) => this.#revisions.get(name)?.get(revision),
      placements: [...this.#placements.values()],
      nodes: this.#schedulerNodes(),
      condition: (id) => this.#condition(id),
      drained: (id) => this.#drained(id),
      schedule: this.#o.schedule,
      nowMs: now,
      failing: due.map((d) => ({ replicaId: d.replicaId, message: this.#moveMessage(d) })),
      avoid,
      frozen,
    });
    this.#failing.offered(due);
    // Sequential: a port given to one new replica is taken for the next on the same node.
    const added: PlacementRecord[] = [];
    for (const p of plan.add) added.push(this.#withRendezvous(p, added));
    const removed: string[] = [];
    const put: PlacementRecord[] = [];
    // Events name how many requests were cut: read before the reports are dropped.
    const cut = new Map<string, number | undefined>();
    for (const r of plan.remove) {
      if (r.kind === "drain-timeout") cut.set(r.placement.replicaId, this.#inFlightOf(r.placement));
      this.#placements.delete(r.placement.replicaId);
      this.#retiring.delete(r.placement.replicaId);
      this.#indexServing(r.placement, false);
      this.#engineKeys.delete(r.placement.replicaId);
      removed.push(r.placement.replicaId);
      this.#retireStatuses(r.placement);
      for (const rank of r.placement.ranks) this.#desiredDirty.add(rank.nodeId);
      if (r.reason.code === "replica-failed") {
        const nodes = due.find((d) => d.replicaId === r.placement.replicaId)?.nodes ?? [];
        this.#failing.moved(r.placement.deployment, nodes, now);
      }
      this.#failing.forget(r.placement.replicaId);
    }
    const stepped: { before: PlacementRecord | undefined; after: PlacementRecord }[] = [];
    for (const p of plan.changed) {
      const before = this.#placements.get(p.replicaId);
      this.#placements.set(p.replicaId, p);
      if (p.retirement !== undefined) this.#retiring.add(p.replicaId);
      put.push(p);
      if (p.retirement !== undefined && p.retirement.phase !== before?.retirement?.phase)
        stepped.push({ before, after: p });
    }
    for (const p of added) {
      this.#placements.set(p.replicaId, p);
      this.#indexServing(p, true);
      put.push(p);
    }
    for (const id of removed) {
      this.#loads.forget(id);
    }
    if (removed.length + put.length > 0) this.#routingChange();
    for (const p of put) for (const rank of p.ranks) this.#desiredDirty.add(rank.nodeId);
    this.#savePlacements(removed, put);
    this.#saveStatuses(
      [],
      removed.map((id) => [id, undefined]),
    );
    this.#recordLifecycle(plan, added, stepped, cut);
    for (const name of this.#deployments.keys()) {
      const before = this.#unschedulable.get(name);
      const after = plan.unschedulable.get(name);
      const key = (u: typeof after) =>
        u ? `${u.missing}|${u.reasons.map((r) => r.message).join(";")}` : "";
      if (key(before) === key(after)) continue;
      if (after) {
        this.#unschedulable.set(name, after);
        this.events.record(
          "deployment.unschedulable",
          name,
          `${after.missing} replica${after.missing === 1 ? "" : "s"} cannot be placed: ${after.reasons.map((r) => r.message).join("; ")}`,
          "warning",
        );
      } else {
        this.#unschedulable.delete(name);
        if (before)
          this.events.record(
            "deployment.schedulable",
            name,
            `every replica of ${name} is placed`,
            "info",
          );
      }
    }
    this.#finishRollouts(now);
    const changed = plan.remove.length + added.length + plan.changed.length > 0;
    if (changed || !opts.quietIfUnchanged)
      this.#o.log?.(
        `reconciled (${cause}): +${added.length} -${plan.remove.length}${
          stepped.length > 0 ? ` ~${stepped.length} leaving` : ""
        }`,
      );
    this.#refreshDesiredSets(now);
    this.#touch();
  }

  /** Events for a plan's placements, steps of leaving replicas, removals and capacity dips. */
  #recordLifecycle(
    plan: ReturnType<typeof planReconcile>,
    added: readonly PlacementRecord[],
    stepped: readonly { before: PlacementRecord | undefined; after: PlacementRecord }[],
    cut: ReadonlyMap<string, number | undefined>,
  ): void {
    for (const r of plan.remove) {
      const id = r.placement.replicaId;
      if (r.kind === "drained") {
        this.events.record(
          "replica.drained",
          id,
          `drained (nothing in flight): stopping it`,
          "info",
        );
      } else if (r.kind === "drain-timeout") {
        const n = cut.get(id);
        const spec = this.#specOf(r.placement);
        const seconds = spec === undefined ? "?" : rolloutLimits(spec).drainTimeoutMs / 1000;
        this.events.record(
          "replica.drain-timeout",
          id,
          `drain timed out after ${seconds}s with ${n === undefined ? "an unknown number of" : n} request(s) in flight: stopping it anyway`,
          "warning",
        );
      } else {
        this.events.record(
          "replica.removed",
          id,
          r.reason.message,
          r.kind === "lost" ? "warning" : "info",
        );
      }
    }
    for (const { after } of stepped) {
      const r = after.retirement;
      if (r === undefined) continue;
      if (r.phase === "waiting") {
        this.events.record(
          "replica.retiring",
          after.replicaId,
          `keeps serving until its replacement is ready: ${r.message}`,
          "info",
        );
      } else {
        const seconds = Math.round(((r.deadlineMs ?? 0) - (r.drainingSinceMs ?? 0)) / 1000);
        this.events.record(
          "replica.draining",
          after.replicaId,
          `draining (no new requests; stopped once none is in flight, within ${seconds}s): ${r.message}`,
          "info",
        );
      }
    }
    for (const p of added) {
      const where = p.ranks.map((r) => `${r.nodeId}[${r.gpuIndices.join(",")}]`).join(" + ");
      this.events.record(
        "replica.placed",
        p.replicaId,
        `placed on ${where}${p.fabricId ? ` via ${p.fabricId}` : ""}`,
        "info",
      );
    }
    for (const dip of plan.dips) {
      this.events.record("deployment.capacity-dip", dip.deployment, dip.message, "warning");
    }
  }

  /** Where replica `id` stands for leaving (see {@link ReplicaCondition}). */
  #condition(id: string): ReplicaCondition {
    const p = this.#placements.get(id);
    if (p === undefined) return "idle";
    // The replica view's state, without building the view (this runs per leaving replica
    // on every reconcile).
    const state = aggregateRankStates(
      p.ranks.map(
        (r) => this.#nodes.get(r.nodeId)?.statuses.get(statusKey(p.replicaId, r.rank))?.state,
      ),
    );
    switch (state) {
      case "ready":
        if (this.#endpointOf(p) === undefined) return "coming";
        return p.ranks.some((r) => this.#nodes.get(r.nodeId)?.state === "lost")
          ? "idle"
          : "serving";
      case "pending":
      case "starting":
      case "loading":
        return "coming";
      case "failed":
        return "failed";
      default:
        return "idle";
    }
  }

  /**
   * True when replica `id` is failed and serves its deployment's current revision, which this
   * release accepts (a move places the spec on another node).
   */
  #movable(id: string): boolean {
    const p = this.#placements.get(id);
    const spec = p === undefined ? undefined : this.#deployments.get(p.deployment)?.spec;
    return (
      p !== undefined &&
      spec !== undefined &&
      p.retirement === undefined &&
      p.revision === spec.revision &&
      !this.#refused.has(spec) &&
      this.#condition(id) === "failed"
    );
  }

  /** Why a replica that keeps failing moves (the removal's reason, in events). */
  #moveMessage(d: DueReplica): string {
    const p = this.#placements.get(d.replicaId) as PlacementRecord;
    const names = d.nodes.map((id) => this.#nodes.get(id)?.record.hostname ?? id).join(", ");
    const period = this.#failing.periodMs(p.deployment, d.nodes, this.#o.clock.now());
    return `its engine kept failing on ${names} since ${new Date(d.sinceMs).toISOString()} (${this.#failureOf(p)}): moved, and ${p.deployment} avoids ${names} for ${periodText(period)}`;
  }

  #drained(id: string): boolean {
    const r = this.#placements.get(id)?.retirement;
    if (r?.phase !== "draining") return false;
    const load = this.#loads.reported(id)?.load;
    const busy =
      load === undefined || (load.running === undefined && load.waiting === undefined)
        ? undefined
        : (load.running ?? 0) + (load.waiting ?? 0) > 0;
    return this.#drains.drained(id, r.drainingSinceMs ?? 0, busy);
  }

  /** Requests routers still hold on a leaving replica; undefined when none reported it. */
  #inFlightOf(p: PlacementRecord): number | undefined {
    return p.retirement?.phase === "draining" ? this.#drains.inFlight(p.replicaId) : undefined;
  }

  /**
   * A router's report of what it still has in flight on the replicas it holds as draining
   * (`RouterService.ReportInFlight`, or the in-process router). A drain that it completes
   * reconciles soon.
   */
  reportInFlight(routerId: string, report: InFlightReport): void {
    this.#drains.report(routerId, report);
    if (this.#drainsDue()) this.#requestReconcile("replicas drained");
  }

  /** True when a draining replica may stop now (drained, or its deadline passed). */
  #drainsDue(): boolean {
    if (this.#retiring.size === 0) return false;
    const now = this.#o.clock.now();
    for (const id of this.#retiring) {
      const r = this.#placements.get(id)?.retirement;
      if (r?.phase !== "draining") continue;
      if (now >= (r.deadlineMs ?? 0) || this.#drained(id)) return true;
    }
    return false;
  }

  /**
   * A rolling update whose new revision failed, or could not place its replicas for longer
   * than {@link ClusterOptions.rolloutProgressDeadlineMs}, goes back ({@link #rollBack}).
   */
  #rollBackRollouts(now: number): void {
    for (const d of this.#deployments.values()) {
      const rollout = d.record.rollout;
      if (rollout?.state !== "in-progress" || rollout.toRevision !== d.spec.revision) continue;
      // An invalid deployment changes only when an operator applies a spec: a rollback would
      // update it too (its replicas of this revision replaced), on no one's word.
      if (this.#refused.has(d.spec)) continue;
      let failed: PlacementRecord | undefined;
      for (const p of this.#placements.values()) {
        if (p.deployment !== d.spec.name || p.revision !== d.spec.revision) continue;
        if (this.#condition(p.replicaId) === "failed") failed = p;
      }
      if (failed !== undefined) {
        const why = this.#failureOf(failed);
        this.#rollBack(
          d,
          rollout,
          `revision ${d.spec.revision} failed (${failed.replicaId}: ${why})`,
          now,
        );
      } else if (this.#stalledPast(d.spec.name, now)) {
        const unplaced = this.#unschedulable.get(d.spec.name);
        const missing = unplaced?.missing ?? 0;
        const why = unplaced?.reasons.map((r) => r.message).join("; ") ?? "";
        const span = durationText(
          this.#o.rolloutProgressDeadlineMs ?? DEFAULT_ROLLOUT_PROGRESS_DEADLINE_MS,
        );
        this.#rollBack(
          d,
          rollout,
          `revision ${d.spec.revision} could not place ${missing} replica${missing === 1 ? "" : "s"} for ${span} (${why})`,
          now,
        );
      }
    }
  }

  /**
   * Rolls `d` back: it takes the spec of the revision its rollout came from (as a new
   * revision, so that the old replicas keep running untouched and the new ones go), marked
   * rolled back with `cause` and the revisions.
   */
  #rollBack(
    d: LiveDeployment,
    rollout: NonNullable<DeploymentRecord["rollout"]>,
    cause: string,
    now: number,
  ): void {
    const from = this.#revisions.get(d.spec.name)?.get(rollout.fromRevision);
    if (from === undefined) {
      this.#o.log?.(
        `cannot roll ${d.spec.name} back: revision ${rollout.fromRevision} is not kept`,
      );
      return;
    }
    const refused = this.#refused.get(from);
    if (refused !== undefined) {
      // Never back to a spec this release refuses (an older release stored it): that would
      // place it anew. The update stays in progress, its rollout saying why, once.
      const message = `${cause}; not rolled back: the spec of revision ${from.revision} is refused by this release (${refused}); apply a corrected spec`;
      // Counted afresh: a stalled update past its deadline would reconcile at every tick.
      this.#stalled.delete(d.spec.name);
      if (rollout.message === message) return;
      const record: DeploymentRecord = {
        ...d.record,
        rollout: { ...rollout, message, updatedAtMs: now },
      };
      try {
        this.#o.store.putDeployment(record);
      } catch (error) {
        // Shown from memory; the next change of the deployment writes it.
        if (!isStoreFailure(error)) throw error;
      }
      d.record = record;
      this.events.record("deployment.rollback-refused", d.spec.name, message, "error");
      return;
    }
    const revision = d.spec.revision + 1;
    const message = `${cause}; back to the spec of revision ${from.revision} as revision ${revision}`;
    this.#putDeployment(
      { ...from, replicas: d.spec.replicas, revision },
      d.record.createdAtMs,
      now,
      {
        // The update that was rolled back: from the good revision to the new one.
        state: "rolled-back",
        fromRevision: rollout.fromRevision,
        toRevision: d.spec.revision,
        message,
        startedAtMs: rollout.startedAtMs,
        updatedAtMs: now,
      },
    );
    this.events.record("deployment.rolled-back", d.spec.name, message, "error");
  }

  /** True when `name`'s rollout has had unplaced replicas, and no progress, past the deadline. */
  #stalledPast(name: string, now: number): boolean {
    const deadlineMs = this.#o.rolloutProgressDeadlineMs ?? DEFAULT_ROLLOUT_PROGRESS_DEADLINE_MS;
    const stalled = this.#stalled.get(name);
    return (
      deadlineMs > 0 &&
      stalled !== undefined &&
      !stalled.freeing &&
      stalled.revision === this.#deployments.get(name)?.spec.revision &&
      now - stalled.sinceMs >= deadlineMs
    );
  }

  /** A failed replica's status message, for a rollback's reason. */
  #failureOf(p: PlacementRecord): string {
    for (const rank of p.ranks) {
      const status = this.#nodes.get(rank.nodeId)?.statuses.get(statusKey(p.replicaId, rank.rank));
      if (status?.state === "failed") return status.message || "engine failed";
    }
    return "engine failed";
  }

  /**
   * Marks in-progress rollouts complete once every replica runs the current revision, none
   * is leaving and `replicas` of them serve; recomputes which deployments have lifecycle work
   * under way; forgets the revision specs no replica runs (but the one an in-progress rollout
   * came from: a failure of the new revision goes back to it).
   */
  #finishRollouts(now: number): void {
    // One pass over the placements for all three: which deployments have work under way,
    // how many replicas serve their current revision, and which kept revisions replicas
    // still run (only of names with more than the current one).
    const extra = new Map<string, Set<number>>();
    for (const [name, byRevision] of this.#revisions) {
      const current = this.#deployments.get(name)?.spec.revision;
      if (byRevision.size > 1 || !byRevision.has(current ?? -1)) extra.set(name, new Set());
    }
    const active = new Set<string>();
    const serving = new Map<string, number>();
    /** Deployments with a replica of an older revision still placed: what a rollout replaces. */
    const older = new Set<string>();
    /** Placed replicas of the current revision, serving or not. */
    const placed = new Map<string, number>();
    /** Deployments with an older replica draining: room for the new revision is coming. */
    const freeing = new Set<string>();
    for (const p of this.#placements.values()) {
      const d = this.#deployments.get(p.deployment);
      if (d !== undefined && d.spec.revision !== p.revision) {
        older.add(p.deployment);
        if (p.retirement?.phase === "draining") freeing.add(p.deployment);
      }
      if (p.retirement !== undefined || d?.spec.revision !== p.revision) active.add(p.deployment);
      else {
        placed.set(p.deployment, (placed.get(p.deployment) ?? 0) + 1);
        if (d.record.rollout?.state === "in-progress" && this.#condition(p.replicaId) === "serving")
          serving.set(p.deployment, (serving.get(p.deployment) ?? 0) + 1);
      }
      extra.get(p.deployment)?.add(p.revision);
    }
    for (const d of this.#deployments.values()) {
      // Until its new replicas serve, a state change of one (ready, failed) reconciles: it
      // completes the rollout or rolls it back. Replicas the fleet has no room for, once no
      // older one is left to replace and every placed one serves, wait for room, not for the
      // rollout: it is done, as far as it can go (a deployment short of room before the update
      // is no less short after it).
      const name = d.spec.name;
      const up = serving.get(name) ?? 0;
      if (
        d.record.rollout?.state === "in-progress" &&
        up < d.spec.replicas &&
        (up < (placed.get(name) ?? 0) || !this.#unschedulable.has(name))
      )
        active.add(name);
    }
    this.#active = active;
    this.#trackStalled(serving, older, freeing, now);
    for (const d of this.#deployments.values()) {
      const rollout = d.record.rollout;
      if (rollout?.state !== "in-progress") continue;
      if (active.has(d.spec.name)) {
        // A rollback goes back to it.
        extra.get(d.spec.name)?.add(rollout.fromRevision);
        continue;
      }
      const record: DeploymentRecord = {
        ...d.record,
        rollout: {
          ...rollout,
          state: "complete",
          message: this.#unschedulable.has(d.spec.name)
            ? `every placed replica runs revision ${rollout.toRevision}; ${this.#unschedulable.get(d.spec.name)?.missing ?? 0} cannot be placed`
            : `every replica runs revision ${rollout.toRevision}`,
          updatedAtMs: now,
        },
      };
      try {
        this.#o.store.putDeployment(record);
      } catch (error) {
        // Shown from memory; the next change of the deployment writes it.
        if (!isStoreFailure(error)) throw error;
      }
      d.record = record;
      this.events.record(
        "deployment.rollout",
        d.spec.name,
        `rollout from revision ${rollout.fromRevision} to ${rollout.toRevision} complete`,
        "info",
      );
    }
    this.#pruneRevisions(extra);
  }

  /**
   * Starts, restarts or ends the progress count of each in-progress rollout
   * ({@link #stalled}) from the plan's unplaced replicas and the new revision's serving ones.
   * Only while replicas of an older revision are still placed (`older`): once none is, going
   * back would place no more than going on. While one of them drains (`freeing`: a dip, or
   * one `maxUnavailable` lets go) there is no count, and it starts over when the drain ends:
   * room is coming, as slowly as its engine finishes what it runs (at most its
   * `drainTimeoutSeconds`, which may be longer than the deadline), and a rollback meanwhile
   * would undo the update for want of room that is on its way.
   */
  #trackStalled(
    serving: ReadonlyMap<string, number>,
    older: ReadonlySet<string>,
    freeing: ReadonlySet<string>,
    now: number,
  ): void {
    for (const d of this.#deployments.values()) {
      const name = d.spec.name;
      const rollout = d.record.rollout;
      if (
        rollout?.state !== "in-progress" ||
        rollout.toRevision !== d.spec.revision ||
        !this.#unschedulable.has(name) ||
        !older.has(name)
      ) {
        this.#stalled.delete(name);
        continue;
      }
      const count = serving.get(name) ?? 0;
      const stalled = this.#stalled.get(name);
      const draining = freeing.has(name);
      if (
        stalled === undefined ||
        stalled.revision !== d.spec.revision ||
        count > stalled.serving ||
        draining ||
        stalled.freeing
      )
        this.#stalled.set(name, {
          revision: d.spec.revision,
          sinceMs: now,
          serving: count,
          freeing: draining,
        });
      else stalled.serving = count;
    }
  }

  /**
   * Forgets revision specs no replica runs any more (the current ones stay), of the names in
   * `used` (name → revisions its replicas run).
   */
  #pruneRevisions(used: ReadonlyMap<string, ReadonlySet<number>>): void {
    for (const [name, running] of used) {
      const byRevision = this.#revisions.get(name);
      if (byRevision === undefined) continue;
      const current = this.#deployments.get(name)?.spec.revision;
      for (const revision of byRevision.keys()) {
        if (revision === current || running.has(revision)) continue;
        try {
          this.#o.store.deleteDeploymentRevision(name, revision);
        } catch (error) {
          // Kept in the store: harmless, pruned again at the next reconcile.
          if (!isStoreFailure(error)) throw error;
          continue;
        }
        byRevision.delete(revision);
      }
      if (byRevision.size === 0) this.#revisions.delete(name);
    }
  }

  /**
   * Writes a reconcile's placement changes. The placements in memory are what nodes and
   * routers follow, so a store that fails (a full disk) does not undo them: the failure is
   * logged and every placement is written again once the store takes writes ({@link tick}).
   */
  #savePlacements(removed: readonly string[], put: readonly PlacementRecord[]): void {
    if (this.#placementsUnsaved) {
      this.#resavePlacements();
      return;
    }
    if (removed.length + put.length === 0) return;
    try {
      this.#o.store.transaction(() => {
        for (const id of removed) this.#o.store.deletePlacement(id);
        for (const p of put) this.#o.store.putPlacement(p);
      });
    } catch (error) {
      if (!isStoreFailure(error)) throw error;
      this.#placementsUnsaved = true;
      this.#o.log?.(
        `placements kept in memory only, retried every tick until the store takes writes: ${(error as Error).message}`,
      );
    }
  }

  /** Makes the stored placements equal to those in memory; true when that worked. */
  #resavePlacements(): boolean {
    try {
      this.#o.store.transaction(() => {
        for (const p of this.#o.store.listPlacements()) {
          if (!this.#placements.has(p.replicaId)) this.#o.store.deletePlacement(p.replicaId);
        }
        for (const p of this.#placements.values()) this.#o.store.putPlacement(p);
      });
    } catch (error) {
      if (!isStoreFailure(error)) throw error;
      return false;
    }
    this.#placementsUnsaved = false;
    this.#o.log?.(`placements written to the state store again (${this.#placements.size})`);
    return true;
  }

  /** `p` with a rendezvous port free on its rank 0 node among current and `alsoPlaced`. */
  #withRendezvous(p: PlacementRecord, alsoPlaced: readonly PlacementRecord[]): PlacementRecord {
    if (p.ranks.length < 2) return p;
    const rank0 = p.ranks[0]?.nodeId;
    const used = new Set(
      [...this.#placements.values(), ...alsoPlaced]
        .filter((q) => q.ranks[0]?.nodeId === rank0 && q.rendezvousPort !== undefined)
        .map((q) => q.rendezvousPort),
    );
    for (let port = this.#o.rendezvousPortMin; port <= this.#o.rendezvousPortMax; port++) {
      if (!used.has(port)) return { ...p, rendezvousPort: port };
    }
    return p;
  }

  #refreshDesiredSets(now: number): void {
    const all = this.#desiredAllDirty;
    const dirty = this.#desiredDirty;
    this.#desiredAllDirty = false;
    this.#desiredDirty = new Set();
    if (!all && dirty.size === 0) return;
    const byNode = new Map<string, { p: PlacementRecord; rank: PlacementRankRecord }[]>();
    for (const p of this.#placements.values()) {
      if (this.#specOf(p) === undefined) continue;
      for (const rank of p.ranks) {
        if (!all && !dirty.has(rank.nodeId)) continue;
        if (!this.#nodes.has(rank.nodeId)) continue;
        const list = byNode.get(rank.nodeId);
        if (list) list.push({ p, rank });
        else byNode.set(rank.nodeId, [{ p, rank }]);
      }
    }
    for (const node of all ? this.#nodes.values() : nodesIn(this.#nodes, dirty)) {
      const entries = (byNode.get(node.record.id) ?? []).sort(
        (a, b) => a.p.replicaId.localeCompare(b.p.replicaId) || a.rank.rank - b.rank.rank,
      );
      const specs = entries.map(({ p }) => this.#specOf(p) as DeploymentSpec);
      const rank0Address = (p: PlacementRecord) =>
        this.#nodes.get(p.ranks[0]?.nodeId ?? "")?.record.advertiseAddress ?? "";
      const fingerprint = entries
        .map(
          ({ p, rank }, i) =>
            `${p.replicaId}/${rank.rank}/${specs[i]?.revision}/${rank.gpuIndices.join(",")}/${rank0Address(p)}:${p.rendezvousPort ?? 0}`,
        )
        .join(";");
      // The messages are rebuilt only when something they carry changed: the fingerprint, a
      // spec object (a scale keeps the revision) or the inventory (GPU uuids); and only when
      // asked for (the node's next answer), not for every node a full re-plan touched.
      const from = node.assignmentsFrom;
      if (
        from === undefined ||
        from.fingerprint !== fingerprint ||
        from.inventory !== node.inventory ||
        from.specs.length !== specs.length ||
        from.specs.some((spec, i) => spec !== specs[i])
      ) {
        node.assignments = undefined;
        node.assignmentsFrom = { fingerprint, inventory: node.inventory, specs, entries };
      }
      if (fingerprint !== node.fingerprint) {
        node.fingerprint = fingerprint;
        node.generation = node.generation + 1n > BigInt(now) ? node.generation + 1n : BigInt(now);
        this.#desiredChanged(node.record.id);
      }
    }
  }

  /** `node`'s assignments as messages, built on first use after they changed. */
  #assignmentsOf(node: LiveNode): readonly Assignment[] {
    if (node.assignments !== undefined) return node.assignments;
    const from = node.assignmentsFrom;
    const rank0Address = (p: PlacementRecord) =>
      this.#nodes.get(p.ranks[0]?.nodeId ?? "")?.record.advertiseAddress ?? "";
    const built = (from?.entries ?? []).map(
      ({ p, rank }, i): Assignment => ({
        replicaId: p.replicaId,
        spec: from?.specs[i] as DeploymentSpec,
        rank: rank.rank,
        world: {
          nnodes: p.ranks.length,
          rank0Address: rank0Address(p),
          rendezvousPort: p.rendezvousPort ?? 0,
          nodeIds: p.ranks.map((k) => k.nodeId),
        },
        gpuIndices: rank.gpuIndices,
        gpuUuids: rank.gpuIndices.map(
          (gi) => from?.inventory.gpus.find((g) => g.index === gi)?.uuid ?? "",
        ),
        ...(p.fabricId ? { fabricId: p.fabricId } : {}),
      }),
    );
    node.assignments = built;
    return built;
  }

  /**
   * Calls `listener` (synchronously, so it should only schedule work) whenever what
   * {@link desiredSet} returns for `nodeId` may have changed: a new generation, the node
   * registered again (a new credential) or revoked. Returns an unsubscribe function.
   */
  onDesiredChange(nodeId: string, listener: () => void): () => void {
    let set = this.#desiredListeners.get(nodeId);
    if (!set) {
      set = new Set();
      this.#desiredListeners.set(nodeId, set);
    }
    set.add(listener);
    return () => {
      set.delete(listener);
      if (set.size === 0 && this.#desiredListeners.get(nodeId) === set) {
        this.#desiredListeners.delete(nodeId);
      }
    };
  }

  #desiredChanged(nodeId: string): void {
    const set = this.#desiredListeners.get(nodeId);
    if (set) for (const l of [...set]) l();
  }

  /**
   * Applies a `ReportLoad` from `nodeId` (the caller checked its credential and bounds): the
   * load of each replica whose rank 0 is placed on `nodeId`, stamped with the control plane's
   * clock now, as heartbeat load is. One clock stamps every sample: an agent clock behind by
   * more than its report interval would otherwise lose every report to the last heartbeat's
   * load, and one ahead would keep dead load fresh. Reports for replicas served by another
   * node are ignored (a node never sets another's load), and so are unknown ids (the replica
   * may have just been removed), and so is a report scraped before the newest one taken from
   * the node for that replica (one held up on a slower connection: a call sent while the
   * stream was backed up, a rotated stream's tail). Updates what {@link readyReplicas} and
   * {@link routingMembership} read and fires {@link onLoad}; never bumps {@link version} or
   * {@link routingVersion}, never reconciles.
   */
  reportLoad(nodeId: string, reports: readonly ReplicaLoadReportInput[]): void {
    const atMs = this.#o.clock.now();
    for (const r of reports) {
      if (this.#placements.get(r.replicaId)?.ranks[0]?.nodeId !== nodeId) continue;
      this.#loads.apply(nodeId, r.replicaId, r.load, atMs, r.scrapedAtMs);
    }
  }

  // ---------------------------------------------------------------- readers

  /** The cluster's clock (epoch ms): what times that agents send are judged against. */
  now(): number {
    return this.#o.clock.now();
  }

  /** The node's current desired set (what its next heartbeat will receive). */
  desiredSet(nodeId: string): DesiredSet {
    const node = this.#requireNode(nodeId);
    return {
      generation: node.generation,
      assignments: this.#assignmentsOf(node),
      heartbeatIntervalMs: this.#o.heartbeatIntervalMs,
    };
  }

  /** Lifecycle state of a node by id or hostname. */
  nodeState(nodeOrHost: string): NodeState {
    return this.#requireNode(nodeOrHost).state;
  }

  /** Bumped on every change; lets readers cache derived views. */
  get version(): number {
    return this.#version;
  }

  /** Calls `listener` after every change (synchronously). Returns an unsubscribe function. */
  onChange(listener: ChangeListener): () => void {
    this.#changeListeners.add(listener);
    return () => this.#changeListeners.delete(listener);
  }

  #touch(): void {
    this.#version++;
    for (const l of this.#changeListeners) l();
    this.#flushRouting();
  }

  /**
   * Bumped only when the routing membership may have changed (deployments, placements, a
   * replica rank's state or API port, a node lost or back, an advertise address, API keys,
   * engine keys); never by load, readings or problems alone. At most once per operation.
   */
  get routingVersion(): number {
    return this.#routingVersion;
  }

  /** Called synchronously after each {@link routingVersion} bump. Returns an unsubscribe function. */
  onRoutingChange(listener: () => void): () => void {
    this.#routingListeners.add(listener);
    return () => this.#routingListeners.delete(listener);
  }

  /**
   * Called with each load report of a replica's rank 0 (heartbeat or {@link reportLoad})
   * whose load changed, and with one that repeats a known load last announced
   * {@link LOAD_REFRESH_MS} or longer before. A sample with no field says the load became
   * unknown. Returns an unsubscribe function.
   */
  onLoad(listener: (sample: ReplicaLoadSample) => void): () => void {
    return this.#loads.onLoad(listener);
  }

  /**
   * Something routers route by changed: caches rebuild now, listeners hear at the flush.
   * "keys": only API key grants did, so replicas and models stay as built.
   */
  #routingChange(what: "keys" | "membership" = "membership"): void {
    if (what === "keys") this.#keyMarks++;
    else this.#routingMarks++;
    this.#routingDirty = true;
  }

  /**
   * Bumped when anything routers route by but the API key grants may have changed: a reader
   * that saw this value before needs only {@link routingKeys} again. Moves with
   * {@link routingVersion}'s bumps, never alone.
   */
  get routingTopologyVersion(): number {
    return this.#routingMarks;
  }

  #flushRouting(): void {
    if (!this.#routingDirty) return;
    this.#routingDirty = false;
    this.#routingVersion++;
    for (const l of this.#routingListeners) l();
  }

  /** Served model names with at least one ready replica (for `GET /v1/models`). */
  readyModels(): string[] {
    const models = new Set<string>();
    for (const d of this.#deployments.values()) {
      if (this.readyReplicas(d.spec.servedModelName).length > 0) models.add(d.spec.servedModelName);
    }
    return [...models].sort();
  }

  /**
   * Ready replicas serving `model` (by served model name), with endpoint and load signals.
   * Cached until the routing membership changes, so the router may call it per request; each
   * replica's `load` object is refreshed in place as load arrives. Treat the returned array
   * as read-only.
   */
  readyReplicas(model: string): RoutableReplica[] {
    this.#refreshRoutable();
    let cached = this.#routable.get(model);
    if (!cached) {
      cached = this.#computeReadyReplicas(model);
      this.#routable.set(model, cached);
    }
    return cached;
  }

  #computeReadyReplicas(model: string): RoutableReplica[] {
    const out: RoutableReplica[] = [];
    for (const d of this.#deployments.values()) {
      if (d.spec.servedModelName !== model) continue;
      for (const p of this.#placements.values()) {
        if (p.deployment !== d.spec.name || p.retirement?.phase === "draining") continue;
        const view = this.#replicaView(p);
        if (view.state !== "ready" || view.endpoint === undefined) continue;
        if (p.ranks.some((r) => this.#nodes.get(r.nodeId)?.state === "lost")) continue;
        const apiKey = this.#engineKeys.get(p.replicaId);
        const kvEventsUrl = d.spec.kvEvents ? this.#kvEventsUrlOf(p) : undefined;
        out.push({
          replicaId: p.replicaId,
          deployment: d.spec.name,
          model,
          endpoint: view.endpoint,
          state: "ready",
          load: this.#loads.held(p.replicaId).load,
          routingPolicy: d.spec.routingPolicy,
          capacity: d.spec.maxConcurrencyPerReplica ?? DEFAULT_REPLICA_CAPACITY,
          ...(apiKey === undefined ? {} : { apiKey }),
          ...(kvEventsUrl === undefined ? {} : { kvEventsUrl }),
        });
      }
    }
    return out.sort((a, b) => a.replicaId.localeCompare(b.replicaId));
  }

  /** Drops the routing caches when the membership changed since they were built. */
  #refreshRoutable(): void {
    if (this.#routableVersion === this.#routingMarks) return;
    this.#routable.clear();
    this.#membership = undefined;
    this.#routableVersion = this.#routingMarks;
  }

  /**
   * What routers route by, now: every deployment's served model (also those with no ready
   * replica, so routers answer "loading" or "no ready replica" rather than "unknown model";
   * where deployments share a served name, the first by name speaks for it), the replicas
   * that take traffic by the {@link readyReplicas} rule with their capacity, engine key when
   * known and last load with `loadReportedAtMs` when reported, and the grants of non-revoked
   * API keys (their stored hash and cluster-wide limits; never a secret). Built once per
   * membership change; load is added per call. Models by name, replicas by id, keys oldest
   * first (as {@link listApiKeys}).
   */
  routingMembership(): RoutingMembership {
    this.#refreshRoutable();
    this.#membership ??= this.#buildMembership();
    const base = this.#membership;
    return {
      models: [...base.models],
      replicas: base.replicas.map((r) => {
        const held = this.#loads.reported(r.id);
        if (held === undefined || !knownLoad(held.load)) return r;
        return { ...r, load: copyLoad(held.load), loadReportedAtMs: held.reportedAtMs };
      }),
      keys: [...this.routingKeys()],
      tenants: [...this.routingTenants()],
    };
  }

  /**
   * The API key grants of {@link routingMembership} alone, built once per key change (an
   * admin creating keys must not cost a walk over every replica). Treat as read-only.
   */
  routingKeys(): readonly KeyGrant[] {
    if (this.#membershipKeys?.marks !== this.#keyMarks) {
      this.#membershipKeys = { marks: this.#keyMarks, keys: this.apiKeys.grants() };
    }
    return this.#membershipKeys.keys;
  }

  /** The tenant grants of {@link routingMembership} alone, by name. Treat as read-only. */
  routingTenants(): readonly TenantGrant[] {
    if (this.#membershipTenants?.marks !== this.#keyMarks) {
      this.#membershipTenants = { marks: this.#keyMarks, tenants: this.tenants.grants() };
    }
    return this.#membershipTenants.tenants;
  }

  /** GPUs a placement holds, all ranks together (a request's GPU-seconds are a share of these). */
  #gpusOf(replicaId: string): number | undefined {
    const p = this.#placements.get(replicaId);
    if (p === undefined) return undefined;
    let gpus = 0;
    for (const r of p.ranks) gpus += r.gpuIndices.length;
    return gpus > 0 ? gpus : undefined;
  }

  /**
   * How the engines behind served model `name` keep a request's cache apart: `spec`'s engine's
   * way, unless a ready replica runs an engine that isolates another way (a rolling update from
   * vLLM to llama.cpp, or two deployments of one name): then none is said, and routers send
   * both the salt and `cache_prompt: false`, which every engine takes.
   */
  #cacheIsolationOf(name: string, spec: DeploymentSpec): { cacheIsolation?: EngineCacheIsolation } {
    const mode = CACHE_ISOLATION_OF[spec.engine];
    for (const r of this.readyReplicas(name)) {
      const p = this.#placements.get(r.replicaId);
      const runs = p === undefined ? undefined : this.#specOf(p);
      if (runs !== undefined && CACHE_ISOLATION_OF[runs.engine] !== mode) return {};
    }
    return { cacheIsolation: mode };
  }

  #buildMembership(): Omit<RoutingMembership, "keys" | "tenants"> {
    const byModel = new Map<string, DeploymentSpec>();
    for (const name of [...this.#deployments.keys()].sort()) {
      const spec = (this.#deployments.get(name) as LiveDeployment).spec;
      if (!byModel.has(spec.servedModelName)) byModel.set(spec.servedModelName, spec);
    }
    const models: RoutedModel[] = [];
    const replicas: RoutedReplica[] = [];
    for (const [name, spec] of [...byModel].sort(([a], [b]) => a.localeCompare(b))) {
      const tokenizer = spec.kvEvents ? TOKENIZER_OF[spec.engine] : undefined;
      models.push({
        name,
        deployment: spec.name,
        policy: spec.routingPolicy,
        loading: this.hasLoadingReplicas(name),
        ...(tokenizer === undefined ? {} : { tokenizer }),
        ...(schedulesByPriority(spec) ? { enginePriority: true } : {}),
        ...this.#cacheIsolationOf(name, spec),
      });
      for (const r of this.readyReplicas(name)) {
        const gpus = this.#gpusOf(r.replicaId);
        replicas.push({
          id: r.replicaId,
          model: name,
          deployment: r.deployment,
          baseUrl: `http://${r.endpoint}`,
          state: "ready",
          capacity: r.capacity,
          ...(r.apiKey === undefined ? {} : { apiKey: r.apiKey }),
          ...(r.kvEventsUrl === undefined ? {} : { kvEventsUrl: r.kvEventsUrl }),
          ...(gpus === undefined ? {} : { gpus }),
        });
      }
    }
    // Draining replicas stay listed, taking no new requests, so that routers finish (and
    // report) what they have in flight on them; also those of a deleted deployment, whose
    // model is gone.
    for (const id of this.#retiring) {
      const p = this.#placements.get(id);
      const spec = p === undefined ? undefined : this.#specOf(p);
      if (p?.retirement?.phase !== "draining" || spec === undefined) continue;
      const endpoint = this.#endpointOf(p);
      if (endpoint === undefined) continue;
      if (p.ranks.some((r) => this.#nodes.get(r.nodeId)?.state === "lost")) continue;
      const apiKey = this.#engineKeys.get(p.replicaId);
      const gpus = this.#gpusOf(p.replicaId);
      replicas.push({
        id: p.replicaId,
        model: spec.servedModelName,
        deployment: p.deployment,
        baseUrl: `http://${endpoint}`,
        state: "draining",
        capacity: spec.maxConcurrencyPerReplica ?? DEFAULT_REPLICA_CAPACITY,
        ...(apiKey === undefined ? {} : { apiKey }),
        ...(gpus === undefined ? {} : { gpus }),
      });
    }
    replicas.sort((a, b) => a.id.localeCompare(b.id));
    return { models, replicas };
  }

  /** True when `model` has a replica placed but not ready yet (the router answers "loading"). */
  hasLoadingReplicas(model: string): boolean {
    for (const d of this.#deployments.values()) {
      if (d.spec.servedModelName !== model) continue;
      for (const r of this.#replicasOf(d.spec.name)) {
        if (r.state === "pending" || r.state === "starting" || r.state === "loading") return true;
      }
    }
    return false;
  }

  /** One-screen summary. */
  clusterStatus(): ClusterSummary {
    const nodes = [...this.#nodes.values()];
    const allocated = new Map<string, Set<number>>();
    for (const p of this.#placements.values()) {
      for (const r of p.ranks) {
        const set = allocated.get(r.nodeId) ?? new Set<number>();
        for (const i of r.gpuIndices) set.add(i);
        allocated.set(r.nodeId, set);
      }
    }
    const classes = new Map<
      string,
      { -readonly [K in keyof ClassCapacityInfo]: ClassCapacityInfo[K] }
    >();
    let gpusTotal = 0;
    let gpusAllocated = 0;
    let gpusUnhealthy = 0;
    for (const n of nodes) {
      const fabric = n.inventory.fabrics[0]?.id ?? "";
      for (const g of n.inventory.gpus) {
        const isAllocated = allocated.get(n.record.id)?.has(g.index) ?? false;
        const healthy = this.#faults.verdict(g, n.readings.get(g.index)).healthy;
        gpusTotal++;
        if (isAllocated) gpusAllocated++;
        if (!healthy) gpusUnhealthy++;
        const gpuClass = g.gpuClass ?? "";
        const key = `${gpuClass}|${fabric}`;
        const c = classes.get(key) ?? {
          gpuClass,
          fabricId: fabric,
          total: 0,
          allocated: 0,
          unhealthy: 0,
          free: 0,
        };
        c.total++;
        if (isAllocated) c.allocated++;
        if (!healthy) c.unhealthy++;
        if (!isAllocated && healthy && n.state === "ready" && !n.record.cordoned) c.free++;
        classes.set(key, c);
      }
    }
    const deployments = this.listDeployments();
    const replicas = deployments.flatMap((d) => d.replicas);
    return {
      nodesTotal: nodes.length,
      nodesReady: nodes.filter((n) => n.state === "ready").length,
      gpusTotal,
      gpusAllocated,
      gpusUnhealthy,
      deploymentsTotal: deployments.length,
      deploymentsReady: deployments.filter((d) => d.readyReplicas >= d.desiredReplicas).length,
      replicasTotal: replicas.length,
      replicasReady: replicas.filter((r) => r.state === "ready").length,
      classes: [...classes.values()].sort((a, b) =>
        `${a.gpuClass}${a.fabricId}`.localeCompare(`${b.gpuClass}${b.fabricId}`),
      ),
    };
  }

  /** Plain snapshot of nodes for metrics (see `createClusterView`). */
  nodeSnapshots(): readonly {
    readonly id: string;
    readonly state: NodeState;
    readonly record: NodeRecord;
    readonly inventory: NodeInventory;
    readonly readings: ReadonlyMap<number, GpuReading>;
    readonly lastHeartbeatMs?: number;
    /** The control plane's health verdict of each of `inventory.gpus`, same order. */
    readonly health: readonly GpuHealthVerdict[];
    readonly faultTallies: readonly FaultTally[];
    readonly ports: readonly PortSnapshot[];
  }[] {
    // Called by every /metrics scrape for every node: no intermediate arrays.
    const out = [];
    for (const n of this.#nodes.values()) {
      const health: GpuHealthVerdict[] = [];
      for (const g of n.inventory.gpus)
        health.push(this.#faults.verdict(g, n.readings.get(g.index)));
      out.push({
        id: n.record.id,
        state: n.state,
        record: n.record,
        inventory: n.inventory,
        readings: n.readings,
        lastHeartbeatMs: n.lastHeartbeatMs,
        health,
        faultTallies: this.#faults.tallies(n.record.id),
        ports: n.ports,
      });
    }
    return out;
  }

  /** The cleared faults of a GPU by uuid (fault key → lastSeenUnixMs when cleared). */
  clearedFaults(gpuUuid: string): ClearedFaults {
    return this.#faults.cleared(gpuUuid) ?? new Map();
  }

  /** Current placements (read-only). */
  placements(): readonly PlacementRecord[] {
    return [...this.#placements.values()];
  }

  /** Current deployment specs (read-only). */
  deploymentSpecs(): readonly DeploymentSpec[] {
    return [...this.#deployments.values()].map((d) => d.spec);
  }

  /** Whether a deployment misses replicas, and why. */
  unschedulableReasons(name: string): readonly { code: string; message: string }[] {
    return this.#unschedulable.get(name)?.reasons ?? [];
  }

  /** Why this release refuses deployment `name`'s stored spec; undefined: it does not. */
  invalidReason(name: string): string | undefined {
    const spec = this.#deployments.get(name)?.spec;
    return spec === undefined ? undefined : this.#refused.get(spec);
  }
}

/** `15 minutes`, `1 minute`, `90 seconds`: a window as an operator reads it. */
function formatMinutes(ms: number): string {
  if (ms % 60_000 !== 0) return `${Math.ceil(ms / 1000)} seconds`;
  const minutes = ms / 60_000;
  return `${minutes} minute${minutes === 1 ? "" : "s"}`;
}

/** `ms` as a duration flag reads: `10m`, `1h`, `90s`, `1.5s`. */
function durationText(ms: number): string {
  if (ms > 0 && ms % 3_600_000 === 0) return `${ms / 3_600_000}h`;
  if (ms > 0 && ms % 60_000 === 0) return `${ms / 60_000}m`;
  return `${ms / 1000}s`;
}
