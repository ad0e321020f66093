/**
 * Reading an engine's `usage` counts from the end of its answer, without parsing the answer:
 * a JSON answer puts `usage` after `choices`, and a stream that reports it does so in its last
 * data event. What is read here comes from an engine, so every count is checked, and a count
 * that is not a plain non-negative integer reads as absent (the caller keeps its estimate).
 */

/** Characters of an answer's end that {@link usageTail} keeps; `usage` fits many times over. */
export const USAGE_TAIL_CHARS = 4096;

/**
 * The last {@link USAGE_TAIL_CHARS} bytes of an answer whose final two chunks were `previous`
 * and `latest`, as Latin-1 text (usage is ASCII; multi-byte text around it needs no decoding).
 */
export function usageTail(
  previous: Uint8Array | undefined,
  latest: Uint8Array | undefined,
): string {
  const last = latest === undefined ? "" : latin1(latest, latest.length - USAGE_TAIL_CHARS);
  if (previous === undefined || last.length >= USAGE_TAIL_CHARS) return last;
  return latin1(previous, previous.length - (USAGE_TAIL_CHARS - last.length)) + last;
}

function latin1(bytes: Uint8Array, from: number): string {
  const start = Math.max(0, from);
  // The router's chunks are Buffers already: decode in place, with no view object per answer.
  if (Buffer.isBuffer(bytes)) return bytes.toString("latin1", start);
  return Buffer.from(bytes.buffer, bytes.byteOffset + start, bytes.length - start).toString(
    "latin1",
  );
}

/** A `usage` field {@link readUsageCount} reads. */
export type UsageField = "prompt_tokens" | "completion_tokens" | "cached_tokens";

const KEYS: Readonly<Record<UsageField, string>> = {
  prompt_tokens: '"prompt_tokens"',
  completion_tokens: '"completion_tokens"',
  // `usage.prompt_tokens_details.cached_tokens`: prompt tokens the engine found in its cache.
  cached_tokens: '"cached_tokens"',
};

/** More digits than this is no token count (2^53 has 16). */
const MAX_DIGITS = 15;

/**
 * The value of the last `"field": N` in `tail` (JSON whitespace allowed around the colon),
 * e.g. `completion_tokens` of an answer's `usage`; `undefined` when the field is absent or its
 * last value is not an unsigned integer of at most 15 digits (a negative, fractional, exponent,
 * string or `null` value). The last occurrence decides: in a stream with per-chunk usage the
 * last count is the total, and falling back to an earlier one would undercount. A scan from
 * the end, no regex: this runs once per proxied request. Escaped quotes inside generated text
 * (`\"prompt_tokens\"`) never match, since the key's closing quote must follow directly.
 */
export function readUsageCount(tail: string, field: UsageField): number | undefined {
  return usageValue(tail, field) ?? undefined;
}

/**
 * {@link readUsageCount}, telling an absent field (`undefined`, or a JSON `null`) from one
 * whose value no engine would report (`null` returned): negative, fractional, an exponent, a
 * string, more than 15 digits.
 */
function usageValue(tail: string, field: UsageField): number | null | undefined {
  const key = KEYS[field];
  for (
    let at = tail.lastIndexOf(key);
    at >= 0;
    at = at === 0 ? -1 : tail.lastIndexOf(key, at - 1)
  ) {
    let i = skipJsonSpace(tail, at + key.length);
    // The key as a value (`["prompt_tokens"]`) is not the member: look further back.
    if (tail.charCodeAt(i) !== 0x3a) continue;
    i = skipJsonSpace(tail, i + 1);
    if (tail.startsWith("null", i)) return undefined;
    let value = 0;
    let digits = 0;
    let c = tail.charCodeAt(i);
    for (; c >= 0x30 && c <= 0x39; c = tail.charCodeAt(++i)) {
      value = value * 10 + (c - 0x30);
      digits++;
    }
    const fraction = c === 0x2e || c === 0x65 || c === 0x45;
    return digits === 0 || digits > MAX_DIGITS || fraction ? null : value;
  }
  return undefined;
}

/**
 * Most tokens one answer may report in one field (2^24, above any context window times any
 * sane `n`): more is a corrupt or hostile answer, refused like a negative count.
 */
export const MAX_REPORTED_TOKENS = 2 ** 24;

/** An answer's `usage` as the router may trust it. */
export interface AnswerUsage {
  readonly prompt?: number;
  readonly completion?: number;
  readonly cached?: number;
  /**
   * A count was there but no engine would send it (negative, fractional, exponent, string,
   * above {@link MAX_REPORTED_TOKENS}, cached above prompt): every count of the answer is
   * dropped, and the request charged its estimate.
   */
  readonly refused: boolean;
}

