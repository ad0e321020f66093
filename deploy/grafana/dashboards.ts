// Source of the three llmgw Grafana dashboards. The JSON files in ./dashboards are generated
// from this file (npx tsx deploy/grafana/dashboards.ts) and a test in
// packages/metrics-collector checks they match it and that every metric in every query is a
// family that @llmgw/metrics-collector defines.
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

/** One query of a panel. */
interface Target {
  expr: string;
  legend?: string;
  instant?: boolean;
}

/** A panel before layout. */
interface PanelSpec {
  title: string;
  description: string;
  type?: "timeseries" | "stat" | "table" | "bargauge";
  unit?: string;
  stack?: boolean;
  targets: Target[];
  /** Width in grid units (24 per row). Default 12. */
  w?: number;
  h?: number;
  /** A dashboard variable: Grafana draws the panel once per selected value, side by side. */
  repeat?: string;
}

interface Row {
  title: string;
  panels: PanelSpec[];
}

// Grafana substitutes the dashboard's `datasource` variable here (a literal "${…}", not a JS template).
const DATASOURCE_VARIABLE = "$" + "{datasource}";
const DS = { type: "prometheus", uid: DATASOURCE_VARIABLE } as const;
const RATE = "$__rate_interval";

function datasourceVar() {
  return {
    name: "datasource",
    label: "Prometheus",
    type: "datasource",
    query: "prometheus",
    current: {},
    hide: 0,
  };
}

function queryVar(name: string, label: string, query: string, multi: boolean) {
  return {
    name,
    label,
    type: "query",
    datasource: DS,
    query: { query, refId: `${name}-var` },
    definition: query,
    refresh: 2,
    sort: 1,
    multi,
    includeAll: multi,
    allValue: multi ? ".*" : undefined,
    current: {},
    hide: 0,
  };
}

function layout(rows: Row[]) {
  const panels: unknown[] = [];
  let id = 1;
  let y = 0;
  for (const row of rows) {
    panels.push({
      id: id++,
      type: "row",
      title: row.title,
      collapsed: false,
      gridPos: { x: 0, y, w: 24, h: 1 },
      panels: [],
    });
    y += 1;
    let x = 0;
    let rowHeight = 0;
    for (const p of row.panels) {
      const w = p.w ?? 12;
      const h = p.h ?? (p.type === "stat" ? 4 : 8);
      if (x + w > 24) {
        x = 0;
        y += rowHeight;
        rowHeight = 0;
      }
      const type = p.type ?? "timeseries";
      panels.push({
        id: id++,
        type,
        title: p.title,
        description: p.description,
        datasource: DS,
        gridPos: { x, y, w, h },
        ...(p.repeat === undefined
          ? {}
          : { repeat: p.repeat, repeatDirection: "h", maxPerRow: Math.floor(24 / w) }),
        fieldConfig: {
          defaults: {
            unit: p.unit ?? "short",
            ...(type === "timeseries"
              ? {
                  custom: {
                    stacking: { mode: p.stack ? "normal" : "none" },
                    fillOpacity: p.stack ? 60 : 10,
                  },
                }
              : {}),
          },
          overrides: [],
        },
        options:
          type === "timeseries"
            ? {
                legend: { displayMode: "table", placement: "right", calcs: ["lastNotNull", "max"] },
                tooltip: { mode: "multi" },
              }
            : { reduceOptions: { calcs: ["lastNotNull"], fields: "", values: false } },
        targets: p.targets.map((t, i) => ({
          refId: String.fromCharCode(65 + i),
          datasource: DS,
          expr: t.expr,
          legendFormat: t.legend ?? "__auto",
          instant: t.instant ?? type !== "timeseries",
          range: type === "timeseries",
        })),
      });
      x += w;
      rowHeight = Math.max(rowHeight, h);
    }
    y += rowHeight;
  }
  return panels;
}

