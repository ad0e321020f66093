/**
 * Reading an engine's `usage` counts from its answer as it goes by, without parsing the
 * answer: a JSON answer has a `usage` member (vLLM may write long members after it), and a
 * stream that reports it does so in its last data event. What is read here comes from an engine, so every count is checked, and a count
 * that is not a plain non-negative integer reads as absent (the caller keeps its estimate).
 */

const USAGE_MEMBER = Buffer.from('"usage"');
const QUOTE = 0x22;

/** Most characters of one `usage` member a {@link UsageReader} keeps (its object needs ~200). */
export const USAGE_MEMBER_CHARS = 4096;

/**
 * Finds the last `"usage": {…}` member of an answer as its chunks go by, wherever it is: vLLM
 * writes `prompt_logprobs`, `prompt_token_ids` and `kv_transfer_params` after `usage` in a
 * whole answer, as long as the client makes them, so the answer's end alone may not hold it;
 * and a stream's usage event may come in many small chunks. Holds one member's text (at most
 * {@link USAGE_MEMBER_CHARS}) and a reference to the previous chunk, never the answer: each
 * chunk costs one native search for the key. A key that is not a member (the string `"usage"`
 * as a value, in generated text or a token's text) is passed over.
 */
export class UsageReader {
  /** The last member found, whole, as Latin-1 text ("" for none). */
  #found = "";
  /** A member whose key was found but not its end yet (it may prove to be no member). */
  #open: string | undefined;
  /** The last bytes read (the key's length less one), for a key split across chunks. */
  readonly #carry = Buffer.alloc(USAGE_MEMBER.length - 1);
  #carried = 0;

  /** Reads the next chunk of the answer. */
  push(chunk: Buffer): void {
    const open = this.#open;
    if (open !== undefined) {
      this.#open = undefined;
      this.#take(open + latin1(chunk, 0, USAGE_MEMBER_CHARS - open.length));
    }
    const split = this.#splitKey(chunk);
    this.#keep(chunk);
    for (
      let at = chunk.lastIndexOf(USAGE_MEMBER);
      at >= 0;
      at = at === 0 ? -1 : chunk.lastIndexOf(USAGE_MEMBER, at - 1)
    ) {
      if (this.#take(latin1(chunk, at, at + USAGE_MEMBER_CHARS))) return;
    }
    if (split !== undefined) this.#take(split);
  }

  /**
   * The text from a key that starts in the bytes carried from earlier chunks (however many:
   * a chunk of one byte may sit inside the key) and ends in `chunk`; undefined for none. Only
   * when the carried bytes hold its opening quote: most chunks end an event, in no quote.
   */
  #splitKey(chunk: Buffer): string | undefined {
    const n = this.#carried;
    const carry = this.#carry;
    let quote = false;
    for (let i = 0; i < n && !quote; i++) quote = carry[i] === QUOTE;
    if (!quote) return undefined;
    const joint = carry.toString("latin1", 0, n) + latin1(chunk, 0, USAGE_MEMBER.length - 1);
    const at = joint.indexOf('"usage"');
    // From `n` on, the key is in the chunk: its own search finds it.
    if (at < 0 || at >= n) return undefined;
    return joint.slice(at, n) + latin1(chunk, 0, USAGE_MEMBER_CHARS - (n - at));
  }

  /** Carries the last bytes read, `chunk`'s and, where it is short, those before it. */
  #keep(chunk: Buffer): void {
    const carry = this.#carry;
    const k = carry.length;
    if (chunk.length >= k) {
      chunk.copy(carry, 0, chunk.length - k);
      this.#carried = k;
      return;
    }
    const kept = Math.min(this.#carried, k - chunk.length);
    carry.copyWithin(0, this.#carried - kept, this.#carried);
    chunk.copy(carry, kept);
    this.#carried = kept + chunk.length;
  }

  /** The last whole `usage` member found, for {@link readAnswerUsage}; "" for none. */
  text(): string {
    return this.#found;
  }

  /** Takes `text` (from a `"usage"` key on) as the member found; false if it is none. */
  #take(text: string): boolean {
    const end = memberEnd(text);
    if (end < 0) return false;
    // A later member: the one still open before it (if any) is no longer the last.
    this.#open = undefined;
    if (end > 0) this.#found = text.slice(0, end);
    else if (text.length >= USAGE_MEMBER_CHARS) this.#found = text;
    else this.#open = text;
    return true;
  }
}

/**
 * Where the member `text` starts with (`"usage"`, then `: {…}` or `: null`) ends: its length
 * when whole, 0 when `text` ends before the member does, -1 when the key is no member.
 */
function memberEnd(text: string): number {
  let i = skipJsonSpace(text, USAGE_MEMBER.length);
  if (i >= text.length) return 0;
  if (text.charCodeAt(i) !== 0x3a) return -1;
  i = skipJsonSpace(text, i + 1);
  if (i >= text.length) return 0;
  if (text.charCodeAt(i) === 0x6e) {
    const rest = text.slice(i, i + 4);
    return rest === "null" ? i + 4 : "null".startsWith(rest) ? 0 : -1;
  }
  if (text.charCodeAt(i) !== 0x7b) return -1;
  let depth = 0;
  let inString = false;
  for (; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++;
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x7b || c === 0x5b) depth++;
    else if ((c === 0x7d || c === 0x5d) && --depth === 0) return i + 1;
  }
  return 0;
}

