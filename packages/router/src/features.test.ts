import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { analyzeByParsing, analyzeByScanning, analyzeRequestBody } from "./analyze.js";
import { hashPromptBlocks } from "./block-hash.js";
import { extractRequestFeatures } from "./features.js";

describe("extractRequestFeatures", () => {
  it.each([
    {
      name: "chat with text parts",
      body: '{"model":"m","stream":true,"max_tokens":10,"messages":[{"role":"system","content":"S"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]}]}',
      expected: {
        model: "m",
        stream: true,
        promptText: "system\nS\nuser\nab\n",
        maxTokens: 10,
        estimatedTokens: 15,
      },
    },
    {
      name: "completion prompt list",
      body: '{"model":"m","prompt":["one","two"],"max_completion_tokens":4}',
      expected: {
        model: "m",
        stream: false,
        promptText: "one\ntwo",
        maxTokens: 4,
        estimatedTokens: 6,
      },
    },
    {
      name: "both limits: the larger is charged (engines disagree on which wins)",
      body: '{"model":"m","prompt":"abcd","max_tokens":1,"max_completion_tokens":1200}',
      expected: {
        model: "m",
        stream: false,
        promptText: "abcd",
        maxTokens: 1200,
        estimatedTokens: 1201,
      },
    },
    {
      name: "both limits, max_tokens larger",
      body: '{"model":"m","prompt":"abcd","max_tokens":300,"max_completion_tokens":2}',
      expected: {
        model: "m",
        stream: false,
        promptText: "abcd",
        maxTokens: 300,
        estimatedTokens: 301,
      },
    },
    {
      name: "an invalid limit beside a valid one",
      body: '{"model":"m","prompt":"abcd","max_tokens":"9999","max_completion_tokens":5}',
      expected: { model: "m", stream: false, promptText: "abcd", maxTokens: 5, estimatedTokens: 6 },
    },
    {
      name: "n choices each reserve the output limit",
      body: '{"model":"m","prompt":"abcd","max_tokens":10,"n":3}',
      expected: {
        model: "m",
        stream: false,
        promptText: "abcd",
        maxTokens: 10,
        choices: 3,
        estimatedTokens: 31,
      },
    },
    {
      name: "best_of candidates beyond n reserve the default each",
      body: '{"model":"m","prompt":"abcd","n":2,"best_of":4}',
      expected: {
        model: "m",
        stream: false,
        promptText: "abcd",
        choices: 4,
        estimatedTokens: 1025,
      },
    },
    {
      name: "n of 1 or not a positive integer is one choice",
      body: '{"model":"m","prompt":"abcd","n":1,"best_of":"9"}',
      expected: { model: "m", stream: false, promptText: "abcd", estimatedTokens: 257 },
    },
    {
      name: "token-id prompt",
      body: '{"model":"m","prompt":[1,2,3]}',
      expected: { model: "m", stream: false, promptText: "1,2,3", estimatedTokens: 258 },
    },
    {
      name: "embeddings input",
      body: '{"model":"e","input":"hello world"}',
      expected: { model: "e", stream: false, promptText: "hello world", estimatedTokens: 259 },
    },
    {
      name: "a cache_salt, not part of the prompt text",
      body: '{"model":"m","prompt":"abcd","cache_salt":"tenant-a"}',
      expected: {
        model: "m",
        stream: false,
        promptText: "abcd",
        estimatedTokens: 257,
        cacheSalt: "tenant-a",
      },
    },
  ])("$name", ({ body, expected }) => {
    expect(extractRequestFeatures(new TextEncoder().encode(body))).toEqual({
      ok: true,
      features: { streamUsage: "absent", ...expected },
    });
  });

  it.each([
    ['{"model":"m","stream":true}', "absent"],
    ['{"model":"m","stream":true,"stream_options":null}', "absent"],
    ['{"model":"m","stream":true,"stream_options":{"include_usage":true}}', "asked"],
    [
      '{"model":"m","stream_options":{"include_usage":true,"continuous_usage_stats":true}}',
      "asked",
    ],
    ['{"model":"m","stream":true,"stream_options":{"include_usage":false}}', "other"],
    ['{"model":"m","stream":true,"stream_options":{}}', "other"],
    ['{"model":"m","stream":true,"stream_options":"yes"}', "other"],
    ['{"model":"m","stream_options":{"include_usage":true},"stream_options":{}}', "other"],
  ])("stream_options of %s: %s", (body, streamUsage) => {
    for (const analyse of [analyzeByParsing, analyzeByScanning]) {
      expect(analyse(new TextEncoder().encode(body))).toMatchObject({ ok: true, streamUsage });
    }
  });

  it.each([
    { body: "", reason: "invalid_json" },
    { body: "[1]", reason: "not_an_object" },
    { body: "null", reason: "not_an_object" },
    { body: '{"model":""}', reason: "invalid_model" },
    { body: '{"model":7}', reason: "invalid_model" },
    { body: '{"model":"m","stream":"yes"}', reason: "invalid_field" },
    { body: '{"model":"m","cache_salt":""}', reason: "invalid_field" },
  ])("refuses $body as $reason", ({ body, reason }) => {
    expect(extractRequestFeatures(body)).toMatchObject({ ok: false, reason });
  });

  it("never throws on arbitrary bytes", () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 512 }), (bytes) => {
        const r = analyzeRequestBody(bytes);
        expect(typeof r.ok).toBe("boolean");
      }),
      { numRuns: 500 },
    );
  });

  it("never throws on arbitrary JSON values", () => {
    fc.assert(
      fc.property(fc.jsonValue(), (value) => {
        const r = analyzeRequestBody(JSON.stringify(value));
        expect(typeof r.ok).toBe("boolean");
      }),
      { numRuns: 500 },
    );
  });
});

describe("hashPromptBlocks", () => {
  it("hashes complete blocks only, each key standing for its whole prefix", () => {
    const a = hashPromptBlocks("x".repeat(2500), { blockBytes: 1000 });
    const b = hashPromptBlocks(`${"x".repeat(1000)}y${"x".repeat(1999)}`, { blockBytes: 1000 });
    expect(a.length).toBe(2);
    expect(b.length).toBe(3);
    expect(a[0]).toBe(b[0]);
    expect(a[1]).not.toBe(b[1]);
    // Same block content at a different position is a different key (it is a chain).
    expect(a[1]).not.toBe(a[0]);
  });

  it("caps the chain at maxBlocks", () => {
    expect(hashPromptBlocks("z".repeat(10_000), { blockBytes: 100, maxBlocks: 7 }).length).toBe(7);
  });
});
