/**
 * A validating JSON scanner over request body bytes that extracts what the router needs
 * (model, stream, max tokens, the prompt's text pieces) without building the document or
 * decoding the prompt into a string.
 *
 * Why not `JSON.parse`: a large prompt becomes one large string, twice (the decoded body, then
 * the content value). V8 puts every string over ~128 KiB in its large-object space, a fresh
 * mapping each time; on the 2-core VMs this project runs on, that costs ~5 µs per KiB (1 ms per
 * 200 KB string, measured: `bench/router/scan.ts`), more than parsing itself. Here the prompt
 * stays bytes: string values come back as spans into the body, hashed in place.
 *
 * Semantics are those of {@link extractRequestFeatures} (`features.ts`), which stays the
 * reference: the same bodies are accepted (strict RFC 8259, a leading UTF-8 BOM skipped, any
 * bytes ≥ 0x20 inside strings as `TextDecoder` would replace them), duplicate keys resolve to
 * the last one, and the prompt pieces decode to the same text. `json-scan.test.ts` checks both
 * against each other on generated bodies. One difference: invalid UTF-8 inside a prompt string
 * is counted and hashed as its raw bytes (the reference sees U+FFFD).
 */
import { ISOLATED_SALT_PREFIX } from "./cache-isolation.js";
import {
  choiceCount,
  completionTokenLimit,
  type FeatureErrorReason,
  HINT_FIELDS,
  hintOf,
  isCacheSalt,
  MAX_CACHE_SALT_LENGTH,
  MAX_HINT_LENGTH,
  MAX_MODEL_LENGTH,
  REFUSED,
  type RequestHint,
  type StreamUsage,
} from "./features.js";

/** A JSON string value inside the body: the bytes between its quotes. */
export interface StringSpan {
  /** First byte after the opening quote. */
  readonly start: number;
  /** The closing quote. */
  readonly end: number;
  /** Whether the raw bytes contain escapes (then they must be decoded before use). */
  readonly escaped: boolean;
  /** Length in bytes of the decoded value as UTF-8 (lone surrogates count 3, as U+FFFD). */
  readonly bytes: number;
}

/** One piece of the prompt text: a literal, or a string value of the body. */
export type PromptPiece = string | StringSpan;

/** Result of {@link scanRequestBody}. */
export type ScanResult =
  | {
      readonly ok: true;
      readonly model: string;
      readonly stream: boolean;
      readonly streamUsage: StreamUsage;
      readonly maxTokens?: number;
      /** The larger of `n` and `best_of` when more than one (`RequestFeatures.choices`). */
      readonly choices?: number;
      /** In order; their concatenation is `RequestFeatures.promptText`. */
      readonly pieces: readonly PromptPiece[];
      /** Total UTF-8 bytes of the pieces. */
      readonly promptBytes: number;
      /** `RequestFeatures.hint`. */
      readonly hint?: RequestHint;
      /** `RequestFeatures.cacheSalt`. */
      readonly cacheSalt?: string;
    }
  | {
      readonly ok: false;
      readonly reason: FeatureErrorReason;
      readonly message: string;
      readonly param?: string;
    };

class SyntaxFailure {
  constructor(
    readonly message: string,
    readonly at: number,
  ) {}
}

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN_OBJECT = 0x7b;
const CLOSE_OBJECT = 0x7d;
const OPEN_ARRAY = 0x5b;
const CLOSE_ARRAY = 0x5d;
const COMMA = 0x2c;
const COLON = 0x3a;

/** Known keys, as bytes; compared against unescaped key spans. */
const KEY = {
  model: bytesOf("model"),
  stream: bytesOf("stream"),
  max_tokens: bytesOf("max_tokens"),
  max_completion_tokens: bytesOf("max_completion_tokens"),
  n: bytesOf("n"),
  best_of: bytesOf("best_of"),
  messages: bytesOf("messages"),
  prompt: bytesOf("prompt"),
  input: bytesOf("input"),
  role: bytesOf("role"),
  content: bytesOf("content"),
  text: bytesOf("text"),
  prompt_cache_key: bytesOf("prompt_cache_key"),
  safety_identifier: bytesOf("safety_identifier"),
  user: bytesOf("user"),
  cache_salt: bytesOf("cache_salt"),
  stream_options: bytesOf("stream_options"),
  include_usage: bytesOf("include_usage"),
} as const;
type KeyName = keyof typeof KEY;

