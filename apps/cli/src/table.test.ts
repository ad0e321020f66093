import { describe, expect, it } from "vitest";
import { formatDuration, renderTable } from "./table.js";

describe("renderTable", () => {
  it("pads every column but the last", () => {
    expect(
      renderTable(
        ["NAME", "STATE"],
        [
          ["chat", "ready"],
          ["embeddings-large", "loading"],
        ],
      ),
    ).toBe("NAME              STATE\nchat              ready\nembeddings-large  loading\n");
  });
  it("prints only the header for no rows", () => {
    expect(renderTable(["A", "B"], [])).toBe("A  B\n");
  });
});

describe("formatDuration", () => {
  it.each([
    [0, "0s"],
    [59_999, "59s"],
    [65_000, "1m 05s"],
    [3_600_000 + 60_000, "1h 01m"],
    [3 * 86_400_000, "3d"],
  ])("%i ms → %s", (ms, text) => {
    expect(formatDuration(ms)).toBe(text);
  });
});
