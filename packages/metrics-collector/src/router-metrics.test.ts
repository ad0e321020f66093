import { Registry } from "prom-client";
import { describe, expect, it } from "vitest";
import { isMetricsCollectorError } from "./errors.js";
import { ROUTER_FAMILIES } from "./families.js";
import { boundLabelValue, boundModelLabel } from "./labels.js";
import { createRouterMetrics } from "./router-metrics.js";
import { parseExposition } from "./testing/exposition.js";
import { exerciseRouterMetrics } from "./testing/index.js";

describe("createRouterMetrics", () => {
  it("registers at least 22 llmgw_router_* families, each usable with its catalogue labels", async () => {
    const registry = new Registry();
    const metrics = createRouterMetrics(registry, {
      workerPool: () => ({ utilizationRatio: 0.25, queueSize: 4 }),
    });
    exerciseRouterMetrics(metrics);
    expect(ROUTER_FAMILIES.length).toBeGreaterThanOrEqual(22);
    const { samples, types } = parseExposition(await registry.metrics());
    for (const f of ROUTER_FAMILIES) {
      expect(f.name).toMatch(/^llmgw_router_[a-z_]+$/);
      expect(types.get(f.name)).toBe(f.type);
      const own = samples.filter((s) => s.name === f.name || s.name.startsWith(`${f.name}_`));
      expect(own.length, f.name).toBeGreaterThan(0);
      for (const s of own) {
        expect(
          Object.keys(s.labels)
            .filter((l) => l !== "le")
            .sort(),
          f.name,
        ).toEqual([...f.labelNames].sort());
      }
    }
    expect(
      samples.find((s) => s.name === "llmgw_router_worker_pool_utilization_ratio")?.value,
    ).toBe(0.25);
    expect(samples.find((s) => s.name === "llmgw_router_worker_pool_queue_size")?.value).toBe(4);
  });

  it("keeps the circuit state set exclusive", async () => {
    const registry = new Registry();
    const m = createRouterMetrics(registry);
    m.setCircuitState("llama", "r0", "open");
    m.setCircuitState("llama", "r0", "half_open");
    const states = parseExposition(await registry.metrics()).samples.filter(
      (s) => s.name === "llmgw_router_circuit_state",
    );
    expect(states.map((s) => [s.labels.state, s.value])).toEqual([
      ["closed", 0],
      ["open", 0],
      ["half_open", 1],
    ]);
  });

  it("forgets a replica's series so cardinality follows deployed replicas", async () => {
    const registry = new Registry();
    const m = createRouterMetrics(registry);
    exerciseRouterMetrics(m);
    m.forgetReplica("llama", "llama-0");
    const samples = parseExposition(await registry.metrics()).samples;
    expect(samples.filter((s) => s.labels.replica === "llama-0")).toEqual([]);
    expect(samples.some((s) => s.name === "llmgw_router_requests_total")).toBe(true);
  });

  it("leaves worker pool gauges missing without a sampler, or when it throws", async () => {
    for (const workerPool of [
      undefined,
      () => {
        throw new Error("pool closed");
      },
    ]) {
      const registry = new Registry();
      createRouterMetrics(registry, workerPool ? { workerPool } : {});
      const samples = parseExposition(await registry.metrics()).samples;
      expect(samples.filter((s) => s.name.startsWith("llmgw_router_worker_pool"))).toEqual([]);
    }
  });

  it("refuses double registration with a stable code", () => {
    const registry = new Registry();
    createRouterMetrics(registry);
    try {
      createRouterMetrics(registry);
      expect.unreachable();
    } catch (error) {
      expect(isMetricsCollectorError(error)).toBe(true);
      expect((error as { code: string }).code).toBe("LLMGW_METRICS_COLLECTOR_ALREADY_REGISTERED");
    }
  });

  it("unregister removes every router family", () => {
    const registry = new Registry();
    createRouterMetrics(registry).unregister();
    expect(registry.getMetricsAsArray()).toEqual([]);
  });
});

describe("label bounds", () => {
  it.each([
    ["short", 16, "short"],
    ["x".repeat(40), 16, "x".repeat(16)],
    [`${"a".repeat(15)}\uD83D\uDE00`, 16, "a".repeat(15)],
    ["lone \uDC00 surrogate", 64, "lone \uFFFD surrogate"],
  ])("boundLabelValue(%j, %i)", (input, max, expected) => {
    expect(boundLabelValue(input, max)).toBe(expected);
  });

  it("folds unknown model names into other", () => {
    const known = new Set(["llama"]);
    expect(boundModelLabel("llama", (m) => known.has(m))).toBe("llama");
    expect(boundModelLabel("x".repeat(1000), (m) => known.has(m))).toBe("other");
  });
});
