import { mkdtempSync, rmSync } from "node:fs";
import type { Server } from "node:http";
import { createServer as createHttp2Server, type Http2Server, type Http2Session } from "node:http2";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, createRouterTransport } from "@connectrpc/connect";
import { connectNodeAdapter, createConnectTransport } from "@connectrpc/connect-node";
import {
  ClusterService,
  RouterService,
  type WatchRoutingResponse,
  WatchRoutingResponseSchema,
} from "@llmgw/proto";
import {
  createRoutingState,
  type InFlightReport,
  type KeyGrant,
  type RoutingFeed,
  type RoutingMessage,
} from "@llmgw/router";
import { createHttpListener, startRoutingClient } from "@llmgw/router-server";
import { schedule } from "@llmgw/scheduler";
import { routingMessageFromProto, routingMessageToProto } from "@llmgw/wire";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { Cluster } from "../domain/cluster.js";
import { ControlPlaneError } from "../errors.js";
import { createRoutingPublisher, type RoutingPublisher } from "../routing/publisher.js";
import { createRouterRegistry, type RouterRegistry } from "../routing/router-registry.js";
import { IN_PROCESS_ROUTER_ID } from "../run.js";
import { openSqliteStore } from "../store/sqlite-store.js";
import type { ClusterStore } from "../store/types.js";
import { createManualClock } from "../testing/manual-clock.js";
import { createClusterService } from "./cluster-service.js";
import { errorMappingInterceptor } from "./errors.js";
import {
  createRouterService,
  preEncodeRoutingResponse,
  REPORT_IN_FLIGHT_LIMITS,
  routerServiceContextValues,
  STALLED_WRITE_KEEPALIVES,
  WATCH_ROUTING_LIMITS,
} from "./router-service.js";

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
let transport: ReturnType<typeof createRouterTransport>;
/** What `onInFlight` was handed, in order. */
let inFlightHeard: { routerId: string; report: InFlightReport }[];
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
  inFlightHeard = [];
  transport = createRouterTransport(
    (router) => {
      router.service(
        RouterService,
        createRouterService(publisher, registry, ROUTER_TOKEN, {
          shutdown: shutdown.signal,
          maxQueued: 64,
          onInFlight: (routerId, report) => inFlightHeard.push({ routerId, report }),
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

/**
 * Opens a WatchRouting stream and collects what it delivers, converted back to plain form;
 * keepalives (one follows each snapshot) are left out.
 */
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
        const message = routingMessageFromProto(res as WatchRoutingResponse);
        if (message.kind !== "keepalive") received.push(message);
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
    [
      { cacheIsolation: "Tenant\n" },
      `WatchRoutingRequest.cache_isolation must be at most 16 lower-case letters or '-', e.g. "tenant" (got "Tenant\\n")`,
    ],
    [
      { routerId: "in-process" },
      `WatchRoutingRequest.router_id "in-process" is reserved for the control plane's own router; start this router with another --router-id`,
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

  it("reserves the in-process router's id", () => {
    expect(WATCH_ROUTING_LIMITS.reservedRouterIds).toContain(IN_PROCESS_ROUTER_ID);
  });

  it("streams a snapshot then deltas, and lists the router with what it was sent", async () => {
    const { key } = cluster.apiKeys.create({ name: "team-a", models: [] });
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
    cluster.apiKeys.revoke("team-a");
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

describe("RouterService.ReportInFlight", () => {
  const report = (over: Record<string, unknown> = {}) => ({
    routerId: "router-a",
    epoch: "epoch-1",
    stateVersion: BigInt(7),
    draining: [
      { replicaId: "chat-0", inFlight: 2 },
      { replicaId: "chat-1", inFlight: 0 },
    ],
    ...over,
  });
  const callError = async (req: ReturnType<typeof report>, token?: string) => {
    try {
      await routerClient.reportInFlight(req, token === undefined ? {} : { headers: bearer(token) });
      return undefined;
    } catch (e) {
      return ConnectError.from(e);
    }
  };

  it("hands a valid report to onInFlight, 0 included, and answers empty", async () => {
    const res = await routerClient.reportInFlight(report(), { headers: bearer(ROUTER_TOKEN) });
    expect(res.$typeName).toBe("llmgw.v1.ReportInFlightResponse");
    expect(inFlightHeard).toEqual([
      {
        routerId: "router-a",
        report: {
          epoch: "epoch-1",
          stateVersion: 7,
          draining: [
            { replicaId: "chat-0", inFlight: 2 },
            { replicaId: "chat-1", inFlight: 0 },
          ],
        },
      },
    ]);
    // The empty list that ends a drain is a report too.
    await routerClient.reportInFlight(report({ draining: [] }), { headers: bearer(ROUTER_TOKEN) });
    expect(inFlightHeard[1]?.report.draining).toEqual([]);
  });

  it.each([
    [undefined, "missing Authorization: Bearer header"],
    [ADMIN_TOKEN, "wrong token"],
    [JOIN_TOKEN, "wrong token"],
  ])("refuses any token but the router token (%s)", async (token, start) => {
    const error = await callError(report(), token);
    expect(error?.code).toBe(Code.Unauthenticated);
    expect(error?.rawMessage).toBe(
      `${start}; this call needs the router token (llmgw control-plane token --router; LLMGW_ROUTER_TOKEN)`,
    );
    expect(inFlightHeard).toEqual([]);
  });

  it.each([
    [
      { routerId: "-a" },
      `ReportInFlightRequest.router_id must be 1–63 letters, digits, '.', '_' or '-', starting alphanumeric (got "-a")`,
    ],
    [
      { routerId: "in-process" },
      `ReportInFlightRequest.router_id "in-process" is reserved for the control plane's own router; start this router with another --router-id`,
    ],
    [{ epoch: "" }, "ReportInFlightRequest.epoch must be 1–64 characters (got 0)"],
    [{ epoch: "e".repeat(65) }, "ReportInFlightRequest.epoch must be 1–64 characters (got 65)"],
    [
      { stateVersion: BigInt(Number.MAX_SAFE_INTEGER) + BigInt(1) },
      "ReportInFlightRequest.state_version must be at most 9007199254740991 (got 9007199254740992)",
    ],
    [
      {
        draining: Array.from({ length: REPORT_IN_FLIGHT_LIMITS.maxDraining + 1 }, (_, i) => ({
          replicaId: `r-${i}`,
          inFlight: 0,
        })),
      },
      "ReportInFlightRequest.draining lists 10001 replicas, more than 10000",
    ],
    [
      { draining: [{ replicaId: "", inFlight: 1 }] },
      `ReportInFlightRequest.draining[0].replica_id must be 1–256 characters (got "")`,
    ],
    [
      { draining: [{ replicaId: "r".repeat(257), inFlight: 1 }] },
      `ReportInFlightRequest.draining[0].replica_id must be 1–256 characters (got "${"r".repeat(80)}…")`,
    ],
    [
      {
        draining: [
          { replicaId: "chat-0", inFlight: 1 },
          { replicaId: "chat-0", inFlight: 0 },
        ],
      },
      `ReportInFlightRequest.draining[1].replica_id repeats "chat-0"`,
    ],
  ])("refuses a bad request field (case %#)", async (bad, message) => {
    const error = await callError(report(bad), ROUTER_TOKEN);
    expect(error?.code).toBe(Code.InvalidArgument);
    expect(error?.rawMessage).toBe(message);
    expect(inFlightHeard).toEqual([]);
  });

  it("accepts and ignores reports without onInFlight", async () => {
    const bare = createRouterTransport(
      (router) => {
        router.service(
          RouterService,
          createRouterService(publisher, registry, ROUTER_TOKEN, { shutdown: shutdown.signal }),
        );
      },
      { router: { interceptors: [errorMappingInterceptor] } },
    );
    const res = await createClient(RouterService, bare).reportInFlight(report(), {
      headers: bearer(ROUTER_TOKEN),
    });
    expect(res.$typeName).toBe("llmgw.v1.ReportInFlightResponse");
  });

  it("is what a remote router's routing client sends, on the control plane its stream is on", async () => {
    const state = createRoutingState({ hashSecret: (s) => s });
    const client = startRoutingClient({
      controlPlanes: ["http://cp-1.test:7070"],
      routerToken: ROUTER_TOKEN,
      routerId: "router-r",
      address: "",
      version: "0.1.0",
      apply: (m) => state.apply(m),
      held: () => ({ epoch: state.epoch, version: state.version, ageMs: undefined }),
      transportFor: () => transport,
    });
    try {
      // Before a stream is open there is no one to tell: dropped.
      client.reportInFlight({ epoch: "epoch-1", stateVersion: 0, draining: [] });
      await vi.waitFor(() => expect(client.state).toBe("streaming"), { interval: 2 });
      client.reportInFlight({
        epoch: state.epoch as string,
        stateVersion: state.version,
        draining: [{ replicaId: "chat-0", inFlight: 1 }],
      });
      await vi.waitFor(() => expect(inFlightHeard).toHaveLength(1), { interval: 2 });
      expect(inFlightHeard[0]).toEqual({
        routerId: "router-r",
        report: {
          epoch: "epoch-1",
          stateVersion: state.version,
          draining: [{ replicaId: "chat-0", inFlight: 1 }],
        },
      });
    } finally {
      await client.close();
    }
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

describe("RouterService.WatchRouting over a real listener", () => {
  // Generous: a 0.6 MB message must be written well within it on a loaded machine.
  const KEEPALIVE_MS = 500;
  const STALL_MS = STALLED_WRITE_KEEPALIVES * KEEPALIVE_MS;
  const opened: { server: Server | Http2Server; abort: AbortController }[] = [];
  const sessions = new WeakMap<Server | Http2Server, Http2Session[]>();
  afterEach(async () => {
    for (const { server, abort } of opened.splice(0)) {
      abort.abort();
      if ("closeAllConnections" in server) server.closeAllConnections();
      const closed = new Promise((resolve) => server.close(resolve));
      for (const session of sessions.get(server) ?? []) session.destroy();
      await closed;
    }
  });

  /** A feed the test drives: a snapshot on subscribe, then what `emit` hands it. */
  function drivenFeed() {
    const listeners = new Set<(message: RoutingMessage) => void>();
    const feed: RoutingFeed = {
      subscribe(listener) {
        listeners.add(listener);
        listener({
          kind: "snapshot",
          epoch: "e",
          version: 1,
          models: [],
          replicas: [],
          keys: [],
          routers: 1,
          sentAtMs: Date.now(),
        });
        return () => listeners.delete(listener);
      },
    };
    return {
      feed,
      subscribers: () => listeners.size,
      emit: (message: RoutingMessage) => {
        for (const l of [...listeners]) l(message);
      },
    };
  }

  // ~0.6 MB: a few dozen fill any loopback socket's buffers.
  const keys: KeyGrant[] = Array.from({ length: 2_000 }, (_, i) => ({
    id: `key_${i}`,
    name: `${"n".repeat(250)}${i}`.slice(-256),
    secretSha256: "ab".repeat(32),
  }));
  const bigDelta: RoutingMessage = {
    kind: "delta",
    epoch: "e",
    version: 2,
    upsertedModels: [],
    removedModels: [],
    upsertedReplicas: [],
    removedReplicas: [],
    upsertedKeys: keys,
    removedKeys: [],
    sentAtMs: 1,
  };

  async function serve(
    feed: RoutingFeed,
    withConnection: boolean,
    httpVersion: "1.1" | "2" = "1.1",
  ) {
    const lines: string[] = [];
    const routers = createRouterRegistry({ keepaliveMs: KEEPALIVE_MS, log: (l) => lines.push(l) });
    const handler = connectNodeAdapter({
      interceptors: [errorMappingInterceptor],
      ...(withConnection ? { contextValues: routerServiceContextValues } : {}),
      routes: (router) => {
        router.service(
          RouterService,
          createRouterService(feed, routers, ROUTER_TOKEN, {
            shutdown: new AbortController().signal,
            maxQueued: 10_000,
            keepaliveMs: KEEPALIVE_MS,
          }),
        );
      },
    });
    // HTTP/1.1 through the control listener's own factory; HTTP/2 through node:http2.
    let server: Server | Http2Server;
    if (httpVersion === "1.1") server = createHttpListener({}, handler);
    else {
      const h2 = createHttp2Server(handler);
      const held: Http2Session[] = [];
      h2.on("session", (session) => held.push(session));
      sessions.set(h2, held);
      server = h2;
    }
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const abort = new AbortController();
    opened.push({ server, abort });
    const { port } = server.address() as AddressInfo;
    const client = createClient(
      RouterService,
      createConnectTransport({ baseUrl: `http://127.0.0.1:${port}`, httpVersion }),
    );
    const stream = client
      .watchRouting(
        { routerId: "router-a", address: "10.0.0.9:8080", version: "1" },
        { headers: bearer(ROUTER_TOKEN), signal: abort.signal },
      )
      [Symbol.asyncIterator]();
    const connections = () =>
      new Promise<number>((resolve, reject) =>
        server.getConnections((error, n) => (error ? reject(error) : resolve(n))),
      );
    return { routers, lines, stream, connections };
  }

  /**
   * Emits big deltas (the kernel buffers fill, then a write stalls) until the router is no
   * longer counted; returns when its last write completed and when it was uncounted (epoch ms,
   * as the registry lists them).
   */
  async function fillUntilCutOff(driven: ReturnType<typeof drivenFeed>, routers: RouterRegistry) {
    let lastWriteMs = 0;
    const deadline = performance.now() + 10_000;
    while (routers.connected > 0 && performance.now() < deadline) {
      driven.emit(bigDelta);
      await new Promise((resolve) => setTimeout(resolve, 2));
      const entry = routers.list()[0];
      if (entry?.connected) lastWriteMs = entry.lastSeenMs;
    }
    expect(routers.connected).toBe(0);
    return { lastWriteMs, cutOffMs: routers.list()[0]?.lastSeenMs ?? 0 };
  }

  it("keeps a router that reads, however quiet the stream is", async () => {
    const driven = drivenFeed();
    const { routers, stream } = await serve(driven.feed, true);
    expect((await stream.next()).value?.message.case).toBe("snapshot");
    expect(routers.connected).toBe(1);
    // Quiet for twice the stall bound: waiting for the next message is not a stalled write.
    const next = stream.next();
    await new Promise((resolve) => setTimeout(resolve, 2 * STALL_MS));
    expect(routers.connected).toBe(1);
    driven.emit(bigDelta);
    expect((await next).value?.message.case).toBe("delta");
    // Busy for the stall bound and more: every big delta is read, none is cut off.
    for (let i = 0; i < 20; i++) {
      driven.emit(bigDelta);
      expect((await stream.next()).value?.message.case).toBe("delta");
    }
    expect(routers.connected).toBe(1);
  });

  /** Reads on to the stream's end: the error it ends with, or undefined. */
  async function drain(stream: AsyncIterator<WatchRoutingResponse>) {
    try {
      for (let r = await stream.next(); r.done !== true; r = await stream.next()) {}
      return undefined;
    } catch (e) {
      return ConnectError.from(e);
    }
  }

  it.each(["1.1", "2"] as const)(
    "cuts off a router that stops reading (HTTP/%s): uncounted within the bound, its feed and connection released",
    async (httpVersion) => {
      const driven = drivenFeed();
      const { routers, lines, stream, connections } = await serve(driven.feed, true, httpVersion);
      expect((await stream.next()).value?.message.case).toBe("snapshot");
      await vi.waitFor(() => expect(routers.connected).toBe(1), { interval: 5 });
      // The client now reads nothing more: its socket buffers fill, then the server's write stalls.
      const { lastWriteMs, cutOffMs } = await fillUntilCutOff(driven, routers);
      // The stalled write began as the last one completed: cut off STALL_MS later (the slack
      // is for a loaded machine's late timer).
      expect(cutOffMs - lastWriteMs).toBeGreaterThanOrEqual(STALL_MS - 5);
      expect(cutOffMs - lastWriteMs).toBeLessThan(STALL_MS + 2_000);
      expect(routers.list()).toMatchObject([{ id: "router-a", connected: false }]);
      expect(lines.at(-1)).toBe(
        `router router-a disconnected: a routing message waited ${STALL_MS} ms (${STALLED_WRITE_KEEPALIVES} keepalive intervals) for the router to read it; cut off (LLMGW_CONTROL_PLANE_ROUTER_TOO_SLOW)`,
      );
      expect(lines[0]).toBe("router router-a connected from 10.0.0.9:8080");
      expect(driven.subscribers()).toBe(0);
      // Torn down: what the client had buffered, then an error, never a clean end.
      expect(await drain(stream)).toBeInstanceOf(ConnectError);
      if (httpVersion === "1.1")
        await vi.waitFor(async () => expect(await connections()).toBe(0), { interval: 5 });
    },
  );

  it("without the connection in its context, still uncounts at once, and ends the stream TOO_SLOW once the router reads again", async () => {
    const driven = drivenFeed();
    const { routers, stream } = await serve(driven.feed, false);
    expect((await stream.next()).value?.message.case).toBe("snapshot");
    await fillUntilCutOff(driven, routers);
    expect(driven.subscribers()).toBe(0);
    // Reading again drains what was buffered, then the stream ends with the reason.
    const error = await drain(stream);
    expect(error?.code).toBe(Code.ResourceExhausted);
    expect(error?.rawMessage).toBe(
      `the router read nothing for ${STALL_MS} ms while a routing message waited; reconnect for a fresh snapshot`,
    );
  });
});
