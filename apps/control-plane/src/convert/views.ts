import { create } from "@bufbuild/protobuf";
import type * as plain from "@llmgw/discovery";
import type { DeploymentSpec } from "@llmgw/engines";
import {
  type DeploymentStatus,
  DeploymentStatusSchema,
  type GetClusterStatusResponse,
  GetClusterStatusResponseSchema,
  type Node,
  type NodeInventory,
  NodeSchema,
  NodeState,
  type PlacedRank,
  PlacedRankSchema,
  type Replica,
  type ReplicaAssignment,
  ReplicaAssignmentSchema,
  ReplicaSchema,
  type ReplicaStatus,
  ReplicaStatusSchema,
  RetirementPhase,
  type Rollout,
  RolloutSchema,
  RolloutState,
} from "@llmgw/proto";
import { engineLoadToProto, gpuReadingToProto, inventoryToProto } from "@llmgw/wire";
import type { NodeState as NodeStateName } from "../domain/node-lifecycle.js";
import { replicaStateToProto } from "../domain/replica-state.js";
import type {
  Assignment,
  ClusterSummary,
  DeploymentInfo,
  NodeInfo,
  PlacedRankInfo,
  RankStatus,
  ReplicaInfo,
} from "../domain/views.js";
import type { RolloutRecord } from "../store/types.js";
import { deploymentSpecToProto } from "./deployment.js";

/*
 * The cluster's plain views as the admin API (`ClusterService`) sends them: the one place
 * they meet protobuf on their way out.
 */

const big = (v: number | undefined): bigint | undefined =>
  v === undefined ? undefined : BigInt(Math.round(v));

/**
 * One wire inventory per registered inventory: a node's inventory changes only when it
 * registers again (a new object), and `rpc/pre-encoded.ts` encodes each wire inventory once
 * by its identity.
 */
const inventories = new WeakMap<plain.NodeInventory, NodeInventory>();

function inventoryMessage(inventory: plain.NodeInventory): NodeInventory {
  let message = inventories.get(inventory);
  if (message === undefined) {
    message = inventoryToProto(inventory);
    inventories.set(inventory, message);
  }
  return message;
}

const NODE_STATE: Readonly<Record<NodeStateName, NodeState>> = {
  ready: NodeState.READY,
  unreachable: NodeState.UNREACHABLE,
  lost: NodeState.LOST,
};

export function rankStatusToProto(s: RankStatus): ReplicaStatus {
  return create(ReplicaStatusSchema, {
    replicaId: s.replicaId,
    rank: s.rank,
    state: replicaStateToProto(s.state),
    pid: s.pid,
    apiPort: s.apiPort,
    startedAtUnixMs: big(s.startedAtMs),
    restarts: s.restarts,
    lastExit: s.lastExit,
    logTail: [...s.logTail],
    load: s.load === undefined ? undefined : engineLoadToProto(s.load),
    message: s.message,
    stateSinceUnixMs: BigInt(s.stateSinceMs),
    specHash: s.specHash,
    revision: BigInt(s.revision),
    adopted: s.adopted,
    kvEventsPort: s.kvEventsPort,
  });
}

function placedRankToProto(r: PlacedRankInfo): PlacedRank {
  return create(PlacedRankSchema, {
    replicaId: r.replicaId,
    deployment: r.deployment,
    rank: r.rank,
    nodeId: r.nodeId,
    gpuIndices: [...r.gpuIndices],
    status: r.status === undefined ? undefined : rankStatusToProto(r.status),
  });
}

export function replicaToProto(r: ReplicaInfo): Replica {
  const t = r.retirement;
  return create(ReplicaSchema, {
    replicaId: r.replicaId,
    deployment: r.deployment,
    revision: BigInt(r.revision),
    state: replicaStateToProto(r.state),
    fabricId: r.fabricId ?? "",
    ranks: r.ranks.map(placedRankToProto),
    endpoint: r.endpoint ?? "",
    createdAtUnixMs: BigInt(r.createdAtMs),
    retirement:
      t === undefined
        ? undefined
        : {
            reason: t.reason,
            phase: t.phase === "waiting" ? RetirementPhase.WAITING : RetirementPhase.DRAINING,
            sinceUnixMs: BigInt(t.sinceMs),
            drainingSinceUnixMs: big(t.drainingSinceMs),
            drainDeadlineUnixMs: big(t.drainDeadlineMs),
            inFlight: t.inFlight,
          },
  });
}

