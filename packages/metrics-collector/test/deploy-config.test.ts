import { spawnSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import {
  CLUSTER_FAMILIES,
  CONTROL_PLANE_FAMILIES,
  createClusterCollector,
  createControlPlaneMetrics,
  createMetricsRegistry,
  createRouterMetrics,
  createUsageMetrics,
  ROUTER_FAMILIES,
  ROUTER_STATE_FAMILIES,
  USAGE_FAMILIES,
} from "@llmgw/metrics-collector";
import {
  buildSyntheticCluster,
  exerciseRouterMetrics,
  familyNamesInExposition,
  metricNamesInPromQL,
  promQLInDashboard,
} from "@llmgw/metrics-collector/testing";
import { describe, expect, it } from "vitest";
import { buildDashboards, dashboardText } from "../../../deploy/grafana/dashboards.js";

const root = fileURLToPath(new URL("../../../", import.meta.url));
const dashboardsDir = `${root}deploy/grafana/dashboards/`;
const rulesFile = `${root}deploy/prometheus/llmgw-rules.yml`;

/** A scrape over a realistic fake cluster with router traffic recorded. */
async function scrapedFamilies(): Promise<Set<string>> {
  const registry = createMetricsRegistry();
  createClusterCollector(
    registry,
    buildSyntheticCluster({ nodes: 30, gpusPerNode: 8, replicas: 20 }),
  );
  exerciseRouterMetrics(
    createRouterMetrics(registry, { workerPool: () => ({ utilizationRatio: 0.1, queueSize: 0 }) }),
  );
  // Usage families are the control plane's, counted from stored usage batches.
  createUsageMetrics(registry).add("search", "chat", {
    requests: 3,
    promptTokens: 300,
    cachedTokens: 100,
    cachedReported: 3,
    completionTokens: 90,
    gpuMs: 2_500,
    estimatedRequests: 1,
    refusedUsage: 1,
  });
  // The leader's own work.
  createControlPlaneMetrics(registry).reconciled(0.004);
  const families = familyNamesInExposition(await registry.metrics());
  // Registered by each router (@llmgw/router-server, which depends on this package) from this
  // catalogue; the live-dashboards test finds them in a real control plane's scrape.
  for (const f of ROUTER_STATE_FAMILIES) families.add(f.name);
  return families;
}

/**
 * The `expr` and `record` values of the rules file. A tiny reader for the two shapes used
 * there (`expr: one line` and `expr: |` blocks), since this package has no YAML dependency;
 * `promtool check config` below validates the file for real.
 */
function readRules(): { exprs: string[]; records: Set<string> } {
  const lines = readFileSync(rulesFile, "utf8").split("\n");
  const exprs: string[] = [];
  const records = new Set<string>();
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!;
    const record = /^\s*- record: (\S+)\s*$/.exec(line);
    if (record) records.add(record[1]!);
    const expr = /^(\s*)expr: (.*)$/.exec(line);
    if (!expr) continue;
    if (expr[2]!.trim() !== "|") {
      exprs.push(expr[2]!);
      continue;
    }
    const block: string[] = [];
    const indent = expr[1]!.length;
    while (
      i + 1 < lines.length &&
      (lines[i + 1]!.trim() === "" || lines[i + 1]!.search(/\S/) > indent)
    )
      block.push(lines[++i]!);
    exprs.push(block.join("\n"));
  }
  return { exprs, records };
}

