/**
 * Our own chained block keys over token ids. Engine block hashes are useless across replicas
 * (vLLM seeds them with `os.urandom(32)` unless PYTHONHASHSEED is set, kv_cache_utils.py), so,
 * like llm-d's "request keys", a consumer recomputes a key per block from the `token_ids` of
 * `BlockStored` and the router computes the same keys from a tokenized request.
 *
 * Key `i` stands for the whole token prefix through block `i`: it is `chainKey(key[i-1],
 * block i's tokens)`, starting from no parent. The chain state between blocks is the 48-bit key
 * itself, so a consumer that knows only the parent's key (an event's `parent_block_hash`
 * resolved through its own map) continues the chain exactly.
 *
 * The hash is MurmurHash3's 32-bit mixing in two lanes with different constants, one token id
 * (a 32-bit word) per step, finalised with fmix32 into 48 bits (32 of one lane, 16 of the
 * other), as packages/router/src/block-hash.ts does over bytes. Held in a JS number, exact
 * (< 2^53). Not cryptographic: a client crafting colliding prompts only steers its own
 * requests' affinity.
 */

import { KvEventsError } from "./errors.js";

const SEED1 = 0x9747b28c | 0;
const SEED2 = 0x85ebca6b | 0;
/** Lanes of a chain that has a parent start elsewhere than a root chain's. */
const CHILD1 = 0x1b873593 | 0;
const CHILD2 = 0x27d4eb2f | 0;
const TWO32 = 4294967296;

/** MurmurHash3's finaliser: every input bit affects every output bit. */
function fmix32(h: number): number {
  let x = h ^ (h >>> 16);
  x = Math.imul(x, 0x85ebca6b);
  x ^= x >>> 13;
  x = Math.imul(x, 0xc2b2ae35);
  return x ^ (x >>> 16);
}

/**
 * The key of `words[from, to)` after `parentKey`. The parent seeds the two lanes (a
 * one-to-one map of its 48 bits, from other constants than a root chain's, so "no parent" and
 * a parent key 0 differ). Everything stays on locals: V8 keeps them in registers (module-level
 * lanes measured ~25% slower).
 */
function hashRange(
  parentKey: number | undefined,
  words: ArrayLike<number>,
  from: number,
  to: number,
): number {
  let h1 = SEED1;
  let h2 = SEED2;
  if (parentKey !== undefined) {
    const lo = (parentKey % TWO32) | 0;
    h1 = CHILD1 ^ lo;
    h2 = CHILD2 ^ fmix32(lo) ^ Math.floor(parentKey / TWO32);
  }
  for (let i = from; i < to; i++) {
    const w = words[i] as number;
    let k1 = Math.imul(w, 0xcc9e2d51);
    k1 = Math.imul((k1 << 15) | (k1 >>> 17), 0x1b873593);
    h1 ^= k1;
    h1 = (Math.imul((h1 << 13) | (h1 >>> 19), 5) + 0xe6546b64) | 0;
    let k2 = Math.imul(w, 0x85ebca77);
    k2 = Math.imul((k2 << 17) | (k2 >>> 15), 0xc2b2ae3d);
    h2 ^= k2;
    h2 = (Math.imul((h2 << 11) | (h2 >>> 21), 3) + 0x27d4eb2f) | 0;
  }
  const length = to - from;
  return (fmix32(h1 ^ length) >>> 0) * 65536 + (fmix32(h2 ^ length) >>> 16);
}

/**
 * The key of the block `tokens[from, to)` whose parent block has key `parentKey` (`undefined`
 * for a prompt's first block). Token ids are taken as unsigned 32-bit words.
 */
export function chainKey(
  parentKey: number | undefined,
  tokens: ArrayLike<number>,
  from: number,
  to: number,
): number {
  return hashRange(parentKey, tokens, from, to);
}

/** Longest `cache_salt` keyed, in UTF-16 code units (the router refuses longer ones). */
export const MAX_SALT_LENGTH = 1024;

/** Marks a salt's words apart from any token ids' (those are taken as 32-bit words too). */
const SALT_DOMAIN = 0x5a17_5a17;

/**
 * The parent key a prompt's first block chains from under vLLM's `cache_salt` (vLLM makes the
 * salt the first block's extra key, so every block of a salted prompt hashes apart from the
 * same tokens' unsalted or under another salt). `tokenBlockKeys(tokens, size, saltKey(salt))`
 * are the keys of such a prompt, and a consumer of `BlockStored` chains its first salted block
 * from the same key. `undefined` for a salt longer than {@link MAX_SALT_LENGTH}.
 */
export function saltKey(salt: string): number | undefined {
  if (salt.length > MAX_SALT_LENGTH) return undefined;
  const words = new Array<number>(salt.length + 1);
  words[0] = SALT_DOMAIN;
  for (let i = 0; i < salt.length; i++) words[i + 1] = salt.charCodeAt(i);
  return hashRange(undefined, words, 0, words.length);
}

/**
 * One key per full block of `tokens` (a trailing partial block has none: an engine cannot
 * cache it either), each standing for the prefix through its block. `parentKey` continues a
 * chain whose earlier blocks were keyed already. `blockSize` must be a positive integer.
 */
export function tokenBlockKeys(
  tokens: ArrayLike<number>,
  blockSize: number,
  parentKey?: number,
): Float64Array {
  if (!Number.isSafeInteger(blockSize) || blockSize <= 0) {
    throw new KvEventsError(
      "LLMGW_KV_EVENTS_INVALID_OPTIONS",
      `blockSize must be a positive integer, got ${blockSize}`,
    );
  }
  const keys = new Float64Array(Math.floor(tokens.length / blockSize));
  let parent = parentKey;
  for (let b = 0, at = 0; b < keys.length; b++, at += blockSize) {
    parent = hashRange(parent, tokens, at, at + blockSize);
    keys[b] = parent;
  }
  return keys;
}
