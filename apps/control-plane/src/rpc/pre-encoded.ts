/**
 * Nodes as `ClusterService` sends them: each inventory's digest set, and the inventory itself
 * left out when asked (`ListNodesRequest.omit_inventory`) or sent as the bytes it was encoded
 * to before.
 *
 * An inventory changes only when its agent registers again, yet it is three quarters of a
 * node's encoded size (1,000 simulated 8-GPU nodes: 2.7 MB, of which 2.0 MB inventories), and
 * protobuf-es encodes by reflection: ~450 ms of the control plane's CPU for one `ListNodes` of
 * 1,000 nodes, which the web console's fleet page asks for every 2 s. Protobuf's wire format
 * lets a sub-message travel as its encoded bytes: field 6 written as an unknown field holding
 * the cached encoding decodes, on any client, exactly as the inventory itself. Only for binary
 * codecs: JSON leaves unknown fields out, so JSON callers get the plain message.
 */
import { createHash } from "node:crypto";
import { toBinary, type UnknownField } from "@bufbuild/protobuf";
import { BinaryWriter, WireType } from "@bufbuild/protobuf/wire";
import { type Node, type NodeInventory, NodeInventorySchema, NodeSchema } from "@llmgw/proto";

/** `Node.inventory`'s field number. */
const INVENTORY_FIELD = NodeSchema.field.inventory.number;

interface Encoded {
  /** Field 6 as an unknown field: tag and length prefix written by protobuf-es, then these. */
  readonly field: UnknownField;
  /** `Node.inventory_digest`: SHA-256 of the encoding, 16 hex digits. */
  readonly digest: string;
}

/** Keyed by the inventory object itself: a new registration is a new object, and a new entry. */
const encoded = new WeakMap<NodeInventory, Encoded>();

function encodedInventory(inventory: NodeInventory): Encoded {
  let found = encoded.get(inventory);
  if (found === undefined) {
    const bytes = toBinary(NodeInventorySchema, inventory);
    // Length-delimited: the writer's `raw` after the tag takes the length prefix too.
    const data = new BinaryWriter().bytes(bytes).finish();
    found = {
      field: { no: INVENTORY_FIELD, wireType: WireType.LengthDelimited, data },
      digest: createHash("sha256").update(bytes).digest("hex").slice(0, 16),
    };
    encoded.set(inventory, found);
  }
  return found;
}

/** How {@link nodeForWire} sends a node. */
export interface WireOptions {
  /** The answer goes out in protobuf's binary format ({@link binaryCodec}). */
  readonly binary: boolean;
  /** `ListNodesRequest.omit_inventory`. */
  readonly omitInventory?: boolean;
}

/**
 * The node as the admin API sends it: `inventory_digest` set, and the inventory left out
 * (`omitInventory`) or, for binary codecs, replaced by the cached encoding of it. Mutates and
 * returns `node`: the cluster builds a fresh node for every answer.
 */
export function nodeForWire(node: Node, options: WireOptions): Node {
  const inventory = node.inventory;
  if (inventory === undefined) return node;
  const { field, digest } = encodedInventory(inventory);
  node.inventoryDigest = digest;
  if (options.omitInventory) node.inventory = undefined;
  else if (options.binary) {
    node.inventory = undefined;
    node.$unknown = [...(node.$unknown ?? []), field];
  }
  return node;
}

/**
 * Whether a call's answer goes out in protobuf's binary format: Connect (`application/proto`),
 * gRPC and gRPC-web without `+json`. A GET without a content type counts as JSON (safe).
 */
export function binaryCodec(headers: Headers): boolean {
  const type = headers.get("content-type");
  return type !== null && !type.includes("json");
}
