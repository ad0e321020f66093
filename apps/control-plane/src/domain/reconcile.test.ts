import { type DeploymentSpec, parseDeploymentSpecOrThrow, sameLaunch } from "@llmgw/engines";
import { type SchedulerNode, schedule } from "@llmgw/scheduler";
import { testNode } from "@llmgw/scheduler/testing";
import { describe, expect, it } from "vitest";
import type { PlacementRecord } from "../store/types.js";
import { planReconcile, type ReconcileInput, type ReplicaCondition } from "./reconcile.js";

const NOW = 1_000_000;

function spec(input: Record<string, unknown> = {}): DeploymentSpec {
  return parseDeploymentSpecOrThrow({
    name: "chat",
    model: "org/model",
    engine: "vllm",
    tensorParallel: 2,
    replicas: 2,
    ...input,
  });
}

function placed(id: string, node: string, gpus: number[], extra: Partial<PlacementRecord> = {}) {
  return {
    replicaId: id,
    deployment: "chat",
    revision: 1,
    ranks: [{ rank: 0, nodeId: node, gpuIndices: gpus }],
    createdAtMs: 0,
    ...extra,
  } satisfies PlacementRecord;
}

interface World {
  specs: DeploymentSpec[];
  older?: DeploymentSpec[];
  placements: readonly PlacementRecord[];
  nodes: SchedulerNode[];
  conditions?: Record<string, ReplicaCondition>;
  drained?: string[];
  now?: number;
  failing?: ReconcileInput["failing"];
  avoid?: ReconcileInput["avoid"];
  frozen?: string[];
}

function plan(w: World) {
  const input: ReconcileInput = {
    deployments: new Map(w.specs.map((s) => [s.name, s])),
    specOf: (name, revision) =>
      [...(w.older ?? []), ...w.specs].find((s) => s.name === name && s.revision === revision),
    placements: w.placements,
    nodes: w.nodes,
    // Placed replicas serve unless a test says otherwise; new ones are coming.
    condition: (id) => w.conditions?.[id] ?? "serving",
    drained: (id) => (w.drained ?? []).includes(id),
    schedule,
    nowMs: w.now ?? NOW,
    failing: w.failing,
    avoid: w.avoid,
    ...(w.frozen === undefined ? {} : { frozen: new Set(w.frozen) }),
  };
  return planReconcile(input);
}

const leaving = (p: ReturnType<typeof plan>) =>
  p.changed.map((c) => `${c.replicaId}:${c.retirement?.phase ?? `r${c.revision}`}`);
const removed = (p: ReturnType<typeof plan>) =>
  p.remove.map((r) => `${r.placement.replicaId}:${r.kind}`);

