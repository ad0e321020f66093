import { createRouterMetrics } from "@llmgw/metrics-collector";
import type { ApiKeyStore, ReplicaRoute, RouteResolution, RouteTable } from "@llmgw/router";
import {
  createPrometheusRouterMetricsSink,
  createRouterHandler,
  type RouterServiceOptions,
} from "@llmgw/router-server";
import type { Cluster } from "./domain/cluster.js";
import type { PublicHandler, PublicHandlerContext } from "./run.js";

/**
 * The router's view of the cluster, answered from memory: resolutions are rebuilt at most once
 * per cluster version (heartbeats bump it), so the hot path never touches the store.
 */
export function createClusterRouteTable(cluster: Cluster): RouteTable {
  let cachedVersion = -1;
  const cache = new Map<string, RouteResolution | undefined>();
  const listeners = new Set<(version: number) => void>();
  cluster.onChange(() => {
    for (const listener of listeners) listener(cluster.version);
  });
  const resolveFresh = (model: string): RouteResolution | undefined => {
    const spec = cluster.deploymentSpecs().find((s) => s.servedModelName === model);
    if (!spec) return undefined;
    const ready = cluster.readyReplicas(model);
    const deployment = ready[0]?.deployment ?? spec.name;
    const policy = ready[0]?.routingPolicy ?? spec.routingPolicy;
    const replicas: ReplicaRoute[] = ready.map((r) => ({
      id: r.replicaId,
      baseUrl: `http://${r.endpoint}`,
      state: "ready",
      capacity: r.capacity,
      load: r.load,
      ...(r.apiKey === undefined ? {} : { apiKey: r.apiKey, authorization: `Bearer ${r.apiKey}` }),
    }));
    return { deployment, policy, replicas, loading: cluster.hasLoadingReplicas(model) };
  };
  return {
    resolve(model) {
      if (cachedVersion !== cluster.version) {
        cache.clear();
        cachedVersion = cluster.version;
      }
      if (!cache.has(model)) cache.set(model, resolveFresh(model));
      return cache.get(model);
    },
    models: () => cluster.readyModels(),
    get version() {
      return cluster.version;
    },
    subscribe(listener) {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
  };
}

/** API keys checked against the control plane's hashed keys, in memory. */
export function createClusterApiKeyStore(cluster: Cluster): ApiKeyStore {
  return {
    verify(secret) {
      const grant = cluster.authenticateApiKey(secret);
      if (!grant) return undefined;
      return {
        id: grant.id,
        name: grant.name,
        ...(grant.models.length > 0 ? { models: grant.models } : {}),
        ...(grant.requestsPerMinute !== undefined ? { rpm: grant.requestsPerMinute } : {}),
        ...(grant.tokensPerMinute !== undefined ? { tpm: grant.tokensPerMinute } : {}),
        ...(grant.maxConcurrency !== undefined ? { maxConcurrency: grant.maxConcurrency } : {}),
      };
    },
  };
}

/**
 * The public listener's handler: the OpenAI-compatible router over the live cluster, with
 * its `llmgw_router_*` families on the control listener's registry.
 */
export function createPublicApi(
  ctx: PublicHandlerContext,
  options: RouterServiceOptions = {},
): PublicHandler {
  const routeTable = createClusterRouteTable(ctx.cluster);
  let handler: ReturnType<typeof createRouterHandler> | undefined;
  const metrics = createRouterMetrics(ctx.registry, {
    workerPool: () => handler?.workerPool(),
  });
  handler = createRouterHandler({
    routeTable,
    apiKeys: createClusterApiKeyStore(ctx.cluster),
    metrics: createPrometheusRouterMetricsSink(metrics),
    options: { noAuth: ctx.options.noAuth, ...options },
    log: (event) => ctx.log(`router ${JSON.stringify(event)}`),
  });
  const h = handler;
  return {
    handle: (req, res) => h(req, res),
    close: () => h.close(),
  };
}
