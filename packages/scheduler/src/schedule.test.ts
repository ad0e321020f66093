import { describe, expect, it } from "vitest";
import { isSchedulerError } from "./errors.js";
import { schedule } from "./schedule.js";
import {
  testPlacement as at,
  checkPlan,
  testDeployment as dep,
  testNode as node,
} from "./testing/index.js";
import type { ScheduleInput, ScheduleResult, SchedulerNode } from "./types.js";

/** The plan as short lines: "id node:gpus node:gpus @fabric", "id -code", "name ×missing code". */
function summarize(result: ScheduleResult): string[] {
  return [
    ...result.add.map(
      (p) =>
        `${p.replicaId} ${p.ranks.map((r) => `${r.nodeId}:${r.gpuIndices.join(",")}`).join(" ")}${p.fabricId === undefined ? "" : ` @${p.fabricId}`}`,
    ),
    ...result.remove.map((r) => `${r.replicaId} -${r.reason.code}`),
    ...result.revised.map((p) => `${p.replicaId} @revision ${p.revision}`),
    ...result.unschedulable.map(
      (u) => `${u.deployment} ×${u.missingReplicas} ${u.reasons.map((r) => r.code).join(",")}`,
    ),
  ];
}

const all8 = "0,1,2,3,4,5,6,7";
const eightGpus = [0, 1, 2, 3, 4, 5, 6, 7];
/** `g-0`: a 16-GPU gang on n1 and n2, over ib-a. */
const gangOnN1N2 = at(
  "g-0",
  [
    ["n1", eightGpus],
    ["n2", eightGpus],
  ],
  { fabricId: "ib-a" },
);

interface Scenario {
  readonly name: string;
  readonly input: ScheduleInput;
  readonly plan: readonly string[];
}

