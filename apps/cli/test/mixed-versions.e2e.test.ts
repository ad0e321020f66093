/**
 * Mixed versions during an upgrade (control planes first, then agents): the previous main's
 * agent, built from git history, against this control plane. It registers, takes a
 * deployment, reports its engine ready, and keeps it through a restart of this control plane.
 * (It knows one control-plane URL only, so it cannot follow a PostgreSQL failover: upgrade
 * agents before relying on one.)
 */
import { type ChildProcess, spawn } from "node:child_process";
import path from "node:path";
import { NodeState } from "@llmgw/proto";
import { afterAll, describe, expect, it } from "vitest";
import {
  allReady,
  ControlPlaneProc,
  enginePids,
  ensureCliBuilt,
  freePort,
  simDeployment,
  stopAll,
  tempRoot,
  waitFor,
} from "./cluster-harness.js";
import { PREVIOUS_MAIN, previousCli, previousCliUnavailable } from "./previous-release.js";

const skip = previousCliUnavailable();
const roots: string[] = [];
const children: ChildProcess[] = [];
afterAll(async () => {
  for (const c of children) c.kill("SIGKILL");
  await stopAll(roots);
});

describe.skipIf(skip)(
  `the previous main's agent (${PREVIOUS_MAIN.slice(0, 7)}) against this control plane${skip ? ` (skipped: ${skip})` : ""}`,
  () => {
    it("registers, runs a deployment and keeps its engine through a control-plane restart", async () => {
      ensureCliBuilt();
      const previous = previousCli();
      const root = tempRoot("llmgw-mixed-");
      roots.push(root);
      const cp = new ControlPlaneProc(root, await freePort(), 0, [
        "--no-public-api",
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
      await admin.applyDeployment(
        {
          deployment: simDeployment("chat", { gpuClass: "h100-80g", replicas: 1 }),
        },
        auth,
      );
      const ready = await waitFor("its replica ready", async () => {
        const d = (await admin.getDeployment({ name: "chat" }, auth)).deployment;
        return allReady(d, 1) ? d : undefined;
      });
      const pids = enginePids(ready);
      await cp.stop();
      await cp.start();
      const again = await waitFor("the replica ready after the restart", async () => {
        const node = (await admin.listNodes({}, auth)).nodes[0];
        if (node?.state !== NodeState.READY) return undefined;
        const d = (await admin.getDeployment({ name: "chat" }, auth)).deployment;
        return allReady(d, 1) ? d : undefined;
      });
      expect(enginePids(again)).toEqual(pids);
      expect(output).not.toContain("LLMGW_AGENT_CONFIG_INVALID");
    }, 400_000);
  },
);
