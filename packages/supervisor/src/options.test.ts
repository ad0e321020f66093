import { describe, expect, it } from "vitest";
import { validateProcessSpec } from "./process-spec.js";
import { resolveRestartPolicy } from "./restart-policy.js";
import { resolveSupervisorOptions } from "./supervisor.js";

const INVALID = { code: "LLMGW_SUPERVISOR_INVALID_OPTIONS" };

describe("option validation", () => {
  it.each([
    { name: "empty stateDir", options: { stateDir: "" }, message: /stateDir/ },
    { name: "zero kill wait", options: { stateDir: "/s", killWaitMs: 0 }, message: /killWaitMs/ },
    {
      name: "NaN poll interval",
      options: { stateDir: "/s", logPollIntervalMs: Number.NaN },
      message: /logPollIntervalMs/,
    },
  ])("resolveSupervisorOptions rejects $name, naming the field", ({ options, message }) => {
    expect(() => resolveSupervisorOptions(options)).toThrow(message);
    expect(() => resolveSupervisorOptions(options)).toThrow(expect.objectContaining(INVALID));
  });

  it.each([
    { name: "factor below 1", options: { factor: 0.5 }, message: /factor/ },
    { name: "negative delay", options: { initialDelayMs: -1 }, message: /initialDelayMs/ },
    { name: "fractional give-up", options: { maxQuickFailures: 1.5 }, message: /maxQuickFailures/ },
  ])("resolveRestartPolicy rejects $name", ({ options, message }) => {
    expect(() => resolveRestartPolicy(options)).toThrow(message);
    expect(() => resolveRestartPolicy(options)).toThrow(expect.objectContaining(INVALID));
  });

  it.each([
    { name: "no argv", spec: { argv: [], env: {}, logFile: "/l" }, message: /argv/ },
    { name: "no log file", spec: { argv: ["x"], env: {}, logFile: "" }, message: /logFile/ },
    {
      name: "negative grace",
      spec: { argv: ["x"], env: {}, logFile: "/l", stopGraceMs: -1 },
      message: /stopGraceMs/,
    },
  ])("validateProcessSpec rejects $name", ({ spec, message }) => {
    expect(() => validateProcessSpec(spec)).toThrow(message);
    expect(() => validateProcessSpec(spec)).toThrow(expect.objectContaining(INVALID));
  });
});
