/**
 * The open-loop client of the routing benchmark: Poisson arrivals of conversation turns, every
 * request streamed so TTFT (time to the first non-empty content delta) is measured at the
 * client, through whichever target (proxy or router) is in front of the engines. Every target
 * gets the same requests: the session (tenant) as an `x-session-id` header and as the body's
 * `prompt_cache_key` (OpenAI's cache-affinity hint; proxies ignore the body, llmgw reads it),
 * unless hints are off; and `stream_options.include_usage`, so the final chunk carries the
 * engine's usage, with `prompt_tokens_details.cached_tokens` where the engine reports it.
 */

import { createPrng } from "@llmgw/engine-sim";
import { Agent, request } from "undici";
import { chatStreamEvents, DONE } from "../lib/sse.js";
import type { Conversation } from "./workloads.js";

/** One answered (or failed) request. */
export interface RequestSample {
  readonly session: string;
  readonly turn: number;
  readonly status: number;
  readonly ok: boolean;
  /** Time to the first content token, ms (undefined when none arrived). */
  readonly ttftMs?: number;
  readonly e2eMs: number;
  readonly error?: string;
  readonly startedMs: number;
  /** `usage.prompt_tokens` of the final chunk, when the stream carried usage. */
  readonly promptTokens?: number;
  /**
   * `usage.prompt_tokens_details.cached_tokens`: prompt tokens the engine found in its prefix
   * cache for this request (vLLM with `--enable-prompt-tokens-details`; the simulator), when
   * reported.
   */
  readonly cachedTokens?: number;
}

/** What to run. */
export interface OpenLoopSpec {
  /** Base URL of the target (proxy, router or engine). */
  readonly url: string;
  readonly model: string;
  readonly conversations: readonly Conversation[];
  /** Mean arrival rate, requests per second. */
  readonly ratePerSecond: number;
  readonly maxTokens: number;
  /** Per-request limit, ms; a request past it is aborted and counted as failed. */
  readonly requestTimeoutMs: number;
  readonly seed?: number;
  /**
   * Send the session as `x-session-id` and `prompt_cache_key` (default true); false sends
   * neither, to show a router without hints.
   */
  readonly hints?: boolean;
  /**
   * Send this many arrivals, then stop, treating `conversations` as a pool: an arrival
   * continues a conversation whose answer has come (the longest waiting first) before it
   * starts a new one, so with a pool larger than the conversations in flight the client never
   * waits for an answer. Unset: every turn of every conversation, new conversations first.
   */
  readonly requests?: number;
}

/** What {@link runOpenLoop} resolves with. */
export interface OpenLoopResult {
  readonly samples: RequestSample[];
  /** From the first arrival's due time to the last answer, ms. */
  readonly wallMs: number;
  /** Due time of the last arrival in the Poisson schedule, ms after the start. */
  readonly scheduledSpanMs: number;
  /**
   * When the last arrival was actually sent, ms after the start: later than scheduled when
   * arrivals waited for an idle conversation (every conversation busy: the client held the
   * load back, so the offered rate was not reached).
   */
  readonly sentSpanMs: number;
}

