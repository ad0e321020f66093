/**
 * Request feature extraction with `JSON.parse`: the reference semantics of what the router
 * reads from a body. The request path uses `json-scan.ts` (same results straight from the
 * bytes, tested against this on generated bodies); this stays the public
 * `extractRequestFeatures` and that test's oracle. Never throws, whatever the bytes
 * (property-tested): malformed input comes back as a `{ ok: false }` result.
 */
import { ISOLATED_SALT_PREFIX } from "./cache-isolation.js";

/** What the router needs to know about an OpenAI request body. */
export interface RequestFeatures {
  /** The `model` field. */
  readonly model: string;
  /** The `stream` field (false when absent). */
  readonly stream: boolean;
  /** What the request says of `stream_options.include_usage` (see {@link StreamUsage}). */
  readonly streamUsage: StreamUsage;
  /**
   * The text a prefix cache would see: for chat, each message as `role\ncontent\n` (text parts
   * of array contents joined); for completions/embeddings the prompt/input strings joined by
   * `\n` (token-id arrays as comma-joined numbers). Used only for hashing and token estimates.
   */
  readonly promptText: string;
  /**
   * The output limit an engine may honour: the larger of `max_tokens` and
   * `max_completion_tokens` that is a positive integer (see {@link completionTokenLimit}).
   */
  readonly maxTokens?: number;
  /**
   * Completions the engine generates, when more than one: the larger of `n` and `best_of`
   * that is a positive integer (see {@link choiceCount}); absent for one.
   */
  readonly choices?: number;
  /**
   * Token estimate reserved against per-key `tpm` limits at admission: prompt UTF-8 bytes ÷ 4
   * (rounded up) plus `maxTokens` (or {@link DEFAULT_COMPLETION_TOKEN_ESTIMATE} when absent)
   * for each of the `choices`. The router settles it against the answer's real `usage` once
   * known.
   */
  readonly estimatedTokens: number;
  /**
   * The request's own cache-affinity hint, when it gives one: `prompt_cache_key`, else
   * `safety_identifier`, else `user` (see {@link HINT_FIELDS}); an empty string is none.
   */
  readonly hint?: RequestHint;
  /**
   * vLLM's `cache_salt`, when given (`null` is none): the engine shares prefix-cache blocks only
   * among requests with the same salt, never with unsalted ones, so the router keys the prompt's
   * prefix under it too (see `promptKeys`).
   */
  readonly cacheSalt?: string;
}

/**
 * `stream_options` as the router reads it: `absent` (no `stream_options`, or `null`): the router
 * may add `{"include_usage":true}` and take the usage event out of the stream again; `asked`
 * (`include_usage: true`): the client gets the usage event, and so does the router; `other`
 * (any other `stream_options`): left alone, and a stream is charged an estimate.
 */
export type StreamUsage = "absent" | "asked" | "other";

/** {@link StreamUsage} of a `stream_options` value. */
export function streamUsageOf(options: unknown): StreamUsage {
  if (options === undefined || options === null) return "absent";
  if (typeof options === "object" && !Array.isArray(options)) {
    return (options as Record<string, unknown>).include_usage === true ? "asked" : "other";
  }
  return "other";
}

/** A body field that names what a request belongs with, strongest first. */
export const HINT_FIELDS = ["prompt_cache_key", "safety_identifier", "user"] as const;

/** Where a {@link RequestHint} came from: a body field, or the router's session header. */
export type HintSource = (typeof HINT_FIELDS)[number] | "header";

/** An affinity hint: requests with equal values belong on the same replica while it has room. */
export interface RequestHint {
  readonly source: HintSource;
  readonly value: string;
}

/** Longest hint value used, in UTF-16 code units; a longer one is cut (it still groups alike). */
export const MAX_HINT_LENGTH = 256;

/**
 * Longest `cache_salt` accepted, in UTF-16 code units. A longer one is refused, not cut as a hint
 * is: two salts cut to one would share keys their engine never shares.
 */
export const MAX_CACHE_SALT_LENGTH = 1024;

/** Why a body was refused. */
export type FeatureErrorReason =
  | "invalid_json"
  | "not_an_object"
  | "invalid_model"
  | "invalid_field";

/** Result of {@link extractRequestFeatures}. */
export type FeatureResult =
  | { readonly ok: true; readonly features: RequestFeatures }
  | {
      readonly ok: false;
      readonly reason: FeatureErrorReason;
      readonly message: string;
      /** The offending request field, when one is to blame (OpenAI's `param`). */
      readonly param?: string;
    };

/** Longest `model` accepted, in UTF-16 code units. */
export const MAX_MODEL_LENGTH = 256;

