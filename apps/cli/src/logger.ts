/** A structured one-line logger for the daemons: `time level component message key=value…`. */
export interface ConsoleLogger {
  info(message: string, fields?: Record<string, unknown>): void;
  warn(message: string, fields?: Record<string, unknown>): void;
  error(message: string, fields?: Record<string, unknown>): void;
}

function formatFields(fields: Record<string, unknown> | undefined): string {
  if (!fields) return "";
  const parts: string[] = [];
  for (const [key, value] of Object.entries(fields)) {
    if (value === undefined) continue;
    const text = typeof value === "string" ? value : JSON.stringify(value);
    parts.push(`${key}=${/[\s"]/.test(text) ? JSON.stringify(text) : text}`);
  }
  return parts.length > 0 ? ` ${parts.join(" ")}` : "";
}

/** Writes log lines to `out` (stderr in the daemons). */
export function createConsoleLogger(
  out: { write(chunk: string): unknown },
  component: string,
): ConsoleLogger {
  const line = (level: string, message: string, fields?: Record<string, unknown>) => {
    out.write(
      `${new Date().toISOString()} ${level} ${component} ${message}${formatFields(fields)}\n`,
    );
  };
  return {
    info: (m, f) => line("INFO ", m, f),
    warn: (m, f) => line("WARN ", m, f),
    error: (m, f) => line("ERROR", m, f),
  };
}
