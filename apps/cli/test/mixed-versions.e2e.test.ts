/**
 * Mixed versions during an upgrade, in either order. The previous main's agent, built from git
 * history, against this control plane: it registers, takes a deployment, reports its engine
 * ready, and keeps it through a restart of this control plane. (It knows one control-plane URL
 * only, so it cannot follow a PostgreSQL failover: upgrade agents before relying on one.) And
 * this agent against the previous main's control plane: deploy, ready, serve.
 */
import { type ChildProcess, spawn } from "node:child_process";
import path from "node:path";
import { MIGRATIONS } from "@llmgw/control-plane";
import { NodeState } from "@llmgw/proto";
import { LLMGW_VERSION } from "@llmgw/wire";
import OpenAI from "openai";
import { afterAll, describe, expect, it } from "vitest";
import {
  AgentProc,
  allReady,
  ControlPlaneProc,
  deploySimReady,
  enginePids,
  ensureCliBuilt,
  freePort,
  runLlmgw,
  stopAll,
  tempRoot,
  waitFor,
} from "./cluster-harness.js";
import {
  PREVIOUS_MAIN,
  previousCli,
  previousCliUnavailable,
  previousControlPlane,
} from "./previous-release.js";

const skip = previousCliUnavailable();

let keys = 0;

/** One chat completion through the control plane's public API, with a new key. */
async function chatOnce(cp: ControlPlaneProc): Promise<void> {
  keys += 1;
  const { secret } = await cp.admin().createApiKey({ name: `mixed-${keys}` }, cp.adminHeaders());
  const client = new OpenAI({ baseURL: `${cp.publicUrl}/v1`, apiKey: secret, maxRetries: 0 });
  const answer = await client.chat.completions.create({
    model: "chat",
    max_tokens: 8,
    messages: [{ role: "user", content: "hello across versions" }],
  });
  expect(answer.choices[0]?.message.content?.length).toBeGreaterThan(0);
  expect(answer.usage?.completion_tokens).toBeGreaterThan(0);
}
const roots: string[] = [];
const children: ChildProcess[] = [];
afterAll(async () => {
  for (const c of children) c.kill("SIGKILL");
  await stopAll(roots);
});

