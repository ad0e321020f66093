import { UsageDimension, UsageGranularity, type UsageRow } from "@llmgw/proto";

/*
 * `llmgw usage`: parsing its flags and rendering its rows, pure. The command is in
 * commands/usage.ts.
 */

const UNIT_MS: Readonly<Record<string, number>> = {
  m: 60_000,
  h: 3_600_000,
  d: 86_400_000,
  w: 7 * 86_400_000,
};

/** `y-m-d` as epoch ms at 00:00 UTC, or undefined when it is not a calendar date. */
function utcDate(y: number, m: number, d: number): number | undefined {
  const ms = Date.UTC(y, m - 1, d);
  const back = new Date(ms);
  // 2026-02-30 is not a date, whatever Date.UTC (or Date.parse) makes of it: March 2.
  if (back.getUTCFullYear() !== y || back.getUTCMonth() !== m - 1 || back.getUTCDate() !== d)
    return undefined;
  return ms;
}

/** A time `--since`/`--until` accept, as epoch ms, or undefined when `text` is none of them. */
export function parseUsageTime(text: string, nowMs: number): number | undefined {
  const relative = /^(\d{1,6})([mhdw])$/.exec(text);
  if (relative) return nowMs - Number(relative[1]) * (UNIT_MS[relative[2] as string] as number);
  const date = /^(\d{4})-(\d{2})-(\d{2})$/.exec(text);
  if (date) return utcDate(Number(date[1]), Number(date[2]), Number(date[3]));
  const time =
    /^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):\d{2}(:\d{2}(\.\d{1,9})?)?([Zz]|[+-]\d{2}:\d{2})$/.exec(
      text,
    );
  if (time) {
    // Date.parse reads hour 24 as the next day's midnight; RFC 3339 has no hour 24.
    if (utcDate(Number(time[1]), Number(time[2]), Number(time[3])) === undefined) return undefined;
    if (Number(time[4]) > 23) return undefined;
    const ms = Date.parse(text.replace(" ", "T"));
    return Number.isNaN(ms) ? undefined : ms;
  }
  return undefined;
}

/** What `--since` and `--until` accept, for messages. */
export const USAGE_TIME_FORMS =
  "a duration back from now (30m, 24h, 7d, 2w), a UTC date (2026-12-01) or an RFC 3339 time (2026-12-01T10:00:00Z)";

const GRANULARITY: Readonly<Record<string, UsageGranularity>> = {
  minute: UsageGranularity.MINUTE,
  hour: UsageGranularity.HOUR,
  day: UsageGranularity.DAY,
};

/** `--by minute|hour|day`, or undefined for anything else. */
export function parseUsageGranularity(text: string): UsageGranularity | undefined {
  return GRANULARITY[text];
}

const DIMENSION: Readonly<Record<string, UsageDimension>> = {
  tenant: UsageDimension.TENANT,
  key: UsageDimension.KEY,
  model: UsageDimension.MODEL,
};

/** `--group tenant,key,model` (any of them, each once), or undefined when it is not that. */
export function parseUsageGroups(text: string): UsageDimension[] | undefined {
  const parts = text.split(",").map((p) => p.trim());
  const dims = parts.map((p) => DIMENSION[p]);
  if (dims.some((d) => d === undefined) || new Set(parts).size !== parts.length) return undefined;
  return dims as UsageDimension[];
}

/** The dimensions a table shows: those asked for, else tenant and model (the server's default). */
export function shownDimensions(groups: readonly UsageDimension[]): Set<UsageDimension> {
  return new Set(groups.length === 0 ? [UsageDimension.TENANT, UsageDimension.MODEL] : groups);
}

/** A row's period start as the granularity reads: "2026-12-03", "2026-12-03 10:00". */
export function formatUsagePeriod(startMs: number, granularity: UsageGranularity): string {
  const iso = new Date(startMs).toISOString();
  return granularity === UsageGranularity.MINUTE || granularity === UsageGranularity.HOUR
    ? `${iso.slice(0, 10)} ${iso.slice(11, 16)}`
    : iso.slice(0, 10);
}

const COUNT_HEADERS = [
  "REQUESTS",
  "PROMPT",
  "CACHED",
  "COMPLETION",
  "GPU-SECONDS",
  "ESTIMATED",
  "REFUSED",
] as const;

/** What {@link counts} shows of a row or of the total. */
interface Counts {
  requests: bigint;
  promptTokens: bigint;
  cachedTokens: bigint;
  cachedReportedRequests: bigint;
  completionTokens: bigint;
  gpuSeconds: number;
  estimatedRequests: bigint;
  refusedUsage: bigint;
}

