/**
 * The chat template of the simulated model family: each message as `<|role|>\ncontent\n`,
 * then `<|assistant|>\n` to prompt the answer. A router applies the same function to route
 * on the sim's token ids, so the sim and its callers must never disagree on it.
 */

/** One chat message as the OpenAI API carries it (content parts other than text count as ""). */
export interface SimChatMessage {
  readonly role: string;
  readonly content?: string | null | readonly unknown[];
}

/** Options of {@link simChatPrompt}, named as vLLM's `/tokenize` names them. */
export interface SimChatPromptOptions {
  /** Append `<|assistant|>\n` (default true). */
  readonly addGenerationPrompt?: boolean;
  /** Leave the last message open (no newline after it) so the model continues it. */
  readonly continueFinalMessage?: boolean;
}

/** A message's text: a string, or the `text` of its parts joined. */
function contentText(content: SimChatMessage["content"]): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  let text = "";
  for (const part of content) {
    const t = (part as { text?: unknown } | null)?.text;
    if (typeof t === "string") text += t;
  }
  return text;
}

/** The prompt text the sim builds from `messages` (see the module comment). */
export function simChatPrompt(
  messages: readonly SimChatMessage[],
  options: SimChatPromptOptions = {},
): string {
  let prompt = "";
  for (const [i, m] of messages.entries()) {
    const open = options.continueFinalMessage === true && i === messages.length - 1;
    prompt += `<|${m.role}|>\n${contentText(m.content)}${open ? "" : "\n"}`;
  }
  const generation = (options.addGenerationPrompt ?? true) && options.continueFinalMessage !== true;
  return generation ? `${prompt}<|assistant|>\n` : prompt;
}

/**
 * Validates an API `messages` value; returns the messages or a message naming what is wrong
 * (the sim answers it with a 400).
 */
export function parseSimChatMessages(messages: unknown): readonly SimChatMessage[] | string {
  if (!Array.isArray(messages) || messages.length === 0)
    return "messages must be a non-empty array";
  for (const [i, m] of messages.entries()) {
    if (typeof m !== "object" || m === null || typeof (m as { role?: unknown }).role !== "string") {
      return `messages[${i}] must be an object with a string role`;
    }
    const content = (m as { content?: unknown }).content;
    if (
      content !== undefined &&
      content !== null &&
      typeof content !== "string" &&
      !Array.isArray(content)
    ) {
      return `messages[${i}].content must be a string or an array of parts`;
    }
  }
  return messages as SimChatMessage[];
}
