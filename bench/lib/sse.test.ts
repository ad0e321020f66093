import { describe, expect, it } from "vitest";
import { type ChatStreamEvent, chatStreamEvents, DONE } from "./sse.js";

async function* chunksOf(text: string, size: number): AsyncGenerator<Uint8Array> {
  const bytes = Buffer.from(text, "utf8");
  for (let i = 0; i < bytes.length; i += size) yield bytes.subarray(i, i + size);
}

async function read(text: string, size: number): Promise<(ChatStreamEvent | typeof DONE)[]> {
  const out: (ChatStreamEvent | typeof DONE)[] = [];
  for await (const e of chatStreamEvents(chunksOf(text, size))) out.push(e);
  return out;
}

describe("chatStreamEvents", () => {
  const stream =
    'data: {"choices":[{"delta":{"content":"héllo ✓"}}]}\n\n: keep-alive\n\n' +
    'data: {"choices":[],"usage":{"completion_tokens":2}}\n\ndata: [DONE]\n\n';

  it("reads the same events however the bytes are cut, multi-byte characters included", async () => {
    const whole = await read(stream, 1 << 20);
    expect(whole).toEqual([
      { choices: [{ delta: { content: "héllo ✓" } }] },
      { choices: [], usage: { completion_tokens: 2 } },
      DONE,
    ]);
    for (const size of [1, 2, 3, 7]) expect(await read(stream, size)).toEqual(whole);
  });

  it("throws on an error event", async () => {
    await expect(read('data: {"error":{"message":"overloaded"}}\n\n', 5)).rejects.toThrow(
      "SSE error event: overloaded",
    );
  });
});
