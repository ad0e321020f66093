// The agents' calls served off the socket (agent-fast-path.ts), on a real loopback listener,
// driven by the official Connect client as agents drive them; anything the fast path does not
// take goes to Connect's own handler on the same listener (and so does a request carrying the
// test's `x-via-connect` header, to compare the two answers).
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, createClient } from "@connectrpc/connect";
import { createWritableIterable } from "@connectrpc/connect/protocol";
import { connectNodeAdapter, createConnectTransport } from "@connectrpc/connect-node";
import { simulateInventory } from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import {
  AgentService,
  HeartbeatRequestSchema,
  HeartbeatResponseSchema,
  ReplicaLoadReportSchema,
  ReplicaState,
  ReplicaStatusSchema,
  type StreamHeartbeatRequest,
  type StreamLoadRequest,
} from "@llmgw/proto";
import type { ReplicaLoadSample } from "@llmgw/router";
import { schedule } from "@llmgw/scheduler";
import { inventoryToProto } from "@llmgw/wire";
import { afterEach, describe, expect, it } from "vitest";
import { Cluster } from "../domain/cluster.js";
import { ControlPlaneError } from "../errors.js";
import { openSqliteStore } from "../store/sqlite-store.js";
import { createManualClock } from "../testing/manual-clock.js";
import { refusal } from "../testing/refusal.js";
import { createAgentFastPath } from "./agent-fast-path.js";
import { createAgentCalls, createAgentService, createAgentStreams } from "./agent-service.js";
import { ERROR_CODE_HEADER, errorMappingInterceptor } from "./errors.js";

