import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import {
  CLUSTER_FAMILIES,
  createClusterCollector,
  createControlPlaneMetrics,
  createMetricsRegistry,
  createRouterMetrics,
  createUsageMetrics,
  METRICS_REFERENCE_MARKERS,
  ROUTER_FAMILIES,
  ROUTER_PEER_FAMILIES,
  ROUTER_STATE_FAMILIES,
  renderMetricsReference,
} from "@llmgw/metrics-collector";
import { FakeClusterView, metricNamesInPromQL } from "@llmgw/metrics-collector/testing";
import { describe, expect, it } from "vitest";

// Formatters (biome formats Markdown) may pad table cells; compare modulo that padding.
const normalize = (text: string) =>
  text
    .split("\n")
    .map((l) => (l.startsWith("|") ? l.replace(/ {2,}/g, " ").replace(/-{3,}/g, "---") : l))
    .join("\n");

const doc = readFileSync(
  fileURLToPath(new URL("../../../docs/metrics.md", import.meta.url)),
  "utf8",
);

describe("docs/metrics.md", () => {
  it("has the generated section exactly as renderMetricsReference() renders it", () => {
    const start = doc.indexOf(METRICS_REFERENCE_MARKERS.begin);
    const end = doc.indexOf(METRICS_REFERENCE_MARKERS.end) + METRICS_REFERENCE_MARKERS.end.length;
    expect(start).toBeGreaterThan(0);
    expect(normalize(doc.slice(start, end)), "regenerate: see the command in docs/metrics.md").toBe(
      normalize(renderMetricsReference()),
    );
  });

  it("lists exactly the families registered, with their types and labels", async () => {
    const registry = createMetricsRegistry();
    createClusterCollector(registry, new FakeClusterView());
    createRouterMetrics(registry);
    createUsageMetrics(registry);
    createControlPlaneMetrics(registry);
    // The router-state and peer families are registered by @llmgw/router-server (apps/router),
    // which depends on this package; their specs are here, and apps/router reads names and help
    // from them.
    const registered = [
      ...(await registry.getMetricsAsJSON()).map((m) => `${m.name} ${m.type}`),
      ...[...ROUTER_STATE_FAMILIES, ...ROUTER_PEER_FAMILIES].map((f) => `${f.name} ${f.type}`),
    ].sort();
    const rows = [
      ...normalize(doc).matchAll(
        /^\| `(llmgw_[a-z_]+)` \| (counter|gauge|histogram) \| ([^|]*) \|/gm,
      ),
    ];
    expect(rows.map((r) => `${r[1]} ${r[2]}`).sort()).toEqual(registered);
    for (const metric of registry.getMetricsAsArray()) {
      const row = rows.find((r) => r[1] === metric.name)!;
      const documented =
        row[3]!.trim() === "—" ? [] : [...row[3]!.matchAll(/`([a-z_]+)`/g)].map((m) => m[1]);
      const labelNames = (metric as unknown as { labelNames: string[] }).labelNames;
      expect(documented, metric.name).toEqual(labelNames);
    }
  });

  it("only uses defined families in its example queries", () => {
    const defined = new Set(
      [...CLUSTER_FAMILIES, ...ROUTER_FAMILIES, ...ROUTER_STATE_FAMILIES].map((f) => f.name),
    );
    const text = normalize(doc);
    const section = text.slice(
      text.indexOf("## Useful queries"),
      text.indexOf(METRICS_REFERENCE_MARKERS.begin),
    );
    const queries = [...section.matchAll(/^\|[^|]+\| `(.+)` \|$/gm)].map((m) => m[1]!);
    expect(queries.length).toBeGreaterThanOrEqual(5);
    const used = new Set(queries.flatMap((q) => [...metricNamesInPromQL(q)]));
    expect([...used].filter((n) => !defined.has(n))).toEqual([]);
  });
});