function counts(r: Counts): string[] {
  return [
    String(r.requests),
    String(r.promptTokens),
    // "-" where no engine reported them: unknown, not 0.
    r.cachedReportedRequests === 0n ? "-" : String(r.cachedTokens),
    String(r.completionTokens),
    r.gpuSeconds.toFixed(1),
    String(r.estimatedRequests),
    String(r.refusedUsage),
  ];
}

/**
 * The table `llmgw usage` prints: a column per dimension shown (TENANT "-" for keys without
 * one; KEY by name, or id when the key has none), the counts, and a TOTAL row over all rows.
 */
export function usageTable(
  rows: readonly UsageRow[],
  groups: readonly UsageDimension[],
  granularity: UsageGranularity,
): { headers: string[]; rows: string[][] } {
  const shown = shownDimensions(groups);
  const dims: [UsageDimension, string, (r: UsageRow) => string][] = [
    [UsageDimension.TENANT, "TENANT", (r) => r.tenant || "-"],
    [UsageDimension.KEY, "KEY", (r) => r.keyName || r.keyId],
    [UsageDimension.MODEL, "MODEL", (r) => r.model],
  ];
  const kept = dims.filter(([d]) => shown.has(d));
  const total: Counts = {
    requests: 0n,
    promptTokens: 0n,
    cachedTokens: 0n,
    cachedReportedRequests: 0n,
    completionTokens: 0n,
    gpuSeconds: 0,
    estimatedRequests: 0n,
    refusedUsage: 0n,
  };
  const body = rows.map((r) => {
    total.requests += r.requests;
    total.promptTokens += r.promptTokens;
    total.cachedTokens += r.cachedTokens;
    total.cachedReportedRequests += r.cachedReportedRequests;
    total.completionTokens += r.completionTokens;
    total.gpuSeconds += r.gpuSeconds;
    total.estimatedRequests += r.estimatedRequests;
    total.refusedUsage += r.refusedUsage;
    return [
      formatUsagePeriod(Number(r.startUnixMs), granularity),
      ...kept.map(([, , cell]) => cell(r)),
      ...counts(r),
    ];
  });
  return {
    headers: ["PERIOD", ...kept.map(([, h]) => h), ...COUNT_HEADERS],
    rows: [...body, ["TOTAL", ...kept.map(() => ""), ...counts(total)]],
  };
}

/** The columns of `llmgw usage --csv`, always all of them (empty where not grouped by). */
export const USAGE_CSV_COLUMNS = [
  "period_start",
  "tenant",
  "key_id",
  "key_name",
  "model",
  "requests",
  "prompt_tokens",
  "cached_tokens",
  "completion_tokens",
  "gpu_seconds",
  "estimated_requests",
  "refused_usage",
  "cached_reported_requests",
] as const;

/** One CSV field (RFC 4180): quoted when it holds a comma, a quote, CR or LF; quotes doubled. */
export function csvField(value: string): string {
  return /[",\r\n]/.test(value) ? `"${value.replaceAll('"', '""')}"` : value;
}

/**
 * A name field (tenant, key id or name, model) as {@link csvField}, first defused for
 * spreadsheets: a value starting with `=`, `+`, `-`, `@`, a tab or CR is one Excel, LibreOffice
 * and Google Sheets run as a formula when the file is opened (`=HYPERLINK(…)`, DDE), and a
 * model name reaches usage rows from routers' reports, so it is prefixed with `'`, which
 * they show as text. Counts and times are ours and never need it.
 */
export function csvText(value: string): string {
  return csvField(/^[=+\-@\t\r]/.test(value) ? `'${value}` : value);
}

/**
 * `rows` as RFC 4180 CSV: a header row, CRLF line ends, period starts in RFC 3339 (UTC), names
 * that a spreadsheet would read as a formula prefixed with `'` ({@link csvText}).
 */
export function usageCsv(rows: readonly UsageRow[]): string {
  const lines = [USAGE_CSV_COLUMNS.join(",")];
  for (const r of rows) {
    lines.push(
      [
        csvField(new Date(Number(r.startUnixMs)).toISOString()),
        ...[r.tenant, r.keyId, r.keyName, r.model].map(csvText),
        ...[
          r.requests,
          r.promptTokens,
          // Empty where no engine reported them: unknown, not 0.
          r.cachedReportedRequests === 0n ? "" : r.cachedTokens,
          r.completionTokens,
          r.gpuSeconds,
          r.estimatedRequests,
          r.refusedUsage,
          r.cachedReportedRequests,
        ].map((n) => csvField(String(n))),
      ].join(","),
    );
  }
  return `${lines.join("\r\n")}\r\n`;
}
