/**
 * What a node is made of, as plain data (numbers, not protobuf bigints). These types mirror
 * `llmgw.v1.NodeInventory` in proto/llmgw/v1/inventory.proto field for field; apps convert at
 * the wire boundary. Absent is not zero: an optional field nobody reported stays `undefined`.
 */

/** A problem found while discovering; `code` is stable (see the package README's table). */
export interface Problem {
  readonly code: string;
  readonly message: string;
  /** Where it came from: "nvidia-smi", "sysfs", "topology", "host", ... */
  readonly source: string;
}

/** One physical GPU with its latest readings and health. */
export interface Gpu {
  readonly index: number;
  readonly uuid: string;
  /** As printed by nvidia-smi, e.g. "NVIDIA H100 80GB HBM3". */
  readonly name: string;
  /** e.g. "h100-80g" (DESIGN §2); undefined when memory.total was not reported. */
  readonly gpuClass?: string;
  /** nvidia-smi's 8-hex-digit-domain form, e.g. "00000000:00:09.0". */
  readonly pciBusId: string;
  readonly memoryTotalBytes?: number;
  /** "major.minor", e.g. "9.0"; undefined on drivers too old to report it. */
  readonly computeCapability?: string;
  readonly migEnabled: boolean;
  readonly memoryUsedBytes?: number;
  readonly utilizationPercent?: number;
  readonly eccUncorrectedErrors?: number;
  readonly temperatureCelsius?: number;
  readonly powerWatts?: number;
  /** False when any health problem is present. Unhealthy GPUs are reported, never hidden. */
  readonly healthy: boolean;
  readonly healthProblems: readonly Problem[];
  /** Memory held by processes llmgw does not manage. */
  readonly unmanagedMemoryBytes?: number;
  /** The GPU could not be queried at all ("fallen off the bus"). */
  readonly lost: boolean;
  /** Absent: `"nvidia"` (inventories from before AMD support). */
  readonly vendor?: GpuVendor;
  /** Health readings beyond the basics; absent when the tool reported none of them. */
  readonly health?: GpuHealthReadings;
  /** Kernel-log faults that affect this GPU (see {@link GpuFault}); absent or empty: none. */
  readonly faults?: readonly GpuFault[];
}

/**
 * What of a GPU changes while it runs: the part an agent reports with every heartbeat, apart
 * from the identity and static facts registration already carried.
 */
export type GpuReading = Pick<
  Gpu,
  | "index"
  | "uuid"
  | "memoryUsedBytes"
  | "utilizationPercent"
  | "eccUncorrectedErrors"
  | "temperatureCelsius"
  | "powerWatts"
  | "healthy"
  | "healthProblems"
  | "unmanagedMemoryBytes"
  | "lost"
  | "health"
  | "faults"
>;

export type GpuVendor = "nvidia" | "amd";

/**
 * Health readings of one GPU (mirrors `llmgw.v1.GpuHealthReadings`). Every field is optional:
 * a driver too old to know a field leaves it undefined, never 0 or false.
 */
export interface GpuHealthReadings {
  /** A row remap is pending: it takes effect at the next GPU reset. */
  readonly remappedRowsPending?: boolean;
  /** A row could not be remapped. */
  readonly remappedRowsFailure?: boolean;
  readonly remappedRowsCorrectable?: number;
  readonly remappedRowsUncorrectable?: number;
  readonly retiredPagesSingleBit?: number;
  readonly retiredPagesDoubleBit?: number;
  readonly retiredPagesPending?: boolean;
  /** NVML clock-event-reason bitmask active now; a reading (thermal/power slowdown), not a fault. */
  readonly clocksEventReasonsActive?: number;
  readonly pcieLinkGenCurrent?: number;
  readonly pcieLinkGenMax?: number;
  readonly pcieLinkWidthCurrent?: number;
  readonly pcieLinkWidthMax?: number;
  readonly nvlinksTotal?: number;
  readonly nvlinksInactive?: number;
  /** nvidia-smi's `gpu_recovery_action`, e.g. "None", "Reset". */
  readonly recoveryAction?: string;
  /** AMD RAS deferred errors. */
  readonly eccDeferredErrors?: number;
}

/** What llmgw does about a kernel-log fault, mildest first (see `classifyXid`). */
export type FaultAction = "ignore" | "restart-engine" | "reset-gpu" | "drain-node" | "reboot";

/**
 * One hardware fault read from the kernel log, folded per (kind, device, code); mirrors
 * `llmgw.v1.GpuFault`.
 */
export interface GpuFault {
  readonly kind: "xid" | "sxid" | "fallen-off-bus";
  /** Xid or SXid code; 79 for fallen-off-bus. */
  readonly code: number;
  readonly action: FaultAction;
  /** nvidia-smi's form of the device the record names, e.g. "00000000:9B:00.0". */
  readonly pciBusId: string;
  /** Records folded in since the fault was first seen. */
  readonly count: number;
  readonly firstSeenUnixMs: number;
  readonly lastSeenUnixMs: number;
  /** The record that opened the fault, as printed (bounded). */
  readonly evidence: string;
  /** The catalog's description, e.g. "GPU has fallen off the bus". */
  readonly description: string;
  readonly bootId?: string;
  /** kmsg sequence number of the first record; absent for text logs. */
  readonly seq?: number;
}

