import type {
  ClusterView,
  DeploymentView,
  GpuView,
  NodeView,
  ReplicaView,
  RouterView,
} from "@llmgw/metrics-collector";
import { ReplicaState } from "@llmgw/proto";
import type { Cluster } from "./domain/cluster.js";
import { replicaStateName } from "./domain/replica-state.js";
import type { RouterRegistry } from "./routing/router-registry.js";

/** Problem codes for the two verdicts that are not the agent's own problems. */
const LOST = "LLMGW_DISCOVERY_GPU_LOST";
const FAULT = "LLMGW_DISCOVERY_GPU_FAULT";

const num = (v: bigint | undefined): number | undefined =>
  v === undefined ? undefined : Number(v);

/**
 * The read-only {@link ClusterView} `@llmgw/metrics-collector` scrapes: built from memory on
 * each call (no I/O). Readings come from the last heartbeat and fall back to registration;
 * a reading nobody reported stays undefined (a missing series, never 0). With `routers`, the
 * view lists the routers too (`llmgw_routers`).
 */
export function createClusterView(cluster: Cluster, routers?: RouterRegistry): ClusterView {
  return {
    ...(routers === undefined
      ? {}
      : {
          routers: (): RouterView[] =>
            routers.list().map((r) => ({ id: r.id, connected: r.connected })),
        }),
    nodes(): NodeView[] {
      const allocatedBy = new Map<string, string>();
      for (const p of cluster.placements()) {
        for (const r of p.ranks)
          for (const i of r.gpuIndices) allocatedBy.set(`${r.nodeId}/${i}`, p.deployment);
      }
      return cluster.nodeSnapshots().map((n) => {
        const gpus: GpuView[] = n.inventory.gpus.map((g) => {
          const reading = n.readings.get(g.index);
          const verdict = n.health.get(g.index);
          const problems = [
            ...(verdict?.lost ? [LOST] : []),
            ...(verdict?.problems ?? []).map((p) => p.code),
            ...((verdict?.faults.length ?? 0) > 0 ? [FAULT] : []),
          ];
          const faultsSeen = n.faultTallies
            .filter((t) => t.gpu === g.index)
            .map(({ code, kind, action, count }) => ({ code, kind, action, count }));
          return {
            index: g.index,
            uuid: g.uuid,
            name: g.name,
            gpuClass: g.gpuClass,
            memoryTotalBytes: num(g.memoryTotalBytes),
            memoryUsedBytes: num(reading ? reading.memoryUsedBytes : g.memoryUsedBytes),
            utilizationPercent: reading ? reading.utilizationPercent : g.utilizationPercent,
            eccUncorrectedErrors: num(
              reading ? reading.eccUncorrectedErrors : g.eccUncorrectedErrors,
            ),
            temperatureCelsius: reading ? reading.temperatureCelsius : g.temperatureCelsius,
            powerWatts: reading ? reading.powerWatts : g.powerWatts,
            healthy: verdict?.healthy ?? false,
            ...(problems.length > 0 ? { healthProblems: problems } : {}),
            ...(faultsSeen.length > 0 ? { faultsSeen } : {}),
            mig: g.migEnabled,
            allocatedDeployment: allocatedBy.get(`${n.id}/${g.index}`),
          };
        });
        return {
          id: n.id,
          hostname: n.record.hostname,
          state: n.state,
          cordoned: n.record.cordoned,
          draining: n.record.draining,
          simulated: n.inventory.simulated,
          agentVersion: n.inventory.agentVersion,
          lastHeartbeatUnixMs: n.lastHeartbeatMs,
          healthy: gpus.every((g) => g.healthy),
          gpus,
          ports: n.ports.map((p) => ({
            device: p.device,
            port: p.port,
            ...(p.healthy === undefined ? {} : { healthy: p.healthy }),
          })),
          fabrics: n.inventory.fabrics.map((f) => ({
            id: f.id,
            linkLayer:
              f.linkLayer === "infiniband" || f.linkLayer === "roce" ? f.linkLayer : "unknown",
          })),
        };
      });
    },
    deployments(): DeploymentView[] {
      return cluster.listDeployments().map((d) => ({
        name: d.spec?.name ?? "",
        desired: d.desiredReplicas,
        ready: d.readyReplicas,
        unschedulable: cluster.unschedulableReasons(d.spec?.name ?? "").length > 0,
        gpuClass: d.spec?.gpuClass ?? "",
        engine: cluster.deploymentSpecs().find((s) => s.name === d.spec?.name)?.engine ?? "",
      }));
    },
    replicas(): ReplicaView[] {
      return cluster.listReplicas().map((r) => ({
        id: r.replicaId,
        deployment: r.deployment,
        state: replicaStateName(
          r.state === ReplicaState.UNSPECIFIED ? ReplicaState.PENDING : r.state,
        ) as ReplicaView["state"],
      }));
    },
  };
}
