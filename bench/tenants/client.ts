/**
 * The open-loop client of the tenants benchmark: Poisson arrivals of streamed chat requests
 * under one API key, each timed to its first content byte. A request the router refuses is
 * not retried: it is counted by the limit or queue that refused it (`x-llmgw-limit`), since a
 * burst far above the fleet's capacity is refused by design. Every outstanding request can be
 * abandoned at once (the end of a burst window): those are counted as `abandoned`, not failed.
 */
import { createPrng } from "@llmgw/engine-sim";
import { Agent, request } from "undici";
import { chatStreamEvents, DONE } from "../lib/sse.js";

/** One request's outcome. */
export interface TenantSample {
  /** When it was sent, ms after the run's start. */
  readonly sentMs: number;
  /** When it ended (answered, refused, failed or abandoned), ms after the run's start. */
  readonly endMs: number;
  /** HTTP status; 0 when none arrived. */
  readonly status: number;
  /** Answered in full: 200 and the stream's `[DONE]`. */
  readonly ok: boolean;
  /** Time to the first non-empty content delta, ms. */
  readonly ttftMs?: number;
  /** `usage.completion_tokens` of the final chunk. */
  readonly completionTokens?: number;
  /** The `x-llmgw-limit` of a 429 (`queue_full`, `queue_timeout`, `tenant-rpm`, …). */
  readonly limit?: string;
  /** Given up by the client at the end of its window (never a failure of the target). */
  readonly abandoned?: boolean;
  readonly error?: string;
}

/** One tenant's stream of requests. */
export interface PoissonSpec {
  /** Router base URL. */
  readonly url: string;
  readonly model: string;
  /** Sent as `Authorization: Bearer <secret>`. */
  readonly secret: string;
  /** Mean arrivals per wall-clock second. */
  readonly ratePerSecond: number;
  /** Arrivals start this long after the run's start, ms. */
  readonly startMs: number;
  /** No arrival after this, ms after the run's start. */
  readonly endMs: number;
  /**
   * Outstanding requests are abandoned at this time (ms after the run's start); default:
   * never, each runs to its end.
   */
  readonly abandonAtMs?: number;
  readonly maxTokens: number;
  /** The user message's length in characters (the sim counts 4 per token). */
  readonly promptChars: number;
  readonly seed: number;
  /** Per-request limit, ms (default 120 000). */
  readonly requestTimeoutMs?: number;
}

/** A prompt of `chars` characters that no other request shares a prefix with. */
export function uniquePrompt(tag: string, chars: number): string {
  const head = `[${tag}] `;
  return (
    head + "Summarise the quarterly report in plain words. ".repeat(Math.ceil(chars / 47))
  ).slice(0, Math.max(head.length, chars));
}

/** Sends one streamed chat request and times it. */
async function send(
  dispatcher: Agent,
  spec: PoissonSpec,
  n: number,
  t0: number,
  abandon: AbortSignal,
): Promise<TenantSample> {
  const started = performance.now();
  const sentMs = started - t0;
  let status = 0;
  let ttftMs: number | undefined;
  let completionTokens: number | undefined;
  let limit: string | undefined;
  try {
    const res = await request(`${spec.url}/v1/chat/completions`, {
      method: "POST",
      dispatcher,
      headers: {
        "content-type": "application/json",
        authorization: `Bearer ${spec.secret}`,
      },
      body: JSON.stringify({
        model: spec.model,
        stream: true,
        stream_options: { include_usage: true },
        max_tokens: spec.maxTokens,
        messages: [{ role: "user", content: uniquePrompt(`${spec.seed}-${n}`, spec.promptChars) }],
      }),
      signal: AbortSignal.any([abandon, AbortSignal.timeout(spec.requestTimeoutMs ?? 120_000)]),
    });
    status = res.statusCode;
    const header = res.headers["x-llmgw-limit"];
    if (typeof header === "string") limit = header;
    if (status !== 200) {
      await res.body.dump();
      return {
        sentMs,
        endMs: performance.now() - t0,
        status,
        ok: false,
        ...(limit === undefined ? {} : { limit }),
        error: `HTTP ${status}`,
      };
    }
    let done = false;
    for await (const event of chatStreamEvents(res.body)) {
      if (event === DONE) {
        done = true;
        continue;
      }
      if (typeof event.usage?.completion_tokens === "number")
        completionTokens = event.usage.completion_tokens;
      if (ttftMs === undefined && event.choices?.[0]?.delta?.content)
        ttftMs = performance.now() - started;
    }
    return {
      sentMs,
      endMs: performance.now() - t0,
      status,
      ok: done,
      ...(ttftMs === undefined ? {} : { ttftMs }),
      ...(completionTokens === undefined ? {} : { completionTokens }),
      ...(done ? {} : { error: "stream ended without [DONE]" }),
    };
  } catch (err) {
    return {
      sentMs,
      endMs: performance.now() - t0,
      status,
      ok: false,
      ...(ttftMs === undefined ? {} : { ttftMs }),
      ...(abandon.aborted ? { abandoned: true } : { error: (err as Error).message }),
    };
  }
}

/**
 * Runs several tenants' Poisson streams against one start time and resolves with each
 * stream's samples (in `specs` order) once every request ended.
 */
export async function runTenants(specs: readonly PoissonSpec[]): Promise<TenantSample[][]> {
  const dispatcher = new Agent({ keepAliveTimeout: 30_000, connections: 4096 });
  const t0 = performance.now();
  try {
    return await Promise.all(
      specs.map(async (spec) => {
        const abandon = new AbortController();
        const abandonTimer =
          spec.abandonAtMs === undefined
            ? undefined
            : setTimeout(() => abandon.abort(), spec.abandonAtMs);
        const rand = createPrng(spec.seed);
        const pending: Promise<TenantSample>[] = [];
        let due = t0 + spec.startMs;
        for (let n = 0; ; n++) {
          due += (-Math.log(1 - rand()) / spec.ratePerSecond) * 1000;
          if (due - t0 > spec.endMs) break;
          const wait = due - performance.now();
          if (wait > 0) await new Promise((r) => setTimeout(r, wait));
          pending.push(send(dispatcher, spec, n, t0, abandon.signal));
        }
        const samples = await Promise.all(pending);
        clearTimeout(abandonTimer);
        return samples;
      }),
    );
  } finally {
    await dispatcher.close();
  }
}
