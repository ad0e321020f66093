import { describe, expect, it } from "vitest";
import { metricNamesInPromQL, promQLInDashboard } from "./promql.js";

describe("metricNamesInPromQL", () => {
  it.each([
    ["llmgw_node_up", ["llmgw_node_up"]],
    [
      'sum by (gpu_class) (llmgw_cluster_gpus{state="free", gpu_class=~"$gpu_class"})',
      ["llmgw_cluster_gpus"],
    ],
    [
      'histogram_quantile(0.99, sum by (le, model) (rate(llmgw_router_time_to_first_token_seconds_bucket{model=~"$model"}[$__rate_interval])))',
      ["llmgw_router_time_to_first_token_seconds"],
    ],
    [
      'llmgw_gpu_memory_used_bytes * on (node, gpu) group_left (deployment) llmgw_gpu_allocation{deployment="x"}',
      ["llmgw_gpu_memory_used_bytes", "llmgw_gpu_allocation"],
    ],
    [
      "topk(10, time() - llmgw_node_last_heartbeat_timestamp_seconds) > 1e3",
      ["llmgw_node_last_heartbeat_timestamp_seconds"],
    ],
    ["llmgw_a_sum / llmgw_a_count unless on (x) up", ["llmgw_a", "up"]],
    ["sum(rate(foo_total[5m] offset 1h)) by (code) == bool 0", ["foo_total"]],
  ])("%s", (expr, names) => {
    expect([...metricNamesInPromQL(expr)].sort()).toEqual([...names].sort());
  });
});

describe("promQLInDashboard", () => {
  it("collects panel targets and label_values variables", () => {
    const dash = {
      templating: {
        list: [
          {
            definition: 'label_values(llmgw_deployment_info{a="b"}, deployment)',
            query: { query: "x" },
          },
        ],
      },
      panels: [
        { targets: [{ expr: "llmgw_node_up" }] },
        { panels: [{ targets: [{ expr: "llmgw_replicas" }] }] },
      ],
    };
    expect(promQLInDashboard(dash)).toEqual([
      'llmgw_deployment_info{a="b"}',
      "llmgw_node_up",
      "llmgw_replicas",
    ]);
  });
});
