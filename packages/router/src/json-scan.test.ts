import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  analyzeByParsing,
  analyzeByScanning,
  analyzeRequestBody,
  type BodyAnalysis,
  SCAN_THRESHOLD_BYTES,
} from "./analyze.js";
import { scanRequestBody } from "./json-scan.js";

// One key per byte: equal chains mean the scanner's prompt bytes equal the reference's.
const EVERY_BYTE = { blockBytes: 1, maxBlocks: 1 << 20 };
const SMALL_BLOCKS = { blockBytes: 7, maxBlocks: 1 << 20 };
// Quarter keys every 4 bytes (block sizes that are a multiple of 16 have them).
const QUARTERED = { blockBytes: 16, maxBlocks: 1 << 20 };
const strictUtf8 = new TextDecoder("utf-8", { fatal: true });

type Outcome =
  | { ok: false; reason: string; param?: string }
  | {
      ok: true;
      model: string;
      stream: boolean;
      streamUsage: string;
      maxTokens?: number;
      choices?: number;
      estimatedTokens: number;
      chain?: Float64Array;
      quarters?: readonly number[];
      hint?: { source: string; value: string };
      salt?: string;
    };

function outcome(a: BodyAnalysis, withChain: boolean): Outcome {
  if (!a.ok) {
    return a.param === undefined
      ? { ok: false, reason: a.reason }
      : { ok: false, reason: a.reason, param: a.param };
  }
  return {
    ok: true,
    model: a.model,
    stream: a.stream,
    streamUsage: a.streamUsage,
    ...(a.maxTokens === undefined ? {} : { maxTokens: a.maxTokens }),
    ...(a.choices === undefined ? {} : { choices: a.choices }),
    estimatedTokens: a.estimatedTokens,
    ...(withChain ? { chain: a.chain, quarters: a.quarters } : {}),
    ...(a.hint === undefined ? {} : { hint: a.hint }),
    ...(a.salt === undefined ? {} : { salt: a.salt }),
  };
}

/** What `JSON.parse` (`features.ts`, the reference) says about `bytes`. */
const reference = (bytes: Uint8Array, options = EVERY_BYTE, withChain = true): Outcome =>
  outcome(analyzeByParsing(bytes, options), withChain);

/** What the byte scanner says. */
const scanned = (bytes: Uint8Array, options = EVERY_BYTE, withChain = true): Outcome =>
  outcome(analyzeByScanning(bytes, options), withChain);

function isUtf8(bytes: Uint8Array): boolean {
  try {
    strictUtf8.decode(bytes);
    return true;
  } catch {
    return false;
  }
}

function agree(bytes: Uint8Array): void {
  if (isUtf8(bytes)) {
    expect(scanned(bytes)).toEqual(reference(bytes));
    expect(scanned(bytes, SMALL_BLOCKS)).toEqual(reference(bytes, SMALL_BLOCKS));
    expect(scanned(bytes, QUARTERED)).toEqual(reference(bytes, QUARTERED));
    return;
  }
  // Invalid UTF-8 inside a string: the reference decodes it to U+FFFD (3 bytes) before
  // counting and hashing, the scanner counts and hashes the raw bytes. Either is consistent;
  // everything else must agree.
  const drop = (o: Outcome) => (o.ok ? { ...o, estimatedTokens: 0 } : o);
  expect(drop(scanned(bytes, EVERY_BYTE, false))).toEqual(
    drop(reference(bytes, EVERY_BYTE, false)),
  );
}

const utf8 = (s: string): Uint8Array => new TextEncoder().encode(s);

// ---- A JSON text generator that can do what JSON.stringify won't: duplicate keys, escaped
// ---- non-ASCII (as Python's ensure_ascii does), odd whitespace.

type Node =
  | { t: "obj"; entries: [string, Node][] }
  | { t: "arr"; items: Node[] }
  | { t: "str"; v: string }
  | { t: "num"; v: string }
  | { t: "lit"; v: "true" | "false" | "null" };

interface Style {
  readonly escapeNonAscii: boolean;
  readonly escapeAll: boolean;
  readonly ws: string;
}

