import { describe, expect, it } from "vitest";
import { escapeOutsideText } from "./outside-text.js";

describe("escapeOutsideText", () => {
  it.each([
    ["gpu-node-1", "gpu-node-1"],
    ["gpu1\n[fake] admin login", "gpu1\\n[fake] admin login"],
    ["a\r\nb", "a\\r\\nb"],
    ["tab\there", "tab\\there"],
    ["\u001b[31mred\u001b[0m", "\\u001b[31mred\\u001b[0m"],
    ["nul\u0000", "nul\\u0000"],
    ["del\u007f c1\u0085", "del\\u007f c1\\u0085"],
    ["ls\u2028ps\u2029", "ls\\u2028ps\\u2029"],
    ["C:\\path ünïcödé ✓", "C:\\path ünïcödé ✓"],
  ])("%j → %j", (input, expected) => {
    expect(escapeOutsideText(input)).toBe(expected);
  });
});