const scenarios: Scenario[] = [
  {
    name: "held placements keep their GPUs and do not count as replicas",
    input: {
      nodes: [node("n1", { gpus: 2 })],
      deployments: [dep("m", { replicas: 1 })],
      placements: [],
      held: [at("m-0", [["n1", [0]]])],
    },
    // A replacement goes beside it, under a fresh id.
    plan: ["m-1 n1:1"],
  },
  {
    name: "planned rules leave held placements alone: draining node, deleted deployment",
    input: {
      nodes: [node("n1", { draining: true, cordoned: true })],
      deployments: [],
      placements: [],
      held: [at("m-0", [["n1", [0]]])],
    },
    plan: [],
  },
  {
    name: "a loss removes a held placement",
    input: {
      nodes: [node("n1", { unhealthy: [0] })],
      deployments: [dep("m", { replicas: 0 })],
      placements: [],
      held: [at("m-0", [["n1", [0]]]), at("m-1", [["gone", [0]]])],
    },
    plan: ["m-0 -gpu-unusable", "m-1 -node-gone"],
  },
  {
    name: "nothing new is placed on a held placement's GPUs",
    input: {
      nodes: [node("n1", { gpus: 1 })],
      deployments: [dep("m", { replicas: 0 }), dep("o")],
      placements: [],
      held: [at("m-0", [["n1", [0]]])],
    },
    plan: ["o ×1 no-free-gpus"],
  },
  {
    name: "a replica that keeps failing moves to a node its deployment does not avoid",
    input: {
      nodes: [node("n1", { gpus: 1 }), node("n2", { gpus: 1 })],
      deployments: [dep("m")],
      placements: [at("m-0", [["n1", [0]]])],
      avoid: [{ deployment: "m", nodeId: "n1" }],
      failing: [{ replicaId: "m-0", message: "its engine keeps failing on n1" }],
    },
    plan: ["m-1 n2:0", "m-0 -replica-failed"],
  },
  {
    name: "a replica that keeps failing stays where no other node has room",
    input: {
      nodes: [node("n1", { gpus: 1 }), node("n2", { gpus: 1 }), node("n3", { cordoned: true })],
      deployments: [dep("m"), dep("o")],
      placements: [at("m-0", [["n1", [0]]]), at("o-0", [["n2", [0]]])],
      avoid: [{ deployment: "m", nodeId: "n1" }],
      failing: [{ replicaId: "m-0", message: "its engine keeps failing on n1" }],
    },
    plan: [],
  },
  {
    name: "a failing gang moves off the node it avoids, keeping one whose rank did not fail",
    input: {
      nodes: ["n1", "n2", "n3"].map((id) => node(id, { fabrics: ["ib-a"] })),
      deployments: [dep("g", { gpusPerReplica: 16 })],
      placements: [gangOnN1N2],
      avoid: [{ deployment: "g", nodeId: "n2" }],
      failing: [{ replicaId: "g-0", message: "rank 1 keeps failing on n2" }],
    },
    plan: [`g-1 n1:${all8} n3:${all8} @ib-a`, "g-0 -replica-failed"],
  },
  {
    name: "a failing replica of an engine without GPUs moves to the other node",
    input: {
      nodes: [node("n1"), node("n2")],
      deployments: [dep("s", { gpusPerReplica: 0, gpuClass: undefined })],
      placements: [at("s-0", [["n1", []]])],
      avoid: [{ deployment: "s", nodeId: "n1" }],
      failing: [{ replicaId: "s-0", message: "its engine keeps failing on n1" }],
    },
    plan: ["s-1 n2:", "s-0 -replica-failed"],
  },
  {
    name: "new replicas go to avoided nodes last, and there when nothing else fits",
    input: {
      nodes: [node("n1"), node("n2", { gpus: 2 })],
      deployments: [dep("m", { replicas: 3 })],
      placements: [],
      avoid: [
        { deployment: "m", nodeId: "n1" },
        { deployment: "other", nodeId: "n2" },
        { deployment: "m", nodeId: "gone" },
      ],
    },
    plan: ["m-0 n2:0", "m-1 n2:1", "m-2 n1:0"],
  },
  {
    name: "an avoided node loses to every other pool's place, a gang's included",
    input: {
      nodes: [
        node("n1"),
        node("n2", { gpus: 4, gpuClass: "a100-80g", fabrics: ["ib-a"] }),
        node("n3", { gpus: 4, gpuClass: "a100-80g", fabrics: ["ib-a"] }),
      ],
      deployments: [dep("m", { gpuClass: undefined, gpusPerReplica: 8 })],
      placements: [],
      avoid: [{ deployment: "m", nodeId: "n1" }],
    },
    plan: ["m-0 n2:0,1,2,3 n3:0,1,2,3 @ib-a"],
  },
  {
    name: "a scale-down removes the replica that keeps failing first",
    input: {
      nodes: [node("n1"), node("n2")],
      deployments: [dep("m", { replicas: 1 })],
      placements: [at("m-0", [["n1", [0]]]), at("m-1", [["n2", [0]]])],
      failing: [{ replicaId: "m-0", message: "its engine keeps failing on n1" }],
    },
    plan: ["m-0 -scale-down"],
  },
  {
    name: "a scale-down removes a failed replica before a serving one, even the newest",
    input: {
      nodes: [node("n1"), node("n2"), node("n3")],
      deployments: [dep("m", { replicas: 2 })],
      placements: [at("m-0", [["n1", [0]]]), at("m-1", [["n2", [0]]]), at("m-2", [["n3", [0]]])],
      notServing: [{ replicaId: "m-0", failed: true }],
    },
    plan: ["m-0 -scale-down"],
  },
  {
    name: "a scale-down removes one that keeps failing before a failed one",
    input: {
      nodes: [node("n1"), node("n2")],
      deployments: [dep("m", { replicas: 1 })],
      placements: [at("m-0", [["n1", [0]]]), at("m-1", [["n2", [0]]])],
      failing: [{ replicaId: "m-0", message: "its engine keeps failing on n1" }],
      notServing: [{ replicaId: "m-1", failed: true }],
    },
    plan: ["m-0 -scale-down"],
  },
  {
    name: "a scale-down removes a failed replica before a starting one",
    input: {
      nodes: [node("n1"), node("n2")],
      deployments: [dep("m", { replicas: 1 })],
      placements: [at("m-0", [["n1", [0]]]), at("m-1", [["n2", [0]]])],
      notServing: [
        { replicaId: "m-1", failed: false },
        { replicaId: "m-0", failed: true },
      ],
    },
    plan: ["m-0 -scale-down"],
  },
  {
    name: "a scale-down removes a starting replica before one on a cordoned node that serves",
    input: {
      nodes: [node("n1"), node("n2", { cordoned: true })],
      deployments: [dep("m", { replicas: 1 })],
      placements: [at("m-0", [["n1", [0]]]), at("m-1", [["n2", [0]]])],
      notServing: [{ replicaId: "m-0", failed: false }],
    },
    plan: ["m-0 -scale-down"],
  },
  {
    name: "single GPU replica on an empty node",
    input: { nodes: [node("n1")], deployments: [dep("m")], placements: [] },
    plan: ["m-0 n1:0"],
  },
  {
    name: "TP 8 needs a whole node: skips the node with one GPU in use",
    input: {
      nodes: [node("n1"), node("n2")],
      deployments: [dep("small"), dep("big", { gpusPerReplica: 8 })],
      placements: [at("small-0", [["n1", [0]]])],
    },
    plan: [`big-0 n2:${all8}`],
  },
  {
    name: "TP 8 with every node partly used is unschedulable",
    input: {
      nodes: [node("n1"), node("n2")],
      deployments: [dep("small", { replicas: 2 }), dep("big", { gpusPerReplica: 8 })],
      placements: [at("small-0", [["n1", [0]]]), at("small-1", [["n2", [3]]])],
    },
    plan: ["big ×1 no-node-fits"],
  },
  {
    name: "two-node gang stays inside one fabric",
    input: {
      nodes: [
        node("n1", { fabrics: ["ib-a"] }),
        node("n2", { fabrics: ["ib-b"] }),
        node("n3", { fabrics: ["ib-b"] }),
      ],
      deployments: [dep("g", { gpusPerReplica: 16 })],
      placements: [],
    },
    plan: [`g-0 n2:${all8} n3:${all8} @ib-b`],
  },
  {
    name: "fragmentation across islands: one free node per fabric is not a gang",
    input: {
      nodes: [node("n1", { fabrics: ["ib-a"] }), node("n2", { fabrics: ["ib-b"] })],
      deployments: [dep("g", { gpusPerReplica: 16 })],
      placements: [],
    },
    plan: ["g ×1 no-fabric-fits"],
  },
  {
    name: "unhealthy GPU is skipped",
    input: { nodes: [node("n1", { unhealthy: [0] })], deployments: [dep("m")], placements: [] },
    plan: ["m-0 n1:1"],
  },
  {
    name: "TP 8 avoids a node with an unhealthy GPU",
    input: {
      nodes: [node("n1", { unhealthy: [5] }), node("n2")],
      deployments: [dep("big", { gpusPerReplica: 8 })],
      placements: [],
    },
    plan: [`big-0 n2:${all8}`],
  },
  {
    name: "MIG GPU is skipped",
    input: { nodes: [node("n1", { mig: [0, 1] })], deployments: [dep("m")], placements: [] },
    plan: ["m-0 n1:2"],
  },
  {
    name: "mixed classes: the requested class only",
    input: {
      nodes: [node("a", { gpuClass: "a100-80g" }), node("b", { gpuClass: "l40s-45g" })],
      deployments: [dep("m", { gpuClass: "l40s-45g", gpusPerReplica: 2 })],
      placements: [],
    },
    plan: ["m-0 b:0,1"],
  },
  {
    name: "no class preference: best fit over all classes",
    input: {
      nodes: [node("a", { gpuClass: "a100-80g" }), node("b", { gpuClass: "l4-23g", gpus: 2 })],
      deployments: [dep("m", { gpuClass: undefined, gpusPerReplica: 2 })],
      placements: [],
    },
    plan: ["m-0 b:0,1"],
  },
  {
    name: "GPUs of unknown class are never used",
    input: {
      nodes: [node("n1", { gpuClass: null })],
      deployments: [dep("m", { gpuClass: undefined })],
      placements: [],
    },
    plan: ["m ×1 no-gpu-class"],
  },
  {
    name: "adding a node moves nothing",
    input: {
      nodes: [node("n1"), node("n2")],
      deployments: [dep("m", { replicas: 2, gpusPerReplica: 2 })],
      placements: [at("m-0", [["n1", [0, 1]]]), at("m-1", [["n1", [2, 3]]])],
    },
    plan: [],
  },
  {
    name: "losing a node re-places only its replicas",
    input: {
      nodes: [node("n1", { state: "lost" }), node("n2"), node("n3")],
      deployments: [dep("m", { replicas: 2 }), dep("o")],
      placements: [at("m-0", [["n1", [0]]]), at("m-1", [["n2", [0]]]), at("o-0", [["n2", [1]]])],
    },
    plan: ["m-2 n3:0", "m-0 -node-lost"],
  },
  {
    name: "an unreachable node keeps its replicas but gets no new ones",
    input: {
      nodes: [node("n1", { state: "unreachable" }), node("n2")],
      deployments: [dep("m", { replicas: 2 })],
      placements: [at("m-0", [["n1", [0]]])],
    },
    plan: ["m-1 n2:0"],
  },
  {
    name: "a node missing from the input loses its replicas",
    input: {
      nodes: [node("n2")],
      deployments: [dep("m")],
      placements: [at("m-0", [["n1", [0]]])],
    },
    plan: ["m-1 n2:0", "m-0 -node-gone"],
  },
  {
    name: "a gang whose second node is lost is removed whole",
    input: {
      nodes: [
        node("n1", { fabrics: ["ib-a"] }),
        node("n2", { fabrics: ["ib-a"], state: "lost" }),
        node("n3", { fabrics: ["ib-a"] }),
      ],
      deployments: [dep("g", { gpusPerReplica: 16 })],
      placements: [gangOnN1N2],
    },
    plan: [`g-1 n1:${all8} n3:${all8} @ib-a`, "g-0 -node-lost"],
  },
  {
    name: "spread: replicas of one deployment go to different nodes",
    input: {
      nodes: [node("n1"), node("n2")],
      deployments: [dep("m", { replicas: 2 })],
      placements: [],
    },
    plan: ["m-0 n1:0", "m-1 n2:0"],
  },
  {
    name: "best fit beats first fit: the 2-GPU replica fills the fuller node",
    input: {
      nodes: [node("n1"), node("n2"), node("n3")],
      deployments: [
        dep("x", { gpusPerReplica: 2 }),
        dep("y", { gpusPerReplica: 6 }),
        dep("m", { gpusPerReplica: 2 }),
      ],
      placements: [at("x-0", [["n1", [0, 1]]]), at("y-0", [["n2", [0, 1, 2, 3, 4, 5]]])],
    },
    plan: ["m-0 n2:6,7"],
  },
  {
    name: "cordoned node keeps its replica and gets no new ones",
    input: {
      nodes: [node("n1", { cordoned: true }), node("n2")],
      deployments: [dep("m", { replicas: 2 })],
      placements: [at("m-0", [["n1", [0]]])],
    },
    plan: ["m-1 n2:0"],
  },
  {
    name: "draining node: its replicas move",
    input: {
      nodes: [node("n1", { draining: true }), node("n2")],
      deployments: [dep("m")],
      placements: [at("m-0", [["n1", [0]]])],
    },
    plan: ["m-1 n2:0", "m-0 -node-draining"],
  },
  {
    name: "priority without preemption: the running replica stays",
    input: {
      nodes: [node("n1")],
      deployments: [
        dep("low", { gpusPerReplica: 8 }),
        dep("high", { gpusPerReplica: 8, priority: 10 }),
      ],
      placements: [at("low-0", [["n1", [0, 1, 2, 3, 4, 5, 6, 7]]])],
    },
    plan: ["high ×1 no-free-gpus"],
  },
  {
    name: "priority with preemption: the lower-priority replica is evicted",
    input: {
      nodes: [node("n1")],
      deployments: [
        dep("low", { gpusPerReplica: 8 }),
        dep("high", { gpusPerReplica: 8, priority: 10, allowPreemption: true }),
      ],
      placements: [at("low-0", [["n1", [0, 1, 2, 3, 4, 5, 6, 7]]])],
    },
    plan: [`high-0 n1:${all8}`, "low-0 -preempted", "low ×1 no-free-gpus"],
  },
  {
    name: "preemption picks the lowest priority first",
    input: {
      nodes: [node("n1")],
      deployments: [
        dep("p1", { gpusPerReplica: 4, priority: 1 }),
        dep("p5", { gpusPerReplica: 4, priority: 5 }),
        dep("high", { gpusPerReplica: 4, priority: 10, allowPreemption: true }),
      ],
      placements: [at("p1-0", [["n1", [0, 1, 2, 3]]]), at("p5-0", [["n1", [4, 5, 6, 7]]])],
    },
    plan: ["high-0 n1:0,1,2,3", "p1-0 -preempted", "p1 ×1 no-free-gpus"],
  },
  {
    name: "preemption never evicts equal or higher priority",
    input: {
      nodes: [node("n1")],
      deployments: [
        dep("same", { gpusPerReplica: 8, priority: 10 }),
        dep("high", { gpusPerReplica: 8, priority: 10, allowPreemption: true }),
      ],
      placements: [at("same-0", [["n1", [0, 1, 2, 3, 4, 5, 6, 7]]])],
    },
    plan: ["high ×1 no-free-gpus,preemption-insufficient"],
  },
  {
    // Found by the idempotence property: the preemptor frees 4 GPUs and takes 1; "a", tried
    // before it at the same priority, must get one of the rest in this plan, not the next.
    name: "capacity freed by preemption goes to deployments tried earlier",
    input: {
      nodes: [node("n0")],
      deployments: [
        dep("low", { gpusPerReplica: 4 }),
        dep("a", { replicas: 5, priority: 1 }),
        dep("u", { priority: 1, allowPreemption: true }),
      ],
      placements: [
        at("low-0", [["n0", [0, 1, 2, 3]]]),
        at("a-0", [["n0", [4]]]),
        at("a-1", [["n0", [5]]]),
        at("a-2", [["n0", [6]]]),
        at("a-3", [["n0", [7]]]),
      ],
    },
    plan: ["a-4 n0:1", "u-0 n0:0", "low-0 -preempted", "low ×1 no-node-fits"],
  },
  {
    name: "higher priority is placed first when capacity is short",
    input: {
      nodes: [node("n1")],
      deployments: [dep("a", { gpusPerReplica: 8 }), dep("b", { gpusPerReplica: 8, priority: 1 })],
      placements: [],
    },
    plan: [`b-0 n1:${all8}`, "a ×1 no-free-gpus"],
  },
  {
    name: "scale up fills the lowest free ordinals",
    input: {
      nodes: [node("n1"), node("n2"), node("n3")],
      deployments: [dep("m", { replicas: 3 })],
      placements: [at("m-1", [["n1", [0]]])],
    },
    plan: ["m-0 n2:0", "m-2 n3:0"],
  },
  {
    name: "scale down removes the replica whose removal frees a whole node",
    input: {
      nodes: [node("n1"), node("n2")],
      deployments: [dep("m", { replicas: 1, gpusPerReplica: 2 }), dep("o", { gpusPerReplica: 6 })],
      placements: [
        at("m-0", [["n2", [0, 1]]]),
        at("m-1", [["n1", [0, 1]]]),
        at("o-0", [["n2", [2, 3, 4, 5, 6, 7]]]),
      ],
    },
    plan: ["m-1 -scale-down"],
  },
  {
    name: "scale down removes replicas on cordoned nodes first",
    input: {
      nodes: [node("n1"), node("n2", { cordoned: true })],
      deployments: [dep("m", { replicas: 1 })],
      placements: [at("m-0", [["n1", [0]]]), at("m-1", [["n2", [0]]])],
    },
    plan: ["m-1 -scale-down"],
  },
  {
    name: "a new revision of the same shape keeps the replica, at that revision",
    input: {
      nodes: [node("n1")],
      deployments: [dep("m", { revision: 2 })],
      placements: [at("m-0", [["n1", [0]]])],
    },
    plan: ["m-0 @revision 2"],
  },
  {
    // Removals are carried out before additions, so the new shape may reuse the GPUs.
    name: "a change of shape re-creates the replica",
    input: {
      nodes: [node("n1")],
      deployments: [dep("m", { revision: 2, gpusPerReplica: 2 })],
      placements: [at("m-0", [["n1", [0]]])],
    },
    plan: ["m-1 n1:0,1", "m-0 -shape-changed"],
  },
  {
    name: "a change of GPU class re-creates the replica",
    input: {
      nodes: [node("n1"), node("n2", { gpuClass: "a100-80g" })],
      deployments: [dep("m", { revision: 2, gpuClass: "a100-80g" })],
      placements: [at("m-0", [["n1", [0]]])],
    },
    plan: ["m-1 n2:0", "m-0 -shape-changed"],
  },
  {
    name: "a gang with an unhealthy port on its fabric loses every rank, a single-node replica none",
    input: {
      // The control plane leaves a troubled fabric out of `fabrics` too.
      nodes: [
        node("n1", { gpus: 9, fabricTrouble: { "ib-a": "mlx5_0 port 1: 12 symbol errors" } }),
        node("n2", { gpus: 9, fabrics: ["ib-a"] }),
      ],
      deployments: [dep("g", { gpusPerReplica: 16, replicas: 1 }), dep("m")],
      placements: [
        at(
          "g-0",
          [
            ["n1", [0, 1, 2, 3, 4, 5, 6, 7]],
            ["n2", [0, 1, 2, 3, 4, 5, 6, 7]],
          ],
          {
            fabricId: "ib-a",
          },
        ),
        at("m-0", [["n1", [8]]]),
      ],
    },
    plan: ["g-0 -port-unhealthy", "g ×1 no-fabric-fits"],
  },
  {
    name: "deleted deployment loses its replicas",
    input: { nodes: [node("n1")], deployments: [], placements: [at("m-0", [["n1", [0]]])] },
    plan: ["m-0 -deployment-deleted"],
  },
  {
    name: "a GPU that became unhealthy takes its replica with it",
    input: {
      nodes: [node("n1", { unhealthy: [1] })],
      deployments: [dep("m", { gpusPerReplica: 2 })],
      placements: [at("m-0", [["n1", [0, 1]]])],
    },
    plan: ["m-1 n1:0,2", "m-0 -gpu-unusable"],
  },
  {
    name: "two placements claiming one GPU: the later id goes",
    input: {
      nodes: [node("n1")],
      deployments: [dep("a"), dep("b")],
      placements: [at("a-0", [["n1", [0]]]), at("b-0", [["n1", [0]]])],
    },
    plan: ["b-1 n1:1", "b-0 -gpu-conflict"],
  },
  {
    name: "zero-GPU replicas spread over every schedulable node, GPU-less ones too",
    input: {
      nodes: [node("cpu", { gpus: 0 }), node("n1"), node("n2", { cordoned: true })],
      deployments: [dep("sim", { gpusPerReplica: 0, gpuClass: undefined, replicas: 3 })],
      placements: [],
    },
    plan: ["sim-0 cpu:", "sim-1 n1:", "sim-2 cpu:"],
  },
  {
    name: "zero-GPU replica without a schedulable node",
    input: {
      nodes: [node("n1", { draining: true })],
      deployments: [dep("sim", { gpusPerReplica: 0, gpuClass: undefined })],
      placements: [],
    },
    plan: ["sim ×1 no-schedulable-node"],
  },
  {
    name: "an engine that cannot span nodes never gets a gang",
    input: {
      nodes: [node("n1", { fabrics: ["ib-a"] }), node("n2", { fabrics: ["ib-a"] })],
      deployments: [dep("cpp", { gpusPerReplica: 16, multiNode: false })],
      placements: [],
    },
    plan: ["cpp ×1 exceeds-node"],
  },
  {
    name: "explicit nodesPerReplica that does not divide the GPUs",
    input: {
      nodes: [node("n1", { fabrics: ["ib-a"] })],
      deployments: [dep("g", { gpusPerReplica: 16, nodesPerReplica: 3 })],
      placements: [],
    },
    plan: ["g ×1 uneven-split"],
  },
  {
    name: "explicit nodesPerReplica splits a replica that would fit one node",
    input: {
      nodes: [node("n1", { fabrics: ["ib-a"] }), node("n2", { fabrics: ["ib-a"] })],
      deployments: [dep("g", { gpusPerReplica: 8, nodesPerReplica: 2 })],
      placements: [],
    },
    plan: ["g-0 n1:0,1,2,3 n2:0,1,2,3 @ib-a"],
  },
  {
    name: "derived split: 24 GPUs on 8-GPU nodes take 3 nodes",
    input: {
      nodes: ["n1", "n2", "n3", "n4"].map((id) => node(id, { fabrics: ["ib-a"] })),
      deployments: [dep("g", { gpusPerReplica: 24 })],
      placements: [],
    },
    plan: [`g-0 n1:${all8} n2:${all8} n3:${all8} @ib-a`],
  },
  {
    name: "a fabric restriction is honoured",
    input: {
      nodes: ["a1", "a2"]
        .map((id) => node(id, { fabrics: ["ib-a"] }))
        .concat(["b1", "b2"].map((id) => node(id, { fabrics: ["ib-b"] }))),
      deployments: [dep("g", { gpusPerReplica: 16, fabric: "ib-b" })],
      placements: [],
    },
    plan: [`g-0 b1:${all8} b2:${all8} @ib-b`],
  },
  {
    name: "a fabric nobody has",
    input: {
      nodes: [node("n1", { fabrics: ["ib-a"] })],
      deployments: [dep("g", { gpusPerReplica: 16, fabric: "roce-x" })],
      placements: [],
    },
    plan: ["g ×1 fabric-unknown"],
  },
  {
    name: "NVLink-connected pair preferred over adjacent indices",
    input: {
      nodes: [
        node("n1", {
          gpus: 4,
          nvlinks: [
            { a: 0, b: 1, count: 4 },
            { a: 2, b: 3, count: 4 },
          ],
        }),
      ],
      deployments: [dep("x"), dep("m", { gpusPerReplica: 2 })],
      placements: [at("x-0", [["n1", [0]]])],
    },
    plan: ["m-0 n1:2,3"],
  },
  {
    name: "GPUs close to the NIC preferred when NVLink is equal",
    input: {
      nodes: [node("n1", { gpus: 4, nicDistance: { 0: 4, 1: 4, 2: 0, 3: 1 } })],
      deployments: [dep("m", { gpusPerReplica: 2 })],
      placements: [],
    },
    plan: ["m-0 n1:2,3"],
  },
];

