import { describe, expect, it } from "vitest";
import { probeAddress } from "./run.js";

describe("probeAddress", () => {
  it.each([
    ["10.0.0.5", "10.0.0.5"],
    ["127.0.0.1", "127.0.0.1"],
    // Wildcard binds accept loopback, and a probe cannot connect to the wildcard itself.
    ["0.0.0.0", "127.0.0.1"],
    ["::", "::1"],
    ["[::]", "::1"],
    ["fd00::5", "fd00::5"],
    ["[fd00::5]", "fd00::5"],
  ])("an engine bound to %s is probed at %s", (bind, probe) => {
    expect(probeAddress(bind)).toBe(probe);
  });
});
