/**
 * Tokenizers for precise mode: the prompt's token ids as the engine will see them (its chat
 * template applied), so the router can key them into the same token blocks the engine's KV
 * events report. Which one a deployment uses comes with its route (`RouteResolution.tokenizer`):
 *
 * - `sim`: the simulator's model family, tokenized in-process with the simulator's own
 *   functions (`@llmgw/engine-sim/tokenizer`), as a tokenizer library would be for a real model.
 * - `vllm`: the engine's own `POST /tokenize` (vLLM's API server; it takes `messages` and
 *   applies the model's chat template). One more round trip per request, to a replica of the
 *   deployment: measured in `bench/routing`. A failure or a slow answer is no error: the
 *   request is routed on the approximate index.
 *
 * The body is parsed with `JSON.parse` here (the analysis that ran before keeps no text); the
 * request was already validated by that analysis.
 */
import { parseSimChatMessages, simChatPrompt, simTokenIds } from "@llmgw/engine-sim/tokenizer";
import type { PromptTokenizerKind, ReplicaRoute } from "@llmgw/router";
import { request } from "undici";

/** What a tokenizer returns: the ids, or why there are none. */
export type TokenizeResult =
  | { readonly ok: true; readonly tokens: ArrayLike<number> }
  | { readonly ok: false; readonly reason: "unsupported_request" | "tokenizer_failed" };

/** Tokenizes one request body for `endpoint` (`/v1/chat/completions` or `/v1/completions`). */
export type PromptTokenizer = (
  body: Uint8Array,
  endpoint: string,
  replicas: readonly ReplicaRoute[],
) => TokenizeResult | Promise<TokenizeResult>;

/** Longest wait for an engine's `/tokenize` answer before routing approximately. */
export const TOKENIZE_TIMEOUT_MS = 2_000;
/** Most token ids accepted from an engine's `/tokenize`. */
const MAX_TOKENS = 4_000_000;

const decoder = new TextDecoder();
const UNSUPPORTED = { ok: false, reason: "unsupported_request" } as const;
const FAILED = { ok: false, reason: "tokenizer_failed" } as const;

/** The tokenizer of `kind`. */
export function tokenizerFor(kind: PromptTokenizerKind): PromptTokenizer {
  return kind === "sim" ? simTokenize : vllmTokenize;
}

function parsed(body: Uint8Array): Record<string, unknown> | undefined {
  try {
    const v = JSON.parse(decoder.decode(body)) as unknown;
    return typeof v === "object" && v !== null && !Array.isArray(v)
      ? (v as Record<string, unknown>)
      : undefined;
  } catch {
    return undefined;
  }
}

const simTokenize: PromptTokenizer = (body, endpoint) => {
  const obj = parsed(body);
  if (obj === undefined) return UNSUPPORTED;
  if (endpoint === "/v1/chat/completions") {
    const messages = parseSimChatMessages(obj.messages);
    if (typeof messages === "string") return UNSUPPORTED;
    return { ok: true, tokens: simTokenIds(simChatPrompt(messages)) };
  }
  if (endpoint === "/v1/completions" && typeof obj.prompt === "string") {
    return { ok: true, tokens: simTokenIds(obj.prompt) };
  }
  return UNSUPPORTED;
};

const vllmTokenize: PromptTokenizer = async (body, endpoint, replicas) => {
  const obj = parsed(body);
  const replica = replicas[0];
  if (obj === undefined || replica === undefined) return UNSUPPORTED;
  let ask: Record<string, unknown>;
  if (endpoint === "/v1/chat/completions" && Array.isArray(obj.messages)) {
    ask = { model: obj.model, messages: obj.messages, add_generation_prompt: true };
  } else if (endpoint === "/v1/completions" && typeof obj.prompt === "string") {
    ask = { model: obj.model, prompt: obj.prompt };
  } else {
    return UNSUPPORTED;
  }
  try {
    const res = await request(`${replica.baseUrl}/tokenize`, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        ...(replica.authorization === undefined ? {} : { authorization: replica.authorization }),
      },
      body: JSON.stringify(ask),
      signal: AbortSignal.timeout(TOKENIZE_TIMEOUT_MS),
    });
    if (res.statusCode !== 200) {
      await res.body.dump();
      return FAILED;
    }
    const answer = (await res.body.json()) as { tokens?: unknown };
    const tokens = answer.tokens;
    if (
      !Array.isArray(tokens) ||
      tokens.length > MAX_TOKENS ||
      !tokens.every((t) => Number.isInteger(t) && t >= 0 && t < 2 ** 32)
    ) {
      return FAILED;
    }
    return { ok: true, tokens: tokens as number[] };
  } catch {
    return FAILED;
  }
};
