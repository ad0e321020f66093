/**
 * The soak's client: a fixed number of closed loops sending chat completions (streaming and
 * not, seeded mix) through the router, each request classified exactly once. A per-request
 * timeout well above the worst expected latency turns a hang into a `hang`, never a wait.
 */

import { createPrng } from "@llmgw/engine-sim";
import { Agent, request } from "undici";
import { classifyFailure, classifyJson, classifySse, type Verdict } from "./classify.js";
import type { RequestRecord } from "./report.js";

/** What the load loops need. */
export interface LoadOptions {
  /** Router base URL, e.g. `http://127.0.0.1:8080`. */
  readonly baseUrl: string;
  readonly apiKey: string;
  readonly model: string;
  readonly concurrency: number;
  /** Whole-request client timeout, ms. */
  readonly timeoutMs: number;
  /** Fraction of streaming requests (0–1). */
  readonly streamShare: number;
  /** `max_tokens` is drawn from [min, max]. */
  readonly maxTokens: readonly [number, number];
  /** Pause between a loop's requests, ms. */
  readonly thinkMs: number;
  readonly seed: number;
  /** ms since the run started (the injected clock). */
  readonly now: () => number;
}

/** The running load: stop it, then read what it counted. */
export interface LoadRun {
  /** Requests started so far (incremented before each request goes out). */
  readonly sent: () => number;
  readonly records: readonly RequestRecord[];
  /** Stops starting new requests and resolves when every loop's last request is classified. */
  stop(): Promise<void>;
}

const WORDS = ["cluster", "replica", "engine", "token", "latency", "router", "fabric", "node"];

/** Starts `concurrency` loops; they run until `stop()`. */
export function startLoad(options: LoadOptions): LoadRun {
  const dispatcher = new Agent({
    connections: options.concurrency * 2,
    connectTimeout: 5_000,
    headersTimeout: options.timeoutMs,
    bodyTimeout: options.timeoutMs,
    keepAliveTimeout: 2_000,
  });
  const records: RequestRecord[] = [];
  let sent = 0;
  let stopping = false;
  const random = createPrng(options.seed);

  const one = async (id: number): Promise<RequestRecord> => {
    const stream = random() < options.streamShare;
    const [lo, hi] = options.maxTokens;
    const maxTokens = lo + Math.floor(random() * (hi - lo + 1));
    const prompt = Array.from(
      { length: 12 },
      () => WORDS[Math.floor(random() * WORDS.length)],
    ).join(" ");
    const body = JSON.stringify({
      model: options.model,
      stream,
      max_tokens: maxTokens,
      messages: [
        { role: "system", content: "You are a soak test." },
        { role: "user", content: `${id}: ${prompt}` },
      ],
    });
    const startMs = options.now();
    let answered = false;
    let replica: string | undefined;
    let status: number | undefined;
    let verdict: Verdict;
    try {
      const res = await request(`${options.baseUrl}/v1/chat/completions`, {
        method: "POST",
        dispatcher,
        headers: {
          authorization: `Bearer ${options.apiKey}`,
          "content-type": "application/json",
        },
        body,
        signal: AbortSignal.timeout(options.timeoutMs),
      });
      answered = true;
      status = res.statusCode;
      const header = res.headers["x-llmgw-replica"];
      replica = typeof header === "string" ? header : undefined;
      const text = await res.body.text();
      verdict = stream ? classifySse(res.statusCode, text) : classifyJson(res.statusCode, text);
    } catch (error) {
      verdict = classifyFailure(error, answered);
    }
    return {
      id,
      stream,
      startMs,
      endMs: options.now(),
      class: verdict.class,
      detail: verdict.detail,
      ...(replica === undefined ? {} : { replica }),
      ...(status === undefined ? {} : { status }),
    };
  };

  const loop = async (): Promise<void> => {
    while (!stopping) {
      sent += 1;
      const record = await one(sent);
      records.push(record);
      // Errors return at once: back off a little, as a real client would, so a down router or a
      // 503 is not spun on (and the error budget counts time, not spin rate).
      const pause = record.class === "ok" ? options.thinkMs : Math.max(options.thinkMs, 100);
      if (pause > 0 && !stopping) await new Promise((r) => setTimeout(r, pause));
    }
  };
  const loops = Array.from({ length: options.concurrency }, () => loop());

  return {
    sent: () => sent,
    records,
    async stop() {
      stopping = true;
      await Promise.all(loops);
      await dispatcher.close();
    },
  };
}