/** A hint field's index in {@link HINT_FIELDS}. */
const HINT_INDEX: Readonly<Record<string, number | undefined>> = Object.fromEntries(
  HINT_FIELDS.map((field, i) => [field, i]),
);

function bytesOf(s: string): Uint8Array {
  return new TextEncoder().encode(s);
}

const utf8 = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });

/** The kind of a scanned scalar or container, for fields whose type matters. */
enum Kind {
  Absent,
  Null,
  True,
  False,
  Number,
  String,
  Array,
  Object,
}

/** An `input`/`prompt` value, kept until the end (`prompt ?? input` needs both). */
type InputValue =
  | { readonly kind: Kind.String; readonly span: StringSpan }
  | { readonly kind: Kind.Array; readonly items: readonly PromptPiece[]; readonly numeric: boolean }
  | { readonly kind: Exclude<Kind, Kind.String | Kind.Array> };

class Scanner {
  /** Out-values of {@link str}. */
  private sEscaped = false;
  private sBytes = 0;
  private numStart = 0;
  /** The kind of the last value {@link value} walked. */
  kind: Kind = Kind.Absent;
  /** Position after the last structure walked by a helper that returns something else. */
  lastEnd = 0;

  constructor(
    private readonly b: Uint8Array,
    private readonly n: number,
  ) {}

  fail(message: string, at: number): never {
    throw new SyntaxFailure(message, at);
  }

  unexpected(at: number): never {
    if (at >= this.n) this.fail("Unexpected end of JSON input", at);
    const c = this.b[at] as number;
    const shown =
      c >= 0x20 && c < 0x7f ? `token ${String.fromCharCode(c)}` : `byte 0x${c.toString(16)}`;
    this.fail(`Unexpected ${shown} in JSON at position ${at}`, at);
  }

  ws(p: number): number {
    const b = this.b;
    const n = this.n;
    while (p < n) {
      const c = b[p] as number;
      if (c !== 0x20 && c !== 0x0a && c !== 0x0d && c !== 0x09) break;
      p++;
    }
    return p;
  }

  expect(p: number, c: number): number {
    if (this.b[p] !== c) this.unexpected(p);
    return p + 1;
  }

  /** `p` at an opening quote; returns the position after the closing one. */
  str(p: number): number {
    const b = this.b;
    const n = this.n;
    let i = p + 1;
    let bytes = 0;
    let escaped = false;
    for (;;) {
      if (i >= n) this.fail("Unterminated string in JSON", i);
      const c = b[i] as number;
      if (c === QUOTE) break;
      if (c === BACKSLASH) {
        escaped = true;
        const e = b[i + 1];
        if (e === 0x75 /* u */) {
          const unit = this.hex4(i + 2);
          if (unit >= 0xd800 && unit <= 0xdbff && b[i + 6] === BACKSLASH && b[i + 7] === 0x75) {
            const low = this.hex4(i + 8);
            if (low >= 0xdc00 && low <= 0xdfff) {
              bytes += 4;
              i += 12;
              continue;
            }
          }
          bytes += unit < 0x80 ? 1 : unit < 0x800 ? 2 : 3;
          i += 6;
          continue;
        }
        if (
          e === QUOTE ||
          e === BACKSLASH ||
          e === 0x2f ||
          e === 0x62 ||
          e === 0x66 ||
          e === 0x6e ||
          e === 0x72 ||
          e === 0x74
        ) {
          bytes += 1;
          i += 2;
          continue;
        }
        if (i + 1 >= n) this.fail("Unterminated string in JSON", i + 1);
        this.fail(`Bad escaped character in JSON at position ${i + 1}`, i + 1);
      }
      if (c < 0x20)
        this.fail(`Bad control character in string literal in JSON at position ${i}`, i);
      bytes++;
      i++;
    }
    this.sEscaped = escaped;
    this.sBytes = bytes;
    return i + 1;
  }

  hex4(p: number): number {
    let v = 0;
    for (let k = 0; k < 4; k++) {
      const c = this.b[p + k];
      let d: number;
      if (c === undefined || p + k >= this.n) this.fail("Unterminated string in JSON", p + k);
      if (c >= 0x30 && c <= 0x39) d = c - 0x30;
      else if (c >= 0x61 && c <= 0x66) d = c - 0x57;
      else if (c >= 0x41 && c <= 0x46) d = c - 0x37;
      else this.fail(`Bad Unicode escape in JSON at position ${p + k}`, p + k);
      v = (v << 4) | d;
    }
    return v;
  }

