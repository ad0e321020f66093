import { describe, expect, it } from "vitest";
import { formatDuration, renderTable, terminalText } from "./table.js";

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
  it("escapes what an agent could put in a cell to forge lines or drive the terminal", () => {
    expect(
      renderTable(["NODE", "HOST"], [["n1", "gpu1\n[fake] node-x ready \u001b[2J\u2028"]]),
    ).toBe("NODE  HOST\nn1    gpu1\\n[fake] node-x ready \\u001b[2J\\u2028\n");
  });
});

describe("terminalText", () => {
  it("keeps the lines of a log tail but escapes the controls inside each", () => {
    expect(terminalText("loading\r\u001b[31mOOM\u0007\nexit 1")).toBe(
      "loading\\r\\u001b[31mOOM\\u0007\nexit 1",
    );
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
