import { describe, expect, it } from "vitest";
import { parseAgentConfig } from "./config.js";

const base = {
  controlPlaneUrl: "http://127.0.0.1:7070",
  joinToken: "j".repeat(20),
  stateDir: "/tmp/llmgw-agent",
};

describe("loadScrapeIntervalMs (--load-interval)", () => {
  it("defaults to 500 ms", () => {
    expect(parseAgentConfig(base).loadScrapeIntervalMs).toBe(500);
  });

  it.each([100, 500, 2_000, 60_000])("accepts %i ms", (ms) => {
    expect(parseAgentConfig({ ...base, loadScrapeIntervalMs: ms }).loadScrapeIntervalMs).toBe(ms);
  });

  it.each([
    [99, "must be 100..60000 ms (--load-interval)"],
    [0, "must be 100..60000 ms (--load-interval)"],
    [60_001, "must be 100..60000 ms (--load-interval)"],
    [250.5, "must be a whole number of milliseconds (--load-interval)"],
    // What the CLI passes for `--load-interval 1s` (Number("1s")).
    [Number.NaN, "must be a whole number of milliseconds (--load-interval)"],
  ])("refuses %d: %s", (ms, message) => {
    expect(() => parseAgentConfig({ ...base, loadScrapeIntervalMs: ms })).toThrow(
      `invalid agent configuration: loadScrapeIntervalMs: ${message}`,
    );
  });
});

describe.each([
  ["leaveTimeoutMs", "--leave-timeout", 600_000],
  ["relaunchFailedMs", "--relaunch-failed", 60_000],
] as const)("%s (%s)", (field, flag, defaultMs) => {
  it(`defaults to ${defaultMs / 1000} s`, () => {
    expect(parseAgentConfig(base)[field]).toBe(defaultMs);
  });

  it.each([0, 1, 30_000, 86_400_000])("accepts %i ms", (ms) => {
    expect(parseAgentConfig({ ...base, [field]: ms })[field]).toBe(ms);
  });

  it.each([
    [-1],
    [86_400_001],
    [0.5],
    // What the CLI passes for `10m` (not a number of seconds).
    [Number.NaN],
  ])("refuses %d", (ms) => {
    expect(() => parseAgentConfig({ ...base, [field]: ms })).toThrow(
      `invalid agent configuration: ${field}: must be 0..86400 seconds (${flag})`,
    );
  });
});