describe("schedule", () => {
  it.each(scenarios)("$name", ({ input, plan }) => {
    const result = schedule(input);
    expect(summarize(result)).toEqual(plan);
    expect(checkPlan(input, result)).toEqual([]);
  });

  it("judges each node of a shared layout by its own state and fabrics", () => {
    // As the control plane builds them: one GPU list and one fabric list for many nodes.
    const layout = node("x", { fabrics: ["ib-a"] });
    const as = (id: string, extra: Partial<SchedulerNode> = {}): SchedulerNode => ({
      ...layout,
      id,
      ...extra,
    });
    const input: ScheduleInput = {
      nodes: [
        as("a1"),
        as("a2", { draining: true }),
        as("a3", { state: "unreachable" }),
        as("a4"),
        as("b1", { fabrics: ["ib-b"] }),
      ],
      deployments: [dep("g", { gpusPerReplica: 16 }), dep("one", { gpusPerReplica: 8 })],
      placements: [at("one-0", [["a2", [0, 1, 2, 3, 4, 5, 6, 7]]])],
    };
    const result = schedule(input);
    expect(summarize(result)).toEqual([
      "g-0 a1:0,1,2,3,4,5,6,7 a4:0,1,2,3,4,5,6,7 @ib-a",
      "one-1 b1:0,1,2,3,4,5,6,7",
      "one-0 -node-draining",
    ]);
    expect(checkPlan(input, result)).toEqual([]);
    // The same nodes as separate objects plan alike.
    expect(schedule(JSON.parse(JSON.stringify(input)) as ScheduleInput)).toEqual(result);
  });

  it("explains a gang that no fabric can hold, with numbers", () => {
    const result = schedule({
      nodes: [node("a1", { fabrics: ["ib-a"] }), node("b1", { fabrics: ["ib-b"] })],
      deployments: [dep("g", { gpusPerReplica: 16 }), dep("x")],
      placements: [at("x-0", [["b1", [0]]])],
    });
    expect(result.unschedulable).toEqual([
      {
        deployment: "g",
        missingReplicas: 1,
        reasons: [
          {
            code: "no-fabric-fits",
            message:
              "needs 2 nodes × 8 h100-80g on one fabric; fabric ib-a has 1 node with 8 free, fabric ib-b has none",
          },
        ],
      },
    ]);
  });

  it("explains an exhausted class, with numbers", () => {
    const input: ScheduleInput = {
      nodes: [node("n1", { unhealthy: [7] }), node("n2", { unhealthy: [7] })],
      deployments: [dep("fill", { gpusPerReplica: 7, replicas: 2 }), dep("m")],
      placements: [],
    };
    expect(schedule(input).unschedulable).toEqual([
      {
        deployment: "m",
        missingReplicas: 1,
        reasons: [
          {
            code: "no-free-gpus",
            message: "no healthy h100-80g GPU free: 16 total, 14 allocated, 2 unhealthy",
          },
        ],
      },
    ]);
  });

  it("explains fragmentation, naming the node with the most free GPUs", () => {
    const result = schedule({
      nodes: [node("n1"), node("n2")],
      deployments: [
        dep("a", { gpusPerReplica: 5 }),
        dep("b", { gpusPerReplica: 6 }),
        dep("m", { gpusPerReplica: 4 }),
      ],
      placements: [],
    });
    expect(result.unschedulable[0]?.reasons).toEqual([
      {
        code: "no-node-fits",
        message:
          "needs 4 h100-80g on one node; the most free on one node is 3 (n2), 5 free in all: 16 total, 11 allocated, 0 unhealthy",
      },
    ]);
  });

  it("names the preemptor in the removal reason", () => {
    const result = schedule({
      nodes: [node("n1", { gpus: 2 })],
      deployments: [
        dep("batch", { gpusPerReplica: 2, priority: 1 }),
        dep("chat", { gpusPerReplica: 2, priority: 9, allowPreemption: true }),
      ],
      placements: [at("batch-0", [["n1", [0, 1]]])],
    });
    expect(result.remove).toEqual([
      {
        replicaId: "batch-0",
        deployment: "batch",
        reason: {
          code: "preempted",
          message: "preempted by deployment chat (priority 9 > 1) to free 2 h100-80g on node n1",
        },
      },
    ]);
  });

  it("is deterministic for reordered input", () => {
    const input: ScheduleInput = {
      nodes: [node("n3"), node("n1", { fabrics: ["ib-a"] }), node("n2", { fabrics: ["ib-a"] })],
      deployments: [dep("z", { replicas: 3 }), dep("a", { gpusPerReplica: 16 })],
      placements: [],
    };
    const reversed: ScheduleInput = {
      nodes: [...input.nodes].reverse(),
      deployments: [...input.deployments].reverse(),
      placements: [],
    };
    expect(schedule(reversed)).toEqual(schedule(input));
  });

  const oneGpu = node("n1", { gpus: 1 });
  it.each([
    [
      "duplicate node id",
      { nodes: [node("n1"), node("n1")], deployments: [], placements: [] },
      'duplicate node id "n1"',
    ],
    [
      "duplicate node id in sorted ids",
      { nodes: [node("n1"), node("n2"), node("n2"), node("n3")], deployments: [], placements: [] },
      'duplicate node id "n2"',
    ],
    [
      "duplicate node id in unsorted ids",
      { nodes: [node("n3"), node("n1"), node("n2"), node("n1")], deployments: [], placements: [] },
      'duplicate node id "n1"',
    ],
    [
      "negative replicas",
      { nodes: [], deployments: [dep("m", { replicas: -1 })], placements: [] },
      "deployment m: replicas must be an integer ≥ 0, got -1",
    ],
    [
      "duplicate replica id",
      {
        nodes: [],
        deployments: [],
        placements: [at("m-0", [["n1", [0]]]), at("m-0", [["n1", [1]]])],
      },
      'duplicate replica id "m-0"',
    ],
    [
      "duplicate deployment name",
      { nodes: [], deployments: [dep("m"), dep("m")], placements: [] },
      'duplicate deployment name "m"',
    ],
    [
      "fractional gpusPerReplica",
      { nodes: [], deployments: [dep("m", { gpusPerReplica: 1.5 })], placements: [] },
      "deployment m: gpusPerReplica must be an integer ≥ 0, got 1.5",
    ],
    [
      "zero nodesPerReplica",
      { nodes: [], deployments: [dep("m", { nodesPerReplica: 0 })], placements: [] },
      "deployment m: nodesPerReplica must be an integer ≥ 1, got 0",
    ],
    [
      "non-finite priority",
      { nodes: [], deployments: [dep("m", { priority: Number.NaN })], placements: [] },
      "deployment m: priority must be a finite number, got NaN",
    ],
    [
      "duplicate GPU index",
      {
        nodes: [{ ...oneGpu, gpus: [...oneGpu.gpus, ...oneGpu.gpus] }],
        deployments: [],
        placements: [],
      },
      "node n1: duplicate GPU index 0",
    ],
  ] as const)("rejects %s", (_name, input, message) => {
    let caught: unknown;
    try {
      schedule(input);
    } catch (error) {
      caught = error;
    }
    expect(isSchedulerError(caught)).toBe(true);
    expect(caught).toMatchObject({ code: "LLMGW_SCHEDULER_INVALID_INPUT", message });
  });
});

