/**
 * Prefix block hashing. The prompt text, as UTF-8, is cut into fixed blocks of `blockBytes`
 * bytes (default 1024 ≈ 256 tokens of English). One running hash goes over all the bytes and is
 * read out at the end of each block, so block `i`'s key stands for the whole prefix up to and
 * including it: equal keys mean equal prefixes (up to 48-bit collisions). A trailing partial
 * block gets no block key, since an engine cannot cache a partial block either; but the same
 * running hash is also read out at every quarter block, the partial block's included
 * ({@link PromptKeys}), so that prompts sharing their complete blocks are told apart by where
 * their own text ends. Only consistency inside one router and its peers matters (engines hash
 * their own way).
 *
 * The hash is MurmurHash3's 32-bit mixing in two lanes with different constants, four bytes
 * per step through a `DataView`, finalised (fmix32) per block into a 48-bit key (32 bits of one
 * lane, 16 of the other). It is not cryptographic: a client could craft two prompts with equal
 * keys, which only steers its own requests' affinity, itself bounded by load. It replaced a
 * SHA-1 chain (one `crypto.hash` per block) at 80 vs 275 µs per 200 KB prompt here: the native
 * call per block cost more than the hashing.
 *
 * Bytes, not UTF-16 code units, because the router hashes a large prompt straight out of the
 * request body (`json-scan.ts`) without decoding it into a string; a prompt given as JS strings
 * (`hashPromptBlocks`) is encoded to UTF-8 first and yields the same keys. Escapes in the body
 * are decoded on the way, so `"\u00e9"` and a raw `é` hash alike (Python clients escape
 * non-ASCII by default, JavaScript ones do not). Lone surrogates hash as U+FFFD, as
 * `TextEncoder` writes them.
 *
 * A prompt under vLLM's `cache_salt` starts the running hash from lanes derived from the salt
 * ({@link promptKeys}): vLLM puts the salt in its first block's hash, so its blocks are shared
 * only among requests with the same salt, and so are these keys. An unsalted prompt starts from
 * a fixed seed.
 */
import type { PromptPiece } from "./json-scan.js";

/** Options of {@link hashPromptBlocks}. */
export interface BlockHashOptions {
  /** Block size in UTF-8 bytes (default 1024). */
  readonly blockBytes?: number;
  /** Most blocks hashed; later text is ignored (default 512, i.e. 512 KiB). */
  readonly maxBlocks?: number;
}

/** Default block size in bytes. */
export const DEFAULT_BLOCK_BYTES = 1024;
/** Default cap on hashed blocks per prompt. */
export const DEFAULT_MAX_BLOCKS = 512;

const SCRATCH_BYTES = 48 * 1024;
/** Reused for encoding strings (one per thread; nothing here is async). */
const scratch = new Uint8Array(SCRATCH_BYTES);
const encoder = new TextEncoder();
/** The block buffer, reused while the block size stays the same. */
let shared = new Uint8Array(DEFAULT_BLOCK_BYTES);
let sharedView = new DataView(shared.buffer);

/** The running hash's two lanes before any byte of an unsalted prompt. */
const SEED_1 = 0x9747b28c | 0;
const SEED_2 = 0x85ebca6b | 0;

/**
 * The lanes a prompt under `salt` starts from: the salt hashed from the unsalted seed and
 * finalised, so each of its keys differs from the same text's under another salt or none (up to
 * 48-bit collisions). UTF-16 code units, two per step, rather than UTF-8: salts that differ only
 * in lone surrogates stay apart, and the salt (≤ 1024 units) needs no encoding.
 */
function saltedLanes(salt: string): readonly [number, number] {
  let h1 = SEED_1;
  let h2 = SEED_2;
  for (let i = 0; i < salt.length; i += 2) {
    const w = salt.charCodeAt(i) | (i + 1 < salt.length ? salt.charCodeAt(i + 1) << 16 : 0);
    // The steps of `ChainBuilder.#mix`.
    let k1 = Math.imul(w, 0xcc9e2d51);
    k1 = Math.imul((k1 << 15) | (k1 >>> 17), 0x1b873593);
    h1 ^= k1;
    h1 = (Math.imul((h1 << 13) | (h1 >>> 19), 5) + 0xe6546b64) | 0;
    let k2 = Math.imul(w, 0x85ebca77);
    k2 = Math.imul((k2 << 17) | (k2 >>> 15), 0xc2b2ae3d);
    h2 ^= k2;
    h2 = (Math.imul((h2 << 11) | (h2 >>> 21), 3) + 0x27d4eb2f) | 0;
  }
  return [fmix32(h1 ^ salt.length), fmix32(h2 ^ salt.length)];
}

