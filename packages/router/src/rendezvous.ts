/**
 * Rendezvous (highest-random-weight) hashing on a prompt's prefix chain, so routers that share
 * nothing but the route table send a new shared prefix to the same replica: each replica's
 * weight for a prompt is `h(anchor, replica)`, and the highest weight among the replicas with
 * room is the prompt's preferred replica. Every router computes the same weights from the same
 * two inputs, and a replica that leaves moves only the prefixes it was preferred for.
 *
 * The anchor is the key of block `min(chain length, anchorBlocks)` (1-based), i.e. the hash of
 * the prompt's first `anchorBlocks` KiB (at the default block size). A block key stands for its
 * whole prefix (block-hash.ts), so prompts with equal anchors share at least that much text. It
 * must lie inside the shared part (system prompt, tool definitions, few-shot examples): an
 * anchor past it makes every conversation its own group and the shared part is cached once per
 * group again; an anchor too short merges groups that share only boilerplate, which the load
 * bounds in scoring.ts then spread. Short anchors also keep the turns of one conversation
 * together across routers, since every turn longer than the anchor has the same one.
 *
 * Integer mixing only (MurmurHash3's finaliser): no crypto, no I/O, a few nanoseconds per
 * replica. Seeds depend on the replica id alone, never on a process or a random salt, so all
 * routers agree; changing this function makes routers of two releases disagree until all run
 * the same one (affinity only, never correctness).
 */

import { fmix32 } from "./block-hash.js";

/** Default anchor depth in blocks (2 × 1 KiB ≈ 512 tokens of English). */
export const DEFAULT_RENDEZVOUS_ANCHOR_BLOCKS = 2;

/**
 * The 32-bit seed of a replica id: FNV-1a over its UTF-16 code units, finalised. Pure and
 * stable across processes; compute it once per replica (the picker caches it).
 */
export function replicaSeed(replicaId: string): number {
  let h = 0x811c9dc5 | 0;
  for (let i = 0; i < replicaId.length; i++) {
    h = Math.imul(h ^ replicaId.charCodeAt(i), 0x01000193);
  }
  return fmix32(h ^ replicaId.length) >>> 0;
}

/**
 * The anchor of `chain` mixed to 32 bits (once per request), or undefined for an empty chain.
 * `anchorBlocks` ≥ 1: the block whose key is the anchor when the chain is at least that long.
 */
export function chainAnchor(chain: ArrayLike<number>, anchorBlocks: number): number | undefined {
  const n = chain.length;
  if (n === 0) return undefined;
  const key = chain[Math.min(n, anchorBlocks) - 1] as number;
  // Keys are 48-bit integers: `>>> 0` keeps the low 32 bits exactly, the division the rest.
  const hi = Math.floor(key / 4294967296) | 0;
  return fmix32((key >>> 0) ^ fmix32(hi + 0x9e3779b9)) >>> 0;
}

/**
 * The weight of the replica with seed `seed` for a prompt whose anchor is `anchor` (both from
 * this module): an unsigned 32-bit number; the highest weight is the preferred replica.
 */
/**
 * The anchor of a request that names its own affinity (`prompt_cache_key`, a session header,
 * `user`): FNV-1a over the value's UTF-16 units, finalised, seeded apart from
 * {@link replicaSeed} so a hint equal to a replica id does not pick that replica.
 */
export function hintAnchor(value: string): number {
  let h = 0x9e3779b9 | 0;
  for (let i = 0; i < value.length; i++) h = Math.imul(h ^ value.charCodeAt(i), 0x01000193);
  return fmix32(h ^ value.length) >>> 0;
}

export function rendezvousWeight(anchor: number, seed: number): number {
  return fmix32(anchor ^ seed) >>> 0;
}

/**
 * Replica ids in rendezvous order for `chain`, preferred first (equal weights: by id), for
 * tests and tools; the picker computes weights inline.
 */
export function rendezvousOrder(
  chain: ArrayLike<number>,
  replicaIds: readonly string[],
  anchorBlocks: number = DEFAULT_RENDEZVOUS_ANCHOR_BLOCKS,
): string[] {
  const anchor = chainAnchor(chain, anchorBlocks);
  if (anchor === undefined) return [...replicaIds];
  const weighted = replicaIds.map((id) => ({ id, w: rendezvousWeight(anchor, replicaSeed(id)) }));
  weighted.sort((a, b) => b.w - a.w || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  return weighted.map((x) => x.id);
}
