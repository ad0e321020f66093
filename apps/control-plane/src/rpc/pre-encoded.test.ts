import { create, equals, fromBinary, toBinary } from "@bufbuild/protobuf";
import { simulateInventory } from "@llmgw/discovery";
import { ListNodesResponseSchema, NodeSchema } from "@llmgw/proto";
import { inventoryToProto } from "@llmgw/wire";
import { describe, expect, it } from "vitest";
import { binaryCodec, nodeForWire } from "./pre-encoded.js";

const binary = (n: ReturnType<typeof node>) => nodeForWire(n, { binary: true });

function node(hostname: string, sim = "8xh100-80g@ib-a") {
  return create(NodeSchema, {
    nodeId: `${hostname}-1`,
    hostname,
    inventory: inventoryToProto(simulateInventory(sim, { hostname })),
    lastHeartbeatUnixMs: 1_700_000_000_000n,
  });
}

describe("nodeForWire", () => {
  it("decodes, on a client that knows nothing of it, exactly as the plain node", () => {
    const plain = [node("a"), node("b", "2xa100-40g"), create(NodeSchema, { hostname: "bare" })];
    const fast = [node("a"), node("b", "2xa100-40g"), create(NodeSchema, { hostname: "bare" })].map(
      binary,
    );
    expect(fast[0]?.inventory).toBeUndefined();
    const bytes = toBinary(
      ListNodesResponseSchema,
      create(ListNodesResponseSchema, { nodes: fast }),
    );
    const decoded = fromBinary(ListNodesResponseSchema, bytes);
    // JSON callers get the inventory itself, with the same digest.
    const viaJson = plain.map((n) => nodeForWire(n, { binary: false }));
    expect(viaJson[0]?.inventory).toBeDefined();
    expect(viaJson.map((n) => n.inventoryDigest)).toEqual(fast.map((n) => n.inventoryDigest));
    expect(fast[0]?.inventoryDigest).toMatch(/^[0-9a-f]{16}$/);
    expect(fast[2]?.inventoryDigest).toBe("");
    const expected = create(ListNodesResponseSchema, { nodes: viaJson });
    expect(equals(ListNodesResponseSchema, decoded, expected)).toBe(true);
    expect(decoded.nodes[1]?.inventory?.gpus.map((g) => g.gpuClass)).toEqual([
      "a100-40g",
      "a100-40g",
    ]);
    // Same size: the same fields, only written in another order.
    expect(bytes.length).toBe(toBinary(ListNodesResponseSchema, expected).length);
  });

  it("encodes an inventory once, and a new inventory (a registration) anew", () => {
    const a = node("a");
    const inventory = a.inventory;
    const first = binary(create(NodeSchema, { inventory }));
    const again = binary(create(NodeSchema, { inventory }));
    expect(again.$unknown?.[0]).toBe(first.$unknown?.[0]);
    const renewed = node("a", "4xh100-80g@ib-a");
    const other = binary(create(NodeSchema, { inventory: renewed.inventory }));
    expect(other.$unknown?.[0]).not.toBe(first.$unknown?.[0]);
    expect(other.inventoryDigest).not.toBe(first.inventoryDigest);
    const back = fromBinary(NodeSchema, toBinary(NodeSchema, other));
    expect(back.inventory?.gpus).toHaveLength(4);
    // The same hardware registered again (a new object): the same digest, nothing to fetch.
    expect(binary(node("a")).inventoryDigest).toBe(first.inventoryDigest);
  });

  it("leaves the inventory out when asked, keeping its digest", () => {
    const full = binary(node("a"));
    const light = nodeForWire(node("a"), { binary: true, omitInventory: true });
    expect(light.inventory).toBeUndefined();
    expect(light.$unknown ?? []).toEqual([]);
    expect(light.inventoryDigest).toBe(full.inventoryDigest);
    const size = (n: typeof light) => toBinary(NodeSchema, n).length;
    expect(size(light)).toBeLessThan(size(full) / 4);
  });
});

describe("binaryCodec", () => {
  it("is true for Connect, gRPC and gRPC-web binary, false for JSON and for no content type", () => {
    const h = (type?: string) => new Headers(type === undefined ? {} : { "content-type": type });
    expect(binaryCodec(h("application/proto"))).toBe(true);
    expect(binaryCodec(h("application/grpc"))).toBe(true);
    expect(binaryCodec(h("application/grpc-web+proto"))).toBe(true);
    expect(binaryCodec(h("application/json"))).toBe(false);
    expect(binaryCodec(h("application/grpc+json"))).toBe(false);
    expect(binaryCodec(h("application/json; charset=utf-8"))).toBe(false);
    expect(binaryCodec(h())).toBe(false);
  });
});