export type LinkLayer = "infiniband" | "roce" | "unknown";

/** One RDMA port from /sys/class/infiniband/<device>/ports/<port>. */
export interface Port {
  /** e.g. "mlx5_0", "ibp12s0", "rocep193s0f0", "mlx5_bond_0". */
  readonly device: string;
  readonly port: number;
  readonly linkLayer: LinkLayer;
  /** e.g. "ACTIVE", "DOWN", "INIT". */
  readonly state: string;
  /** e.g. "LinkUp", "Polling", "Disabled". */
  readonly physState: string;
  readonly rateGbps?: number;
  readonly netdev?: string;
  /** RoCE v2 GID index for NCCL_IB_GID_INDEX; undefined on IB or when none is usable. */
  readonly gidIndex?: number;
  readonly numaNode?: number;
  /** node_guid, e.g. "1070:fd03:0027:250b". */
  readonly guid?: string;
  /** IB: upper 64 bits of GID 0, e.g. "fe80:0000:0000:0000". */
  readonly subnetPrefix?: string;
  /** IB: e.g. "0x1". */
  readonly smLid?: string;
  /** RoCE: IPv4 address of the chosen RoCE v2 GID. */
  readonly ipv4?: string;
  /** PCI address of the RDMA device, e.g. "0000:3b:00.0". */
  readonly pciBusId?: string;
  /** Error counters, flaps and the verdict; absent when the port's health was not read. */
  readonly health?: PortHealth;
}

/** The health of one RDMA port over time (mirrors `llmgw.v1.PortHealth`). */
export interface PortHealth {
  /** False when a threshold was crossed (flaps, error rates, a saturated counter). */
  readonly healthy: boolean;
  readonly problems: readonly Problem[];
  /** Times the port left ACTIVE within the last `flapWindowS` seconds. */
  readonly flaps: number;
  readonly flapWindowS: number;
  readonly counters: readonly PortCounter[];
}

/** One sysfs error counter of an RDMA port. */
export interface PortCounter {
  /** e.g. "symbol_error", "link_downed". */
  readonly name: string;
  /** Undefined when the file could not be read. */
  readonly value?: number;
  /** New errors per second since the previous read; undefined on the first read, when saturated or unreadable. */
  readonly ratePerSecond?: number;
  /** At its maximum: the counter stops there (no wrap), so new errors are hidden. */
  readonly saturated: boolean;
}

/** Ports that can reach each other: one IB subnet or one RoCE IP subnet. */
export interface Fabric {
  /** Operator-given, or derived: "ib:<prefix>:<sm>" / "roce:<subnet>". */
  readonly id: string;
  readonly linkLayer: "infiniband" | "roce";
  readonly ports: readonly Port[];
  readonly idSource: "configured" | "derived";
}

/** Connection between two GPUs as `nvidia-smi topo -m` prints it. */
export interface GpuLink {
  readonly gpuA: number;
  readonly gpuB: number;
  /** "NV18", "PIX", "PXB", "PHB", "NODE", "SYS". */
  readonly path: string;
  /** Bonded NVLinks; 0 when PCIe only. */
  readonly nvlinks: number;
}

/** PCIe distance between a GPU and an RDMA NIC. */
export interface GpuNicAffinity {
  readonly gpu: number;
  /** RDMA device name from the NIC legend, e.g. "mlx5_0". */
  readonly nic: string;
  /** "PIX", "PXB", "PHB", "NODE", "SYS". */
  readonly path: string;
}

export interface GpuAffinity {
  readonly gpu: number;
  readonly cpuAffinity: string;
  readonly numaNode?: number;
}

export interface Topology {
  readonly gpuLinks: readonly GpuLink[];
  readonly gpuNics: readonly GpuNicAffinity[];
  readonly gpuAffinity: readonly GpuAffinity[];
}

export interface HostFacts {
  readonly cpuCount: number;
  readonly memoryBytes: number;
  readonly os: string;
  readonly osRelease: string;
  readonly arch: string;
}

/** Everything discovery found about one node, plus what it could not read. */
export interface NodeInventory {
  readonly hostname: string;
  readonly addresses: readonly string[];
  readonly agentVersion: string;
  readonly simulated: boolean;
  readonly host: HostFacts;
  readonly gpus: readonly Gpu[];
  /** Only ACTIVE + LinkUp ports belong to a fabric. A node with none is a single-node island. */
  readonly fabrics: readonly Fabric[];
  /** Ports that exist but do not count (DOWN, INIT, unknown link layer). */
  readonly inactivePorts: readonly Port[];
  readonly topology: Topology;
  readonly problems: readonly Problem[];
  readonly driverVersion?: string;
  readonly collectedAtUnixMs: number;
}
