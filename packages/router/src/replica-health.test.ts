import { describe, expect, it } from "vitest";
import { createManualClock } from "./clock.js";
import { type CircuitState, createReplicaHealth } from "./replica-health.js";

describe("replica health", () => {
  it("opens after consecutive failures, probes once after the cooldown, closes on success", () => {
    const clock = createManualClock();
    const transitions: string[] = [];
    const health = createReplicaHealth({
      clock,
      failureThreshold: 2,
      cooldownMs: 1000,
      onCircuitChange: (id, from: CircuitState, to: CircuitState) =>
        transitions.push(`${id}:${from}->${to}`),
    });
    health.onFailure("r");
    expect(health.isRoutable("r")).toBe(true);
    health.onFailure("r");
    expect(health.state("r")).toBe("open");
    expect(health.isRoutable("r")).toBe(false);
    clock.advance(1000);
    expect(health.isRoutable("r")).toBe(true);
    health.onDispatch("r");
    expect(health.state("r")).toBe("half-open");
    expect(health.isRoutable("r")).toBe(false); // one probe at a time
    health.onSuccess("r", 12);
    expect(health.state("r")).toBe("closed");
    expect(transitions).toEqual(["r:closed->open", "r:open->half-open", "r:half-open->closed"]);
  });

  it("re-opens when the probe fails, and frees the probe slot when abandoned", () => {
    const clock = createManualClock();
    const health = createReplicaHealth({ clock, failureThreshold: 1, cooldownMs: 500 });
    health.onFailure("r");
    clock.advance(500);
    health.onDispatch("r");
    health.onAbandon("r");
    expect(health.isRoutable("r")).toBe(true);
    health.onDispatch("r");
    health.onFailure("r");
    expect(health.state("r")).toBe("open");
    expect(health.isRoutable("r")).toBe(false);
  });

  it("tracks error rate and latency as EWMAs", () => {
    const health = createReplicaHealth({ ewmaAlpha: 0.5, failureThreshold: 10 });
    expect(health.latencyMs("r")).toBeUndefined();
    health.onSuccess("r", 100);
    health.onSuccess("r", 200);
    expect(health.latencyMs("r")).toBe(150);
    health.onFailure("r");
    expect(health.errorRate("r")).toBe(0.5);
  });
});
