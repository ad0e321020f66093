/** The benchmark's cluster generator and its naive first-fit baseline. */

import { createPrng } from "@llmgw/engine-sim";
import type {
  Placement,
  ScheduleInput,
  SchedulerDeployment,
  SchedulerNode,
} from "@llmgw/scheduler";

/** Sizes of one benchmark run. */
export interface BenchOptions {
  readonly nodes: number;
  readonly deployments: number;
  readonly runs: number;
  readonly seed: number;
}

const CLASSES = [
  { name: "h100-80g", share: 0.5, nvlink: 18 },
  { name: "a100-80g", share: 0.3, nvlink: 12 },
  { name: "l40s-45g", share: 0.2, nvlink: 0 },
] as const;
const FABRICS = ["ib-a", "ib-b", "ib-c", "ib-d"] as const;
const SIZES = [
  { gpus: 1, share: 0.25 },
  { gpus: 2, share: 0.25 },
  { gpus: 4, share: 0.2 },
  { gpus: 8, share: 0.2 },
  { gpus: 16, share: 0.1 },
] as const;

function pick<T extends { share: number }>(items: readonly T[], r: number): T {
  let acc = 0;
  for (const item of items) {
    acc += item.share;
    if (r < acc) return item;
  }
  return items[items.length - 1] as T;
}

/**
 * A seeded cluster: `nodes` × 8 GPUs, one class per node (h100 50%, a100 30%, l40s 20%), one of
 * four fabrics per node, 2% unhealthy GPUs, full NVLink on h100/a100, and `deployments` of 1, 2,
 * 4, 8 and 16-GPU replicas whose demand is about 110% of the capacity.
 */
export function buildCluster(options: BenchOptions): ScheduleInput {
  const random = createPrng(options.seed);
  const pad = String(options.nodes).length;
  const nodes: SchedulerNode[] = [];
  for (let i = 0; i < options.nodes; i++) {
    const cls = pick(CLASSES, random());
    const id = `node-${String(i).padStart(pad, "0")}`;
    const nvlinks: { a: number; b: number; count: number }[] = [];
    if (cls.nvlink > 0) {
      for (let a = 0; a < 8; a++)
        for (let b = a + 1; b < 8; b++) nvlinks.push({ a, b, count: cls.nvlink });
    }
    nodes.push({
      id,
      state: "ready",
      cordoned: false,
      draining: false,
      fabrics: [FABRICS[i % FABRICS.length] as string],
      gpus: Array.from({ length: 8 }, (_, index) => ({
        index,
        uuid: `GPU-${id}-${index}`,
        gpuClass: cls.name,
        healthy: random() >= 0.02,
        migEnabled: false,
      })),
      nvlinks,
      // Two NICs per node, each a PCIe switch away from four GPUs (PIX), SYS from the rest.
      nicDistance: Object.fromEntries(Array.from({ length: 8 }, (_, g) => [g, g < 4 ? 0 : 1])),
    });
  }
  // Demand ≈ 110% of capacity, so packing decides what fits.
  const capacity = options.nodes * 8;
  const meanGpus = SIZES.reduce((s, x) => s + x.gpus * x.share, 0);
  const meanReplicas = (1.1 * capacity) / (options.deployments * meanGpus);
  const deployments: SchedulerDeployment[] = [];
  const dpad = String(options.deployments).length;
  for (let i = 0; i < options.deployments; i++) {
    const size = pick(SIZES, random());
    deployments.push({
      name: `model-${String(i).padStart(dpad, "0")}`,
      revision: 1,
      gpuClass: pick(CLASSES, random()).name,
      gpusPerReplica: size.gpus,
      replicas: Math.max(1, Math.round(random() * 2 * meanReplicas)),
      multiNode: true,
      priority: 0,
      allowPreemption: false,
    });
  }
  return { nodes, deployments, placements: [] };
}

/**
 * The baseline: deployments in input order, each replica on the first node (by id) with enough
 * free healthy GPUs of its class; a 16-GPU replica on the first two such nodes of one fabric.
 * No spread, no best fit, no size ordering.
 */
export function firstFit(input: ScheduleInput): Placement[] {
  const free = new Map<string, number[]>();
  for (const node of input.nodes) {
    free.set(
      node.id,
      node.gpus.filter((g) => g.healthy && !g.migEnabled).map((g) => g.index),
    );
  }
  const classOf = new Map(input.nodes.map((n) => [n.id, n.gpus[0]?.gpuClass]));
  const placements: Placement[] = [];
  for (const d of input.deployments) {
    const nodesNeeded = d.gpusPerReplica > 8 ? Math.ceil(d.gpusPerReplica / 8) : 1;
    const per = d.gpusPerReplica / nodesNeeded;
    for (let r = 0; r < d.replicas; r++) {
      const byFabric = new Map<string, SchedulerNode[]>();
      let chosen: SchedulerNode[] | undefined;
      for (const node of input.nodes) {
        if (classOf.get(node.id) !== d.gpuClass) continue;
        if ((free.get(node.id)?.length ?? 0) < per) continue;
        const fabric = node.fabrics[0] ?? node.id;
        const list = byFabric.get(fabric) ?? [];
        list.push(node);
        byFabric.set(fabric, list);
        if (list.length === nodesNeeded) {
          chosen = list;
          break;
        }
      }
      if (chosen === undefined) break;
      placements.push({
        replicaId: `${d.name}-${r}`,
        deployment: d.name,
        revision: d.revision,
        ranks: chosen.map((node, rank) => ({
          rank,
          nodeId: node.id,
          gpuIndices: (free.get(node.id) ?? []).splice(0, per),
        })),
      });
    }
  }
  return placements;
}
