import { spawnSync } from "node:child_process";
import { mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

/**
 * Measure what ships: run from source under tsx, a benchmark times esbuild's keepNames
 * wrappers (`__name`) and other transpile artefacts the CLI bundle does not have (6% of a
 * one-node re-plan). `runAsShipped(import.meta.url)` bundles the calling script the way
 * `apps/cli/tsup.config.ts` bundles the CLI (tsup, ESM, node20, workspace packages compiled
 * in from source, npm packages external), runs the bundle with the same arguments and exits
 * with its status. Inside the bundle it returns false and the script goes on. `--source`
 * skips the bundle (profiling against source files).
 */
export async function runAsShipped(entryUrl: string): Promise<false> {
  if (process.env.LLMGW_BENCH_SHIPPED === "1" || process.argv.includes("--source")) return false;
  const entry = fileURLToPath(entryUrl);
  // Beside the CLI's own bundle (git-ignored), so that it resolves npm packages as the CLI
  // does: from apps/cli/node_modules.
  const outDir = fileURLToPath(
    new URL(`../../apps/cli/dist/.bench-${process.pid}/`, import.meta.url),
  );
  try {
    await bundleAsShipped({ bench: entry }, outDir);
    // --expose-gc: a benchmark may collect between timed steps (`collectGarbage`).
    const script = [join(outDir, "bench.js"), ...process.argv.slice(2)];
    const run = spawnSync(process.execPath, ["--expose-gc", ...script], {
      stdio: "inherit",
      env: { ...process.env, LLMGW_BENCH_SHIPPED: "1" },
    });
    process.exitCode = run.status ?? 1;
  } finally {
    rmSync(outDir, { recursive: true, force: true });
  }
  process.exit();
}

/**
 * Bundles `entries` (output name → source file) into `outDir` the way `apps/cli/tsup.config.ts`
 * bundles the CLI: tsup, ESM, node20, workspace packages compiled in from source, every other
 * bare import left external. `outDir` should sit beside the CLI's own bundle (under
 * `apps/cli/dist/`, git-ignored), so that the bundle resolves npm packages as the CLI does.
 */
export async function bundleAsShipped(
  entries: Readonly<Record<string, string>>,
  outDir: string,
): Promise<void> {
  mkdirSync(outDir, { recursive: true });
  const { build } = await import("tsup");
  await build({
    entry: { ...entries },
    format: ["esm"],
    platform: "node",
    target: "node20",
    outDir,
    splitting: false,
    sourcemap: false,
    dts: false,
    silent: true,
    config: false,
    noExternal: [/^@llmgw\//],
    // Every other bare import stays external, as in the CLI (whose package.json lists them).
    external: [/^(?!@llmgw\/)[^./]/],
    esbuildOptions(options) {
      options.conditions = ["@llmgw/source"];
    },
  });
}

/**
 * A full collection now, where `--expose-gc` allows it (bundled runs), so that one timed step
 * does not pay for the garbage of the one before.
 */
export function collectGarbage(): void {
  (globalThis as { gc?: () => void }).gc?.();
}
