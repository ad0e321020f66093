/**
 * Scheduler benchmark: a full placement from scratch and the incremental re-plan after losing
 * one node, on 1,000 nodes × 8 GPUs (three classes, four fabrics, 2% unhealthy GPUs) and 300
 * deployments of 1, 2, 4, 8 and 16-GPU replicas, against a naive first-fit baseline run in the
 * same process. Prints a table, then one JSON line.
 *
 *   npx tsx --conditions=@llmgw/source bench/scheduler/run.ts [--quick] [--seed N] [--runs N]
 *
 * Goals (DESIGN §12, issue [5/10]): full < 200 ms, incremental < 20 ms, more large (8/16-GPU)
 * replicas placed than first-fit.
 */

import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { applyPlan, type Placement, type ScheduleInput, schedule } from "@llmgw/scheduler";
import { formatTable, quantile } from "../lib/table.js";
import { type BenchOptions, buildCluster, firstFit } from "./cluster.js";

/** Wall time and CPU time (user + system of this process) of one call, in ms. */
function time<T>(fn: () => T): { ms: number; cpuMs: number; value: T } {
  const cpu = process.cpuUsage();
  const start = performance.now();
  const value = fn();
  const ms = performance.now() - start;
  const used = process.cpuUsage(cpu);
  return { ms, cpuMs: (used.user + used.system) / 1000, value };
}

function median(values: readonly number[]): number {
  return quantile(values, 0.5) ?? Number.NaN;
}

function getGc(): (() => void) | undefined {
  try {
    setFlagsFromString("--expose-gc");
    return runInNewContext("gc") as () => void;
  } catch {
    return undefined;
  }
}

interface Counts {
  readonly replicas: number;
  readonly large: number;
  readonly largeGpus: number;
  readonly gpus: number;
}

function count(input: ScheduleInput, placements: readonly Placement[]): Counts {
  const size = new Map(input.deployments.map((d) => [d.name, d.gpusPerReplica]));
  let large = 0;
  let largeGpus = 0;
  let gpus = 0;
  for (const p of placements) {
    const g = size.get(p.deployment) ?? 0;
    if (g >= 8) {
      large++;
      largeGpus += g;
    }
    gpus += g;
  }
  return { replicas: placements.length, large, largeGpus, gpus };
}