/** The refusals both readers of a body (this one and `json-scan.ts`) give, word for word. */
export const REFUSED = {
  notAnObject: {
    ok: false,
    reason: "not_an_object",
    message: "request body must be a JSON object",
  },
  model: {
    ok: false,
    reason: "invalid_model",
    message: `\`model\` must be a non-empty string of at most ${MAX_MODEL_LENGTH} characters`,
    param: "model",
  },
  stream: {
    ok: false,
    reason: "invalid_field",
    message: "`stream` must be a boolean",
    param: "stream",
  },
  ...hintRefusals(),
  cacheSalt: {
    ok: false,
    reason: "invalid_field",
    message: `\`cache_salt\` must be a non-empty string of at most ${MAX_CACHE_SALT_LENGTH} characters`,
    param: "cache_salt",
  },
  cacheSaltReserved: {
    ok: false,
    reason: "invalid_field",
    message: `\`cache_salt\` must not start with \`${ISOLATED_SALT_PREFIX}\`: routers that keep tenants' caches apart set salts of that form`,
    param: "cache_salt",
  },
} as const satisfies Record<string, FeatureResult>;

function hintRefusals(): Record<
  (typeof HINT_FIELDS)[number],
  { ok: false; reason: "invalid_field"; message: string; param: string }
> {
  const out = {} as Record<
    (typeof HINT_FIELDS)[number],
    { ok: false; reason: "invalid_field"; message: string; param: string }
  >;
  for (const field of HINT_FIELDS) {
    out[field] = {
      ok: false,
      reason: "invalid_field",
      message: `\`${field}\` must be a string`,
      param: field,
    };
  }
  return out;
}

/** The hint of a body whose hint fields hold these values (strings, or absent/null). */
export function hintOf(values: readonly (string | undefined)[]): RequestHint | undefined {
  for (let i = 0; i < HINT_FIELDS.length; i++) {
    const value = values[i];
    if (value !== undefined && value.length > 0) {
      return {
        source: HINT_FIELDS[i] as HintSource,
        value: value.length > MAX_HINT_LENGTH ? value.slice(0, MAX_HINT_LENGTH) : value,
      };
    }
  }
  return undefined;
}

/**
 * Completion tokens reserved for the `tpm` estimate when the request sets no output limit; the
 * engine's real count replaces it once the answer reports `usage`.
 */
export const DEFAULT_COMPLETION_TOKEN_ESTIMATE = 256;

/**
 * The output limit to charge for a request that may set `max_tokens`, `max_completion_tokens`
 * or both: the larger of those that are positive safe integers, `undefined` when neither is.
 * Engines disagree on which one wins (vLLM and SGLang take `max_completion_tokens` over the
 * deprecated `max_tokens`; older servers know only `max_tokens`), so charging either one alone
 * lets a client set the charged one small and the honoured one large.
 */
export function completionTokenLimit(
  maxTokens: unknown,
  maxCompletionTokens: unknown,
): number | undefined {
  const a = positiveInteger(maxTokens);
  const b = positiveInteger(maxCompletionTokens);
  if (a === undefined) return b;
  return b === undefined || a >= b ? a : b;
}

/**
 * Completions a request makes the engine generate: the larger of `n` (choices returned) and
 * `best_of` (candidates generated, of which `n` are returned) that is a positive safe integer,
 * `undefined` for one (or neither set). Each is charged its own output limit.
 */
export function choiceCount(n: unknown, bestOf: unknown): number | undefined {
  const count = completionTokenLimit(n, bestOf);
  return count === undefined || count === 1 ? undefined : count;
}

/**
 * The tokens to reserve for a request: its prompt estimate plus the output limit (or the
 * default) for each choice.
 */
export function reservedTokens(
  promptBytes: number,
  maxTokens: number | undefined,
  choices: number | undefined,
): number {
  return (
    Math.ceil(promptBytes / 4) + (maxTokens ?? DEFAULT_COMPLETION_TOKEN_ESTIMATE) * (choices ?? 1)
  );
}

function positiveInteger(value: unknown): number | undefined {
  return typeof value === "number" && Number.isSafeInteger(value) && value > 0 ? value : undefined;
}

const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: false });

/** Parses a request body (UTF-8 bytes or text) once and extracts its {@link RequestFeatures}. */
export function extractRequestFeatures(body: Uint8Array | string): FeatureResult {
  return extractRequestFeaturesAndPieces(body).result;
}

const NO_PIECES: readonly string[] = [];

/**
 * {@link extractRequestFeatures}, plus the prompt text as the pieces it is made of (their
 * concatenation is `promptText`). Package-internal (the scanner's test oracle): hashing the pieces instead of `promptText`
 * never flattens a large prompt into one fresh string (for a 200 KB prompt that copy and the
 * garbage it leaves cost more than the hashing itself).
 */
