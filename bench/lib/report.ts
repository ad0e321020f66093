import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { formatTable } from "./table.js";

/** One benchmark goal and how the run measured against it. */
export interface GoalResult {
  readonly goal: string;
  readonly measured: string;
  readonly met: boolean;
}

/**
 * The common end of every benchmark: the results table, the goals table, the JSON document
 * on stdout and in `bench/results/<name>-<time>.json` (git-ignored).
 */
export function printReport(
  name: string,
  table: string,
  goals: readonly GoalResult[],
  result: unknown,
): void {
  console.log(table);
  if (goals.length > 0) {
    console.log("");
    console.log(
      formatTable(
        ["goal", "measured", "met"],
        goals.map((g) => [g.goal, g.measured, g.met ? "yes" : "MISS"]),
      ),
    );
  }
  const json = JSON.stringify(result, null, 2);
  try {
    const dir = join(import.meta.dirname, "..", "results");
    mkdirSync(dir, { recursive: true });
    writeFileSync(
      join(dir, `${name}-${new Date().toISOString().replace(/[:.]/g, "-")}.json`),
      json,
    );
  } catch (error) {
    console.error(`could not write bench/results/${name}-*.json: ${(error as Error).message}`);
  }
  console.log(json);
}
