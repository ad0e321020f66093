/** Node lifecycle state (DESIGN §6). */
export type NodeState = "ready" | "unreachable" | "lost";

/** Replica state as the wire contract names it, lower-cased. */
export type ReplicaState =
  | "pending"
  | "starting"
  | "loading"
  | "ready"
  | "unhealthy"
  | "stopping"
  | "exited"
  | "failed";

/**
 * One GPU as the control plane knows it: hardware from registration, readings from the last
 * heartbeat. Every reading is optional: `undefined` means nobody reported it, and the
 * matching series is then missing from the scrape (never 0).
 */
export interface GpuView {
  readonly index: number;
  readonly uuid: string;
  /** Product name from nvidia-smi, e.g. `NVIDIA H100 80GB HBM3`. */
  readonly name: string;
  /** GPU class, e.g. `h100-80g`. */
  readonly gpuClass: string;
  readonly memoryTotalBytes?: number;
  readonly memoryUsedBytes?: number;
  /** 0..100 as nvidia-smi reports it; exported as a 0..1 ratio. */
  readonly utilizationPercent?: number;
  readonly eccUncorrectedErrors?: number;
  readonly temperatureCelsius?: number;
  readonly powerWatts?: number;
  readonly healthy: boolean;
  readonly mig: boolean;
  /** Name of the deployment holding this GPU, if any. */
  readonly allocatedDeployment?: string;
  /** Codes of the problems keeping the GPU out of service now; absent or empty: none. */
  readonly healthProblems?: readonly string[];
  /** Distinct kernel-log faults seen, by code, kind and action (monotonic counts). */
  readonly faultsSeen?: readonly GpuFaultCount[];
}

/** A GPU's readings apart from its other fields (see {@link NodeView.gpuReadings}). */
export type GpuReadingView = Pick<
  GpuView,
  | "memoryUsedBytes"
  | "utilizationPercent"
  | "eccUncorrectedErrors"
  | "temperatureCelsius"
  | "powerWatts"
>;

/** How many distinct faults of one code, kind and action a GPU has had. */
export interface GpuFaultCount {
  readonly code: number;
  /** `xid|sxid|fallen-off-bus`. */
  readonly kind: string;
  /** `ignore|restart-engine|reset-gpu|drain-node|reboot`. */
  readonly action: string;
  readonly count: number;
}

/** One RDMA port of a node and its health verdict. */
export interface PortView {
  readonly device: string;
  readonly port: number;
  /** Undefined when the agent did not read the port's health (no series then). */
  readonly healthy?: boolean;
}

/** An RDMA fabric (island) a node is attached to. */
export interface FabricView {
  readonly id: string;
  readonly linkLayer: "infiniband" | "roce" | "unknown";
}

/** One registered node. */
export interface NodeView {
  readonly id: string;
  readonly hostname: string;
  readonly state: NodeState;
  readonly cordoned: boolean;
  readonly draining: boolean;
  readonly simulated: boolean;
  readonly agentVersion: string;
  /** Unix ms of the last heartbeat; `undefined` before the first one. */
  readonly lastHeartbeatUnixMs?: number;
  readonly healthy: boolean;
  readonly gpus: readonly GpuView[];
  /**
   * Optional: the readings of `gpus`, same order (undefined: none). When set, the walk reads
   * the readings from here, not from `gpus`: a view may then hand over the same `gpus` (array
   * and objects) from scrape to scrape while nothing else about them changed, and the walk
   * sees that by identity instead of comparing every GPU's fields.
   */
  readonly gpuReadings?: readonly (GpuReadingView | undefined)[];
  readonly fabrics: readonly FabricView[];
  /** RDMA ports; absent: none known. */
  readonly ports?: readonly PortView[];
}

/** One deployment and its rollout counters. */
export interface DeploymentView {
  readonly name: string;
  /** The model name clients send (the router's `model` label); defaults to `name`. */
  readonly servedModelName?: string;
  readonly desired: number;
  readonly ready: number;
  /** True when the scheduler could not place every desired replica. */
  readonly unschedulable: boolean;
  /** True when this release refuses the deployment's stored spec (absent: false). */
  readonly invalid?: boolean;
  readonly gpuClass: string;
  /** `vllm`, `sglang`, `llamacpp`, `sim`, … */
  readonly engine: string;
}

/** One replica of a deployment. */
export interface ReplicaView {
  readonly id: string;
  readonly deployment: string;
  readonly state: ReplicaState;
  /** Set while it leaves service (a scale-down, an update, a drain, an undeploy). */
  readonly leaving?: "waiting" | "draining";
}

/** A router the control plane streams routing to: connected now, or recently. */
export interface RouterView {
  readonly id: string;
  /** True while its routing stream (or the in-process feed) is attached. */
  readonly connected: boolean;
}

/**
 * The read-only view of cluster state that the control plane implements for the collector.
 * Called synchronously on every scrape (once per scrape, however many families read it), so
 * it must return what is already in memory, never do I/O.
 */
export interface ClusterView {
  nodes(): readonly NodeView[];
  deployments(): readonly DeploymentView[];
  replicas(): readonly ReplicaView[];
  /** Routers known to the control plane; absent: no `llmgw_routers` series. */
  routers?(): readonly RouterView[];
}
