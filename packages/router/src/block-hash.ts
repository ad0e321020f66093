/**
 * Prefix block hashing. The prompt text is cut into fixed blocks of `blockChars` UTF-16 code
 * units (default 1024 ≈ 256 tokens) and block `i` is identified by the SHA-1 of the whole
 * prefix up to and including it (one running native hash, copied at each boundary, so each
 * byte is hashed once). Equal keys therefore mean equal prefixes. Only consistency inside one
 * router matters (engines hash their own way); a trailing partial block is not hashed, since
 * an engine cannot cache it either.
 *
 * Keys are the first 48 bits of each digest as a JS number (a cheap `Map` key; a collision at
 * a bounded index of ~10⁵ entries has odds around 10⁻⁵ and only costs affinity, never
 * correctness).
 */
import { createHash } from "node:crypto";

/** Options of {@link hashPromptBlocks}. */
export interface BlockHashOptions {
  /** Block size in UTF-16 code units (default 1024). */
  readonly blockChars?: number;
  /** Most blocks hashed; later text is ignored (default 512, i.e. 512 Ki characters). */
  readonly maxBlocks?: number;
}

/** Default block size in characters. */
export const DEFAULT_BLOCK_CHARS = 1024;
/** Default cap on hashed blocks per prompt. */
export const DEFAULT_MAX_BLOCKS = 512;

/** The prefix-hash chain of `text`: one 48-bit key per complete block, in order. */
export function hashPromptBlocks(text: string, options: BlockHashOptions = {}): Float64Array {
  const blockChars = options.blockChars ?? DEFAULT_BLOCK_CHARS;
  const maxBlocks = options.maxBlocks ?? DEFAULT_MAX_BLOCKS;
  const count = Math.min(Math.floor(text.length / blockChars), maxBlocks);
  const keys = new Float64Array(count);
  if (count === 0) return keys;
  const running = createHash("sha1");
  for (let i = 0; i < count; i++) {
    running.update(text.slice(i * blockChars, (i + 1) * blockChars));
    keys[i] = running.copy().digest().readUIntBE(0, 6);
  }
  return keys;
}

/**
 * {@link hashPromptBlocks} of the concatenation of `pieces`, without building it: each block is
 * fed to the running hash piece by piece. Same keys as hashing the joined text, except where a
 * piece boundary splits a UTF-16 surrogate pair (each half then hashes as U+FFFD), which only
 * lone-surrogate prompts can produce.
 */
export function hashPromptPieces(
  pieces: readonly string[],
  options: BlockHashOptions = {},
): Float64Array {
  const blockChars = options.blockChars ?? DEFAULT_BLOCK_CHARS;
  const maxBlocks = options.maxBlocks ?? DEFAULT_MAX_BLOCKS;
  let total = 0;
  for (const piece of pieces) total += piece.length;
  const count = Math.min(Math.floor(total / blockChars), maxBlocks);
  const keys = new Float64Array(count);
  if (count === 0) return keys;
  const running = createHash("sha1");
  let filled = 0;
  let done = 0;
  for (const piece of pieces) {
    let at = 0;
    while (at < piece.length && done < count) {
      const take = Math.min(piece.length - at, blockChars - filled);
      running.update(take === piece.length ? piece : piece.slice(at, at + take));
      at += take;
      filled += take;
      if (filled === blockChars) {
        keys[done++] = running.copy().digest().readUIntBE(0, 6);
        filled = 0;
      }
    }
    if (done === count) break;
  }
  return keys;
}