describe("planReconcile: planned removals drain", () => {
  it("a scale-down drains the surplus replica instead of stopping it", () => {
    const p = plan({
      specs: [spec({ replicas: 1, revision: 1 })],
      placements: [placed("chat-0", "n1", [0, 1]), placed("chat-1", "n2", [0, 1])],
      nodes: [testNode("n1"), testNode("n2")],
    });
    expect(p.remove).toEqual([]);
    expect(p.add).toEqual([]);
    expect(p.changed).toHaveLength(1);
    const r = p.changed[0]?.retirement;
    expect(r).toMatchObject({ code: "scale-down", phase: "draining", drainingSinceMs: NOW });
    expect(r?.deadlineMs).toBe(NOW + 300_000);
  });

  it("drainTimeoutSeconds sets the deadline", () => {
    const p = plan({
      specs: [spec({ replicas: 0, revision: 1, drainTimeoutSeconds: 7 })],
      placements: [placed("chat-0", "n1", [0, 1])],
      nodes: [testNode("n1")],
    });
    expect(p.changed[0]?.retirement?.deadlineMs).toBe(NOW + 7_000);
  });

  it("a replica that serves nothing leaves at once", () => {
    const p = plan({
      specs: [spec({ replicas: 0, revision: 1 })],
      placements: [placed("chat-0", "n1", [0, 1])],
      nodes: [testNode("n1")],
      conditions: { "chat-0": "coming" },
    });
    expect(removed(p)).toEqual(["chat-0:idle"]);
  });

  it("a deleted deployment's replicas drain", () => {
    const p = plan({
      specs: [],
      older: [spec({ revision: 1 })],
      placements: [placed("chat-0", "n1", [0, 1]), placed("chat-1", "n1", [2, 3])],
      nodes: [testNode("n1")],
      conditions: { "chat-1": "failed" },
    });
    expect(leaving(p)).toEqual(["chat-0:draining"]);
    expect(p.changed[0]?.retirement?.code).toBe("deployment-deleted");
    expect(removed(p)).toEqual(["chat-1:idle"]);
  });

  it("a deleted deployment's replica waiting for a replacement (a move, an update) drains now", () => {
    const waiting = (id: string, gpus: number[], code: string) =>
      placed(id, "n1", gpus, {
        retirement: { code, message: "m", phase: "waiting", sinceMs: NOW - 5 },
      });
    const p = plan({
      specs: [],
      older: [spec({ revision: 1, drainTimeoutSeconds: 7 })],
      placements: [
        waiting("chat-0", [0, 1], "node-draining"),
        waiting("chat-1", [2, 3], "rollout"),
      ],
      nodes: [testNode("n1")],
    });
    expect(leaving(p)).toEqual(["chat-0:draining", "chat-1:draining"]);
    expect(p.changed[0]?.retirement).toMatchObject({
      code: "deployment-deleted",
      sinceMs: NOW - 5,
      drainingSinceMs: NOW,
      deadlineMs: NOW + 7_000,
    });
    expect(p.remove).toEqual([]);
  });

  it("a drained replica stops; one past its deadline stops with drain-timeout", () => {
    const draining = (id: string, gpus: number[], deadlineMs: number) =>
      placed(id, "n1", gpus, {
        retirement: {
          code: "scale-down",
          message: "m",
          phase: "draining",
          sinceMs: 0,
          drainingSinceMs: 0,
          deadlineMs,
        },
      });
    const p = plan({
      specs: [spec({ replicas: 0, revision: 1 })],
      placements: [
        draining("chat-0", [0, 1], NOW + 1),
        draining("chat-1", [2, 3], NOW),
        draining("chat-2", [4, 5], NOW + 1),
      ],
      nodes: [testNode("n1")],
      drained: ["chat-0"],
    });
    expect(removed(p).sort()).toEqual(["chat-0:drained", "chat-1:drain-timeout"]);
    expect(p.keep.map((k) => k.replicaId)).toEqual(["chat-2"]);
    expect(p.changed).toEqual([]);
  });

  it("a loss removes at once: nothing is left to drain", () => {
    const p = plan({
      specs: [spec({ replicas: 1, revision: 1 })],
      placements: [placed("chat-0", "n1", [0, 1])],
      nodes: [testNode("n1", { state: "lost" }), testNode("n2")],
    });
    expect(removed(p)).toEqual(["chat-0:lost"]);
    expect(p.add.map((a) => a.ranks[0]?.nodeId)).toEqual(["n2"]);
  });

  it("GPUs of a draining replica are not given to anything new", () => {
    // One 2-GPU node: scaling chat down while `other` waits for GPUs must not place `other`
    // on the GPUs chat still serves from.
    const other = parseDeploymentSpecOrThrow({
      name: "other",
      model: "org/other",
      engine: "vllm",
      tensorParallel: 2,
      revision: 1,
    });
    const p = plan({
      specs: [spec({ replicas: 0, revision: 1 }), other],
      placements: [placed("chat-0", "n1", [0, 1])],
      nodes: [testNode("n1", { gpus: 2 })],
    });
    expect(leaving(p)).toEqual(["chat-0:draining"]);
    expect(p.add).toEqual([]);
    expect(p.unschedulable.get("other")?.missing).toBe(1);
    // Once drained, the next plan places it there.
    const after = plan({
      specs: [spec({ replicas: 0, revision: 1 }), other],
      placements: p.keep,
      nodes: [testNode("n1", { gpus: 2 })],
      drained: ["chat-0"],
    });
    expect(removed(after)).toEqual(["chat-0:drained"]);
    expect(after.add.map((a) => a.replicaId)).toEqual(["other-0"]);
  });
});

