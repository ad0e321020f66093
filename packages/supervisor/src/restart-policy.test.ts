import { describe, expect, it } from "vitest";
import { isSupervisorError } from "./errors.js";
import { nextRestartDecision, type RunRecord, resolveRestartPolicy } from "./restart-policy.js";

const policy = resolveRestartPolicy({
  initialDelayMs: 1000,
  factor: 2,
  maxDelayMs: 5000,
  stablePeriodMs: 60_000,
  maxQuickFailures: 5,
});

/** Runs of the given durations (seconds), back to back, starting at t=0. */
function runs(...durationsS: number[]): RunRecord[] {
  let t = 0;
  return durationsS.map((d) => {
    const run = { startedAtMs: t, exitedAtMs: t + d * 1000 };
    t += d * 1000 + 1000;
    return run;
  });
}

describe("nextRestartDecision", () => {
  it.each([
    { name: "first quick crash", history: runs(1), action: "restart", delayMs: 1000, quick: 1 },
    {
      name: "second quick crash doubles",
      history: runs(1, 1),
      action: "restart",
      delayMs: 2000,
      quick: 2,
    },
    {
      name: "third quick crash doubles again",
      history: runs(1, 1, 1),
      action: "restart",
      delayMs: 4000,
      quick: 3,
    },
    {
      name: "fourth is capped",
      history: runs(1, 1, 1, 1),
      action: "restart",
      delayMs: 5000,
      quick: 4,
    },
    { name: "fifth gives up", history: runs(1, 1, 1, 1, 1), action: "give-up", quick: 5 },
    {
      name: "stable run resets",
      history: runs(1, 1, 1, 1, 120),
      action: "restart",
      delayMs: 1000,
      quick: 0,
    },
    {
      name: "quick after stable counts from 1",
      history: runs(1, 1, 1, 1, 120, 1),
      action: "restart",
      delayMs: 1000,
      quick: 1,
    },
    {
      name: "exactly the stable period is stable",
      history: runs(60),
      action: "restart",
      delayMs: 1000,
      quick: 0,
    },
    { name: "empty history", history: [], action: "restart", delayMs: 1000, quick: 0 },
  ])("$name", ({ history, action, delayMs, quick }) => {
    const decision = nextRestartDecision(history, 500_000, policy);
    expect(decision.action).toBe(action);
    expect(decision.quickFailures).toBe(quick);
    if (decision.action === "restart") {
      expect(decision.delayMs).toBe(delayMs);
      expect(decision.restartAtMs).toBe(500_000 + delayMs!);
    } else {
      expect(decision.reason).toBe("5 consecutive runs shorter than 60000 ms");
    }
  });

  it("is pure: same input, same output, input untouched", () => {
    const history = runs(1, 2);
    const copy = structuredClone(history);
    expect(nextRestartDecision(history, 10, policy)).toEqual(
      nextRestartDecision(history, 10, policy),
    );
    expect(history).toEqual(copy);
  });
});

describe("resolveRestartPolicy", () => {
  it("fills defaults", () => {
    expect(resolveRestartPolicy()).toEqual({
      initialDelayMs: 1000,
      factor: 2,
      maxDelayMs: 60_000,
      stablePeriodMs: 60_000,
      maxQuickFailures: 5,
    });
  });

  it.each([
    [
      { initialDelayMs: -1 },
      "restart policy option initialDelayMs must be a finite number ≥ 0, got -1",
    ],
    [{ factor: 0.5 }, "restart policy option factor must be ≥ 1, got 0.5"],
    [
      { maxQuickFailures: 0 },
      "restart policy option maxQuickFailures must be an integer ≥ 1, got 0",
    ],
    [
      { maxDelayMs: Number.NaN },
      "restart policy option maxDelayMs must be a finite number ≥ 0, got NaN",
    ],
  ])("rejects %o", (options, message) => {
    let caught: unknown;
    try {
      resolveRestartPolicy(options);
    } catch (error) {
      caught = error;
    }
    expect(isSupervisorError(caught)).toBe(true);
    expect((caught as Error).message).toBe(message);
  });
});
