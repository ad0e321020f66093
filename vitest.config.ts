import { defineConfig } from "vitest/config";

// One config for the whole workspace: tests import each other's `src/` through the
// `@llmgw/source` export condition, so nothing needs building before unit tests run.
export default defineConfig({
  resolve: { conditions: ["@llmgw/source"] },
  ssr: { resolve: { conditions: ["@llmgw/source"], externalConditions: ["@llmgw/source"] } },
  test: {
    include: [
      "packages/*/src/**/*.test.ts",
      "packages/*/test/**/*.test.ts",
      "apps/*/src/**/*.test.ts",
      "apps/*/test/**/*.test.ts",
      "bench/**/*.test.ts",
    ],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    pool: "forks",
    maxWorkers: 2,
  },
});
