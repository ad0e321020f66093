/**
 * The simulator's token approximation: a prompt is cut into consecutive 4-character pieces
 * (the usual "~4 characters per token" rule of thumb for English BPE vocabularies). Cutting
 * from the start keeps tokenisation prefix-stable: two prompts sharing their first 64
 * characters share their first 16 tokens, which is what the prefix cache needs.
 */
export const CHARS_PER_TOKEN = 4;

/** Number of simulated tokens in `text` (`ceil(length / 4)`, 0 for the empty string). */
export function countTokens(text: string): number {
  return Math.ceil(text.length / CHARS_PER_TOKEN);
}

/**
 * The simulated token ids of `text`: one per 4-character piece (the last piece may be
 * shorter), each the FNV-1a 32-bit hash of the piece's UTF-16 code units, modulo 2^31 (ids
 * stay non-negative int32, as real vocabularies' are). Deterministic and prefix-stable like
 * {@link countTokens}: `simTokenIds(text).length === countTokens(text)`, and equal pieces get
 * equal ids. A router tokenizes requests for the sim's model family with this (plus
 * {@link simChatPrompt} for chat), and the sim's KV events carry these ids.
 */
export function simTokenIds(text: string): Uint32Array {
  const ids = new Uint32Array(countTokens(text));
  for (let t = 0; t < ids.length; t += 1) {
    let h = 0x811c9dc5;
    const end = Math.min(text.length, (t + 1) * CHARS_PER_TOKEN);
    for (let i = t * CHARS_PER_TOKEN; i < end; i += 1) {
      h = Math.imul(h ^ text.charCodeAt(i), 0x01000193);
    }
    ids[t] = (h >>> 0) % 0x80000000;
  }
  return ids;
}

/** The text of each simulated token of `text`: its 4-character pieces (the last may be shorter). */
export function simTokenTexts(text: string): string[] {
  const pieces: string[] = [];
  for (let i = 0; i < text.length; i += CHARS_PER_TOKEN) {
    pieces.push(text.slice(i, i + CHARS_PER_TOKEN));
  }
  return pieces;
}

/**
 * Chained hashes of the full KV blocks of a token sequence given as token texts (a prompt's
 * {@link simTokenTexts}, then any generated pieces), like vLLM's prefix-cache block hashes:
 * block i's hash covers blocks 0..i, so equal hashes mean equal token prefixes. A trailing
 * partial block gets no hash (it is never shared).
 */
export function sequenceBlockHashes(
  tokenTexts: readonly string[],
  blockSizeTokens: number,
  cacheSalt?: string,
): string[] {
  const full = Math.floor(tokenTexts.length / blockSizeTokens);
  const hashes: string[] = [];
  let parent = 0x811c9dc5;
  let parent2 = 0x01000193;
  if (cacheSalt !== undefined) {
    // As vLLM's `cache_salt` (an extra key of the first block): the whole chain differs.
    parent = Math.imul(parent ^ 0x5a17, 0x01000193) >>> 0;
    for (let i = 0; i < cacheSalt.length; i += 1) {
      const c = cacheSalt.charCodeAt(i);
      parent = Math.imul(parent ^ c, 0x01000193) >>> 0;
      parent2 = (Math.imul(parent2 ^ c, 0x5bd1e995) ^ (parent2 >>> 15)) >>> 0;
    }
  }
  for (let b = 0; b < full; b += 1) {
    let h = parent;
    let h2 = parent2 ^ b;
    for (let t = b * blockSizeTokens; t < (b + 1) * blockSizeTokens; t += 1) {
      const piece = tokenTexts[t] as string;
      for (let i = 0; i < piece.length; i += 1) {
        const c = piece.charCodeAt(i);
        h = Math.imul(h ^ c, 0x01000193);
        h2 = Math.imul(h2 ^ c, 0x5bd1e995) ^ (h2 >>> 15);
      }
    }
    parent = h >>> 0;
    parent2 = h2 >>> 0;
    hashes.push(`${parent.toString(16)}${parent2.toString(16).padStart(8, "0")}`);
  }
  return hashes;
}

/** {@link sequenceBlockHashes} of a prompt's tokens. */
export function blockHashes(text: string, blockSizeTokens: number): string[] {
  return sequenceBlockHashes(simTokenTexts(text), blockSizeTokens);
}

/** FNV-1a 32-bit hash of a string; used to derive per-request seeds. */
export function hashString(text: string, seed = 0x811c9dc5): number {
  let h = seed >>> 0;
  for (let i = 0; i < text.length; i += 1) {
    h = Math.imul(h ^ text.charCodeAt(i), 0x01000193);
  }
  return h >>> 0;
}

/** A small deterministic PRNG (mulberry32); returns floats in [0, 1). */
export function createPrng(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * Output vocabulary: every word is exactly one 4-character piece, so an answer's text cut by
 * {@link simTokenTexts} gives back its tokens one for one (a next turn that quotes the answer
 * after a prompt whose length is a multiple of 4 re-tokenizes to the same ids, as on vLLM).
 */
const WORDS = [
  " the",
  " sim",
  " and",
  " for",
  " was",
  " are",
  " can",
  " GPU",
  " but",
  " not",
  " one",
  " all",
  " has",
  " its",
  " new",
  " run",
  " our",
  " may",
  " KV ",
  " to ",
  " of ",
  " in ",
  " is ",
  " it ",
  " on ",
  " at ",
  " by ",
  " as ",
  " an ",
  " or ",
  " be ",
  " we ",
  "ing.",
  "ed, ",
  "s to",
];

/**
 * The text of the next output token for a request whose PRNG is `next` (call in order):
 * always one 4-character piece.
 */
export function nextTokenText(next: () => number): string {
  return WORDS[Math.floor(next() * WORDS.length)] ?? " the";
}