describe("Grafana dashboards", () => {
  const files = readdirSync(dashboardsDir)
    .filter((f) => f.endsWith(".json"))
    .sort();

  it("are the three generated from deploy/grafana/dashboards.ts, byte for byte", () => {
    const built = buildDashboards();
    expect(files).toEqual(Object.keys(built).sort());
    for (const [file, d] of Object.entries(built)) {
      expect(
        readFileSync(`${dashboardsDir}${file}`, "utf8"),
        `${file}: run npx tsx deploy/grafana/dashboards.ts`,
      ).toBe(dashboardText(d));
    }
  });

  it.each(files)(
    "%s only queries families that a scrape of the collector contains",
    async (file) => {
      const scraped = await scrapedFamilies();
      const dashboard = JSON.parse(readFileSync(`${dashboardsDir}${file}`, "utf8")) as unknown;
      const exprs = promQLInDashboard(dashboard);
      expect(exprs.length).toBeGreaterThan(5);
      const used = new Set(exprs.flatMap((e) => [...metricNamesInPromQL(e)]));
      const missing = [...used].filter((name) => !scraped.has(name));
      expect(missing).toEqual([]);
    },
  );

  it("have unique panel ids and datasource-variable queries", () => {
    for (const file of files) {
      const d = JSON.parse(readFileSync(`${dashboardsDir}${file}`, "utf8")) as {
        uid: string;
        panels: { id: number; type: string; datasource?: { uid: string } }[];
      };
      const ids = d.panels.map((p) => p.id);
      expect(new Set(ids).size, file).toBe(ids.length);
      const queryPanels = d.panels.filter((p) => p.type !== "row");
      expect(queryPanels.length, file).toBeGreaterThan(8);
      expect(
        queryPanels.every((p) => p.datasource?.uid === "$" + "{datasource}"),
        file,
      ).toBe(true);
    }
  });

  it("cover the cluster, traffic and the join of the two", () => {
    const allUsed = new Set(
      Object.values(buildDashboards()).flatMap((d) =>
        promQLInDashboard(d).flatMap((e) => [...metricNamesInPromQL(e)]),
      ),
    );
    for (const name of [
      "llmgw_cluster_gpus",
      "llmgw_gpu_utilization_ratio",
      "llmgw_gpu_ecc_uncorrected_errors",
      "llmgw_fabric_gpus",
      "llmgw_router_queue_depth",
      "llmgw_router_time_to_first_token_seconds",
      "llmgw_router_admission_rejections_total",
    ]) {
      expect(allUsed.has(name), name).toBe(true);
    }
  });
});

describe("Prometheus config", () => {
  it("rules only use families a scrape contains (or rules recorded here)", async () => {
    const scraped = await scrapedFamilies();
    const { exprs, records } = readRules();
    expect(exprs.length).toBe(15);
    expect(records.size).toBe(4);
    const used = new Set(exprs.flatMap((e) => [...metricNamesInPromQL(e)]));
    expect([...used].filter((n) => !scraped.has(n) && !records.has(n))).toEqual([]);
  });

  it("every family the package defines shows up in the realistic scrape", async () => {
    const scraped = await scrapedFamilies();
    const defined = [
      ...CLUSTER_FAMILIES,
      ...ROUTER_FAMILIES,
      ...USAGE_FAMILIES,
      ...CONTROL_PLANE_FAMILIES,
    ].map((f) => f.name);
    expect(defined.filter((n) => !scraped.has(n))).toEqual([]);
  });

  const promtool = spawnSync("promtool", ["--version"]).status === 0;
  it.skipIf(!promtool)(
    "prometheus.yml and the rules pass promtool check config (promtool present)",
    () => {
      const result = spawnSync(
        "promtool",
        ["check", "config", `${root}deploy/prometheus/prometheus.yml`],
        { encoding: "utf8" },
      );
      expect(result.stdout + result.stderr).toContain("SUCCESS: 1 rule files found");
      expect(result.status).toBe(0);
    },
  );

  it.skipIf(!promtool)("the alerts fire as their tests say (promtool test rules)", () => {
    const result = spawnSync(
      "promtool",
      ["test", "rules", `${root}deploy/prometheus/llmgw-rules.test.yml`],
      { encoding: "utf8" },
    );
    expect(result.stdout + result.stderr).toContain("SUCCESS");
    expect(result.status, result.stdout + result.stderr).toBe(0);
  });
});
