import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { expect, it } from "vitest";

const root = fileURLToPath(new URL("../..", import.meta.url));

// Smoke only: the quick mode (100 and 400 nodes) runs to the end and prints its table. The
// numbers are for people reading the benchmark, not for assertions on a shared machine.
it("runs the quick control-plane-path scheduler benchmark and prints the table", async () => {
  const { stdout } = await promisify(execFile)(
    process.execPath,
    [
      "--import",
      "tsx",
      "--conditions=@llmgw/source",
      "bench/scheduler/control-plane-path.ts",
      "--quick",
    ],
    { cwd: root, timeout: 120_000 },
  );
  expect(stdout).toMatch(/scheduler alone, same input\s+control plane path\s+goal/);
  expect(stdout).toMatch(/incremental: one node cordoned \/ uncordoned \(100 nodes\)\s+\d/);
  expect(stdout).toMatch(
    /full re-plan: a starting leader's reconcile, the scheduler's caches cold \(400 nodes\)\s+\d+\.\d\s+\d+\.\d/,
  );
  expect(stdout).toMatch(/start less a follower's load-only start \(400 nodes\)\s+\d/);
  expect(stdout).toMatch(
    /start: loading the stored state, then the full re-plan \(400 nodes\)\s+\d/,
  );
  expect(stdout).toMatch(/takeover: the same start by a follower.*\(400 nodes\)\s+\d/);
  expect(stdout).toContain("run as shipped (bundled by tsup)");
}, 130_000);
