import type {
  ClusterView,
  DeploymentView,
  GpuView,
  NodeView,
  ReplicaState,
  ReplicaView,
  RouterView,
} from "../cluster-view.js";
import type { RouterMetrics } from "../router-metrics.js";

const MIB = 1024 * 1024;

/**
 * A real, mutable {@link ClusterView} for tests and benchmarks: holds plain arrays and lets a
 * test replace them between scrapes, the way heartbeats change control-plane state.
 */
export class FakeClusterView implements ClusterView {
  nodeList: NodeView[];
  deploymentList: DeploymentView[];
  replicaList: ReplicaView[];
  routerList: RouterView[];
  /** Set to make every accessor throw (a broken control plane). */
  failWith: Error | undefined;

  constructor(
    init: {
      nodes?: NodeView[];
      deployments?: DeploymentView[];
      replicas?: ReplicaView[];
      routers?: RouterView[];
    } = {},
  ) {
    this.nodeList = init.nodes ?? [];
    this.deploymentList = init.deployments ?? [];
    this.replicaList = init.replicas ?? [];
    this.routerList = init.routers ?? [];
    this.failWith = undefined;
  }
  nodes(): readonly NodeView[] {
    if (this.failWith) throw this.failWith;
    return this.nodeList;
  }
  deployments(): readonly DeploymentView[] {
    if (this.failWith) throw this.failWith;
    return this.deploymentList;
  }
  replicas(): readonly ReplicaView[] {
    if (this.failWith) throw this.failWith;
    return this.replicaList;
  }
  routers(): readonly RouterView[] {
    if (this.failWith) throw this.failWith;
    return this.routerList;
  }
  /** Replaces one node (matched by id) with `update(node)`. */
  updateNode(id: string, update: (node: NodeView) => NodeView): void {
    this.nodeList = this.nodeList.map((n) => (n.id === id ? update(n) : n));
  }
}

/**
 * An H100 as nvidia-smi reported it in the reference capture (formats.md, the 100 % / 59 °C
 * row: 81559 MiB total, 19818 MiB used, 631.95 W).
 */
export function h100Gpu(index: number, overrides: Partial<GpuView> = {}): GpuView {
  return {
    index,
    uuid: `GPU-00000000-0000-0000-0000-${String(index).padStart(12, "0")}`,
    name: "NVIDIA H100 80GB HBM3",
    gpuClass: "h100-80g",
    memoryTotalBytes: 81559 * MIB,
    memoryUsedBytes: 19818 * MIB,
    utilizationPercent: 100,
    eccUncorrectedErrors: 0,
    temperatureCelsius: 59,
    powerWatts: 631.95,
    healthy: true,
    mig: false,
    ...overrides,
  };
}

/** An L40S from the reference capture (46068 MiB, 1235 MiB used, 9 %, 54 °C, 110.23 W). */
export function l40sGpu(index: number, overrides: Partial<GpuView> = {}): GpuView {
  return {
    index,
    uuid: `GPU-00000000-0000-0000-0001-${String(index).padStart(12, "0")}`,
    name: "NVIDIA L40S",
    gpuClass: "l40s-45g",
    memoryTotalBytes: 46068 * MIB,
    memoryUsedBytes: 1235 * MIB,
    utilizationPercent: 9,
    eccUncorrectedErrors: 0,
    temperatureCelsius: 54,
    powerWatts: 110.23,
    healthy: true,
    mig: false,
    ...overrides,
  };
}

/** A ready, healthy node with the given GPUs. */
export function readyNode(
  id: string,
  gpus: GpuView[],
  overrides: Partial<NodeView> = {},
): NodeView {
  return {
    id,
    hostname: `${id}.dc1.example`,
    state: "ready",
    cordoned: false,
    draining: false,
    simulated: false,
    agentVersion: "0.1.0",
    lastHeartbeatUnixMs: 1_796_000_000_000,
    healthy: true,
    gpus,
    fabrics: [{ id: "ib-a", linkLayer: "infiniband" }],
    ...overrides,
  };
}