function quote(s: string, style: Style): string {
  let out = '"';
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    const ch = s[i] as string;
    if (ch === '"' || ch === "\\") out += `\\${ch}`;
    else if (c < 0x20 || (style.escapeNonAscii && c > 0x7e) || (style.escapeAll && i % 3 === 0)) {
      out += `\\u${c.toString(16).padStart(4, "0")}`;
    } else if (c >= 0xd800 && c <= 0xdfff) {
      // A lone surrogate can only travel escaped (raw it is not UTF-8).
      const pair =
        c <= 0xdbff &&
        i + 1 < s.length &&
        s.charCodeAt(i + 1) >= 0xdc00 &&
        s.charCodeAt(i + 1) <= 0xdfff;
      if (pair) {
        out += s.slice(i, i + 2);
        i++;
      } else out += `\\u${c.toString(16).toUpperCase()}`;
    } else out += ch;
  }
  return `${out}"`;
}

function write(node: Node, style: Style): string {
  const w = style.ws;
  switch (node.t) {
    case "obj":
      return `{${w}${node.entries.map(([k, v]) => `${quote(k, style)}${w}:${w}${write(v, style)}`).join(`${w},${w}`)}${w}}`;
    case "arr":
      return `[${w}${node.items.map((v) => write(v, style)).join(`${w},${w}`)}${w}]`;
    case "str":
      return quote(node.v, style);
    default:
      return node.v;
  }
}

const anyText = fc.oneof(
  fc.string({ maxLength: 40 }),
  fc.string({ unit: "binary", maxLength: 40 }),
  fc.constantFrom("", "\n", "é", "日本語", "😀", "\ud83d", "\ude00", 'q"uo\\te', "\t\u0001"),
);
const str = anyText.map((v): Node => ({ t: "str", v }));
const num = fc
  .oneof(
    fc.integer({ min: -5, max: 1_000_000 }).map(String),
    fc.constantFrom("0", "-0", "1.0", "1e2", "2E+1", "1.5", "9007199254740993", "1e400", "-3"),
    fc.double({ noNaN: true, noDefaultInfinity: true }).map((d) => JSON.stringify(d)),
  )
  .map((v): Node => ({ t: "num", v }));
