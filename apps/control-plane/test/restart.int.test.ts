// A control plane restarted over the same data dir routes to the replicas that were ready
// before any agent has reported again, and takes load over the real control listener.
import { create } from "@bufbuild/protobuf";
import { Engine, ReplicaLoadReportSchema, ReplicaState } from "@llmgw/proto";
import { afterEach, describe, expect, it } from "vitest";
import type { ControlPlane } from "../src/run.js";
import { FakeAgent } from "../src/testing/fake-agent.js";
import { adminClient, simAgent, startTestControlPlane, tempDir } from "./helpers.js";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function started(dir: string): Promise<ControlPlane> {
  const cp = await startTestControlPlane(dir);
  cleanups.push(() => cp.close().then(() => {}));
  return cp;
}

describe("control plane restart", () => {
  it("keeps the ready replicas routed until their nodes report, and takes ReportLoad", async () => {
    const tmp = tempDir();
    cleanups.push(tmp.cleanup);
    const first = await started(tmp.dir);
    const agent = simAgent(first, "node-a", "2xh100-80g");
    await agent.register();
    await adminClient(first, first.adminToken).applyDeployment({
      deployment: {
        name: "chat",
        model: "m",
        engine: Engine.SIM,
        gpuClass: "h100-80g",
        replicas: 2,
      },
    });
    await agent.heartbeat();
    agent.report("chat-0", 0, { state: ReplicaState.READY, apiPort: 41_000 });
    agent.report("chat-1", 0, { state: ReplicaState.LOADING, apiPort: 41_001 });
    await agent.heartbeat();
    expect(first.cluster.routingMembership().replicas.map((r) => r.baseUrl)).toEqual([
      "http://127.0.0.1:41000",
    ]);
    await first.close();

    const cp = await started(tmp.dir);
    // No agent has reported to this process yet.
    expect(cp.cluster.nodeState(agent.nodeId as string)).toBe("unreachable");
    const membership = cp.cluster.routingMembership();
    expect(membership.replicas.map((r) => [r.id, r.baseUrl, r.state])).toEqual([
      ["chat-0", "http://127.0.0.1:41000", "ready"],
    ]);
    expect(membership.models).toEqual([
      {
        name: "chat",
        deployment: "chat",
        policy: "llmgw",
        loading: true,
        cacheIsolation: "salt",
      },
    ]);

    // The same agent (its credential unchanged) reports load between heartbeats.
    const again = new FakeAgent({ ...agent.options, controlUrl: cp.controlUrl });
    again.nodeId = agent.nodeId;
    again.credential = agent.credential;
    const version = cp.cluster.routingVersion;
    const res = await again.client.reportLoad(
      {
        nodeId: again.nodeId,
        replicas: [
          create(ReplicaLoadReportSchema, {
            replicaId: "chat-0",
            load: { running: 4, kvCacheUsage: 0.5 },
            scrapedAtUnixMs: BigInt(Date.now()),
          }),
        ],
      },
      { headers: { authorization: `Bearer ${again.credential}` } },
    );
    expect(res.loadIntervalMs).toBe(0);
    expect(cp.cluster.routingMembership().replicas[0]?.load).toEqual({
      running: 4,
      kvCacheUsage: 0.5,
    });
    expect(cp.cluster.routingVersion).toBe(version);

    // Its first heartbeat says chat-0 failed: out of the routing at once.
    again.assignments = agent.assignments;
    again.report("chat-0", 0, { state: ReplicaState.FAILED, apiPort: 41_000 });
    again.report("chat-1", 0, { state: ReplicaState.READY, apiPort: 41_001 });
    await again.heartbeat();
    expect(cp.cluster.routingMembership().replicas.map((r) => r.id)).not.toContain("chat-0");
  });
});