describe("schedule: vendors and fabric islands (issue 20)", () => {
  it.each<Scenario>([
    {
      name: "a gang never spans vendors, even of one class name",
      input: {
        nodes: [
          node("n1", { fabrics: ["ib-a"], vendor: "amd" }),
          node("n2", { fabrics: ["ib-a"] }),
          node("n3", { fabrics: ["ib-a"], vendor: "amd" }),
        ],
        deployments: [dep("g", { gpusPerReplica: 16 })],
        placements: [],
      },
      plan: [`g-0 n1:${all8} n3:${all8} @ib-a`],
    },
    {
      name: "one node with both vendors: each replica takes one vendor's GPUs",
      input: {
        nodes: [node("n1", { amd: [4, 5, 6, 7] })],
        deployments: [dep("m", { gpusPerReplica: 4, replicas: 2 })],
        placements: [],
      },
      plan: ["m-0 n1:0,1,2,3", "m-1 n1:4,5,6,7"],
    },
    {
      name: "one node with both vendors cannot hold a replica that needs all of them",
      input: {
        nodes: [node("n1", { amd: [4, 5, 6, 7] })],
        deployments: [dep("m", { gpusPerReplica: 8 })],
        placements: [],
      },
      plan: ["m ×1 no-fabric-fits,no-fabric-fits"],
    },
    {
      name: "no class asked: the two vendors are tried apart, never mixed",
      input: {
        nodes: [node("n1", { gpus: 2, amd: [1] })],
        deployments: [dep("m", { gpuClass: undefined, gpusPerReplica: 2 })],
        placements: [],
      },
      plan: ["m ×1 no-fabric-fits,no-fabric-fits"],
    },
    {
      name: "a gang whose GPU faulted is re-placed on healthy GPUs in its fabric island",
      input: {
        nodes: [
          node("n1", { fabrics: ["ib-a"], unhealthy: [3] }),
          node("n2", { fabrics: ["ib-a"] }),
          node("n3", { fabrics: ["ib-a"] }),
          node("n4", { fabrics: ["ib-b"] }),
        ],
        deployments: [dep("g", { gpusPerReplica: 16, fabric: "ib-a" })],
        placements: [
          at(
            "g-0",
            [
              ["n1", all8.split(",").map(Number)],
              ["n2", all8.split(",").map(Number)],
            ],
            { fabricId: "ib-a" },
          ),
        ],
      },
      plan: [`g-1 n2:${all8} n3:${all8} @ib-a`, "g-0 -gpu-unusable"],
    },
    {
      name: "a gang is re-placed inside one island, never across two",
      input: {
        nodes: [
          node("n1", { fabrics: ["ib-a"], unhealthy: [0] }),
          node("n2", { fabrics: ["ib-a"] }),
          node("n3", { fabrics: ["ib-b"] }),
        ],
        deployments: [dep("g", { gpusPerReplica: 16 })],
        placements: [
          at(
            "g-0",
            [
              ["n1", all8.split(",").map(Number)],
              ["n2", all8.split(",").map(Number)],
            ],
            { fabricId: "ib-a" },
          ),
        ],
      },
      plan: ["g-0 -gpu-unusable", "g ×1 no-fabric-fits"],
    },
    {
      name: "a single-node replica whose GPU faulted goes to any healthy GPU",
      input: {
        nodes: [
          node("n1", { gpus: 1, unhealthy: [0], fabrics: ["ib-a"] }),
          node("n2", { gpus: 1 }),
        ],
        deployments: [dep("m")],
        placements: [at("m-0", [["n1", [0]]])],
      },
      plan: ["m-1 n2:0", "m-0 -gpu-unusable"],
    },
  ])("$name", ({ input, plan }) => {
    const result = schedule(input);
    expect(summarize(result)).toEqual(plan);
    checkPlan(input, result);
  });
});
