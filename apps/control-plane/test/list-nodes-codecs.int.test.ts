/**
 * `ListNodes` sends each inventory as bytes encoded once (`rpc/pre-encoded.ts`) to binary
 * callers: against a real control plane, binary and JSON callers see the same nodes, an agent
 * that registers again with other GPUs is seen with them under a new digest, and
 * `omit_inventory` leaves inventories out and `nodes` picks nodes.
 */
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { ClusterService } from "@llmgw/proto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { ControlPlane } from "../src/run.js";
import { adminClient, simAgent, startTestControlPlane, tempDir } from "./helpers.js";

const dir = tempDir("llmgw-list-nodes-");
let cp: ControlPlane;
beforeAll(async () => {
  cp = await startTestControlPlane(dir.dir);
});
afterAll(async () => {
  await cp?.close();
  dir.cleanup();
});

const jsonClient = () =>
  createClient(
    ClusterService,
    createConnectTransport({
      httpVersion: "1.1",
      baseUrl: cp.controlUrl,
      useBinaryFormat: false,
      interceptors: [
        (next) => (req) => {
          req.header.set("authorization", `Bearer ${cp.adminToken}`);
          return next(req);
        },
      ],
    }),
  );

describe("ListNodes over both codecs", () => {
  it("gives binary and JSON callers the same inventories, and a new one after a registration", async () => {
    const a = simAgent(cp, "codec-a", "2xh100-80g@ib-a");
    await a.register();
    await simAgent(cp, "codec-b", "1xa100-40g").register();
    const binary = adminClient(cp, cp.adminToken);
    const classes = (nodes: Awaited<ReturnType<typeof binary.listNodes>>["nodes"]) =>
      Object.fromEntries(
        nodes.map((n) => [n.hostname, n.inventory?.gpus.map((g) => g.gpuClass).join(",")]),
      );
    const viaBinary = await binary.listNodes({});
    const viaJson = await jsonClient().listNodes({});
    expect(classes(viaBinary.nodes)).toEqual({
      "codec-a": "h100-80g,h100-80g",
      "codec-b": "a100-40g",
    });
    expect(classes(viaJson.nodes)).toEqual(classes(viaBinary.nodes));
    expect(viaBinary.nodes.map((n) => n.inventory?.hostname).sort()).toEqual([
      "codec-a",
      "codec-b",
    ]);

    // The same agent comes back with four GPUs: its old encoding must not be sent again.
    const again = simAgent(cp, "codec-a", "4xh100-80g@ib-a");
    again.nodeId = a.nodeId;
    again.credential = a.credential;
    await again.register();
    const after = await binary.listNodes({});
    expect(classes(after.nodes)["codec-a"]).toBe("h100-80g,h100-80g,h100-80g,h100-80g");
    const digest = (nodes: typeof after.nodes, host: string) =>
      nodes.find((n) => n.hostname === host)?.inventoryDigest;
    expect(digest(after.nodes, "codec-a")).not.toBe(digest(viaBinary.nodes, "codec-a"));
    expect(digest(after.nodes, "codec-b")).toBe(digest(viaBinary.nodes, "codec-b"));

    // omit_inventory: the same nodes and digests, no inventories.
    const light = await binary.listNodes({ omitInventory: true });
    expect(light.nodes.map((n) => n.inventory)).toEqual([undefined, undefined]);
    expect(light.nodes.map((n) => n.inventoryDigest).sort()).toEqual(
      after.nodes.map((n) => n.inventoryDigest).sort(),
    );
    // Only the nodes asked for, by id or hostname; a name no node has is left out.
    const some = await binary.listNodes({ nodes: ["codec-b", a.nodeId ?? "", "gone"] });
    expect(some.nodes.map((n) => n.hostname).sort()).toEqual(["codec-a", "codec-b"]);
    expect(some.nodes.every((n) => n.inventory !== undefined)).toBe(true);
    const none = await binary.listNodes({ nodes: ["gone"] });
    expect(none.nodes).toEqual([]);
    await expect(
      binary.listNodes({ nodes: Array.from({ length: 1_001 }, (_, i) => `n${i}`) }),
    ).rejects.toThrow(/at most 1000 names/);
    await expect(binary.listNodes({ nodes: ["x".repeat(257)] })).rejects.toThrow(
      /of at most 256 characters/,
    );

    // GetNode carries the digest too (and the inventory).
    const one = await binary.getNode({ node: "codec-b" });
    expect(one.node?.inventoryDigest).toBe(digest(after.nodes, "codec-b"));
    expect(one.node?.inventory?.gpus).toHaveLength(1);
  });
});
