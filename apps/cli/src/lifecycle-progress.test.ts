import { create } from "@bufbuild/protobuf";
import {
  DeploymentSchema,
  type DeploymentStatus,
  DeploymentStatusSchema,
  type Replica,
  ReplicaRetirementSchema,
  ReplicaState,
  type RetirementPhase,
  RolloutSchema,
  RolloutState,
} from "@llmgw/proto";
import { describe, expect, it } from "vitest";
import {
  drainProgress,
  leftText,
  type ReplicaSnapshot,
  replicaProgressLines,
  retiringSummary,
  rolledBack,
  rolloutDone,
  rolloutProgress,
  runsRevision,
} from "./lifecycle-progress.js";
import { testReplica as replica, TEST_NOW_MS } from "./testing.js";

const T0 = TEST_NOW_MS;

const snap = (atMs: number, ...replicas: Replica[]): ReplicaSnapshot => ({ replicas, atMs });

describe("replicaProgressLines", () => {
  const cases: [
    name: string,
    prev: ReplicaSnapshot | undefined,
    next: ReplicaSnapshot,
    lines: string[],
  ][] = [
    [
      "the first poll gives every replica its line, with where it runs and its revision",
      undefined,
      snap(
        T0,
        replica("chat-0", { endpoint: "10.0.0.1:4000" }),
        replica("chat-1", { state: ReplicaState.PENDING, revision: 2, nodes: ["node-b"] }),
        replica("chat-2", { waiting: "rollout" }),
      ),
      [
        "chat-0  on node-a[0] (revision 1): ready at 10.0.0.1:4000",
        "chat-1  placed on node-b[0] (revision 2)",
        "chat-2  on node-a[0] (revision 1): ready,waiting (rollout): serves until its replacement is ready",
      ],
    ],
    [
      "nothing moved, nothing printed",
      snap(T0, replica("chat-0")),
      snap(T0 + 500, replica("chat-0")),
      [],
    ],
    [
      "a new replica placed, then each state it reaches",
      snap(T0, replica("chat-0")),
      snap(
        T0 + 500,
        replica("chat-0"),
        replica("chat-1", {
          state: ReplicaState.PENDING,
          revision: 2,
          nodes: ["node-b", "node-c"],
        }),
      ),
      ["chat-1  placed on node-b[0] + node-c[1] (revision 2)"],
    ],
    [
      "loading shows how long since the agent said it began",
      snap(T0, replica("chat-1", { state: ReplicaState.STARTING })),
      snap(T0 + 12_000, replica("chat-1", { state: ReplicaState.LOADING, stateSinceMs: T0 })),
      ["chat-1  loading (12s)"],
    ],
    [
      "loading without a reported start says only loading (absent is not zero)",
      snap(T0, replica("chat-1", { state: ReplicaState.STARTING })),
      snap(T0 + 500, replica("chat-1", { state: ReplicaState.LOADING })),
      ["chat-1  loading"],
    ],
    [
      "a long load repeats its line when it crosses each 10 s",
      snap(T0 + 9_900, replica("chat-1", { state: ReplicaState.LOADING, stateSinceMs: T0 })),
      snap(T0 + 10_400, replica("chat-1", { state: ReplicaState.LOADING, stateSinceMs: T0 })),
      ["chat-1  loading (10s)"],
    ],
    [
      "…and stays quiet between",
      snap(T0 + 10_400, replica("chat-1", { state: ReplicaState.LOADING, stateSinceMs: T0 })),
      snap(T0 + 10_900, replica("chat-1", { state: ReplicaState.LOADING, stateSinceMs: T0 })),
      [],
    ],
    [
      "ready with its endpoint",
      snap(T0, replica("chat-1", { state: ReplicaState.LOADING })),
      snap(T0 + 500, replica("chat-1", { endpoint: "[fd00::2]:41234" })),
      ["chat-1  ready at [fd00::2]:41234"],
    ],
    [
      "a bad state carries the rank's message",
      snap(T0, replica("chat-1", { state: ReplicaState.LOADING })),
      snap(T0 + 500, replica("chat-1", { state: ReplicaState.FAILED, message: "CUDA OOM" })),
      ["chat-1  failed (CUDA OOM)"],
    ],
    [
      "an old replica starts waiting for its replacement",
      snap(T0, replica("chat-0")),
      snap(T0 + 500, replica("chat-0", { waiting: "rollout" })),
      ["chat-0  ready,waiting (rollout): serves until its replacement is ready"],
    ],
    [
      "…then drains, before any router reported its in-flight requests",
      snap(T0, replica("chat-0", { waiting: "rollout" })),
      snap(
        T0 + 500,
        replica("chat-0", { draining: { reason: "rollout", deadlineMs: T0 + 300_000 } }),
      ),
      ["chat-0  ready,draining (rollout, 4m 59s left)"],
    ],
    [
      "…reports its in-flight count when it moves",
      snap(T0, replica("chat-0", { draining: { reason: "rollout", deadlineMs: T0 + 300_000 } })),
      snap(
        T0 + 1_000,
        replica("chat-0", {
          draining: { reason: "rollout", inFlight: 3, deadlineMs: T0 + 300_000 },
        }),
      ),
      ["chat-0  ready,draining (rollout, 3 in flight, 4m 59s left)"],
    ],
    [
      "…not while only the time left moves",
      snap(
        T0,
        replica("chat-0", {
          draining: { reason: "rollout", inFlight: 3, deadlineMs: T0 + 300_000 },
        }),
      ),
      snap(
        T0 + 5_000,
        replica("chat-0", {
          draining: { reason: "rollout", inFlight: 3, deadlineMs: T0 + 300_000 },
        }),
      ),
      [],
    ],
    [
      "…and is stopped once gone from the list",
      snap(
        T0,
        replica("chat-0", {
          draining: { reason: "rollout", inFlight: 0, deadlineMs: T0 + 300_000 },
        }),
      ),
      snap(T0 + 500),
      ["chat-0  stopped"],
    ],
    [
      "a replica gone past its drain deadline with requests in flight says so",
      snap(
        T0 + 299_800,
        replica("chat-0", {
          draining: { reason: "scale-down", inFlight: 2, deadlineMs: T0 + 300_000 },
        }),
      ),
      snap(T0 + 300_300),
      ["chat-0  stopped at its drain deadline with 2 in flight"],
    ],
    [
      "a replica that vanishes without retiring (an older control plane) is removed",
      snap(T0, replica("chat-0"), replica("chat-1")),
      snap(T0 + 500, replica("chat-1")),
      ["chat-0  removed"],
    ],
    [
      "an engine replaced in place shows its revision moving",
      snap(T0, replica("chat-0", { revision: 1 })),
      snap(T0 + 500, replica("chat-0", { revision: 2, runs: 1, state: ReplicaState.STARTING })),
      ["chat-0  revision 1 → 2: starting"],
    ],
    [
      "a retiring phase from a newer control plane still reads",
      snap(T0, replica("chat-0")),
      snap(
        T0 + 500,
        Object.assign(replica("chat-0"), {
          retirement: create(ReplicaRetirementSchema, {
            phase: 7 as RetirementPhase,
            reason: { code: "future", message: "" },
          }),
        }),
      ),
      ["chat-0  ready,retiring (future)"],
    ],
  ];
  it.each(cases)("%s", (_name, prev, next, lines) => {
    expect(replicaProgressLines(prev, next)).toEqual(lines);
  });

  it("lists moved replicas in the order listed, then the gone ones", () => {
    const lines = replicaProgressLines(
      snap(T0, replica("chat-0"), replica("chat-1", { state: ReplicaState.LOADING })),
      snap(
        T0 + 500,
        replica("chat-2", { state: ReplicaState.PENDING }),
        replica("chat-1", { draining: { reason: "rollout" } }),
      ),
    );
    expect(lines).toEqual([
      "chat-2  placed on node-a[0] (revision 1)",
      "chat-1  ready,draining (rollout)",
      "chat-0  removed",
    ]);
  });
});