/** Bytes `from` up to `to` of `chunk` (both clamped to it), as Latin-1 text. */
function latin1(chunk: Buffer, from: number, to = chunk.length): string {
  const start = Math.max(0, from);
  const end = Math.min(chunk.length, to);
  return end <= start ? "" : chunk.toString("latin1", start, end);
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

/** The counts of an answer's `usage` member (see {@link UsageReader}). */
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
const CR = 0x0d;

/**
 * Counts the server-sent events a stream ends, chunk by chunk. Each ends in a blank line, and a
 * line ends in `\n`, `\r\n` or `\r` (JSON text inside an event has no raw line break); an end
 * split across chunks counts once. A stream's events bound its tokens from below (engines send
 * at least one token per content event), which is what a stream that reports no `usage` is
 * settled with.
 */
export class EventEndCounter {
  #count = 0;
  /** Whether the last byte seen ended a line: 0 not, {@link CR} (its LF may follow) or LF. */
  #lineEnded = 0;

  get count(): number {
    return this.#count;
  }

  push(chunk: Uint8Array): void {
    if (chunk.length === 0) return;
    if (this.#lineEnded !== CR && chunk.indexOf(CR) < 0) {
      // Lines end in `\n` alone, as every engine writes them: a blank line is `\n\n`.
      for (let at = chunk.indexOf(LF); at >= 0; at = chunk.indexOf(LF, at + 1)) {
        if (at === 0 ? this.#lineEnded !== 0 : chunk[at - 1] === LF) this.#count++;
      }
      this.#lineEnded = chunk[chunk.length - 1] === LF ? LF : 0;
      return;
    }
    let ended = this.#lineEnded;
    for (let i = 0; i < chunk.length; i++) {
      const b = chunk[i];
      if (b === LF && ended === CR) ended = LF;
      else if (b === LF || b === CR) {
        if (ended !== 0) this.#count++;
        ended = b;
      } else ended = 0;
    }
    this.#lineEnded = ended;
  }
}

/** The blank lines that end a server-sent event: `\n\n`, `\r\n\r\n` or `\r\r`. */
const EVENT_ENDS = [Buffer.from("\n\n"), Buffer.from("\r\n\r\n"), Buffer.from("\r\r")];
const EMPTY_CHOICES = [Buffer.from('"choices":[]'), Buffer.from('"choices": []')];
const USAGE_KEY = Buffer.from('"usage"');
const EMPTY = Buffer.alloc(0);

/** Where the last event of `data` ends (just past its blank line), or -1 where none does. */
function lastEventEnd(data: Buffer): number {
  // Most chunks end an event, the engine writing one event at a time: no search then.
  const n = data.length;
  if (n >= 2 && data[n - 1] === LF && (data[n - 2] === LF || endsInCrlfBlank(data))) return n;
  let end = -1;
  for (const blank of EVENT_ENDS) {
    const at = data.lastIndexOf(blank);
    if (at >= 0) end = Math.max(end, at + blank.length);
  }
  return end;
}

/** Whether `data` ends in `\r\n\r\n`. */
function endsInCrlfBlank(data: Buffer): boolean {
  const n = data.length;
  return n >= 4 && data[n - 4] === CR && data[n - 3] === LF && data[n - 2] === CR;
}

/** Where the first event of `data` from `from` on ends (past its blank line), or -1. */
function nextEventEnd(data: Buffer, from: number): number {
  let end = -1;
  for (const blank of EVENT_ENDS) {
    const at = data.indexOf(blank, from);
    if (at >= 0 && (end < 0 || at + blank.length < end)) end = at + blank.length;
  }
  return end;
}

/**
 * Takes out of a stream the one event a client did not ask for: the usage event that the
 * router asked the engine for (`stream_options.include_usage`) so that a stream is charged
 * its exact counts. vLLM, SGLang and llama.cpp all send it as its own event, after the last
 * content and before `[DONE]`, with an empty `choices` list. Every other byte goes through
 * unchanged and in order; an event split across chunks is held until its end arrives, so a
 * client sees the same bytes as without the router, at most one partial event later. Events
 * may end in any blank line SSE allows (`\n\n`, `\r\n\r\n`, `\r\r`); every event with an
 * empty `choices` list and a `usage` is taken out, a second one too (an engine that repeats it).
 */
export class UsageEventFilter {
  #held: Buffer | undefined;
  /** Whether the usage event was seen (and dropped). */
  dropped = false;

  /** The bytes of `chunk` (and of what was held) to forward now; may be empty. */
  push(chunk: Buffer): Buffer {
    const data = this.#held === undefined ? chunk : Buffer.concat([this.#held, chunk]);
    const cut = lastEventEnd(data);
    if (cut < 0) {
      this.#held = data;
      return EMPTY;
    }
    this.#held = cut === data.length ? undefined : data.subarray(cut);
    return this.#drop(cut === data.length ? data : data.subarray(0, cut));
  }

  /** What is still held when the stream ends (an unfinished last event), forwarded as is. */
  end(): Buffer | undefined {
    const held = this.#held;
    this.#held = undefined;
    return held;
  }

  /** `events` (whole ones) without those with empty `choices` and a `usage`. */
  #drop(events: Buffer): Buffer {
    // Most batches have no empty `choices` at all: one search each, and through untouched.
    if (events.indexOf(EMPTY_CHOICES[0] as Buffer) < 0) {
      if (events.indexOf(EMPTY_CHOICES[1] as Buffer) < 0) return events;
    }
    const kept: Buffer[] = [];
    let from = 0;
    let dropped = false;
    while (from < events.length) {
      const end = nextEventEnd(events, from);
      const event = events.subarray(from, end);
      const usage =
        (event.indexOf(EMPTY_CHOICES[0] as Buffer) >= 0 ||
          event.indexOf(EMPTY_CHOICES[1] as Buffer) >= 0) &&
        event.indexOf(USAGE_KEY) >= 0;
      if (usage) dropped = true;
      else kept.push(event);
      from = end;
    }
    if (!dropped) return events;
    this.dropped = true;
    return kept.length === 1 ? (kept[0] as Buffer) : Buffer.concat(kept);
  }
}
