import { postgresUnavailable } from "@llmgw/control-plane/testing";
import { describe, expect, it } from "vitest";
import { runQuick } from "../lib/smoke.js";

const skip = postgresUnavailable();

// Smoke only: one round of each setup runs to the end and prints the table. The times are for
// people reading the benchmark, not for assertions on a shared box.
describe.skipIf(skip)(
  `bench/control-plane/failover.ts --quick${skip ? ` (skipped: ${skip})` : ""}`,
  () => {
    it("kills the serving control plane of each setup once and prints the table", async () => {
      const { code, stdout, stderr } = await runQuick(
        new URL("./failover.ts", import.meta.url),
        170_000,
      );
      expect(code, stderr.slice(-2000)).toBe(0);
      expect(stdout).toMatch(/setup\s+leads p50\s+leads max\s+heartbeat p50\s+heartbeat max/);
      expect(stdout).toMatch(/sqlite: one instance, restarted at once\s+\d+/);
      expect(stdout).toMatch(/postgres: 3 instances, lease 2s\s+\d+/);
    }, 180_000);
  },
);