  span(p: number, after: number): StringSpan {
    return { start: p + 1, end: after - 1, escaped: this.sEscaped, bytes: this.sBytes };
  }

  /** `p` at a number's first byte; returns the position after it. */
  num(p: number): number {
    const b = this.b;
    let i = p;
    if (b[i] === 0x2d) i++;
    if (b[i] === 0x30) i++;
    else if (isDigit(b[i])) while (isDigit(b[i])) i++;
    else this.unexpected(i);
    if (b[i] === 0x2e) {
      i++;
      if (!isDigit(b[i])) this.unexpected(i);
      while (isDigit(b[i])) i++;
    }
    if (b[i] === 0x65 || b[i] === 0x45) {
      i++;
      if (b[i] === 0x2b || b[i] === 0x2d) i++;
      if (!isDigit(b[i])) this.unexpected(i);
      while (isDigit(b[i])) i++;
    }
    this.numStart = p;
    return i;
  }

  numberValue(end: number): number {
    return Number(latin1(this.b, this.numStart, end));
  }

  literal(p: number, word: string): number {
    for (let k = 0; k < word.length; k++) {
      if (this.b[p + k] !== word.charCodeAt(k)) this.unexpected(p + k);
    }
    return p + word.length;
  }

  /**
   * Skips any value at `p` (whitespace already skipped), validating it; iterative, so nesting
   * depth is bounded by memory, as in `JSON.parse`. Sets {@link kind}.
   */
  value(p: number): number {
    const b = this.b;
    const c = b[p];
    if (c === QUOTE) {
      this.kind = Kind.String;
      return this.str(p);
    }
    if (c === OPEN_OBJECT || c === OPEN_ARRAY) {
      this.kind = c === OPEN_OBJECT ? Kind.Object : Kind.Array;
      return this.skipContainer(p);
    }
    if (c === 0x74) {
      this.kind = Kind.True;
      return this.literal(p, "true");
    }
    if (c === 0x66) {
      this.kind = Kind.False;
      return this.literal(p, "false");
    }
    if (c === 0x6e) {
      this.kind = Kind.Null;
      return this.literal(p, "null");
    }
    this.kind = Kind.Number;
    return this.num(p);
  }

  skipContainer(p: number): number {
    const b = this.b;
    // true = object, false = array.
    const stack: boolean[] = [];
    let i = p;
    for (;;) {
      // At the start of a value.
      const c = b[i];
      if (c === OPEN_OBJECT) {
        stack.push(true);
        i = this.ws(i + 1);
        if (b[i] === CLOSE_OBJECT) {
          stack.pop();
          i++;
        } else {
          i = this.memberKey(i);
          continue;
        }
      } else if (c === OPEN_ARRAY) {
        stack.push(false);
        i = this.ws(i + 1);
        if (b[i] === CLOSE_ARRAY) {
          stack.pop();
          i++;
        } else continue;
      } else if (c === QUOTE) i = this.str(i);
      else if (c === 0x74) i = this.literal(i, "true");
      else if (c === 0x66) i = this.literal(i, "false");
      else if (c === 0x6e) i = this.literal(i, "null");
      else i = this.num(i);
      // After a value: close containers or move to the next element.
      for (;;) {
        if (stack.length === 0) return i;
        i = this.ws(i);
        const d = b[i];
        const inObject = stack[stack.length - 1] === true;
        if (d === COMMA) {
          i = this.ws(i + 1);
          if (inObject) i = this.memberKey(i);
          break;
        }
        if (d === (inObject ? CLOSE_OBJECT : CLOSE_ARRAY)) {
          stack.pop();
          i++;
          continue;
        }
        this.unexpected(i);
      }
    }
  }

  /** `p` at a member's key; returns the position of its value (past the colon). */
  memberKey(p: number): number {
    if (this.b[p] !== QUOTE) this.unexpected(p);
    const after = this.str(p);
    return this.ws(this.expect(this.ws(after), COLON));
  }

