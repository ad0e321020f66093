/**
 * Scrubs secrets from engine output before it leaves the node. A failed engine's log tail
 * travels into ReplicaStatus, events, the admin API and the control plane's store; an engine
 * may print its environment, a download URL with a token, or its own API key.
 */

/** What replaces a secret. */
export const REDACTED = "[redacted]";

// Shapes of secrets worth catching even when the agent does not hold the value: Hugging Face
// tokens, OpenAI-style keys, llmgw's own keys and tokens, bearer credentials, and
// `api_key=…` / `token: …` / `password=…` assignments (the name is kept, the value goes).
const TOKEN_SHAPES: readonly RegExp[] = [
  /\bhf_[A-Za-z0-9]{30,}\b/g,
  /\bsk-[A-Za-z0-9_-]{16,}/g,
  /\bllmgw-[A-Za-z0-9]+-[A-Za-z0-9_-]{16,}/g,
  /\bllmgw_[A-Za-z0-9_-]{16,}/g,
];
const BEARER = /\b(Bearer|Basic)\s+[A-Za-z0-9._~+/=-]{8,}/gi;
const ASSIGNMENT =
  /\b([A-Za-z0-9_-]*(?:api[_-]?key|token|secret|password|passwd|authorization)["']?\s*[:=]\s*["']?)(?!(?:Bearer|Basic)\s|\[redacted\])([^\s"',;&]{4,})/gi;

/** A function that scrubs one line. */
export type Redactor = (line: string) => string;

/**
 * Builds a redactor from the secret values the agent holds (HF_TOKEN, engine API keys, …):
 * every occurrence of each value (longest first, values shorter than 8 characters ignored —
 * too likely to match ordinary text) becomes {@link REDACTED}, then common token shapes do.
 */
export function createRedactor(secrets: Iterable<string>): Redactor {
  const values = [...new Set([...secrets].filter((s) => s.length >= 8))].sort(
    (a, b) => b.length - a.length,
  );
  return (line) => {
    let out = line;
    for (const value of values) out = out.replaceAll(value, REDACTED);
    for (const shape of TOKEN_SHAPES) out = out.replace(shape, REDACTED);
    out = out.replace(BEARER, (_, scheme: string) => `${scheme} ${REDACTED}`);
    out = out.replace(ASSIGNMENT, (_, name: string) => `${name}${REDACTED}`);
    return out;
  };
}

/** {@link createRedactor} applied to every line. */
export function redactLines(lines: readonly string[], secrets: Iterable<string>): string[] {
  const redact = createRedactor(secrets);
  return lines.map(redact);
}