/** Gathers UTF-8 bytes into blocks and records each block's key, and each quarter's. */
class ChainBuilder {
  readonly keys: Float64Array;
  /**
   * One key per complete quarter block (see {@link PromptKeys.quarters}), pushed in order. A
   * plain array: a `Float64Array` over 64 bytes gets a backing store off V8's heap, which cost
   * more than hashing a 4 KB prompt's quarters (analysis of a 4 KB chat: 10 → 14.7 µs).
   */
  readonly quarters: number[] = [];
  /** Most quarter keys kept. */
  readonly #maxQuarters: number;
  readonly #block: Uint8Array;
  readonly #view: DataView;
  /** Write position in {@link #block}; the block is full at `#end`. */
  #at = 0;
  readonly #end: number;
  /** Bytes of a quarter block; 0 when the block size is not a multiple of 16 (no quarters). */
  readonly #quarter: number;
  #done = 0;
  /** Bytes taken at most: the complete blocks', and with quarters the partial one's too. */
  readonly #limit: number;
  /** Bytes of the current block hashed into the lanes (a multiple of `#quarter`). */
  #hashed = 0;
  /** The running hash's two lanes. */
  #h1 = SEED_1;
  #h2 = SEED_2;

  constructor(totalBytes: number, blockBytes: number, maxBlocks: number, salt?: string) {
    if (salt !== undefined) [this.#h1, this.#h2] = saltedLanes(salt);
    const blocks = Math.min(Math.floor(totalBytes / blockBytes), maxBlocks);
    this.keys = new Float64Array(blocks);
    this.#quarter = blockBytes % 16 === 0 ? blockBytes / 4 : 0;
    this.#maxQuarters =
      this.#quarter === 0
        ? 0
        : blocks < maxBlocks
          ? Math.floor(totalBytes / this.#quarter)
          : 4 * maxBlocks;
    this.#limit =
      this.#quarter === 0 ? blocks * blockBytes : Math.min(totalBytes, maxBlocks * blockBytes);
    if (shared.length !== blockBytes) {
      shared = new Uint8Array(blockBytes);
      sharedView = new DataView(shared.buffer);
    }
    this.#block = shared;
    this.#view = sharedView;
    this.#end = blockBytes;
  }

  /** Hashes the block's bytes `[#hashed, to)` into the lanes. */
  #mix(to: number): void {
    const view = this.#view;
    const words = this.#end & ~3;
    let h1 = this.#h1;
    let h2 = this.#h2;
    for (let p = this.#hashed; p < to; p += 4) {
      // The last partial word (block sizes not a multiple of 4) is read byte by byte.
      const w =
        p < words
          ? view.getUint32(p, true)
          : (this.#block[p] as number) |
            ((this.#block[p + 1] ?? 0) << 8) |
            ((this.#block[p + 2] ?? 0) << 16);
      let k1 = Math.imul(w, 0xcc9e2d51);
      k1 = Math.imul((k1 << 15) | (k1 >>> 17), 0x1b873593);
      h1 ^= k1;
      h1 = (Math.imul((h1 << 13) | (h1 >>> 19), 5) + 0xe6546b64) | 0;
      let k2 = Math.imul(w, 0x85ebca77);
      k2 = Math.imul((k2 << 17) | (k2 >>> 15), 0xc2b2ae3d);
      h2 ^= k2;
      h2 = (Math.imul((h2 << 11) | (h2 >>> 21), 3) + 0x27d4eb2f) | 0;
    }
    this.#h1 = h1;
    this.#h2 = h2;
    this.#hashed = to;
  }

  /** The 48-bit key of the prefix hashed so far, `length` bytes into the current block. */
  #key(length: number): number {
    return (fmix32(this.#h1 ^ length) >>> 0) * 65536 + (fmix32(this.#h2 ^ length) >>> 16);
  }

  /** Hashes the current block's complete quarters not hashed yet, recording their keys. */
  #quarters(upTo: number): void {
    const q = this.#quarter;
    if (q === 0) return;
    for (let to = this.#hashed + q; to <= upTo && to < this.#end; to += q) {
      this.#mix(to);
      if (this.quarters.length < this.#maxQuarters) this.quarters.push(this.#key(to));
    }
  }

  #emit(): void {
    const end = this.#end;
    this.#quarters(end);
    this.#mix(end);
    const key = this.#key(end);
    this.keys[this.#done] = key;
    if (this.quarters.length < this.#maxQuarters) this.quarters.push(key);
    this.#done++;
    this.#at = 0;
    this.#hashed = 0;
  }

  /** After the last bytes: hashes the trailing partial block's complete quarters; the keys. */
  finish(): PromptKeys {
    this.#quarters(this.#at);
    return { chain: this.keys, quarters: this.quarters };
  }

  /** Every byte the keys need was taken. */
  get full(): boolean {
    return this.#done * this.#end + this.#at >= this.#limit;
  }

  bytes(b: Uint8Array, start: number, end: number): void {
    const block = this.#block;
    while (start < end && !this.full) {
      const take = Math.min(
        end - start,
        this.#end - this.#at,
        this.#limit - this.#done * this.#end - this.#at,
      );
      if (take <= 16) {
        for (let k = 0; k < take; k++) block[this.#at + k] = b[start + k] as number;
      } else {
        block.set(b.subarray(start, start + take), this.#at);
      }
      start += take;
      this.#at += take;
      if (this.#at === this.#end) this.#emit();
    }
  }

  string(s: string): void {
    // ≤ 3 UTF-8 bytes per UTF-16 unit; never cut between the halves of a surrogate pair.
    const step = Math.floor(SCRATCH_BYTES / 3);
    for (let at = 0; at < s.length && !this.full; ) {
      let to = Math.min(s.length, at + step);
      const last = s.charCodeAt(to - 1);
      if (to < s.length && last >= 0xd800 && last <= 0xdbff) to--;
      const { written } = encoder.encodeInto(
        at === 0 && to === s.length ? s : s.slice(at, to),
        scratch,
      );
      this.bytes(scratch, 0, written);
      at = to;
    }
  }

  /**
   * A JSON string's raw bytes with escapes, decoded to UTF-8 on the way: runs between
   * backslashes are found natively (`indexOf`) and copied as one piece each.
   */
  escaped(b: Uint8Array, start: number, end: number): void {
    let i = start;
    while (i < end && !this.full) {
      let next = b.indexOf(0x5c, i);
      if (next < 0 || next > end) next = end;
      if (next > i) this.bytes(b, i, next);
      if (next === end) return;
      const e = b[next + 1] as number;
      let cp: number;
      if (e === 0x75) {
        cp = hex4(b, next + 2);
        i = next + 6;
        if (cp >= 0xd800 && cp <= 0xdbff && b[i] === 0x5c && b[i + 1] === 0x75) {
          const low = hex4(b, i + 2);
          if (low >= 0xdc00 && low <= 0xdfff) {
            cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
            i += 6;
          }
        }
        if (cp >= 0xd800 && cp <= 0xdfff) cp = 0xfffd;
      } else {
        cp = SIMPLE_ESCAPES[e] ?? e; // e is one of the eight validated escape letters
        i = next + 2;
      }
      if (cp < 0x80 && this.#at + 1 < this.#end && !this.full) this.#block[this.#at++] = cp;
      else this.bytes(scratch, 0, writeUtf8(cp));
    }
  }
}

/** MurmurHash3's finaliser: every input bit affects every output bit. */
export function fmix32(h: number): number {
  let x = h ^ (h >>> 16);
  x = Math.imul(x, 0x85ebca6b);
  x ^= x >>> 13;
  x = Math.imul(x, 0xc2b2ae35);
  return x ^ (x >>> 16);
}

/** Byte value of each one-character escape's letter (`n` → 0x0a …); `"`, `\\`, `/` map to themselves. */
const SIMPLE_ESCAPES = Uint8Array.from({ length: 128 }, (_, i) => i);
SIMPLE_ESCAPES[0x62] = 0x08; // \b
SIMPLE_ESCAPES[0x66] = 0x0c; // \f
SIMPLE_ESCAPES[0x6e] = 0x0a; // \n
SIMPLE_ESCAPES[0x72] = 0x0d; // \r
SIMPLE_ESCAPES[0x74] = 0x09; // \t

function hex4(b: Uint8Array, p: number): number {
  let v = 0;
  for (let k = 0; k < 4; k++) {
    const c = b[p + k] as number;
    v = (v << 4) | (c <= 0x39 ? c - 0x30 : (c | 0x20) - 0x57);
  }
  return v;
}

/** Writes `cp` as UTF-8 at the start of `scratch`; returns its length. */
function writeUtf8(cp: number): number {
  let o = 0;
  if (cp < 0x80) {
    scratch[o++] = cp;
  } else if (cp < 0x800) {
    scratch[o++] = 0xc0 | (cp >> 6);
    scratch[o++] = 0x80 | (cp & 0x3f);
  } else if (cp < 0x10000) {
    scratch[o++] = 0xe0 | (cp >> 12);
    scratch[o++] = 0x80 | ((cp >> 6) & 0x3f);
    scratch[o++] = 0x80 | (cp & 0x3f);
  } else {
    scratch[o++] = 0xf0 | (cp >> 18);
    scratch[o++] = 0x80 | ((cp >> 12) & 0x3f);
    scratch[o++] = 0x80 | ((cp >> 6) & 0x3f);
    scratch[o++] = 0x80 | (cp & 0x3f);
  }
  return o;
}

function builder(
  totalBytes: number,
  options: BlockHashOptions,
  salt: string | undefined,
): ChainBuilder {
  return new ChainBuilder(
    totalBytes,
    options.blockBytes ?? DEFAULT_BLOCK_BYTES,
    options.maxBlocks ?? DEFAULT_MAX_BLOCKS,
    salt,
  );
}

/**
 * A prompt's keys: its chain, and the same running hash read out at every quarter block.
 * Quarters tell apart prompts that share their complete blocks and differ in a partial one: a
 * chat's turns after a shared system prompt are often shorter than a block (bench/routing
 * hot-prefix: a 200-character turn after a 4 KB system prompt), so the first turn's own text is
 * in no complete block, and a router matching blocks alone sees every replica holding the
 * system prompt as holding as much as the one its conversation went to.
 */
export interface PromptKeys {
  /** One 48-bit key per complete block, in order. */
  readonly chain: Float64Array;
  /**
   * One 48-bit key per complete quarter block (`blockBytes ÷ 4` bytes; none when the block size
   * is not a multiple of 16), in order: `quarters[4i + 3]` is `chain[i]`, the others stand for
   * the prefix up to a quarter inside a block, the trailing partial block's included.
   */
  readonly quarters: readonly number[];
}

/** The prefix-hash chain of `text`: one 48-bit key per complete block, in order. */
export function hashPromptBlocks(text: string, options: BlockHashOptions = {}): Float64Array {
  return hashPromptPieces([text], options);
}

/** {@link hashPromptBlocks} of the concatenation of `pieces`, without building it. */
export function hashPromptPieces(
  pieces: readonly string[],
  options: BlockHashOptions = {},
): Float64Array {
  return promptKeys(pieces, options).chain;
}

/**
 * {@link PromptKeys} of the concatenation of `pieces`. `salt`: the request's `cache_salt`
 * (`RequestFeatures.cacheSalt`), under which the keys share nothing with the same text's under
 * another salt or none.
 */
export function promptKeys(
  pieces: readonly string[],
  options: BlockHashOptions = {},
  salt?: string,
): PromptKeys {
  let total = 0;
  for (const piece of pieces) total += Buffer.byteLength(piece);
  const chain = builder(total, options, salt);
  for (const piece of pieces) {
    if (chain.full) break;
    chain.string(piece);
  }
  return chain.finish();
}

/**
 * The keys of a prompt found by `scanRequestBody` in `body`: string pieces are encoded,
 * spans are hashed straight from the body (decoding escapes on the way). Same keys as
 * {@link promptKeys} of the decoded pieces, under the same `salt`.
 */
export function hashScannedPrompt(
  body: Uint8Array,
  pieces: readonly PromptPiece[],
  promptBytes: number,
  options: BlockHashOptions = {},
  salt?: string,
): PromptKeys {
  const chain = builder(promptBytes, options, salt);
  for (const piece of pieces) {
    if (chain.full) break;
    if (typeof piece === "string") chain.string(piece);
    else if (piece.escaped) chain.escaped(body, piece.start, piece.end);
    else chain.bytes(body, piece.start, piece.end);
  }
  return chain.finish();
}

/**
 * The key of `keys`' prompt at its last complete quarter past its last complete block, when
 * there is one: what a replica that received it holds beyond the chain.
 */
export function quarterTail(keys: PromptKeys): number | undefined {
  const n = keys.quarters.length;
  return n % 4 !== 0 && n > 4 * keys.chain.length ? keys.quarters[n - 1] : undefined;
}
