import { execFile } from "node:child_process";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { expect, it } from "vitest";

const root = fileURLToPath(new URL("../..", import.meta.url));

// Smoke only: the quick mode runs to the end and prints its table and JSON. The numbers are
// for people reading the benchmark, not for assertions on a shared machine.
it("runs the quick scheduler benchmark and prints the table", async () => {
  const { stdout } = await promisify(execFile)(
    process.execPath,
    ["--import", "tsx", "--conditions=@llmgw/source", "bench/scheduler/run.ts", "--quick"],
    { cwd: root, timeout: 60_000 },
  );
  expect(stdout).toContain("full placement, wall ms median (min)");
  expect(stdout).toContain("large (8/16-GPU) replicas placed");
  const json = JSON.parse(stdout.trim().split("\n").at(-1) ?? "");
  expect(json).toMatchObject({ bench: "scheduler", nodes: 40 });
});