const NO_USAGE: AnswerUsage = { refused: false };
const REFUSED_USAGE: AnswerUsage = { refused: true };

/** The counts of the `usage` at the end of an answer (see {@link usageTail}). */
export function readAnswerUsage(tail: string): AnswerUsage {
  if (tail.indexOf("_tokens") < 0) return NO_USAGE;
  const prompt = usageValue(tail, "prompt_tokens");
  const completion = usageValue(tail, "completion_tokens");
  const cached = usageValue(tail, "cached_tokens");
  if (prompt === null || completion === null || cached === null) return REFUSED_USAGE;
  if (
    (prompt ?? 0) > MAX_REPORTED_TOKENS ||
    (completion ?? 0) > MAX_REPORTED_TOKENS ||
    (cached !== undefined && cached > (prompt ?? MAX_REPORTED_TOKENS))
  ) {
    return REFUSED_USAGE;
  }
  if (prompt === undefined && completion === undefined) return NO_USAGE;
  return {
    refused: false,
    ...(prompt === undefined ? {} : { prompt }),
    ...(completion === undefined ? {} : { completion }),
    ...(cached === undefined ? {} : { cached }),
  };
}

function skipJsonSpace(text: string, i: number): number {
  for (let c = text.charCodeAt(i); c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09; ) {
    c = text.charCodeAt(++i);
  }
  return i;
}

const LF = 0x0a;

/**
 * Server-sent events that end in `chunk`: each ends in a blank line, `\n\n` (JSON text inside
 * an event never has a raw newline). `afterNewline`: whether the previous chunk ended in `\n`,
 * so an end split across two chunks counts once. A stream's events bound its tokens from below
 * (engines send at least one token per content event), which is what a stream that reports no
 * `usage` is settled with.
 */
export function countEventEnds(chunk: Uint8Array, afterNewline: boolean): number {
  let count = 0;
  for (let at = chunk.indexOf(LF); at >= 0; at = chunk.indexOf(LF, at + 1)) {
    if (at === 0 ? afterNewline : chunk[at - 1] === LF) count++;
  }
  return count;
}

const EVENT_END = Buffer.from("\n\n");
const EMPTY_CHOICES = [Buffer.from('"choices":[]'), Buffer.from('"choices": []')];
const USAGE_KEY = Buffer.from('"usage"');
const EMPTY = Buffer.alloc(0);

/**
 * Takes out of a stream the one event a client did not ask for: the usage event that the
 * router asked the engine for (`stream_options.include_usage`) so that a stream is charged
 * its exact counts. vLLM, SGLang and llama.cpp all send it as its own event, after the last
 * content and before `[DONE]`, with an empty `choices` list. Every other byte goes through
 * unchanged and in order; an event split across chunks is held until its end arrives, so a
 * client sees the same bytes as without the router, at most one partial event later.
 */
export class UsageEventFilter {
  #held: Buffer | undefined;
  /** Whether the usage event was seen (and dropped). */
  dropped = false;

  /** The bytes of `chunk` (and of what was held) to forward now; may be empty. */
  push(chunk: Buffer): Buffer {
    const data = this.#held === undefined ? chunk : Buffer.concat([this.#held, chunk]);
    const last = data.lastIndexOf(EVENT_END);
    if (last < 0) {
      this.#held = data;
      return EMPTY;
    }
    const cut = last + EVENT_END.length;
    this.#held = cut === data.length ? undefined : data.subarray(cut);
    const complete = cut === data.length ? data : data.subarray(0, cut);
    return this.dropped ? complete : this.#drop(complete);
  }

  /** What is still held when the stream ends (an unfinished last event), forwarded as is. */
  end(): Buffer | undefined {
    const held = this.#held;
    this.#held = undefined;
    return held;
  }

  #drop(events: Buffer): Buffer {
    let at = events.indexOf(EMPTY_CHOICES[0] as Buffer);
    if (at < 0) at = events.indexOf(EMPTY_CHOICES[1] as Buffer);
    if (at < 0) return events;
    const previous = events.lastIndexOf(EVENT_END, at);
    const from = previous < 0 ? 0 : previous + EVENT_END.length;
    const end = events.indexOf(EVENT_END, at) + EVENT_END.length;
    const event = events.subarray(from, end);
    if (event.indexOf(USAGE_KEY) < 0) return events;
    this.dropped = true;
    if (from === 0) return events.subarray(end);
    if (end === events.length) return events.subarray(0, from);
    return Buffer.concat([events.subarray(0, from), events.subarray(end)]);
  }
}
