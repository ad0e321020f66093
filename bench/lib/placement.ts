/**
 * Where a benchmark's processes run. On a small box the load generator, the simulated engines
 * and the proxy under test share the cores, and Linux's wake-up preemption turns every response
 * the proxy writes into a context switch: the woken load generator (or engine) takes the core
 * and the proxy's next requests wait behind it. In production they are different machines.
 *
 * "Split" placement gives the main thread of the target being measured (every process of it:
 * nginx's master and worker) CPU 0 to itself, lets its other threads (a worker pool, V8's GC
 * helpers) run on any CPU, and keeps everything else — this process, the load generator, the
 * engines and the targets not being measured — on the other CPUs, with `taskset`.
 * Targets not being measured stay off CPU 0 because their background work (an idle router's
 * GC after a 200 KB row) would otherwise land on the measured core. Every target is measured
 * the same way, so side-by-side ratios stay fair; `shared` leaves the scheduler free.
 *
 * A thread created while its process is promoted inherits its creator's mask: a pool that
 * grows mid-measurement gets CPU 0 only until the next promotion (each warm-up is followed by
 * one).
 */
import { execFileSync } from "node:child_process";
import { availableParallelism } from "node:os";
import { findBinary, processTree } from "./children.js";

export interface Placement {
  readonly mode: "split" | "shared";
  /** `taskset` CPU list for the measured target's main threads; undefined when shared. */
  readonly targetCpus?: string;
  /** `taskset` CPU list for everything else; undefined when shared. */
  readonly loadCpus?: string;
  /** Every CPU, for the measured target's other threads; undefined when shared. */
  readonly allCpus?: string;
  /** One line for the report. */
  readonly description: string;
}

/**
 * Split placement when asked for and possible (Linux with `taskset` and at least 2 CPUs),
 * otherwise shared, saying why.
 */
export function planPlacement(split: boolean): Placement {
  return placementFor(split, availableParallelism(), findBinary("taskset") !== undefined);
}

/** {@link planPlacement} for a machine with `cpus` CPUs, with or without `taskset`. */
export function placementFor(split: boolean, cpus: number, haveTaskset: boolean): Placement {
  if (!split) return { mode: "shared", description: "shared: every process on every core" };
  const why = cpus < 2 ? `${cpus} CPU` : !haveTaskset ? "taskset is not installed" : undefined;
  if (why !== undefined)
    return { mode: "shared", description: `shared: every process on every core (${why})` };
  const loadCpus = cpus === 2 ? "1" : `1-${cpus - 1}`;
  return {
    mode: "split",
    targetCpus: "0",
    loadCpus,
    allCpus: `0-${cpus - 1}`,
    description: `split: the measured target's main thread alone on CPU 0 (its other threads anywhere); load generator, engines and idle targets on CPU ${loadCpus}`,
  };
}

/** Moves every thread of this process to `cpus`; children spawned later inherit it. */
export function pinSelf(cpus: string): void {
  taskset(["-a", "-p", "-c", cpus, String(process.pid)]);
}

/**
 * Moves processes between "measured" and "idle" under a split placement (no-op when shared).
 * Processes are given by their root pid; their descendants move with them.
 */
export interface Placer {
  /** Every thread of every process of `pid`'s tree onto the load CPUs. */
  demote(pid: number | undefined): void;
  /** Main threads of `pid`'s tree alone on the target CPU; their other threads anywhere. */
  promote(pid: number | undefined): void;
}

export function createPlacer(placement: Placement): Placer {
  const { targetCpus, loadCpus, allCpus } = placement;
  if (targetCpus === undefined || loadCpus === undefined || allCpus === undefined) {
    return { demote() {}, promote() {} };
  }
  return {
    demote(pid) {
      for (const p of processTree(pid)) taskset(["-a", "-p", "-c", loadCpus, String(p)]);
    },
    promote(pid) {
      for (const p of processTree(pid)) {
        taskset(["-a", "-p", "-c", allCpus, String(p)]);
        taskset(["-p", "-c", targetCpus, String(p)]); // the main thread only (tid = pid)
      }
    },
  };
}

function taskset(args: string[]): void {
  try {
    execFileSync("taskset", args, { stdio: "ignore" });
  } catch {
    // The process exited between listing and pinning: nothing to place.
  }
}
