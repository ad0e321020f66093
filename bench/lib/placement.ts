/**
 * Where a benchmark's processes run. On a small box the load generator, the simulated engines
 * and the proxy under test share the cores, and Linux's wake-up preemption turns every response
 * the proxy writes into a context switch: the woken load generator (or engine) takes the core
 * and the proxy's next requests wait behind it. In production they are different machines.
 *
 * "Split" placement gives the targets (the proxies under test and the idle loop-delay probe)
 * CPU 0 and everything else (the load generator, the engines, the benchmark process itself)
 * the remaining CPUs, with `taskset`. Every target gets the same core, so side-by-side ratios
 * stay fair; `shared` leaves the scheduler free, as before.
 */
import { execFileSync } from "node:child_process";
import { availableParallelism } from "node:os";
import { findBinary } from "./children.js";

export interface Placement {
  readonly mode: "split" | "shared";
  /** `taskset` CPU list for the targets; undefined when shared. */
  readonly targetCpus?: string;
  /** `taskset` CPU list for the load generator and the engines; undefined when shared. */
  readonly loadCpus?: string;
  /** One line for the report. */
  readonly description: string;
}

/**
 * Split placement when asked for and possible (Linux with `taskset` and at least 2 CPUs),
 * otherwise shared, saying why.
 */
export function planPlacement(split: boolean): Placement {
  if (!split) return { mode: "shared", description: "shared: every process on every core" };
  const cpus = availableParallelism();
  const why =
    cpus < 2
      ? `${cpus} CPU`
      : findBinary("taskset") === undefined
        ? "taskset is not installed"
        : undefined;
  if (why !== undefined)
    return { mode: "shared", description: `shared: every process on every core (${why})` };
  const loadCpus = cpus === 2 ? "1" : `1-${cpus - 1}`;
  return {
    mode: "split",
    targetCpus: "0",
    loadCpus,
    description: `split: targets on CPU 0; load generator and engines on CPU ${loadCpus}`,
  };
}

/** Moves every thread of this process to `cpus`; children spawned later inherit it. */
export function pinSelf(cpus: string): void {
  execFileSync("taskset", ["-a", "-p", "-c", cpus, String(process.pid)], { stdio: "ignore" });
}
