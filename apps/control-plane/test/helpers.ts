import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type Client, Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { simulateInventory } from "@llmgw/discovery";
import { ClusterService } from "@llmgw/proto";
import { inventoryToProto } from "@llmgw/wire";
import { type ControlPlane, type ControlPlaneDeps, startControlPlane } from "../src/run.js";
import { FakeAgent } from "../src/testing/fake-agent.js";

/** A temp data dir removed by `cleanup`. */
export function tempDir(prefix = "llmgw-cp-"): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  return { dir, cleanup: () => rmSync(dir, { recursive: true, force: true }) };
}

/**
 * Starts a control plane on loopback port 0. Heartbeat interval 2 s by default, so that
 * agents that only heartbeat when a test says so stay `ready` on a loaded machine; lifecycle
 * tests pass a short one.
 */
export function startTestControlPlane(
  dataDir: string,
  extra: { nodeLostAfterMs?: number; heartbeatIntervalMs?: number } = {},
  deps: ControlPlaneDeps = {},
): Promise<ControlPlane> {
  return startControlPlane(
    {
      dataDir,
      listen: "127.0.0.1:0",
      controlListen: "127.0.0.1:0",
      heartbeatIntervalMs: extra.heartbeatIntervalMs ?? 2_000,
      nodeLostAfterMs: extra.nodeLostAfterMs ?? 60_000,
      shutdownGraceMs: 2_000,
    },
    deps,
  );
}

/** An admin client of `ClusterService`, with the token (or none). */
export function adminClient(
  cp: { controlUrl: string },
  token?: string,
): Client<typeof ClusterService> {
  return createClient(
    ClusterService,
    createConnectTransport({
      httpVersion: "1.1",
      baseUrl: cp.controlUrl,
      interceptors: token
        ? [
            (next) => (req) => {
              req.header.set("authorization", `Bearer ${token}`);
              return next(req);
            },
          ]
        : [],
    }),
  );
}

/** A fake agent with a simulated inventory, e.g. `"2xh100-80g@ib-a"`. */
export function simAgent(cp: ControlPlane, hostname: string, sim: string): FakeAgent {
  return new FakeAgent({
    controlUrl: cp.controlUrl,
    joinToken: cp.joinToken,
    inventory: inventoryToProto(simulateInventory(sim, { hostname, addresses: ["127.0.0.1"] })),
  });
}

/**
 * `read`'s answer, or undefined while it is refused `Unavailable`: a follower refuses reads
 * too until its warm copy is first read (for {@link eventually}).
 */
export async function whenServed<T>(read: () => Promise<T>): Promise<T | undefined> {
  try {
    return await read();
  } catch (error) {
    if (ConnectError.from(error).code === Code.Unavailable) return undefined;
    throw error;
  }
}

/** Polls `check` until it returns a value other than undefined, or fails after `timeoutMs`. */
export async function eventually<T>(
  check: () => Promise<T | undefined> | T | undefined,
  timeoutMs = 10_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
