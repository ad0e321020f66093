import { create } from "@bufbuild/protobuf";
import { simulateInventory } from "@llmgw/discovery";
import {
  DeploymentSchema,
  DeploymentStatusSchema,
  GpuFaultSchema,
  GpuReadingSchema,
  NodeSchema,
  NodeState,
  ReasonSchema,
  ReplicaSchema,
  ReplicaState,
  RetirementPhase,
  RolloutSchema,
  RolloutState,
} from "@llmgw/proto";
import { inventoryToProto } from "@llmgw/wire";
import { describe, expect, it } from "vitest";
import {
  deploymentDetail,
  deploymentRow,
  fleetVersions,
  nodeDetail,
  replicaRow,
  replicaStateText,
  rolloutText,
} from "./cluster-format.js";

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

const NOW = 1_796_000_000_000;

const leaving = (phase: RetirementPhase, more: Record<string, unknown> = {}) =>
  create(ReplicaSchema, {
    replicaId: "chat-0",
    deployment: "chat",
    revision: 2n,
    state: ReplicaState.READY,
    createdAtUnixMs: BigInt(NOW - 90_000),
    ranks: [{ replicaId: "chat-0", nodeId: "gpu-07", gpuIndices: [0, 1] }],
    endpoint: "10.0.0.7:41234",
    retirement: {
      reason: { code: "node-draining", message: "node gpu-07 is draining" },
      phase,
      sinceUnixMs: BigInt(NOW - 5_000),
      ...more,
    },
  });

describe("replicaStateText", () => {
  it.each([
    ["serving, not leaving", create(ReplicaSchema, { state: ReplicaState.LOADING }), "loading"],
    [
      "waiting for its replacement",
      leaving(RetirementPhase.WAITING),
      "ready,waiting (node-draining)",
    ],
    [
      "draining, no in-flight report yet, deadline ahead",
      leaving(RetirementPhase.DRAINING, { drainDeadlineUnixMs: BigInt(NOW + 125_000) }),
      "ready,draining (node-draining, 2m 05s left)",
    ],
    [
      "draining with requests in flight",
      leaving(RetirementPhase.DRAINING, { inFlight: 3, drainDeadlineUnixMs: BigInt(NOW + 1_000) }),
      "ready,draining (node-draining, 3 in flight, 1s left)",
    ],
    [
      "draining past its deadline, none in flight",
      leaving(RetirementPhase.DRAINING, { inFlight: 0, drainDeadlineUnixMs: BigInt(NOW) }),
      "ready,draining (node-draining, 0 in flight, deadline passed)",
    ],
  ])("%s", (_name, r, text) => {
    expect(replicaStateText(r, NOW)).toBe(text);
  });

  it("is the STATE column of llmgw replicas", () => {
    const row = replicaRow(leaving(RetirementPhase.DRAINING, { inFlight: 3 }), NOW);
    expect(row).toEqual([
      "chat-0",
      "chat",
      "ready,draining (node-draining, 3 in flight)",
      "gpu-07[0,1]",
      "10.0.0.7:41234",
      "1m 30s",
    ]);
  });
});

