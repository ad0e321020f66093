/** The Prometheus type of a family, as it appears on its `# TYPE` line. */
export type FamilyType = "counter" | "gauge" | "histogram";

/**
 * Described data for one metric family: the single source that both the registry
 * (`createClusterCollector`, `createRouterMetrics`) and `docs/metrics.md` are built from.
 */
export interface FamilySpec {
  /** Full name, `llmgw_*`, unit in the name. Counters end in `_total`. */
  readonly name: string;
  readonly type: FamilyType;
  /** One sentence: what a sample means. Becomes the `# HELP` text. */
  readonly help: string;
  /** Label names, each with a bounded value set (documented in {@link LABEL_DOCS}). */
  readonly labelNames: readonly string[];
  /** Histogram bucket upper bounds (histograms only). */
  readonly buckets?: readonly number[];
  /**
   * A counter whose value the `ClusterView` holds (read at scrape time like the gauges,
   * rendered with them) rather than one prom-client increments.
   */
  readonly fromView?: boolean;
}

/** Whether a cluster family is rendered from the view (every gauge, and view counters). */
export function isViewFamily(spec: FamilySpec): boolean {
  return spec.type === "gauge" || spec.fromView === true;
}

/** What each label may hold, and why its cardinality is bounded. Rendered into the docs. */
export const LABEL_DOCS: Readonly<Record<string, string>> = {
  node: "control-plane node id (one per registered node)",
  hostname: "node hostname as the agent reported it (truncated to the label bound)",
  agent_version: "agent version string (truncated)",
  simulated: '"true" | "false"',
  state:
    "a closed set per family: node `ready|unreachable|lost`; GPU `free|allocated|unhealthy|unavailable`; replica `pending|starting|loading|ready|unhealthy|stopping|exited|failed|unknown`; circuit `closed|open|half_open`; router `connected|disconnected`",
  gpu: "GPU index on its node",
  uuid: "GPU UUID from nvidia-smi",
  name: "GPU product name from nvidia-smi (truncated)",
  gpu_class: "GPU class, `<model>-<GiB>g` (DESIGN §2)",
  mig: '"true" | "false"',
  deployment: "deployment name",
  engine: "`vllm|sglang|llamacpp|sim|…` as the deployment declares it",
  fabric: 'fabric id, or `"none"` for nodes with no RDMA fabric',
  link_layer: "`infiniband|roce|unknown`, or `none` with fabric `none`",
  version: "agent version string (truncated)",
  reason: "closed enum named in the family's description",
  model: "served model name of a known deployment; unknown names are folded into `other`",
  endpoint: "`chat_completions|completions|embeddings|models|other`",
  code: "router: HTTP status code of the answer (`200`, `429`, `503`, …); `llmgw_gpu_faults_total`: the Xid or SXid number; `llmgw_gpu_health_problem`: the problem code (`LLMGW_DISCOVERY_*`)",
  replica: "replica id (bounded by deployed replicas)",
  kind: "router: upstream error kind `connect|timeout|reset|http_5xx|stream_aborted|protocol`; GPU faults: `xid|sxid|fallen-off-bus`",
  action: "a fault's catalog action: `ignore|restart-engine|reset-gpu|drain-node|reboot`",
  device: "RDMA device name, e.g. `mlx5_0` (bounded by the node's ports)",
  port: "port number on its RDMA device",
  to: "circuit state entered: `closed|open|half_open`",
  path: "`inline|pool`: scored on the main thread or in the worker pool",
  outcome:
    "queue wait outcome: `admitted|timed_out|cancelled|shed`; prefix prediction: `hit|miss|false_hit|missed_hit`; peer event: `sent|dropped` (out), `applied|invalid` (in)",
  phase: "where the client left: `queued|before_first_byte|streaming`",
  key_name: "API key _name_ (never the secret), truncated",
  tenant:
    "tenant name (bounded by the tenants defined); `(none)` for keys without a tenant, `other` for names past the series bound",
  type: "`prompt|cached|completion`",
  limit:
    "`<level>-<limit>`: `key|tenant` × `rpm|tpm|concurrency|budget` (the 429's `x-llmgw-limit`)",
  direction: "`in|out`",
};

/** Replica states as the wire contract names them, lower-cased, plus `unknown`. */
export const REPLICA_STATES = [
  "pending",
  "starting",
  "loading",
  "ready",
  "unhealthy",
  "stopping",
  "exited",
  "failed",
  "unknown",
] as const;

/** Node lifecycle states (DESIGN §6). */
export const NODE_STATES = ["ready", "unreachable", "lost"] as const;

