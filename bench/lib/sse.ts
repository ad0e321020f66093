/**
 * The events of an OpenAI-style streamed answer (`data: {...}` lines, ending `data: [DONE]`),
 * as the benchmarks' clients read them.
 */

/** What the clients read of one chunk. */
export interface ChatStreamEvent {
  readonly choices?: readonly { readonly delta?: { readonly content?: string } }[];
  readonly usage?: {
    readonly prompt_tokens?: number;
    readonly completion_tokens?: number;
    readonly prompt_tokens_details?: { readonly cached_tokens?: number } | null;
  } | null;
  readonly error?: { readonly message?: string };
}

/** Yielded for `data: [DONE]`. */
export const DONE = Symbol("[DONE]");

/**
 * Yields each `data:` event of `body` parsed, and {@link DONE} for the end marker. An error
 * event throws (`SSE error event: …`), as does a line that is not JSON.
 */
export async function* chatStreamEvents(
  body: AsyncIterable<Uint8Array>,
): AsyncGenerator<ChatStreamEvent | typeof DONE> {
  const decoder = new TextDecoder();
  let buf = "";
  for await (const chunk of body) {
    buf += decoder.decode(chunk, { stream: true });
    let nl = buf.indexOf("\n");
    while (nl >= 0) {
      const line = buf.slice(0, nl).trim();
      buf = buf.slice(nl + 1);
      nl = buf.indexOf("\n");
      if (!line.startsWith("data:")) continue;
      const data = line.slice(5).trim();
      if (data === "[DONE]") {
        yield DONE;
        continue;
      }
      const event = JSON.parse(data) as ChatStreamEvent;
      if (event.error) throw new Error(`SSE error event: ${event.error.message ?? "?"}`);
      yield event;
    }
  }
}
