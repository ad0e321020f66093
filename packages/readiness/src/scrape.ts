import { type EngineKind, type EngineLoad, extractEngineLoad } from "./engine-load.js";
import { ReadinessError } from "./errors.js";
import { authorizationHeaders, boundedText, type FetchLike } from "./probes.js";
import { parsePrometheusText } from "./prometheus.js";

/**
 * `/metrics` bodies read at most: vLLM's and SGLang's are tens to hundreds of KiB, with
 * LoRA adapters and histograms included.
 */
export const MAX_METRICS_BYTES = 8 * 2 ** 20;

/** Options of {@link scrapeEngineLoad}. */
export interface ScrapeOptions {
  /** Default: detected from metric prefixes. */
  engine?: EngineKind;
  /** Default 2000 ms. */
  timeoutMs?: number;
  signal?: AbortSignal;
  fetch?: FetchLike;
  /** The engine's API key, sent as `Authorization: Bearer` (llama-server guards `/metrics`). */
  apiKey?: string;
}

/**
 * GETs an engine's `/metrics` (`url` is the full metrics URL) and returns its load signals.
 * Throws `LLMGW_READINESS_SCRAPE_FAILED` on transport errors, timeouts, non-200 statuses and
 * bodies over {@link MAX_METRICS_BYTES}.
 */
export async function scrapeEngineLoad(
  url: string,
  options: ScrapeOptions = {},
): Promise<EngineLoad> {
  const timeoutMs = options.timeoutMs ?? 2000;
  const timeout = AbortSignal.timeout(timeoutMs);
  const signal =
    options.signal === undefined ? timeout : AbortSignal.any([timeout, options.signal]);
  const doFetch =
    options.fetch ?? ((input: string, init: Parameters<FetchLike>[1]) => fetch(input, init));
  const started = performance.now();
  let text: string;
  try {
    const response = await doFetch(url, { signal, headers: authorizationHeaders(options.apiKey) });
    if (response.status !== 200) {
      await response.body?.cancel().catch(() => {});
      throw new ReadinessError(
        "LLMGW_READINESS_SCRAPE_FAILED",
        `scrape ${url}: HTTP ${response.status} after ${Math.round(performance.now() - started)} ms`,
      );
    }
    text = await boundedText(response, MAX_METRICS_BYTES);
  } catch (cause) {
    if (cause instanceof ReadinessError) throw cause;
    const what = timeout.aborted
      ? `timed out after ${timeoutMs} ms`
      : `${(cause as Error).message} after ${Math.round(performance.now() - started)} ms`;
    throw new ReadinessError("LLMGW_READINESS_SCRAPE_FAILED", `scrape ${url}: ${what}`, { cause });
  }
  return extractEngineLoad(parsePrometheusText(text), options.engine);
}
