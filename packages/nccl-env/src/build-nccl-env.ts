/**
 * Derives the NCCL/Gloo environment of one rank from what discovery found on its node.
 * Pure: data in, data out. The input types are the structural subset of `@llmgw/discovery`'s
 * `Fabric`, `Port` and `GpuNicAffinity` this builder reads, so a discovery inventory can be
 * passed as is.
 */
import { NcclEnvError } from "./errors.js";

/** The fields of discovery's `Port` this builder reads. */
export interface NcclPort {
  /** RDMA device, e.g. "mlx5_0", "ibp12s0", "mlx5_bond_0". */
  readonly device: string;
  readonly port: number;
  readonly linkLayer: "infiniband" | "roce" | "unknown";
  /** Only "ACTIVE" ports are ever listed. */
  readonly state: string;
  /** When present, only "LinkUp" ports are listed. */
  readonly physState?: string;
  readonly netdev?: string;
  /** RoCE v2 GID index, when discovery found a usable one. */
  readonly gidIndex?: number;
}

/** The fields of discovery's `Fabric` this builder reads. */
export interface NcclFabric {
  readonly id: string;
  readonly linkLayer: "infiniband" | "roce";
  readonly ports: readonly NcclPort[];
}

/** PCIe distance between a GPU and an RDMA NIC (`nvidia-smi topo -m`). */
export interface NcclGpuNic {
  readonly gpu: number;
  /** RDMA device name from topo's NIC legend, e.g. "mlx5_0". */
  readonly nic: string;
  /** "PIX", "PXB", "PHB", "NODE" or "SYS". */
  readonly path: string;
}

/** Input of {@link buildNcclEnv}. */
export interface BuildNcclEnvOptions {
  /** This node's fabrics (discovery's `NodeInventory.fabrics`). */
  readonly fabrics: readonly NcclFabric[];
  /** The fabric every rank of the group shares; required when `multiNode`. */
  readonly chosenFabricId?: string;
  /** Indices (nvidia-smi order) of the GPUs this rank uses; orders NICs nearest first. */
  readonly rankGpus: readonly number[];
  /** GPU↔NIC distances (discovery's `topology`); without them NICs keep name order. */
  readonly topology?: { readonly gpuNics: readonly NcclGpuNic[] };
  /** False for a group on one node: then nothing network-related is set at all. */
  readonly multiNode: boolean;
  /** Interface for bootstrap and Gloo, overriding the fabric port's netdev (node config). */
  readonly socketIfname?: string;
}

/** What {@link buildNcclEnv} decided, and why. */
export interface NcclEnvReport {
  /** Variables to add to the rank's environment. */
  readonly env: Readonly<Record<string, string>>;
  /** One human sentence per decision, in the order taken. */
  readonly reasons: readonly string[];
  /** The RDMA devices listed in `NCCL_IB_HCA`, nearest first (empty for a single node). */
  readonly adapters: readonly string[];
}

/** Variables {@link buildNcclEnv} may set; nothing else is ever written. */
export const NCCL_ENV_KEYS = [
  "NCCL_IB_HCA",
  "NCCL_IB_GID_INDEX",
  "NCCL_SOCKET_IFNAME",
  "GLOO_SOCKET_IFNAME",
] as const;

/** topo -m distance words, nearest first; unknown words and missing entries sort after SYS. */
const DISTANCE_ORDER = ["PIX", "PXB", "PHB", "NODE", "SYS"] as const;
const SAFE_NAME = /^[A-Za-z0-9_.-]+$/;

/**
 * Builds the NCCL/Gloo environment for one rank.
 *
 * - Single node (`multiNode: false`): returns no variables; NVLink/PCIe peer-to-peer needs none
 *   and a stale network setting is exactly what makes a later job hang.
 * - Multi-node: `NCCL_IB_HCA` is an exact-match list (`=` prefix, so `mlx5_1` never matches
 *   `mlx5_10`) of the chosen fabric's ACTIVE (+LinkUp) ports with port numbers, nearest to the
 *   rank's GPUs first (PIX < PXB < PHB < NODE < SYS, ties by name); `NCCL_IB_GID_INDEX` on RoCE
 *   when every listed port agrees on a discovered index; `NCCL_SOCKET_IFNAME` (`=name`, exact)
 *   and `GLOO_SOCKET_IFNAME` (`name`: Gloo takes plain exact names) for `socketIfname` or the
 *   nearest listed port's netdev.
 *
 * @throws NcclEnvError `LLMGW_NCCL_ENV_NO_FABRIC_CHOSEN`, `…_FABRIC_MISSING`,
 *   `…_NO_ACTIVE_PORTS`, `…_NO_SOCKET_INTERFACE`, `…_INVALID_NAME`.
 */
