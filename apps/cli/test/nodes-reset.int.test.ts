import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { type ControlPlane, inventoryToProto, startControlPlane } from "@llmgw/control-plane";
import { FakeAgent } from "@llmgw/control-plane/testing";
import { simulateInventory } from "@llmgw/discovery";
import { afterEach, describe, expect, it } from "vitest";
import type { CliIo } from "../src/command.js";
import { command } from "../src/commands/nodes-reset.js";
import { command as revoke } from "../src/commands/nodes-revoke.js";

const cleanups: (() => Promise<unknown> | undefined)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

function captureIo(cp: ControlPlane): { io: CliIo; out: string[] } {
  const out: string[] = [];
  return {
    out,
    io: {
      stdout: { write: (s: string) => out.push(s) > 0 },
      stderr: { write: (s: string) => out.push(s) > 0 },
      env: { LLMGW_CONTROL_PLANE: cp.controlUrl, LLMGW_ADMIN_TOKEN: cp.adminToken },
      cwd: process.cwd(),
      signal: new AbortController().signal,
    },
  };
}

/** A real control plane on loopback and a fake agent (not yet registered) for `hostname`. */
async function controlPlaneWithAgent(hostname: string) {
  const dir = mkdtempSync(join(tmpdir(), "llmgw-cli-nodes-"));
  cleanups.push(async () => rmSync(dir, { recursive: true, force: true }));
  const cp = await startControlPlane({
    dataDir: dir,
    listen: "127.0.0.1:0",
    controlListen: "127.0.0.1:0",
  });
  cleanups.push(() => cp.close());
  const agent = new FakeAgent({
    controlUrl: cp.controlUrl,
    joinToken: cp.joinToken,
    inventory: inventoryToProto(
      simulateInventory("1xh100-80g", { hostname, addresses: ["127.0.0.1"] }),
    ),
  });
  return { cp, agent };
}

describe("llmgw nodes reset", () => {
  it("lets an agent that lost its credential take its node back, once", async () => {
    const { cp, agent } = await controlPlaneWithAgent("node-a");
    const id = await agent.register();
    // The agent's state dir was restored from an old backup: right id, stale credential.
    agent.credential = "llmgw-node-stale";
    const refused = await agent.register().catch((e: unknown) => e);
    expect(ConnectError.from(refused).code).toBe(Code.PermissionDenied);

    const { io, out } = captureIo(cp);
    expect(await command.run(["node-a"], io)).toBe(0);
    expect(out.join("")).toBe(
      `node-a (${id}): the next agent registering as it may take it with the join token alone, once\n`,
    );
    agent.credential = undefined;
    expect(await agent.register()).toBe(id);
    await agent.heartbeat();
  });
});

describe("llmgw nodes revoke", () => {
  it("revokes a node by hostname: its heartbeat is refused and it must join again", async () => {
    const { cp, agent } = await controlPlaneWithAgent("node-b");
    const id = await agent.register();
    const { io, out } = captureIo(cp);
    expect(await revoke.run(["node-b"], io)).toBe(0);
    expect(out.join("")).toBe(
      `node-b (${id}): revoked; its replicas move elsewhere and its agent must join again\n`,
    );
    const refused = await agent.heartbeat().catch((e: unknown) => e);
    expect(ConnectError.from(refused).code).toBe(Code.Unauthenticated);
    expect(ConnectError.from(refused).rawMessage).toContain("revoked");
  });
});
