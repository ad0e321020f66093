/** One sample line of a Prometheus text exposition. */
export interface ParsedSample {
  readonly name: string;
  readonly labels: Readonly<Record<string, string>>;
  readonly value: number;
}

/** A parsed exposition: samples plus the `# TYPE` of each family. */
export interface ParsedExposition {
  readonly samples: readonly ParsedSample[];
  readonly types: ReadonlyMap<string, string>;
}

const SAMPLE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\d+)?$/s;
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?/gsy;

function unescapeLabelValue(v: string): string {
  return v.replace(/\\(.)/g, (_, c: string) => (c === "n" ? "\n" : c));
}

/**
 * Parses Prometheus text format 0.0.4 as prom-client writes it, for tests that compare
 * scrapes (here and in the integrator's live control-plane checks).
 * @throws Error naming the line when a sample line does not parse.
 */
export function parseExposition(text: string): ParsedExposition {
  const samples: ParsedSample[] = [];
  const types = new Map<string, string>();
  for (const line of text.split("\n")) {
    if (line.length === 0) continue;
    if (line.startsWith("#")) {
      const m = /^# TYPE (\S+) (\S+)$/.exec(line);
      if (m) types.set(m[1]!, m[2]!);
      continue;
    }
    const m = SAMPLE.exec(line);
    if (!m) throw new Error(`unparsable exposition line: ${line.slice(0, 200)}`);
    const labels: Record<string, string> = {};
    const body = m[3] ?? "";
    LABEL.lastIndex = 0;
    while (LABEL.lastIndex < body.length) {
      const start = LABEL.lastIndex;
      const l = LABEL.exec(body);
      if (!l || LABEL.lastIndex === start)
        throw new Error(`unparsable labels: ${line.slice(0, 200)}`);
      labels[l[1]!] = unescapeLabelValue(l[2]!);
    }
    const raw = m[4]!;
    const value =
      raw === "+Inf"
        ? Number.POSITIVE_INFINITY
        : raw === "-Inf"
          ? Number.NEGATIVE_INFINITY
          : Number(raw);
    samples.push({ name: m[1]!, labels, value });
  }
  return { samples, types };
}

/** Family names present in an exposition, with histogram `_bucket/_sum/_count` folded in. */
export function familyNamesInExposition(text: string): Set<string> {
  const { samples, types } = parseExposition(text);
  const names = new Set<string>();
  for (const s of samples) {
    const base = s.name.replace(/_(bucket|sum|count)$/, "");
    names.add(types.get(base) === "histogram" ? base : s.name);
  }
  return names;
}
