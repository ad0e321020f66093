import { describe, expect, it } from "vitest";
import { resolveHttpListenerOptions } from "./http-listener.js";
import { optionInt } from "./option-int.js";
import { resolveRouterServiceOptions } from "./options.js";

describe("optionInt", () => {
  it("returns a safe integer within the bounds, bounds included", () => {
    expect(optionInt("router", "x", 1, 1, 10)).toBe(1);
    expect(optionInt("router", "x", 10, 1, 10)).toBe(10);
  });

  it.each([
    [0, "0"],
    [11, "11"],
    [1.5, "1.5"],
    [Number.NaN, "NaN"],
    [Number.POSITIVE_INFINITY, "Infinity"],
  ])("refuses %s, naming the option and echoing the value", (value, shown) => {
    expect(() => optionInt("listener", "maxConnections", value, 1, 10)).toThrow(
      `listener option maxConnections must be an integer in [1, 10], got ${shown}`,
    );
  });

  it("is what both resolvers use, each naming its own scope", () => {
    expect(() => resolveHttpListenerOptions({ headersTimeoutMs: 0 })).toThrow(
      /^listener option headersTimeoutMs must be an integer in \[1, /,
    );
    expect(() => resolveRouterServiceOptions({ maxBodyBytes: 1.5 })).toThrow(
      /^router option maxBodyBytes must be an integer in \[1, .*got 1\.5$/,
    );
  });
});
