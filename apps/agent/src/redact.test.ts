import { describe, expect, it } from "vitest";
import { createRedactor, REDACTED, redactLines } from "./redact.js";

const HF = "hf_abcdefghijklmnopqrstuvwxyzABCDEF12";

describe("createRedactor", () => {
  const redact = createRedactor([
    "my-secret-value-1",
    "llmgw-engine-KEYKEYKEYKEYKEYKEYKEY",
    "short",
  ]);
  it.each([
    [
      "a held secret anywhere in a line",
      "env: X=my-secret-value-1 done",
      `env: X=${REDACTED} done`,
    ],
    ["an engine key", "key llmgw-engine-KEYKEYKEYKEYKEYKEYKEY", `key ${REDACTED}`],
    [
      "a Hugging Face token it does not hold",
      `using ${HF} for download`,
      `using ${REDACTED} for download`,
    ],
    ["an OpenAI-style key", "OPENAI sk-proj-abcdefghijklmnop123", `OPENAI ${REDACTED}`],
    [
      "a bearer credential",
      "Authorization: Bearer abc.def-ghi_jkl",
      `Authorization: Bearer ${REDACTED}`,
    ],
    [
      "a bearer credential in prose",
      "sent Bearer abcdefgh12345 upstream",
      `sent Bearer ${REDACTED} upstream`,
    ],
    [
      "an api_key assignment",
      "args: api_key=abcd1234 port=8000",
      `args: api_key=${REDACTED} port=8000`,
    ],
    ["a quoted token field", `{"hf_token": "zzzzzzzz"}`, `{"hf_token": "${REDACTED}"}`],
    [
      "nothing secret",
      "INFO: loaded 32 layers, max_tokens=512",
      "INFO: loaded 32 layers, max_tokens=512",
    ],
    ["values shorter than 8 characters are not treated as secrets", "a short line", "a short line"],
  ])("%s", (_, line, expected) => {
    expect(redact(line)).toBe(expected);
  });

  it("redacts the longer of two overlapping secrets whole", () => {
    expect(createRedactor(["abcdefgh", "abcdefgh-and-more"])("x abcdefgh-and-more y")).toBe(
      `x ${REDACTED} y`,
    );
  });

  it("redactLines maps every line", () => {
    expect(redactLines(["HF_TOKEN=my-secret-value-1", "ok"], ["my-secret-value-1"])).toEqual([
      `HF_TOKEN=${REDACTED}`,
      "ok",
    ]);
  });
});
