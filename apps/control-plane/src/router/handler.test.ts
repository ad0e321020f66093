import { describe, expect, it } from "vitest";
import { lastNumber } from "./handler.js";

describe("lastNumber (usage counts at the end of an answer)", () => {
  it.each([
    ['{"usage":{"prompt_tokens":12,"completion_tokens":4}}', '"prompt_tokens"', 12],
    ['{"usage":{"prompt_tokens" :\n\t 7 }}', '"prompt_tokens"', 7],
    [
      'data: {"usage":{"completion_tokens":1}}\n\ndata: {"usage":{"completion_tokens":19}}',
      '"completion_tokens"',
      19,
    ],
    ['{"completion_tokens":3} then {"completion_tokens":"x"}', '"completion_tokens"', 3],
    ['{"prompt_tokens":null}', '"prompt_tokens"', undefined],
    ['{"other":5}', '"prompt_tokens"', undefined],
    ['"prompt_tokens"', '"prompt_tokens"', undefined],
    ["", '"prompt_tokens"', undefined],
  ])("%s → %s", (text, key, expected) => {
    expect(lastNumber(text, key)).toBe(expected);
  });
});
