import { toJsonString } from "@bufbuild/protobuf";
import {
  applyKernelFaults,
  type DiscoveryOptions,
  discoverNode,
  faultWord,
  type Gpu,
  isUnhealthyFault,
  type NodeInventory,
  ProblemCodes,
  readAddresses,
  readKernelLogFaults,
  simulateInventory,
} from "@llmgw/discovery";
import { NodeInventorySchema } from "@llmgw/proto";
import { inventoryToProto } from "@llmgw/wire";

/** Inputs of {@link collectInventory}: discovery options, or a simulated node. */
export interface InventoryOptions {
  /** `<count>x<class>[,…][@<fabric>]`: a simulated node instead of reading this machine. */
  readonly simulate?: string;
  readonly nvidiaSmiPath?: string;
  readonly amdSmiPath?: string;
  readonly rocmSmiPath?: string;
  readonly sysfsRoot?: string;
  /** Operator fabric ids by RDMA device (`mlx5_0` → `rail-0`); config wins over derived ids. */
  readonly fabricNames?: Readonly<Record<string, string>>;
  readonly timeoutMs?: number;
  readonly agentVersion?: string;
  readonly hostname?: string;
  readonly managedPids?: Iterable<number>;
  /** Milliseconds since the epoch. Default `Date.now`. */
  readonly clock?: () => number;
  /**
   * A kernel log to read once (`/dev/kmsg`, a file or a FIFO) for Xid/SXid faults, applied to
   * the GPUs (see `applyKernelFaults`); its read problems join the node problems. Absent: none.
   */
  readonly kernelLogPath?: string;
}

/**
 * What the scheduler would see of this node: `discoverNode` on the real machine, or
 * `simulateInventory` when `simulate` is given. Throws only `DiscoveryError` for bad options
 * or a bad simulate spec; machine trouble is in `problems`.
 */
export async function collectInventory(options: InventoryOptions = {}): Promise<NodeInventory> {
  const clock = options.clock ?? Date.now;
  const { kernelLogPath } = options;
  const inventory = await discoverOrSimulate(options, clock);
  if (kernelLogPath === undefined) return inventory;
  const report = await readKernelLogFaults(kernelLogPath, { clock });
  const applied = applyKernelFaults(inventory.gpus, report.faults);
  return {
    ...inventory,
    gpus: applied.gpus,
    problems: [...inventory.problems, ...report.problems, ...applied.problems],
  };
}

async function discoverOrSimulate(
  options: InventoryOptions,
  clock: () => number,
): Promise<NodeInventory> {
  if (options.simulate !== undefined) {
    return simulateInventory(options.simulate, {
      ...(options.hostname === undefined ? {} : { hostname: options.hostname }),
      ...(options.agentVersion === undefined ? {} : { agentVersion: options.agentVersion }),
      addresses: readAddresses(),
      nowMs: clock(),
    });
  }
  const discovery: DiscoveryOptions = {
    ...(options.nvidiaSmiPath === undefined ? {} : { nvidiaSmiPath: options.nvidiaSmiPath }),
    ...(options.amdSmiPath === undefined ? {} : { amdSmiPath: options.amdSmiPath }),
    ...(options.rocmSmiPath === undefined ? {} : { rocmSmiPath: options.rocmSmiPath }),
    ...(options.sysfsRoot === undefined ? {} : { sysfsRoot: options.sysfsRoot }),
    ...(options.fabricNames === undefined ? {} : { fabricNames: options.fabricNames }),
    ...(options.timeoutMs === undefined ? {} : { timeoutMs: options.timeoutMs }),
    ...(options.agentVersion === undefined ? {} : { agentVersion: options.agentVersion }),
    ...(options.hostname === undefined ? {} : { hostname: options.hostname }),
    ...(options.managedPids === undefined ? {} : { managedPids: options.managedPids }),
    clock,
  };
  return discoverNode(discovery);
}

/**
 * The protobuf JSON form (lowerCamelCase, uint64 as strings, 2-space indent) of the
 * inventory. Implicit-presence fields are always emitted, so GPU index 0, `healthy: false` and
 * empty lists are visible to scripts; `optional` readings that were not reported stay absent.
 */
export function inventoryToJson(inv: NodeInventory): string {
  return toJsonString(NodeInventorySchema, inventoryToProto(inv), {
    prettySpaces: 2,
    alwaysEmitImplicit: true,
  });
}

const GIB = 1024 ** 3;
const dash = (value: string | undefined): string =>
  value === undefined || value === "" ? "-" : value;
const gib = (bytes: number | undefined) =>
  bytes === undefined ? undefined : `${(bytes / GIB).toFixed(1)} GiB`;

