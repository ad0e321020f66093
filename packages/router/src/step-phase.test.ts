import { describe, expect, it } from "vitest";
import { STEP_END_MARGIN_MS, StepPhase } from "./step-phase.js";

/** Steps ending every `period` ms from `start`, each seen as `streams` chunks 0.5 ms apart. */
function feed(phase: StepPhase, start: number, period: number, steps: number, streams = 3): number {
  let end = start;
  for (let s = 0; s < steps; s++) {
    end = start + s * period;
    for (let k = 0; k < streams; k++) phase.observe(end + k * 0.5);
  }
  return end;
}

describe("StepPhase", () => {
  it("knows nothing until two step ends were seen", () => {
    const phase = new StepPhase();
    expect(phase.waitShare(0)).toBeUndefined();
    phase.observe(100);
    phase.observe(100.5);
    expect(phase.periodMs()).toBeUndefined();
    expect(phase.waitShare(110)).toBeUndefined();
    phase.observe(140);
    expect(phase.periodMs()).toBe(40);
  });

  it("learns the period from chunk clusters, one per step, whatever the streams", () => {
    const phase = new StepPhase();
    feed(phase, 1_000, 40, 20, 8);
    expect(phase.periodMs()).toBeCloseTo(40, 6);
  });

  it("waits a whole step just after one ended and none a margin before the next", () => {
    const phase = new StepPhase();
    const last = feed(phase, 0, 40, 10);
    const margin = STEP_END_MARGIN_MS;
    expect(phase.waitShare(last + 1.5)).toBeCloseTo(1 - (1.5 + margin) / 40, 6);
    expect(phase.waitShare(last + 20)).toBeCloseTo((20 - margin) / 40, 6);
    // Due to end just as a request sent now would reach the engine: no wait.
    expect(phase.waitShare(last + 40 - margin)).toBeCloseTo(0, 6);
  });

  it("reads a step due to end within the margin as ended already: the next one is waited for", () => {
    const phase = new StepPhase();
    const last = feed(phase, 0, 40, 10);
    const margin = STEP_END_MARGIN_MS;
    // Half the margin left: the request arrives half a margin into the next step.
    expect(phase.waitShare(last + 40 - margin / 2)).toBeCloseTo(1 - margin / 2 / 40, 6);
    expect(phase.waitShare(last + 39.9)).toBeGreaterThan(phase.waitShare(last + 20) as number);
  });

  it("keeps the margin to a quarter of a short step", () => {
    const phase = new StepPhase();
    const last = feed(phase, 0, 4, 10, 1);
    expect(phase.periodMs()).toBeCloseTo(4, 6);
    expect(phase.waitShare(last + 3)).toBeCloseTo(0, 6);
    expect(phase.waitShare(last + 1)).toBeCloseTo(0.5, 6);
  });

  it("reads a step past its usual length as a long one still running, and a silent engine as idle", () => {
    const phase = new StepPhase();
    const last = feed(phase, 0, 40, 10);
    // Overdue: a prefill in that step, its end unknown.
    expect(phase.waitShare(last + 60)).toBe(1);
    // Nothing for three periods: the engine ran out of work and starts a step at once.
    expect(phase.silent(last + 119)).toBe(false);
    expect(phase.silent(last + 121)).toBe(true);
    expect(phase.waitShare(last + 121)).toBe(0);
  });

  it("keeps idle spells out of the period", () => {
    const phase = new StepPhase();
    const last = feed(phase, 0, 40, 10);
    // A second of silence, then steps again: the silence is no step.
    feed(phase, last + 1_000, 40, 3);
    expect(phase.periodMs()).toBeCloseTo(40, 6);
  });

  it("follows a rhythm that changes", () => {
    const phase = new StepPhase();
    const last = feed(phase, 0, 40, 10);
    feed(phase, last + 60, 60, 30);
    expect(phase.periodMs()).toBeGreaterThan(59);
    expect(phase.periodMs()).toBeLessThan(61);
  });
});
