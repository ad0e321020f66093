/** Body analysis = feature extraction + prefix hashing; the unit of work inline or in a worker. */
import { type BlockHashOptions, hashPromptPieces } from "./block-hash.js";
import { extractRequestFeaturesAndPieces, type FeatureResult } from "./features.js";

/** Features plus the prompt's prefix-hash chain (empty when the body was refused). */
export type BodyAnalysis = FeatureResult & { readonly chain: Float64Array };

const EMPTY = new Float64Array(0);

/** Parses `body` once and hashes its prompt blocks. Never throws for any input bytes. */
export function analyzeRequestBody(
  body: Uint8Array | string,
  options: BlockHashOptions = {},
): BodyAnalysis {
  const { result, pieces } = extractRequestFeaturesAndPieces(body);
  if (!result.ok) return { ...result, chain: EMPTY };
  // The pieces, not `promptText`: never flatten a large prompt into one more fresh string.
  return { ...result, chain: hashPromptPieces(pieces, options) };
}