const JOIN = "llmgw-join-test";
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** A control listener of the fast path then Connect, a node with one ready replica. */
async function setup(
  opts: { readonly readMaxBytes?: number; readonly heartbeatStreams?: boolean } = {},
) {
  const { readMaxBytes = 4 * 1024 * 1024, heartbeatStreams = true } = opts;
  const dir = mkdtempSync(join(tmpdir(), "llmgw-fast-path-"));
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  const store = openSqliteStore({ file: join(dir, "state.db") });
  cleanups.push(() => store.close());
  const clock = createManualClock();
  const cluster = new Cluster({
    store,
    schedule,
    clock,
    heartbeatIntervalMs: 1000,
    unreachableAfterMs: 3000,
    nodeLostAfterMs: 10_000,
    rendezvousPortMin: 29_500,
    rendezvousPortMax: 29_999,
  });
  const options = { loadStreamMs: 20_000, heartbeatStreams };
  let durable = (): Promise<void> => Promise.resolve();
  const fast = createAgentFastPath({
    streams: createAgentStreams(cluster, options),
    calls: createAgentCalls(cluster, options),
    durable: () => durable(),
    readMaxBytes,
  });
  const connect = connectNodeAdapter({
    interceptors: [errorMappingInterceptor],
    readMaxBytes: 4 * 1024 * 1024,
    routes: (router) => router.service(AgentService, createAgentService(cluster, JOIN, options)),
  });
  let taken = 0;
  const server: Server = createServer((req, res) => {
    if (req.headers["x-via-connect"] === undefined && fast(req, res)) {
      taken++;
      return;
    }
    connect(req, res);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  cleanups.push(
    () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  );
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const client = (useBinaryFormat = true) =>
    createClient(
      AgentService,
      createConnectTransport({ baseUrl: url, httpVersion: "1.1", useBinaryFormat }),
    );
  const agent = client();
  const reg = await agent.register(
    {
      inventory: inventoryToProto(
        simulateInventory("1xh100-80g", {
          hostname: "node-a",
          addresses: ["10.0.0.1"],
          nowMs: clock.now(),
        }),
      ),
      advertiseAddress: "10.0.0.1",
    },
    { headers: { authorization: `Bearer ${JOIN}` } },
  );
  const nodeId = reg.nodeId;
  const auth = { authorization: `Bearer ${reg.nodeCredential}` };
  cluster.applyDeployment(
    parseDeploymentSpecOrThrow({
      name: "chat",
      engine: "sim",
      model: "org/model",
      gpuClass: "h100-80g",
    }),
  );
  const replicaId = cluster.desiredSet(nodeId).assignments[0]?.replicaId as string;
  await agent.heartbeat(
    {
      nodeId,
      replicas: [
        create(ReplicaStatusSchema, {
          replicaId,
          rank: 0,
          state: ReplicaState.READY,
          apiPort: 8000,
        }),
      ],
    },
    { headers: auth },
  );
  const samples: ReplicaLoadSample[] = [];
  cluster.onLoad((s) => samples.push(s));
  // Counted from here: setup's own heartbeat went the fast way too.
  taken = 0;
  const report = (running: number) =>
    create(ReplicaLoadReportSchema, {
      replicaId,
      load: { running },
      scrapedAtUnixMs: BigInt(clock.now()),
    });
  return {
    cluster,
    url,
    client,
    agent,
    nodeId,
    auth,
    samples,
    report,
    taken: () => taken,
    /** Replaces what unary answers wait for. */
    setDurable: (wait: () => Promise<void>) => {
      durable = wait;
    },
  };
}

describe("agent stream fast path", () => {
  it("takes StreamLoad messages as they arrive and answers when the agent ends", async () => {
    const { agent, nodeId, auth, samples, report, taken } = await setup();
    const requests = createWritableIterable<StreamLoadRequest>();
    const call = agent.streamLoad(requests, { headers: auth });
    void requests.write({ nodeId, replicas: [report(1)] } as StreamLoadRequest);
    await expect.poll(() => samples.map((s) => s.load)).toEqual([{ running: 1 }]);
    void requests.write({ nodeId, replicas: [report(2)] } as StreamLoadRequest);
    await expect.poll(() => samples.length).toBe(2);
    requests.close();
    expect((await call).loadIntervalMs).toBe(0);
    expect(taken()).toBe(1);
  });

  it("ends a stream with the error and llmgw-error-code of its first bad message", async () => {
    const { cluster, agent, nodeId, auth, taken } = await setup();
    const requests = createWritableIterable<StreamHeartbeatRequest>();
    const call = refusal(agent.streamHeartbeat(requests, { headers: auth }));
    const problem = { code: "first", message: "", source: "test" };
    void requests
      .write({ heartbeat: { nodeId, problems: [problem] } } as unknown as StreamHeartbeatRequest)
      .catch(() => {});
    await expect.poll(() => cluster.getNode(nodeId).problems.map((p) => p.code)).toEqual(["first"]);
    void requests.write({} as StreamHeartbeatRequest).catch(() => {});
    const error = await call;
    requests.close();
    expect(error.code).toBe(Code.InvalidArgument);
    expect(error.rawMessage).toBe("StreamHeartbeatRequest.heartbeat is required");
    expect(error.metadata.get(ERROR_CODE_HEADER)).toBe("LLMGW_CONTROL_PLANE_INVALID_ARGUMENT");

    const wrong = createWritableIterable<StreamHeartbeatRequest>();
    const refused = refusal(
      agent.streamHeartbeat(wrong, { headers: { authorization: "Bearer llmgw-node-wrong" } }),
    );
    void wrong
      .write({ heartbeat: { nodeId } } as unknown as StreamHeartbeatRequest)
      .catch(() => {});
    const denied = await refused;
    wrong.close();
    expect(denied.code).toBe(Code.Unauthenticated);
    expect(denied.metadata.get(ERROR_CODE_HEADER)).toBe("LLMGW_CONTROL_PLANE_UNAUTHENTICATED");
    expect(taken()).toBe(2);
  });

  it("refuses a message over readMaxBytes with resource_exhausted", async () => {
    const { agent, nodeId, auth } = await setup({ readMaxBytes: 64 });
    const requests = createWritableIterable<StreamLoadRequest>();
    const call = refusal(agent.streamLoad(requests, { headers: auth }));
    void requests
      .write({ nodeId: `${nodeId}-${"x".repeat(100)}` } as StreamLoadRequest)
      .catch(() => {});
    const error = await call;
    requests.close();
    expect(error.code).toBe(Code.ResourceExhausted);
    expect(error.rawMessage).toMatch(/larger than configured readMaxBytes 64/);
  });

  it("refuses StreamHeartbeat with unimplemented when heartbeat streams are off, reading nothing", async () => {
    const { cluster, agent, nodeId, auth, taken } = await setup({ heartbeatStreams: false });
    const requests = createWritableIterable<StreamHeartbeatRequest>();
    const call = refusal(agent.streamHeartbeat(requests, { headers: auth }));
    void requests
      .write({
        heartbeat: { nodeId, problems: [{ code: "never", message: "", source: "test" }] },
      } as unknown as StreamHeartbeatRequest)
      .catch(() => {});
    const error = await call;
    requests.close();
    expect(error.code).toBe(Code.Unimplemented);
    expect(error.rawMessage).toMatch(/^StreamHeartbeat is turned off on this control plane/);
    expect(cluster.getNode(nodeId).problems).toEqual([]);
    expect(taken()).toBe(1);
  });

  it("leaves JSON to Connect's handler, which serves the same streams", async () => {
    const { client, nodeId, auth, samples, report, taken } = await setup();
    const json = client(false);
    const requests = createWritableIterable<StreamLoadRequest>();
    const call = json.streamLoad(requests, { headers: auth });
    void requests.write({ nodeId, replicas: [report(3)] } as StreamLoadRequest);
    requests.close();
    await call;
    expect(samples.map((s) => s.load)).toEqual([{ running: 3 }]);
    expect(taken()).toBe(0);
  });

  it("answers a truncated, compressed or end-of-stream envelope with invalid_argument", async () => {
    const { url, auth } = await setup();
    const post = async (body: Buffer) => {
      const res = await fetch(`${url}/llmgw.v1.AgentService/StreamLoad`, {
        method: "POST",
        headers: { ...auth, "content-type": "application/connect+proto" },
        body,
      });
      let bytes = Buffer.from(await res.arrayBuffer());
      expect(res.status).toBe(200);
      // A message first (the answer, on success), then the end of the stream.
      const answered = bytes[0] === 0;
      if (answered) bytes = bytes.subarray(5 + bytes.readUInt32BE(1));
      expect(bytes[0]).toBe(0b10);
      const end = JSON.parse(bytes.subarray(5).toString()) as {
        error?: { code: string; message: string };
      };
      return { answered, ...end };
    };
    const header = (flags: number, length: number) => {
      const h = Buffer.alloc(5);
      h[0] = flags;
      h.writeUInt32BE(length, 1);
      return h;
    };
    expect(await post(Buffer.concat([header(0, 10), Buffer.alloc(3)]))).toEqual({
      answered: false,
      error: { code: "invalid_argument", message: "protocol error: incomplete envelope" },
    });
    expect(await post(Buffer.concat([header(1, 2), Buffer.alloc(2)]))).toEqual({
      answered: false,
      error: {
        code: "invalid_argument",
        message: "protocol error: received a compressed message, but no encoding was negotiated",
      },
    });
    // An end-of-stream envelope is for answers only.
    expect(await post(Buffer.concat([header(2, 2), Buffer.from("{}")]))).toEqual({
      answered: false,
      error: {
        code: "invalid_argument",
        message: "protocol error: unexpected envelope flags 2 in a request",
      },
    });
    // No message at all: an empty stream is answered.
    expect(await post(Buffer.alloc(0))).toEqual({ answered: true });
  });
});

describe("agent unary fast path", () => {
  /** POSTs `body` to a unary method as `application/proto`, through Connect with `viaConnect`. */
  const postUnary = async (
    url: string,
    method: string,
    body: Uint8Array,
    headers: Record<string, string>,
    viaConnect = false,
  ) => {
    const res = await fetch(`${url}/llmgw.v1.AgentService/${method}`, {
      method: "POST",
      headers: {
        ...headers,
        "content-type": "application/proto",
        ...(viaConnect ? { "x-via-connect": "1" } : {}),
      },
      body,
    });
    return {
      status: res.status,
      type: res.headers.get("content-type"),
      errorCode: res.headers.get(ERROR_CODE_HEADER),
      body: await res.text(),
    };
  };

  it("answers Heartbeat and ReportLoad as Connect does, the desired set once per generation", async () => {
    const { cluster, agent, nodeId, auth, samples, report, taken } = await setup();
    const first = await agent.heartbeat({ nodeId }, { headers: auth });
    const desired = cluster.desiredSet(nodeId);
    expect(first.generation).toBe(desired.generation);
    expect(first.unchanged).toBe(false);
    expect(first.assignments.map((a) => a.replicaId)).toEqual(
      desired.assignments.map((a) => a.replicaId),
    );
    expect(first.assignments).toHaveLength(1);
    expect(first.heartbeatStreams).toBe(true);
    expect(first.loadStreamMs).toBe(20_000);
    const again = await agent.heartbeat(
      { nodeId, generationSeen: first.generation },
      { headers: auth },
    );
    expect(again.unchanged).toBe(true);
    expect(again.assignments).toEqual([]);
    // The same call through Connect's handler gives the same answer.
    const viaConnect = await agent.heartbeat(
      { nodeId, generationSeen: first.generation },
      { headers: { ...auth, "x-via-connect": "1" } },
    );
    expect(viaConnect).toEqual(again);

    const problem = { code: "xid-79", message: "fell off the bus", source: "test" };
    await agent.heartbeat({ nodeId, problems: [problem] }, { headers: auth });
    expect(cluster.getNode(nodeId).problems.map((p) => p.code)).toEqual(["xid-79"]);

    expect(
      (await agent.reportLoad({ nodeId, replicas: [report(4)] }, { headers: auth })).loadIntervalMs,
    ).toBe(0);
    expect(samples.map((s) => s.load)).toEqual([{ running: 4 }]);
    expect(taken()).toBe(4);
  });

  it("refuses a wrong credential or an unbounded request with the code and llmgw-error-code Connect gives", async () => {
    const { url, agent, nodeId, auth, taken } = await setup();
    const wrong = await refusal(
      agent.heartbeat({ nodeId }, { headers: { authorization: "Bearer llmgw-node-wrong" } }),
    );
    expect(wrong.code).toBe(Code.Unauthenticated);
    expect(wrong.metadata.get(ERROR_CODE_HEADER)).toBe("LLMGW_CONTROL_PLANE_UNAUTHENTICATED");
    const missing = await refusal(agent.reportLoad({ nodeId }));
    expect(missing.code).toBe(Code.Unauthenticated);
    expect(missing.rawMessage).toMatch(/missing Authorization: Bearer header; ReportLoad needs/);

    const tooMany = Array.from({ length: 65 }, (_, i) => ({
      code: `p${i}`,
      message: "",
      source: "test",
    }));
    const bounded = await refusal(
      agent.heartbeat({ nodeId, problems: tooMany }, { headers: auth }),
    );
    expect(bounded.code).toBe(Code.InvalidArgument);
    expect(bounded.metadata.get(ERROR_CODE_HEADER)).toBe("LLMGW_CONTROL_PLANE_INVALID_ARGUMENT");
    expect(taken()).toBe(3);

    // Byte for byte what Connect's handler answers.
    const body = toBinary(HeartbeatRequestSchema, create(HeartbeatRequestSchema, { nodeId }));
    const wrongAuth = { authorization: "Bearer llmgw-node-wrong" };
    const fast = await postUnary(url, "Heartbeat", body, wrongAuth);
    expect(fast).toEqual(await postUnary(url, "Heartbeat", body, wrongAuth, true));
    expect(fast.status).toBe(401);
    expect(fast.type).toBe("application/json");
  });

  it("answers a body that is not protobuf with invalid_argument, as Connect's handler (rewritten) does", async () => {
    const { url, auth, taken } = await setup();
    // Field 1 (node_id), length-delimited, claiming 100 bytes that are not there.
    const garbage = Uint8Array.from([0x0a, 100, 1, 2]);
    const fast = await postUnary(url, "Heartbeat", garbage, auth);
    expect(fast.status).toBe(400);
    expect(fast.errorCode).toBe("LLMGW_CONTROL_PLANE_INVALID_ARGUMENT");
    const error = JSON.parse(fast.body) as { code: string; message: string };
    expect(error.code).toBe("invalid_argument");
    expect(error.message).toMatch(/^the request body is not a valid protobuf message \(.+\)$/);
    expect(taken()).toBe(1);
  });

  it("refuses a body over readMaxBytes with resource_exhausted and keeps the connection usable", async () => {
    const { url, auth, nodeId } = await setup({ readMaxBytes: 64 });
    const big = toBinary(
      HeartbeatRequestSchema,
      create(HeartbeatRequestSchema, { nodeId: `${nodeId}-${"x".repeat(100)}` }),
    );
    const answer = await postUnary(url, "Heartbeat", big, auth);
    expect(answer.status).toBe(429);
    expect(JSON.parse(answer.body)).toEqual({
      code: "resource_exhausted",
      message: `message size ${big.byteLength} is larger than configured readMaxBytes 64`,
    });
    const small = toBinary(HeartbeatRequestSchema, create(HeartbeatRequestSchema, { nodeId }));
    expect((await postUnary(url, "Heartbeat", small, auth)).status).toBe(200);

    // Without a content-length (chunked), the bound holds as the bytes arrive.
    const chunked = await fetch(`${url}/llmgw.v1.AgentService/Heartbeat`, {
      method: "POST",
      headers: { ...auth, "content-type": "application/proto" },
      body: new ReadableStream({
        start(controller) {
          controller.enqueue(big.subarray(0, 40));
          controller.enqueue(big.subarray(40));
          controller.close();
        },
      }),
      duplex: "half",
    } as RequestInit);
    expect(chunked.status).toBe(429);
    expect(((await chunked.json()) as { message: string }).message).toBe(
      `message size ${big.byteLength} is larger than configured readMaxBytes 64`,
    );
  });

  it("leaves a malformed connect-timeout-ms to Connect, which refuses it", async () => {
    const { url, auth, nodeId, taken } = await setup();
    const body = toBinary(HeartbeatRequestSchema, create(HeartbeatRequestSchema, { nodeId }));
    const answer = await postUnary(url, "Heartbeat", body, {
      ...auth,
      "connect-timeout-ms": "soon",
    });
    expect(answer.status).toBe(400);
    expect(JSON.parse(answer.body)).toEqual({
      code: "invalid_argument",
      message: "protocol error: invalid connect timeout value: soon",
    });
    expect(taken()).toBe(0);
    // A well-formed one is taken (the answer is synchronous but for durability).
    const ok = await postUnary(url, "Heartbeat", body, { ...auth, "connect-timeout-ms": "5000" });
    expect(ok.status).toBe(200);
    expect(taken()).toBe(1);
  });

  it("answers only once the change is durable, and unavailable when the store does not confirm", async () => {
    const { agent, nodeId, auth, setDurable } = await setup();
    let confirm: (() => void) | undefined;
    setDurable(
      () =>
        new Promise<void>((resolve) => {
          confirm = resolve;
        }),
    );
    let answered = false;
    const call = agent.heartbeat({ nodeId }, { headers: auth }).then((res) => {
      answered = true;
      return res;
    });
    await expect.poll(() => confirm).toBeDefined();
    // The call was taken; its answer waits for the store. A short real wait shows it waiting.
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(answered).toBe(false);
    confirm?.();
    expect((await call).unchanged).toBe(false);

    setDurable(() =>
      Promise.reject(
        new ControlPlaneError("LLMGW_CONTROL_PLANE_STORE_UNAVAILABLE", "the store did not confirm"),
      ),
    );
    const refused = await refusal(agent.heartbeat({ nodeId }, { headers: auth }));
    expect(refused.code).toBe(Code.Unavailable);
    expect(refused.metadata.get(ERROR_CODE_HEADER)).toBe("LLMGW_CONTROL_PLANE_STORE_UNAVAILABLE");
  });

  it("leaves JSON and compressed calls to Connect's handler", async () => {
    const { url, client, nodeId, auth, taken } = await setup();
    const json = client(false);
    expect((await json.heartbeat({ nodeId }, { headers: auth })).assignments).toHaveLength(1);
    const body = toBinary(HeartbeatRequestSchema, create(HeartbeatRequestSchema, { nodeId }));
    const res = await fetch(`${url}/llmgw.v1.AgentService/Heartbeat`, {
      method: "POST",
      headers: { ...auth, "content-type": "application/proto", "content-encoding": "gzip" },
      body: gzipSync(body),
    });
    expect(res.status).toBe(200);
    expect(
      fromBinary(HeartbeatResponseSchema, new Uint8Array(await res.arrayBuffer())).assignments,
    ).toHaveLength(1);
    expect(taken()).toBe(0);
  });
});
