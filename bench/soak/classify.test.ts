import { describe, expect, it } from "vitest";
import { classifyFailure, classifyJson, classifySse, errorCode } from "./classify.js";

const chunk = (content: string) =>
  `data: ${JSON.stringify({ object: "chat.completion.chunk", choices: [{ index: 0, delta: { content } }] })}\n\n`;
const openAiError = (type: string, code: string) =>
  JSON.stringify({ error: { message: "m", type, code, param: null } });

describe("classifyJson", () => {
  it.each([
    [
      200,
      JSON.stringify({ choices: [{ message: { role: "assistant", content: "hi" } }] }),
      "ok",
      "200",
    ],
    [200, JSON.stringify({ choices: [] }), "malformed", "200 without choices"],
    [200, '{"choices":[{"message":{"content":"tru', "malformed", "200 without choices"],
    [429, openAiError("rate_limit_error", "queue_full"), "error", "429 queue_full"],
    [503, openAiError("service_unavailable", "model_loading"), "error", "503 model_loading"],
    [
      502,
      openAiError("upstream_error", "upstream_unavailable"),
      "error",
      "502 upstream_unavailable",
    ],
    [502, "<html>Bad Gateway</html>", "malformed", "502 without an OpenAI error body"],
    [500, JSON.stringify({ error: "boom" }), "malformed", "500 without an OpenAI error body"],
  ])("%i %s → %s", (status, body, cls, detail) => {
    const verdict = classifyJson(status, body);
    expect(verdict.class).toBe(cls);
    expect(verdict.detail).toContain(detail);
  });
});

describe("classifySse", () => {
  it.each([
    ["a complete stream", 200, `${chunk("a")}${chunk("b")}data: [DONE]\n\n`, "ok"],
    ["a stream cut before [DONE]", 200, `${chunk("a")}${chunk("b")}`, "malformed"],
    ["an empty 200", 200, "", "malformed"],
    ["a non-JSON event", 200, `${chunk("a")}data: {oops\n\ndata: [DONE]\n\n`, "malformed"],
    ["events after [DONE]", 200, `${chunk("a")}data: [DONE]\n\n${chunk("b")}`, "malformed"],
    [
      "an error event ending the stream",
      200,
      `${chunk("a")}data: ${openAiError("upstream_error", "upstream_unavailable")}\n\n`,
      "error",
    ],
    [
      "a 503 before streaming",
      503,
      openAiError("service_unavailable", "no_ready_replica"),
      "error",
    ],
  ])("%s → %s", (_what, status, body, cls) => {
    expect(classifySse(status, body).class).toBe(cls);
  });
});

describe("classifyFailure", () => {
  const coded = (code: string) => Object.assign(new Error(code), { code });
  it.each([
    ["refused at connect", coded("ECONNREFUSED"), false, "cp-down"],
    [
      "refused wrapped in a fetch TypeError",
      new TypeError("fetch failed", { cause: coded("ECONNREFUSED") }),
      false,
      "cp-down",
    ],
    ["reset before any answer", coded("ECONNRESET"), false, "reset"],
    ["socket closed mid-body", coded("UND_ERR_SOCKET"), true, "reset"],
    ["headers timeout", coded("UND_ERR_HEADERS_TIMEOUT"), false, "hang"],
    ["body timeout", coded("UND_ERR_BODY_TIMEOUT"), true, "hang"],
    [
      "the client's AbortSignal.timeout",
      new DOMException("timed out", "TimeoutError"),
      true,
      "hang",
    ],
    ["anything else", new Error("weird"), false, "reset"],
  ])("%s → %s", (_what, error, answered, cls) => {
    expect(classifyFailure(error, answered).class).toBe(cls);
  });

  it("finds a code on the error or down its cause chain", () => {
    expect(errorCode(new Error("x", { cause: new Error("y", { cause: { code: "EPIPE" } }) }))).toBe(
      "EPIPE",
    );
    expect(errorCode(new Error("no code"))).toBeUndefined();
  });
});