/** Runs the benchmark and returns the table text and the JSON-ready figures. */
export function runSchedulerBench(options: BenchOptions): { table: string; json: object } {
  // Every timed run starts after a full GC, so garbage of earlier runs and of input cloning is
  // not billed to it (what a run itself allocates still is).
  const gc = getGc();
  const input = buildCluster(options);
  const wantedLarge = input.deployments
    .filter((d) => d.gpusPerReplica >= 8)
    .reduce((s, d) => s + d.replicas, 0);
  const unhealthy = input.nodes.reduce((s, n) => s + n.gpus.filter((g) => !g.healthy).length, 0);

  // "From scratch" means fresh node objects every run: the scheduler caches derived node data
  // per node object, and a full placement must not profit from an earlier run's cache.
  const fresh = (): ScheduleInput => structuredClone(input);
  // Warm-up: the control plane calls the scheduler over and over, so measure JIT-compiled code.
  for (let i = 0; i < 3; i++) schedule(fresh());
  let cold = fresh();
  gc?.();
  const heapBefore = process.memoryUsage().heapUsed;
  const first = time(() => schedule(cold));
  const heapAfter = process.memoryUsage().heapUsed;
  const fullMs = [first.ms];
  const fullCpuMs = [first.cpuMs];
  for (let i = 1; i < options.runs; i++) {
    cold = fresh();
    gc?.();
    const t = time(() => schedule(cold));
    fullMs.push(t.ms);
    fullCpuMs.push(t.cpuMs);
  }
  const placements = applyPlan([], first.value);

  // Lose the node carrying the most replicas: the worst single-node loss.
  const perNode = new Map<string, number>();
  for (const p of placements)
    for (const r of p.ranks) perNode.set(r.nodeId, (perNode.get(r.nodeId) ?? 0) + 1);
  const lostId = [...perNode].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1))[0]?.[0] ?? "";
  const afterLoss: ScheduleInput = {
    ...input,
    nodes: input.nodes.map((n) => (n.id === lostId ? { ...n, state: "lost" as const } : n)),
    placements,
  };
  // Warm: the control plane passes the same node objects for nodes that did not change.
  for (let i = 0; i < 5; i++) schedule(afterLoss);
  const incrementalMs: number[] = [];
  const incrementalCpuMs: number[] = [];
  let incremental = schedule(afterLoss);
  for (let i = 0; i < options.runs; i++) {
    gc?.();
    const t = time(() => schedule(afterLoss));
    incrementalMs.push(t.ms);
    incrementalCpuMs.push(t.cpuMs);
    incremental = t.value;
  }

  // Cold: every node object new, as if the caller rebuilt them all from its store.
  const incrementalColdMs: number[] = [];
  for (let i = 0; i < options.runs; i++) {
    const coldAfterLoss = structuredClone(afterLoss);
    gc?.();
    incrementalColdMs.push(time(() => schedule(coldAfterLoss)).ms);
  }

  const baselineMs: number[] = [];
  const baselineCpuMs: number[] = [];
  let baseline: Placement[] = [];
  for (let i = 0; i < options.runs; i++) {
    gc?.();
    const t = time(() => firstFit(input));
    baselineMs.push(t.ms);
    baselineCpuMs.push(t.cpuMs);
    baseline = t.value;
  }

  const ours = count(input, placements);
  const theirs = count(input, baseline);
  const full = median(fullMs);
  const inc = median(incrementalMs);
  const heapMiB = (heapAfter - heapBefore) / 2 ** 20;
  const f = (n: number): string => n.toFixed(1);
  // The minimum shows the cost without other processes' interference on a shared machine.
  const mm = (values: readonly number[]): string =>
    `${f(median(values))} (${f(Math.min(...values))})`;
  const table = formatTable(
    ["metric", "llmgw", "first-fit", "goal"],
    [
      ["full placement, wall ms median (min)", mm(fullMs), mm(baselineMs), "< 200"],
      ["full placement, median CPU ms", f(median(fullCpuMs)), f(median(baselineCpuMs)), "-"],
      [`incremental after losing ${lostId}, wall ms median (min)`, mm(incrementalMs), "-", "< 20"],
      ["incremental, median CPU ms", f(median(incrementalCpuMs)), "-", "-"],
      ["incremental, new node objects, wall ms median (min)", mm(incrementalColdMs), "-", "-"],
      [
        "  replicas removed / added",
        `${incremental.remove.length} / ${incremental.add.length}`,
        "-",
        "-",
      ],
      ["heap allocated by one full run, MiB", f(heapMiB), "-", "-"],
      [
        "large (8/16-GPU) replicas placed",
        `${ours.large} of ${wantedLarge}`,
        `${theirs.large} of ${wantedLarge}`,
        "more than first-fit",
      ],
      ["GPUs in large replicas", ours.largeGpus, theirs.largeGpus, "-"],
      ["replicas placed", ours.replicas, theirs.replicas, "-"],
      ["GPUs allocated", `${ours.gpus} of ${options.nodes * 8 - unhealthy}`, theirs.gpus, "-"],
    ],
  );
  const json = {
    bench: "scheduler",
    nodes: options.nodes,
    gpus: options.nodes * 8,
    unhealthyGpus: unhealthy,
    deployments: options.deployments,
    runs: options.runs,
    seed: options.seed,
    fullMs: { median: full, min: Math.min(...fullMs), cpuMedian: median(fullCpuMs), all: fullMs },
    incrementalColdMs: { median: median(incrementalColdMs), all: incrementalColdMs },
    incrementalMs: {
      median: inc,
      min: Math.min(...incrementalMs),
      cpuMedian: median(incrementalCpuMs),
      all: incrementalMs,
      lostNode: lostId,
      removed: incremental.remove.length,
      added: incremental.add.length,
    },
    heapAllocatedMiB: heapMiB,
    heapMeasuredWithGc: gc !== undefined,
    large: { wanted: wantedLarge, llmgw: ours.large, firstFit: theirs.large },
    largeGpus: { llmgw: ours.largeGpus, firstFit: theirs.largeGpus },
    replicas: { llmgw: ours.replicas, firstFit: theirs.replicas },
    gpusAllocated: { llmgw: ours.gpus, firstFit: theirs.gpus },
    firstFitMs: { median: median(baselineMs), cpuMedian: median(baselineCpuMs) },
    goals: {
      fullUnder200Ms: full < 200,
      incrementalUnder20Ms: inc < 20,
      moreLargeThanFirstFit: ours.large > theirs.large,
    },
  };
  return { table, json };
}

function main(argv: readonly string[]): void {
  const quick = argv.includes("--quick");
  const seedAt = argv.indexOf("--seed");
  const seed = seedAt >= 0 ? Number(argv[seedAt + 1]) : 42;
  if (!Number.isInteger(seed))
    throw new Error(`--seed must be an integer, got ${argv[seedAt + 1]}`);
  const runsAt = argv.indexOf("--runs");
  const runs = runsAt >= 0 ? Number(argv[runsAt + 1]) : quick ? 3 : 9;
  if (!Number.isInteger(runs) || runs < 1) {
    throw new Error(`--runs must be a positive integer, got ${argv[runsAt + 1]}`);
  }
  const options: BenchOptions = quick
    ? { nodes: 40, deployments: 20, runs, seed }
    : { nodes: 1000, deployments: 300, runs, seed };
  const { table, json } = runSchedulerBench(options);
  console.log(
    `scheduler: ${options.nodes} nodes × 8 GPUs, ${options.deployments} deployments${quick ? " (quick)" : ""}`,
  );
  console.log(table);
  console.log(JSON.stringify(json));
}

main(process.argv.slice(2));
