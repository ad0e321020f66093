import { defineConfig } from "tsup";

// The published build: ESM + type declarations. No runtime dependencies, so the tarball
// installs offline into any Node >= 20 project.
export default defineConfig({
  entry: { index: "src/index.ts" },
  format: ["esm"],
  platform: "node",
  target: "node20",
  dts: true,
  sourcemap: true,
  clean: true,
});
