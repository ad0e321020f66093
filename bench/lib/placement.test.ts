import { execFileSync, spawn } from "node:child_process";
import { readdirSync } from "node:fs";
import { availableParallelism } from "node:os";
import { describe, expect, it } from "vitest";
import { findBinary, processTree, processTreeCpuUs } from "./children.js";
import { createPlacer, placementFor } from "./placement.js";

/** CPU numbers of a `taskset` list such as `0-2,5` (taskset prints `0,1` for `0-1`). */
const cpus = (list: string | undefined): number[] =>
  (list ?? "").split(",").flatMap((part) => {
    const [a, b] = part.split("-").map(Number) as [number, number | undefined];
    return Array.from({ length: (b ?? a) - a + 1 }, (_, i) => a + i);
  });

/** The CPUs one thread may run on (`taskset -p -c`). */
const affinity = (tid: number | string): number[] =>
  cpus(
    execFileSync("taskset", ["-p", "-c", String(tid)], { encoding: "utf8" })
      .trim()
      .split(": ")[1],
  );

describe("benchmark placement", () => {
  it("splits when it can, and says why it shares when it cannot", () => {
    expect(placementFor(true, 2, true)).toMatchObject({
      mode: "split",
      targetCpus: "0",
      loadCpus: "1",
      allCpus: "0-1",
    });
    expect(placementFor(true, 16, true)).toMatchObject({ loadCpus: "1-15", allCpus: "0-15" });
    expect(placementFor(false, 16, true)).toEqual({
      mode: "shared",
      description: "shared: every process on every core",
    });
    expect(placementFor(true, 1, true).description).toContain("(1 CPU)");
    expect(placementFor(true, 8, false).description).toContain("(taskset is not installed)");
    // Shared: the placer moves nothing (and needs no taskset).
    const placer = createPlacer(placementFor(false, 2, true));
    expect(() => placer.promote(process.pid)).not.toThrow();
  });

  it.skipIf(findBinary("taskset") === undefined || availableParallelism() < 2)(
    "promotes a process's main thread alone onto CPU 0 and demotes all its threads (needs taskset and 2 CPUs)",
    async () => {
      const placement = placementFor(true, availableParallelism(), true);
      const placer = createPlacer(placement);
      // A Node process: a main thread plus V8 and libuv helper threads.
      const child = spawn(process.execPath, ["-e", "setTimeout(() => {}, 10000)"], {
        stdio: "ignore",
      });
      try {
        const pid = child.pid as number;
        // Wait for its helper threads (a loaded machine starts them late), not a fixed time.
        const helpers = () => {
          try {
            return readdirSync(`/proc/${pid}/task`).filter((t) => t !== String(pid));
          } catch {
            return [];
          }
        };
        for (const until = Date.now() + 10_000; helpers().length < 4 && Date.now() < until; ) {
          await new Promise((r) => setTimeout(r, 20));
        }
        const threads = helpers();
        expect(threads.length).toBeGreaterThan(0);
        placer.promote(pid);
        expect(affinity(pid)).toEqual([0]);
        for (const t of threads) expect(affinity(t)).toEqual(cpus(placement.allCpus));
        placer.demote(pid);
        for (const t of [String(pid), ...threads]) {
          expect(affinity(t)).toEqual(cpus(placement.loadCpus));
        }
        placer.demote(999_999_999); // gone or never there: nothing to place, no error
      } finally {
        child.kill();
      }
    },
  );

  it.skipIf(process.platform !== "linux")(
    "lists a process with its descendants and sums their CPU; nothing for a gone pid (Linux /proc)",
    async () => {
      const shell = spawn("sh", ["-c", "sleep 5 & wait"], { stdio: "ignore" });
      try {
        await new Promise((r) => setTimeout(r, 200));
        const tree = processTree(shell.pid);
        expect(tree[0]).toBe(shell.pid);
        expect(tree.length).toBe(2); // sh and its sleep
        expect(processTreeCpuUs(shell.pid)).toBeGreaterThanOrEqual(0);
      } finally {
        shell.kill();
      }
      expect(processTree(999_999_999)).toEqual([]);
      expect(processTreeCpuUs(999_999_999)).toBeUndefined();
      expect(processTreeCpuUs(undefined)).toBeUndefined();
    },
  );
});
