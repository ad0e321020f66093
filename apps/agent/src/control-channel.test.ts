import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createRouterTransport, type Transport } from "@connectrpc/connect";
import {
  AgentService,
  HeartbeatResponseSchema,
  NodeInventorySchema,
  RegisterResponseSchema,
} from "@llmgw/proto";
import { afterEach, describe, expect, it } from "vitest";
import { ControlChannel } from "./control-channel.js";
import { loadIdentity } from "./identity.js";

const dirs: string[] = [];
afterEach(async () => {
  for (const dir of dirs.splice(0)) await rm(dir, { recursive: true, force: true });
});

const URL = "http://control-plane.test";

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

// Reconnects, backoff, re-registering, generations and beatSoon: control-loop.test.ts, a
// table over the control plane's real AgentService.
describe("ControlChannel", () => {
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