  /**
   * Walks the members of the object at `p` (`{`), calling `onMember(key, valueAt)`, which must
   * return the position after the value. Returns the position after `}`.
   */
  members(p: number, onMember: (key: KeyName | undefined, at: number) => number): number {
    const b = this.b;
    let i = this.ws(p + 1);
    if (b[i] === CLOSE_OBJECT) return i + 1;
    for (;;) {
      if (b[i] !== QUOTE) this.unexpected(i);
      const after = this.str(i);
      const key = this.keyName(i + 1, after - 1);
      i = this.ws(this.expect(this.ws(after), COLON));
      i = this.ws(onMember(key, i));
      if (b[i] === COMMA) {
        i = this.ws(i + 1);
        continue;
      }
      return this.expect(i, CLOSE_OBJECT);
    }
  }

  /** Walks the elements of the array at `p` (`[`), like {@link members}. */
  elements(p: number, onElement: (at: number) => number): number {
    const b = this.b;
    let i = this.ws(p + 1);
    if (b[i] === CLOSE_ARRAY) return i + 1;
    for (;;) {
      i = this.ws(onElement(i));
      if (b[i] === COMMA) {
        i = this.ws(i + 1);
        continue;
      }
      return this.expect(i, CLOSE_ARRAY);
    }
  }

  keyName(start: number, end: number): KeyName | undefined {
    const b = this.b;
    if (this.sEscaped) {
      // Rare: an escaped key (`"mod\u0065l"`) decodes to compare.
      const key = JSON.parse(`"${utf8.decode(b.slice(start, end))}"`) as string;
      return Object.hasOwn(KEY, key) ? (key as KeyName) : undefined;
    }
    const length = end - start;
    for (const name in KEY) {
      const k = KEY[name as KeyName];
      if (k.length !== length) continue;
      let same = true;
      for (let j = 0; j < length; j++) {
        if (b[start + j] !== k[j]) {
          same = false;
          break;
        }
      }
      if (same) return name as KeyName;
    }
    return undefined;
  }

  /** Decodes a (small) string value to a JS string. */
  text(span: StringSpan): string {
    // A copy: TextDecoder refuses views of shared memory (the worker scans pooled shared bodies).
    const raw = utf8.decode(this.b.slice(span.start, span.end));
    return span.escaped ? (JSON.parse(`"${raw}"`) as string) : raw;
  }

  // ---- The request's own structure -------------------------------------------------------

  /**
   * `messages` array: each object message becomes `role\n`, its content pieces, `\n`. Sets
   * {@link lastEnd}.
   */
  messages(p: number): PromptPiece[] {
    const pieces: PromptPiece[] = [];
    this.lastEnd = this.elements(p, (at) => {
      if (this.b[at] === OPEN_ARRAY) {
        // An array is an object without `role`/`content`.
        pieces.push("", "\n", "\n");
        return this.value(at);
      }
      if (this.b[at] !== OPEN_OBJECT) return this.value(at);
      let role: PromptPiece = "";
      let content: PromptPiece[] = [];
      const end = this.members(at, (key, v) => {
        if (key === "role") {
          const after = this.value(v);
          role = this.kind === Kind.String ? this.span(v, after) : "";
          return after;
        }
        if (key === "content") {
          if (this.b[v] === OPEN_ARRAY) {
            content = this.contentParts(v);
            return this.lastEnd;
          }
          const after = this.value(v);
          content = this.kind === Kind.String ? [this.span(v, after)] : [];
          return after;
        }
        return this.value(v);
      });
      pieces.push(role, "\n");
      for (const piece of content) pieces.push(piece);
      pieces.push("\n");
      return end;
    });
    return pieces;
  }

  /** A content array: the `text` string of each object part. Sets {@link lastEnd}. */
  contentParts(p: number): PromptPiece[] {
    const parts: PromptPiece[] = [];
    this.lastEnd = this.elements(p, (at) => {
      if (this.b[at] !== OPEN_OBJECT) return this.value(at);
      let text: StringSpan | undefined;
      const end = this.members(at, (key, v) => {
        const after = this.value(v);
        if (key === "text") text = this.kind === Kind.String ? this.span(v, after) : undefined;
        return after;
      });
      if (text !== undefined) parts.push(text);
      return end;
    });
    return parts;
  }

