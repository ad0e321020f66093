/**
 * `schedule()` alone on the control plane's input: warm at 1,000 nodes (one node cordoned or
 * uncordoned between calls, every other node object reused), cold at 10,000 nodes (fresh node
 * objects). Runs bundled as shipped (`--source`: from source under tsx).
 *
 *   node --conditions=@llmgw/source --import tsx bench/scheduler/alone-run.ts [--quick] [--rounds N]
 */
import { parseArgs } from "node:util";
import { schedule } from "@llmgw/scheduler";
import { runAsShipped } from "../lib/shipped.js";
import { formatTable } from "../lib/table.js";
import { timeScheduleAlone } from "./alone.js";

function main(): void {
  const { values } = parseArgs({
    args: process.argv.slice(2),
    options: {
      quick: { type: "boolean", default: false },
      rounds: { type: "string" },
      source: { type: "boolean", default: false },
    },
  });
  const quick = values.quick ?? false;
  const options = {
    rounds: Number(values.rounds ?? (quick ? 3 : 15)),
    smallNodes: quick ? 100 : 1_000,
    largeNodes: quick ? 400 : 10_000,
  };
  const [report] = timeScheduleAlone({ schedule }, options);
  console.log(
    formatTable(
      ["schedule() alone, medians, ms", "warm (one node changed)", "cold (fresh nodes)"],
      [
        [
          `${options.smallNodes} / ${options.largeNodes} nodes × 8 GPUs, ${options.rounds} rounds`,
          report?.warmMs.toFixed(2) ?? "",
          report?.coldMs.toFixed(1) ?? "",
        ],
      ],
    ),
  );
}

await runAsShipped(import.meta.url);
main();