describe("rollouts in llmgw deployments", () => {
  const rollout = (state: RolloutState, message = "") =>
    create(RolloutSchema, {
      state,
      fromRevision: 1n,
      toRevision: 2n,
      message,
      startedAtUnixMs: BigInt(NOW - 65_000),
    });
  const status = (r?: ReturnType<typeof rollout>) =>
    create(DeploymentStatusSchema, {
      spec: create(DeploymentSchema, { name: "chat", model: "m", engine: 4, revision: 2n }),
      desiredReplicas: 1,
      readyReplicas: 1,
      replicas: [leaving(RetirementPhase.WAITING)],
      ...(r ? { rollout: r } : {}),
    });

  it.each([
    [RolloutState.IN_PROGRESS, "1 of 2 replaced", "rollout r1 → r2 in progress: 1 of 2 replaced"],
    [RolloutState.COMPLETE, "", "rollout r1 → r2 complete"],
    [
      RolloutState.ROLLED_BACK,
      "chat-3 failed: CUDA OOM",
      "rolled back from r2 to r1: chat-3 failed: CUDA OOM",
    ],
    [9 as RolloutState, "", "rollout r1 → r2 (state 9)"],
  ])("rolloutText %s", (state, message, text) => {
    expect(rolloutText(rollout(state, message))).toBe(text);
  });

  it.each([
    ["no rollout yet", undefined, "ok"],
    ["a complete rollout is just ok", rollout(RolloutState.COMPLETE), "ok"],
    ["in progress", rollout(RolloutState.IN_PROGRESS), "rollout r1 → r2 in progress"],
    [
      "rolled back, first line of why",
      rollout(RolloutState.ROLLED_BACK, "chat-3 failed\nlog tail"),
      "rolled back from r2 to r1: chat-3 failed",
    ],
  ])("STATUS column: %s", (_name, r, text) => {
    expect(deploymentRow(status(r))[6]).toBe(text);
  });

  it("llmgw deployments NAME shows the rollout and each replica's state and revision", () => {
    const lines = deploymentDetail(status(rollout(RolloutState.IN_PROGRESS)), NOW).split("\n");
    expect(lines.slice(0, 2)).toEqual([
      "chat: m on sim, class any, revision 2, 1/1 ready",
      "  rollout r1 → r2 in progress (started 1m 05s ago)",
    ]);
    expect(lines[3]).toMatch(/^REPLICA +STATE +REV +PLACEMENT +ENDPOINT +AGE$/);
    expect(lines[4]).toMatch(
      /^chat-0 +ready,waiting \(node-draining\) +2 +gpu-07\[0,1\] +10\.0\.0\.7:41234 +1m 30s$/,
    );
  });

  it("lists the nodes the deployment avoids, escaped", () => {
    const d = status();
    const code = "LLMGW_CONTROL_PLANE_NODE_AVOIDED";
    d.avoided = [
      create(ReasonSchema, {
        code,
        message:
          "gpu-07 is avoided until 2026-12-06T02:35:00.000Z: a replica kept failing there and moved",
      }),
      create(ReasonSchema, { code, message: "x\u001b[2J\nforged line" }),
    ];
    const text = deploymentDetail(d, NOW);
    expect(text.split("\n")[1]).toBe(
      "  gpu-07 is avoided until 2026-12-06T02:35:00.000Z: a replica kept failing there and moved",
    );
    expect(text).not.toContain("\u001b");
    expect(text).not.toMatch(/^forged line/m);
  });

  it("escapes a rollout message's control characters", () => {
    const text = deploymentDetail(
      status(rollout(RolloutState.ROLLED_BACK, "x\u001b[2J\nforged line")),
      NOW,
    );
    expect(text).not.toContain("\u001b");
    expect(text).not.toMatch(/^forged line/m);
  });
});

describe("fleetVersions in llmgw status", () => {
  it("says one version when everything runs it", () => {
    expect(
      fleetVersions([
        { kind: "control plane", name: "cp-1", version: "0.2.0" },
        { kind: "agent", name: "node-a", version: "0.2.0" },
      ]),
    ).toBe("0.2.0 everywhere");
  });

  it("names who runs which version during an upgrade, newest first, numerically", () => {
    expect(
      fleetVersions([
        { kind: "agent", name: "node-c", version: "0.9.1" },
        { kind: "control plane", name: "cp-1", version: "0.10.0" },
        { kind: "agent", name: "node-a", version: "0.10.0" },
        { kind: "agent", name: "node-b", version: "0.10.0" },
        { kind: "router", name: "r-1", version: "0.9.1" },
      ]),
    ).toBe(
      "mixed: 0.10.0 (control plane cp-1, agents node-a, node-b), 0.9.1 (agent node-c, router r-1)",
    );
  });

  it("counts a component that reported no version as unknown, and shortens long lists", () => {
    const agents = ["a", "b", "c", "d", "e"].map((n) => ({
      kind: "agent" as const,
      name: n,
      version: "0.2.0",
    }));
    expect(fleetVersions([...agents, { kind: "router", name: "r-1", version: "" }])).toBe(
      "mixed: 0.2.0 (agents a, b, c and 2 more), unknown (router r-1)",
    );
  });
});
