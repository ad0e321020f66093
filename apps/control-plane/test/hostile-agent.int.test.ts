import { create, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  Engine,
  GpuSchema,
  NodeInventorySchema,
  RegisterRequestSchema,
  ReplicaState,
} from "@llmgw/proto";
import { afterEach, describe, expect, it } from "vitest";
import { startControlPlane } from "../src/run.js";
import { FakeAgent } from "../src/testing/fake-agent.js";
import { fillDisk } from "../src/testing/full-disk.js";
import { adminClient, simAgent, startTestControlPlane, tempDir } from "./helpers.js";

const cleanups: (() => Promise<unknown> | undefined)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

async function setup(log?: (line: string) => void) {
  const tmp = tempDir();
  cleanups.push(async () => tmp.cleanup());
  const cp = await startTestControlPlane(tmp.dir, {}, { log });
  cleanups.push(() => cp.close());
  return cp;
}

/** The error a Register with `inventory` gets from `cp`. */
async function refusedRegister(
  cp: Awaited<ReturnType<typeof setup>>,
  inventory: Parameters<typeof create<typeof NodeInventorySchema>>[1],
): Promise<ConnectError> {
  const agent = new FakeAgent({
    controlUrl: cp.controlUrl,
    joinToken: cp.joinToken,
    inventory: create(NodeInventorySchema, inventory),
  });
  return ConnectError.from(await agent.register().catch((e: unknown) => e));
}

