import { create } from "@bufbuild/protobuf";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import {
  type ApiKey,
  ApiKeySchema,
  type ClusterService,
  ControlPlaneInstanceSchema,
  type Event,
  EventSchema,
  RouterInfoSchema,
  type Tenant,
  TenantSchema,
  type TokenBudget,
  type WatchEventsResponse,
  WatchEventsResponseSchema,
} from "@llmgw/proto";
import {
  budgetPeriodFromProto,
  priorityClassFromProto,
  priorityClassToProto,
  tokenBudgetToProto,
} from "@llmgw/wire";
import { deploymentSpecFromProto } from "../convert/deployment.js";
import {
  clusterSummaryToProto,
  deploymentToProto,
  nodeToProto,
  replicaToProto,
} from "../convert/views.js";
import type { Cluster } from "../domain/cluster.js";
import type { TenantInput, TokenBudgetInput } from "../domain/tenants.js";
import type { ClusterUsage } from "../domain/usage.js";
import { ControlPlaneError } from "../errors.js";
import type { RouterRegistry } from "../routing/router-registry.js";
import type { ApiKeyRecord, EventRecord, TenantRecord } from "../store/types.js";
import { requireToken } from "./auth.js";
import { binaryCodec, nodeForWire, type WireOptions } from "./pre-encoded.js";
import { usageRowToProto, validateGetUsageRequest } from "./usage-requests.js";

/** A control-plane instance for `GetClusterStatus` (see `store/postgres-lease.ts`). */
export interface ControlPlaneInstanceInfo {
  readonly id: string;
  readonly url: string;
  readonly version: string;
  readonly leader: boolean;
  readonly startedAtMs: number;
  readonly seenAgoMs: number;
}

const wireOf = (ctx: HandlerContext): WireOptions => ({ binary: binaryCodec(ctx.requestHeader) });

/** `ListNodesRequest.nodes`: how many names, and how long each. */
const MAX_LISTED_NAMES = 1_000;
const MAX_NODE_NAME_CHARS = 256;

const ADMIN = "the admin token (llmgw control-plane token --admin; LLMGW_ADMIN_TOKEN)";

function required(value: string, field: string): string {
  if (!value)
    throw new ControlPlaneError("LLMGW_CONTROL_PLANE_INVALID_ARGUMENT", `${field} is required`);
  return value;
}