describe("planReconcile: preemption", () => {
  it("drains the victim, and the preemptor waits for it instead of evicting more", () => {
    const low = (name: string) =>
      parseDeploymentSpecOrThrow({
        name,
        model: "org/m",
        engine: "vllm",
        tensorParallel: 2,
        revision: 1,
        priority: 0,
      });
    const high = parseDeploymentSpecOrThrow({
      name: "high",
      model: "org/h",
      engine: "vllm",
      tensorParallel: 2,
      revision: 1,
      priority: 10,
      allowPreemption: true,
    });
    const p = plan({
      specs: [low("a"), low("b"), high],
      placements: [
        { ...placed("a-0", "n1", [0, 1]), deployment: "a" },
        { ...placed("b-0", "n2", [0, 1]), deployment: "b" },
      ],
      nodes: [testNode("n1", { gpus: 2 }), testNode("n2", { gpus: 2 })],
    });
    expect(leaving(p)).toHaveLength(1);
    expect(p.changed[0]?.retirement).toMatchObject({ code: "preempted", phase: "draining" });
    expect(p.add).toEqual([]);
    expect(p.remove).toEqual([]);
    // Nor in the next plans while it drains; once drained, the preemptor takes its GPUs.
    const world = {
      specs: [low("a"), low("b"), high],
      nodes: [testNode("n1", { gpus: 2 }), testNode("n2", { gpus: 2 })],
    };
    const again = plan({ ...world, placements: p.keep });
    expect(again.changed).toEqual([]);
    const victim = p.changed[0]?.replicaId as string;
    const done = plan({ ...world, placements: p.keep, drained: [victim] });
    expect(removed(done)).toEqual([`${victim}:drained`]);
    expect(done.add.map((a) => a.deployment)).toEqual(["high"]);
  });
});

describe("planReconcile: make before break", () => {
  it("a node drain starts the replacement first, then drains the old replica", () => {
    const world: World = {
      specs: [spec({ replicas: 1, revision: 1 })],
      placements: [placed("chat-0", "n1", [0, 1])],
      nodes: [testNode("n1", { draining: true, cordoned: true }), testNode("n2")],
    };
    const first = plan(world);
    expect(leaving(first)).toEqual(["chat-0:waiting"]);
    expect(first.add.map((a) => `${a.replicaId}@${a.ranks[0]?.nodeId}`)).toEqual(["chat-1@n2"]);
    expect(first.remove).toEqual([]);
    // While the replacement loads, the old one keeps serving.
    const loading = plan({
      ...world,
      placements: [...first.keep, ...first.add],
      conditions: { "chat-1": "coming" },
    });
    expect(loading.changed).toEqual([]);
    expect(loading.add).toEqual([]);
    // Ready: the old one drains.
    const ready = plan({ ...world, placements: [...first.keep, ...first.add] });
    expect(leaving(ready)).toEqual(["chat-0:draining"]);
    expect(ready.dips).toEqual([]);
  });

  it("with no room for a replacement, one replica goes at a time and the dip is announced", () => {
    const p = plan({
      specs: [spec({ replicas: 2, revision: 1 })],
      placements: [placed("chat-0", "n1", [0, 1]), placed("chat-1", "n2", [0, 1])],
      nodes: [
        testNode("n1", { gpus: 2, draining: true, cordoned: true }),
        testNode("n2", { gpus: 2, draining: true, cordoned: true }),
      ],
    });
    expect(leaving(p)).toEqual(["chat-0:draining", "chat-1:waiting"]);
    expect(p.dips).toHaveLength(1);
    expect(p.dips[0]?.message).toMatch(/no room for a replacement .*chat-0 drains first, 1 of 2/);
  });

  it("the dip goes on while another deployment waits for room the freed GPUs do not make", () => {
    // The freed GPUs are on the draining node: `other` gets none of them.
    const other = spec({ name: "other", model: "org/other", revision: 1, priority: 1 });
    const p = plan({
      specs: [spec({ replicas: 1, revision: 1 }), other],
      placements: [placed("chat-0", "n1", [0, 1])],
      nodes: [testNode("n1", { gpus: 2, draining: true, cordoned: true })],
    });
    expect(p.unschedulable.get("other")?.missing).toBe(2);
    expect(leaving(p)).toEqual(["chat-0:draining"]);
    expect(p.dips).toHaveLength(1);
  });

  it("maxUnavailable lets a replica drain without waiting", () => {
    const p = plan({
      specs: [spec({ replicas: 2, revision: 1, maxUnavailable: 1 })],
      placements: [placed("chat-0", "n1", [0, 1]), placed("chat-1", "n2", [0, 1])],
      nodes: [testNode("n1", { draining: true, cordoned: true }), testNode("n2"), testNode("n3")],
    });
    expect(leaving(p)).toEqual(["chat-0:draining"]);
    expect(p.add.map((a) => a.ranks[0]?.nodeId)).toEqual(["n3"]);
    expect(p.dips).toEqual([]);
  });
});