const lit = fc.constantFrom("true", "false", "null").map((v): Node => ({ t: "lit", v }));
const { json } = fc.letrec<{ json: Node }>((tie) => ({
  json: fc.oneof(
    { depthSize: "small", withCrossShrink: true },
    str,
    num,
    lit,
    fc.array(tie("json"), { maxLength: 4 }).map((items): Node => ({ t: "arr", items })),
    fc
      .array(fc.tuple(fc.oneof(anyText, fc.constantFrom("text", "role")), tie("json")), {
        maxLength: 4,
      })
      .map((entries): Node => ({ t: "obj", entries })),
  ),
}));
const obj = (entries: [string, Node][]): Node => ({ t: "obj", entries });
const arr = (items: Node[]): Node => ({ t: "arr", items });
const part = fc.oneof(
  fc
    .tuple(str, fc.boolean())
    .map(([text, typed]) =>
      obj([
        ...(typed ? ([["type", { t: "str", v: "text" }]] as [string, Node][]) : []),
        ["text", text],
      ]),
    ),
  json,
);
const content = fc.oneof(str, fc.array(part, { maxLength: 4 }).map(arr), json);
const message = fc.oneof(
  {
    weight: 4,
    arbitrary: fc
      .tuple(
        fc.option(fc.oneof(str, json), { nil: undefined }),
        fc.option(content, { nil: undefined }),
        fc.option(content, { nil: undefined }),
        fc.array(fc.tuple(anyText, json), { maxLength: 2 }),
      )
      .map(([role, c1, c2, extra]) => {
        const entries: [string, Node][] = [...extra];
        if (role !== undefined) entries.push(["role", role]);
        if (c1 !== undefined) entries.push(["content", c1]);
        if (c2 !== undefined) entries.push(["content", c2]); // duplicate key: the last one wins
        return obj(entries);
      }),
  },
  { weight: 1, arbitrary: json },
);
const tokenItem = fc.oneof(
  num,
  str,
  fc.array(fc.oneof(num, json), { maxLength: 4 }).map(arr),
  json,
);
const input = fc.oneof(str, fc.array(tokenItem, { maxLength: 5 }).map(arr), json);
const field = fc.oneof(
  fc.tuple(fc.constant("model"), fc.oneof({ weight: 5, arbitrary: str }, json)),
  fc.tuple(fc.constant("stream"), fc.oneof(lit, json)),
  fc.tuple(
    fc.constant("stream_options"),
    fc.oneof(
      lit,
      json,
      fc
        .array(fc.tuple(fc.constantFrom("include_usage", "continuous_usage_stats"), lit), {
          maxLength: 3,
        })
        .map(obj),
    ),
  ),
  fc.tuple(fc.constantFrom("max_tokens", "max_completion_tokens"), fc.oneof(num, lit, json)),
  fc.tuple(fc.constantFrom("n", "best_of"), fc.oneof(num, lit, json)),
  fc.tuple(
    fc.constantFrom("prompt_cache_key", "safety_identifier", "user"),
    fc.oneof({ weight: 4, arbitrary: str }, lit, json),
  ),
  fc.tuple(fc.constant("cache_salt"), fc.oneof({ weight: 4, arbitrary: str }, lit, json)),
  fc.tuple(
    fc.constant("messages"),
    fc.oneof({ weight: 5, arbitrary: fc.array(message, { maxLength: 5 }).map(arr) }, json),
  ),
  fc.tuple(fc.constantFrom("prompt", "input"), input),
  fc.tuple(anyText, json),
);
const body = fc
  .tuple(
    fc.array(field, { maxLength: 7 }),
    fc.record({
      escapeNonAscii: fc.boolean(),
      escapeAll: fc.boolean(),
      ws: fc.constantFrom("", " ", "\n\t ", "\r\n"),
    }),
    fc.boolean(),
  )
  .map(([fields, style, bom]) => {
    const entries: [string, Node][] = [["model", { t: "str", v: "m" }], ...fields];
    return utf8(`${bom ? "\ufeff" : ""}${style.ws}${write(obj(entries), style)}${style.ws}`);
  });

