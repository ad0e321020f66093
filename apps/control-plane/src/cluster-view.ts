import type { NodeInventory } from "@llmgw/discovery";
import type {
  ClusterView,
  DeploymentView,
  FabricView,
  GpuReadingView,
  GpuView,
  NodeView,
  PortView,
  ReplicaView,
  RouterView,
} from "@llmgw/metrics-collector";
import type { GpuHealthVerdict } from "@llmgw/wire";
import type { Cluster, PortSnapshot } from "./domain/cluster.js";
import type { RouterRegistry } from "./routing/router-registry.js";

/** Problem codes for the two verdicts that are not the agent's own problems. */
const LOST = "LLMGW_DISCOVERY_GPU_LOST";
const FAULT = "LLMGW_DISCOVERY_GPU_FAULT";

type InventoryGpu = NodeInventory["gpus"][number];
type Snapshot = ReturnType<Cluster["nodeSnapshots"]>[number];

/** What one GPU's view (readings apart) is built from. */
interface GpuInputs {
  /** The registered GPU: a new object with each registration. */
  readonly gpu: InventoryGpu;
  /** The health verdict: one shared object for every sound GPU. */
  readonly verdict: GpuHealthVerdict | undefined;
  readonly allocated: string | undefined;
  /** The node's fault tallies: one shared empty list for a node without any. */
  readonly tallies: Snapshot["faultTallies"];
}

interface FixedGpus {
  readonly inputs: readonly GpuInputs[];
  readonly gpus: readonly GpuView[];
}

/** Whether `was` holds these very inputs (compared without building an object for them). */
const sameInputs = (
  was: GpuInputs | undefined,
  gpu: InventoryGpu,
  verdict: GpuHealthVerdict | undefined,
  allocated: string | undefined,
  tallies: Snapshot["faultTallies"],
): was is GpuInputs =>
  was !== undefined &&
  was.gpu === gpu &&
  was.verdict === verdict &&
  was.allocated === allocated &&
  was.tallies === tallies;

/** A GPU's view without its readings (those go in `NodeView.gpuReadings`). */
function gpuView({ gpu: g, verdict, allocated, tallies }: GpuInputs): GpuView {
  // Most GPUs are sound and have seen no fault: no arrays for them.
  let problems: string[] | undefined;
  if (verdict !== undefined && !verdict.healthy) {
    problems = [];
    if (verdict.lost) problems.push(LOST);
    for (const p of verdict.problems) problems.push(p.code);
    if (verdict.faults.length > 0) problems.push(FAULT);
  }
  let faultsSeen: { code: number; kind: string; action: string; count: number }[] | undefined;
  if (tallies.length > 0) {
    faultsSeen = [];
    for (const t of tallies) {
      if (t.gpu !== g.index) continue;
      faultsSeen.push({ code: t.code, kind: t.kind, action: t.action, count: t.count });
    }
  }
  return {
    index: g.index,
    uuid: g.uuid,
    name: g.name,
    gpuClass: g.gpuClass ?? "",
    memoryTotalBytes: g.memoryTotalBytes,
    healthy: verdict?.healthy ?? false,
    healthProblems: problems !== undefined && problems.length > 0 ? problems : undefined,
    faultsSeen: faultsSeen !== undefined && faultsSeen.length > 0 ? faultsSeen : undefined,
    mig: g.migEnabled,
    allocatedDeployment: allocated,
  };
}

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
  // Ports change only when a heartbeat reports them (a new list).
  const portsOf = new WeakMap<readonly PortSnapshot[], readonly PortView[]>();
  const ports = (list: readonly PortSnapshot[]): readonly PortView[] => {
    let out = portsOf.get(list);
    if (out === undefined) {
      out = list.map((p) => ({ device: p.device, port: p.port, healthy: p.healthy }));
      portsOf.set(list, out);
    }
    return out;
  };
  // Each node's GPU views apart from readings, as the last scrape built them: the same
  // objects while their inputs are (see `NodeView.gpuReadings`).
  let fixedGpus = new Map<string, FixedGpus>();
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
      const kept = new Map<string, FixedGpus>();
      const out = cluster.nodeSnapshots().map((n): NodeView => {
        const allocated = allocatedBy.get(n.id);
        const before = fixedGpus.get(n.id);
        const inventoryGpus = n.inventory.gpus;
        const count = inventoryGpus.length;
        const readings: (GpuReadingView | undefined)[] = new Array(count);
        // Allocation-free while nothing but readings moved (every GPU of every scrape).
        let fixed = before !== undefined && before.gpus.length === count ? before : undefined;
        let healthy = true;
        for (let i = 0; i < count; i++) {
          const g = inventoryGpus[i] as InventoryGpu;
          const verdict = n.health[i];
          if (
            fixed !== undefined &&
            !sameInputs(fixed.inputs[i], g, verdict, allocated?.get(g.index), n.faultTallies)
          )
            fixed = undefined;
          // The registration's values until a heartbeat brings readings.
          readings[i] = n.readings.get(g.index) ?? g;
          healthy &&= verdict?.healthy ?? false;
        }
        if (fixed === undefined) {
          const inputs: GpuInputs[] = [];
          const gpus: GpuView[] = [];
          for (let i = 0; i < count; i++) {
            const g = inventoryGpus[i] as InventoryGpu;
            const verdict = n.health[i];
            const held = allocated?.get(g.index);
            const was = before?.inputs[i];
            // A GPU whose own inputs did not move keeps its view (and its cached lines).
            if (sameInputs(was, g, verdict, held, n.faultTallies)) {
              inputs.push(was);
              gpus.push(before?.gpus[i] as GpuView);
            } else {
              const input = { gpu: g, verdict, allocated: held, tallies: n.faultTallies };
              inputs.push(input);
              gpus.push(gpuView(input));
            }
          }
          fixed = { inputs, gpus };
        }
        kept.set(n.id, fixed);
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
          gpus: fixed.gpus,
          gpuReadings: readings,
          ports: ports(n.ports),
          fabrics: fabrics(n.inventory),
        };
      });
      fixedGpus = kept;
      return out;
    },
    deployments(): DeploymentView[] {
      return currentMembership().deployments.map((d) => ({
        ...d,
        unschedulable: cluster.unschedulableReasons(d.name).length > 0,
        invalid: cluster.invalidReason(d.name) !== undefined,
      }));
    },
    replicas(): readonly ReplicaView[] {
      return currentMembership().replicas;
    },
  };
}
