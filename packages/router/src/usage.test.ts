import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  countEventEnds,
  readAnswerUsage,
  readUsageCount,
  USAGE_TAIL_CHARS,
  UsageEventFilter,
  usageTail,
} from "./usage.js";

const bytes = (s: string) => new TextEncoder().encode(s);

describe("readUsageCount (usage counts at the end of an answer)", () => {
  it.each([
    ['{"usage":{"prompt_tokens":12,"completion_tokens":4}}', "prompt_tokens", 12],
    ['{"usage":{"prompt_tokens":12,"completion_tokens":4}}', "completion_tokens", 4],
    ['{"usage":{"prompt_tokens" :\n\t 7 }}', "prompt_tokens", 7],
    [
      'data: {"usage":{"completion_tokens":1}}\n\ndata: {"usage":{"completion_tokens":19}}',
      "completion_tokens",
      19,
    ],
    // The last stated count decides; an earlier one would undercount a stream.
    ['{"completion_tokens":3} then {"completion_tokens":"x"}', "completion_tokens", undefined],
    ['{"completion_tokens":-5}', "completion_tokens", undefined],
    ['{"completion_tokens":2.5}', "completion_tokens", undefined],
    ['{"completion_tokens":1e9}', "completion_tokens", undefined],
    ['{"completion_tokens":1234567890123456}', "completion_tokens", undefined],
    ['{"prompt_tokens":null}', "prompt_tokens", undefined],
    ['{"prompt_tokens_details":{"cached_tokens":3}}', "prompt_tokens", undefined],
    // Generated text quoting a usage object is escaped, so it never matches.
    ['{"content":"say \\"completion_tokens\\": 1"}', "completion_tokens", undefined],
    ['{"usage":{"prompt_tokens":9},"x":["prompt_tokens"]}', "prompt_tokens", 9],
    ['{"other":5}', "prompt_tokens", undefined],
    ['"prompt_tokens"', "prompt_tokens", undefined],
    ["", "prompt_tokens", undefined],
  ] as const)("%s → %s = %s", (text, field, expected) => {
    expect(readUsageCount(text, field)).toBe(expected);
  });
});

describe("usageTail", () => {
  it("keeps the last bytes of the last two chunks, and no more", () => {
    expect(usageTail(bytes("abc"), bytes("def"))).toBe("abcdef");
    expect(usageTail(undefined, bytes("def"))).toBe("def");
    expect(usageTail(undefined, undefined)).toBe("");
    const big = bytes(`${"x".repeat(USAGE_TAIL_CHARS)}{"completion_tokens":3}`);
    const tail = usageTail(bytes("previous"), big);
    expect(tail).toHaveLength(USAGE_TAIL_CHARS);
    expect(tail.endsWith('{"completion_tokens":3}')).toBe(true);
    const split = usageTail(bytes(`${"y".repeat(10_000)}{"prompt_`), bytes('tokens":8}'));
    expect(split).toHaveLength(USAGE_TAIL_CHARS);
    expect(readUsageCount(split, "prompt_tokens")).toBe(8);
  });

  it("reads a view at an offset of a larger buffer", () => {
    const whole = bytes('garbage{"prompt_tokens":5}');
    expect(usageTail(undefined, whole.subarray(7))).toBe('{"prompt_tokens":5}');
  });
});

describe("countEventEnds", () => {
  it.each([
    ['data: {"a":1}\n\ndata: {"b":2}\n\n', false, 2],
    ['data: {"a":"x\\n\\ny"}\n\n', false, 1],
    ["data: [DONE]\n", false, 0],
    ["\ndata: x\n\n", true, 2],
    ["\ndata: x\n\n", false, 1],
    ["", true, 0],
  ])("%j (after newline: %s) → %s", (text, afterNewline, expected) => {
    expect(countEventEnds(bytes(text), afterNewline)).toBe(expected);
  });
});

describe("readAnswerUsage (what an engine says it used, trusted only when sane)", () => {
  it.each([
    [
      '{"usage":{"prompt_tokens":12,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":8}}}',
      { refused: false, prompt: 12, completion: 4, cached: 8 },
    ],
    ['{"usage":{"prompt_tokens":3}}', { refused: false, prompt: 3 }],
    ['{"usage":{"prompt_tokens":3,"completion_tokens":null}}', { refused: false, prompt: 3 }],
    ['{"choices":[]}', { refused: false }],
    ["", { refused: false }],
    // Hostile or corrupt: refused, none of the answer's counts kept.
    ['{"usage":{"prompt_tokens":-1,"completion_tokens":4}}', { refused: true }],
    ['{"usage":{"prompt_tokens":5,"completion_tokens":NaN}}', { refused: true }],
    ['{"usage":{"prompt_tokens":5,"completion_tokens":1e30}}', { refused: true }],
    ['{"usage":{"prompt_tokens":5,"completion_tokens":2.5}}', { refused: true }],
    ['{"usage":{"prompt_tokens":"5","completion_tokens":2}}', { refused: true }],
    ['{"usage":{"prompt_tokens":16777217,"completion_tokens":2}}', { refused: true }],
    [
      '{"usage":{"prompt_tokens":4,"prompt_tokens_details":{"cached_tokens":9}}}',
      { refused: true },
    ],
  ] as const)("%s", (text, expected) => {
    expect(readAnswerUsage(text)).toEqual(expected);
  });
});

describe("UsageEventFilter (the usage event the client did not ask for)", () => {
  const usageEvent =
    'data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n';
  const content = (i: number) =>
    `data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"t${i}"}}]}\n\n`;
  const stream = `${content(0)}${content(1)}${usageEvent}data: [DONE]\n\n`;
  const withoutUsage = `${content(0)}${content(1)}data: [DONE]\n\n`;

  /** The stream cut into chunks at `cuts`, through a fresh filter. */
  const relay = (text: string, cuts: number[]): { out: string; dropped: boolean } => {
    const f = new UsageEventFilter();
    const parts: Buffer[] = [];
    let from = 0;
    for (const at of [...cuts, text.length]) {
      parts.push(f.push(Buffer.from(text.slice(from, at))));
      from = at;
    }
    const rest = f.end();
    if (rest !== undefined) parts.push(rest);
    return { out: Buffer.concat(parts).toString(), dropped: f.dropped };
  };

  it("drops exactly that event, however the stream is cut", () => {
    expect(relay(stream, [])).toEqual({ out: withoutUsage, dropped: true });
    fc.assert(
      fc.property(
        fc.uniqueArray(fc.integer({ min: 1, max: stream.length - 1 }), { maxLength: 8 }),
        (cuts) => {
          expect(
            relay(
              stream,
              cuts.sort((a, b) => a - b),
            ),
          ).toEqual({
            out: withoutUsage,
            dropped: true,
          });
        },
      ),
    );
  });

  it("leaves a stream without a usage event byte for byte, an unfinished end included", () => {
    const text = `${content(0)}${content(1)}data: {"unfinished`;
    expect(relay(text, [5, 40])).toEqual({ out: text, dropped: false });
    const emptyNoUsage = 'data: {"choices":[]}\n\n';
    expect(relay(emptyNoUsage, [])).toEqual({ out: emptyNoUsage, dropped: false });
  });

  it("forwards every complete event at once: only a partial one waits", () => {
    const f = new UsageEventFilter();
    expect(f.push(Buffer.from(`${content(0)}data: {"id"`)).toString()).toBe(content(0));
  });
});
