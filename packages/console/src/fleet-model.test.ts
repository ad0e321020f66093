import { create } from "@bufbuild/protobuf";
import { simulateInventory } from "@llmgw/discovery";
import { GpuReadingSchema, NodeSchema, NodeState, ProblemSchema } from "@llmgw/proto";
import { inventoryToProto } from "@llmgw/wire";
import { describe, expect, it } from "vitest";
import { groupNodes, nodeView } from "./fleet-model.js";
import {
  ABSENT,
  ago,
  bytes,
  celsius,
  codeWords,
  count,
  fraction,
  memory,
  percent,
} from "./format.js";

function node(hostname: string, state = NodeState.READY, sim = "2xh100-80g@ib-a") {
  const inventory = inventoryToProto(simulateInventory(sim, { hostname }));
  // Registration-time readings off: what the page shows comes from heartbeats or is absent.
  for (const g of inventory.gpus) {
    g.utilizationPercent = undefined;
    g.temperatureCelsius = undefined;
    g.powerWatts = undefined;
    g.memoryUsedBytes = undefined;
  }
  return create(NodeSchema, { nodeId: `${hostname}-id`, hostname, state, inventory });
}

describe("the fleet page's view of a node", () => {
  it("shows unreported readings as — and reported zeros as 0", () => {
    const n = node("a");
    n.gpuReadings = [
      create(GpuReadingSchema, {
        index: 1,
        healthy: true,
        utilizationPercent: 0,
        temperatureCelsius: 0,
        memoryUsedBytes: 0n,
      }),
    ];
    const [g0, g1] = nodeView(n).gpus;
    expect([g0?.utilization, g0?.temperature, g0?.power, g0?.utilizationValue]).toEqual([
      ABSENT,
      ABSENT,
      ABSENT,
      undefined,
    ]);
    expect(g0?.memory).toBe(`${ABSENT} / 79.6 GiB`);
    expect([g1?.utilization, g1?.temperature, g1?.memory]).toEqual([
      "0%",
      "0 °C",
      "0 B / 79.6 GiB",
    ]);
    expect(g1?.utilizationValue).toBe(0);
  });

  it("takes health from the heartbeat, with the reasons in words", () => {
    const n = node("a");
    n.gpuReadings = [
      create(GpuReadingSchema, {
        index: 0,
        healthy: false,
        healthProblems: [
          create(ProblemSchema, { code: "X", message: "Xid 79: fallen off the bus" }),
        ],
      }),
    ];
    const v = nodeView(n);
    expect(v.gpus[0]?.healthy).toBe(false);
    expect(v.gpus[0]?.reasons).toEqual(["Xid 79: fallen off the bus"]);
    expect(v.gpus[1]?.healthy).toBe(true);
    expect(v.gpus.map((g) => g.gpuClass)).toEqual(["h100-80g", "h100-80g"]);
  });

  it("changes a GPU's signature only when its text changes", () => {
    const a = nodeView(node("a"));
    const b = nodeView(node("a"));
    expect(b.sig).toBe(a.sig);
    const n = node("a");
    n.gpuReadings = [create(GpuReadingSchema, { index: 1, healthy: true, utilizationPercent: 40 })];
    const c = nodeView(n);
    expect(c.gpus[0]?.sig).toBe(a.gpus[0]?.sig);
    expect(c.gpus[1]?.sig).not.toBe(a.gpus[1]?.sig);
    expect(c.sig).not.toBe(a.sig);
  });

  it("groups nodes worst state first, by hostname within a state", () => {
    const groups = groupNodes(
      [node("b"), node("a"), node("z", NodeState.LOST), node("c", NodeState.UNREACHABLE)].map(
        nodeView,
      ),
    );
    expect(groups.map((g) => [g.state, g.nodes.map((n) => n.hostname)])).toEqual([
      ["lost", ["z"]],
      ["unreachable", ["c"]],
      ["ready", ["a", "b"]],
    ]);
  });
});

describe("formatters", () => {
  it("say — for what nobody reported, never 0", () => {
    for (const f of [bytes, percent, fraction, celsius, count]) expect(f(undefined)).toBe(ABSENT);
    expect(percent(Number.NaN)).toBe(ABSENT);
    expect(memory(undefined, 80n * 1024n ** 3n)).toBe("— / 80.0 GiB");
    expect(ago(undefined, 0)).toBe(ABSENT);
    expect(ago(0n, 1000)).toBe(ABSENT);
  });

  it("write numbers the way an operator reads them", () => {
    expect(bytes(0n)).toBe("0 B");
    expect(bytes(1536)).toBe("1.5 KiB");
    expect(bytes(85_899_345_920n)).toBe("80.0 GiB");
    expect(fraction(0.423)).toBe("42%");
    expect(ago(1_000, 13_000)).toBe("12 s ago");
    expect(ago(1, 2.5 * 3_600_000)).toBe("2 h ago");
    expect(codeWords("LLMGW_SCHEDULER_NO_FABRIC_CAPACITY")).toBe("no fabric capacity");
    expect(codeWords("LLMGW_CONTROL_PLANE_REPLICA_FAILED")).toBe("replica failed");
  });
});
