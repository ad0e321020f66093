import {
  type CachedLabels,
  formatLabelPairs,
  LabelCache,
  NO_LABELS,
  type SeriesSink,
  walkClusterSeries,
  walkClusterSeriesYielding,
  type YieldingWalkOptions,
} from "./cluster-series.js";
import type { ClusterView } from "./cluster-view.js";
import { CLUSTER_FAMILIES, isViewFamily } from "./families.js";
import { LineWriter } from "./line-writer.js";

/**
 * The cluster families rendered as text: every gauge of `CLUSTER_FAMILIES` and the counters
 * the view holds (the other counters stay on prom-client).
 */
export const CLUSTER_TEXT_FAMILIES: readonly string[] = CLUSTER_FAMILIES.filter(isViewFamily).map(
  (f) => f.name,
);

const escapeHelp = (s: string) => s.replace(/\\/g, "\\\\").replace(/\n/g, "\\n");

/** `# HELP` and `# TYPE` lines of each text family, written once. */
const HEADERS: ReadonlyMap<string, string> = new Map(
  CLUSTER_FAMILIES.filter(isViewFamily).map((f) => [
    f.name,
    `# HELP ${f.name} ${escapeHelp(f.help)}\n# TYPE ${f.name} ${f.type}`,
  ]),
);

/**
 * Joins family blocks exactly as prom-client 15 does: `# HELP`, `# TYPE`, the sample lines,
 * blocks separated by a blank line, a final newline; a family without samples is its two
 * header lines.
 */
function joinBlocks(lines: ReadonlyMap<string, LineWriter>): string {
  let out = "";
  for (const [name, header] of HEADERS) {
    out += `${out.length === 0 ? "" : "\n"}${header}\n${lines.get(name)?.text() ?? ""}`;
  }
  return out;
}

/** {@link joinBlocks} as UTF-8 bytes: no string is built, each writer's bytes copied once. */
function joinBlockBytes(lines: ReadonlyMap<string, LineWriter>): Buffer {
  const parts: Buffer[] = [];
  for (const [name, header] of HEADERS) {
    parts.push(Buffer.from(`${parts.length === 0 ? "" : "\n"}${header}\n`, "utf8"));
    const own = lines.get(name);
    if (own !== undefined) parts.push(own.bytes());
  }
  return Buffer.concat(parts);
}

/** Empties the cache's per-family writers (reused: no memory grows per scrape). */
function resetWriters(cache: LabelCache): Map<string, LineWriter> {
  const lines = cache.writers;
  for (const name of HEADERS.keys()) {
    const w = lines.get(name);
    if (w === undefined) lines.set(name, new LineWriter());
    else w.reset();
  }
  return lines;
}

/** Walks the view into the cache's per-family writers. */
function writeClusterLines(
  view: ClusterView,
  labelValueMaxLength: number,
  cache: LabelCache,
): ReadonlyMap<string, LineWriter> {
  const lines = resetWriters(cache);
  walkClusterSeries(view, labelValueMaxLength, cache, lineSink(lines));
  return lines;
}

/** The sink writing each sample as one text line into its family's writer. */
function lineSink(lines: ReadonlyMap<string, LineWriter>): SeriesSink {
  // Samples render as `name{` + (family labels + `,`) + shared labels + `} ` + value + `\n`,
  // the same bytes prom-client writes (its order: the sample's own labels, then shared).
  return {
    plain(name, labels, value) {
      if (!Number.isFinite(value)) return;
      const pairs = formatLabelPairs(labels);
      (lines.get(name) as LineWriter).write(
        pairs.length === 0 ? `${name} ${value}\n` : `${name}{${pairs}} ${value}\n`,
      );
    },
    shared(name: string, shared: CachedLabels, extra, value) {
      if (!Number.isFinite(value)) return;
      // One short-lived string per line (dies young; only the bytes outlive the walk).
      (lines.get(name) as LineWriter).write(
        extra === NO_LABELS
          ? `${name}{${shared.text}} ${value}\n`
          : `${name}{${formatLabelPairs(extra)},${shared.text}} ${value}\n`,
      );
    },
  };
}

/**
 * The cluster gauge families (`CLUSTER_TEXT_FAMILIES`) of `view` as Prometheus text format
 * 0.0.4, rendered directly instead of through prom-client's registry loop (bench/metrics:
 * about half the CPU at 76k samples). Same samples, labels and value formatting as
 * `createClusterCollector`'s registry path, byte for byte per family. `cache` keeps each
 * node's and GPU's rendered label text and the render buffers across scrapes (pass the same
 * one every scrape; not for concurrent use, which a synchronous call cannot have anyway).
 * @throws whatever the view throws; `createClusterCollector` turns that into empty families.
 */
export function renderClusterText(
  view: ClusterView,
  labelValueMaxLength: number,
  cache: LabelCache = new LabelCache(),
): string {
  return joinBlocks(writeClusterLines(view, labelValueMaxLength, cache));
}

/**
 * {@link renderClusterText} as UTF-8 bytes, for a handler that sends bytes anyway: skips
 * building the 6 MB string and encoding it again (bench/metrics: "bytes" rows).
 */
export function renderClusterBytes(
  view: ClusterView,
  labelValueMaxLength: number,
  cache: LabelCache = new LabelCache(),
): Buffer {
  return joinBlockBytes(writeClusterLines(view, labelValueMaxLength, cache));
}

/**
 * {@link renderClusterBytes} without holding the event loop: the walk pauses every
 * `sliceMs` (default 5 ms; see `walkClusterSeriesYielding`), so heartbeats are answered
 * during a fleet-sized scrape. Same bytes. `cache` must not be used by another render until
 * the promise settles.
 * @throws (rejects with) whatever the view throws.
 */
export async function renderClusterBytesYielding(
  view: ClusterView,
  labelValueMaxLength: number,
  cache: LabelCache,
  options?: YieldingWalkOptions,
): Promise<Buffer> {
  const lines = resetWriters(cache);
  await walkClusterSeriesYielding(view, labelValueMaxLength, cache, lineSink(lines), options);
  return joinBlockBytes(lines);
}

/** The text of every cluster gauge family with no samples (a scrape whose view failed). */
export function renderEmptyClusterText(): string {
  return joinBlocks(new Map());
}