function dashboard(
  uid: string,
  title: string,
  description: string,
  variables: unknown[],
  rows: Row[],
) {
  return {
    uid,
    title,
    description,
    tags: ["llmgw"],
    editable: true,
    timezone: "browser",
    schemaVersion: 39,
    version: 1,
    refresh: "30s",
    time: { from: "now-6h", to: "now" },
    templating: { list: [datasourceVar(), ...variables] },
    annotations: { list: [] },
    links: [{ type: "dashboards", tags: ["llmgw"], asDropdown: true, title: "llmgw" }],
    panels: layout(rows),
  };
}

const quantile = (q: number, family: string, by: string, filter: string) =>
  `histogram_quantile(${q}, sum by (le, ${by}) (rate(${family}_bucket{${filter}}[${RATE}])))`;

function clusterOverview() {
  const cls = 'gpu_class=~"$gpu_class"';
  return dashboard(
    "llmgw-cluster",
    "llmgw / Cluster overview",
    "Nodes, GPUs by class and state, per-GPU memory and utilisation, ECC, fabric fill. Computed by the control plane at scrape time; a GPU nobody measured has no series (gaps, not zeros).",
    [queryVar("gpu_class", "GPU class", "label_values(llmgw_cluster_gpus, gpu_class)", true)],
    [
      {
        title: "Was the cluster full?",
        panels: [
          {
            title: "Nodes ready",
            description: "Nodes heartbeating now, of all registered.",
            type: "stat",
            w: 4,
            targets: [{ expr: "sum(llmgw_node_up)" }],
          },
          {
            title: "Nodes unreachable / lost",
            description:
              "Nodes that missed heartbeats (replicas keep serving) or exceeded the grace (replicas rescheduled).",
            type: "stat",
            w: 4,
            targets: [{ expr: 'sum(llmgw_cluster_nodes{state!="ready"})' }],
          },
          {
            title: "Free GPUs",
            description:
              "Healthy, unallocated GPUs on ready, schedulable nodes, by class. 0 means the class is full.",
            type: "stat",
            w: 8,
            targets: [
              {
                expr: `sum by (gpu_class) (llmgw_cluster_gpus{state="free", ${cls}})`,
                legend: "{{gpu_class}}",
              },
            ],
          },
          {
            title: "Unschedulable deployments",
            description: "Deployments the scheduler could not fully place.",
            type: "stat",
            w: 4,
            targets: [{ expr: "sum(llmgw_deployment_unschedulable)" }],
          },
          {
            title: "Unhealthy GPUs",
            description: "GPUs flagged unhealthy by their agent (ECC, Xid, lost).",
            type: "stat",
            w: 4,
            targets: [{ expr: `sum(llmgw_cluster_gpus{state="unhealthy", ${cls}})` }],
          },
          {
            title: "GPUs by class and state",
            description:
              "free | allocated | unhealthy | unavailable (MIG, cordoned, draining or not-ready node), stacked per class.",
            stack: true,
            targets: [
              {
                expr: `sum by (gpu_class, state) (llmgw_cluster_gpus{${cls}})`,
                legend: "{{gpu_class}} {{state}}",
              },
            ],
          },
          {
            title: "Allocation ratio by class",
            description: "Allocated GPUs / all GPUs of the class.",
            unit: "percentunit",
            targets: [
              {
                expr: `sum by (gpu_class) (llmgw_cluster_gpus{state="allocated", ${cls}}) / sum by (gpu_class) (llmgw_cluster_gpus{${cls}})`,
                legend: "{{gpu_class}}",
              },
            ],
          },
        ],
      },
      {
        title: "Nodes",
        panels: [
          {
            title: "Nodes by state",
            description: "ready | unreachable | lost.",
            stack: true,
            targets: [{ expr: "llmgw_cluster_nodes", legend: "{{state}}" }],
          },
          {
            title: "Heartbeat age",
            description: "Seconds since each node's last heartbeat (slowest 10).",
            unit: "s",
            targets: [
              {
                expr: "topk(10, time() - llmgw_node_last_heartbeat_timestamp_seconds)",
                legend: "{{node}}",
              },
            ],
          },
          {
            title: "Cordoned / draining nodes",
            description: "Nodes taken out of scheduling by an operator.",
            targets: [
              { expr: "sum(llmgw_node_cordoned)", legend: "cordoned" },
              { expr: "sum(llmgw_node_draining)", legend: "draining" },
            ],
          },
          {
            title: "Agent versions",
            description: "Nodes per agent version (a rollout in progress shows two).",
            stack: true,
            targets: [{ expr: "llmgw_agent_versions", legend: "{{version}}" }],
          },
          {
            title: "Unhealthy nodes",
            description: "Nodes reporting themselves unhealthy.",
            type: "table",
            w: 24,
            targets: [{ expr: "llmgw_node_healthy == 0 and on (node) llmgw_node_info" }],
          },
        ],
      },
      {
        title: "GPUs",
        panels: [
          {
            title: "Utilisation by class",
            description:
              "Mean compute utilisation of GPUs that reported it, by class; compare with the allocation ratio above.",
            unit: "percentunit",
            targets: [
              {
                expr: `avg by (gpu_class) (llmgw_gpu_utilization_ratio{${cls}})`,
                legend: "{{gpu_class}}",
              },
            ],
          },
          {
            title: "Utilisation of allocated vs free GPUs",
            description: "Allocated GPUs that sit idle are wasted capacity.",
            unit: "percentunit",
            targets: [
              {
                expr: `avg(llmgw_gpu_utilization_ratio{${cls}} and on (node, gpu) llmgw_gpu_allocation)`,
                legend: "allocated",
              },
              {
                expr: `avg(llmgw_gpu_utilization_ratio{${cls}} unless on (node, gpu) llmgw_gpu_allocation)`,
                legend: "unallocated",
              },
            ],
          },
          {
            title: "Memory used per GPU (busiest 20)",
            description: "Used / total memory per GPU.",
            unit: "percentunit",
            targets: [
              {
                expr: `topk(20, llmgw_gpu_memory_used_bytes{${cls}} / llmgw_gpu_memory_total_bytes{${cls}})`,
                legend: "{{node}}/{{gpu}}",
              },
            ],
          },
          {
            title: "Utilisation per GPU (busiest 20)",
            description: "Compute utilisation per GPU, 0..1.",
            unit: "percentunit",
            targets: [
              { expr: `topk(20, llmgw_gpu_utilization_ratio{${cls}})`, legend: "{{node}}/{{gpu}}" },
            ],
          },
          {
            title: "Uncorrected ECC errors",
            description:
              "GPUs with any uncorrected ECC error; these should be unhealthy and never scheduled.",
            type: "table",
            targets: [{ expr: `llmgw_gpu_ecc_uncorrected_errors{${cls}} > 0` }],
          },
          {
            title: "Unhealthy GPUs",
            description: "GPUs flagged unhealthy, with their product name.",
            type: "table",
            targets: [
              {
                expr: `(llmgw_gpu_healthy{${cls}} == 0) * on (node, gpu) group_left (name, uuid) llmgw_gpu_info`,
              },
            ],
          },
          {
            title: "GPU faults from the kernel log (last hour)",
            description:
              "New Xid/SXid faults per GPU by code and catalog action (restart-engine, reset-gpu, drain-node, reboot); `llmgw nodes show NODE` has the kernel's line.",
            type: "table",
            targets: [
              {
                expr: "sum by (node, gpu, kind, code, action) (increase(llmgw_gpu_faults_total[1h])) > 0",
              },
            ],
          },
          {
            title: "GPU health problems by code",
            description:
              "Why GPUs are out of service now (kernel-log fault, ECC, row remap pending, NVLink inactive, PCIe degraded…).",
            targets: [{ expr: "sum by (code) (llmgw_gpu_health_problem)", legend: "{{code}}" }],
          },
          {
            title: "Unhealthy RDMA ports",
            description:
              "Ports whose agent judged them bad (flapping, error rates, a saturated counter): multi-node replicas over their fabric leave that node.",
            type: "table",
            targets: [{ expr: "llmgw_port_healthy == 0" }],
          },
          {
            title: "Temperature (hottest 10)",
            description: "GPU temperature.",
            unit: "celsius",
            targets: [
              {
                expr: `topk(10, llmgw_gpu_temperature_celsius{${cls}})`,
                legend: "{{node}}/{{gpu}}",
              },
            ],
          },
          {
            title: "Power by class",
            description: "Total GPU power draw by class.",
            unit: "watt",
            targets: [
              {
                expr: `sum by (gpu_class) (llmgw_gpu_power_watts{${cls}})`,
                legend: "{{gpu_class}}",
              },
            ],
          },
        ],
      },
      {
        title: "Fabrics",
        panels: [
          {
            title: "Fabric fill",
            description:
              "Allocated share of each fabric island's GPUs (multi-node replicas need free GPUs on one fabric).",
            unit: "percentunit",
            targets: [
              {
                expr: `sum by (fabric, gpu_class) (llmgw_fabric_gpus{state="allocated", ${cls}}) / sum by (fabric, gpu_class) (llmgw_fabric_gpus{${cls}})`,
                legend: "{{fabric}} {{gpu_class}}",
              },
            ],
          },
          {
            title: "Free GPUs per fabric",
            description: "Free GPUs and nodes per fabric island and class.",
            type: "table",
            targets: [
              {
                expr: `sum by (fabric, link_layer, gpu_class) (llmgw_fabric_gpus{state="free", ${cls}})`,
              },
              { expr: `llmgw_fabric_nodes{${cls}}` },
            ],
          },
        ],
      },
    ],
  );
}

