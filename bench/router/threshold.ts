/**
 * Measures where the worker pool starts paying for itself: main-thread time per request to
 * analyse a chat body inline vs to hand it to the pool (copy into a reused buffer, transfer,
 * await, read back), by body size. Main-thread time in pool mode comes from event-loop
 * utilisation (active time), so the workers' own CPU is not counted.
 *
 *   npx tsx --conditions=@llmgw/source bench/router/threshold.ts
 */
import { performance } from "node:perf_hooks";
import { createRequestAnalyzer } from "@llmgw/router";
import { formatTable } from "../lib/table.js";

const sizes = [1024, 4096, 8192, 16_384, 32_768, 65_536, 131_072, 262_144];
const inline = createRequestAnalyzer({ pool: false });
const pooled = createRequestAnalyzer({
  inlineThresholdBytes: 0,
  pool: { minThreads: 2, maxThreads: 2, concurrentTasksPerWorker: 16 },
});

const body = (bytes: number) => {
  const text = "The quick brown fox jumps over the lazy dog. "
    .repeat(Math.ceil(bytes / 45))
    .slice(0, bytes);
  return Buffer.from(
    JSON.stringify({
      model: "m",
      messages: [
        { role: "system", content: text },
        { role: "user", content: "hi" },
      ],
    }),
  );
};

const rows: (string | number)[][] = [];
const results: Record<string, unknown>[] = [];
for (const size of sizes) {
  const b = body(size);
  const n = Math.max(200, Math.min(3000, Math.floor(40_000_000 / size)));
  for (let i = 0; i < 50; i++) await inline.analyze(b);
  let t = performance.now();
  for (let i = 0; i < n; i++) inline.analyze(b);
  const inlineUs = ((performance.now() - t) * 1000) / n;

  for (let i = 0; i < 50; i++) await pooled.analyze(b);
  const elu0 = performance.eventLoopUtilization();
  t = performance.now();
  let next = 0;
  const lane = async () => {
    while (next++ < n) await pooled.analyze(b);
  };
  await Promise.all(Array.from({ length: 16 }, lane));
  const wallMs = performance.now() - t;
  const elu = performance.eventLoopUtilization(elu0);
  const poolMainUs = (elu.active * 1000) / n;
  rows.push([
    size,
    n,
    inlineUs.toFixed(1),
    poolMainUs.toFixed(1),
    ((n / wallMs) * 1000).toFixed(0),
  ]);
  results.push({
    bodyBytes: size,
    n,
    inlineMainThreadUs: inlineUs,
    poolMainThreadUs: poolMainUs,
    poolReqPerS: (n / wallMs) * 1000,
  });
}
await pooled.close();
console.log(
  formatTable(["body bytes", "n", "inline µs (main)", "pool µs (main)", "pool req/s"], rows),
);
console.log(JSON.stringify({ bench: "router-threshold", node: process.version, results }, null, 2));
