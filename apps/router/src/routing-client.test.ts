/**
 * The routing client's loop against scripted RouterService servers, served in memory by
 * Connect's router transport: which URL it moves to, when it gives a stream up, what it sends.
 * (The real control plane's WatchRouting is exercised in apps/cli/test/router-remote.int.test.ts.)
 */
import { createHash } from "node:crypto";
import { rootCertificates } from "node:tls";
import {
  Code,
  ConnectError,
  createRouterTransport,
  type HandlerContext,
} from "@connectrpc/connect";
import {
  type ReportInFlightRequest,
  RouterService,
  type WatchRoutingRequest,
  type WatchRoutingResponse,
} from "@llmgw/proto";
import { createRoutingState, type RoutingMessage, type RoutingSnapshot } from "@llmgw/router";
import { routingMessageToProto } from "@llmgw/wire";
import { afterEach, describe, expect, it } from "vitest";
import { controlPlaneTrust, type RoutingClient, startRoutingClient } from "./routing-client.js";

const snapshot = (version = 1, epoch = "e1"): RoutingSnapshot => ({
  kind: "snapshot",
  epoch,
  version,
  models: [{ name: "m", deployment: "m", policy: "llmgw", loading: false }],
  replicas: [
    {
      id: "m-0",
      model: "m",
      deployment: "m",
      baseUrl: "http://10.0.0.5:8000",
      state: "ready",
      capacity: 4,
    },
  ],
  keys: [],
  routers: 1,
  sentAtMs: Date.now(),
});

const wire = (m: RoutingMessage): WatchRoutingResponse => routingMessageToProto(m);

type Script = (
  req: WatchRoutingRequest,
  ctx: HandlerContext,
  connection: number,
) => AsyncIterable<WatchRoutingResponse>;

/**
 * A control plane at `url` answering WatchRouting with `script` (counting its connections) and
 * ReportInFlight with `report` (when given).
 */
function server(
  script: Script,
  report?: (req: ReportInFlightRequest, ctx: HandlerContext) => Promise<Record<string, never>>,
) {
  let connections = 0;
  const requests: { req: WatchRoutingRequest; authorization: string | null }[] = [];
  const transport = createRouterTransport(({ service }) => {
    service(RouterService, {
      watchRouting(req, ctx) {
        connections += 1;
        requests.push({ req, authorization: ctx.requestHeader.get("authorization") });
        return script(req, ctx, connections);
      },
      ...(report === undefined ? {} : { reportInFlight: report }),
    });
  });
  return { transport, connections: () => connections, requests };
}

/** Yields `messages`, then holds the stream open until the client goes away. */
async function* thenHold(ctx: HandlerContext, ...messages: RoutingMessage[]) {
  for (const m of messages) yield wire(m);
  await new Promise<void>((resolve) => ctx.signal.addEventListener("abort", () => resolve()));
}

const clients: RoutingClient[] = [];
afterEach(async () => {
  for (const c of clients.splice(0)) await c.close();
});

function client(
  transports: Record<string, ReturnType<typeof server>["transport"]>,
  extra: Partial<Parameters<typeof startRoutingClient>[0]> = {},
) {
  const state = createRoutingState({
    hashSecret: (s) => createHash("sha256").update(s).digest("hex"),
  });
  const events: Record<string, unknown>[] = [];
  const c = startRoutingClient({
    controlPlanes: Object.keys(transports),
    routerToken: "rt-secret",
    routerId: "edge-1",
    address: "10.0.0.9:8080",
    version: "0.1.0",
    apply: (m) => state.apply(m),
    held: () => ({ epoch: state.epoch, version: state.version, ageMs: 1234 }),
    transportFor: (url) => transports[url] as ReturnType<typeof server>["transport"],
    initialBackoffMs: 10,
    maxBackoffMs: 50,
    random: () => 0.5,
    log: (e) => events.push({ ...e }),
    ...extra,
  });
  clients.push(c);
  return { c, state, events };
}

