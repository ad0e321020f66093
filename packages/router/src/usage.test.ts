import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  EventEndCounter,
  readAnswerUsage,
  readUsageCount,
  UsageEventFilter,
  UsageReader,
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

describe("EventEndCounter", () => {
  const counted = (...chunks: string[]) => {
    const counter = new EventEndCounter();
    for (const chunk of chunks) counter.push(bytes(chunk));
    return counter.count;
  };

  it.each([
    ['data: {"a":1}\n\ndata: {"b":2}\n\n', 2],
    ['data: {"a":"x\\n\\ny"}\n\n', 1],
    ["data: [DONE]\n", 0],
    ["\ndata: x\n\n", 1],
    ["", 0],
    ['data: {"a":1}\r\n\r\ndata: {"b":2}\r\n\r\n', 2],
    ['data: {"a":1}\r\rdata: {"b":2}\r\r', 2],
    ["data: a\r\n\ndata: b\n\r\n", 2],
    ["data: [DONE]\r\n", 0],
  ])("%j → %s", (text, expected) => {
    expect(counted(text)).toBe(expected);
  });

  it("counts an end split across chunks once, whatever ends its lines", () => {
    expect(counted("data: x\n", "\ndata: y\n\n")).toBe(2);
    expect(counted("data: x\r\n", "\r\n")).toBe(1);
    expect(counted("data: x\r", "\n\r", "\n")).toBe(1);
    expect(counted("data: x\r", "\r")).toBe(1);
    // A chunk that only ends a line, then one that starts the next event.
    expect(counted("data: x", "\n", "data: y\n\n")).toBe(1);
  });

  it("reads a stream the same however it is cut", () => {
    const streams = [
      'data: {"a":1}\n\ndata: {"b":2}\n\ndata: [DONE]\n\n',
      'data: {"a":1}\r\n\r\ndata: {"b":2}\r\n\r\ndata: [DONE]\r\n\r\n',
      'data: {"a":1}\r\rdata: {"b":2}\r\rdata: [DONE]\r\r',
    ];
    for (const stream of streams) {
      for (let i = 0; i <= stream.length; i++) {
        for (let j = i; j <= stream.length; j++) {
          const cut = counted(stream.slice(0, i), stream.slice(i, j), stream.slice(j));
          if (cut !== 3) throw new Error(`${JSON.stringify(stream)} cut at ${i}, ${j}: ${cut}`);
        }
      }
    }
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

  it.each(["\r\n", "\r"])(
    "forwards events ended by %j blank lines as they come, the usage event dropped",
    (eol) => {
      const crlf = (text: string) => text.replaceAll("\n", eol);
      const f = new UsageEventFilter();
      expect(f.push(Buffer.from(crlf(content(0)))).toString()).toBe(crlf(content(0)));
      expect(f.push(Buffer.from(crlf(usageEvent))).toString()).toBe("");
      expect(f.push(Buffer.from(crlf("data: [DONE]\n\n"))).toString()).toBe(
        crlf("data: [DONE]\n\n"),
      );
      expect(f.end()).toBe(undefined);
      expect(f.dropped).toBe(true);
    },
  );

  it("drops every usage event, after another empty-choices event and after a first drop", () => {
    const emptyNoUsage = 'data: {"choices":[]}\n\n';
    const text = `${content(0)}${emptyNoUsage}${usageEvent}${content(1)}${usageEvent}data: [DONE]\n\n`;
    const expected = `${content(0)}${emptyNoUsage}${content(1)}data: [DONE]\n\n`;
    expect(relay(text, [])).toEqual({ out: expected, dropped: true });
    const second = text.indexOf(usageEvent) + usageEvent.length;
    expect(relay(text, [second])).toEqual({ out: expected, dropped: true });
  });

  it("forwards every complete event at once: only a partial one waits", () => {
    const f = new UsageEventFilter();
    expect(f.push(Buffer.from(`${content(0)}data: {"id"`)).toString()).toBe(content(0));
  });
});

/** What `text`, cut into chunks at `cuts` (ascending), reads as through a fresh reader. */
function read(text: string, cuts: readonly number[] = []): string {
  const reader = new UsageReader();
  let from = 0;
  for (const at of [...cuts, text.length]) {
    if (at > from) reader.push(Buffer.from(text.slice(from, at), "latin1"));
    from = at;
  }
  return reader.text();
}

const USAGE =
  '"usage":{"prompt_tokens":1201,"completion_tokens":40,"prompt_tokens_details":{"cached_tokens":16}}';

describe("UsageReader", () => {
  it("finds usage followed by more than any tail holds (vLLM's prompt_logprobs and the rest)", () => {
    const after = JSON.stringify({
      prompt_logprobs: Array.from({ length: 300 }, (_, i) => ({
        [i]: { logprob: -1.5, rank: 1, decoded_token: "usage" },
      })),
      prompt_token_ids: Array.from({ length: 1200 }, (_, i) => i),
      kv_transfer_params: null,
    }).slice(1, -1);
    const answer = `{"id":"c","choices":[{"message":{"content":"the \\"usage\\": {\\"prompt_tokens\\":1}"}}],${USAGE},${after}}`;
    expect(answer.length - answer.indexOf(USAGE)).toBeGreaterThan(8192);
    expect(read(answer)).toBe(USAGE);
    const at = answer.indexOf(USAGE);
    expect(read(answer, [at - 10, at + 3, at + 30, 9000])).toBe(USAGE);
    expect(readAnswerUsage(read(answer))).toEqual({
      refused: false,
      prompt: 1201,
      completion: 40,
      cached: 16,
    });
  });

  it("reads a stream's usage event however it is cut, the last of several deciding", () => {
    const event = (usage: string) =>
      `data: {"id":"c","choices":[{"index":0,"delta":{"content":"usage"}}],${usage}}\n\n`;
    const stream = `${event('"usage":null')}${event('"usage": {"prompt_tokens":1,"completion_tokens":1}')}data: {"id":"c","choices":[],${USAGE}}\n\ndata: [DONE]\n\n`;
    fc.assert(
      fc.property(
        fc.uniqueArray(fc.integer({ min: 1, max: stream.length - 1 }), { maxLength: 12 }),
        (cuts) => {
          expect(
            read(
              stream,
              cuts.sort((a, b) => a - b),
            ),
          ).toBe(USAGE);
        },
      ),
    );
  });

  it("reads nothing where there is no whole usage member", () => {
    expect(read('{"choices":[{"message":{"content":"usage"}}],"object":"usage"}')).toBe("");
    expect(read('{"choices":[],"usage":{"prompt_tokens":5,"completion_tok')).toBe("");
    expect(read('{"choices":[],"usage":null}')).toBe('"usage":null');
  });
});
