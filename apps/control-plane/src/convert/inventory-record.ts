import { fromBinary, toBinary } from "@bufbuild/protobuf";
import type { NodeInventory } from "@llmgw/discovery";
import { NodeInventorySchema } from "@llmgw/proto";
import { inventoryFromProto, inventoryToProto } from "@llmgw/wire";

/*
 * How the store keeps a node's inventory: the protobuf encoding of `llmgw.v1.NodeInventory`,
 * the format every release has written (`NodeRecord.inventory`). The cluster keeps the plain
 * inventory and meets the encoding only here.
 */

/** The stored bytes of `inventory`. */
export function inventoryRecord(inventory: NodeInventory): Uint8Array {
  return toBinary(NodeInventorySchema, inventoryToProto(inventory));
}

/** A stored inventory back; throws when the bytes do not decode. */
export function inventoryFromRecord(bytes: Uint8Array): NodeInventory {
  return inventoryFromProto(fromBinary(NodeInventorySchema, bytes));
}