  /** A `prompt`/`input` value. Sets {@link lastEnd}. */
  input(p: number): InputValue {
    const b = this.b;
    if (b[p] !== OPEN_ARRAY) {
      const after = this.value(p);
      this.lastEnd = after;
      const kind = this.kind;
      if (kind === Kind.String) return { kind, span: this.span(p, after) };
      return { kind: kind as Exclude<Kind, Kind.String | Kind.Array> };
    }
    const items: PromptPiece[] = [];
    let first = true;
    let numeric = false;
    this.lastEnd = this.elements(p, (at) => {
      const c = b[at];
      if (c === OPEN_ARRAY) {
        // Token ids: the numbers inside, joined by commas (other entries ignored).
        const ids: string[] = [];
        const end = this.elements(at, (v) => {
          const after = this.value(v);
          if (this.kind === Kind.Number) ids.push(String(this.numberValue(after)));
          return after;
        });
        if (first) numeric = false;
        first = false;
        items.push(ids.join(","));
        return end;
      }
      const after = this.value(at);
      if (first) numeric = this.kind === Kind.Number;
      first = false;
      if (this.kind === Kind.String) items.push(this.span(at, after));
      else if (this.kind === Kind.Number) items.push(String(this.numberValue(after)));
      return after;
    });
    return { kind: Kind.Array, items, numeric };
  }
}

function isDigit(c: number | undefined): boolean {
  return c !== undefined && c >= 0x30 && c <= 0x39;
}

function latin1(b: Uint8Array, start: number, end: number): string {
  let s = "";
  for (let i = start; i < end; i++) s += String.fromCharCode(b[i] as number);
  return s;
}

function inputPieces(value: InputValue): PromptPiece[] {
  if (value.kind === Kind.String) return [value.span];
  if (value.kind !== Kind.Array) return [""];
  const out: PromptPiece[] = [];
  const separator = value.numeric ? "," : "\n";
  value.items.forEach((item, i) => {
    if (i > 0) out.push(separator);
    out.push(item);
  });
  return out;
}

/**
 * Scans a request body. Never throws, whatever the bytes. The returned spans point into
 * `body`, which must stay unchanged while they are used.
 */
