// The simulated engine as a standalone process for the benchmark (same code path as
// `llmgw engine-sim`, without building the CLI).
import { runEngineSimCli } from "@llmgw/engine-sim";

const controller = new AbortController();
process.on("SIGTERM", () => controller.abort());
process.on("SIGINT", () => controller.abort());
process.exit(
  await runEngineSimCli(process.argv.slice(2), {
    stdout: process.stdout,
    stderr: process.stderr,
    signal: controller.signal,
  }),
);