/**
 * GPU capacity states used by the fabric and cluster totals: `unhealthy` wins over
 * `allocated`, which wins over `unavailable` (healthy and unallocated but not schedulable:
 * MIG enabled, or its node cordoned, draining or not ready); the rest are `free`.
 */
export const GPU_STATES = ["free", "allocated", "unhealthy", "unavailable"] as const;

/** States of a router as the control plane counts it. */
export const ROUTER_STATES = ["connected", "disconnected"] as const;

/** Circuit-breaker states of a replica as the router sees it. */
export const CIRCUIT_STATES = ["closed", "open", "half_open"] as const;

const g = (name: string, help: string, labelNames: readonly string[]): FamilySpec => ({
  name,
  type: "gauge",
  help,
  labelNames,
});
const c = (name: string, help: string, labelNames: readonly string[]): FamilySpec => ({
  name,
  type: "counter",
  help,
  labelNames,
});
const h = (
  name: string,
  help: string,
  labelNames: readonly string[],
  buckets: readonly number[],
): FamilySpec => ({ name, type: "histogram", help, labelNames, buckets });

const GPU = ["node", "gpu", "gpu_class"] as const;

/** Cluster families, computed at scrape time from a `ClusterView`. */
export const CLUSTER_FAMILIES: readonly FamilySpec[] = [
  g(
    "llmgw_node_info",
    "Always 1 per registered node; carries hostname, agent version and whether the node is simulated.",
    ["node", "hostname", "agent_version", "simulated"],
  ),
  g("llmgw_node_up", "1 when the node is ready (heartbeating), 0 when unreachable or lost.", [
    "node",
  ]),
  g(
    "llmgw_node_state",
    "State set: 1 for the node's current lifecycle state (ready|unreachable|lost), 0 for the others.",
    ["node", "state"],
  ),
  g("llmgw_node_healthy", "1 when the node reports itself healthy, 0 when not.", ["node"]),
  g("llmgw_node_cordoned", "1 when an operator cordoned the node, else 0.", ["node"]),
  g("llmgw_node_draining", "1 while the node is being drained, else 0.", ["node"]),
  g(
    "llmgw_node_last_heartbeat_timestamp_seconds",
    "Unix time of the node's last heartbeat; missing until the first one arrives.",
    ["node"],
  ),
  g("llmgw_node_gpus", "GPUs the node registered, by class (a node may hold several classes).", [
    "node",
    "gpu_class",
  ]),
  g("llmgw_gpu_info", "Always 1 per GPU; carries uuid, product name and MIG mode.", [
    ...GPU,
    "uuid",
    "name",
    "mig",
  ]),
  g("llmgw_gpu_memory_total_bytes", "GPU memory size; missing when not reported.", GPU),
  g(
    "llmgw_gpu_memory_used_bytes",
    "GPU memory in use at the last heartbeat; missing when not reported.",
    GPU,
  ),
  g(
    "llmgw_gpu_utilization_ratio",
    "GPU compute utilisation at the last heartbeat, 0..1 (nvidia-smi percent / 100); missing when not reported.",
    GPU,
  ),
  g(
    "llmgw_gpu_ecc_uncorrected_errors",
    "Uncorrected ECC errors as the driver counts them (volatile; may reset with the driver); missing when not reported.",
    GPU,
  ),
  g("llmgw_gpu_temperature_celsius", "GPU temperature; missing when not reported.", GPU),
  g("llmgw_gpu_power_watts", "GPU power draw; missing when not reported.", GPU),
  g("llmgw_gpu_healthy", "1 when the GPU is healthy, 0 when the agent flagged a problem.", GPU),
  g(
    "llmgw_gpu_health_problem",
    "1 per problem keeping a GPU out of service now, by code (an uncleared actionable kernel-log fault is LLMGW_DISCOVERY_GPU_FAULT); no series for a healthy GPU.",
    ["node", "gpu", "code"],
  ),
  {
    ...c(
      "llmgw_gpu_faults_total",
      "Distinct kernel-log faults seen on a GPU since the control plane started, by Xid/SXid code, kind and catalog action (a burst of one fault counts once; a fault seen again after an operator's clear counts again).",
      ["node", "gpu", "code", "kind", "action"],
    ),
    fromView: true,
  },
  g(
    "llmgw_port_healthy",
    "1 when an RDMA port's health checks pass, 0 when not (flaps, error rates, a saturated counter); missing when the agent does not read port health.",
    ["node", "device", "port"],
  ),
  g(
    "llmgw_gpu_allocation",
    "1 for each GPU held by a deployment, labelled with that deployment; no series for unallocated GPUs.",
    [...GPU, "deployment"],
  ),
  g(
    "llmgw_fabric_gpus",
    "GPUs per fabric, class and capacity state (free|allocated|unhealthy|unavailable). A node on several fabrics counts in each.",
    ["fabric", "link_layer", "gpu_class", "state"],
  ),
  g(
    "llmgw_fabric_nodes",
    "Nodes per fabric and class (nodes holding at least one GPU of the class).",
    ["fabric", "link_layer", "gpu_class"],
  ),
  g(
    "llmgw_cluster_gpus",
    'Cluster-wide GPUs by class and capacity state: the "was the cluster full" answer (free == 0).',
    ["gpu_class", "state"],
  ),
  g("llmgw_cluster_nodes", "Registered nodes by lifecycle state.", ["state"]),
  g("llmgw_agent_versions", "Nodes running each agent version.", ["version"]),
  g("llmgw_replicas", "Replicas by deployment and state (every state present, 0 when none).", [
    "deployment",
    "state",
  ]),
  g(
    "llmgw_replicas_leaving",
    "Replicas leaving service by deployment and phase: waiting (serves until its replacement is ready) or draining (takes no new requests, finishing those in flight). Both phases present, 0 when none.",
    ["deployment", "phase"],
  ),
  g(
    "llmgw_deployment_info",
    "Always 1 per deployment; carries its served model name (the router's `model` label), GPU class and engine.",
    ["deployment", "model", "gpu_class", "engine"],
  ),
  g("llmgw_deployment_replicas_desired", "Replicas the deployment asks for.", ["deployment"]),
  g("llmgw_deployment_replicas_ready", "Replicas of the deployment that are ready.", [
    "deployment",
  ]),
  g(
    "llmgw_deployment_unschedulable",
    "1 when the scheduler could not place every desired replica, else 0.",
    ["deployment"],
  ),
  g(
    "llmgw_deployment_invalid",
    "1 when this release refuses the deployment's stored spec (an engine flag or env name an older release accepted): its replicas run on, and nothing is placed, replaced or updated for it until a corrected spec is deployed; else 0.",
    ["deployment"],
  ),
  g(
    "llmgw_routers",
    "Routers by state: connected (watching the routing state now; the in-process router counts) or disconnected within the last 10 minutes. Each router admits 1/connected of every replica's capacity and of every key's limits.",
    ["state"],
  ),
  c(
    "llmgw_gpu_readings_rejected_total",
    "GPU readings refused at heartbeat ingest, by reason (not_an_object|wrong_type|non_finite|negative|out_of_range|label_too_long).",
    ["reason"],
  ),
  c(
    "llmgw_cluster_view_errors_total",
    "Scrapes where reading the cluster view threw; cluster families are missing from those scrapes.",
    [],
  ),
];