/** `ClusterService`, the admin API; every call needs the admin token. */
export function createClusterService(
  cluster: Cluster,
  adminToken: string,
  opts: {
    version: string;
    shutdown: AbortSignal;
    routers?: RouterRegistry;
    /** Publishes a pending routing change now (the publisher's `flush`). */
    flushRouting?: () => void;
    /** "sqlite" or "postgres", for `GetClusterStatus`. */
    store?: string;
    /** The instances sharing the store (PostgreSQL), for `GetClusterStatus`. */
    controlPlanes?: () => Promise<readonly ControlPlaneInstanceInfo[]>;
    /** The usage `GetUsage` reads; absent: it answers `…_STORE_UNAVAILABLE`. */
    usage?: ClusterUsage;
  },
): ServiceImpl<typeof ClusterService> {
  const flush = opts.flushRouting ?? (() => {});
  const admin = (ctx: HandlerContext) => requireToken(ctx.requestHeader, adminToken, ADMIN);
  return {
    listNodes(req, ctx) {
      admin(ctx);
      if (
        req.nodes.length > MAX_LISTED_NAMES ||
        req.nodes.some((n) => n.length > MAX_NODE_NAME_CHARS)
      )
        throw new ControlPlaneError(
          "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
          `ListNodesRequest.nodes: at most ${MAX_LISTED_NAMES} names of at most ${MAX_NODE_NAME_CHARS} characters (${req.nodes.length} given)`,
        );
      const wire = { ...wireOf(ctx), omitInventory: req.omitInventory };
      return {
        nodes: cluster.listNodes(req.nodes).map((n) => nodeForWire(nodeToProto(n), wire)),
      };
    },
    getNode(req, ctx) {
      admin(ctx);
      return {
        node: nodeForWire(nodeToProto(cluster.getNode(required(req.node, "node"))), wireOf(ctx)),
      };
    },
    cordonNode(req, ctx) {
      admin(ctx);
      return {
        node: nodeForWire(nodeToProto(cluster.cordonNode(required(req.node, "node"))), wireOf(ctx)),
      };
    },
    uncordonNode(req, ctx) {
      admin(ctx);
      return {
        node: nodeForWire(
          nodeToProto(cluster.uncordonNode(required(req.node, "node"))),
          wireOf(ctx),
        ),
      };
    },
    drainNode(req, ctx) {
      admin(ctx);
      return {
        node: nodeForWire(nodeToProto(cluster.drainNode(required(req.node, "node"))), wireOf(ctx)),
      };
    },
    revokeNode(req, ctx) {
      admin(ctx);
      cluster.revokeNode(required(req.node, "node"));
      return {};
    },
    resetNode(req, ctx) {
      admin(ctx);
      cluster.resetNode(required(req.node, "node"));
      return {};
    },
    clearGpuFaults(req, ctx) {
      admin(ctx);
      return { cleared: cluster.clearGpuFaults(required(req.node, "node"), req.gpuIndex) };
    },
    unavoidNode(req, ctx) {
      admin(ctx);
      const nodeIds = cluster.unavoid(
        required(req.deployment, "deployment"),
        req.node === "" ? undefined : req.node,
      );
      return { nodeIds };
    },
    applyDeployment(req, ctx) {
      admin(ctx);
      if (!req.deployment)
        throw new ControlPlaneError(
          "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
          "deployment is required",
        );
      const result = cluster.applyDeployment(deploymentSpecFromProto(req.deployment));
      flush();
      return { deployment: deploymentToProto(result.status), changed: result.changed };
    },
    scaleDeployment(req, ctx) {
      admin(ctx);
      const deployment = cluster.scaleDeployment(required(req.name, "name"), req.replicas);
      flush();
      return { deployment: deploymentToProto(deployment) };
    },
    deleteDeployment(req, ctx) {
      admin(ctx);
      cluster.deleteDeployment(required(req.name, "name"));
      flush();
      return {};
    },
    getDeployment(req, ctx) {
      admin(ctx);
      return {
        deployment: deploymentToProto(cluster.deploymentStatus(required(req.name, "name"))),
      };
    },
    listDeployments(_req, ctx) {
      admin(ctx);
      return { deployments: cluster.listDeployments().map(deploymentToProto) };
    },
    listReplicas(req, ctx) {
      admin(ctx);
      return {
        replicas: cluster
          .listReplicas({ deployment: req.deployment || undefined, node: req.node || undefined })
          .map(replicaToProto),
      };
    },
    createApiKey(req, ctx) {
      admin(ctx);
      const { key, secret } = cluster.apiKeys.create({
        name: req.name,
        models: req.models,
        requestsPerMinute: req.requestsPerMinute,
        tokensPerMinute: req.tokensPerMinute,
        maxConcurrency: req.maxConcurrency,
        tenant: req.tenant,
        budgets: budgetsFromProto(req.budgets),
        priority: priorityFromProto(req.priority),
      });
      // The in-process router knows the key when this answer arrives: a client that creates
      // a key and uses it at once is not told it is wrong.
      flush();
      return { key: apiKeyToProto(key), secret };
    },
    listApiKeys(req, ctx) {
      admin(ctx);
      return { keys: cluster.apiKeys.list(req.includeRevoked).map(apiKeyToProto) };
    },
    revokeApiKey(req, ctx) {
      admin(ctx);
      const key = cluster.apiKeys.revoke(required(req.key, "key"));
      flush();
      return { key: apiKeyToProto(key) };
    },
    createTenant(req, ctx) {
      admin(ctx);
      const t = req.tenant;
      if (t === undefined)
        throw new ControlPlaneError("LLMGW_CONTROL_PLANE_INVALID_ARGUMENT", "tenant is required");
      const tenant = cluster.tenants.create(t.name, tenantInputFromProto(t));
      flush();
      return { tenant: tenantToProto(tenant, 0) };
    },
    listTenants(_req, ctx) {
      admin(ctx);
      return {
        tenants: cluster.tenants
          .list()
          .map((t) => tenantToProto(t, cluster.apiKeys.activeKeysOf(t.name))),
      };
    },
    updateTenant(req, ctx) {
      admin(ctx);
      const t = req.tenant;
      if (t === undefined)
        throw new ControlPlaneError("LLMGW_CONTROL_PLANE_INVALID_ARGUMENT", "tenant is required");
      const tenant = cluster.tenants.update(
        required(t.name, "tenant.name"),
        tenantInputFromProto(t),
        req.fields,
        req.ifUpdatedAtUnixMs === undefined ? undefined : Number(req.ifUpdatedAtUnixMs),
      );
      flush();
      return { tenant: tenantToProto(tenant, cluster.apiKeys.activeKeysOf(tenant.name)) };
    },
    deleteTenant(req, ctx) {
      admin(ctx);
      cluster.tenants.delete(required(req.name, "name"));
      flush();
      return {};
    },
    listEvents(req, ctx) {
      admin(ctx);
      return {
        events: cluster.events
          .list({ afterId: Number(req.afterId), limit: Math.min(req.limit || 100, 10_000) })
          .map(eventToProto),
      };
    },
    async *watchEvents(req, ctx): AsyncIterable<WatchEventsResponse> {
      admin(ctx);
      const queue: Event[] = [];
      let wake: (() => void) | undefined;
      const off = cluster.events.subscribe((e) => {
        queue.push(eventToProto(e));
        wake?.();
      });
      const stop = AbortSignal.any([ctx.signal, opts.shutdown]);
      // One abort listener for the whole stream (one per wait would pile up on a long watch).
      const onStop = () => wake?.();
      stop.addEventListener("abort", onStop, { once: true });
      try {
        let lastId = 0n;
        for (const event of req.backlog > 0
          ? cluster.events.list({ limit: Math.min(req.backlog, 10_000) }).map(eventToProto)
          : []) {
          lastId = event.id;
          yield create(WatchEventsResponseSchema, { event });
        }
        while (!stop.aborted) {
          while (queue.length > 0) {
            const event = queue.shift() as Event;
            if (event.id > lastId) yield create(WatchEventsResponseSchema, { event });
          }
          if (queue.length === 0 && !stop.aborted) {
            await new Promise<void>((resolve) => {
              wake = resolve;
            });
          }
          wake = undefined;
        }
      } finally {
        stop.removeEventListener("abort", onStop);
        off();
      }
    },
    async getClusterStatus(_req, ctx) {
      admin(ctx);
      const status = clusterSummaryToProto(cluster.clusterStatus());
      status.version = opts.version;
      status.store = opts.store ?? "sqlite";
      status.controlPlanes = ((await opts.controlPlanes?.()) ?? []).map((i) =>
        create(ControlPlaneInstanceSchema, {
          id: i.id,
          url: i.url,
          version: i.version,
          leader: i.leader,
          startedAtUnixMs: BigInt(i.startedAtMs),
          seenAgoMs: BigInt(Math.max(0, i.seenAgoMs)),
        }),
      );
      return status;
    },
    async getUsage(req, ctx) {
      admin(ctx);
      const { key, ...query } = validateGetUsageRequest(req, cluster.now());
      if (opts.usage === undefined)
        throw new ControlPlaneError(
          "LLMGW_CONTROL_PLANE_STORE_UNAVAILABLE",
          "this control plane serves no usage now",
        );
      // Keys are revoked, never deleted: every id a row can name has its name here. A name
      // may cover a revoked key and the active one that took the name after it.
      const keys = cluster.apiKeys.list(true);
      const names = new Map(keys.map((k) => [k.id, k.name]));
      let keyIds: string[] | undefined;
      if (key !== undefined) {
        keyIds = keys.filter((k) => k.id === key || k.name === key).map((k) => k.id);
        if (keyIds.length === 0) keyIds = [key];
      }
      const rows = await opts.usage.query({
        ...query,
        ...(keyIds === undefined ? {} : { keyIds }),
      });
      return { rows: rows.map((r) => usageRowToProto(r, names.get(r.keyId) ?? "")) };
    },
    listRouters(_req, ctx) {
      admin(ctx);
      const now = Date.now();
      return {
        routers: (opts.routers?.list() ?? []).map((r) =>
          create(RouterInfoSchema, {
            id: r.id,
            address: r.address,
            version: r.version,
            connected: r.connected,
            connectedAtUnixMs: BigInt(r.connectedAtMs),
            lastSeenUnixMs: BigInt(r.lastSeenMs),
            epoch: r.epoch,
            stateVersion: BigInt(r.stateVersion),
            inProcess: r.inProcess,
            cacheIsolation: r.cacheIsolation,
            appliesTenantCacheIsolation: r.appliesTenantCacheIsolation,
            stateAgeMs: BigInt(Math.max(0, now - r.lastSeenMs)),
          }),
        ),
      };
    },
  };
}

