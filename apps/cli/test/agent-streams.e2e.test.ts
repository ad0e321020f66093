/**
 * Heartbeat streams between real processes: with a 30 s heartbeat interval, a deployment
 * applied right after the agent's first heartbeat reaches the agent over its `WatchDesired`
 * stream at once, not at its next heartbeat; with `--agent-stream 0` it waits for that beat.
 */
import { existsSync, readdirSync } from "node:fs";
import path from "node:path";
import { create } from "@bufbuild/protobuf";
import { DeploymentSchema, Engine, NodeState } from "@llmgw/proto";
import { afterAll, describe, expect, it } from "vitest";
import {
  AgentProc,
  ControlPlaneProc,
  ensureCliBuilt,
  freePort,
  stopAll,
  tempRoot,
  waitFor,
} from "./cluster-harness.js";

const roots: string[] = [];
afterAll(() => stopAll(roots));

/** A control plane with a 30 s heartbeat and one agent that has sent its first heartbeat. */
async function cluster(extra: string[]) {
  ensureCliBuilt();
  const root = tempRoot("llmgw-agent-streams-");
  roots.push(root);
  const cp = new ControlPlaneProc(root, await freePort(), await freePort(), [
    "--heartbeat-interval",
    "30s",
    "--node-lost-after",
    "300s",
    "--no-public-api",
    ...extra,
  ]);
  await cp.start();
  const agent = new AgentProc(root, "node-a", "1xh100-80g", cp);
  agent.start();
  // Registered is not enough: the heartbeat right after Register would bring the deployment.
  await waitFor("the agent's first heartbeat", async () => {
    const res = await cp.admin().listNodes({}, cp.adminHeaders());
    return res.nodes.some((n) => n.state === NodeState.READY && n.lastHeartbeatUnixMs !== undefined)
      ? true
      : undefined;
  });
  const launched = () => {
    const dir = path.join(agent.stateDir, "pids");
    return existsSync(dir) && readdirSync(dir).some((f) => f.endsWith(".pid.json"));
  };
  const deploy = () =>
    cp.admin().applyDeployment(
      {
        deployment: create(DeploymentSchema, {
          name: "chat",
          model: "sim/chat",
          engine: Engine.SIM,
          gpuClass: "h100-80g",
          replicas: 1,
        }),
      },
      cp.adminHeaders(),
    );
  return { cp, agent, launched, deploy };
}

describe("heartbeat streams between real processes", () => {
  it("a deployment reaches the agent at once, not at its next heartbeat 30 s later", async () => {
    const c = await cluster([]);
    expect(c.launched()).toBe(false);
    const t0 = Date.now();
    await c.deploy();
    await waitFor(
      "the agent to launch the engine",
      () => (c.launched() ? true : undefined),
      10_000,
    );
    expect(Date.now() - t0).toBeLessThan(10_000);
  });

  it("with --agent-stream 0 the same deployment waits for the next heartbeat", async () => {
    const c = await cluster(["--agent-stream", "0"]);
    await c.deploy();
    // Placed at once: only the agent's next heartbeat can bring it there.
    const placed = await c.cp.admin().getDeployment({ name: "chat" }, c.cp.adminHeaders());
    expect(placed.deployment?.replicas.length).toBe(1);
    // Well past the push path's few hundred ms, well before the next beat: an absence has no
    // condition to wait for.
    await new Promise((r) => setTimeout(r, 4_000));
    expect(c.launched()).toBe(false);
  });
});
