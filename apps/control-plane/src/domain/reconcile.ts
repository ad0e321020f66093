import {
  type DeploymentSpec,
  deploymentGpusPerReplica,
  engineSupportsMultiNode,
} from "@llmgw/engines";
import type { Reason, ScheduleInput, ScheduleResult, SchedulerNode } from "@llmgw/scheduler";
import type { PlacementRecord } from "../store/types.js";

/** The scheduler as the reconciler uses it: pure, deterministic for the same input. */
export type ScheduleFn = (input: ScheduleInput) => ScheduleResult;

/** What {@link planReconcile} works from. */
export interface ReconcileInput {
  /** Current specs by name. */
  readonly deployments: ReadonlyMap<string, DeploymentSpec>;
  readonly placements: readonly PlacementRecord[];
  /** Every known, non-revoked node, in scheduler form. */
  readonly nodes: readonly SchedulerNode[];
  readonly schedule: ScheduleFn;
  readonly nowMs: number;
  /**
   * Node id → fabrics it may not be used on for multi-node replicas, each with why (an
   * unhealthy port). Absent: none.
   */
  readonly fabricTrouble?: ReadonlyMap<string, ReadonlyMap<string, string>>;
}

/** A placement to drop and why. */
export interface PlacementRemovalPlan {
  readonly placement: PlacementRecord;
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
 * Decides placements. The control plane's own rules run first, because they are about
 * lifecycle rather than packing: a placement goes when its deployment is gone, a node it uses
 * is lost, revoked or draining, one of its GPUs turned unhealthy, a multi-node replica's node
 * has an unhealthy port on its fabric, or its deployment changed shape. Placements on `unreachable` nodes stay: their engines keep serving. A spec change of
 * the same shape keeps the placement (and its replica id) at the new revision: the agent
 * replaces the engine in place. Then the scheduler scales down (its own order), fills the
 * gaps, and its removals are applied too. Pure apart from calling `schedule`.
 */
export function planReconcile(input: ReconcileInput): ReconcilePlan {
  const nodes = new Map(input.nodes.map((n) => [n.id, n]));
  const remove: PlacementRemovalPlan[] = [];
  const survivors: PlacementRecord[] = [];
  for (const p of input.placements) {
    const reason =
      removalReason(p, input.deployments.get(p.deployment), nodes) ??
      fabricReason(p, input.fabricTrouble);
    if (reason) remove.push({ placement: p, reason });
    else survivors.push(p);
  }
  const keepAfterScale = survivors.map((p) => {
    const spec = input.deployments.get(p.deployment) as DeploymentSpec;
    return p.revision === spec.revision ? p : { ...p, revision: spec.revision };
  });

  const result = input.schedule({
    nodes: input.nodes,
    deployments: [...input.deployments.values()].map((spec) => ({
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
    })),
    placements: keepAfterScale.map((p) => ({
      replicaId: p.replicaId,
      deployment: p.deployment,
      revision: p.revision,
      ranks: p.ranks,
      fabricId: p.fabricId,
    })),
  });

  const schedulerRemoved = new Map(result.remove.map((r) => [r.replicaId, r.reason]));
  const keep: PlacementRecord[] = [];
  for (const p of keepAfterScale) {
    const reason = schedulerRemoved.get(p.replicaId);
    if (reason) remove.push({ placement: p, reason });
    else keep.push(p);
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

/**
 * A multi-node replica goes when a node of it has an unhealthy port on the replica's fabric:
 * NCCL over a flapping or erroring link hangs or crawls. Single-node replicas never use it.
 */
function fabricReason(
  p: PlacementRecord,
  trouble: ReconcileInput["fabricTrouble"],
): Reason | undefined {
  if (p.ranks.length < 2 || p.fabricId === undefined || !trouble) return undefined;
  for (const rank of p.ranks) {
    const why = trouble.get(rank.nodeId)?.get(p.fabricId);
    if (why !== undefined) {
      return {
        code: "LLMGW_CONTROL_PLANE_PORT_UNHEALTHY",
        message: `node ${rank.nodeId} (rank ${rank.rank}): ${why}`,
      };
    }
  }
  return undefined;
}

function removalReason(
  p: PlacementRecord,
  spec: DeploymentSpec | undefined,
  nodes: ReadonlyMap<string, SchedulerNode>,
): Reason | undefined {
  if (!spec) {
    return {
      code: "LLMGW_CONTROL_PLANE_DEPLOYMENT_DELETED",
      message: `deployment ${p.deployment} was deleted`,
    };
  }
  for (const rank of p.ranks) {
    const node = nodes.get(rank.nodeId);
    const wrongClass =
      spec.gpuClass === undefined
        ? undefined
        : rank.gpuIndices.find((i) => {
            const gpu = node?.gpus.find((g) => g.index === i);
            return gpu !== undefined && gpu.gpuClass !== spec.gpuClass;
          });
    if (wrongClass !== undefined) {
      return {
        code: "LLMGW_CONTROL_PLANE_SHAPE_CHANGED",
        message: `deployment ${spec.name} now needs ${spec.gpuClass} GPUs; GPU ${wrongClass} on node ${rank.nodeId} is not one`,
      };
    }
    if (!node) {
      return {
        code: "LLMGW_CONTROL_PLANE_NODE_REMOVED",
        message: `node ${rank.nodeId} was removed from the cluster`,
      };
    }
    if (node.state === "lost") {
      return {
        code: "LLMGW_CONTROL_PLANE_NODE_LOST",
        message: `node ${rank.nodeId} is lost (no heartbeat within the grace period)`,
      };
    }
    if (node.draining) {
      return {
        code: "LLMGW_CONTROL_PLANE_NODE_DRAINING",
        message: `node ${rank.nodeId} is draining`,
      };
    }
    if (node.state === "ready") {
      for (const index of rank.gpuIndices) {
        const gpu = node.gpus.find((g) => g.index === index);
        if (!gpu?.healthy) {
          return {
            code: "LLMGW_CONTROL_PLANE_GPU_UNHEALTHY",
            message: `GPU ${index} on node ${rank.nodeId} is ${gpu ? "unhealthy" : "gone"}`,
          };
        }
      }
    }
  }
  const gpus = p.ranks.reduce((sum, r) => sum + r.gpuIndices.length, 0);
  const wantGpus = deploymentGpusPerReplica(spec);
  if (
    gpus !== wantGpus ||
    (spec.nodesPerReplica !== undefined && p.ranks.length !== spec.nodesPerReplica)
  ) {
    return {
      code: "LLMGW_CONTROL_PLANE_SHAPE_CHANGED",
      message: `deployment ${spec.name} now needs ${wantGpus} GPU${wantGpus === 1 ? "" : "s"}${
        spec.nodesPerReplica === undefined ? "" : ` on ${spec.nodesPerReplica} node(s)`
      } per replica; this replica has ${gpus} on ${p.ranks.length}`,
    };
  }
  return undefined;
}
