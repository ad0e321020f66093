import {
  CLUSTER_FAMILIES,
  CONTROL_PLANE_FAMILIES,
  type FamilySpec,
  LABEL_DOCS,
  ROUTER_FAMILIES,
  ROUTER_PEER_FAMILIES,
  ROUTER_STATE_FAMILIES,
  USAGE_FAMILIES,
} from "./families.js";

const BEGIN = "<!-- BEGIN GENERATED: renderMetricsReference() -->";
const END = "<!-- END GENERATED -->";

function table(families: readonly FamilySpec[]): string {
  const rows = families.map((f) => {
    const labels = f.labelNames.length === 0 ? "—" : f.labelNames.map((l) => `\`${l}\``).join(", ");
    return `| \`${f.name}\` | ${f.type} | ${labels} | ${f.help.replaceAll("|", "\\|")} |`;
  });
  return ["| family | type | labels | meaning |", "| --- | --- | --- | --- |", ...rows].join("\n");
}

/**
 * Renders the generated part of `docs/metrics.md` (between its BEGIN/END markers) from the
 * family catalogue, so the reference cannot drift from what is registered; a test compares.
 */
export function renderMetricsReference(): string {
  const usedLabels = new Set(
    [
      ...CLUSTER_FAMILIES,
      ...ROUTER_FAMILIES,
      ...ROUTER_PEER_FAMILIES,
      ...USAGE_FAMILIES,
      ...CONTROL_PLANE_FAMILIES,
    ].flatMap((f) => f.labelNames),
  );
  const labelRows = [...usedLabels]
    .sort()
    .map((l) => `| \`${l}\` | ${(LABEL_DOCS[l] ?? "").replaceAll("|", "\\|")} |`);
  return [
    BEGIN,
    "",
    `## Cluster families (${CLUSTER_FAMILIES.length})`,
    "",
    "Computed at scrape time from the control plane's view of nodes, GPUs, deployments and replicas.",
    "",
    table(CLUSTER_FAMILIES),
    "",
    `## Router families (${ROUTER_FAMILIES.length})`,
    "",
    "Recorded by the router as requests flow. Histograms expose `_bucket`, `_sum` and `_count`. The",
    "series labelled `replica` disappear when that replica leaves the route table, so their",
    "cardinality follows the replicas deployed now.",
    "",
    table(ROUTER_FAMILIES),
    "",
    `## Router state families (${ROUTER_STATE_FAMILIES.length})`,
    "",
    "Each router's own state, read at scrape time: its view of the routing state, and the usage",
    "its control plane refused. A router that has never heard from a control plane has no",
    "`llmgw_router_state_age_seconds` series; one that records no usage has no usage series.",
    "",
    table(ROUTER_STATE_FAMILIES),
    "",
    `## Router peer families (${ROUTER_PEER_FAMILIES.length})`,
    "",
    "A router's exchange with the other routers of its cluster (`llmgw router --peer`): present",
    "only on a router that has peers.",
    "",
    table(ROUTER_PEER_FAMILIES),
    "",
    `## Usage families (${USAGE_FAMILIES.length})`,
    "",
    "The control plane's, from the usage batches routers report (`ReportUsage`): cumulative since",
    "it started, each batch counted once. Labelled by tenant and model, never by key; per key,",
    "ask `llmgw usage --group key`.",
    "",
    table(USAGE_FAMILIES),
    "",
    `## Control plane families (${CONTROL_PLANE_FAMILIES.length})`,
    "",
    "The control plane's own work, on the leader (a follower plans nothing). A reconcile runs after",
    "each change that can move a replica (a node's state or inventory, a deployment, a drain), a",
    "burst of agent changes coalesced into one.",
    "",
    table(CONTROL_PLANE_FAMILIES),
    "",
    "## Labels",
    "",
    "| label | values |",
    "| --- | --- |",
    ...labelRows,
    "",
    END,
  ].join("\n");
}

/** The BEGIN/END markers that delimit the generated part of `docs/metrics.md`. */
export const METRICS_REFERENCE_MARKERS = { begin: BEGIN, end: END } as const;