const LATENCY_BUCKETS = [
  0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
] as const;
const TTFT_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60] as const;
const CHUNK_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5] as const;
const QUEUE_BUCKETS = [0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30] as const;
const DECISION_BUCKETS = [
  0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05,
] as const;
const RATIO_BUCKETS = [0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1] as const;

/** Router families: the router records them through `createRouterMetrics` handles. */
/**
 * A router's own state, read at scrape time from its routing runtime and usage reporter
 * (registered by `@llmgw/router-server`); unlabelled. The state age is absent until a control
 * plane was heard, the usage counts on a router that records no usage.
 */
export const ROUTER_STATE_FAMILIES: readonly FamilySpec[] = [
  g(
    "llmgw_router_state_age_seconds",
    "Seconds since this router last heard from a control plane (live stream or its saved state); absent until it has",
    [],
  ),
  g(
    "llmgw_router_state_version",
    "Routing membership version this router holds (0 before its first snapshot)",
    [],
  ),
  g(
    "llmgw_router_control_plane_connected",
    "1 while this router's routing stream to a control plane is open, else 0",
    [],
  ),
  g(
    "llmgw_router_state_stale",
    "1 while this router refuses requests because no control plane has confirmed its routing state for longer than its --max-state-age, else 0; absent without --max-state-age",
    [],
  ),
  g(
    "llmgw_router_cache_isolation",
    "1 while this router salts chat, completion and embedding requests per tenant or key (--cache-isolation tenant|key), else 0; routers of one cluster should agree",
    [],
  ),
  g(
    "llmgw_router_routers",
    "Routers sharing the cluster as this router last heard; it admits 1/routers of each replica's capacity and of each key's limits",
    [],
  ),
  c(
    "llmgw_router_usage_batches_refused_total",
    "Usage batches the control plane refused for good (an invalid argument) since this router started: set aside in its state dir, never sent again; absent on a router that records no usage",
    [],
  ),
  c(
    "llmgw_router_usage_requests_refused_total",
    "Requests in the usage batches the control plane refused for good: their usage is charged to no one; absent on a router that records no usage",
    [],
  ),
];

