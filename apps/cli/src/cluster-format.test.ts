import { create } from "@bufbuild/protobuf";
import { simulateInventory } from "@llmgw/discovery";
import { GpuFaultSchema, GpuReadingSchema, NodeSchema, NodeState } from "@llmgw/proto";
import { inventoryToProto } from "@llmgw/wire";
import { describe, expect, it } from "vitest";
import { nodeDetail } from "./cluster-format.js";

// Verbatim from shared/reference/health-formats.md §1.3.
const XID48 =
  "NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fffa8860 partition 7, subpartition 1.";

describe("nodeDetail", () => {
  const inventory = inventoryToProto(
    simulateInventory("2xh100-80g", { hostname: "node-a", addresses: ["10.0.0.1"], nowMs: 1 }),
  );
  const node = (evidence: string) =>
    create(NodeSchema, {
      nodeId: "node-a-1f2e3d",
      hostname: "node-a",
      state: NodeState.READY,
      advertiseAddress: "10.0.0.1",
      inventory,
      gpuReadings: [
        create(GpuReadingSchema, { index: 0, uuid: inventory.gpus[0]?.uuid, healthy: true }),
        create(GpuReadingSchema, {
          index: 1,
          uuid: inventory.gpus[1]?.uuid,
          healthy: false,
          healthProblems: [{ code: "LLMGW_DISCOVERY_GPU_FAULT", message: "Xid 48 (reset-gpu)" }],
          faults: [
            create(GpuFaultSchema, {
              kind: "xid",
              code: 48,
              action: "reset-gpu",
              pciBusId: "00000000:02:00.0",
              count: 3,
              firstSeenUnixMs: 1_796_000_000_000n,
              lastSeenUnixMs: 1_796_000_000_500n,
              evidence,
            }),
          ],
        }),
      ],
    });

  it("lists each GPU's health and its faults with code, action, count, first seen and evidence", () => {
    const text = nodeDetail(node(XID48), 1_796_000_001_000);
    const lines = text.split("\n");
    expect(lines[0]).toBe("node-a (node-a-1f2e3d): ready");
    expect(lines.find((l) => l.startsWith("1 "))).toMatch(
      /^1 +h100-80g +nvidia +00000000:02:00\.0 +unhealthy +Xid 48 \(reset-gpu\)$/,
    );
    expect(lines.find((l) => l.startsWith("0 "))).toMatch(/ healthy +-$/);
    const fault = lines.find((l) => l.includes("Xid 48  "));
    expect(fault).toMatch(
      /^1 +Xid 48 +reset-gpu +3 +2026-11-30T\d\d:\d\d:\d\dZ +NVRM: Xid \(PCI:0000:07:00\): 48, /,
    );
    expect(fault?.endsWith("subpartition 1.")).toBe(true);
  });

  it("escapes an evidence line's control characters, so it cannot forge output", () => {
    const text = nodeDetail(node(`${XID48}\n\u001b[2Jforged line`), 0);
    expect(text).not.toContain("\u001b");
    expect(text).not.toMatch(/^\S*forged line/m);
  });

  it("says when a node has no faults", () => {
    const plain = create(NodeSchema, { nodeId: "n", hostname: "n", inventory });
    expect(nodeDetail(plain, 0)).toContain("\nno kernel-log faults\n");
  });
});