describe("scanRequestBody agrees with JSON.parse (features.ts)", () => {
  it("on generated request bodies", () => {
    fc.assert(fc.property(body, agree), { numRuns: 3000 });
  });

  it("on the same bodies cut short or with one byte changed", () => {
    fc.assert(
      fc.property(
        body,
        fc.nat(),
        fc.integer({ min: 0, max: 255 }),
        fc.boolean(),
        (b, at, byte, cut) => {
          const i = b.length === 0 ? 0 : at % b.length;
          const mutated = cut
            ? b.subarray(0, i)
            : Uint8Array.from(b, (x, j) => (j === i ? byte : x));
          agree(mutated);
        },
      ),
      { numRuns: 3000 },
    );
  });

  it("on arbitrary JSON values and arbitrary bytes", () => {
    fc.assert(
      fc.property(fc.jsonValue(), (v) => agree(utf8(JSON.stringify(v)))),
      { numRuns: 1000 },
    );
    fc.assert(fc.property(fc.uint8Array({ maxLength: 64 }), agree), { numRuns: 2000 });
  });

  it.each([
    ["empty", ""],
    ["whitespace only", " \n"],
    ["BOM then object", '\ufeff{"model":"m"}'],
    ["BOM twice", '\ufeff\ufeff{"model":"m"}'],
    ["trailing comma", '{"model":"m",}'],
    ["trailing garbage", '{"model":"m"} x'],
    ["two documents", '{"model":"m"}{}'],
    ["leading zero", '{"model":"m","max_tokens":01}'],
    ["bare dot", '{"model":"m","max_tokens":1.}'],
    ["bare exponent", '{"model":"m","max_tokens":1e}'],
    ["lone minus", '{"model":"m","max_tokens":-}'],
    ["raw tab in a string", '{"model":"m","prompt":"a\tb"}'],
    ["bad escape", '{"model":"m","prompt":"a\\qb"}'],
    ["short unicode escape", '{"model":"m","prompt":"\\u12"}'],
    ["unterminated string", '{"model":"m","prompt":"abc'],
    ["single quotes", "{'model':'m'}"],
    ["escaped key", '{"mod\\u0065l":"m","\\u0070rompt":"hi"}'],
    ["duplicate model", '{"model":"a","model":"b"}'],
    [
      "messages then a non-array messages",
      '{"model":"m","messages":[{"role":"u","content":"x"}],"messages":1,"prompt":"p"}',
    ],
    ["prompt null falls back to input", '{"model":"m","prompt":null,"input":"i"}'],
    ["max_tokens null falls back", '{"model":"m","max_tokens":null,"max_completion_tokens":9}'],
    [
      "max_tokens string, max_completion_tokens counts",
      '{"model":"m","max_tokens":"5","max_completion_tokens":9}',
    ],
    ["both limits, the larger counts", '{"model":"m","max_tokens":1,"max_completion_tokens":1200}'],
    ["both limits, max_tokens larger", '{"model":"m","max_tokens":300,"max_completion_tokens":0}'],
    ["surrogate pair escaped", '{"model":"m","prompt":"\\ud83d\\ude00 and \\ud83d alone \\ude00"}'],
    ["escapes", '{"model":"m","prompt":"\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\u65e5"}'],
    ["model of 256 escaped chars", `{"model":"${"\\u0061".repeat(256)}"}`],
    ["model of 257 escaped chars", `{"model":"${"\\u0061".repeat(257)}"}`],
    ["model of 256 astral chars", `{"model":"${"😀".repeat(128)}"}`],
    ["model of 129 astral chars", `{"model":"${"😀".repeat(129)}"}`],
    ["token ids", '{"model":"m","prompt":[1,2.50,-0,1e2]}'],
    ["token id lists", '{"model":"m","prompt":[[1,"x",2],[],[3]]}'],
    ["mixed prompt list", '{"model":"m","prompt":["a",1,null,["b"],{"c":1}]}'],
    ["array messages", '{"model":"m","messages":[[1],"s",null,{"role":1,"content":{"a":1}}]}'],
    [
      "text parts",
      '{"model":"m","messages":[{"content":[{"text":"a","text":"b"},{"text":1},["t"],"x"]}]}',
    ],
  ])("%s", (_name, text) => {
    agree(utf8(text));
  });

  it("keeps a growing conversation's prefix keys across the parse/scan threshold", () => {
    const system = "Prose with a newline, an é and a 😀 in it.\n".repeat(1000);
    const chat = (user: string) =>
      utf8(
        JSON.stringify({
          model: "m",
          messages: [
            { role: "system", content: system },
            { role: "user", content: user },
          ],
        }),
      );
    const small = chat("hi");
    const large = chat("x".repeat(40_000));
    expect(small.length).toBeLessThan(SCAN_THRESHOLD_BYTES);
    expect(large.length).toBeGreaterThanOrEqual(SCAN_THRESHOLD_BYTES);
    const a = analyzeRequestBody(small);
    const b = analyzeRequestBody(large);
    if (!a.ok || !b.ok) throw new Error("both bodies are valid");
    const shared = Math.floor(new TextEncoder().encode(`system\n${system}\nuser\n`).length / 1024);
    expect(shared).toBeGreaterThan(30);
    expect(b.chain.subarray(0, shared)).toEqual(a.chain.subarray(0, shared));
    expect(b.quarters.slice(0, 4 * shared)).toEqual(a.quarters.slice(0, 4 * shared));
  });

  it("walks deep nesting without overflowing the stack, as JSON.parse does", () => {
    const depth = 200_000;
    const deep = `{"model":"m","x":${"[".repeat(depth)}${"]".repeat(depth)}}`;
    expect(scanRequestBody(utf8(deep))).toMatchObject({ ok: true, model: "m" });
    expect(scanRequestBody(utf8(deep.slice(0, -2)))).toMatchObject({
      ok: false,
      reason: "invalid_json",
    });
  });

  it("charges the larger of max_tokens and max_completion_tokens", () => {
    expect(
      scanRequestBody(utf8('{"model":"m","max_tokens":1,"max_completion_tokens":1200}')),
    ).toMatchObject({ ok: true, maxTokens: 1200 });
    expect(
      scanRequestBody(utf8('{"max_completion_tokens":7,"model":"m","max_tokens":-3}')),
    ).toMatchObject({ ok: true, maxTokens: 7 });
  });

  it("reads the larger of n and best_of as the choices generated", () => {
    expect(scanRequestBody(utf8('{"model":"m","n":3,"best_of":5,"max_tokens":7}'))).toMatchObject({
      ok: true,
      maxTokens: 7,
      choices: 5,
    });
    expect(scanRequestBody(utf8('{"model":"m","n":1}'))).not.toHaveProperty("choices");
    // Only top-level members count: a message field named `n` is no choice count.
    expect(
      scanRequestBody(utf8('{"model":"m","messages":[{"role":"user","content":"x","n":4}]}')),
    ).not.toHaveProperty("choices");
  });

  it("reads the affinity hint: prompt_cache_key, else safety_identifier, else user", () => {
    expect(
      scanRequestBody(utf8('{"user":"u1","model":"m","prompt_cache_key":"tenant-7"}')),
    ).toMatchObject({ ok: true, hint: { source: "prompt_cache_key", value: "tenant-7" } });
    expect(
      scanRequestBody(utf8('{"model":"m","user":"u1","safety_identifier":"s\u00e9"}')),
    ).toMatchObject({ ok: true, hint: { source: "safety_identifier", value: "sé" } });
    // Empty and null are no hint; nested fields of the same name are not the request's.
    expect(
      scanRequestBody(
        utf8(
          '{"model":"m","prompt_cache_key":"","user":null,"messages":[{"role":"user","content":"x","user":"no"}]}',
        ),
      ),
    ).not.toHaveProperty("hint");
    // A long hint is cut to MAX_HINT_LENGTH, alike in both readers.
    const long = utf8(`{"model":"m","user":"${"é".repeat(2000)}"}`);
    expect(scanned(long)).toEqual(reference(long));
    expect(analyzeByScanning(long)).toMatchObject({ hint: { value: "é".repeat(256) } });
  });

  it.each(["prompt_cache_key", "safety_identifier", "user"])(
    "refuses a %s that is not a string, naming it",
    (field) => {
      for (const body of [`{"model":"m","${field}":7}`, `{"model":"m","${field}":{"a":1}}`]) {
        const expected = {
          ok: false,
          reason: "invalid_field",
          message: `\`${field}\` must be a string`,
          param: field,
        };
        expect(analyzeByScanning(utf8(body))).toEqual(expected);
        expect(analyzeByParsing(utf8(body))).toEqual(expected);
      }
    },
  );

  it("keys a salted prompt under its salt, alike in both readers, below and above 64 KiB", () => {
    const chat = (content: string, salt?: string) =>
      utf8(
        JSON.stringify({
          model: "m",
          messages: [{ role: "user", content }],
          ...(salt === undefined ? {} : { cache_salt: salt }),
        }),
      );
    const keysOf = (a: BodyAnalysis) => (a.ok ? [...a.chain, ...a.quarters] : []);
    const small = "Prose, é and 😀.\n".repeat(200);
    const large = "y".repeat(70_000);
    expect(chat(small, "tenant-a").length).toBeLessThan(SCAN_THRESHOLD_BYTES);
    expect(chat(large, "tenant-a").length).toBeGreaterThanOrEqual(SCAN_THRESHOLD_BYTES);
    for (const content of [small, large]) {
      const plain = chat(content);
      const a = chat(content, "tenant-a");
      const b = chat(content, "tenant-b");
      expect(analyzeRequestBody(a)).toMatchObject({ ok: true, salt: "tenant-a" });
      expect(analyzeRequestBody(plain)).not.toHaveProperty("salt");
      for (const options of [SMALL_BLOCKS, QUARTERED]) {
        expect(scanned(a, options)).toEqual(reference(a, options));
        expect(scanned(b, options)).toEqual(reference(b, options));
      }
      const keys = keysOf(analyzeRequestBody(a));
      expect(keys.length).toBeGreaterThan(8);
      for (const other of [b, plain]) {
        const seen = new Set(keysOf(analyzeRequestBody(other)));
        expect(keys.filter((k) => seen.has(k))).toEqual([]);
      }
      // The same salt, escaped or not, wherever it stands: the same keys.
      const escaped = utf8(
        `{"model":"m","cache_salt":"tenant-\\u0061","messages":${JSON.stringify([{ role: "user", content }])}}`,
      );
      expect(keysOf(analyzeRequestBody(escaped))).toEqual(keys);
      // A null salt is none, as in vLLM.
      const none = utf8(
        JSON.stringify({ model: "m", cache_salt: null, messages: [{ role: "user", content }] }),
      );
      expect(analyzeRequestBody(none)).toEqual(analyzeRequestBody(plain));
    }
  });

  /** A body with `salt` (JSON text) as its `cache_salt`, below and at the scan threshold. */
  const salted = (salt: string): Uint8Array[] => [
    utf8(`{"model":"m","cache_salt":${salt},"prompt":"p"}`),
    utf8(`{"model":"m","cache_salt":${salt},"prompt":"${"p".repeat(SCAN_THRESHOLD_BYTES)}"}`),
  ];

  it.each([
    ["a number", "7"],
    ["an object", '{"a":"b"}'],
    ["an array", '["s"]'],
    ["a boolean", "true"],
    ["empty", '""'],
    ["1025 characters", JSON.stringify("s".repeat(1025))],
    ["1025 escaped characters", `"${"\\u0073".repeat(1025)}"`],
    ["513 astral characters (1026 UTF-16 units)", JSON.stringify("😀".repeat(513))],
  ])("refuses a cache_salt that is %s, naming it", (_name, salt) => {
    const expected = {
      ok: false,
      reason: "invalid_field",
      message: "`cache_salt` must be a non-empty string of at most 1024 characters",
      param: "cache_salt",
    };
    for (const body of salted(salt)) {
      expect(analyzeRequestBody(body)).toEqual(expected);
      expect(analyzeByScanning(body)).toEqual(expected);
      expect(analyzeByParsing(body)).toEqual(expected);
    }
  });

  it.each([
    ["1024 characters", JSON.stringify("s".repeat(1024))],
    ["1024 escaped characters", `"${"\\u0073".repeat(1024)}"`],
    ["512 astral characters", JSON.stringify("😀".repeat(512))],
  ])("takes a cache_salt of %s, in both readers", (_name, salt) => {
    for (const body of salted(salt)) {
      const text = JSON.parse(salt) as string;
      expect(analyzeByScanning(body)).toMatchObject({ ok: true, salt: text });
      expect(analyzeByParsing(body)).toMatchObject({ ok: true, salt: text });
      expect(scanned(body, QUARTERED)).toEqual(reference(body, QUARTERED));
    }
  });

  it("says where the syntax broke", () => {
    expect(scanRequestBody(utf8('{"model":"m",}'))).toEqual({
      ok: false,
      reason: "invalid_json",
      message: "request body is not valid JSON: Unexpected token } in JSON at position 13",
    });
  });

  it("returns the prompt as spans into the body, not as decoded strings", () => {
    const text = "x".repeat(300_000);
    const b = utf8(JSON.stringify({ model: "m", messages: [{ role: "user", content: text }] }));
    const r = scanRequestBody(b);
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    const span = r.pieces.find((p) => typeof p !== "string" && p.bytes === text.length);
    expect(span).toMatchObject({ escaped: false, bytes: 300_000 });
    expect(r.promptBytes).toBe("user\n".length + text.length + 1);
  });
});
