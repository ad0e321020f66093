/**
 * Prefix block hashing. The prompt text, as UTF-8, is cut into fixed blocks of `blockBytes`
 * bytes (default 1024 ≈ 256 tokens of English). One running hash goes over all the bytes and is
 * read out at the end of each block, so block `i`'s key stands for the whole prefix up to and
 * including it: equal keys mean equal prefixes (up to 48-bit collisions). A trailing partial
 * block is not hashed, since an engine cannot cache it either. Only consistency inside one
 * router matters (engines hash their own way).
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

/** Gathers UTF-8 bytes into blocks and records each block's key. */
class ChainBuilder {
  readonly keys: Float64Array;
  readonly #block: Uint8Array;
  readonly #view: DataView;
  /** Write position in {@link #block}; the block is full at `#end`. */
  #at = 0;
  readonly #end: number;
  #done = 0;
  /** The running hash's two lanes. */
  #h1 = 0x9747b28c | 0;
  #h2 = 0x85ebca6b | 0;

  constructor(totalBytes: number, blockBytes: number, maxBlocks: number) {
    this.keys = new Float64Array(Math.min(Math.floor(totalBytes / blockBytes), maxBlocks));
    if (shared.length !== blockBytes) {
      shared = new Uint8Array(blockBytes);
      sharedView = new DataView(shared.buffer);
    }
    this.#block = shared;
    this.#view = sharedView;
    this.#end = blockBytes;
  }

  #emit(): void {
    const view = this.#view;
    const end = this.#end;
    let h1 = this.#h1;
    let h2 = this.#h2;
    const words = end & ~3;
    for (let p = 0; p < end; p += 4) {
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
    this.keys[this.#done++] = (fmix32(h1 ^ end) >>> 0) * 65536 + (fmix32(h2 ^ end) >>> 16);
    this.#at = 0;
  }

  get full(): boolean {
    return this.#done >= this.keys.length;
  }

  bytes(b: Uint8Array, start: number, end: number): void {
    const block = this.#block;
    while (start < end && this.#done < this.keys.length) {
      const take = Math.min(end - start, this.#end - this.#at);
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
      if (cp < 0x80 && this.#at + 1 < this.#end) this.#block[this.#at++] = cp;
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

function builder(totalBytes: number, options: BlockHashOptions): ChainBuilder {
  return new ChainBuilder(
    totalBytes,
    options.blockBytes ?? DEFAULT_BLOCK_BYTES,
    options.maxBlocks ?? DEFAULT_MAX_BLOCKS,
  );
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
  let total = 0;
  for (const piece of pieces) total += Buffer.byteLength(piece);
  const chain = builder(total, options);
  for (const piece of pieces) {
    if (chain.full) break;
    chain.string(piece);
  }
  return chain.keys;
}

/**
 * The chain of a prompt found by `scanRequestBody` in `body`: string pieces are encoded,
 * spans are hashed straight from the body (decoding escapes on the way). Same keys as
 * {@link hashPromptPieces} of the decoded pieces.
 */
export function hashScannedPrompt(
  body: Uint8Array,
  pieces: readonly PromptPiece[],
  promptBytes: number,
  options: BlockHashOptions = {},
): Float64Array {
  const chain = builder(promptBytes, options);
  for (const piece of pieces) {
    if (chain.full) break;
    if (typeof piece === "string") chain.string(piece);
    else if (piece.escaped) chain.escaped(body, piece.start, piece.end);
    else chain.bytes(body, piece.start, piece.end);
  }
  return chain.keys;
}
