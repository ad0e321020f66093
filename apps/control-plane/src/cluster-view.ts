import type { NodeInventory } from "@llmgw/discovery";
import type {
  ClusterView,
  DeploymentView,
  FabricView,
  GpuView,
  NodeView,
  ReplicaView,
  RouterView,
} from "@llmgw/metrics-collector";
import type { Cluster } from "./domain/cluster.js";
import type { RouterRegistry } from "./routing/router-registry.js";

/** Problem codes for the two verdicts that are not the agent's own problems. */
const LOST = "LLMGW_DISCOVERY_GPU_LOST";
const FAULT = "LLMGW_DISCOVERY_GPU_FAULT";

/** Deployments and replicas as of one {@link Cluster.routingVersion}. */
interface Membership {
  readonly routingVersion: number;
  readonly replicas: readonly ReplicaView[];
  /** Without `unschedulable`, which is read at every call (it can move on its own). */
  readonly deployments: readonly Omit<DeploymentView, "unschedulable">[];
}

/**
 * The read-only {@link ClusterView} `@llmgw/metrics-collector` scrapes: built from memory on
 * each call (no I/O). Readings come from the last heartbeat and fall back to registration;
 * a reading nobody reported stays undefined (a missing series, never 0). With `routers`, the
 * view lists the routers too (`llmgw_routers`).
 *
 * Deployments and replicas are rebuilt only when `cluster.routingVersion` moved: it is bumped
 * on every change to deployments, placements and replica ranks' states, the only inputs of
 * their views besides `unschedulable` (read live). Heartbeats alone leave them as built, which
 * at 1,000 replicas saves most of a scrape's view time (bench/metrics/cluster-scrape.ts).
 */
export function createClusterView(cluster: Cluster, routers?: RouterRegistry): ClusterView {
  let membership: Membership | undefined;
  const currentMembership = (): Membership => {
    const routingVersion = cluster.routingVersion;
    if (membership?.routingVersion === routingVersion) return membership;
    const ready = new Map<string, number>();
    const replicas = cluster.listReplicas().map((r): ReplicaView => {
      if (r.state === "ready") ready.set(r.deployment, (ready.get(r.deployment) ?? 0) + 1);
      const phase = r.retirement?.phase;
      return {
        id: r.replicaId,
        deployment: r.deployment,
        state: r.state,
        ...(phase === undefined ? {} : { leaving: phase }),
      };
    });
    // By name, as `listDeployments` orders them.
    const deployments = [...cluster.deploymentSpecs()]
      .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))
      .map((s) => ({
        name: s.name,
        desired: s.replicas,
        ready: ready.get(s.name) ?? 0,
        gpuClass: s.gpuClass ?? "",
        engine: s.engine,
      }));
    membership = { routingVersion, replicas, deployments };
    return membership;
  };
  // Fabrics come from the registered inventory, which a node keeps until it registers again.
  const fabricsOf = new WeakMap<NodeInventory, readonly FabricView[]>();
  const fabrics = (inventory: NodeInventory): readonly FabricView[] => {
    let out = fabricsOf.get(inventory);
    if (out === undefined) {
      out = inventory.fabrics.map((f) => ({
        id: f.id,
        linkLayer: f.linkLayer === "infiniband" || f.linkLayer === "roce" ? f.linkLayer : "unknown",
      }));
      fabricsOf.set(inventory, out);
    }
    return out;
  };
  return {
    ...(routers === undefined
      ? {}
      : {
          routers: (): RouterView[] =>
            routers.list().map((r) => ({ id: r.id, connected: r.connected })),
        }),
    nodes(): NodeView[] {
      const allocatedBy = new Map<string, Map<number, string>>();
      for (const p of cluster.placements()) {
        for (const r of p.ranks) {
          let byIndex = allocatedBy.get(r.nodeId);
          if (byIndex === undefined) {
            byIndex = new Map();
            allocatedBy.set(r.nodeId, byIndex);
          }
          for (const i of r.gpuIndices) byIndex.set(i, p.deployment);
        }
      }
      return cluster.nodeSnapshots().map((n) => {
        const allocated = allocatedBy.get(n.id);
        let healthy = true;
        const gpus = n.inventory.gpus.map((g): GpuView => {
          const reading = n.readings.get(g.index);
          const verdict = n.health.get(g.index);
          // Most GPUs are sound and have seen no fault: no arrays for them (8,000 a scrape).
          let problems: string[] | undefined;
          if (verdict !== undefined && !verdict.healthy) {
            problems = [];
            if (verdict.lost) problems.push(LOST);
            for (const p of verdict.problems) problems.push(p.code);
            if (verdict.faults.length > 0) problems.push(FAULT);
          }
          let faultsSeen:
            | { code: number; kind: string; action: string; count: number }[]
            | undefined;
          if (n.faultTallies.length > 0) {
            faultsSeen = [];
            for (const t of n.faultTallies) {
              if (t.gpu !== g.index) continue;
              faultsSeen.push({ code: t.code, kind: t.kind, action: t.action, count: t.count });
            }
          }
          const gpuHealthy = verdict?.healthy ?? false;
          healthy &&= gpuHealthy;
          const source = reading ?? g;
          return {
            index: g.index,
            uuid: g.uuid,
            name: g.name,
            gpuClass: g.gpuClass ?? "",
            memoryTotalBytes: g.memoryTotalBytes,
            memoryUsedBytes: source.memoryUsedBytes,
            utilizationPercent: source.utilizationPercent,
            eccUncorrectedErrors: source.eccUncorrectedErrors,
            temperatureCelsius: source.temperatureCelsius,
            powerWatts: source.powerWatts,
            healthy: gpuHealthy,
            healthProblems: problems !== undefined && problems.length > 0 ? problems : undefined,
            faultsSeen: faultsSeen !== undefined && faultsSeen.length > 0 ? faultsSeen : undefined,
            mig: g.migEnabled,
            allocatedDeployment: allocated?.get(g.index),
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
          healthy,
          gpus,
          ports: n.ports.map((p) => ({ device: p.device, port: p.port, healthy: p.healthy })),
          fabrics: fabrics(n.inventory),
        };
      });
    },
    deployments(): DeploymentView[] {
      return currentMembership().deployments.map((d) => ({
        ...d,
        unschedulable: cluster.unschedulableReasons(d.name).length > 0,
      }));
    },
    replicas(): readonly ReplicaView[] {
      return currentMembership().replicas;
    },
  };
}