/**
 * A router's exchange with the other routers (`llmgw router --peer`), registered by
 * `@llmgw/router-server` only when it has peers.
 */
export const ROUTER_PEER_FAMILIES: readonly FamilySpec[] = [
  c(
    "llmgw_router_peer_events_total",
    "Routing events exchanged with the other routers (a dispatch, a first byte), by direction and outcome: out sent, or dropped while no stream to that peer is open or its buffer is full; in applied, or invalid (the stream is ended with the reason).",
    ["direction", "outcome"],
  ),
  g(
    "llmgw_router_peers_connected",
    "Other routers this router has its event stream open to, read at scrape time.",
    [],
  ),
];

export const ROUTER_FAMILIES: readonly FamilySpec[] = [
  c("llmgw_router_requests_total", "Answered requests by model, endpoint and HTTP status code.", [
    "model",
    "endpoint",
    "code",
  ]),
  h(
    "llmgw_router_request_duration_seconds",
    "Time from request received to last byte sent (or error).",
    ["model", "endpoint"],
    LATENCY_BUCKETS,
  ),
  h(
    "llmgw_router_time_to_first_token_seconds",
    "Time from request received to the first response byte of a streamed answer.",
    ["model"],
    TTFT_BUCKETS,
  ),
  h(
    "llmgw_router_inter_chunk_seconds",
    "Gap between consecutive chunks of a streamed answer.",
    ["model"],
    CHUNK_BUCKETS,
  ),
  c("llmgw_router_prompt_tokens_total", "Prompt tokens as reported by the engine's usage.", [
    "model",
  ]),
  c(
    "llmgw_router_completion_tokens_total",
    "Completion tokens as reported by the engine's usage.",
    ["model"],
  ),
  g("llmgw_router_requests_in_flight", "Requests proxied upstream right now, by model.", ["model"]),
  g(
    "llmgw_router_replica_requests_in_flight",
    "Requests in flight to each replica (the load the scorer sees).",
    ["model", "replica"],
  ),
  g("llmgw_router_queue_depth", "Requests waiting for admission, by model.", ["model"]),
  h(
    "llmgw_router_queue_wait_seconds",
    "Time spent in the admission queue, by outcome (admitted|timed_out|cancelled|shed).",
    ["model", "outcome"],
    QUEUE_BUCKETS,
  ),
  c(
    "llmgw_router_admission_rejections_total",
    "Requests refused before reaching an engine, by reason (queue_full|queue_timeout|shed|no_ready_replica|model_loading|model_not_found|body_too_large|invalid_request).",
    ["model", "reason"],
  ),
  c(
    "llmgw_router_upstream_errors_total",
    "Failures talking to a replica, by kind (connect|timeout|reset|http_5xx|stream_aborted|protocol).",
    ["model", "replica", "kind"],
  ),
  c(
    "llmgw_router_cached_prompt_tokens_total",
    "Prompt tokens the engine reported serving from its prefix cache (usage.prompt_tokens_details.cached_tokens).",
    ["model"],
  ),
  c(
    "llmgw_router_prefix_predictions_total",
    "Requests whose cached tokens are known (reported, or left out by an engine seen to report them, as vLLM leaves out a 0), by where the router's prefix knowledge came from (precise: the engines' KV events; approximate: its own model) and how it fared (hit|miss: it agreed; false_hit: it expected a cached prefix the engine lacked; missed_hit: the engine had one it did not expect).",
    ["model", "source", "outcome"],
  ),
  c(
    "llmgw_router_affinity_hints_total",
    "Requests routed by an affinity hint, by its source (prompt_cache_key|header|safety_identifier|user).",
    ["model", "source"],
  ),
  c(
    "llmgw_router_retries_total",
    "Requests retried after a connect failure before any byte: on the next-best replica, or on the same one over a new connection when the engine closed the one used and no other replica can take it.",
    ["model"],
  ),
  g(
    "llmgw_router_circuit_state",
    "State set per replica: 1 for the circuit's current state (closed|open|half_open), 0 for the others.",
    ["model", "replica", "state"],
  ),
  c(
    "llmgw_router_circuit_transitions_total",
    "Circuit-breaker transitions per replica, by the state entered.",
    ["model", "replica", "to"],
  ),
  h(
    "llmgw_router_routing_decision_seconds",
    "Time to parse, hash and score one request, by where it ran (inline|pool).",
    ["model", "path"],
    DECISION_BUCKETS,
  ),
  h(
    "llmgw_router_chosen_score",
    "Score of the replica each request was sent to (0..1, higher is better).",
    ["model"],
    RATIO_BUCKETS,
  ),
  h(
    "llmgw_router_prefix_hit_ratio",
    "Share of the prompt the chosen replica held (0..1), in the blocks the match counted: the engine's in precise mode, the router's (a partial one in quarters) otherwise.",
    ["model"],
    RATIO_BUCKETS,
  ),
  c(
    "llmgw_router_prefix_hit_requests_total",
    "Requests routed to a replica that had served at least one block of their prefix.",
    ["model"],
  ),
  c(
    "llmgw_router_routing_fallbacks_total",
    "Requests scored without part of the signals, by reason (missing_load_signals|stale_load_signals: load; kv_events_not_synced|unsupported_request|tokenizer_failed: a precise-mode deployment routed on the approximate prefix index), never silently.",
    ["model", "reason"],
  ),
  c(
    "llmgw_router_client_disconnects_total",
    "Clients that went away before the answer ended, by phase (queued|before_first_byte|streaming).",
    ["model", "phase"],
  ),
  g(
    "llmgw_router_worker_pool_utilization_ratio",
    "Busy share of the scoring worker pool (0..1), sampled at scrape time.",
    [],
  ),
  g("llmgw_router_worker_pool_queue_size", "Tasks waiting for a scoring worker.", []),
  c(
    "llmgw_router_scoring_tasks_total",
    "Requests scored, by where (inline on the main thread or in the worker pool).",
    ["path"],
  ),
  c(
    "llmgw_router_auth_failures_total",
    "Requests refused for their API key, by reason (missing|invalid|model_not_allowed; a revoked key reads invalid: routers hold only keys in force).",
    ["reason"],
  ),
  c(
    "llmgw_router_rate_limited_total",
    "Requests refused by a key's or its tenant's limit, by key name (never the secret) and limit (key-rpm|key-tpm|key-concurrency|key-budget|tenant-rpm|tenant-tpm|tenant-concurrency|tenant-budget).",
    ["key_name", "limit"],
  ),
  g(
    "llmgw_router_replicas_available",
    "Ready replicas the router can send a model's requests to.",
    ["model"],
  ),
  c(
    "llmgw_router_bytes_total",
    "Body bytes moved by the router, by direction (in: from clients, out: to clients).",
    ["model", "endpoint", "direction"],
  ),
];

