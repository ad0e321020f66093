import { defineConfig } from "tsup";

// The published build: ESM + type declarations. No runtime dependencies, so the tarball
// installs offline into any Node >= 20 project.
export default defineConfig({
  // The fakes (a fake nvidia-smi, a sysfs tree writer) ship for other packages' tests.
  entry: { index: "src/index.ts", "testing/index": "src/testing/index.ts" },
  format: ["esm"],
  platform: "node",
  target: "node20",
  dts: true,
  sourcemap: true,
  clean: true,
});