describe("planReconcile: rolling updates", () => {
  const v1 = spec({ replicas: 2, revision: 1 });
  const v2 = spec({ replicas: 2, revision: 2, extraArgs: ["--enforce-eager"] });
  const nodes = [testNode("n1", { gpus: 4 }), testNode("n2", { gpus: 4 })];

  it("replaces maxSurge replicas at a time, each drained only once its replacement serves", () => {
    let placements: PlacementRecord[] = [
      placed("chat-0", "n1", [0, 1]),
      placed("chat-1", "n2", [0, 1]),
    ];
    const step = (conditions: Record<string, ReplicaCondition> = {}, drained: string[] = []) => {
      const p = plan({ specs: [v2], older: [v1], placements, nodes, conditions, drained });
      placements = [...p.keep, ...p.add];
      return p;
    };
    const first = step();
    expect(leaving(first)).toEqual(["chat-0:waiting"]);
    expect(first.add.map((a) => `${a.replicaId}@r${a.revision}`)).toEqual(["chat-2@r2"]);
    // chat-1 (old, not yet replaced) is untouched and still counted.
    expect(placements.find((p) => p.replicaId === "chat-1")?.retirement).toBeUndefined();
    expect(step({ "chat-2": "coming" }).changed).toEqual([]);
    const second = step();
    expect(leaving(second)).toEqual(["chat-0:draining"]);
    // Nothing new while the drained one holds its slot in the surge: the next old one is
    // marked only after chat-0 leaves.
    expect(second.add).toEqual([]);
    const third = step({}, ["chat-0"]);
    expect(removed(third)).toEqual(["chat-0:drained"]);
    expect(leaving(third)).toEqual(["chat-1:waiting"]);
    // Not chat-0: nothing may take the stopping engine for its replacement.
    expect(third.add.map((a) => `${a.replicaId}@r${a.revision}`)).toEqual(["chat-3@r2"]);
    const fourth = step();
    expect(leaving(fourth)).toEqual(["chat-1:draining"]);
    const done = step({}, ["chat-1"]);
    expect(removed(done)).toEqual(["chat-1:drained"]);
    expect(done.add).toEqual([]);
    expect(placements.map((p) => `${p.replicaId}@r${p.revision}`).sort()).toEqual([
      "chat-2@r2",
      "chat-3@r2",
    ]);
  });

  it("a revision that runs engines the same way keeps its replicas (no restart)", () => {
    const v2Policy = spec({ replicas: 2, revision: 2, routingPolicy: "round-robin" });
    const p = plan({
      specs: [v2Policy],
      older: [v1],
      placements: [placed("chat-0", "n1", [0, 1]), placed("chat-1", "n2", [0, 1])],
      nodes,
    });
    expect(leaving(p)).toEqual(["chat-0:r2", "chat-1:r2"]);
    expect(p.add).toEqual([]);
    expect(p.remove).toEqual([]);
  });

  it("an old replica that serves nothing is replaced at once", () => {
    const p = plan({
      specs: [v2],
      older: [v1],
      placements: [placed("chat-0", "n1", [0, 1]), placed("chat-1", "n2", [0, 1])],
      nodes,
      conditions: { "chat-1": "failed" },
    });
    expect(removed(p)).toEqual(["chat-1:idle"]);
    expect(leaving(p)).toEqual(["chat-0:waiting"]);
    expect(p.add).toHaveLength(2);
  });

  it("on a full fleet the update goes one at a time, announced", () => {
    const full = [testNode("n1", { gpus: 2 }), testNode("n2", { gpus: 2 })];
    const p = plan({
      specs: [v2],
      older: [v1],
      placements: [placed("chat-0", "n1", [0, 1]), placed("chat-1", "n2", [0, 1])],
      nodes: full,
    });
    expect(leaving(p)).toEqual(["chat-0:draining"]);
    expect(p.dips[0]?.message).toMatch(/no room for a replacement/);
    // When it is gone, its GPUs take the new revision.
    const next = plan({
      specs: [v2],
      older: [v1],
      placements: p.keep,
      nodes: full,
      drained: ["chat-0"],
    });
    expect(removed(next)).toEqual(["chat-0:drained"]);
    expect(next.add.map((a) => `${a.ranks[0]?.nodeId}@r${a.revision}`)).toEqual(["n1@r2"]);
  });

  it("on a full fleet the dip lets go a replica whose GPUs can take the replacement", () => {
    // Both wait (maxSurge 2); chat-0 longest, but on a cordoned node: its GPUs take no new
    // replica.
    const v2 = spec({ replicas: 2, revision: 2, extraArgs: ["--enforce-eager"], maxSurge: 2 });
    const full = [testNode("n1", { gpus: 2, cordoned: true }), testNode("n2", { gpus: 2 })];
    const p = plan({
      specs: [v2],
      older: [v1],
      placements: [placed("chat-0", "n1", [0, 1]), placed("chat-1", "n2", [0, 1])],
      nodes: full,
    });
    expect(leaving(p)).toEqual(["chat-0:waiting", "chat-1:draining"]);
    expect(p.dips[0]?.message).toMatch(/chat-1 drains first/);
    const next = plan({
      specs: [v2],
      older: [v1],
      placements: p.keep,
      nodes: full,
      drained: ["chat-1"],
    });
    expect(next.add.map((a) => `${a.ranks[0]?.nodeId}@r${a.revision}`)).toEqual(["n2@r2"]);
  });

  it("on a full fleet the first replica to wait is one whose GPUs can take the replacement", () => {
    // maxSurge + maxUnavailable = 1: only one waits, and only it may dip. chat-0 sorts first
    // but sits on a cordoned node, where its GPUs take no new replica.
    const full = [testNode("n1", { gpus: 2, cordoned: true }), testNode("n2", { gpus: 2 })];
    const p = plan({
      specs: [v2],
      older: [v1],
      placements: [placed("chat-0", "n1", [0, 1]), placed("chat-1", "n2", [0, 1])],
      nodes: full,
    });
    expect(leaving(p)).toEqual(["chat-1:draining"]);
    expect(p.dips[0]?.message).toMatch(/chat-1 drains first/);
    const next = plan({
      specs: [v2],
      older: [v1],
      placements: p.keep,
      nodes: full,
      drained: ["chat-1"],
    });
    expect(next.add.map((a) => `${a.ranks[0]?.nodeId}@r${a.revision}`)).toEqual(["n2@r2"]);
  });

  describe("on a mixed fleet, a deployment that names no GPU class", () => {
    // Full H100 nodes (no-free-gpus) and an L4 node too small for a replica (exceeds-node):
    // one reason per class, not all of them room.
    const mixed = [
      testNode("n1", { gpus: 2 }),
      testNode("n2", { gpus: 2 }),
      testNode("l1", { gpus: 1, gpuClass: "l4-24g" }),
    ];
    const v1 = spec({ replicas: 2, revision: 1, nodesPerReplica: 1 });
    const world = {
      older: [v1],
      placements: [placed("chat-0", "n1", [0, 1]), placed("chat-1", "n2", [0, 1])],
      nodes: mixed,
    };

    it("dips when a freed replica's GPUs take the replacement", () => {
      const v2 = spec({ replicas: 2, revision: 2, nodesPerReplica: 1, extraArgs: ["-x"] });
      const p = plan({ ...world, specs: [v2] });
      expect(p.unschedulable.get("chat")?.reasons.map((r) => r.code)).toEqual([
        "no-free-gpus",
        "exceeds-node",
      ]);
      expect(leaving(p)).toEqual(["chat-0:draining"]);
      expect(p.dips[0]?.message).toMatch(/no room for a replacement .*chat-0 drains first/);
      const next = plan({ ...world, specs: [v2], placements: p.keep, drained: ["chat-0"] });
      expect(next.add.map((a) => `${a.ranks[0]?.nodeId}@r${a.revision}`)).toEqual(["n1@r2"]);
    });

    it("keeps serving when the replacement would not fit on the freed GPUs either", () => {
      // Twice the GPUs: more than any node of either class holds.
      const v2 = spec({ replicas: 2, revision: 2, nodesPerReplica: 1, tensorParallel: 4 });
      const p = plan({ ...world, specs: [v2] });
      expect(p.unschedulable.get("chat")?.reasons.map((r) => r.code)).toEqual([
        "exceeds-node",
        "exceeds-node",
      ]);
      expect(leaving(p)).toEqual(["chat-0:waiting"]);
      expect(p.dips).toEqual([]);
    });
  });

  it("on a full fleet no dip hands the freed GPUs to another deployment waiting for room", () => {
    // `big` (placed first: higher priority, no preemption) waits for room. Dipping gave it
    // chat-0's GPUs, then chat-1's on the next step: the update drained chat to nothing.
    const full = [testNode("n1", { gpus: 2 }), testNode("n2", { gpus: 2 })];
    const big = spec({ name: "big", model: "org/big", replicas: 2, revision: 1, priority: 1 });
    const p = plan({
      specs: [v2, big],
      older: [v1],
      placements: [placed("chat-0", "n1", [0, 1]), placed("chat-1", "n2", [0, 1])],
      nodes: full,
    });
    expect(p.unschedulable.get("big")?.missing).toBe(2);
    expect(leaving(p)).toEqual(["chat-0:waiting"]);
    expect(p.dips).toEqual([]);
  });

  it("sameLaunch ignores what does not reach the engine, and sees what does", () => {
    expect(sameLaunch(v1, spec({ revision: 5, replicas: 9, priority: 3, maxSurge: 2 }))).toBe(true);
    expect(sameLaunch(v1, v2)).toBe(false);
    expect(sameLaunch(v1, spec({ revision: 1, env: { A: "1" } }))).toBe(false);
  });
});