describe("the control plane against a hostile client", () => {
  it.each([
    ["llmgw.v1.AgentService/Register"],
    ["llmgw.v1.AgentService/Heartbeat"],
    ["llmgw.v1.ClusterService/ListNodes"],
  ])(
    "answers garbage protobuf posted to %s with invalid_argument (400), not internal",
    async (path) => {
      const cp = await setup();
      const res = await fetch(`${cp.controlUrl}/${path}`, {
        method: "POST",
        headers: { "content-type": "application/proto" },
        body: new Uint8Array([0xff, 0xff, 0xff, 0xff, 0x0f, 0x01]),
      });
      expect(res.status).toBe(400);
      expect(res.headers.get("llmgw-error-code")).toBe("LLMGW_CONTROL_PLANE_INVALID_ARGUMENT");
      expect(await res.json()).toEqual({
        code: "invalid_argument",
        message:
          "the request body is not a valid protobuf message (illegal tag: field no 536870911 wire type 7)",
      });
    },
  );

  it("still answers a valid binary request, and a refused one with its own code", async () => {
    const cp = await setup();
    const body = toBinary(
      RegisterRequestSchema,
      create(RegisterRequestSchema, {
        inventory: { hostname: "node-a" },
        advertiseAddress: "127.0.0.1",
      }),
    );
    const post = (token: string) =>
      fetch(`${cp.controlUrl}/llmgw.v1.AgentService/Register`, {
        method: "POST",
        headers: { "content-type": "application/proto", authorization: `Bearer ${token}` },
        body,
      });
    expect((await post(cp.joinToken)).status).toBe(200);
    const refused = await post("llmgw-join-wrong");
    expect(refused.status).toBe(401);
    expect(refused.headers.get("llmgw-error-code")).toBe("LLMGW_CONTROL_PLANE_UNAUTHENTICATED");
  });

  it("refuses a Register with 100,000 GPUs, naming the field and the limit", async () => {
    const cp = await setup();
    const error = await refusedRegister(cp, {
      hostname: "node-a",
      gpus: Array.from({ length: 100_000 }, (_, i) =>
        create(GpuSchema, { index: i, uuid: `GPU-${i}`, gpuClass: "h100-80g" }),
      ),
    });
    expect(error.code).toBe(Code.InvalidArgument);
    expect(error.rawMessage).toBe(
      "RegisterRequest.inventory.gpus has 100000 entries; the limit is 64",
    );
    expect(cp.cluster.listNodes()).toEqual([]);
    const metrics = await (await fetch(`${cp.controlUrl}/metrics`)).text();
    expect(metrics).not.toContain("GPU-99999");
  });

  it("refuses a Register whose agent version holds terminal escapes", async () => {
    const cp = await setup();
    const error = await refusedRegister(cp, {
      hostname: "node-a",
      agentVersion: "9.9.9\u001b[2J\u001b[H",
    });
    expect(error.code).toBe(Code.InvalidArgument);
    expect(error.rawMessage).toBe(
      'RegisterRequest.inventory.agentVersion must be visible ASCII characters (no spaces or control characters), got "9.9.9\\u001b[2J\\u001b[H"',
    );
    expect(cp.cluster.listNodes()).toEqual([]);
  });

  it("refuses a Register listing one GPU index twice, and keeps scheduling", async () => {
    const cp = await setup();
    const error = await refusedRegister(cp, {
      hostname: "node-a",
      gpus: [0, 1].map((i) =>
        create(GpuSchema, { index: 0, uuid: `GPU-${i}`, gpuClass: "h100-80g" }),
      ),
    });
    expect(error.code).toBe(Code.InvalidArgument);
    expect(error.rawMessage).toBe(
      "RegisterRequest.inventory.gpus[1].index is 0, the same as RegisterRequest.inventory.gpus[0].index; each GPU needs its own index",
    );
    expect(cp.cluster.listNodes()).toEqual([]);
  });

  it("refuses a node beyond --max-nodes with resource_exhausted and its own code", async () => {
    const tmp = tempDir();
    cleanups.push(async () => tmp.cleanup());
    const cp = await startControlPlane({
      dataDir: tmp.dir,
      listen: "127.0.0.1:0",
      controlListen: "127.0.0.1:0",
      shutdownGraceMs: 0,
      maxNodes: 2,
    });
    cleanups.push(() => cp.close());
    // Each Register without a held id is a new node: the join token alone cannot add more.
    for (const host of ["node-a", "node-b"]) await simAgent(cp, host, "1xh100-80g").register();
    const error = ConnectError.from(
      await simAgent(cp, "node-c", "8xh100-80g")
        .register()
        .catch((e: unknown) => e),
    );
    expect(error.code).toBe(Code.ResourceExhausted);
    expect(error.metadata.get("llmgw-error-code")).toBe("LLMGW_CONTROL_PLANE_NODE_LIMIT");
    expect(cp.cluster.listNodes().map((n) => n.hostname)).toEqual(["node-a", "node-b"]);
  });

  it("escapes control characters of agent text in log lines and events", async () => {
    const lines: string[] = [];
    const cp = await setup((line) => lines.push(line));
    const admin = adminClient(cp, cp.adminToken);
    const agent = simAgent(cp, "gpu1\n[fake] admin login", "1xh100-80g");
    await agent.register();
    await admin.applyDeployment({
      deployment: { name: "chat", model: "m", engine: Engine.VLLM, replicas: 1 },
    });
    await agent.heartbeat();
    agent.report("chat-0", 0, {
      state: ReplicaState.FAILED,
      message: "exited\r\n[fake] replica ready",
      logTail: ["\u001b[2Jcleared", "line\u2028separator"],
    });
    await agent.heartbeat();

    const events = (await admin.listEvents({ limit: 100 })).events;
    const joined = events.find((e) => e.kind === "node.joined");
    expect(joined?.message).toBe(
      "gpu1\\n[fake] admin login joined with 1 GPU (simulated) at 127.0.0.1",
    );
    const failed = events.find((e) => e.kind === "replica.state" && e.severity === "error");
    expect(failed?.message).toBe(
      "rank 0 on gpu1\\n[fake] admin login: reported → failed (exited\\r\\n[fake] replica ready); last output: \\u001b[2Jcleared | line\\u2028separator",
    );
    expect(lines.length).toBeGreaterThan(0);
    for (const line of lines) expect(line).not.toMatch(/[\u0000-\u001f\u007f-\u009f\u2028\u2029]/);
    expect(lines.filter((l) => l.includes("[fake]"))).toHaveLength(2);
  });

  it("on a full disk refuses admin writes with the store's code and keeps answering heartbeats", async () => {
    const cp = await setup();
    const admin = adminClient(cp, cp.adminToken);
    const agent = simAgent(cp, "node-a", "1xh100-80g");
    await agent.register();
    await admin.applyDeployment({
      deployment: { name: "chat", model: "m", engine: Engine.VLLM, replicas: 1 },
    });
    await agent.heartbeat();
    const free = fillDisk(cp.store.location);
    cleanups.push(async () => free());
    const error = ConnectError.from(
      await admin.createApiKey({ name: "app" }).catch((e: unknown) => e),
    );
    expect(error.code).toBe(Code.Internal);
    expect(error.metadata.get("llmgw-error-code")).toBe("LLMGW_CONTROL_PLANE_STORE_FAILED");
    expect(error.rawMessage).toMatch(/failed \(putApiKey\): database or disk is full/);
    agent.report("chat-0", 0, { state: ReplicaState.FAILED, message: "exited" });
    await agent.heartbeat();
    expect((await admin.listReplicas({})).replicas[0]?.state).toBe(ReplicaState.FAILED);
  });
});
