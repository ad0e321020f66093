/**
 * The scheduler's contract: plain data in, a plan out. The control plane builds these inputs
 * from its store and live node state and applies the plan; nothing here does I/O.
 */

/** A stable code plus human text with numbers, e.g. "needs 2 nodes × 8 h100-80g on one fabric; …". */
export interface Reason {
  readonly code: string;
  readonly message: string;
}

export interface SchedulerGpu {
  readonly index: number;
  /** Not read by the scheduler; the control plane leaves it out so that nodes of one layout
   * share one GPU list (see `NodeInfo` in schedule.ts). */
  readonly uuid?: string;
  /** e.g. "h100-80g"; undefined when unknown (such a GPU is never used for a class request). */
  readonly gpuClass?: string;
  readonly healthy: boolean;
  readonly migEnabled: boolean;
  /** Absent: `"nvidia"`. A replica's GPUs, on every rank, are all of one vendor. */
  readonly vendor?: "nvidia" | "amd";
}

export interface SchedulerNode {
  readonly id: string;
  /** "ready" is schedulable; anything else is never given new replicas. */
  readonly state: "ready" | "unreachable" | "lost";
  readonly cordoned: boolean;
  readonly draining: boolean;
  readonly gpus: readonly SchedulerGpu[];
  /** Fabric ids of this node's active RDMA ports; empty = a single-node island. */
  readonly fabrics: readonly string[];
  /** NVLink counts between GPU pairs (from topology); absent pairs are PCIe only. */
  readonly nvlinks?: readonly { readonly a: number; readonly b: number; readonly count: number }[];
  /** GPU index → best PCIe distance to a NIC on the chosen fabric: 0 PIX … 4 SYS. */
  readonly nicDistance?: Readonly<Record<number, number>>;
  /**
   * Fabric id → why this node may not carry a multi-node replica on it (an unhealthy port):
   * a gang placed there loses all its ranks (`port-unhealthy`). Such fabrics are left out of
   * `fabrics` too, so no new gang goes there. Absent: none.
   */
  readonly fabricTrouble?: Readonly<Record<string, string>>;
}

export interface SchedulerDeployment {
  readonly name: string;
  readonly revision: number;
  /** Required GPU class; undefined = any class (or none when gpusPerReplica is 0). */
  readonly gpuClass?: string;
  /** TP × PP for GPU engines; 0 for engines that run without GPUs (sim/llama.cpp on CPU). */
  readonly gpusPerReplica: number;
  readonly replicas: number;
  /** Fixed number of nodes per replica; undefined = 1 when it fits, else the fewest equal split. */
  readonly nodesPerReplica?: number;
  /** Restrict multi-node replicas to this fabric. */
  readonly fabric?: string;
  /** False for engines that cannot span nodes (llama.cpp). */
  readonly multiNode: boolean;
  /** Higher is placed first when capacity is short. */
  readonly priority: number;
  /** May evict lower-priority replicas to fit. */
  readonly allowPreemption: boolean;
}

export interface PlacementRank {
  readonly rank: number;
  readonly nodeId: string;
  readonly gpuIndices: readonly number[];
}

export interface Placement {
  /** Deterministic: `${deployment}-${n}` with the lowest free n. */
  readonly replicaId: string;
  readonly deployment: string;
  readonly revision: number;
  /** Rank 0 first. One entry for a single-node replica. */
  readonly ranks: readonly PlacementRank[];
  /** The fabric shared by all ranks of a multi-node replica; undefined for single-node. */
  readonly fabricId?: string;
}

export interface ScheduleInput {
  readonly nodes: readonly SchedulerNode[];
  readonly deployments: readonly SchedulerDeployment[];
  /** What is placed now (possibly on nodes that are gone or for deployments that changed). */
  readonly placements: readonly Placement[];
  /**
   * Placements leaving on the control plane's own schedule (draining, waiting for their
   * replacement, an older revision in a rolling update): their GPUs stay taken and their ids
   * are not reused, but they do not count as replicas of their deployment and no planned
   * rule (scale-down, node draining, deployment deleted, shape, preemption) touches them.
   * Only a loss removes one: node gone or lost, GPU unusable or claimed twice, port unhealthy.
   * Absent: none.
   */
  readonly held?: readonly Placement[];
  /**
   * Replicas the caller removed in the same plan: their ids are not given to new replicas,
   * so that nothing takes a replacement for the engine being stopped. Absent: none.
   */
  readonly retired?: readonly { readonly deployment: string; readonly replicaId: string }[];
  /**
   * Nodes a deployment's engines failed on lately: its new replicas go to other nodes when
   * they fit there, and to these only when nothing else fits. Absent: none.
   */
  readonly avoid?: readonly { readonly deployment: string; readonly nodeId: string }[];
  /**
   * Placed replicas whose engines keep failing where they are, each with the message of its
   * removal. One moves (removed as `replica-failed`, its replacement added in the same plan)
   * when its deployment fits on nodes that {@link avoid} does not name for it, its own GPUs
   * counted as free; the caller names the nodes it failed on there. Otherwise it stays: placed back on the same node it
   * would only start its agent's relaunch backoff over. A scale-down removes these first.
   * Absent: none.
   */
  readonly failing?: readonly { readonly replicaId: string; readonly message: string }[];
  /**
   * Placed replicas that take no traffic now: `failed` when their engine failed (the restart
   * policy gave up), else starting, unhealthy or not reported. A scale-down removes these
   * after those in {@link failing} and before serving ones (failed first), so that it never
   * drains a serving replica while one that serves nothing stays. Absent: all serve.
   */
  readonly notServing?: readonly { readonly replicaId: string; readonly failed: boolean }[];
}

export interface PlacementRemoval {
  readonly replicaId: string;
  readonly deployment: string;
  readonly reason: Reason;
}

export interface UnschedulableDeployment {
  readonly deployment: string;
  /** Replicas wanted but not placed. */
  readonly missingReplicas: number;
  readonly reasons: readonly Reason[];
}

export interface ScheduleResult {
  readonly add: readonly Placement[];
  readonly remove: readonly PlacementRemoval[];
  /**
   * Kept placements whose deployment moved to a new revision of the same shape, at that
   * revision: the replica (and its id) stays, its engine is replaced in place.
   */
  readonly revised: readonly Placement[];
  readonly unschedulable: readonly UnschedulableDeployment[];
}