export function buildNcclEnv(options: BuildNcclEnvOptions): NcclEnvReport {
  if (!options.multiNode) {
    return {
      env: {},
      reasons: [
        "single-node group: NVLink/PCIe peer-to-peer needs no network settings, so no NCCL_*/GLOO_* is set",
      ],
      adapters: [],
    };
  }
  const fabricId = options.chosenFabricId;
  if (fabricId === undefined || fabricId === "") {
    throw new NcclEnvError(
      "LLMGW_NCCL_ENV_NO_FABRIC_CHOSEN",
      "a multi-node group needs a chosen fabric; leaving NCCL_IB_HCA open lets NCCL pick an adapter the peers cannot reach",
    );
  }
  const fabric = options.fabrics.find((f) => f.id === fabricId);
  if (fabric === undefined) {
    const have = options.fabrics.map((f) => f.id);
    throw new NcclEnvError(
      "LLMGW_NCCL_ENV_FABRIC_MISSING",
      `fabric ${JSON.stringify(fabricId)} is not on this node (it has ${have.length === 0 ? "no fabric" : have.map((id) => JSON.stringify(id)).join(", ")})`,
    );
  }
  const reasons: string[] = [];
  const active = fabric.ports.filter(
    (p) => p.state === "ACTIVE" && (p.physState === undefined || p.physState === "LinkUp"),
  );
  const skipped = fabric.ports.filter((p) => !active.includes(p));
  for (const p of skipped) {
    reasons.push(
      `skipped ${p.device}:${p.port}: state ${p.state}${p.physState ? `/${p.physState}` : ""}, not ACTIVE/LinkUp`,
    );
  }
  if (active.length === 0) {
    throw new NcclEnvError(
      "LLMGW_NCCL_ENV_NO_ACTIVE_PORTS",
      `fabric ${JSON.stringify(fabricId)} has no ACTIVE port on this node`,
    );
  }
  for (const p of active) {
    if (!SAFE_NAME.test(p.device)) {
      throw new NcclEnvError(
        "LLMGW_NCCL_ENV_INVALID_NAME",
        `RDMA device name ${JSON.stringify(p.device)} cannot be listed in NCCL_IB_HCA`,
      );
    }
  }

  const gpus = options.rankGpus;
  const distance = (device: string): number => {
    let best: number = DISTANCE_ORDER.length;
    for (const link of options.topology?.gpuNics ?? []) {
      if (link.nic !== device || !gpus.includes(link.gpu)) continue;
      const d = (DISTANCE_ORDER as readonly string[]).indexOf(link.path);
      if (d >= 0 && d < best) best = d;
    }
    return best;
  };
  const ranked = active
    .map((p) => ({ p, d: distance(p.device) }))
    .sort((a, b) => a.d - b.d || compareNames(a.p.device, b.p.device) || a.p.port - b.p.port);

  const env: Record<string, string> = {};
  const entries = ranked.map(({ p }) => `${p.device}:${p.port}`);
  env.NCCL_IB_HCA = `=${entries.join(",")}`;
  const otherFabrics = options.fabrics.filter((f) => f.id !== fabricId).map((f) => f.id);
  reasons.push(
    `NCCL_IB_HCA lists the ${entries.length} ACTIVE ${fabric.linkLayer} port(s) of fabric ${fabricId} as exact names ("=" so e.g. mlx5_1 cannot match mlx5_10)` +
      (otherFabrics.length > 0
        ? `; ports of ${otherFabrics.join(", ")} are left out because the peers are not on them`
        : ""),
  );
  const order = ranked.map(
    ({ p, d }) =>
      `${p.device}:${p.port} ${d < DISTANCE_ORDER.length ? DISTANCE_ORDER[d] : "unknown distance"}`,
  );
  reasons.push(
    gpus.length > 0
      ? `ordered nearest to GPU(s) ${gpus.join(",")} first: ${order.join(", ")}`
      : `no GPUs on this rank: adapters in name order (${order.join(", ")})`,
  );

  if (fabric.linkLayer === "roce") {
    const indices = new Set(ranked.map(({ p }) => p.gidIndex));
    const only = [...indices][0];
    if (indices.size === 1 && only !== undefined) {
      env.NCCL_IB_GID_INDEX = String(only);
      reasons.push(
        `NCCL_IB_GID_INDEX=${only}: the RoCE v2 GID index discovery found on every listed port`,
      );
    } else if (indices.size === 1) {
      reasons.push(
        "NCCL_IB_GID_INDEX left unset: discovery found no RoCE v2 GID index, NCCL auto-selects",
      );
    } else {
      reasons.push(
        `NCCL_IB_GID_INDEX left unset: listed ports disagree (${ranked.map(({ p }) => `${p.device}=${p.gidIndex ?? "none"}`).join(", ")}), NCCL auto-selects per port`,
      );
    }
  }

  let ifname = options.socketIfname;
  if (ifname !== undefined) {
    reasons.push(`socket interface ${ifname} as configured on this node`);
  } else {
    const withNetdev = ranked.find(({ p }) => p.netdev !== undefined && p.netdev !== "");
    if (withNetdev === undefined) {
      throw new NcclEnvError(
        "LLMGW_NCCL_ENV_NO_SOCKET_INTERFACE",
        `no port of fabric ${JSON.stringify(fabricId)} has a network interface; configure the socket interface that reaches the peers`,
      );
    }
    ifname = withNetdev.p.netdev as string;
    reasons.push(
      `socket interface ${ifname}: the netdev of ${withNetdev.p.device}:${withNetdev.p.port}, which is on the peers' fabric`,
    );
  }
  if (!SAFE_NAME.test(ifname)) {
    throw new NcclEnvError(
      "LLMGW_NCCL_ENV_INVALID_NAME",
      `interface name ${JSON.stringify(ifname)} cannot be listed in NCCL_SOCKET_IFNAME`,
    );
  }
  env.NCCL_SOCKET_IFNAME = `=${ifname}`;
  env.GLOO_SOCKET_IFNAME = ifname;
  reasons.push(
    `NCCL_SOCKET_IFNAME==${ifname} (exact) and GLOO_SOCKET_IFNAME=${ifname} (Gloo takes plain exact names) for bootstrap and CPU groups`,
  );
  return { env, reasons, adapters: ranked.map(({ p }) => p.device) };
}

/** Natural order so mlx5_2 sorts before mlx5_10. */
function compareNames(a: string, b: string): number {
  return a.localeCompare(b, "en", { numeric: true });
}