function deployment(desired: number, revision: number, ...replicas: Replica[]): DeploymentStatus {
  return create(DeploymentStatusSchema, {
    spec: create(DeploymentSchema, { name: "chat", revision: BigInt(revision) }),
    desiredReplicas: desired,
    readyReplicas: replicas.filter((r) => r.state === ReplicaState.READY).length,
    replicas,
  });
}

describe("rolloutProgress and rolloutDone", () => {
  const cases: [name: string, d: DeploymentStatus, progress: string, done: boolean][] = [
    [
      "first deploy, all ready",
      deployment(2, 1, replica("chat-0"), replica("chat-1")),
      "chat: 2/2 ready at revision 1",
      true,
    ],
    [
      "first deploy, one loading",
      deployment(2, 1, replica("chat-0"), replica("chat-1", { state: ReplicaState.LOADING })),
      "chat: 1/2 ready at revision 1",
      false,
    ],
    [
      "mid-update: one new ready, one old waiting, one old draining",
      deployment(
        2,
        3,
        replica("chat-2", { revision: 3 }),
        replica("chat-0", { revision: 2, waiting: "rollout" }),
        replica("chat-1", { revision: 2, draining: { reason: "rollout", inFlight: 3 } }),
      ),
      "chat: 1/2 ready at revision 3, 1 waiting, 1 draining, 3 in flight",
      false,
    ],
    [
      "an old replica not yet retiring counts apart",
      deployment(2, 3, replica("chat-2", { revision: 3 }), replica("chat-0", { revision: 2 })),
      "chat: 1/2 ready at revision 3, 1 at an older revision",
      false,
    ],
    [
      "every replica at the revision, but one still drains: not done",
      deployment(
        2,
        3,
        replica("chat-2", { revision: 3 }),
        replica("chat-3", { revision: 3 }),
        replica("chat-0", { revision: 2, draining: { reason: "rollout", inFlight: 0 } }),
      ),
      "chat: 2/2 ready at revision 3, 1 draining, 0 in flight",
      false,
    ],
    [
      "placed at the revision but the agent still runs the old engine: not done",
      deployment(1, 3, replica("chat-0", { revision: 3, runs: 2 })),
      "chat: 0/1 ready at revision 3",
      false,
    ],
    [
      "an agent that reports no revision counts by the placement",
      deployment(1, 3, replica("chat-0", { revision: 3, runs: 0 })),
      "chat: 1/1 ready at revision 3",
      true,
    ],
    [
      "scaled down, before the control plane marks the extra one: not done",
      deployment(1, 1, replica("chat-0"), replica("chat-1")),
      "chat: 2/1 ready at revision 1",
      false,
    ],
    ["scaled to zero, none left", deployment(0, 1), "chat: 0/0 ready at revision 1", true],
  ];
  it.each(cases)("%s", (_name, d, progress, done) => {
    const revision = d.spec?.revision ?? 0n;
    expect(rolloutProgress(d, revision)).toBe(progress);
    expect(rolloutDone(d, revision)).toBe(done);
  });
});

