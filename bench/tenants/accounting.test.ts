import { postgresUnavailable } from "@llmgw/control-plane/testing";
import { describe, expect, it } from "vitest";
import { lastJson, runQuick } from "../lib/smoke.js";

const skip = postgresUnavailable();

// Smoke only: quick mode (two rates, 1 s each, per design) runs to the end against a real
// control plane on PostgreSQL and prints its tables. What is asserted does not depend on the
// box's speed: every design ran every rate, and llmgw's stored usage counted each request once.
describe.skipIf(skip)(
  `bench/tenants/accounting.ts --quick${skip ? ` (skipped: ${skip})` : ""}`,
  () => {
    it("runs both designs at every rate and stores llmgw's usage exactly", async () => {
      const { code, stdout, stderr } = await runQuick(
        new URL("./accounting.ts", import.meta.url),
        150_000,
      );
      expect(code, stderr.slice(-2000)).toBe(0);
      expect(stdout).toMatch(/design\s+offered req\/s\s+accounted\/s/);
      const result = lastJson<{
        rates: number[];
        rows: { design: string; rate: number; issued: number; exact?: boolean }[];
      }>(stdout);
      for (const design of ["llmgw", "per-request"]) {
        expect(result.rows.filter((r) => r.design === design).map((r) => r.rate)).toEqual(
          result.rates,
        );
      }
      for (const r of result.rows) expect(r.issued).toBeGreaterThan(0);
      expect(result.rows.find((r) => r.design === "llmgw")?.exact).toBe(true);
    }, 160_000);
  },
);
