import { escapeOutsideText } from "@llmgw/control-plane/client";

/**
 * Text from the cluster (an agent's hostname, a status message, an engine's log tail) made safe
 * to print to a terminal: within each line, control characters become visible escapes, so a
 * hostile agent cannot move the cursor, recolour the screen or forge a line of output. Line
 * breaks between lines are kept for multi-line text such as log tails.
 */
export function terminalText(text: string): string {
  return text.split("\n").map(escapeOutsideText).join("\n");
}

/**
 * Renders rows as a left-aligned text table with a header, two spaces between columns. Cells
 * are one line each: every control character in them, newlines included, is escaped.
 */
export function renderTable(
  headers: readonly string[],
  rows: readonly (readonly string[])[],
): string {
  const safe = rows.map((r) => r.map(escapeOutsideText));
  const widths = headers.map((h, i) => Math.max(h.length, ...safe.map((r) => (r[i] ?? "").length)));
  const line = (cells: readonly string[]) =>
    cells
      .map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i] ?? 0)))
      .join("  ")
      .trimEnd();
  return `${[line(headers), ...safe.map(line)].join("\n")}\n`;
}

/** "3s", "4m 05s", "2h 01m": how long ago / how long, for humans. */
export function formatDuration(ms: number): string {
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(s % 60).padStart(2, "0")}s`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h}h ${String(m % 60).padStart(2, "0")}m`;
  return `${Math.floor(h / 24)}d`;
}
