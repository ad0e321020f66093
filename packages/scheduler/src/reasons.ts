/**
 * Stable codes of the {@link Reason}s the scheduler attaches to removals and to unschedulable
 * deployments. The message beside each code is for humans and carries the numbers; code on the
 * code, never on the message.
 */

/** Why an existing placement is removed. */
export type RemovalReasonCode =
  /** The deployment no longer exists. */
  | "deployment-deleted"
  /**
   * The deployment changed shape (GPUs per replica, nodes per replica or GPU class): the
   * replica is re-created. A new revision of the same shape keeps it (`revised`).
   */
  | "shape-changed"
  /** A node of the replica is in state `lost`. */
  | "node-lost"
  /** A node of the replica is no longer in the input at all. */
  | "node-gone"
  /** A GPU of the replica is unhealthy, MIG-enabled or no longer present. */
  | "gpu-unusable"
  /** A GPU of the replica is also claimed by another placement that sorts first. */
  | "gpu-conflict"
  /** A node of a multi-node replica has an unhealthy port on the replica's fabric. */
  | "port-unhealthy"
  /** A node of the replica is draining: the replica moves. */
  | "node-draining"
  /** The deployment wants fewer replicas. */
  | "scale-down"
  /** A higher-priority deployment with `allowPreemption` needed the GPUs. */
  | "preempted"
  /** Its engine keeps failing on its node(s) and the deployment fits elsewhere (`failing`). */
  | "replica-failed";

/** Why replicas of a deployment could not be placed. */
export type UnschedulableReasonCode =
  /** No schedulable (ready, uncordoned, not draining) node exists; for zero-GPU deployments. */
  | "no-schedulable-node"
  /** No node has GPUs of the requested class (or of any known class). */
  | "no-gpu-class"
  /** The replica needs more GPUs per node than the largest node of the class has. */
  | "exceeds-node"
  /** `nodesPerReplica` > 1 but the engine cannot span nodes. */
  | "single-node-only"
  /** `gpusPerReplica` does not divide evenly over `nodesPerReplica`. */
  | "uneven-split"
  /** `fabric` names a fabric no node reports. */
  | "fabric-unknown"
  /** Not a single healthy, schedulable GPU of the class is free. */
  | "no-free-gpus"
  /** GPUs are free, but no single node has enough of them. */
  | "no-node-fits"
  /** No fabric has enough nodes with enough free GPUs for the gang. */
  | "no-fabric-fits"
  /** Preemption was allowed but evicting every lower-priority replica would still not suffice. */
  | "preemption-insufficient";

/** Every code a {@link Reason} from this package can carry. */
export type ReasonCode = RemovalReasonCode | UnschedulableReasonCode;