/** Sends one streamed chat request and times it. */
async function send(
  dispatcher: Agent,
  spec: OpenLoopSpec,
  session: string,
  turn: number,
  messages: { role: string; content: string }[],
  t0: number,
): Promise<{ sample: RequestSample; answer: string }> {
  const started = performance.now();
  const startedMs = started - t0;
  let ttftMs: number | undefined;
  let answer = "";
  let status = 0;
  let promptTokens: number | undefined;
  let cachedTokens: number | undefined;
  const hints = spec.hints !== false;
  try {
    const res = await request(`${spec.url}/v1/chat/completions`, {
      method: "POST",
      dispatcher,
      headers: {
        "content-type": "application/json",
        ...(hints ? { "x-session-id": session } : {}),
      },
      body: JSON.stringify({
        model: spec.model,
        stream: true,
        stream_options: { include_usage: true },
        max_tokens: spec.maxTokens,
        messages,
        ...(hints ? { prompt_cache_key: session } : {}),
      }),
      signal: AbortSignal.timeout(spec.requestTimeoutMs),
    });
    status = res.statusCode;
    let sawDone = false;
    for await (const event of chatStreamEvents(res.body)) {
      if (event === DONE) {
        sawDone = true;
        continue;
      }
      if (event.usage) {
        if (typeof event.usage.prompt_tokens === "number") promptTokens = event.usage.prompt_tokens;
        const cached = event.usage.prompt_tokens_details?.cached_tokens;
        if (typeof cached === "number") cachedTokens = cached;
      }
      const content = event.choices?.[0]?.delta?.content;
      if (content) {
        if (ttftMs === undefined) ttftMs = performance.now() - started;
        answer += content;
      }
    }
    const ok = status === 200 && sawDone;
    return {
      sample: {
        session,
        turn,
        status,
        ok,
        ...(ttftMs === undefined ? {} : { ttftMs }),
        e2eMs: performance.now() - started,
        startedMs,
        ...(promptTokens === undefined ? {} : { promptTokens }),
        ...(cachedTokens === undefined ? {} : { cachedTokens }),
        ...(ok ? {} : { error: status === 200 ? "stream ended without [DONE]" : `HTTP ${status}` }),
      },
      answer,
    };
  } catch (err) {
    return {
      sample: {
        session,
        turn,
        status,
        ok: false,
        e2eMs: performance.now() - started,
        startedMs,
        error: (err as Error).message,
      },
      answer,
    };
  }
}

/**
 * Runs the conversations: arrivals are Poisson at `ratePerSecond`; each arrival sends the next
 * turn of the longest-idle conversation, a new one first (or, with `spec.requests`, one whose
 * answer has come first). A conversation waits for its previous answer, so when none is idle
 * the arrival waits for one: the load is open-loop until every conversation is busy. Resolves
 * with every request's sample once all turns sent are answered or failed.
 */
export async function runOpenLoop(spec: OpenLoopSpec): Promise<OpenLoopResult> {
  const rand = createPrng(spec.seed ?? 7);
  const dispatcher = new Agent({ keepAliveTimeout: 30_000, connections: 1024 });
  type Slot = { conv: Conversation; next: number; history: { role: string; content: string }[] };
  const fresh: Slot[] = spec.conversations.map((conv) => ({
    conv,
    next: 0,
    history: [{ role: "system", content: conv.system }],
  }));
  /** Conversations whose last answer came, longest waiting first. */
  const answered: Slot[] = [];
  const pool = spec.requests !== undefined;
  const nextSlot = (): Slot | undefined =>
    pool ? (answered.shift() ?? fresh.shift()) : (fresh.shift() ?? answered.shift());
  let waiter: (() => void) | undefined;
  const samples: RequestSample[] = [];
  const inFlight = new Set<Promise<void>>();
  const t0 = performance.now();
  const turns = spec.conversations.reduce((n, c) => n + c.turns.length, 0);
  let remaining = Math.min(turns, spec.requests ?? turns);
  let due = t0;
  let sentAt = t0;
  while (remaining > 0) {
    due += (-Math.log(1 - rand()) / spec.ratePerSecond) * 1000;
    const wait = due - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    let slot = nextSlot();
    while (slot === undefined) {
      await new Promise<void>((r) => (waiter = r));
      slot = nextSlot();
    }
    sentAt = performance.now();
    const turn = slot.next++;
    const messages = [...slot.history, { role: "user", content: slot.conv.turns[turn] as string }];
    remaining--;
    const p = send(dispatcher, spec, slot.conv.session, turn, messages, t0).then(
      ({ sample, answer }) => {
        samples.push(sample);
        if (slot.next < slot.conv.turns.length) {
          slot.history = [...messages, { role: "assistant", content: answer }];
          answered.push(slot);
          const w = waiter;
          waiter = undefined;
          w?.();
        }
        inFlight.delete(p);
      },
    );
    inFlight.add(p);
  }
  await Promise.all(inFlight);
  const wallMs = performance.now() - t0;
  await dispatcher.close();
  return { samples, wallMs, scheduledSpanMs: due - t0, sentSpanMs: sentAt - t0 };
}
