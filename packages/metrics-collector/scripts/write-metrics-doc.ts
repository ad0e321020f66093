// Rewrites the generated part of docs/metrics.md from the family catalogue.
// Run: npx tsx --conditions=@llmgw/source packages/metrics-collector/scripts/write-metrics-doc.ts
import { readFileSync, writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { METRICS_REFERENCE_MARKERS, renderMetricsReference } from "../src/metrics-doc.js";

const path = fileURLToPath(new URL("../../../docs/metrics.md", import.meta.url));
const text = readFileSync(path, "utf8");
const start = text.indexOf(METRICS_REFERENCE_MARKERS.begin);
const end = text.indexOf(METRICS_REFERENCE_MARKERS.end);
if (start < 0 || end < start) throw new Error(`${path} lacks the generated-section markers`);
const next =
  text.slice(0, start) +
  renderMetricsReference() +
  text.slice(end + METRICS_REFERENCE_MARKERS.end.length);
writeFileSync(path, next);
console.log(`updated ${path}`);
