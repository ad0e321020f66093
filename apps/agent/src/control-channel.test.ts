import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createRouterTransport, type Transport } from "@connectrpc/connect";
import {
  AgentService,
  HeartbeatResponseSchema,
  NodeInventorySchema,
  type RegisterRequest,
  RegisterResponseSchema,
} from "@llmgw/proto";
import { afterEach, describe, expect, it } from "vitest";
import { type ChannelState, ControlChannel } from "./control-channel.js";
import { loadIdentity, saveIdentity } from "./identity.js";

const dirs: string[] = [];
afterEach(async () => {
  for (const dir of dirs.splice(0)) await rm(dir, { recursive: true, force: true });
});

const URL = "http://control-plane.test";
const TAKEN = `node n1 is registered; re-joining it needs its node credential, or an operator's \`llmgw nodes reset n1\``;

/** Options with fast, deterministic backoff (20 ms doubling to 80 ms, no jitter). */
function channelOptions(stateDir: string, transport: Transport) {
  return {
    controlPlaneUrl: URL,
    joinToken: "join",
    stateDir,
    advertiseAddress: "10.0.0.1",
    initialBackoffMs: 20,
    maxBackoffMs: 80,
    callTimeoutMs: 1_000,
    transport,
    random: () => 0.5,
  };
}

/**
 * An AgentService that, like the control plane, holds node n1 with a credential the agent
 * no longer has, and refuses to hand n1 over until `reset` is set.
 */
function heldNodeService() {
  const state = { reset: false, registers: [] as { at: number; req: RegisterRequest }[] };
  const transport = createRouterTransport(({ service }) => {
    service(AgentService, {
      register(req) {
        state.registers.push({ at: Date.now(), req });
        if (!state.reset) {
          throw new ConnectError(TAKEN, Code.PermissionDenied, {
            "llmgw-error-code": "LLMGW_CONTROL_PLANE_NODE_ID_TAKEN",
          });
        }
        return create(RegisterResponseSchema, { nodeId: "n1", nodeCredential: "fresh" });
      },
      heartbeat(_req, ctx) {
        if (ctx.requestHeader.get("authorization") !== "Bearer fresh") {
          throw new ConnectError("wrong credential for node n1", Code.Unauthenticated);
        }
        return create(HeartbeatResponseSchema, { generation: 7n, heartbeatIntervalMs: 10_000 });
      },
    });
  });
  return { state, transport };
}

