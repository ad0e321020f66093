import { execFileSync } from "node:child_process";
import { defineConfig } from "tsup";

/** The commit being built, `-dirty` with uncommitted changes; empty outside a git checkout. */
function buildCommit(): string {
  const git = (...args: string[]) =>
    execFileSync("git", args, { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }).trim();
  try {
    return `${git("rev-parse", "HEAD")}${git("status", "--porcelain") === "" ? "" : "-dirty"}`;
  } catch {
    return "";
  }
}

// One bundle for the whole `llmgw` command: workspace packages are compiled in from source
// (the `@llmgw/source` export condition); npm dependencies and native modules stay external.
export default defineConfig({
  entry: {
    main: "src/main.ts",
    // The router's tinypool worker, loaded by file name next to the bundle's chunks.
    "router-worker": "../../packages/router/src/worker.ts",
  },
  format: ["esm"],
  platform: "node",
  target: "node20",
  splitting: true,
  sourcemap: true,
  clean: true,
  dts: false,
  noExternal: [/^@llmgw\//],
  // What `scripts/pack.sh` checks the package's dependencies against: every bare import left.
  metafile: true,
  define: { __LLMGW_COMMIT__: JSON.stringify(buildCommit()) },
  esbuildOptions(options) {
    options.conditions = ["@llmgw/source"];
  },
});