describe("planReconcile: a replica that keeps failing", () => {
  const failingOnN1 = {
    failing: [{ replicaId: "chat-0", message: "its engine kept failing on n1" }],
    avoid: [{ deployment: "chat", nodeId: "n1" }],
    conditions: { "chat-0": "failed" as const },
  };

  it("moves to a node with room: removed at once, its replacement placed there", () => {
    const p = plan({
      ...failingOnN1,
      specs: [spec({ replicas: 1, revision: 1 })],
      placements: [placed("chat-0", "n1", [0, 1])],
      nodes: [testNode("n1", { gpus: 2 }), testNode("n2", { gpus: 2 })],
    });
    expect(removed(p)).toEqual(["chat-0:lost"]);
    expect(p.remove[0]?.reason.code).toBe("replica-failed");
    expect(p.add.map((a) => `${a.replicaId}@${a.ranks[0]?.nodeId}`)).toEqual(["chat-1@n2"]);
  });

  it("waits while GPUs it would move to are still draining, instead of landing where it failed", () => {
    const other = spec({ name: "o", model: "org/other", replicas: 0, revision: 1 });
    const p = plan({
      ...failingOnN1,
      specs: [spec({ replicas: 1, revision: 1 }), other],
      placements: [
        placed("chat-0", "n1", [0, 1]),
        placed("o-0", "n2", [0, 1], { deployment: "o" }),
      ],
      nodes: [testNode("n1", { gpus: 2 }), testNode("n2", { gpus: 2 })],
    });
    // o-0 drains (holding n2's GPUs); chat-0 stays on n1 for now: nothing is added on n1.
    expect(leaving(p)).toEqual(["o-0:draining"]);
    expect(p.remove).toEqual([]);
    expect(p.add).toEqual([]);
    // Once o-0 is gone the move goes to n2.
    const after = plan({
      ...failingOnN1,
      specs: [spec({ replicas: 1, revision: 1 }), other],
      placements: [placed("chat-0", "n1", [0, 1])],
      nodes: [testNode("n1", { gpus: 2 }), testNode("n2", { gpus: 2 })],
    });
    expect(after.add.map((a) => `${a.replicaId}@${a.ranks[0]?.nodeId}`)).toEqual(["chat-1@n2"]);
  });
});