async function waitFor(check: () => boolean, ms: number, what: string): Promise<void> {
  const deadline = performance.now() + ms;
  while (!check()) {
    if (performance.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

describe("routing client", () => {
  it("sends the router's id, address, version, held state and token", async () => {
    const cp = server((_req, ctx) => thenHold(ctx, snapshot(3)));
    const { c } = client({ "http://a": cp.transport });
    await waitFor(() => c.state === "streaming", 2000, "the stream");
    expect(cp.requests[0]?.authorization).toBe("Bearer rt-secret");
    expect(cp.requests[0]?.req).toMatchObject({
      routerId: "edge-1",
      address: "10.0.0.9:8080",
      version: "0.1.0",
      epoch: "",
      stateVersion: 0n,
      stateAgeMs: 1234n,
    });
  });

  it("moves to the next control plane when one is down, and back when that one fails", async () => {
    const down = server(async function* () {
      yield* [];
      throw new ConnectError("connect ECONNREFUSED", Code.Unavailable);
    });
    const up = server((_req, ctx, n) =>
      n === 1
        ? (async function* () {
            yield wire(snapshot(1));
            throw new ConnectError("reset", Code.Unavailable);
          })()
        : thenHold(ctx, snapshot(2)),
    );
    const { c, state, events } = client({ "http://a": down.transport, "http://b": up.transport });
    await waitFor(() => state.version === 2, 2000, "the second stream of b");
    expect(c.controlPlane).toBe("http://b");
    // a refused, b streamed and broke, a refused again, b again.
    expect([down.connections(), up.connections()]).toEqual([2, 2]);
    expect(events.filter((e) => e.event === "routing_stream_failed")[0]).toMatchObject({
      code: "LLMGW_ROUTER_CONTROL_PLANE_UNREACHABLE",
      controlPlane: "http://a",
      message:
        "Unavailable: connect ECONNREFUSED; trying the next control plane, not ready until a control plane answers",
    });
    expect(events.find((e) => e.event === "routing_stream_lost")).toMatchObject({
      controlPlane: "http://b",
      message:
        "Unavailable: reset; trying the next control plane, serving from the state held meanwhile",
    });
  });

  it("gives up a stream silent for three keepalive intervals", async () => {
    const cp = server((_req, ctx) =>
      thenHold(ctx, snapshot(1), {
        kind: "keepalive",
        epoch: "e1",
        version: 1,
        sentAtMs: Date.now(),
        intervalMs: 100,
      }),
    );
    const { events } = client({ "http://a": cp.transport });
    const started = performance.now();
    await waitFor(() => cp.connections() === 2, 3000, "a second connection");
    expect(performance.now() - started).toBeGreaterThanOrEqual(290);
    expect(events.find((e) => e.event === "routing_stream_lost")).toMatchObject({
      code: "LLMGW_ROUTER_CONTROL_PLANE_UNREACHABLE",
      message:
        "no message for 300ms (3 keepalive intervals); retrying, serving from the state held meanwhile",
    });
  });

  it("ends a stream that carries a malformed message", async () => {
    const cp = server((_req, ctx, n) => {
      if (n > 1) return thenHold(ctx, snapshot(1));
      const bad = wire(snapshot(1));
      const replica = bad.message.case === "snapshot" ? bad.message.value.replicas[0] : undefined;
      if (replica) replica.capacity = 0;
      return (async function* () {
        yield bad;
        yield* thenHold(ctx);
      })();
    });
    const { state, events } = client({ "http://a": cp.transport });
    await waitFor(() => state.version === 1 && cp.connections() >= 2, 2000, "a good snapshot");
    expect(events.find((e) => e.code === "LLMGW_ROUTER_STREAM_INVALID")).toMatchObject({
      event: "routing_stream_failed",
      message: expect.stringMatching(/^a malformed routing message: .*capacity/),
    });
  });

  it("reconnects for a snapshot when the state asks for a resync", async () => {
    const cp = server((_req, ctx, n) =>
      thenHold(
        ctx,
        snapshot(n === 1 ? 1 : 5),
        // A gap: version 3 after 1.
        {
          kind: "delta",
          epoch: "e1",
          version: 3,
          upsertedModels: [],
          removedModels: [],
          upsertedReplicas: [],
          removedReplicas: [],
          upsertedKeys: [],
          removedKeys: [],
          sentAtMs: Date.now(),
        },
      ),
    );
    const { c, state, events } = client({ "http://a": cp.transport });
    await waitFor(() => state.version === 5, 2000, "the second snapshot");
    expect(c.state).toBe("streaming");
    expect(events.find((e) => e.event === "routing_resync")).toMatchObject({
      controlPlane: "http://a",
      message: "a delta the held state cannot follow (epoch e1); reconnecting for a snapshot",
    });
  });

  it("waits the longest backoff after another stream of its id took over, and warns once", async () => {
    // Two routers sharing an id: each new stream ends the other's (Aborted, ROUTER_REPLACED).
    const replaced = () =>
      new ConnectError("a newer stream of router edge-1 replaced this one", Code.Aborted, {
        "llmgw-error-code": "LLMGW_CONTROL_PLANE_ROUTER_REPLACED",
      });
    const opened: number[] = [];
    const cp = server(async function* () {
      opened.push(performance.now());
      yield wire(snapshot(1));
      throw replaced();
    });
    const { events } = client({ "http://a": cp.transport }, { maxBackoffMs: 200 });
    await waitFor(() => cp.connections() >= 3, 3000, "three streams");
    // A stream that broke after its snapshot would start over at 10 ms; this one waits 200 ms.
    for (let i = 1; i < 3; i++)
      expect((opened[i] as number) - (opened[i - 1] as number)).toBeGreaterThanOrEqual(190);
    const warnings = events.filter((e) => e.event === "routing_stream_replaced");
    expect(warnings).toEqual([
      {
        event: "routing_stream_replaced",
        code: "LLMGW_CONTROL_PLANE_ROUTER_REPLACED",
        controlPlane: "http://a",
        routerId: "edge-1",
        times: 1,
        message:
          "the control plane ended this router's stream because another stream of router id edge-1 took over (a newer stream of router edge-1 replaced this one): another router uses this id? Give each router its own --router-id (or state dir); retrying within 200ms, serving from the state held meanwhile",
      },
    ]);
    expect(events.find((e) => e.event === "routing_stream_lost")).toBeUndefined();
  });

  it("treats an Aborted stream with another code as a broken one", async () => {
    const cp = server(async function* () {
      yield wire(snapshot(1));
      throw new ConnectError("something else", Code.Aborted, {
        "llmgw-error-code": "LLMGW_CONTROL_PLANE_SOMETHING_ELSE",
      });
    });
    const { events } = client({ "http://a": cp.transport }, { maxBackoffMs: 60_000 });
    // Started over at 10 ms: three streams come long before a 60 s backoff.
    await waitFor(() => cp.connections() >= 3, 3000, "three streams");
    expect(events.find((e) => e.event === "routing_stream_replaced")).toBeUndefined();
    expect(events.find((e) => e.event === "routing_stream_lost")).toMatchObject({
      message: "Aborted: something else; retrying, serving from the state held meanwhile",
    });
  });

  it("trusts Node's roots and the --control-plane-ca bundle, not the bundle alone", () => {
    const pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    const trust = controlPlaneTrust(pem);
    expect(rootCertificates.length).toBeGreaterThan(50);
    expect(trust).toEqual([...rootCertificates, pem]);
  });

  it("retries a refused token slowly and logs it once", async () => {
    const cp = server(async function* () {
      yield* [];
      throw new ConnectError("router token required", Code.Unauthenticated);
    });
    const { c, events } = client({ "http://a": cp.transport }, { unauthenticatedRetryMs: 30 });
    await waitFor(() => cp.connections() >= 4, 2000, "four attempts");
    expect(c.state).not.toBe("streaming");
    const refused = events.filter((e) => e.event === "routing_stream_refused");
    expect(refused).toHaveLength(1);
    expect(refused[0]).toMatchObject({ code: "LLMGW_ROUTER_UNAUTHENTICATED" });
    expect(JSON.stringify(events)).not.toContain("rt-secret");
  });

  it("closes promptly, mid-stream or mid-backoff", async () => {
    const cp = server((_req, ctx) => thenHold(ctx, snapshot(1)));
    const { c } = client({ "http://a": cp.transport });
    await waitFor(() => c.state === "streaming", 2000, "the stream");
    const t0 = performance.now();
    await c.close();
    expect(c.state).toBe("closed");
    const slow = server(async function* () {
      yield* [];
      throw new ConnectError("down", Code.Unavailable);
    });
    const { c: backingOff } = client(
      { "http://a": slow.transport },
      { initialBackoffMs: 60_000, maxBackoffMs: 60_000 },
    );
    await waitFor(() => backingOff.state === "backoff", 2000, "a backoff");
    await backingOff.close();
    expect(performance.now() - t0).toBeLessThan(1000);
  });
});

describe("routing client: in-flight reports", () => {
  const draining = (inFlight: number) => ({
    epoch: "e1",
    stateVersion: 1,
    draining: [{ replicaId: "m-0", inFlight }],
  });

  it("sends one call at a time with the router token, the newest report replacing one not sent", async () => {
    const heard: { req: ReportInFlightRequest; authorization: string | null }[] = [];
    let release: (() => void) | undefined;
    const cp = server(
      (_req, ctx) => thenHold(ctx, snapshot(1)),
      async (req, ctx) => {
        heard.push({ req, authorization: ctx.requestHeader.get("authorization") });
        if (heard.length === 1) await new Promise<void>((r) => (release = r));
        return {};
      },
    );
    const { c } = client({ "http://a": cp.transport });
    await waitFor(() => c.state === "streaming", 2000, "the stream");
    c.reportInFlight(draining(3));
    await waitFor(() => release !== undefined, 2000, "the first call");
    c.reportInFlight(draining(2)); // replaced by the next before the first call returns
    c.reportInFlight(draining(1));
    release?.();
    await waitFor(() => heard.length === 2, 2000, "the second call");
    expect(heard.map((h) => h.req.draining.map((d) => d.inFlight))).toEqual([[3], [1]]);
    expect(heard[1]?.authorization).toBe("Bearer rt-secret");
    expect(heard[1]?.req).toMatchObject({ routerId: "edge-1", epoch: "e1", stateVersion: 1n });
  });

  it("logs a failing call once per code and control plane, and gives up a call at its timeout", async () => {
    let calls = 0;
    const cp = server(
      (_req, ctx) => thenHold(ctx, snapshot(1)),
      async (_req, ctx) => {
        calls += 1;
        if (calls <= 3) throw new ConnectError("the cluster is busy", Code.Unavailable);
        // Never answers: the router's timeout ends the call.
        await new Promise<void>((r) => ctx.signal.addEventListener("abort", () => r()));
        return {};
      },
    );
    const { c, events } = client({ "http://a": cp.transport }, { reportTimeoutMs: 50 });
    await waitFor(() => c.state === "streaming", 2000, "the stream");
    for (let i = 0; i < 4; i++) {
      c.reportInFlight(draining(i));
      await waitFor(() => calls === i + 1, 2000, `call ${i + 1}`);
    }
    const failed = () => events.filter((e) => e.event === "in_flight_report_failed");
    await waitFor(() => failed().length === 2, 2000, "the timeout's line");
    expect(failed()).toEqual([
      {
        event: "in_flight_report_failed",
        code: "LLMGW_ROUTER_CONTROL_PLANE_UNREACHABLE",
        controlPlane: "http://a",
        message:
          "ReportInFlight failed (Unavailable: the cluster is busy); reporting goes on every second, a drain there waits for a report or its timeout",
      },
      expect.objectContaining({
        message: expect.stringMatching(/^ReportInFlight failed \(DeadlineExceeded: /),
      }),
    ]);
  });
});
