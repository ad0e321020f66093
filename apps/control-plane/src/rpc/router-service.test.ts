import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, createRouterTransport } from "@connectrpc/connect";
import {
  ClusterService,
  RouterService,
  type WatchRoutingResponse,
  WatchRoutingResponseSchema,
} from "@llmgw/proto";
import type { RoutingMessage } from "@llmgw/router";
import { schedule } from "@llmgw/scheduler";
import { routingMessageFromProto, routingMessageToProto } from "@llmgw/wire";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { Cluster } from "../domain/cluster.js";
import { ControlPlaneError } from "../errors.js";
import { createRoutingPublisher, type RoutingPublisher } from "../routing/publisher.js";
import { createRouterRegistry, type RouterRegistry } from "../routing/router-registry.js";
import { openSqliteStore } from "../store/sqlite-store.js";
import type { ClusterStore } from "../store/types.js";
import { createManualClock } from "../testing/manual-clock.js";
import { createClusterService } from "./cluster-service.js";
import { errorMappingInterceptor } from "./errors.js";
import { createRouterService, preEncodeRoutingResponse } from "./router-service.js";

const ROUTER_TOKEN = "llmgw-router-test";
const ADMIN_TOKEN = "llmgw-admin-test";
const JOIN_TOKEN = "llmgw-join-test";

let dir: string;
let store: ClusterStore;
let cluster: Cluster;
let publisher: RoutingPublisher;
let registry: RouterRegistry;
let shutdown: AbortController;
let routerClient: ReturnType<typeof createClient<typeof RouterService>>;
let adminClient: ReturnType<typeof createClient<typeof ClusterService>>;
const streams: AbortController[] = [];

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "llmgw-router-service-"));
  store = openSqliteStore({ file: join(dir, "state.db") });
  cluster = new Cluster({
    store,
    schedule,
    clock: createManualClock(),
    heartbeatIntervalMs: 1_000,
    unreachableAfterMs: 3_000,
    nodeLostAfterMs: 10_000,
    rendezvousPortMin: 29_500,
    rendezvousPortMax: 29_999,
  });
  registry = createRouterRegistry();
  publisher = createRoutingPublisher(cluster, {
    epoch: "epoch-1",
    coalesceMs: 5,
    routers: registry,
  });
  shutdown = new AbortController();
  const transport = createRouterTransport(
    (router) => {
      router.service(
        RouterService,
        createRouterService(publisher, registry, ROUTER_TOKEN, {
          shutdown: shutdown.signal,
          maxQueued: 64,
        }),
      );
      router.service(
        ClusterService,
        createClusterService(cluster, ADMIN_TOKEN, {
          version: "test",
          shutdown: shutdown.signal,
          routers: registry,
        }),
      );
    },
    { router: { interceptors: [errorMappingInterceptor] } },
  );
  routerClient = createClient(RouterService, transport);
  adminClient = createClient(ClusterService, transport);
});
afterEach(() => {
  for (const s of streams.splice(0)) s.abort();
  publisher.close();
  store.close();
  rmSync(dir, { recursive: true, force: true });
});

const bearer = (token: string) => ({ authorization: `Bearer ${token}` });

/** Opens a WatchRouting stream and collects what it delivers, converted back to plain form. */
function watch(
  routerId: string,
  options: { token?: string; address?: string; version?: string } = {},
) {
  const abort = new AbortController();
  streams.push(abort);
  const received: RoutingMessage[] = [];
  const done = (async () => {
    try {
      for await (const res of routerClient.watchRouting(
        { routerId, address: options.address ?? "", version: options.version ?? "0.1.0" },
        { headers: bearer(options.token ?? ROUTER_TOKEN), signal: abort.signal },
      )) {
        received.push(routingMessageFromProto(res as WatchRoutingResponse));
      }
      return undefined;
    } catch (error) {
      return ConnectError.from(error);
    }
  })();
  return { received, done, abort };
}