const ROLLOUT_STATE: Readonly<Record<RolloutRecord["state"], RolloutState>> = {
  "in-progress": RolloutState.IN_PROGRESS,
  complete: RolloutState.COMPLETE,
  "rolled-back": RolloutState.ROLLED_BACK,
};

function rolloutToProto(r: RolloutRecord): Rollout {
  return create(RolloutSchema, {
    state: ROLLOUT_STATE[r.state],
    fromRevision: BigInt(r.fromRevision),
    toRevision: BigInt(r.toRevision),
    message: r.message,
    startedAtUnixMs: BigInt(r.startedAtMs),
    updatedAtUnixMs: BigInt(r.updatedAtMs),
  });
}

export function deploymentToProto(d: DeploymentInfo): DeploymentStatus {
  return create(DeploymentStatusSchema, {
    spec: deploymentSpecToProto(d.spec),
    desiredReplicas: d.desiredReplicas,
    readyReplicas: d.readyReplicas,
    replicas: d.replicas.map(replicaToProto),
    unschedulable: [...d.unschedulable],
    failed: [...d.failed],
    avoided: [...d.avoided],
    createdAtUnixMs: BigInt(d.createdAtMs),
    updatedAtUnixMs: BigInt(d.updatedAtMs),
    rollout: d.rollout === undefined ? undefined : rolloutToProto(d.rollout),
  });
}

/** The node; its inventory is the one wire message kept for that registration. */
export function nodeToProto(n: NodeInfo): Node {
  return create(NodeSchema, {
    nodeId: n.nodeId,
    hostname: n.hostname,
    state: NODE_STATE[n.state],
    cordoned: n.cordoned,
    draining: n.draining,
    inventory: inventoryMessage(n.inventory),
    gpuReadings: n.gpuReadings.map(gpuReadingToProto),
    lastHeartbeatUnixMs: big(n.lastHeartbeatMs),
    registeredAtUnixMs: BigInt(n.registeredAtMs),
    advertiseAddress: n.advertiseAddress,
    problems: [...n.problems],
    placed: n.placed.map(placedRankToProto),
  });
}

/** The summary; the caller adds what the cluster does not know (version, store, instances). */
export function clusterSummaryToProto(s: ClusterSummary): GetClusterStatusResponse {
  return create(GetClusterStatusResponseSchema, {
    ...s,
    classes: s.classes.map((c) => ({ ...c })),
  });
}

/** One wire spec per spec object, shared by every assignment and node carrying it. */
const specMessages = new WeakMap<DeploymentSpec, ReturnType<typeof deploymentSpecToProto>>();

function specMessage(spec: DeploymentSpec): ReturnType<typeof deploymentSpecToProto> {
  let message = specMessages.get(spec);
  if (message === undefined) {
    message = deploymentSpecToProto(spec);
    specMessages.set(spec, message);
  }
  return message;
}

/**
 * One wire list per desired set the cluster built: a node's set is rebuilt (a new array) only
 * when something it carries changed, and sent only then (a heartbeat whose agent applied it
 * gets `unchanged`), so each set meets protobuf once.
 */
const assignmentMessages = new WeakMap<readonly Assignment[], readonly ReplicaAssignment[]>();

/** A node's desired set as `HeartbeatResponse.assignments` carries it. */
export function assignmentsToProto(set: readonly Assignment[]): readonly ReplicaAssignment[] {
  let messages = assignmentMessages.get(set);
  if (messages === undefined) {
    messages = set.map((a) =>
      create(ReplicaAssignmentSchema, {
        replicaId: a.replicaId,
        deployment: specMessage(a.spec),
        rank: a.rank,
        world: { ...a.world, nodeIds: [...a.world.nodeIds] },
        gpuIndices: [...a.gpuIndices],
        gpuUuids: [...a.gpuUuids],
        fabricId: a.fabricId ?? "",
      }),
    );
    assignmentMessages.set(set, messages);
  }
  return messages;
}