/** Shape of {@link buildSyntheticCluster}'s cluster. */
export interface SyntheticClusterSpec {
  nodes: number;
  gpusPerNode: number;
  replicas: number;
  /** GPUs per replica (tensor parallel). Default 2. */
  gpusPerReplica?: number;
  /** Deployments the replicas are spread over. Default 20. */
  deployments?: number;
}

/**
 * A realistic large cluster, deterministic: H100 nodes on four InfiniBand islands plus a
 * slice of L40S nodes on RoCE, a few unreachable/lost/cordoned nodes, an unhealthy GPU here
 * and there, some GPUs whose utilisation was never reported, and `replicas` replicas spread
 * over the deployments with allocated GPUs. For tests at small sizes and the scrape benchmark
 * at 1,000 nodes × 8 GPUs.
 */
export function buildSyntheticCluster(spec: SyntheticClusterSpec): FakeClusterView {
  const perReplica = spec.gpusPerReplica ?? 2;
  const deploymentCount = spec.deployments ?? 20;
  const nodes: NodeView[] = [];
  for (let n = 0; n < spec.nodes; n++) {
    const l40s = n % 10 === 9;
    const gpus: GpuView[] = [];
    for (let i = 0; i < spec.gpusPerNode; i++) {
      const unhealthy = (n * spec.gpusPerNode + i) % 97 === 13;
      const unreported = (n * spec.gpusPerNode + i) % 53 === 7;
      const overrides: Partial<GpuView> = {
        uuid: `GPU-${n.toString(16).padStart(8, "0")}-0000-0000-0000-${i.toString(16).padStart(12, "0")}`,
        utilizationPercent: unreported ? undefined : (n * 7 + i * 13) % 101,
        temperatureCelsius: unreported ? undefined : 40 + ((n + i) % 40),
        eccUncorrectedErrors: unhealthy ? 3 : 0,
        healthy: !unhealthy,
        ...(unhealthy
          ? {
              healthProblems: ["LLMGW_DISCOVERY_GPU_ECC_UNCORRECTED", "LLMGW_DISCOVERY_GPU_FAULT"],
              faultsSeen: [{ code: 48, kind: "xid", action: "reset-gpu", count: 1 }],
            }
          : {}),
      };
      gpus.push(l40s ? l40sGpu(i, overrides) : h100Gpu(i, overrides));
    }
    const state = n % 250 === 17 ? "lost" : n % 100 === 42 ? "unreachable" : "ready";
    nodes.push(
      readyNode(`node-${String(n).padStart(4, "0")}`, gpus, {
        state,
        cordoned: n % 150 === 3,
        agentVersion: n % 5 === 0 ? "0.1.0" : "0.1.1",
        lastHeartbeatUnixMs: 1_796_000_000_000 + n * 10,
        fabrics: l40s
          ? [{ id: "roce-1", linkLayer: "roce" }]
          : [{ id: `ib-${n % 4}`, linkLayer: "infiniband" }],
        // One port per InfiniBand node, a few flapping; RoCE nodes do not report port health.
        ports: l40s
          ? [{ device: "mlx5_bond_0", port: 1 }]
          : [{ device: "mlx5_0", port: 1, healthy: n % 61 !== 5 }],
      }),
    );
  }

  const deployments: DeploymentView[] = [];
  for (let d = 0; d < deploymentCount; d++) {
    deployments.push({
      name: `model-${d}`,
      desired: 0,
      ready: 0,
      unschedulable: false,
      gpuClass: "h100-80g",
      engine: d % 2 === 0 ? "vllm" : "sglang",
    });
  }
  const states: ReplicaState[] = [
    "ready",
    "ready",
    "ready",
    "ready",
    "ready",
    "ready",
    "loading",
    "starting",
    "pending",
    "failed",
  ];
  const replicas: ReplicaView[] = [];
  let cursor = 0;
  const free: { node: number; gpu: number }[] = [];
  nodes.forEach((node, ni) => {
    if (node.state !== "ready" || node.cordoned) return;
    node.gpus.forEach((g, gi) => {
      if (g.healthy && g.gpuClass === "h100-80g") free.push({ node: ni, gpu: gi });
    });
  });
  for (let r = 0; r < spec.replicas; r++) {
    const d = r % deploymentCount;
    const dep = deployments[d]!;
    const state = states[r % states.length]!;
    replicas.push({ id: `${dep.name}-r${r}`, deployment: dep.name, state });
    deployments[d] = {
      ...dep,
      desired: dep.desired + 1,
      ready: dep.ready + (state === "ready" ? 1 : 0),
    };
    if (state === "pending") {
      deployments[d] = { ...deployments[d]!, unschedulable: true };
      continue;
    }
    for (let k = 0; k < perReplica && cursor < free.length; k++, cursor++) {
      const slot = free[cursor]!;
      const node = nodes[slot.node]!;
      const gpus = [...node.gpus];
      gpus[slot.gpu] = { ...gpus[slot.gpu]!, allocatedDeployment: dep.name };
      nodes[slot.node] = { ...node, gpus };
    }
  }
  return new FakeClusterView({ nodes, deployments, replicas });
}

