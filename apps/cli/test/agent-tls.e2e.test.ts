/**
 * A real agent process over HTTPS: the control listener with `--tls-cert`/`--tls-key` (here
 * the control plane in this process, a self-signed certificate from the real `openssl`), the
 * agent trusting it through `NODE_EXTRA_CA_CERTS`, as docs/operations.md sets agents up.
 * It registers, heartbeats, and a deployment reaches it over its `WatchDesired` stream.
 */
import { existsSync, readdirSync } from "node:fs";
import path from "node:path";
import { startControlPlane } from "@llmgw/control-plane";
import { hasOpenssl, selfSignedCert } from "@llmgw/control-plane/testing";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import { afterAll, describe, expect, it } from "vitest";
import { ensureCliBuilt, runLlmgw, stopAll, tempRoot, waitFor } from "./cluster-harness.js";

const roots: string[] = [];
const closers: (() => Promise<unknown>)[] = [];
afterAll(async () => {
  await stopAll(roots);
  for (const close of closers) await close();
});

describe("an agent over HTTPS", () => {
  it.skipIf(!hasOpenssl())(
    "registers, heartbeats and takes a deployment from its watch",
    async () => {
      ensureCliBuilt();
      const root = tempRoot("llmgw-agent-tls-");
      roots.push(root);
      const { cert, key } = selfSignedCert(root);
      const cp = await startControlPlane({
        dataDir: path.join(root, "cp"),
        listen: "127.0.0.1:0",
        controlListen: "127.0.0.1:0",
        tlsCertFile: cert,
        tlsKeyFile: key,
        publicApi: false,
        // Long enough that only the watch can bring the deployment in time.
        heartbeatIntervalMs: 30_000,
        nodeLostAfterMs: 300_000,
      });
      closers.push(() => cp.close());
      expect(cp.controlUrl).toMatch(/^https:/);
      const stateDir = path.join(root, "node-a");
      const agent = runLlmgw(
        [
          "agent",
          "--control-plane",
          cp.controlUrl,
          "--state-dir",
          stateDir,
          "--simulate",
          "1xh100-80g",
          "--node-name",
          "node-a",
          "--advertise-address",
          "127.0.0.1",
        ],
        { NODE_EXTRA_CA_CERTS: cert, LLMGW_JOIN_TOKEN: cp.joinToken },
      );
      const nodeId = await waitFor("the agent's first heartbeat over HTTPS", () => {
        if (agent.child.exitCode !== null) throw new Error(`agent exited:\n${agent.output()}`);
        const node = cp.cluster.listNodes()[0];
        return node?.lastHeartbeatMs !== undefined ? node.nodeId : undefined;
      });
      cp.cluster.applyDeployment(
        parseDeploymentSpecOrThrow({
          name: "chat",
          engine: "sim",
          model: "org/model",
          gpuClass: "h100-80g",
        }),
      );
      expect(cp.cluster.desiredSet(nodeId).assignments).toHaveLength(1);
      const pids = path.join(stateDir, "pids");
      await waitFor(
        "the agent to launch the engine",
        () => (existsSync(pids) && readdirSync(pids).length > 0 ? true : undefined),
        10_000,
      );
      expect(agent.output()).not.toMatch(/watch ended|heartbeat stream failed|cannot reach/);
    },
  );
});
