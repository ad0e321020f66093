import { describe, expect, it } from "vitest";
import { buildWorkload, requestCount, type WorkloadSize } from "./workloads.js";

const size: WorkloadSize = {
  tenants: 10,
  conversationsPerTenant: 2,
  turns: 3,
  systemPromptChars: 4096,
  userTurnChars: 100,
};

describe("buildWorkload", () => {
  it.each([
    // workload, requests, distinct system prompts, share of conversations on tenant 0
    ["shared-prefix", 60, 10, 0.1],
    ["unique", 60, 60, 1 / 60],
    ["hot-prefix", 108, 10, 0.5],
  ] as const)(
    "%s: %i requests over %i system prompts, tenant 0 share %d",
    (name, requests, prompts, hotShare) => {
      const w = buildWorkload(name, size);
      expect(requestCount(w)).toBe(requests);
      expect(new Set(w.map((c) => c.system)).size).toBe(prompts);
      const first = name === "unique" ? "u0" : "t0";
      expect(w.filter((c) => c.session === first).length / w.length).toBeCloseTo(hotShare, 5);
    },
  );

  it("is deterministic for a seed and different across seeds", () => {
    expect(buildWorkload("shared-prefix", size, 3)).toEqual(
      buildWorkload("shared-prefix", size, 3),
    );
    expect(buildWorkload("shared-prefix", size, 3)).not.toEqual(
      buildWorkload("shared-prefix", size, 4),
    );
  });

  it("unique prompts share no 1 KiB prefix block (affinity cannot help)", () => {
    const heads = buildWorkload("unique", size).map((c) => c.system.slice(0, 1024));
    expect(new Set(heads).size).toBe(heads.length);
  });

  it("system prompts carry the requested length", () => {
    for (const c of buildWorkload("shared-prefix", size))
      expect(c.system.length).toBeGreaterThan(4096);
  });
});