describe("ControlChannel", () => {
  it("refused a held node id: proves it with the saved credential, says how to fix it, backs off, keeps engines", async () => {
    const stateDir = await mkdtemp(path.join(tmpdir(), "llmgw-channel-"));
    dirs.push(stateDir);
    await saveIdentity(stateDir, { nodeId: "n1", credential: "stale", controlPlaneUrl: URL });
    const { state, transport } = heldNodeService();
    const states: [ChannelState, string][] = [];
    let applied = 0;
    const channel = new ControlChannel(channelOptions(stateDir, transport), {
      inventory: async () => create(NodeInventorySchema, { hostname: "node-a" }),
      snapshot: async () => ({ gpus: [], replicas: [], problems: [] }),
      applyDesired: async () => {
        applied++;
      },
      onState: (s, detail) => states.push([s, detail]),
    });
    const abort = new AbortController();
    const running = channel.run(abort.signal);
    try {
      await expect.poll(() => state.registers.length, { timeout: 5_000 }).toBeGreaterThanOrEqual(6);
      // Every attempt proves the id with the credential from the state dir.
      expect(
        state.registers.map((r) => [r.req.previousNodeId, r.req.previousNodeCredential]),
      ).toEqual(state.registers.map(() => ["n1", "stale"]));
      // Doubling from 20 ms, capped at 80 ms (timers never fire early).
      const gaps = state.registers.slice(1, 6).map((r, i) => r.at - (state.registers[i]?.at ?? 0));
      const expected = [20, 40, 80, 80, 80];
      expect(gaps.map((g, i) => g >= (expected[i] as number) - 1)).toEqual([
        true,
        true,
        true,
        true,
        true,
      ]);
      expect(gaps.every((g) => g < 1_000)).toBe(true);
      expect(applied).toBe(0);
      expect(states).toContainEqual([
        "registering",
        `the control plane refused to re-join this node (LLMGW_CONTROL_PLANE_NODE_ID_TAKEN): ${TAKEN}. Engines keep running; retrying with backoff (at most every 80 ms)`,
      ]);

      state.reset = true;
      await expect.poll(() => channel.state, { timeout: 5_000 }).toBe("connected");
      expect(channel.nodeId).toBe("n1");
      expect(applied).toBe(1);
      expect(await loadIdentity(stateDir)).toEqual({
        nodeId: "n1",
        credential: "fresh",
        controlPlaneUrl: URL,
      });
    } finally {
      abort.abort();
      await running;
    }
  });
  it("keeps a credential it could not save and writes it after a later heartbeat", async () => {
    const stateDir = await mkdtemp(path.join(tmpdir(), "llmgw-channel-"));
    dirs.push(stateDir);
    // A directory where identity.json should go: the atomic rename onto it fails (as a full
    // disk would fail the write), and root's permissions cannot be used to make that happen.
    await mkdir(path.join(stateDir, "identity.json"));
    let heartbeats = 0;
    const transport = createRouterTransport(({ service }) => {
      service(AgentService, {
        register: () =>
          create(RegisterResponseSchema, {
            nodeId: "n1",
            nodeCredential: "issued",
            heartbeatIntervalMs: 20,
          }),
        heartbeat(_req, ctx) {
          if (ctx.requestHeader.get("authorization") !== "Bearer issued") {
            throw new ConnectError("wrong credential for node n1", Code.Unauthenticated);
          }
          heartbeats++;
          return create(HeartbeatResponseSchema, { generation: 1n, heartbeatIntervalMs: 20 });
        },
      });
    });
    const details: string[] = [];
    const channel = new ControlChannel(channelOptions(stateDir, transport), {
      inventory: async () => create(NodeInventorySchema, { hostname: "node-a" }),
      snapshot: async () => ({ gpus: [], replicas: [], problems: [] }),
      applyDesired: async () => {},
      onState: (_s, detail) => details.push(detail),
    });
    const abort = new AbortController();
    const running = channel.run(abort.signal);
    try {
      // Heartbeats go on with the issued credential although it is not on disk yet.
      await expect.poll(() => heartbeats, { timeout: 5_000 }).toBeGreaterThanOrEqual(2);
      expect(
        details.some((d) => d.startsWith(`cannot save the node credential in ${stateDir}`)),
      ).toBe(true);
      expect(await loadIdentity(stateDir)).toBeUndefined();
      await rm(path.join(stateDir, "identity.json"), { recursive: true });
      await expect
        .poll(() => loadIdentity(stateDir), { timeout: 5_000 })
        .toEqual({ nodeId: "n1", credential: "issued", controlPlaneUrl: URL });
    } finally {
      abort.abort();
      await running;
    }
  });
});

describe("ControlChannel.beatSoon", () => {
  it("sends the next heartbeat at once instead of after the interval, and coalesces a burst", async () => {
    const stateDir = await mkdtemp(path.join(tmpdir(), "llmgw-channel-"));
    dirs.push(stateDir);
    const beats: number[] = [];
    const transport = createRouterTransport(({ service }) => {
      service(AgentService, {
        register: () => create(RegisterResponseSchema, { nodeId: "n1", nodeCredential: "c" }),
        heartbeat() {
          beats.push(Date.now());
          // An hour: only beatSoon can bring the next heartbeat within this test.
          return create(HeartbeatResponseSchema, {
            generation: 1n,
            heartbeatIntervalMs: 3_600_000,
          });
        },
      });
    });
    const channel = new ControlChannel(channelOptions(stateDir, transport), {
      inventory: async () => create(NodeInventorySchema, { hostname: "node-a" }),
      snapshot: async () => ({ gpus: [], replicas: [], problems: [] }),
      applyDesired: async () => {},
    });
    const abort = new AbortController();
    const done = channel.run(abort.signal);
    await expect.poll(() => beats.length).toBe(1);
    channel.beatSoon();
    channel.beatSoon();
    await expect.poll(() => beats.length).toBe(2);
    // The second call came while waiting was already ended: no third beat follows by itself.
    await new Promise((r) => setTimeout(r, 50));
    expect(beats.length).toBe(2);
    abort.abort();
    await done;
  });
});