/** A stored key as the admin API shows it: never the secret or its hash. */
function apiKeyToProto(k: ApiKeyRecord): ApiKey {
  return create(ApiKeySchema, {
    id: k.id,
    name: k.name,
    prefix: k.prefix,
    models: [...k.models],
    requestsPerMinute: k.requestsPerMinute,
    tokensPerMinute: k.tokensPerMinute,
    maxConcurrency: k.maxConcurrency,
    createdAtUnixMs: BigInt(k.createdAtMs),
    revokedAtUnixMs: k.revokedAtMs === undefined ? undefined : BigInt(k.revokedAtMs),
    tenant: k.tenant ?? "",
    budgets: k.budgets.map(tokenBudgetToProto),
    priority: priorityClassToProto(k.priority),
  });
}

/** A stored tenant as the admin API shows it, with its count of non-revoked keys. */
function tenantToProto(t: TenantRecord, activeKeys: number): Tenant {
  return create(TenantSchema, {
    name: t.name,
    requestsPerMinute: t.requestsPerMinute,
    tokensPerMinute: t.tokensPerMinute,
    maxConcurrency: t.maxConcurrency,
    budgets: t.budgets.map(tokenBudgetToProto),
    priority: priorityClassToProto(t.priority),
    weight: t.weight,
    cacheIsolation: t.cacheIsolation ?? "",
    createdAtUnixMs: BigInt(t.createdAtMs),
    updatedAtUnixMs: BigInt(t.updatedAtMs),
    activeKeys,
  });
}

