import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { parsePrometheusText } from "./prometheus.js";

// Shape as emitted by prometheus_client (formats.md §4.6).
const VLLM_SAMPLE = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="google/gemma-3-4b-it"} 0.0
vllm:kv_cache_usage_perc{engine="0",model_name="google/gemma-3-4b-it"} 0.0
vllm:prefix_cache_queries_total{engine="0",model_name="google/gemma-3-4b-it"} 123362.0
vllm:prefix_cache_hits_total{engine="0",model_name="google/gemma-3-4b-it"} 61216.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="google/gemma-3-4b-it"} 3.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="google/gemma-3-4b-it"} 10.0
`;

describe("parsePrometheusText", () => {
  it("parses the vLLM exposition sample", () => {
    const samples = parsePrometheusText(VLLM_SAMPLE);
    expect(samples).toHaveLength(6);
    expect(samples[3]).toEqual({
      name: "vllm:prefix_cache_hits_total",
      labels: { engine: "0", model_name: "google/gemma-3-4b-it" },
      value: 61216,
    });
    expect(samples[4]?.labels).toEqual({
      engine: "0",
      le: "0.1",
      model_name: "google/gemma-3-4b-it",
    });
  });

  it.each([
    { line: "up 1", expected: { name: "up", labels: {}, value: 1 } },
    { line: "a:b_c 1.7592e+09", expected: { name: "a:b_c", labels: {}, value: 1.7592e9 } },
    { line: "x{} 3", expected: { name: "x", labels: {}, value: 3 } },
    { line: 'x{a="1",} 3', expected: { name: "x", labels: { a: "1" }, value: 3 } },
    {
      line: 'x{ a = "1" , b="2"} 3',
      expected: { name: "x", labels: { a: "1", b: "2" }, value: 3 },
    },
    {
      line: 'x{p="a\\"b\\\\c\\nd"} 1',
      expected: { name: "x", labels: { p: 'a"b\\c\nd' }, value: 1 },
    },
    { line: 'x{p="}{,= "} 1', expected: { name: "x", labels: { p: "}{,= " }, value: 1 } },
    {
      line: "x 5 1700000000000",
      expected: { name: "x", labels: {}, value: 5, timestampMs: 1_700_000_000_000 },
    },
    { line: "x +Inf", expected: { name: "x", labels: {}, value: Number.POSITIVE_INFINITY } },
    { line: "x -Inf", expected: { name: "x", labels: {}, value: Number.NEGATIVE_INFINITY } },
    { line: "x NaN", expected: { name: "x", labels: {}, value: Number.NaN } },
    { line: "  x\t-0.5  ", expected: { name: "x", labels: {}, value: -0.5 } },
  ])("parses $line", ({ line, expected }) => {
    expect(parsePrometheusText(line)).toEqual([expected]);
  });

  it.each([
    "# TYPE x gauge",
    "",
    "x",
    "x{a=1} 1",
    'x{a="1" 1',
    'x{a="1"}1',
    "1x 2",
    "x one",
    "x 1 2 3",
    "x 1 later",
    'x{a="unterminated} 1',
    'x{-a="1"} 1',
  ])("skips malformed or comment line %j", (line) => {
    expect(parsePrometheusText(line)).toEqual([]);
  });

  it("keeps good lines around bad ones and tolerates CRLF", () => {
    expect(parsePrometheusText("a 1\r\ngarbage here now\r\nb 2\r\n").map((s) => s.name)).toEqual([
      "a",
      "b",
    ]);
  });

  it("never throws on arbitrary text", () => {
    fc.assert(
      fc.property(fc.string({ maxLength: 400 }), (text) => {
        expect(Array.isArray(parsePrometheusText(text))).toBe(true);
      }),
      { numRuns: 2000 },
    );
  });

  it("never throws on exposition-like fragments, and every sample has a finite-or-special value", () => {
    const token = fc.constantFrom(
      "vllm:x",
      "{",
      "}",
      '"',
      "\\",
      "=",
      ",",
      " ",
      "\n",
      "#",
      "a",
      "1",
      "1e5",
      "NaN",
      "+Inf",
      "le",
      "0.5",
      "\t",
      "-",
    );
    fc.assert(
      fc.property(fc.array(token, { maxLength: 60 }), (tokens) => {
        for (const sample of parsePrometheusText(tokens.join(""))) {
          expect(typeof sample.value).toBe("number");
          expect(sample.name).toMatch(/^[a-zA-Z_:][a-zA-Z0-9_:]*$/);
        }
      }),
      { numRuns: 2000 },
    );
  });
});