function traffic() {
  const m = 'model=~"$model"';
  return dashboard(
    "llmgw-traffic",
    "llmgw / Traffic",
    "Requests through the llmgw router: rates, latency, TTFT, admission queue, rejections, upstream errors, routing.",
    [
      queryVar("model", "Model", "label_values(llmgw_router_requests_total, model)", true),
      queryVar("tenant", "Tenant", "label_values(llmgw_usage_requests_total, tenant)", true),
    ],
    [
      {
        title: "Requests",
        panels: [
          {
            title: "Requests by model and status",
            description: "Answered requests per second.",
            unit: "reqps",
            stack: true,
            targets: [
              {
                expr: `sum by (model, code) (rate(llmgw_router_requests_total{${m}}[${RATE}]))`,
                legend: "{{model}} {{code}}",
              },
            ],
          },
          {
            title: "Error ratio (5xx)",
            description: "Share of answers with a 5xx status.",
            unit: "percentunit",
            targets: [
              {
                expr: `sum by (model) (rate(llmgw_router_requests_total{${m}, code=~"5.."}[${RATE}])) / sum by (model) (rate(llmgw_router_requests_total{${m}}[${RATE}]))`,
                legend: "{{model}}",
              },
            ],
          },
          {
            title: "Request duration p50 / p99",
            description: "Received to last byte.",
            unit: "s",
            targets: [
              {
                expr: quantile(0.5, "llmgw_router_request_duration_seconds", "model", m),
                legend: "p50 {{model}}",
              },
              {
                expr: quantile(0.99, "llmgw_router_request_duration_seconds", "model", m),
                legend: "p99 {{model}}",
              },
            ],
          },
          {
            title: "Time to first token p50 / p99",
            description: "Received to first streamed byte.",
            unit: "s",
            targets: [
              {
                expr: quantile(0.5, "llmgw_router_time_to_first_token_seconds", "model", m),
                legend: "p50 {{model}}",
              },
              {
                expr: quantile(0.99, "llmgw_router_time_to_first_token_seconds", "model", m),
                legend: "p99 {{model}}",
              },
            ],
          },
          {
            title: "Inter-chunk gap p99",
            description: "Gap between streamed chunks (decode speed as clients see it).",
            unit: "s",
            targets: [
              {
                expr: quantile(0.99, "llmgw_router_inter_chunk_seconds", "model", m),
                legend: "{{model}}",
              },
            ],
          },
          {
            title: "Tokens per second",
            description: "Prompt and completion tokens from engine usage.",
            targets: [
              {
                expr: `sum by (model) (rate(llmgw_router_prompt_tokens_total{${m}}[${RATE}]))`,
                legend: "prompt {{model}}",
              },
              {
                expr: `sum by (model) (rate(llmgw_router_completion_tokens_total{${m}}[${RATE}]))`,
                legend: "completion {{model}}",
              },
            ],
          },
          {
            title: "In flight",
            description: "Requests proxied upstream right now.",
            targets: [
              {
                expr: `sum by (model) (llmgw_router_requests_in_flight{${m}})`,
                legend: "{{model}}",
              },
            ],
          },
          {
            title: "Bytes",
            description: "Body bytes in from clients and out to clients.",
            unit: "Bps",
            targets: [
              {
                expr: `sum by (direction) (rate(llmgw_router_bytes_total{${m}}[${RATE}]))`,
                legend: "{{direction}}",
              },
            ],
          },
        ],
      },
      {
        title: "Routers",
        panels: [
          {
            title: "Routers watching the control plane",
            description:
              "Routers with an open routing stream (the in-process one included), and those disconnected in the last 10 minutes. Each admits 1/connected of every replica's capacity.",
            targets: [{ expr: "sum by (state) (llmgw_routers)", legend: "{{state}}" }],
          },
          {
            title: "Routing state age",
            description:
              "Seconds since each router last heard from a control plane. It keeps serving from that state; a growing line is a router cut off from every control plane.",
            unit: "s",
            targets: [
              {
                expr: "max by (instance) (llmgw_router_state_age_seconds)",
                legend: "{{instance}}",
              },
            ],
          },
          {
            title: "Routers without a control plane",
            description: "Routers whose routing stream is down (serving from their last state).",
            targets: [
              {
                expr: "count(llmgw_router_control_plane_connected == 0) or vector(0)",
                legend: "disconnected",
              },
            ],
          },
        ],
      },
      {
        title: "Admission and queueing",
        panels: [
          {
            title: "Queue depth",
            description: "Requests waiting for capacity.",
            targets: [
              { expr: `sum by (model) (llmgw_router_queue_depth{${m}})`, legend: "{{model}}" },
            ],
          },
          {
            title: "Queue wait p99",
            description: "Time spent queued, admitted requests.",
            unit: "s",
            targets: [
              {
                expr: quantile(
                  0.99,
                  "llmgw_router_queue_wait_seconds",
                  "model",
                  `${m}, outcome="admitted"`,
                ),
                legend: "{{model}}",
              },
            ],
          },
          {
            title: "Rejections by reason",
            description:
              "Requests refused before an engine (429 queue full/timeout, 503 no ready replica or loading, …).",
            unit: "reqps",
            stack: true,
            targets: [
              {
                expr: `sum by (reason) (rate(llmgw_router_admission_rejections_total{${m}}[${RATE}]))`,
                legend: "{{reason}}",
              },
            ],
          },
          {
            title: "Auth failures and rate limits",
            description: "Refused API keys by reason; per-key limit hits by key name.",
            unit: "reqps",
            targets: [
              {
                expr: `sum by (reason) (rate(llmgw_router_auth_failures_total[${RATE}]))`,
                legend: "auth {{reason}}",
              },
              {
                expr: `sum by (key_name, limit) (rate(llmgw_router_rate_limited_total[${RATE}]))`,
                legend: "limit {{key_name}} {{limit}}",
              },
            ],
          },
          {
            title: "Replicas available",
            description: "Ready replicas the router can use per model.",
            // Every router reports the same count; max, not sum, across routers.
            targets: [
              {
                expr: `max by (model) (llmgw_router_replicas_available{${m}})`,
                legend: "{{model}}",
              },
            ],
          },
          {
            title: "Client disconnects",
            description: "Clients gone before the answer ended, by phase.",
            unit: "reqps",
            targets: [
              {
                expr: `sum by (phase) (rate(llmgw_router_client_disconnects_total{${m}}[${RATE}]))`,
                legend: "{{phase}}",
              },
            ],
          },
        ],
      },
      {
        title: "Upstreams and routing",
        panels: [
          {
            title: "Upstream errors by kind",
            description: "Failures talking to replicas.",
            unit: "reqps",
            stack: true,
            targets: [
              {
                expr: `sum by (kind) (rate(llmgw_router_upstream_errors_total{${m}}[${RATE}]))`,
                legend: "{{kind}}",
              },
              { expr: `sum(rate(llmgw_router_retries_total{${m}}[${RATE}]))`, legend: "retries" },
            ],
          },
          {
            title: "Open circuits",
            description: "Replicas whose circuit is open or half-open.",
            targets: [
              {
                expr: `sum by (model, state) (llmgw_router_circuit_state{${m}, state!="closed"})`,
                legend: "{{model}} {{state}}",
              },
              {
                expr: `sum by (to) (increase(llmgw_router_circuit_transitions_total{${m}}[${RATE}]))`,
                legend: "to {{to}}",
              },
            ],
          },
          {
            title: "In flight per replica",
            description:
              "Requests in flight per replica, summed over every router (each router sees only its own share).",
            targets: [
              {
                expr: `sum by (replica) (llmgw_router_replica_requests_in_flight{${m}})`,
                legend: "{{replica}}",
              },
            ],
          },
          {
            title: "Routing decision p99",
            description: "Parse + hash + score time, inline vs worker pool.",
            unit: "s",
            targets: [
              {
                expr: quantile(0.99, "llmgw_router_routing_decision_seconds", "path", m),
                legend: "{{path}}",
              },
              {
                expr: `sum by (path) (rate(llmgw_router_scoring_tasks_total[${RATE}]))`,
                legend: "tasks/s {{path}}",
              },
            ],
          },
          {
            title: "Prefix hits",
            description:
              "Share of requests sent to a replica holding part of their prefix, and the median hit ratio.",
            unit: "percentunit",
            targets: [
              {
                expr: `sum by (model) (rate(llmgw_router_prefix_hit_requests_total{${m}}[${RATE}])) / sum by (model) (rate(llmgw_router_requests_total{${m}}[${RATE}]))`,
                legend: "hit requests {{model}}",
              },
              {
                expr: quantile(0.5, "llmgw_router_prefix_hit_ratio", "model", m),
                legend: "median ratio {{model}}",
              },
            ],
          },
          {
            title: "Chosen score p50 and fallbacks",
            description:
              "Score of the chosen replica; scoring without load signals (falls back to least-loaded).",
            targets: [
              {
                expr: quantile(0.5, "llmgw_router_chosen_score", "model", m),
                legend: "score p50 {{model}}",
              },
              {
                expr: `sum by (reason) (rate(llmgw_router_routing_fallbacks_total{${m}}[${RATE}]))`,
                legend: "fallback {{reason}}",
              },
            ],
          },
          {
            title: "Worker pool",
            description: "Scoring pool busy share and waiting tasks.",
            targets: [
              { expr: "llmgw_router_worker_pool_utilization_ratio", legend: "utilisation" },
              { expr: "llmgw_router_worker_pool_queue_size", legend: "queued tasks" },
            ],
          },
        ],
      },
      {
        title: "Usage per tenant",
        panels: [
          {
            title: "Tokens: $tenant",
            description:
              "Tokens per second this tenant used, by model and type (cached tokens are part of prompt), from the usage batches the control plane stored. One panel per tenant selected; (none) is keys without a tenant.",
            repeat: "tenant",
            w: 8,
            targets: [
              {
                expr: `sum by (model, type) (rate(llmgw_usage_tokens_total{tenant="$tenant", ${m}}[${RATE}]))`,
                legend: "{{model}} {{type}}",
              },
            ],
          },
          {
            title: "Tokens in the last 24 h by tenant",
            description:
              "Prompt + completion tokens per tenant over the last day, what day budgets count (budgets use the UTC day; `llmgw usage` has the exact figures).",
            type: "bargauge",
            targets: [
              {
                expr: `sum by (tenant) (increase(llmgw_usage_tokens_total{tenant=~"$tenant", type!="cached", ${m}}[1d]))`,
                legend: "{{tenant}}",
              },
            ],
          },
          {
            title: "Requests by tenant",
            description: "Requests per second each tenant sent, all models.",
            unit: "reqps",
            stack: true,
            targets: [
              {
                expr: `sum by (tenant) (rate(llmgw_usage_requests_total{tenant=~"$tenant", ${m}}[${RATE}]))`,
                legend: "{{tenant}}",
              },
            ],
          },
          {
            title: "GPUs used by tenant",
            description:
              "GPU-seconds per second: each request's share of its replica's GPUs over its duration, summed per tenant.",
            stack: true,
            targets: [
              {
                expr: `sum by (tenant) (rate(llmgw_usage_gpu_seconds_total{tenant=~"$tenant", ${m}}[${RATE}]))`,
                legend: "{{tenant}}",
              },
            ],
          },
          {
            title: "Estimated and refused usage",
            description:
              "Requests charged an estimate (cut short, or no usage from the engine) and answers whose reported usage was refused as implausible.",
            targets: [
              {
                expr: `sum by (tenant) (rate(llmgw_usage_estimated_requests_total{tenant=~"$tenant", ${m}}[${RATE}]))`,
                legend: "estimated {{tenant}}",
              },
              {
                expr: `sum by (tenant) (rate(llmgw_usage_refused_total{tenant=~"$tenant", ${m}}[${RATE}]))`,
                legend: "refused {{tenant}}",
              },
            ],
          },
        ],
      },
    ],
  );
}