describe("runsRevision", () => {
  it.each([
    ["placed and reported at it", replica("c-0", { revision: 2 }), true],
    ["placed at it, reporting the old one", replica("c-0", { revision: 2, runs: 1 }), false],
    ["placed at another", replica("c-0", { revision: 1 }), false],
    [
      "not reported yet (pending)",
      replica("c-0", { revision: 2, state: ReplicaState.PENDING }),
      true,
    ],
  ])("%s", (_name, r, expected) => {
    expect(runsRevision(r, 2n)).toBe(expected);
  });
});

describe("rolledBack", () => {
  const rollout = (state: RolloutState, to: number) =>
    create(RolloutSchema, { state, fromRevision: BigInt(to - 1), toRevision: BigInt(to) });
  it.each([
    ["the rollout to this revision rolled back", rollout(RolloutState.ROLLED_BACK, 3), true],
    ["an earlier rollout rolled back", rollout(RolloutState.ROLLED_BACK, 2), false],
    ["still in progress", rollout(RolloutState.IN_PROGRESS, 3), false],
    ["complete", rollout(RolloutState.COMPLETE, 3), false],
    ["no rollout yet", undefined, false],
  ])("%s", (_name, r, expected) => {
    expect(rolledBack(r, 3n)).toBe(expected);
  });
});

describe("drain and retiring summaries", () => {
  const replicas = [
    replica("chat-0", { nodes: ["gpu-07"], draining: { reason: "node-draining", inFlight: 2 } }),
    replica("chat-1", { nodes: ["gpu-07", "gpu-08"], waiting: "node-draining" }),
    replica("chat-2", { nodes: ["gpu-09"] }),
    replica("chat-3", { nodes: ["gpu-09"], state: ReplicaState.LOADING }),
    replica("embed-0", { nodes: ["gpu-07"], draining: { reason: "node-draining" } }),
  ];

  it("counts what is left on the node and what is ready elsewhere", () => {
    expect(drainProgress("gpu-07", replicas, "gpu-07")).toBe(
      "gpu-07: 3 replica(s) left (1 waiting, 2 draining, 2 in flight); 1 ready elsewhere",
    );
  });

  it("a replica with any rank on the node is left on it", () => {
    expect(drainProgress("gpu-08", replicas, "gpu-08")).toBe(
      "gpu-08: 1 replica(s) left (1 waiting); 1 ready elsewhere",
    );
  });

  it("no in-flight sum until a router reported one", () => {
    expect(retiringSummary([replicas[4] as Replica])).toBe("1 draining");
    expect(retiringSummary([replicas[2] as Replica])).toBe("");
  });

  it("names each replica left with its state", () => {
    expect(leftText(replicas.slice(0, 2), T0)).toBe(
      "chat-0 ready,draining (node-draining, 2 in flight); chat-1 ready,waiting (node-draining)",
    );
  });
});
