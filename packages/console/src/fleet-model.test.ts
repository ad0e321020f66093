import { create } from "@bufbuild/protobuf";
import { simulateInventory } from "@llmgw/discovery";
import { GpuReadingSchema, type Node, NodeSchema, NodeState, ProblemSchema } from "@llmgw/proto";
import { inventoryToProto } from "@llmgw/wire";
import { describe, expect, it, vi } from "vitest";
import {
  createFleetReader,
  firstShown,
  groupNodes,
  type NodeSource,
  nodeView,
} from "./fleet-model.js";
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

  it("shows a reading the heartbeat left out as —, not what registration read", () => {
    const n = node("a");
    const gpu = n.inventory?.gpus[0];
    if (gpu === undefined) throw new Error("no GPU");
    gpu.memoryUsedBytes = 70n * 1024n ** 3n; // read once, at registration
    gpu.utilizationPercent = 95;
    // The latest heartbeat's nvidia-smi said [N/A] for both.
    n.gpuReadings = [create(GpuReadingSchema, { index: 0, healthy: true })];
    const g = nodeView(n).gpus[0];
    expect([g?.utilization, g?.memory]).toEqual([ABSENT, `${ABSENT} / 79.6 GiB`]);
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

describe("the fleet page's reads of nodes", () => {
  /**
   * A control plane's ListNodes over `nodes()`, honouring omit_inventory and `nodes`, with
   * every call logged; `hold` keeps answers for every node whole back until released.
   */
  function plane(nodes: () => Node[]) {
    const calls: string[] = [];
    let held: (() => void)[] | undefined;
    const copy = (n: Node, omit: boolean) =>
      create(NodeSchema, { ...n, inventory: omit ? undefined : n.inventory });
    const source: NodeSource = {
      async list(omitInventory, _signal, only = []) {
        if (only.length > 0) {
          calls.push(`some ${only.join(",")}`);
          return nodes()
            .filter((n) => only.includes(n.nodeId))
            .map((n) => copy(n, omitInventory));
        }
        calls.push(omitInventory ? "light" : "whole");
        if (!omitInventory && held !== undefined) await new Promise<void>((r) => held?.push(r));
        return nodes().map((n) => copy(n, omitInventory));
      },
    };
    return {
      calls,
      source,
      hold: () => {
        held = [];
      },
      release: () => {
        const waiting = held ?? [];
        held = undefined;
        for (const r of waiting) r();
      },
    };
  }
  const withDigest = (n: Node, digest: string) => {
    n.inventoryDigest = digest;
    return n;
  };
  const signal = new AbortController().signal;
  const classes = (nodes: Node[]) =>
    nodes.map((n) => {
      const v = nodeView(n);
      return v.inventoryPending ? "pending" : v.gpus.map((g) => g.gpuClass).join(",");
    });

  it("shows the first nodes at once, the rest once the background read is in", async () => {
    const nodes = [withDigest(node("a"), "d-a"), withDigest(node("b"), "d-b")];
    const p = plane(() => nodes);
    p.hold();
    let arrived = 0;
    const read = createFleetReader(p.source, {
      firstShown: (light) => light.slice(0, 1).map((n) => n.nodeId),
      inventoriesArrived: () => arrived++,
    });
    const first = await read(signal);
    expect(classes(first)).toEqual(["h100-80g,h100-80g", "pending"]);
    // A pending node still says how many GPUs it has, from its readings.
    expect(nodeView(first[1] as Node).gpuCount).toBe(0);
    expect(p.calls).toEqual(["light", "some a-id", "whole"]);
    // While the whole read is out, reads stay light and b stays pending.
    expect(classes(await read(signal))).toEqual(["h100-80g,h100-80g", "pending"]);
    p.release();
    await vi.waitFor(() => expect(arrived).toBe(1));
    expect(classes(await read(signal))).toEqual(["h100-80g,h100-80g", "h100-80g,h100-80g"]);
    expect(p.calls).toEqual(["light", "some a-id", "whole", "light", "light"]);
  });

  it("reads whole again when a node is new or its inventory digest changed", async () => {
    let nodes = [withDigest(node("a"), "d-a")];
    const p = plane(() => nodes);
    let arrived = 0;
    const read = createFleetReader(p.source, {
      firstShown: () => [],
      inventoriesArrived: () => arrived++,
    });
    await read(signal);
    await vi.waitFor(() => expect(arrived).toBe(1));
    nodes = [...nodes, withDigest(node("b"), "d-b")];
    expect(classes(await read(signal))).toEqual(["h100-80g,h100-80g", "h100-80g,h100-80g"]);
    nodes = [withDigest(node("a", NodeState.READY, "4xh100-80g@ib-a"), "d-a2"), nodes[1] as Node];
    expect(classes(await read(signal))[0]).toBe("h100-80g,h100-80g,h100-80g,h100-80g");
    expect(p.calls).toEqual(["light", "whole", "light", "whole", "light", "whole"]);
    // A node gone: the next light read still fills the rest in.
    nodes = [nodes[1] as Node];
    expect(classes(await read(signal))).toEqual(["h100-80g,h100-80g"]);
    expect(p.calls.at(-1)).toBe("light");
  });

  it("always reads whole from a control plane that sets no digest", async () => {
    const p = plane(() => [node("a")]);
    const read = createFleetReader(p.source, {
      firstShown: () => ["a-id"],
      inventoriesArrived: () => {},
    });
    expect(classes(await read(signal))).toEqual(["h100-80g,h100-80g"]);
    await read(signal);
    expect(p.calls).toEqual(["light", "whole", "whole"]);
  });
});

describe("the nodes a first read shows", () => {
  it("are the worst first, each state by hostname, as the page lists them", () => {
    const nodes = [
      node("c"),
      node("b", NodeState.LOST),
      node("a"),
      node("d", NodeState.UNREACHABLE),
    ];
    expect(firstShown(nodes, 3)).toEqual(["b-id", "d-id", "a-id"]);
    expect(firstShown(nodes, 3)).toEqual(
      groupNodes(nodes.map(nodeView))
        .flatMap((g) => g.nodes)
        .slice(0, 3)
        .map((n) => n.id),
    );
  });
});
