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
import { type LentBlock, LineWriter } from "./line-writer.js";

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

/** Each family's header lines as bytes, with the blank line before every block but the first. */
const HEADER_BYTES: readonly (readonly [string, Buffer])[] = [...HEADERS].map(
  ([name, header], i) => [name, Buffer.from(`${i === 0 ? "" : "\n"}${header}\n`, "utf8")],
);

/** {@link joinBlocks} as UTF-8 bytes: no string is built, each writer's bytes copied once. */
function joinBlockBytes(lines: ReadonlyMap<string, LineWriter>): Buffer {
  const parts: Buffer[] = [];
  for (const [name, header] of HEADER_BYTES) {
    parts.push(header);
    const own = lines.get(name);
    if (own !== undefined) parts.push(own.bytes());
  }
  return Buffer.concat(parts);
}

/**
 * Bytes of an exposition in the order they are sent, lent from the render's buffers: send
 * `chunks` one after the other (their sizes add up to `byteLength`), then call `release`
 * once, when they are sent (after the response's `close`), so the next scrape writes into
 * the same memory. Not releasing is safe, only slower.
 */
export interface LentExposition {
  readonly chunks: readonly Buffer[];
  readonly byteLength: number;
  release(): void;
}

/** {@link joinBlockBytes} without the copy: the header bytes and each writer's lent block. */
function lendBlocks(lines: ReadonlyMap<string, LineWriter>): LentExposition {
  const chunks: Buffer[] = [];
  const lent: [LineWriter, LentBlock][] = [];
  let byteLength = 0;
  for (const [name, header] of HEADER_BYTES) {
    chunks.push(header);
    byteLength += header.length;
    const own = lines.get(name);
    if (own === undefined || own.length === 0) continue;
    const block = own.lend();
    lent.push([own, block]);
    chunks.push(block.bytes);
    byteLength += block.bytes.length;
  }
  let released = false;
  return {
    chunks,
    byteLength,
    release() {
      if (released) return;
      released = true;
      for (const [w, block] of lent) w.giveBack(block);
    },
  };
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
  const sink = lineSink(lines, cache);
  walkClusterSeries(view, labelValueMaxLength, cache, sink);
  sink.flush();
  return lines;
}

/**
 * The sink writing each sample as one text line into its family's writer, and keeping (in
 * `cache.fixedBlocks`) each node's fixed samples as bytes, written again as they are for as
 * long as the walk says the node's fixed fields are unchanged. Lines of a node's or GPU's
 * label set without extra labels (its readings above all) keep `name{labels} ` as bytes and
 * the last value's text on the label set: such a line is two copies, no string built.
 */
function lineSink(
  lines: ReadonlyMap<string, LineWriter>,
  cache: LabelCache,
): SeriesSink & { flush(): void } {
  // Samples render as `name{` + (family labels + `,`) + shared labels + `} ` + value + `\n`,
  // the same bytes prom-client writes (its order: the sample's own labels, then shared).
  // While a node's fixed samples are handed over: where each family's writer stood before
  // its first line of them (a node's lines of one family are contiguous).
  let capture: Map<LineWriter, number> | undefined;
  // Consecutive lines of one family are joined and written at once: one short string and
  // one write per run instead of per line (the walk hands over a node's readings family by
  // family); the string dies young.
  let runName = "";
  let run = "";
  const flush = () => {
    if (run.length === 0) return;
    const w = lines.get(runName) as LineWriter;
    if (capture !== undefined && !capture.has(w)) capture.set(w, w.length);
    w.write(run);
    run = "";
  };
  const write = (name: string, line: string) => {
    if (name !== runName) {
      flush();
      runName = name;
    }
    run += line;
  };
  return {
    flush,
    plain(name, labels, value) {
      if (!Number.isFinite(value)) return;
      const pairs = formatLabelPairs(labels);
      write(name, pairs.length === 0 ? `${name} ${value}\n` : `${name}{${pairs}} ${value}\n`);
    },
    shared(name: string, shared: CachedLabels, extra, value) {
      if (!Number.isFinite(value)) return;
      if (extra !== NO_LABELS) {
        write(name, `${name}{${formatLabelPairs(extra)},${shared.text}} ${value}\n`);
        return;
      }
      let line = shared.lines.get(name);
      if (line === undefined) {
        line = {
          prefix: Buffer.from(`${name}{${shared.text}} `, "utf8"),
          value,
          text: `${value}`,
        };
        shared.lines.set(name, line);
      } else if (line.value !== value) {
        line.value = value;
        line.text = `${value}`;
      }
      flush();
      const w = lines.get(name) as LineWriter;
      if (capture !== undefined && !capture.has(w)) capture.set(w, w.length);
      w.writeLine(line.prefix, line.text);
    },
    fixedSamples(memo, unchanged) {
      flush();
      const kept = unchanged ? cache.fixedBlocks.get(memo) : undefined;
      if (kept === undefined) {
        capture = new Map();
        return false;
      }
      for (const [w, bytes] of kept) w.writeBytes(bytes);
      return true;
    },
    fixedSamplesEnd(memo) {
      flush();
      const kept: [LineWriter, Buffer][] = [];
      for (const [w, start] of capture ?? []) kept.push([w, w.copyFrom(start)]);
      cache.fixedBlocks.set(memo, kept);
      capture = undefined;
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
  return joinExposition(
    await renderClusterChunksYielding(view, labelValueMaxLength, cache, options),
  );
}

/**
 * {@link renderClusterBytesYielding} as lent chunks, for a server that writes them to its
 * socket as they are: the same bytes, never joined into one buffer. `cache` may render again
 * before the chunks are released (its writers go on in other memory).
 * @throws (rejects with) whatever the view throws.
 */
export async function renderClusterChunksYielding(
  view: ClusterView,
  labelValueMaxLength: number,
  cache: LabelCache,
  options?: YieldingWalkOptions,
): Promise<LentExposition> {
  const lines = resetWriters(cache);
  const sink = lineSink(lines, cache);
  await walkClusterSeriesYielding(view, labelValueMaxLength, cache, sink, options);
  sink.flush();
  return lendBlocks(lines);
}

/** A lent exposition's chunks copied into one buffer, released at once (for callers of bytes). */
export function joinExposition(lent: LentExposition): Buffer {
  const bytes = Buffer.concat(lent.chunks, lent.byteLength);
  lent.release();
  return bytes;
}

/** `bytes` as a {@link LentExposition} that lends nothing (its release does nothing). */
export function unlentExposition(bytes: Buffer): LentExposition {
  return { chunks: bytes.length === 0 ? [] : [bytes], byteLength: bytes.length, release() {} };
}

/** The text of every cluster gauge family with no samples (a scrape whose view failed). */
export function renderEmptyClusterText(): string {
  return joinBlocks(new Map());
}