/**
 * Usage the control plane stored from the routers' batches, cumulative since it started, each
 * batch counted once (a batch sent again is not). Labelled by tenant and model only, never by
 * key: tenants and deployed models are few, keys are many.
 */
/** The control plane's own work, registered by the leader (`createControlPlaneMetrics`). */
export const CONTROL_PLANE_FAMILIES: readonly FamilySpec[] = [
  h(
    "llmgw_control_plane_reconcile_duration_seconds",
    "Time of one reconcile on the leader: the scheduler's input, its plan, the store writes and the desired sets it changed (a leader's first one, at its start or takeover, plans every node with the scheduler's caches cold).",
    [],
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
  ),
];

export const USAGE_FAMILIES: readonly FamilySpec[] = [
  c(
    "llmgw_usage_requests_total",
    "Requests the routers reported, by tenant and model, from stored usage batches.",
    ["tenant", "model"],
  ),
  c(
    "llmgw_usage_tokens_total",
    "Tokens the routers reported, by tenant, model and type (prompt|cached|completion; cached tokens are part of prompt, counted where the engine reported them: no cached series until one did).",
    ["tenant", "model", "type"],
  ),
  c(
    "llmgw_usage_gpu_seconds_total",
    "GPU-seconds the routers' requests used: each request's share of its replica's GPUs over its duration.",
    ["tenant", "model"],
  ),
  c(
    "llmgw_usage_estimated_requests_total",
    "Requests charged an estimate (cut short, or the engine reported no usage).",
    ["tenant", "model"],
  ),
  c(
    "llmgw_usage_refused_total",
    "Answers whose engine-reported usage the router refused as implausible and charged its estimate instead.",
    ["tenant", "model"],
  ),
];
