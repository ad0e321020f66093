import { type NodeInventory, simulateInventory } from "@llmgw/discovery";
import { schedule } from "@llmgw/scheduler";
import { describe, expect, it } from "vitest";
import { type SchedulerNodeSource, SchedulerNodes } from "./scheduler-nodes.js";

/** An 8-GPU node's inventory with NVLink pairs and NIC paths, as discovery reports them. */
function inventory(hostname: string, nicPaths: readonly string[] = []): NodeInventory {
  const inv = simulateInventory("8xh100-80g@ib-a", { hostname });
  return {
    ...inv,
    topology: {
      gpuLinks: [
        { gpuA: 0, gpuB: 1, path: "NV18", nvlinks: 18 },
        { gpuA: 0, gpuB: 2, path: "SYS", nvlinks: 0 },
        { gpuA: 2, gpuB: 3, path: "NV18", nvlinks: 18 },
      ],
      gpuNics: nicPaths.map((path, i) => ({ gpu: i % 2, nic: `mlx5_${i}`, path })),
      gpuAffinity: [],
    },
  };
}

function source(id: string, inv: NodeInventory, over: Partial<SchedulerNodeSource> = {}) {
  return {
    id,
    state: "ready",
    cordoned: false,
    draining: false,
    inventory: inv,
    healthy: inv.gpus.map(() => true),
    trouble: new Map<string, string>(),
    ...over,
  } satisfies SchedulerNodeSource;
}

describe("SchedulerNodes", () => {
  it("gives nodes of one layout the same parts, and each node its own identity", () => {
    const nodes = new SchedulerNodes();
    const a = nodes.build(source("a", inventory("a", ["PIX", "SYS"])));
    const b = nodes.build(source("b", inventory("b", ["PIX", "SYS"]), { cordoned: true }));
    expect(a.id).toBe("a");
    expect(b).toMatchObject({ id: "b", cordoned: true });
    expect(b.gpus).toBe(a.gpus);
    expect(b.fabrics).toBe(a.fabrics);
    expect(b.nvlinks).toBe(a.nvlinks);
    expect(b.nicDistance).toBe(a.nicDistance);
    // What the parts say: no UUIDs (they differ per node), NVLink pairs only, the nearest NIC.
    expect(a.gpus[0]).toEqual({
      index: 0,
      gpuClass: "h100-80g",
      healthy: true,
      migEnabled: false,
      vendor: "nvidia",
    });
    expect(a.fabrics).toEqual(["ib-a"]);
    expect(a.nvlinks).toEqual([
      { a: 0, b: 1, count: 18 },
      { a: 2, b: 3, count: 18 },
    ]);
    expect(a.nicDistance?.[0]).toBe(0);
    expect(a.nicDistance?.[1]).toBe(4);
    expect(a.nicDistance?.[2]).toBeUndefined();
  });

  it("shares nothing that differs: health, fabric trouble, NIC paths, links", () => {
    const nodes = new SchedulerNodes();
    const base = nodes.build(source("a", inventory("a", ["PIX"])));
    const sick = nodes.build(
      source("b", inventory("b", ["PIX"]), {
        healthy: [true, false, true, true, true, true, true, true],
      }),
    );
    expect(sick.gpus).not.toBe(base.gpus);
    expect(sick.gpus[1]?.healthy).toBe(false);
    expect(sick.fabrics).toBe(base.fabrics);

    const troubled = nodes.build(
      source("c", inventory("c", ["PIX"]), { trouble: new Map([["ib-a", "port down"]]) }),
    );
    expect(troubled.fabrics).toEqual([]);
    expect(troubled.fabricTrouble).toEqual({ "ib-a": "port down" });
    expect(base.fabricTrouble).toBeUndefined();

    const farther = nodes.build(source("d", inventory("d", ["NODE"])));
    expect(farther.nicDistance).not.toBe(base.nicDistance);
    expect(farther.nicDistance?.[0]).toBe(3);
    // A hole and an explicit distance are not the same record.
    const none = nodes.build(source("e", inventory("e", [])));
    expect(none.nicDistance).toEqual([]);
    expect(none.nicDistance).not.toBe(base.nicDistance);

    const plain = inventory("f", ["PIX"]);
    const inv: NodeInventory = {
      ...plain,
      topology: {
        ...plain.topology,
        gpuLinks: [...plain.topology.gpuLinks, { gpuA: 4, gpuB: 5, path: "NV18", nvlinks: 18 }],
      },
    };
    const linked = nodes.build(source("f", inv));
    expect(linked.nvlinks).not.toBe(base.nvlinks);
    expect(linked.nvlinks).toHaveLength(3);
  });

  it("plans shared-layout nodes as the scheduler plans separate ones", () => {
    const parts = new SchedulerNodes();
    const built = ["n1", "n2", "n3"].map((id, i) =>
      parts.build(source(id, inventory(id, ["PIX"]), { cordoned: i === 1 })),
    );
    const separate = built.map((n) => structuredClone(n));
    const deployments = [
      {
        name: "d",
        revision: 1,
        gpuClass: "h100-80g",
        gpusPerReplica: 8,
        replicas: 3,
        multiNode: false,
        priority: 0,
        allowPreemption: false,
      },
    ];
    const shared = schedule({ nodes: built, deployments, placements: [] });
    expect(shared).toEqual(schedule({ nodes: separate, deployments, placements: [] }));
    // The cordoned node takes nothing, though its layout is the others'.
    expect(shared.add.map((p) => p.ranks[0]?.nodeId)).toEqual(["n1", "n3"]);
    expect(shared.unschedulable[0]?.missingReplicas).toBe(1);
  });
});
