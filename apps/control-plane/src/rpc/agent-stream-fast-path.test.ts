// The agents' client streams served off the socket (agent-stream-fast-path.ts), on a real
// loopback listener, driven by the official Connect client as agents drive them; anything the
// fast path does not take goes to Connect's own handler on the same listener.
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { Code, createClient } from "@connectrpc/connect";
import { createWritableIterable } from "@connectrpc/connect/protocol";
import { connectNodeAdapter, createConnectTransport } from "@connectrpc/connect-node";
import { simulateInventory } from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import {
  AgentService,
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
import { openSqliteStore } from "../store/sqlite-store.js";
import { createManualClock } from "../testing/manual-clock.js";
import { refusal } from "../testing/refusal.js";
import { createAgentService, createAgentStreams } from "./agent-service.js";
import { createAgentStreamFastPath } from "./agent-stream-fast-path.js";
import { ERROR_CODE_HEADER, errorMappingInterceptor } from "./errors.js";

const JOIN = "llmgw-join-test";
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** A control listener of the fast path then Connect, a node with one ready replica. */
async function setup(fastReadMaxBytes = 4 * 1024 * 1024, heartbeatStreams = true) {
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
  const fast = createAgentStreamFastPath(createAgentStreams(cluster, options), {
    readMaxBytes: fastReadMaxBytes,
  });
  const connect = connectNodeAdapter({
    interceptors: [errorMappingInterceptor],
    readMaxBytes: 4 * 1024 * 1024,
    routes: (router) => router.service(AgentService, createAgentService(cluster, JOIN, options)),
  });
  let taken = 0;
  const server: Server = createServer((req, res) => {
    if (fast(req, res)) {
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
  const report = (running: number) =>
    create(ReplicaLoadReportSchema, {
      replicaId,
      load: { running },
      scrapedAtUnixMs: BigInt(clock.now()),
    });
  return { cluster, url, client, agent, nodeId, auth, samples, report, taken: () => taken };
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
    const { agent, nodeId, auth } = await setup(64);
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
    const { cluster, agent, nodeId, auth, taken } = await setup(undefined, false);
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