export function scanRequestBody(body: Uint8Array): ScanResult {
  const n = body.length;
  const s = new Scanner(body, n);
  let model: StringSpan | undefined;
  let streamKind = Kind.Absent as Kind;
  let streamUsage: StreamUsage = "absent";
  // NaN unless a number: NaN is no positive integer to `completionTokenLimit`.
  let maxTokens = Number.NaN;
  let maxCompletion = Number.NaN;
  let choicesN = Number.NaN;
  let bestOf = Number.NaN;
  let messages: PromptPiece[] | undefined;
  let prompt: InputValue = { kind: Kind.Absent };
  let input: InputValue = { kind: Kind.Absent };
  /** The hint fields' values, in {@link HINT_FIELDS} order (a span, or its kind when not a string). */
  const hints: (StringSpan | Kind)[] = [Kind.Absent, Kind.Absent, Kind.Absent];
  let salt = Kind.Absent as StringSpan | Kind;
  try {
    // TextDecoder (what the reference decodes with) drops a leading BOM.
    let p = n >= 3 && body[0] === 0xef && body[1] === 0xbb && body[2] === 0xbf ? 3 : 0;
    p = s.ws(p);
    if (p >= n) s.unexpected(p);
    if (body[p] !== OPEN_OBJECT) {
      p = s.ws(s.value(p));
      if (p < n) s.unexpected(p);
      return REFUSED.notAnObject;
    }
    p = s.members(p, (key, v) => {
      switch (key) {
        case "messages":
          if (body[v] === OPEN_ARRAY) {
            messages = s.messages(v);
            return s.lastEnd;
          }
          messages = undefined;
          return s.value(v);
        case "stream_options": {
          if (body[v] !== OPEN_OBJECT) {
            const after = s.value(v);
            streamUsage = s.kind === Kind.Null ? "absent" : "other";
            return after;
          }
          // The last `include_usage` decides, as JSON.parse keeps the last of a repeated key.
          let asked = false;
          const end = s.members(v, (member, m) => {
            const after = s.value(m);
            if (member === "include_usage") asked = s.kind === Kind.True;
            return after;
          });
          streamUsage = asked ? "asked" : "other";
          return end;
        }
        case "prompt":
        case "input": {
          const value = s.input(v);
          if (key === "prompt") prompt = value;
          else input = value;
          return s.lastEnd;
        }
        default: {
          const after = s.value(v);
          const kind = s.kind;
          if (key === "model") {
            model = kind === Kind.String ? s.span(v, after) : undefined;
          } else if (key === "stream") streamKind = kind;
          else if (key === "max_tokens") {
            maxTokens = kind === Kind.Number ? s.numberValue(after) : Number.NaN;
          } else if (key === "max_completion_tokens") {
            maxCompletion = kind === Kind.Number ? s.numberValue(after) : Number.NaN;
          } else if (key === "n") {
            choicesN = kind === Kind.Number ? s.numberValue(after) : Number.NaN;
          } else if (key === "best_of") {
            bestOf = kind === Kind.Number ? s.numberValue(after) : Number.NaN;
          } else if (key === "cache_salt") {
            salt = kind === Kind.String ? s.span(v, after) : kind;
          } else {
            const h = key === undefined ? undefined : HINT_INDEX[key];
            if (h !== undefined) hints[h] = kind === Kind.String ? s.span(v, after) : kind;
          }
          return after;
        }
      }
    });
    p = s.ws(p);
    if (p < n) s.unexpected(p);
  } catch (error) {
    if (!(error instanceof SyntaxFailure)) throw error;
    return {
      ok: false,
      reason: "invalid_json",
      message: `request body is not valid JSON: ${error.message}`,
    };
  }
  // UTF-16 length ≥ raw bytes ÷ 6 (`\uXXXX`), so a long raw span is too long without decoding.
  const modelText =
    model !== undefined && model.end - model.start <= 6 * MAX_MODEL_LENGTH
      ? s.text(model)
      : undefined;
  if (modelText === undefined || modelText.length === 0 || modelText.length > MAX_MODEL_LENGTH) {
    return REFUSED.model;
  }
  if (
    streamKind !== Kind.Absent &&
    streamKind !== Kind.Null &&
    streamKind !== Kind.True &&
    streamKind !== Kind.False
  ) {
    return REFUSED.stream;
  }
  const hintValues: (string | undefined)[] = [];
  for (let i = 0; i < hints.length; i++) {
    const h = hints[i] as StringSpan | Kind;
    if (typeof h === "object") {
      // At most 6 raw bytes per UTF-16 unit: a longer span is cut before decoding.
      const span =
        h.end - h.start > 6 * MAX_HINT_LENGTH && !h.escaped
          ? { ...h, end: h.start + 6 * MAX_HINT_LENGTH }
          : h;
      hintValues.push(s.text(span));
    } else if (h === Kind.Absent || h === Kind.Null) hintValues.push(undefined);
    else return REFUSED[HINT_FIELDS[i] as (typeof HINT_FIELDS)[number]];
  }
  const hint = hintOf(hintValues);
  let cacheSalt: string | undefined;
  if (typeof salt === "object") {
    // As for `model`: a raw span over 6 bytes per allowed unit is too long without decoding.
    const text = salt.end - salt.start <= 6 * MAX_CACHE_SALT_LENGTH ? s.text(salt) : undefined;
    if (!isCacheSalt(text)) return REFUSED.cacheSalt;
    if (text.startsWith(ISOLATED_SALT_PREFIX)) return REFUSED.cacheSaltReserved;
    cacheSalt = text;
  } else if (salt !== Kind.Absent && salt !== Kind.Null) return REFUSED.cacheSalt;
  const pieces: PromptPiece[] =
    messages ??
    inputPieces(prompt.kind === Kind.Absent || prompt.kind === Kind.Null ? input : prompt);
  let promptBytes = 0;
  for (const piece of pieces) {
    promptBytes += typeof piece === "string" ? Buffer.byteLength(piece) : piece.bytes;
  }
  const result = {
    ok: true as const,
    model: modelText,
    stream: streamKind === Kind.True,
    streamUsage,
    pieces,
    promptBytes,
    ...(hint === undefined ? {} : { hint }),
    ...(cacheSalt === undefined ? {} : { cacheSalt }),
  };
  const limit = completionTokenLimit(maxTokens, maxCompletion);
  const choices = choiceCount(choicesN, bestOf);
  if (limit === undefined && choices === undefined) return result;
  return {
    ...result,
    ...(limit === undefined ? {} : { maxTokens: limit }),
    ...(choices === undefined ? {} : { choices }),
  };
}
