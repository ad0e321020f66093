/**
 * Routers for the integration tests, started the way production starts them: {@link startRouter}
 * fed by a manual routing feed (what the control plane's publisher would stream), so the route
 * table and keys a test sees are the routing state's projection, not a hand-built table.
 */
import { createHash } from "node:crypto";
import type {
  EngineCacheIsolation,
  KeyGrant,
  PriorityClass,
  PromptTokenizerKind,
  ReplicaLoad,
  RoutedReplicaState,
  RouterMetricsSink,
  RoutingPolicy,
  RoutingSnapshot,
  TenantGrant,
  TokenBudget,
} from "@llmgw/router";
import { createManualRoutingFeed, type ManualRoutingFeed } from "@llmgw/router/testing";
import type { Registry } from "prom-client";
import {
  type HttpListenerOptions,
  type RouterServiceOptions,
  type RunningRouter,
  startRouter,
} from "../src/index.js";

/** Lower-case hex sha256, as key grants hold secrets. */
export const sha256Hex = (text: string): string => createHash("sha256").update(text).digest("hex");

/** One replica of a {@link ModelSpec}. */
export interface ReplicaSpec {
  readonly id: string;
  readonly baseUrl: string;
  /** Default 8. */
  readonly capacity?: number;
  /** Default "ready". */
  readonly state?: RoutedReplicaState;
  readonly apiKey?: string;
  readonly load?: ReplicaLoad;
  /** Where its agent serves its KV-cache blocks (precise mode). */
  readonly kvEventsUrl?: string;
  /** GPUs it holds (GPU-seconds are a share of these). */
  readonly gpus?: number;
}

/** A served model: its deployment (default: the model name) and replicas. */
export interface ModelSpec {
  readonly deployment?: string;
  /** Default "llmgw". */
  readonly policy?: RoutingPolicy;
  readonly loading?: boolean;
  readonly replicas?: readonly ReplicaSpec[];
  /** How its requests are tokenized for precise routing. */
  readonly tokenizer?: PromptTokenizerKind;
  /** How its engines keep a request's cache apart (absent: not known). */
  readonly cacheIsolation?: EngineCacheIsolation;
}

/** An API key by its secret. */
export interface KeySpec {
  readonly id: string;
  readonly name: string;
  readonly models?: readonly string[];
  readonly rpm?: number;
  readonly tpm?: number;
  readonly maxConcurrency?: number;
  /** Owning tenant's name. */
  readonly tenant?: string;
  readonly budgets?: readonly TokenBudget[];
  readonly priority?: PriorityClass;
}

/** What the control plane would stream first, from a short description. */
export function routingSnapshot(spec: {
  readonly models?: Readonly<Record<string, ModelSpec>>;
  readonly keys?: Readonly<Record<string, KeySpec>>;
  readonly tenants?: readonly TenantGrant[];
  readonly routers?: number;
  readonly epoch?: string;
  readonly version?: number;
}): RoutingSnapshot {
  const now = Date.now();
  const models = Object.entries(spec.models ?? {});
  return {
    kind: "snapshot",
    epoch: spec.epoch ?? "epoch-test",
    version: spec.version ?? 1,
    models: models.map(([name, m]) => ({
      name,
      deployment: m.deployment ?? name,
      policy: m.policy ?? "llmgw",
      loading: m.loading ?? false,
      ...(m.tokenizer === undefined ? {} : { tokenizer: m.tokenizer }),
      ...(m.cacheIsolation === undefined ? {} : { cacheIsolation: m.cacheIsolation }),
    })),
    replicas: models.flatMap(([name, m]) =>
      (m.replicas ?? []).map((r) => ({
        id: r.id,
        model: name,
        deployment: m.deployment ?? name,
        baseUrl: r.baseUrl,
        state: r.state ?? "ready",
        capacity: r.capacity ?? 8,
        ...(r.apiKey === undefined ? {} : { apiKey: r.apiKey }),
        ...(r.kvEventsUrl === undefined ? {} : { kvEventsUrl: r.kvEventsUrl }),
        ...(r.gpus === undefined ? {} : { gpus: r.gpus }),
        ...(r.load === undefined ? {} : { load: r.load, loadReportedAtMs: now }),
      })),
    ),
    keys: Object.entries(spec.keys ?? {}).map(
      ([secret, k]): KeyGrant => ({
        id: k.id,
        name: k.name,
        secretSha256: sha256Hex(secret),
        ...(k.models === undefined ? {} : { models: k.models }),
        ...(k.rpm === undefined ? {} : { rpm: k.rpm }),
        ...(k.tpm === undefined ? {} : { tpm: k.tpm }),
        ...(k.maxConcurrency === undefined ? {} : { maxConcurrency: k.maxConcurrency }),
        ...(k.tenant === undefined ? {} : { tenant: k.tenant }),
        ...(k.budgets === undefined ? {} : { budgets: k.budgets }),
        ...(k.priority === undefined ? {} : { priority: k.priority }),
      }),
    ),
    ...(spec.tenants === undefined ? {} : { tenants: spec.tenants }),
    routers: spec.routers ?? 1,
    sentAtMs: now,
  };
}

/** A router on loopback over a manual feed that has already sent `snapshot` (when given). */
export async function startFedRouter(
  options: {
    readonly snapshot?: RoutingSnapshot;
    readonly router?: RouterServiceOptions;
    readonly listener?: HttpListenerOptions;
    readonly metrics?: RouterMetricsSink;
    readonly registry?: Registry;
    readonly stateDir?: string;
    readonly routerId?: string;
    readonly log?: (event: Readonly<Record<string, unknown>>) => void;
    readonly listen?: string;
    readonly usageReportIntervalMs?: number;
    readonly peers?: {
      readonly urls: readonly string[];
      readonly key: string;
      readonly renewMs?: number;
    };
  } = {},
): Promise<{ router: RunningRouter; feed: ManualRoutingFeed }> {
  const feed = createManualRoutingFeed();
  if (options.snapshot !== undefined) feed.push(options.snapshot);
  const router = await startRouter({
    routing: {
      feed,
      routerId: options.routerId ?? "router-test",
      ...(options.stateDir === undefined ? {} : { stateDir: options.stateDir }),
    },
    ...(options.router === undefined ? {} : { router: options.router }),
    ...(options.listener === undefined ? {} : { listener: options.listener }),
    ...(options.metrics === undefined ? {} : { metrics: options.metrics }),
    ...(options.registry === undefined ? {} : { registry: options.registry }),
    ...(options.log === undefined ? {} : { log: options.log }),
    ...(options.listen === undefined ? {} : { listen: options.listen }),
    ...(options.usageReportIntervalMs === undefined
      ? {}
      : { usageReportIntervalMs: options.usageReportIntervalMs }),
    ...(options.peers === undefined ? {} : { peers: options.peers }),
  });
  return { router, feed };
}
