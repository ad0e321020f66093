/*
 * The control plane's state and its read views, in plain types: numbers for times and
 * counts, state names, `undefined` for what nobody reported. Protobuf is the wire's: agents'
 * reports are converted as they arrive (`convert/agent-reports.ts`) and these views as they
 * leave through the admin API (`convert/views.ts`), so that nothing between them depends on
 * how the wire spells a field.
 */
import type { GpuReading, NodeInventory, Problem } from "@llmgw/discovery";
import type { DeploymentSpec } from "@llmgw/engines";
import type { ReplicaLoad } from "@llmgw/router";
import type { RolloutRecord } from "../store/types.js";
import type { NodeState } from "./node-lifecycle.js";
import type { ReplicaStateName } from "./replica-state.js";

/** How an engine process last ended. */
export interface EngineExit {
  readonly code?: number;
  readonly signal?: string;
  readonly timedOut: boolean;
  readonly forced: boolean;
}

/** One rank of a replica as its agent last reported it. */
export interface RankStatus {
  readonly replicaId: string;
  readonly rank: number;
  readonly state: ReplicaStateName;
  /** Since when (agent's clock, ms since the epoch). */
  readonly stateSinceMs: number;
  readonly pid?: number;
  readonly apiPort?: number;
  readonly startedAtMs?: number;
  readonly restarts: number;
  readonly lastExit?: EngineExit;
  /** The engine's last output lines (failed and unhealthy ranks). */
  readonly logTail: readonly string[];
  /** Rank 0's load; undefined: not reported. */
  readonly load?: ReplicaLoad;
  /** When the agent scraped `load` (its clock); undefined: an older agent, or no scrape. */
  readonly loadScrapedAtMs?: number;
  readonly message: string;
  /** Hash of the launch spec the engine runs. */
  readonly specHash: string;
  readonly revision: number;
  /** Found running when the agent started, not launched by it. */
  readonly adopted: boolean;
  /** The agent's port serving this rank's KV-cache blocks; undefined: none. */
  readonly kvEventsPort?: number;
}

/** A code and a sentence: why something is as it is. */
export interface Reason {
  readonly code: string;
  readonly message: string;
}

/** A rank placed on a node, with what its agent last reported. */
export interface PlacedRankInfo {
  readonly replicaId: string;
  readonly deployment: string;
  readonly rank: number;
  readonly nodeId: string;
  readonly gpuIndices: readonly number[];
  readonly status?: RankStatus;
}

/** A replica on its way out: waiting for its replacement, then draining. */
export interface RetirementInfo {
  readonly reason: Reason;
  readonly phase: "waiting" | "draining";
  readonly sinceMs: number;
  readonly drainingSinceMs?: number;
  readonly drainDeadlineMs?: number;
  /** Requests routers still hold on it; undefined when none reported. */
  readonly inFlight?: number;
}

export interface ReplicaInfo {
  readonly replicaId: string;
  readonly deployment: string;
  readonly revision: number;
  /** From its ranks' states (`aggregateRankStates`). */
  readonly state: ReplicaStateName;
  readonly fabricId?: string;
  readonly ranks: readonly PlacedRankInfo[];
  /** `host:port` of rank 0's engine, once it reported its port. */
  readonly endpoint?: string;
  readonly createdAtMs: number;
  readonly retirement?: RetirementInfo;
}

export interface DeploymentInfo {
  readonly spec: DeploymentSpec;
  readonly desiredReplicas: number;
  readonly readyReplicas: number;
  readonly replicas: readonly ReplicaInfo[];
  /** Why replicas are missing: the scheduler's reasons, then failed replicas. */
  readonly unschedulable: readonly Reason[];
  /** Failed replicas, apart from those that cannot be placed. */
  readonly failed: readonly Reason[];
  /**
   * Nodes its new replicas go to last since a replica kept failing there
   * (`LLMGW_CONTROL_PLANE_NODE_AVOIDED`, see failing-replicas.ts).
   */
  readonly avoided: readonly Reason[];
  readonly createdAtMs: number;
  readonly updatedAtMs: number;
  readonly rollout?: RolloutRecord;
  /**
   * Present when this release refuses the deployment's stored spec (an older release accepted
   * it): code `LLMGW_CONTROL_PLANE_SPEC_REFUSED`, the refusal and what to do. Its running
   * replicas are left alone and nothing new is placed for it until a corrected spec is
   * applied. Also the first of {@link unschedulable}, where clients show it (the wire has no
   * field of its own for it).
   */
  readonly invalid?: Reason;
}

export interface NodeInfo {
  readonly nodeId: string;
  readonly hostname: string;
  readonly state: NodeState;
  readonly cordoned: boolean;
  readonly draining: boolean;
  /** As registered; never changed in place (a registration brings a new one). */
  readonly inventory: NodeInventory;
  /** Latest readings, `healthy` being the control plane's verdict (cleared faults left out). */
  readonly gpuReadings: readonly GpuReading[];
  readonly lastHeartbeatMs?: number;
  readonly registeredAtMs: number;
  readonly advertiseAddress: string;
  readonly problems: readonly Problem[];
  readonly placed: readonly PlacedRankInfo[];
}

/** GPUs of one class on one fabric. */
export interface ClassCapacityInfo {
  readonly gpuClass: string;
  readonly fabricId: string;
  readonly total: number;
  readonly allocated: number;
  readonly unhealthy: number;
  /** Healthy, unallocated, on a ready node that is not cordoned. */
  readonly free: number;
}

/** The one-screen summary (`llmgw status`). */
export interface ClusterSummary {
  readonly nodesTotal: number;
  readonly nodesReady: number;
  readonly gpusTotal: number;
  readonly gpusAllocated: number;
  readonly gpusUnhealthy: number;
  readonly deploymentsTotal: number;
  readonly deploymentsReady: number;
  readonly replicasTotal: number;
  readonly replicasReady: number;
  readonly classes: readonly ClassCapacityInfo[];
}

/** Who a multi-node replica's ranks are, and where they meet. */
export interface ReplicaWorld {
  readonly nnodes: number;
  /** The advertise address of the node running rank 0. */
  readonly rank0Address: string;
  /** 0: none (a single-node replica). */
  readonly rendezvousPort: number;
  readonly nodeIds: readonly string[];
}

/** One rank a node must run: part of its desired set. */
export interface Assignment {
  readonly replicaId: string;
  /** The spec of the revision this rank runs. */
  readonly spec: DeploymentSpec;
  readonly rank: number;
  readonly world: ReplicaWorld;
  readonly gpuIndices: readonly number[];
  /** Per index, the GPU's UUID as registered ("" when the inventory has no such GPU). */
  readonly gpuUuids: readonly string[];
  readonly fabricId?: string;
}
