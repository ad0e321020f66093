/**
 * `schedule()` alone on the control plane's own input (see `control-plane-cluster.ts`), for
 * one or more implementations in the same process, rounds interleaved:
 *
 * - **warm**: 1,000 nodes × 8 GPUs; each round cordons one node (a new object for it, every
 *   other node object reused, as the control plane caches them), then uncordons it; each
 *   implementation is timed on each of the two inputs, as the reconcile right after the event.
 * - **cold**: 10,000 nodes × 8 GPUs, every node object fresh (nothing cached), after a full GC.
 *
 * Every implementation must return the identical plan for the same input (checked per call).
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { isDeepStrictEqual } from "node:util";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import type { ScheduleInput, ScheduleResult } from "@llmgw/scheduler";
import { quantile } from "../lib/table.js";
import { buildPlacedCluster, coldInput } from "./control-plane-cluster.js";

/** A placement function under test. */
export type ScheduleImpl = (input: ScheduleInput) => ScheduleResult;

/** Sizes of one run. */
export interface AloneOptions {
  readonly rounds: number;
  readonly smallNodes: number;
  readonly largeNodes: number;
}

/** Per implementation: the median ms of the warm and the cold calls, and the sample counts. */
export interface AloneReport {
  readonly name: string;
  readonly warmMs: number;
  readonly coldMs: number;
  readonly warmSamples: number;
  readonly coldSamples: number;
}

const median = (xs: readonly number[]): number => quantile(xs, 0.5) ?? Number.NaN;

function getGc(): () => void {
  try {
    setFlagsFromString("--expose-gc");
    return runInNewContext("gc") as () => void;
  } catch {
    return () => {};
  }
}

/** Times each of `impls` on the same inputs; throws when two return different plans. */
export function timeScheduleAlone(
  impls: Readonly<Record<string, ScheduleImpl>>,
  options: AloneOptions,
): AloneReport[] {
  const gc = getGc();
  const names = Object.keys(impls);
  const warm = new Map<string, number[]>(names.map((n) => [n, []]));
  const cold = new Map<string, number[]>(names.map((n) => [n, []]));
  const timeEach = (
    input: () => ScheduleInput,
    round: number,
    into: Map<string, number[]>,
    collect: boolean,
  ): void => {
    let first: ScheduleResult | undefined;
    // Alternate which implementation goes first, so neither always runs after the other's GC.
    const order = round % 2 === 0 ? names : [...names].reverse();
    for (const name of order) {
      const impl = impls[name] as ScheduleImpl;
      const given = input();
      if (collect) gc();
      const t0 = performance.now();
      const result = impl(given);
      const ms = performance.now() - t0;
      into.get(name)?.push(ms);
      if (first === undefined) first = result;
      else if (!isDeepStrictEqual(first, result)) {
        throw new Error(`round ${round}: ${name} returned another plan than ${order[0]}`);
      }
    }
  };
  const dir = mkdtempSync(join(tmpdir(), "llmgw-bench-sched-alone-"));
  try {
    const small = buildPlacedCluster(dir, options.smallNodes, options.smallNodes / 5);
    for (let r = 0; r < options.rounds; r++) {
      const id = small.nodeIds[(r * 37) % small.nodeIds.length] as string;
      small.cluster.cordonNode(id);
      const cordoned = small.lastInput();
      timeEach(() => cordoned, r, warm, false);
      small.cluster.uncordonNode(id);
      const uncordoned = small.lastInput();
      timeEach(() => uncordoned, r, warm, false);
    }
    small.store.close();
    const large = buildPlacedCluster(dir, options.largeNodes, options.largeNodes / 5);
    const input = large.lastInput();
    large.store.close();
    for (let r = 0; r < options.rounds; r++) timeEach(() => coldInput(input), r, cold, true);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  return names.map((name) => ({
    name,
    warmMs: median(warm.get(name) ?? []),
    coldMs: median(cold.get(name) ?? []),
    warmSamples: warm.get(name)?.length ?? 0,
    coldSamples: cold.get(name)?.length ?? 0,
  }));
}
