/** One sample of the Prometheus text exposition format. */
export interface PrometheusSample {
  /** Metric name as written, suffix included (`…_total`, `…_bucket`, `…_created`). */
  readonly name: string;
  /** Label values by name (order on the wire is irrelevant). */
  readonly labels: Readonly<Record<string, string>>;
  /** May be NaN or ±Infinity, as the format allows. */
  readonly value: number;
  /** Optional sample timestamp in ms. */
  readonly timestampMs?: number;
}

const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*/;

/**
 * Parses Prometheus text exposition (version 0.0.4) into samples. Pure and total: it never
 * throws; comment, blank and malformed lines are skipped.
 */
export function parsePrometheusText(text: string): PrometheusSample[] {
  const samples: PrometheusSample[] = [];
  for (const rawLine of text.split("\n")) {
    const line = rawLine.trim();
    if (line === "" || line.startsWith("#")) continue;
    const sample = parseSampleLine(line);
    if (sample !== undefined) samples.push(sample);
  }
  return samples;
}

function parseSampleLine(line: string): PrometheusSample | undefined {
  const nameMatch = NAME.exec(line);
  if (nameMatch === null) return undefined;
  const name = nameMatch[0];
  let pos = name.length;
  const labels: [string, string][] = [];
  if (line[pos] === "{") {
    pos++;
    for (;;) {
      pos = skipSpaces(line, pos);
      if (line[pos] === "}") {
        pos++;
        break;
      }
      const labelMatch = LABEL_NAME.exec(line.slice(pos));
      if (labelMatch === null) return undefined;
      pos = skipSpaces(line, pos + labelMatch[0].length);
      if (line[pos] !== "=") return undefined;
      pos = skipSpaces(line, pos + 1);
      if (line[pos] !== '"') return undefined;
      pos++;
      let value = "";
      for (;;) {
        const ch = line[pos];
        if (ch === undefined) return undefined;
        if (ch === "\\") {
          const next = line[pos + 1];
          if (next === undefined) return undefined;
          value += next === "n" ? "\n" : next;
          pos += 2;
        } else if (ch === '"') {
          pos++;
          break;
        } else {
          value += ch;
          pos++;
        }
      }
      labels.push([labelMatch[0], value]);
      pos = skipSpaces(line, pos);
      if (line[pos] === ",") pos++;
      else if (line[pos] !== "}") return undefined;
    }
  }
  const rest = line.slice(pos).trim().split(/\s+/);
  if (rest.length < 1 || rest.length > 2 || rest[0] === "" || pos === line.length) return undefined;
  if (line[pos] !== " " && line[pos] !== "\t") return undefined;
  const value = parseValue(rest[0]!);
  if (value === undefined) return undefined;
  const sample: {
    name: string;
    labels: Record<string, string>;
    value: number;
    timestampMs?: number;
  } = {
    name,
    labels: Object.fromEntries(labels),
    value,
  };
  if (rest[1] !== undefined) {
    const ts = Number(rest[1]);
    if (!Number.isFinite(ts)) return undefined;
    sample.timestampMs = ts;
  }
  return sample;
}

function skipSpaces(line: string, pos: number): number {
  let p = pos;
  while (line[p] === " " || line[p] === "\t") p++;
  return p;
}

function parseValue(token: string): number | undefined {
  switch (token) {
    case "NaN":
      return Number.NaN;
    case "+Inf":
    case "Inf":
      return Number.POSITIVE_INFINITY;
    case "-Inf":
      return Number.NEGATIVE_INFINITY;
  }
  if (!/^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/.test(token)) return undefined;
  return Number(token);
}
