import { describe, expect, it } from "vitest";
import { optionalLimit } from "./optional-limit.js";

describe("optionalLimit", () => {
  it.each([
    ["", undefined],
    [" 42 ", 42],
    ["4294967295", 4_294_967_295],
  ])("%j → %j", (typed, limit) => {
    expect(optionalLimit(typed, "rpm")).toBe(limit);
  });

  it("refuses past 32 bits, naming the field", () => {
    expect(() => optionalLimit("4294967296", "rpm")).toThrow(
      "rpm: a whole number of at least 1, or empty for no limit",
    );
  });
});