describe("RouterService.WatchRouting", () => {
  it.each([
    [
      "no token",
      undefined,
      "missing Authorization: Bearer header; this call needs the router token (llmgw control-plane token --router; LLMGW_ROUTER_TOKEN)",
    ],
    [
      "the join token",
      JOIN_TOKEN,
      "wrong token; this call needs the router token (llmgw control-plane token --router; LLMGW_ROUTER_TOKEN)",
    ],
    [
      "the admin token",
      ADMIN_TOKEN,
      "wrong token; this call needs the router token (llmgw control-plane token --router; LLMGW_ROUTER_TOKEN)",
    ],
    [
      "a node credential",
      "llmgw-node-abc",
      "wrong token; this call needs the router token (llmgw control-plane token --router; LLMGW_ROUTER_TOKEN)",
    ],
  ])("refuses %s", async (_name, token, message) => {
    const stream = routerClient.watchRouting(
      { routerId: "router-a" },
      token === undefined ? {} : { headers: bearer(token) },
    );
    const error = await (async () => {
      try {
        for await (const _ of stream) return undefined;
      } catch (e) {
        return ConnectError.from(e);
      }
    })();
    expect(error?.code).toBe(Code.Unauthenticated);
    expect(error?.rawMessage).toBe(message);
    expect(registry.list()).toEqual([]);
  });

  it.each([
    [
      { routerId: "" },
      "WatchRoutingRequest.router_id must be 1–63 letters, digits, '.', '_' or '-', starting alphanumeric (got \"\")",
    ],
    [
      { routerId: "-a" },
      "WatchRoutingRequest.router_id must be 1–63 letters, digits, '.', '_' or '-', starting alphanumeric (got \"-a\")",
    ],
    [
      { routerId: "a".repeat(64) },
      `WatchRoutingRequest.router_id must be 1–63 letters, digits, '.', '_' or '-', starting alphanumeric (got "${"a".repeat(64)}")`,
    ],
    [
      { address: "10.0.0.9" },
      'WatchRoutingRequest.address must be HOST:PORT of at most 255 characters, or empty (got "10.0.0.9")',
    ],
    [
      { address: `${"h".repeat(256)}:80` },
      `WatchRoutingRequest.address must be HOST:PORT of at most 255 characters, or empty (got "${"h".repeat(80)}…")`,
    ],
    [
      { version: "1.0 beta" },
      `WatchRoutingRequest.version must be at most 64 letters, digits, '.', '_', '+' or '-' (got "1.0 beta")`,
    ],
    [{ epoch: "e".repeat(65) }, "WatchRoutingRequest.epoch must be at most 64 characters (got 65)"],
    [
      { stateAgeMs: BigInt(-1) },
      "WatchRoutingRequest.state_age_ms must be 0–315360000000 (got -1)",
    ],
  ])("refuses a bad request field (case %#)", async (bad, message) => {
    const error = await (async () => {
      try {
        for await (const _ of routerClient.watchRouting(
          { routerId: "router-a", ...bad },
          { headers: bearer(ROUTER_TOKEN) },
        ))
          return undefined;
      } catch (e) {
        return ConnectError.from(e);
      }
    })();
    expect(error?.code).toBe(Code.InvalidArgument);
    expect(error?.rawMessage).toBe(message);
  });

  it("streams a snapshot then deltas, and lists the router with what it was sent", async () => {
    const { key } = cluster.createApiKey({ name: "team-a", models: [] });
    await vi.waitFor(() => expect(publisher.version).toBe(2), { interval: 2 });
    const a = watch("router-a", { address: "10.0.0.9:8080" });
    await vi.waitFor(() => expect(a.received).toHaveLength(1), { interval: 2 });
    expect(a.received[0]).toMatchObject({
      kind: "snapshot",
      epoch: "epoch-1",
      version: 2,
      routers: 1,
      keys: [{ id: key.id, name: "team-a" }],
    });
    cluster.revokeApiKey("team-a");
    await vi.waitFor(() => expect(a.received).toHaveLength(2), { interval: 2 });
    // One router connected is still a share divisor of 1: the only delta is the revoke.
    expect(a.received[1]).toMatchObject({ kind: "delta", version: 3, removedKeys: [key.id] });
    const { routers } = await adminClient.listRouters({}, { headers: bearer(ADMIN_TOKEN) });
    expect(routers).toMatchObject([
      {
        id: "router-a",
        address: "10.0.0.9:8080",
        version: "0.1.0",
        connected: true,
        inProcess: false,
        epoch: "epoch-1",
      },
    ]);
  });

  it("tells every router the router count, and lists both", async () => {
    const a = watch("router-a");
    await vi.waitFor(() => expect(a.received).toHaveLength(1), { interval: 2 });
    const b = watch("router-b");
    await vi.waitFor(
      () => expect(a.received.some((m) => m.kind === "delta" && m.routers === 2)).toBe(true),
      { interval: 2 },
    );
    await vi.waitFor(() => expect(b.received.length).toBeGreaterThan(0), { interval: 2 });
    const { routers } = await adminClient.listRouters({}, { headers: bearer(ADMIN_TOKEN) });
    expect(routers.map((r) => [r.id, r.connected])).toEqual([
      ["router-a", true],
      ["router-b", true],
    ]);
    b.abort.abort();
    await b.done;
    await vi.waitFor(
      () => expect(a.received.some((m) => m.kind === "delta" && m.routers === 1)).toBe(true),
      { interval: 2 },
    );
    const after = await adminClient.listRouters({}, { headers: bearer(ADMIN_TOKEN) });
    expect(after.routers.map((r) => [r.id, r.connected])).toEqual([
      ["router-a", true],
      ["router-b", false],
    ]);
    await expect(adminClient.listRouters({}, { headers: bearer(ROUTER_TOKEN) })).rejects.toThrow(
      /needs the admin token/,
    );
  });

  it("ends the older stream when the same router id connects again", async () => {
    const older = watch("router-a", { version: "1" });
    await vi.waitFor(() => expect(older.received).toHaveLength(1), { interval: 2 });
    const newer = watch("router-a", { version: "2" });
    const error = await older.done;
    expect(error?.code).toBe(Code.Aborted);
    expect(error?.rawMessage).toBe("a newer stream of router router-a replaced this one");
    await vi.waitFor(() => expect(newer.received).toHaveLength(1), { interval: 2 });
    expect(registry.list()).toMatchObject([{ id: "router-a", version: "2", connected: true }]);
    expect(registry.connected).toBe(1);
  });

  it("ends every stream when the control plane shuts down", async () => {
    const a = watch("router-a");
    await vi.waitFor(() => expect(a.received).toHaveLength(1), { interval: 2 });
    shutdown.abort(
      new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_SHUTTING_DOWN",
        "the control plane is shutting down",
      ),
    );
    const error = await a.done;
    expect(error?.code).toBe(Code.Unavailable);
    expect(error?.rawMessage).toBe("the control plane is shutting down");
    expect(registry.connected).toBe(0);
    // A stream opened after that is refused the same way.
    const late = await watch("router-b").done;
    expect(late?.code).toBe(Code.Unavailable);
  });
});