export {
  familyNamesInExposition,
  type ParsedExposition,
  type ParsedSample,
  parseExposition,
} from "./exposition.js";
export { metricNamesInPromQL, promQLInDashboard } from "./promql.js";

/**
 * Records one sample in every router family, the way the router would over a few requests
 * (model `llama`, replica `llama-0`), so a scrape shows every family with series.
 */
export function exerciseRouterMetrics(m: RouterMetrics): void {
  const model = "llama";
  m.requests.inc({ model, endpoint: "chat_completions", code: "200" });
  m.requests.inc({ model, endpoint: "chat_completions", code: "429" });
  m.requestDuration.observe({ model, endpoint: "chat_completions" }, 0.42);
  m.timeToFirstToken.observe({ model }, 0.08);
  m.interChunk.observe({ model }, 0.012);
  m.promptTokens.inc({ model }, 812);
  m.completionTokens.inc({ model }, 64);
  m.inFlight.set({ model }, 3);
  m.replicaInFlight.set({ model, replica: "llama-0" }, 2);
  m.queueDepth.set({ model }, 1);
  m.queueWait.observe({ model, outcome: "admitted" }, 0.2);
  m.admissionRejections.inc({ model, reason: "queue_full" });
  m.upstreamErrors.inc({ model, replica: "llama-0", kind: "connect" });
  m.retries.inc({ model });
  m.cachedPromptTokens.inc({ model }, 1024);
  m.prefixPredictions.inc({ model, source: "precise", outcome: "hit" });
  m.affinityHints.inc({ model, source: "prompt_cache_key" });
  m.setCircuitState(model, "llama-0", "open");
  m.circuitTransitions.inc({ model, replica: "llama-0", to: "open" });
  m.routingDecision.observe({ model, path: "inline" }, 0.00002);
  m.chosenScore.observe({ model }, 0.7);
  m.prefixHitRatio.observe({ model }, 0.5);
  m.prefixHitRequests.inc({ model });
  m.routingFallbacks.inc({ model, reason: "missing_load_signals" });
  m.clientDisconnects.inc({ model, phase: "streaming" });
  m.scoringTasks.inc({ path: "pool" });
  m.authFailures.inc({ reason: "invalid" });
  m.rateLimited.inc({ key_name: "team-a", limit: "requests" });
  m.replicasAvailable.set({ model }, 2);
  m.bytes.inc({ model, endpoint: "chat_completions", direction: "in" }, 1200);
  m.bytes.inc({ model, endpoint: "chat_completions", direction: "out" }, 3400);
}