/**
 * Wire budgets as the domain checks them: an unspecified or unknown period stays missing or
 * its number (refused there, naming the budget); tokens past 2⁵³ stay past it (refused too).
 */
function budgetsFromProto(budgets: readonly TokenBudget[]): TokenBudgetInput[] {
  return budgets.map((b) => ({
    period: budgetPeriodFromProto(b.period) ?? (b.period === 0 ? undefined : String(b.period)),
    model: b.model,
    tokens: Number(b.tokens),
  }));
}

/** A wire priority as the domain checks it: unspecified is undefined, an unknown one its number. */
function priorityFromProto(p: number): string | undefined {
  return p === 0 ? undefined : (priorityClassFromProto(p) ?? String(p));
}

function tenantInputFromProto(t: Tenant): TenantInput {
  return {
    requestsPerMinute: t.requestsPerMinute,
    tokensPerMinute: t.tokensPerMinute,
    maxConcurrency: t.maxConcurrency,
    budgets: budgetsFromProto(t.budgets),
    priority: priorityFromProto(t.priority),
    weight: t.weight,
    cacheIsolation: t.cacheIsolation,
  };
}

function eventToProto(e: EventRecord): Event {
  return create(EventSchema, {
    id: BigInt(e.id),
    atUnixMs: BigInt(e.atMs),
    kind: e.kind,
    subject: e.subject,
    message: e.message,
    severity: e.severity,
  });
}
