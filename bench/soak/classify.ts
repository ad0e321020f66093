/**
 * Every request of the soak ends in exactly one class. Pure functions over what the client saw
 * (status, body text, or the error thrown), so the rules are testable without a cluster.
 */

/**
 * - `ok`: 200 and a complete body (JSON with a message, or SSE chunks ending with `[DONE]`);
 * - `error`: a well-formed error — a 4xx/5xx with an OpenAI error body, or an SSE error event;
 * - `cp-down`: connection refused at connect (the control plane, which serves the router, is
 *   down for a moment); the client sees it immediately;
 * - `hang`: no complete answer within the client timeout;
 * - `reset`: the connection closed or reset without a complete answer;
 * - `malformed`: an answer that is neither a success nor an OpenAI error.
 */
export type OutcomeClass = "ok" | "error" | "cp-down" | "hang" | "reset" | "malformed";

/** Every class, in report order. */
export const OUTCOME_CLASSES: readonly OutcomeClass[] = [
  "ok",
  "error",
  "cp-down",
  "hang",
  "reset",
  "malformed",
];

/** Classes that break the "every request answered" goal. */
export const BAD_CLASSES: readonly OutcomeClass[] = ["hang", "reset", "malformed"];

/** A class and a short reason (error code, status, what was missing). */
export interface Verdict {
  readonly class: OutcomeClass;
  readonly detail: string;
}

/** True when `body` is an OpenAI error object `{"error":{"message":…,"type":…}}`. */
function isOpenAiError(
  value: unknown,
): value is { error: { message: string; type: string; code?: unknown } } {
  if (typeof value !== "object" || value === null) return false;
  const error = (value as { error?: unknown }).error;
  return (
    typeof error === "object" &&
    error !== null &&
    typeof (error as { message?: unknown }).message === "string" &&
    typeof (error as { type?: unknown }).type === "string"
  );
}

function parse(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

function errorDetail(status: number, body: { error: { type: string; code?: unknown } }): string {
  return `${status} ${String(body.error.code ?? body.error.type)}`;
}

/** A non-streaming answer: status and the whole body text. */
export function classifyJson(status: number, text: string): Verdict {
  const body = parse(text);
  if (status === 200) {
    const choices = (body as { choices?: { message?: { content?: unknown } }[] } | undefined)
      ?.choices;
    if (Array.isArray(choices) && typeof choices[0]?.message?.content === "string") {
      return { class: "ok", detail: "200" };
    }
    return {
      class: "malformed",
      detail: `200 without choices[0].message.content: ${text.slice(0, 80)}`,
    };
  }
  if (status >= 400 && isOpenAiError(body))
    return { class: "error", detail: errorDetail(status, body) };
  return {
    class: "malformed",
    detail: `${status} without an OpenAI error body: ${text.slice(0, 80)}`,
  };
}

/**
 * A streaming answer: status and the whole body text. A 200 stream succeeds when every `data:`
 * line is JSON or `[DONE]`, the last one is `[DONE]` and no chunk is an error; a stream whose
 * last event is an error object is a well-formed error; a non-200 answer is judged as JSON.
 */
export function classifySse(status: number, text: string): Verdict {
  if (status !== 200) return classifyJson(status, text);
  const events = text
    .split("\n")
    .filter((line) => line.startsWith("data:"))
    .map((line) => line.slice(5).trim());
  if (events.length === 0) return { class: "malformed", detail: "200 stream without any event" };
  let sawError: Verdict | undefined;
  for (const [i, data] of events.entries()) {
    if (data === "[DONE]") {
      if (i !== events.length - 1) return { class: "malformed", detail: "events after [DONE]" };
      break;
    }
    const chunk = parse(data);
    if (chunk === undefined)
      return { class: "malformed", detail: `non-JSON event: ${data.slice(0, 80)}` };
    if (isOpenAiError(chunk))
      sawError = { class: "error", detail: `sse ${errorDetail(200, chunk)}` };
  }
  if (sawError) return sawError;
  if (events.at(-1) !== "[DONE]")
    return { class: "malformed", detail: "stream ended without [DONE]" };
  return { class: "ok", detail: "200 sse" };
}

/** The `code` of an error or of its `cause` chain (undici and Node put it on either). */
export function errorCode(error: unknown): string | undefined {
  let current: unknown = error;
  for (let depth = 0; depth < 4 && typeof current === "object" && current !== null; depth++) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === "string") return code;
    const name = (current as { name?: unknown }).name;
    if (name === "TimeoutError" || name === "AbortError") return name;
    current = (current as { cause?: unknown }).cause;
  }
  return undefined;
}

const HANG_CODES = new Set([
  "TimeoutError",
  "AbortError",
  "UND_ERR_HEADERS_TIMEOUT",
  "UND_ERR_BODY_TIMEOUT",
  "UND_ERR_ABORTED",
]);

/**
 * A request that threw instead of completing. `answered` is true when a status line had
 * arrived (the failure happened while reading the body).
 */
export function classifyFailure(error: unknown, answered: boolean): Verdict {
  const code = errorCode(error) ?? "unknown";
  const where = answered ? "mid-body" : "before any answer";
  if (HANG_CODES.has(code)) return { class: "hang", detail: `${code} ${where}` };
  if (code === "ECONNREFUSED" && !answered) return { class: "cp-down", detail: code };
  return { class: "reset", detail: `${code} ${where}` };
}
