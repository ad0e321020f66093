import { describe, expect, it } from "vitest";
import { parseCount, parseDurationMs } from "./control-plane.js";

describe("control-plane flag values", () => {
  it.each([
    ["4096", 4096],
    [" 1 ", 1],
  ])("count %j → %d", (text, expected) => {
    expect(parseCount(text, "--max-connections")).toBe(expected);
  });

  it.each(["0", "-1", "1.5", "many", ""])("refuses count %j", (text) => {
    expect(() => parseCount(text, "--max-connections")).toThrow(
      `--max-connections must be a whole number of at least 1, got "${text}"`,
    );
  });

  it.each([
    ["1500ms", 1500],
    ["30s", 30_000],
    ["2", 2000],
  ])("duration %j → %d ms", (text, expected) => {
    expect(parseDurationMs(text, "--headers-timeout")).toBe(expected);
  });
});