/** One word per GPU health problem for the HEALTH cell; an unknown code prints as itself. */
const HEALTH_WORDS: Record<string, string> = {
  [ProblemCodes.gpuEccUncorrected]: "ecc-errors",
  [ProblemCodes.gpuUnmanagedMemory]: "foreign-processes",
  [ProblemCodes.gpuMigEnabled]: "mig",
  [ProblemCodes.gpuLost]: "lost",
  [ProblemCodes.gpuRowRemapPending]: "row-remap-pending",
  [ProblemCodes.gpuRowRemapFailure]: "row-remap-failed",
  [ProblemCodes.gpuRetiredPagesPending]: "pages-pending",
  [ProblemCodes.gpuRecoveryAction]: "recovery-action",
  [ProblemCodes.gpuNvlinkInactive]: "nvlink-inactive",
  [ProblemCodes.gpuPcieDegraded]: "pcie-degraded",
  [ProblemCodes.gpuRasUncorrected]: "ras-errors",
};

/**
 * The HEALTH cell: `ok`, or one word per health problem; kernel-log faults name themselves
 * (`xid-79`, `sxid-24007`, `fallen-off-bus`).
 */
function healthWords(g: Gpu): string {
  if (g.healthy) return "ok";
  const words: string[] = [];
  for (const p of g.healthProblems) {
    if (p.code !== ProblemCodes.gpuFault) words.push(HEALTH_WORDS[p.code] ?? p.code);
  }
  for (const f of g.faults ?? []) if (isUnhealthyFault(f)) words.push(faultWord(f));
  return [...new Set(words)].join(",") || "unhealthy";
}

function table(headers: readonly string[], rows: readonly (readonly string[])[]): string[] {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)));
  const line = (cells: readonly string[]) =>
    cells
      .map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i] ?? 0)))
      .join("  ")
      .trimEnd();
  return [line(headers), ...rows.map(line)];
}

/**
 * Human output of `llmgw agent inventory`: a header line, a GPU table (index, name, class,
 * memory used/total, utilisation, temperature, ECC, health), a fabric-port table (device,
 * port, fabric, IB/RoCE, state, rate, netdev; inactive ports included), then problems.
 * Unreported values print as `-`, never `0`.
 */
export function formatInventoryTable(inv: NodeInventory): string {
  const out: string[] = [];
  out.push(
    `Node ${inv.hostname}${inv.simulated ? " (simulated)" : ""}  agent ${inv.agentVersion}  ${inv.host.os} ${inv.host.osRelease} ${inv.host.arch}  ${inv.host.cpuCount} CPUs  ${gib(inv.host.memoryBytes)}`,
  );
  out.push(`Addresses: ${inv.addresses.length > 0 ? inv.addresses.join(", ") : "-"}`, "");
  out.push(`GPUs (${inv.gpus.length})`);
  if (inv.gpus.length === 0) {
    out.push("  none");
  } else {
    const rows = inv.gpus.map((g) => [
      String(g.index),
      dash(g.name),
      dash(g.gpuClass),
      `${dash(gib(g.memoryUsedBytes))} / ${dash(gib(g.memoryTotalBytes))}`,
      g.utilizationPercent === undefined ? "-" : `${g.utilizationPercent}%`,
      g.temperatureCelsius === undefined ? "-" : `${g.temperatureCelsius}C`,
      g.eccUncorrectedErrors === undefined ? "-" : String(g.eccUncorrectedErrors),
      healthWords(g),
    ]);
    out.push(
      ...table(
        ["INDEX", "NAME", "CLASS", "MEMORY USED/TOTAL", "UTIL", "TEMP", "ECC", "HEALTH"],
        rows,
      ).map((l) => `  ${l}`),
    );
  }
  out.push("");
  const ports = [
    ...inv.fabrics.flatMap((f) => f.ports.map((p) => ({ p, fabric: f.id }))),
    ...inv.inactivePorts.map((p) => ({ p, fabric: undefined })),
  ];
  out.push(`Fabric ports (${ports.length})`);
  if (ports.length === 0) {
    out.push("  none (single-node island)");
  } else {
    const layer = { infiniband: "IB", roce: "RoCE", unknown: "-" } as const;
    const rows = ports.map(({ p, fabric }) => [
      p.device,
      String(p.port),
      dash(fabric),
      layer[p.linkLayer],
      `${p.state}/${p.physState}`,
      p.rateGbps === undefined ? "-" : `${p.rateGbps} Gb/s`,
      dash(p.netdev),
    ]);
    out.push(
      ...table(["DEVICE", "PORT", "FABRIC", "TYPE", "STATE", "RATE", "NETDEV"], rows).map(
        (l) => `  ${l}`,
      ),
    );
  }
  out.push("");
  out.push(`Problems (${inv.problems.length})`);
  if (inv.problems.length === 0) out.push("  none");
  for (const p of inv.problems) out.push(`  ${p.code}  ${p.message}`);
  return `${out.join("\n")}\n`;
}
