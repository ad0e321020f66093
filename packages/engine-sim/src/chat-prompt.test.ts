import { describe, expect, it } from "vitest";
import { parseSimChatMessages, simChatPrompt } from "./chat-prompt.js";

const chat = [
  { role: "system", content: "Be brief." },
  { role: "user", content: [{ type: "text", text: "Hi" }, { type: "image_url" }, { text: "!" }] },
  { role: "assistant", content: null },
];

describe("simChatPrompt", () => {
  it.each([
    [{}, "<|system|>\nBe brief.\n<|user|>\nHi!\n<|assistant|>\n\n<|assistant|>\n"],
    [{ addGenerationPrompt: false }, "<|system|>\nBe brief.\n<|user|>\nHi!\n<|assistant|>\n\n"],
    [{ continueFinalMessage: true }, "<|system|>\nBe brief.\n<|user|>\nHi!\n<|assistant|>\n"],
  ])("with %j", (options, expected) => {
    expect(simChatPrompt(chat, options)).toBe(expected);
  });
});

describe("parseSimChatMessages", () => {
  it.each([
    [[], "messages must be a non-empty array"],
    ["hi", "messages must be a non-empty array"],
    [[{ content: "x" }], "messages[0] must be an object with a string role"],
    [[{ role: "user", content: 5 }], "messages[0].content must be a string or an array of parts"],
  ])("refuses %j", (messages, message) => {
    expect(parseSimChatMessages(messages)).toBe(message);
  });

  it("passes valid messages through", () => {
    expect(parseSimChatMessages(chat)).toBe(chat);
  });
});
