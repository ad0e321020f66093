/**
 * Body analysis cost per request, by body size, side by side in one process:
 *
 * - **JSON.parse** (`analyzeByParsing`): decode the body, `JSON.parse`, walk the object
 *   (`features.ts`), hash the prompt pieces;
 * - **scan** (`analyzeByScanning`): the validating byte scanner, hashing straight from the body.
 *
 * `analyzeRequestBody` picks the first below `SCAN_THRESHOLD_BYTES` and the second from there
 * on; this table is what that threshold rests on.
 *
 * Prompts are prose with a newline every ~80 characters (escaped `\n` in JSON, as real prompts
 * are), plus one ASCII-only row and one non-ASCII row. Medians of 5 rounds.
 *
 *   node --conditions=@llmgw/source --import tsx bench/router/scan.ts [--quick]
 */
import { parseArgs } from "node:util";
import { analyzeByParsing, analyzeByScanning, SCAN_THRESHOLD_BYTES } from "@llmgw/router";
import { median } from "../lib/load.js";
import { printReport } from "../lib/report.js";
import { formatTable } from "../lib/table.js";

const { values: flags } = parseArgs({ options: { quick: { type: "boolean", default: false } } });
const quick = flags.quick === true;
const rounds = quick ? 1 : 5;

const line = "The quick brown fox jumps over the lazy dog while the router reads its prompt.\n";
const prose = (bytes: number, unit = line): string =>
  unit.repeat(Math.ceil(bytes / unit.length)).slice(0, bytes);
const chat = (content: string): Buffer =>
  Buffer.from(
    JSON.stringify({
      model: "m",
      max_tokens: 16,
      messages: [
        { role: "system", content },
        { role: "user", content: "Summarise." },
      ],
    }),
  );
const cases: { name: string; body: Buffer }[] = [
  { name: "chat 361 B", body: chat("Say something short about routers, please.") },
  { name: "4 KB prose", body: chat(prose(4_000)) },
  { name: "64 KB prose", body: chat(prose(64_000)) },
  { name: "100 KB prose", body: chat(prose(100_000)) },
  { name: "100 KB prose + one emoji", body: chat(`${prose(100_000)}😀`) },
  { name: "200 KB prose", body: chat(prose(200_000)) },
  {
    name: "200 KB no escapes",
    body: chat("You are a careful reader. ".repeat(8000).slice(0, 200_000)),
  },
  {
    name: "200 KB non-ASCII",
    body: chat(prose(100_000, "Le routeur lit l'invite écrite en français — 日本語も。\n")),
  },
  { name: "1 MB prose", body: chat(prose(1_000_000)) },
];

const viaParse = (body: Buffer) => {
  const a = analyzeByParsing(body);
  return a.ok ? a.chain.length : -1;
};
const viaScan = (body: Buffer) => {
  const a = analyzeByScanning(body);
  return a.ok ? a.chain.length : -1;
};

/** µs per call, measured over at least ~0.3 s (0.05 s quick). */
function measure(f: (b: Buffer) => number, body: Buffer): number {
  const budgetMs = quick ? 50 : 300;
  for (let i = 0; i < 20; i++) f(body);
  let calls = 0;
  const t0 = performance.now();
  while (performance.now() - t0 < budgetMs) {
    f(body);
    calls++;
  }
  return ((performance.now() - t0) * 1000) / calls;
}

const rows: (string | number)[][] = [];
const results: Record<string, { parseUs: number; scanUs: number }> = {};
for (const c of cases) {
  if (viaParse(c.body) !== viaScan(c.body)) throw new Error(`${c.name}: the two disagree`);
  const parse: number[] = [];
  const scan: number[] = [];
  for (let r = 0; r < rounds; r++) {
    // Alternate which goes first so neither always runs on a warmer heap.
    if (r % 2 === 0) {
      parse.push(measure(viaParse, c.body));
      scan.push(measure(viaScan, c.body));
    } else {
      scan.push(measure(viaScan, c.body));
      parse.push(measure(viaParse, c.body));
    }
  }
  const p = median(parse);
  const s = median(scan);
  results[c.name] = { parseUs: p, scanUs: s };
  rows.push([
    c.name,
    c.body.length,
    p.toFixed(1),
    s.toFixed(1),
    (p / s).toFixed(2),
    c.body.length < SCAN_THRESHOLD_BYTES ? "JSON.parse" : "scan",
  ]);
}

const big = results["200 KB prose"];
printReport(
  "router-scan",
  formatTable(["body", "bytes", "JSON.parse µs", "scan µs", "parse ÷ scan", "router uses"], rows),
  big === undefined
    ? []
    : [
        {
          goal: "200 KB prompt analysed at least 2× faster than with JSON.parse",
          measured: `${(big.parseUs / big.scanUs).toFixed(2)}× (${big.parseUs.toFixed(0)} → ${big.scanUs.toFixed(0)} µs)`,
          met: big.parseUs / big.scanUs >= 2,
        },
      ],
  { bench: "router-scan", rounds, node: process.version, results },
);