describe("preEncodeRoutingResponse", () => {
  const replica = {
    id: "chat-0",
    model: "org/chat",
    deployment: "chat",
    baseUrl: "http://10.0.0.1:41000",
    state: "ready",
    capacity: 64,
    apiKey: "engine-key",
    load: { running: 3, kvCacheUsage: 0.25 },
    loadReportedAtMs: 1_700_000_000_000,
  } as const;
  it.each<[string, RoutingMessage]>([
    [
      "snapshot",
      {
        kind: "snapshot",
        epoch: "e",
        version: 7,
        models: [{ name: "org/chat", deployment: "chat", policy: "llmgw", loading: false }],
        replicas: [replica],
        keys: [
          { id: "key_1", name: "a", secretSha256: "ab".repeat(32), models: ["org/chat"], rpm: 60 },
        ],
        routers: 2,
        sentAtMs: 1_700_000_000_001,
      },
    ],
    [
      "delta",
      {
        kind: "delta",
        epoch: "e",
        version: 8,
        upsertedModels: [],
        removedModels: ["org/old"],
        upsertedReplicas: [replica],
        removedReplicas: [],
        upsertedKeys: [],
        removedKeys: ["key_1"],
        routers: 3,
        sentAtMs: 1_700_000_000_002,
      },
    ],
    [
      "load",
      {
        kind: "load",
        epoch: "e",
        samples: [{ replicaId: "chat-0", load: { waiting: 2 }, reportedAtMs: 1_700_000_000_003 }],
      },
    ],
    ["keepalive", { kind: "keepalive", epoch: "e", version: 8, sentAtMs: 1, intervalMs: 2_000 }],
  ])("writes exactly the bytes of a %s", (_kind, message) => {
    const proto = routingMessageToProto(message);
    const bytes = toBinary(WatchRoutingResponseSchema, preEncodeRoutingResponse(proto));
    expect(bytes).toEqual(toBinary(WatchRoutingResponseSchema, proto));
    expect(routingMessageFromProto(fromBinary(WatchRoutingResponseSchema, bytes))).toEqual(message);
  });
});
