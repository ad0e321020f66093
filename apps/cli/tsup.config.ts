import { defineConfig } from "tsup";

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
  esbuildOptions(options) {
    options.conditions = ["@llmgw/source"];
  },
});