function deploymentDrilldown() {
  const d = 'deployment="$deployment"';
  const m = 'model="$model"';
  return dashboard(
    "llmgw-deployment",
    "llmgw / Deployment drill-down",
    "One deployment: its capacity (replicas, GPUs, was its GPU class full) next to its traffic (were requests queueing or refused).",
    [
      queryVar(
        "deployment",
        "Deployment",
        "label_values(llmgw_deployment_info, deployment)",
        false,
      ),
      queryVar("model", "Served model", `label_values(llmgw_deployment_info{${d}}, model)`, false),
    ],
    [
      {
        title: "Capacity",
        panels: [
          {
            title: "Replicas desired / ready",
            description: "What the deployment asks for and what serves.",
            w: 8,
            targets: [
              { expr: `llmgw_deployment_replicas_desired{${d}}`, legend: "desired" },
              { expr: `llmgw_deployment_replicas_ready{${d}}`, legend: "ready" },
            ],
          },
          {
            title: "Replicas by state",
            description:
              "pending | starting | loading | ready | unhealthy | stopping | exited | failed.",
            w: 8,
            stack: true,
            targets: [{ expr: `llmgw_replicas{${d}} > 0`, legend: "{{state}}" }],
          },
          {
            title: "Unschedulable",
            description: "1 while the scheduler cannot place every replica.",
            w: 8,
            targets: [{ expr: `llmgw_deployment_unschedulable{${d}}`, legend: "unschedulable" }],
          },
          {
            title: "Free GPUs of this deployment's class",
            description:
              "Cluster-wide free GPUs of the class the deployment needs: 0 here while requests queue means the cluster was full.",
            targets: [
              {
                expr: `sum by (gpu_class) (llmgw_cluster_gpus{state="free"} * on (gpu_class) group_left () llmgw_deployment_info{${d}})`,
                legend: "free {{gpu_class}}",
              },
            ],
          },
          {
            title: "GPUs held and their utilisation",
            description:
              "GPUs allocated to the deployment and their mean utilisation (of those that reported it).",
            targets: [
              { expr: `count(llmgw_gpu_allocation{${d}})`, legend: "GPUs held" },
              {
                expr: `avg(llmgw_gpu_utilization_ratio * on (node, gpu) group_left (deployment) llmgw_gpu_allocation{${d}})`,
                legend: "mean utilisation",
              },
            ],
          },
          {
            title: "Memory used on its GPUs",
            description: "Used memory of each GPU the deployment holds.",
            unit: "bytes",
            targets: [
              {
                expr: `llmgw_gpu_memory_used_bytes * on (node, gpu) group_left (deployment) llmgw_gpu_allocation{${d}}`,
                legend: "{{node}}/{{gpu}}",
              },
            ],
          },
        ],
      },
      {
        title: "Traffic",
        panels: [
          {
            title: "Queue depth and available replicas",
            description: "Requests waiting next to the replicas that could take them.",
            targets: [
              { expr: `llmgw_router_queue_depth{${m}}`, legend: "queued" },
              { expr: `llmgw_router_replicas_available{${m}}`, legend: "replicas available" },
            ],
          },
          {
            title: "Rejections by reason",
            description: "Refusals for this model (429 queue, 503 no replica).",
            unit: "reqps",
            stack: true,
            targets: [
              {
                expr: `sum by (reason) (rate(llmgw_router_admission_rejections_total{${m}}[${RATE}]))`,
                legend: "{{reason}}",
              },
            ],
          },
          {
            title: "Requests by status",
            description: "Answered requests per second.",
            unit: "reqps",
            stack: true,
            targets: [
              {
                expr: `sum by (code) (rate(llmgw_router_requests_total{${m}}[${RATE}]))`,
                legend: "{{code}}",
              },
            ],
          },
          {
            title: "TTFT and queue wait p99",
            description: "Latency as clients feel it, and the part spent queueing.",
            unit: "s",
            targets: [
              {
                expr: quantile(0.99, "llmgw_router_time_to_first_token_seconds", "model", m),
                legend: "TTFT p99",
              },
              {
                expr: quantile(0.99, "llmgw_router_queue_wait_seconds", "model", m),
                legend: "queue wait p99",
              },
            ],
          },
          {
            title: "In flight per replica",
            description: "Load spread over this model's replicas.",
            targets: [
              { expr: `llmgw_router_replica_requests_in_flight{${m}}`, legend: "{{replica}}" },
            ],
          },
          {
            title: "Upstream errors",
            description: "Failures talking to this model's replicas.",
            unit: "reqps",
            targets: [
              {
                expr: `sum by (kind) (rate(llmgw_router_upstream_errors_total{${m}}[${RATE}]))`,
                legend: "{{kind}}",
              },
            ],
          },
        ],
      },
    ],
  );
}

/** Every dashboard, by file name under deploy/grafana/dashboards/. */
export function buildDashboards(): Record<string, unknown> {
  return {
    "llmgw-cluster.json": clusterOverview(),
    "llmgw-traffic.json": traffic(),
    "llmgw-deployment.json": deploymentDrilldown(),
  };
}

/** The file text of a dashboard, as committed. */
export function dashboardText(dashboard: unknown): string {
  return `${JSON.stringify(dashboard, null, 2)}\n`;
}

if (process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1]) {
  const dir = join(fileURLToPath(new URL(".", import.meta.url)), "dashboards");
  for (const [file, d] of Object.entries(buildDashboards()))
    writeFileSync(join(dir, file), dashboardText(d));
  console.log(`wrote ${Object.keys(buildDashboards()).length} dashboards to ${dir}`);
}
