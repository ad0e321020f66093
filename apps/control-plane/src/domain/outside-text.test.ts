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
    // Bidirectional overrides and isolates reorder what follows them on screen.
    ["gpu-\u202etxt.exe", "gpu-\\u202etxt.exe"],
    ["a\u2066b\u2069c\u200fd\u061c", "a\\u2066b\\u2069c\\u200fd\\u061c"],
    ["\u202a\u202b\u202c\u202d", "\\u202a\\u202b\\u202c\\u202d"],
    ["C:\\path ünïcödé ✓", "C:\\path ünïcödé ✓"],
  ])("%j → %j", (input, expected) => {
    expect(escapeOutsideText(input)).toBe(expected);
  });
});
