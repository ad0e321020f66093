import { ControlPlaneError } from "../errors.js";
import type { StoreSnapshot } from "./postgres-store.js";
import type { ClusterStore, ReplicaStatusRecord } from "./types.js";

/**
 * A read-only {@link ClusterStore} over one snapshot of the database: what a follower's warm
 * copy of the state is built on. Every write throws `LLMGW_CONTROL_PLANE_NOT_LEADER`: only
 * the leader writes.
 */
export function snapshotStore(snapshot: StoreSnapshot, location: string): ClusterStore {
  const refuse = (): never => {
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_NOT_LEADER",
      `a follower's copy of ${location} is read-only: only the leader writes`,
    );
  };
  return {
    location,
    listDeployments: () => [...snapshot.deployments],
    listDeploymentRevisions: () => [...snapshot.deploymentRevisions],
    listPlacements: () => [...snapshot.placements],
    listApiKeys: () => [...snapshot.apiKeys],
    listTenants: () => [...snapshot.tenants],
    listNodes: () => [...snapshot.nodes],
    listFaultClears: () => [...snapshot.faultClears],
    listReplicaStatuses: (): ReplicaStatusRecord[] => [...snapshot.replicaStatuses],
    listAvoidedNodes: () => [...snapshot.avoidedNodes],
    listEvents: ({ afterId = 0, limit }) => {
      // Paging: the oldest after `afterId`; without it, the newest.
      if (afterId > 0) return snapshot.events.filter((e) => e.id > afterId).slice(0, limit);
      return snapshot.events.slice(Math.max(0, snapshot.events.length - limit));
    },
    putDeployment: refuse,
    deleteDeployment: refuse,
    putDeploymentRevision: refuse,
    deleteDeploymentRevision: refuse,
    putPlacement: refuse,
    deletePlacement: refuse,
    putApiKey: refuse,
    putTenant: refuse,
    deleteTenant: refuse,
    putNode: refuse,
    deleteNode: refuse,
    putNodeState: refuse,
    replaceFaultClears: refuse,
    putReplicaStatus: refuse,
    deleteReplicaStatuses: refuse,
    putAvoidedNode: refuse,
    deleteAvoidedNode: refuse,
    appendEvent: refuse,
    transaction: (fn) => fn(),
    flush: async () => {},
    close: () => {},
  };
}
