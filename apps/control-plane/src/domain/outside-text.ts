/**
 * C0 and C1 controls, DEL, and the Unicode line and paragraph separators: everything a
 * terminal, a log shipper or a JSON-lines reader may take as the end of a line or a command.
 * And the bidirectional formatting characters (marks, embeddings, overrides, isolates), which
 * reorder how the rest of a line is shown: a node name holding U+202E could make a table row
 * or an event read as something else than it says ("Trojan Source", CVE-2021-42574).
 */
const CONTROL = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]/g;

const NAMED: Readonly<Record<string, string>> = { "\n": "\\n", "\r": "\\r", "\t": "\\t" };

function escapeOne(ch: string): string {
  return NAMED[ch] ?? `\\u${(ch.codePointAt(0) as number).toString(16).padStart(4, "0")}`;
}

/**
 * Text that came from outside (an agent's hostname, a problem message, an engine's log
 * tail), made safe to put into one log line or event message: control characters become
 * visible escapes (`\n`, `\r`, `\t`, `\u001b`, `\u2028`…), so a hostname such as
 * `"gpu1\n[cp] admin login"` cannot forge a second line. Everything else is kept as is.
 */
export function escapeOutsideText(text: string): string {
  return text.replace(CONTROL, escapeOne);
}
