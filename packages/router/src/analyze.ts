/**
 * Body analysis = feature extraction + prefix hashing; the unit of work inline or in a worker.
 *
 * Two ways to the same result (`json-scan.test.ts` checks they agree): below
 * {@link SCAN_THRESHOLD_BYTES}, `JSON.parse` (`features.ts`) is the fastest, ~2× the byte
 * scanner on small bodies; above it, decoding the body and its prompt into strings would put
 * them in V8's large-object space (a fresh mapping per string over ~128 KiB, ~1 ms per 200 KB
 * here), so large bodies are scanned as bytes (`json-scan.ts`) and hashed in place, 2–3.5×
 * faster at 200 KB (`bench/router/scan.ts`).
 */
import { type BlockHashOptions, hashScannedPrompt, promptKeys } from "./block-hash.js";
import { isolatedSalt } from "./cache-isolation.js";
import {
  extractRequestFeaturesAndPieces,
  type FeatureErrorReason,
  type RequestHint,
  reservedTokens,
  type StreamUsage,
} from "./features.js";
import { scanRequestBody } from "./json-scan.js";

/** What the router needs from one request body, plus the prompt's prefix-hash chain. */
export type BodyAnalysis =
  | {
      readonly ok: true;
      readonly model: string;
      readonly stream: boolean;
      /** `RequestFeatures.streamUsage`. */
      readonly streamUsage: StreamUsage;
      /** The larger of `max_tokens` and `max_completion_tokens` that is a positive integer. */
      readonly maxTokens?: number;
      /** The larger of `n` and `best_of`, when more than one. */
      readonly choices?: number;
      /**
       * Prompt UTF-8 bytes ÷ 4, rounded up, plus `maxTokens` (or the default estimate) for each
       * of the `choices`.
       */
      readonly estimatedTokens: number;
      readonly chain: Float64Array;
      /** The prompt's quarter-block keys (`PromptKeys.quarters`). */
      readonly quarters: readonly number[];
      /** The body's affinity hint (`RequestFeatures.hint`), when it gives one. */
      readonly hint?: RequestHint;
      /**
       * The `cache_salt` the engine will see, when there is one: the body's
       * (`RequestFeatures.cacheSalt`), or under an isolation scope the router's own
       * ({@link isolatedSalt}). `chain` and `quarters` are keyed under it, and precise mode
       * keys the prompt's token blocks under it too.
       */
      readonly salt?: string;
      /**
       * Set when the body was analysed for an isolation scope: the `cache_salt` the router
       * sends instead of the client's (`chain` and `quarters` are keyed under it).
       */
      readonly isolatedSalt?: string;
    }
  | {
      readonly ok: false;
      readonly reason: FeatureErrorReason;
      readonly message: string;
      readonly param?: string;
    };

/**
 * Bodies from this size on are scanned as bytes. 64 KiB keeps every string `JSON.parse` makes
 * below the large-object size even when one non-Latin-1 character doubles it to UTF-16.
 */
export const SCAN_THRESHOLD_BYTES = 64 * 1024;

const encoder = new TextEncoder();

/**
 * Analyses `body` the faster way for its size. Never throws for any input bytes. `scope`: the
 * principal whose cache the request belongs to (`isolationScope`), when the router isolates
 * prefix caches; the prompt is then keyed under the salt the router will send.
 */
export function analyzeRequestBody(
  body: Uint8Array | string,
  options: BlockHashOptions = {},
  scope?: string,
): BodyAnalysis {
  const bytes = typeof body === "string" ? encoder.encode(body) : body;
  return bytes.length < SCAN_THRESHOLD_BYTES
    ? analyzeByParsing(bytes, options, scope)
    : analyzeByScanning(bytes, options, scope);
}

/** `JSON.parse`, then hash the prompt's strings. */
export function analyzeByParsing(
  body: Uint8Array,
  options: BlockHashOptions = {},
  scope?: string,
): BodyAnalysis {
  const { result, pieces } = extractRequestFeaturesAndPieces(body);
  if (!result.ok) return result;
  const { model, stream, streamUsage, maxTokens, choices, estimatedTokens, hint } = result.features;
  const salt = effectiveSalt(scope, result.features.cacheSalt);
  const { chain, quarters } = promptKeys(pieces, options, salt);
  return withOptional(
    { ok: true, model, stream, streamUsage, estimatedTokens, chain, quarters },
    maxTokens,
    choices,
    hint,
    salt,
    scope,
  );
}

/** The byte scanner, then hash the prompt straight from `body`. */
export function analyzeByScanning(
  body: Uint8Array,
  options: BlockHashOptions = {},
  scope?: string,
): BodyAnalysis {
  const scan = scanRequestBody(body);
  if (!scan.ok) return scan;
  const { model, stream, streamUsage, maxTokens, choices, hint } = scan;
  const salt = effectiveSalt(scope, scan.cacheSalt);
  const { chain, quarters } = hashScannedPrompt(body, scan.pieces, scan.promptBytes, options, salt);
  const estimatedTokens = reservedTokens(scan.promptBytes, maxTokens, choices);
  return withOptional(
    { ok: true, model, stream, streamUsage, estimatedTokens, chain, quarters },
    maxTokens,
    choices,
    hint,
    salt,
    scope,
  );
}

/** The salt the engine will see: the client's, or under a `scope` the router's own. */
function effectiveSalt(
  scope: string | undefined,
  clientSalt: string | undefined,
): string | undefined {
  return scope === undefined ? clientSalt : isolatedSalt(scope, clientSalt);
}

/**
 * `a` with the optional output limits, hint and salt marks that are set (absent keys stay
 * absent).
 */
function withOptional<T extends object>(
  a: T,
  maxTokens: number | undefined,
  choices: number | undefined,
  hint: RequestHint | undefined,
  cacheSalt: string | undefined,
  scope: string | undefined,
): T & {
  readonly maxTokens?: number;
  readonly choices?: number;
  readonly hint?: RequestHint;
  readonly salt?: string;
  readonly isolatedSalt?: string;
} {
  if (
    maxTokens === undefined &&
    choices === undefined &&
    hint === undefined &&
    cacheSalt === undefined
  ) {
    return a;
  }
  return {
    ...a,
    ...(maxTokens === undefined ? {} : { maxTokens }),
    ...(choices === undefined ? {} : { choices }),
    ...(hint === undefined ? {} : { hint }),
    ...(cacheSalt === undefined ? {} : { salt: cacheSalt }),
    ...(scope === undefined || cacheSalt === undefined ? {} : { isolatedSalt: cacheSalt }),
  };
}
