import type { ReplicaRoute, RouteResolution, RouteTable } from "@llmgw/router";
import type { Cluster } from "./domain/cluster.js";
import type { PublicHandler, PublicHandlerContext } from "./run.js";

const IN_PROCESS_ROUTER = Symbol.for("llmgw.control-plane.in-process-router");

/**
 * @deprecated The control plane runs its router in-process by default now (`startRouter`
 * over the routing feed): pass no `publicHandler`. Kept so that callers written as
 * `publicHandler: (ctx) => createPublicApi(ctx)` still get exactly that default.
 */
export function createPublicApi(_ctx?: PublicHandlerContext): PublicHandler {
  return {
    handle: (_req, res) => {
      // Never served: startControlPlane starts the in-process router instead.
      res.writeHead(500).end();
    },
    [IN_PROCESS_ROUTER]: true,
  } as PublicHandler;
}

/** True for {@link createPublicApi}'s handler: "the default in-process router". */
export function isInProcessRouter(handler: PublicHandler): boolean {
  return (handler as { [IN_PROCESS_ROUTER]?: unknown })[IN_PROCESS_ROUTER] === true;
}

/**
 * @deprecated Test-only, and going: routers route by the routing state (`createRoutingState`
 * over the routing feed), never by resolutions built from the Cluster. Tests that check
 * routability read `cluster.routingMembership()`.
 */
export function createClusterRouteTable(cluster: Cluster): RouteTable {
  let cachedVersion = -1;
  const cache = new Map<string, RouteResolution | undefined>();
  const resolveFresh = (model: string): RouteResolution | undefined => {
    const spec = cluster.deploymentSpecs().find((s) => s.servedModelName === model);
    if (!spec) return undefined;
    const ready = cluster.readyReplicas(model);
    const replicas: ReplicaRoute[] = ready.map((r) => ({
      id: r.replicaId,
      baseUrl: `http://${r.endpoint}`,
      state: "ready",
      capacity: r.capacity,
      load: r.load,
      ...(r.apiKey === undefined ? {} : { apiKey: r.apiKey }),
    }));
    return {
      deployment: ready[0]?.deployment ?? spec.name,
      policy: ready[0]?.routingPolicy ?? spec.routingPolicy,
      replicas,
      loading: cluster.hasLoadingReplicas(model),
    };
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
    subscribe: () => () => {},
  };
}