describe("planReconcile: a scale-down during a rolling update", () => {
  it("drains first the old replicas on nodes that take no new replica", () => {
    // Three old replicas serving, scaled to two mid-update: chat-2 sits on a cordoned node
    // and must leave anyway; by revision and id alone chat-0 went, and chat-2 stayed to be
    // replaced later at the cost of a replica that could have stayed.
    const p = plan({
      specs: [spec({ replicas: 2, revision: 2, maxSurge: 1, maxUnavailable: 0 })],
      older: [spec({ replicas: 3, revision: 1, extraArgs: ["--seed", "1"] })],
      placements: [
        placed("chat-0", "n1", [0, 1]),
        placed("chat-1", "n2", [0, 1]),
        placed("chat-2", "n3", [0, 1]),
      ],
      nodes: [testNode("n1"), testNode("n2"), testNode("n3", { cordoned: true }), testNode("n4")],
    });
    const scaledDown = p.changed
      .filter((c) => c.retirement?.code === "scale-down")
      .map((c) => c.replicaId);
    expect(scaledDown).toEqual(["chat-2"]);
  });
});

describe("planReconcile: a frozen deployment (a spec this release refuses)", () => {
  it("keeps its replicas as placed, short of its count, on a draining node, and waiting ones serve", () => {
    const p = plan({
      specs: [spec({ replicas: 3, revision: 2 })],
      older: [spec({ replicas: 3, revision: 1, extraArgs: ["--seed", "1"] })],
      placements: [
        placed("chat-0", "n1", [0, 1]),
        placed("chat-1", "n2", [0, 1], { revision: 2 }),
        placed("chat-2", "n3", [0, 1], {
          retirement: { code: "rollout", message: "m", phase: "waiting", sinceMs: 0 },
        }),
      ],
      nodes: [testNode("n1", { draining: true }), testNode("n2"), testNode("n3"), testNode("n4")],
      frozen: ["chat"],
    });
    expect([p.add, p.remove, p.changed, p.dips]).toEqual([[], [], [], []]);
    expect(p.unschedulable.size).toBe(0);
    expect(p.keep.map((k) => k.replicaId)).toEqual(["chat-0", "chat-1", "chat-2"]);
  });

  it("lets a lost replica go without a replacement, and a drain under way end", () => {
    const p = plan({
      specs: [spec({ revision: 1 })],
      placements: [
        placed("chat-0", "n1", [0, 1]),
        placed("chat-1", "n2", [0, 1], {
          retirement: {
            code: "scale-down",
            message: "m",
            phase: "draining",
            sinceMs: 0,
            drainingSinceMs: 0,
            deadlineMs: NOW + 1,
          },
        }),
      ],
      nodes: [testNode("n1", { state: "lost" }), testNode("n2"), testNode("n3")],
      drained: ["chat-1"],
      frozen: ["chat"],
    });
    expect(removed(p)).toEqual(["chat-1:drained", "chat-0:lost"]);
    expect(p.add).toEqual([]);
  });
});