describe.skipIf(skip)(
  `the previous main (${PREVIOUS_MAIN.slice(0, 7)}) and this build, mixed${skip ? ` (skipped: ${skip})` : ""}`,
  () => {
    it("registers, runs a deployment, serves, and keeps its engine through a control-plane restart", async () => {
      ensureCliBuilt();
      const previous = previousCli();
      const root = tempRoot("llmgw-mixed-");
      roots.push(root);
      const cp = new ControlPlaneProc(root, await freePort(), await freePort(), [
        "--heartbeat-interval",
        "500ms",
      ]);
      await cp.start();
      let output = "";
      const agent = spawn(
        process.execPath,
        [
          previous,
          "agent",
          "--control-plane",
          cp.controlUrl,
          "--state-dir",
          path.join(root, "agent"),
          "--simulate",
          "1xh100-80g",
          "--node-name",
          "old-agent",
          "--advertise-address",
          "127.0.0.1",
        ],
        {
          env: { ...process.env, LLMGW_JOIN_TOKEN: cp.token() },
          stdio: ["ignore", "pipe", "pipe"],
        },
      );
      children.push(agent);
      agent.stdout?.on("data", (d: Buffer) => {
        output += d.toString();
      });
      agent.stderr?.on("data", (d: Buffer) => {
        output += d.toString();
      });
      const admin = cp.admin();
      const auth = cp.adminHeaders();
      await waitFor("the previous agent's node to be ready", async () => {
        if (agent.exitCode !== null) throw new Error(`the previous agent exited:\n${output}`);
        return (await admin.listNodes({}, auth)).nodes[0]?.state === NodeState.READY
          ? true
          : undefined;
      });
      const ready = await deploySimReady(cp);
      const pids = enginePids(ready);
      await chatOnce(cp);
      // The operator sees the upgrade half done: the old agent's version in `llmgw nodes`, and
      // `llmgw status` naming who runs which.
      const adminEnv = { LLMGW_ADMIN_TOKEN: cp.token("admin") };
      const nodes = runLlmgw(["nodes", "--control-plane", cp.controlUrl], adminEnv);
      expect(await nodes.exited, nodes.output()).toBe(0);
      expect(nodes.output()).toMatch(/old-agent .* 0\.1\.0 /);
      const status = runLlmgw(["status", "--control-plane", cp.controlUrl], adminEnv);
      expect(await status.exited, status.output()).toBe(0);
      const nodeId = (await admin.listNodes({}, auth)).nodes[0]?.nodeId;
      expect(nodeId).toMatch(/^old-agent/);
      expect(status.output()).toContain(
        `versions     mixed: ${LLMGW_VERSION} (control plane ${cp.controlUrl}), 0.1.0 (agent ${nodeId})`,
      );
      await cp.stop();
      await cp.start();
      const again = await waitFor("the replica ready after the restart", async () => {
        const node = (await admin.listNodes({}, auth)).nodes[0];
        if (node?.state !== NodeState.READY) return undefined;
        const d = (await admin.getDeployment({ name: "chat" }, auth)).deployment;
        return allReady(d, 1) ? d : undefined;
      });
      expect(enginePids(again)).toEqual(pids);
      await chatOnce(cp);
      expect(output).not.toContain("LLMGW_AGENT_CONFIG_INVALID");
    }, 400_000);

    it("this agent under the previous main's control plane: deploy, ready, serve", async (test) => {
      ensureCliBuilt();
      const previous = previousControlPlane();
      if (previous.unavailable)
        test.skip(`the previous control plane cannot run here: ${previous.unavailable}`);
      const root = tempRoot("llmgw-mixed-old-cp-");
      roots.push(root);
      const cp = new ControlPlaneProc(
        root,
        await freePort(),
        await freePort(),
        ["--heartbeat-interval", "500ms"],
        previous.main,
      );
      await cp.start();
      const agent = new AgentProc(root, "new-agent", "1xh100-80g", cp);
      agent.start();
      const admin = cp.admin();
      const auth = cp.adminHeaders();
      await waitFor("this agent's node ready under the previous control plane", async () => {
        if (agent.proc?.child.exitCode !== null)
          throw new Error(`the agent exited:\n${agent.proc?.output()}`);
        return (await admin.listNodes({}, auth)).nodes[0]?.state === NodeState.READY
          ? true
          : undefined;
      });
      await deploySimReady(cp);
      await chatOnce(cp);
      const status = await admin.getClusterStatus({}, auth);
      expect(status.version).toBe("0.1.0");
      expect((await admin.listNodes({}, auth)).nodes[0]?.inventory?.agentVersion).toBe(
        LLMGW_VERSION,
      );
    }, 400_000);

    it("a downgrade onto this release's store is refused by the previous control plane, clearly", async (test) => {
      ensureCliBuilt();
      const previous = previousControlPlane();
      if (previous.unavailable)
        test.skip(`the previous control plane cannot run here: ${previous.unavailable}`);
      const root = tempRoot("llmgw-downgrade-");
      roots.push(root);
      const cp = new ControlPlaneProc(root, await freePort(), 0, ["--no-public-api"]);
      await cp.start();
      await cp.stop();
      const old = runLlmgw(
        [
          "control-plane",
          "--data-dir",
          cp.dataDir,
          "--no-public-api",
          "--control-listen",
          `127.0.0.1:${await freePort()}`,
        ],
        {},
        previous.main,
      );
      expect(await old.exited).not.toBe(0);
      expect(old.output()).toContain("LLMGW_CONTROL_PLANE_STORE_TOO_NEW");
      expect(old.output()).toContain(
        `has schema version ${MIGRATIONS.length}, newer than this build understands`,
      );
    }, 400_000);
  },
);