export function extractRequestFeaturesAndPieces(body: Uint8Array | string): {
  readonly result: FeatureResult;
  readonly pieces: readonly string[];
} {
  const pieces: string[] = [];
  const result = extract(body, pieces);
  return { result, pieces: result.ok ? pieces : NO_PIECES };
}

function extract(body: Uint8Array | string, pieces: string[]): FeatureResult {
  let parsed: unknown;
  try {
    parsed = JSON.parse(typeof body === "string" ? body : decoder.decode(body));
  } catch (error) {
    return {
      ok: false,
      reason: "invalid_json",
      message: `request body is not valid JSON: ${error instanceof Error ? error.message : String(error)}`,
    };
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
    return REFUSED.notAnObject;
  }
  const obj = parsed as Record<string, unknown>;
  const model = obj.model;
  if (typeof model !== "string" || model.length === 0 || model.length > MAX_MODEL_LENGTH) {
    return REFUSED.model;
  }
  const stream = obj.stream;
  if (stream !== undefined && stream !== null && typeof stream !== "boolean") {
    return REFUSED.stream;
  }
  const hintValues: (string | undefined)[] = [];
  for (const field of HINT_FIELDS) {
    const v = obj[field];
    if (v !== undefined && v !== null && typeof v !== "string") return REFUSED[field];
    hintValues.push(v ?? undefined);
  }
  const hint = hintOf(hintValues);
  let cacheSalt: string | undefined;
  const salt = obj.cache_salt;
  if (salt !== undefined && salt !== null) {
    if (!isCacheSalt(salt)) return REFUSED.cacheSalt;
    if (salt.startsWith(ISOLATED_SALT_PREFIX)) return REFUSED.cacheSaltReserved;
    cacheSalt = salt;
  }
  promptPiecesOf(obj, pieces);
  let promptText = "";
  let promptBytes = 0;
  for (const piece of pieces) {
    promptText += piece;
    // Piece by piece, as they are hashed (differs from the joined text only where two pieces
    // end and start with the halves of one surrogate pair).
    promptBytes += Buffer.byteLength(piece);
  }
  const maxTokens = completionTokenLimit(obj.max_tokens, obj.max_completion_tokens);
  const choices = choiceCount(obj.n, obj.best_of);
  const estimatedTokens = reservedTokens(promptBytes, maxTokens, choices);
  const features: RequestFeatures = {
    model,
    stream: stream === true,
    streamUsage: streamUsageOf(obj.stream_options),
    promptText,
    ...(maxTokens === undefined ? {} : { maxTokens }),
    ...(choices === undefined ? {} : { choices }),
    estimatedTokens,
    ...(hint === undefined ? {} : { hint }),
    ...(cacheSalt === undefined ? {} : { cacheSalt }),
  };
  return { ok: true, features };
}

/** Whether `value` is a `cache_salt` the router accepts (vLLM's rule, plus a length bound). */
export function isCacheSalt(value: unknown): value is string {
  return typeof value === "string" && value.length > 0 && value.length <= MAX_CACHE_SALT_LENGTH;
}

/** Appends the prompt's pieces (see {@link RequestFeatures.promptText}) to `pieces`. */
function promptPiecesOf(obj: Record<string, unknown>, pieces: string[]): void {
  const messages = obj.messages;
  if (Array.isArray(messages)) {
    for (const message of messages) {
      if (typeof message !== "object" || message === null) continue;
      const m = message as Record<string, unknown>;
      pieces.push(typeof m.role === "string" ? m.role : "", "\n");
      contentPieces(m.content, pieces);
      pieces.push("\n");
    }
    return;
  }
  pieces.push(inputText(obj.prompt ?? obj.input));
}

function contentPieces(content: unknown, pieces: string[]): void {
  if (typeof content === "string") {
    pieces.push(content);
    return;
  }
  if (!Array.isArray(content)) return;
  for (const part of content) {
    if (typeof part === "object" && part !== null) {
      const t = (part as Record<string, unknown>).text;
      if (typeof t === "string") pieces.push(t);
    }
  }
}

function inputText(input: unknown): string {
  if (typeof input === "string") return input;
  if (!Array.isArray(input)) return "";
  const parts: string[] = [];
  for (const item of input) {
    if (typeof item === "string") parts.push(item);
    else if (typeof item === "number") parts.push(String(item));
    else if (Array.isArray(item)) parts.push(item.filter((t) => typeof t === "number").join(","));
  }
  return parts.join(typeof input[0] === "number" ? "," : "\n");
}
