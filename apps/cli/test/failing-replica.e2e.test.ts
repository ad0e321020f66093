/**
 * A replica that keeps failing on one node moves to another, end to end: a real control plane
 * (`--move-failed-after 2s`) and two real agents on simulated nodes. The first agent's engines
 * are told to listen on an address this host does not have (`--engine-bind-address
 * 192.0.2.1`, TEST-NET-1): a node misconfigured in a way no health check sees. Every engine
 * there exits at once; the agent's restart policy gives up and it relaunches the replica
 * (`--relaunch-failed 1`), which fails again. Once the second node joins, the control plane
 * moves the replica there, where it serves through the router; a second replica placed
 * afterwards keeps off the first node too.
 */
import { NodeState } from "@llmgw/proto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  AgentProc,
  allReady,
  ControlPlaneProc,
  deployment,
  ensureCliBuilt,
  freePort,
  runLlmgw,
  simDeployment,
  stopAll,
  tempRoot,
  waitFor,
} from "./cluster-harness.js";

const root = tempRoot("llmgw-e2e-failing-");
let cp: ControlPlaneProc;

beforeAll(async () => {
  ensureCliBuilt();
  cp = new ControlPlaneProc(root, await freePort(), await freePort(), [
    "--heartbeat-interval",
    "300ms",
    "--move-failed-after",
    "2s",
    "--no-auth",
  ]);
  await cp.start();
}, 60_000);

afterAll(async () => {
  await stopAll([root]);
});

async function nodesOf(name: string): Promise<string[]> {
  const d = await deployment(cp, name);
  return (d?.replicas ?? []).flatMap((r) => r.ranks.map((k) => k.nodeId)).sort();
}

describe("a replica that keeps failing on one node", { timeout: 120_000 }, () => {
  it("moves to another node with room, and its deployment keeps off the first", async () => {
    const admin = cp.admin();
    const broken = new AgentProc(root, "broken", "2xh100-80g", cp);
    broken.start([
      "--engine-bind-address",
      "192.0.2.1",
      "--kv-listen",
      "off",
      "--relaunch-failed",
      "1",
    ]);
    await waitFor("the first agent to register", async () => {
      const res = await admin.listNodes({}, cp.adminHeaders());
      return res.nodes.find((n) => n.hostname === "broken" && n.state === NodeState.READY);
    });
    await admin.applyDeployment(
      { deployment: simDeployment("chat", { gpuClass: "h100-80g", replicas: 1 }) },
      cp.adminHeaders(),
    );
    // Five quick exits, then the policy gives up: failed, and relaunched a second later.
    await waitFor(
      "the replica to fail on the first node",
      async () => {
        const events = (await admin.listEvents({ limit: 500 }, cp.adminHeaders())).events;
        return events.find((e) => e.kind === "replica.state" && /→ failed/.test(e.message));
      },
      60_000,
    );
    const [brokenId] = await nodesOf("chat");

    const healthy = new AgentProc(root, "healthy", "2xh100-80g", cp);
    healthy.start();
    const moved = await waitFor(
      "the replica to be READY on the second node",
      async () => {
        const d = await deployment(cp, "chat");
        const nodes = await nodesOf("chat");
        return allReady(d, 1) && nodes[0] !== brokenId ? d : undefined;
      },
      60_000,
    );
    expect(moved.replicas[0]?.replicaId).not.toBe("chat-0");
    const events = (await admin.listEvents({ limit: 500 }, cp.adminHeaders())).events;
    const removed = events.find((e) => e.kind === "replica.removed" && e.subject === "chat-0");
    expect(removed?.message).toMatch(
      /^its engine kept failing on broken since \S+Z \(restart policy gave up: .*\): moved, and chat avoids broken for 60 min$/,
    );

    expect(moved.avoided.map((r) => r.message)).toEqual([
      expect.stringMatching(
        /^broken is avoided until \S+Z: a replica kept failing there and moved; 'llmgw unavoid chat broken-\w+' lifts it$/,
      ),
    ]);

    // Served through the router from its new node, once the route table has it.
    const served = await waitFor("the router to serve chat", async () => {
      const res = await fetch(`${cp.publicUrl}/v1/chat/completions`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          model: "chat",
          max_tokens: 4,
          messages: [{ role: "user", content: "hi" }],
        }),
      });
      await res.arrayBuffer();
      return res.status === 200 ? res : undefined;
    });
    expect(served.headers.get("x-llmgw-replica")).toBe(moved.replicas[0]?.replicaId);

    // A second replica: the first node has the most room (spread would pick it), but the
    // deployment avoids it for an hour.
    await admin.scaleDeployment({ name: "chat", replicas: 2 }, cp.adminHeaders());
    await waitFor(
      "both replicas READY",
      async () => (allReady(await deployment(cp, "chat"), 2) ? true : undefined),
      60_000,
    );
    const healthyId = (await nodesOf("chat")).find((id) => id !== brokenId);
    expect(await nodesOf("chat")).toEqual([healthyId, healthyId]);

    // The operator mends the node and lifts the avoidance with the CLI; the detail view lists
    // it until then.
    const env = { LLMGW_CONTROL_PLANE: cp.controlUrl, LLMGW_ADMIN_TOKEN: cp.token("admin") };
    const cli = async (...args: string[]) => {
      const proc = runLlmgw(args, env);
      return { code: await proc.exited, out: proc.output() };
    };
    expect((await cli("deployments", "chat")).out).toMatch(
      /\n {2}broken is avoided until \S+Z: a replica kept failing there and moved; /,
    );
    expect(await cli("unavoid", "chat", "nope")).toMatchObject({
      code: 1,
      out: expect.stringContaining('no node with id or hostname "nope"'),
    });
    expect(await cli("unavoid", "chat", "broken")).toEqual({
      code: 0,
      out: `chat no longer avoids ${brokenId}\n`,
    });
    expect(await cli("unavoid", "chat")).toEqual({ code: 0, out: "chat did not avoid any node\n" });
    expect((await deployment(cp, "chat"))?.avoided).toEqual([]);
    const lifted = (await admin.listEvents({ limit: 500 }, cp.adminHeaders())).events.find(
      (e) => e.kind === "deployment.unavoided",
    );
    expect(lifted?.message).toBe("chat no longer avoids broken: lifted by an operator");
  });
});
