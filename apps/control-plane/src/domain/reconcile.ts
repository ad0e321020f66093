import {
  type DeploymentSpec,
  deploymentGpusPerReplica,
  engineSupportsMultiNode,
} from "@llmgw/engines";
import type {
  Reason,
  ScheduleInput,
  ScheduleResult,
  SchedulerDeployment,
  SchedulerNode,
} from "@llmgw/scheduler";
import type { PlacementRecord } from "../store/types.js";

/** The scheduler as the reconciler uses it: pure, deterministic for the same input. */
export type ScheduleFn = (input: ScheduleInput) => ScheduleResult;

/** What {@link planReconcile} works from. */
export interface ReconcileInput {
  /** Current specs by name. */
  readonly deployments: ReadonlyMap<string, DeploymentSpec>;
  readonly placements: readonly PlacementRecord[];
  /** Every known, non-revoked node, in scheduler form (fabric trouble included). */
  readonly nodes: readonly SchedulerNode[];
  readonly schedule: ScheduleFn;
  readonly nowMs: number;
}

/** A placement to drop and why. */
export interface PlacementRemovalPlan {
  readonly placement: PlacementRecord;
  /** The scheduler's reason: its codes (`node-lost`, `shape-changed`, …) are the one vocabulary. */
  readonly reason: Reason;
}

/** What the control plane should do to converge; applied (and persisted) by the caller. */
export interface ReconcilePlan {
  /** Placements to keep, with revisions brought up to date. */
  readonly keep: readonly PlacementRecord[];
  readonly add: readonly PlacementRecord[];
  readonly remove: readonly PlacementRemovalPlan[];
  /** Reasons per deployment that misses replicas; absent = fully placed. */
  readonly unschedulable: ReadonlyMap<string, { missing: number; reasons: readonly Reason[] }>;
}

/**
 * Decides placements: the scheduler owns every rule (which placement goes and why, which
 * stays at a new revision, what is added); this translates between the control plane's
 * records and the scheduler's plain input and back. Pure apart from calling `schedule`.
 */
export function planReconcile(input: ReconcileInput): ReconcilePlan {
  const deployments: SchedulerDeployment[] = [];
  for (const spec of input.deployments.values()) deployments.push(schedulerDeployment(spec));
  const result = input.schedule({
    nodes: input.nodes,
    deployments,
    // A record has every field of the scheduler's placement (and more it ignores).
    placements: input.placements,
  });

  const removed = new Map(result.remove.map((r) => [r.replicaId, r.reason]));
  const revised = new Map(result.revised.map((p) => [p.replicaId, p.revision]));
  const keep: PlacementRecord[] = [];
  const remove: PlacementRemovalPlan[] = [];
  for (const p of input.placements) {
    const reason = removed.get(p.replicaId);
    if (reason) {
      remove.push({ placement: p, reason });
      continue;
    }
    const revision = revised.get(p.replicaId);
    keep.push(revision === undefined ? p : { ...p, revision });
  }
  const add = result.add.map<PlacementRecord>((p) => ({
    replicaId: p.replicaId,
    deployment: p.deployment,
    revision: p.revision,
    ranks: p.ranks.map((r) => ({ rank: r.rank, nodeId: r.nodeId, gpuIndices: [...r.gpuIndices] })),
    fabricId: p.fabricId,
    createdAtMs: input.nowMs,
  }));
  const unschedulable = new Map(
    result.unschedulable.map((u) => [
      u.deployment,
      { missing: u.missingReplicas, reasons: u.reasons },
    ]),
  );
  return { keep, add, remove, unschedulable };
}

/** The scheduler's view of a spec, one object per spec object (reconciles reuse it). */
const schedulerDeployments = new WeakMap<DeploymentSpec, SchedulerDeployment>();
function schedulerDeployment(spec: DeploymentSpec): SchedulerDeployment {
  let d = schedulerDeployments.get(spec);
  if (d === undefined) {
    d = {
      name: spec.name,
      revision: spec.revision,
      gpuClass: spec.gpuClass,
      gpusPerReplica: deploymentGpusPerReplica(spec),
      replicas: spec.replicas,
      nodesPerReplica: spec.nodesPerReplica,
      fabric: spec.fabric,
      multiNode: engineSupportsMultiNode(spec.engine),
      priority: spec.priority,
      allowPreemption: spec.allowPreemption,
    };
    schedulerDeployments.set(spec, d);
  }
  return d;
}
