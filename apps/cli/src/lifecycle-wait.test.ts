import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  DeploymentSchema,
  type DeploymentStatus,
  DeploymentStatusSchema,
  NodeSchema,
  NodeState,
  ReasonSchema,
  type Replica,
  RolloutSchema,
  RolloutState,
} from "@llmgw/proto";
import { afterEach, describe, expect, it } from "vitest";
import { runCli } from "./cli.js";
import { callAgainAfterBreak } from "./lifecycle-wait.js";
import {
  capturedIo,
  type FakeClusterService,
  testReplica as replica,
  startFakeClusterService,
} from "./testing.js";

// Each `--wait` command against a real Connect server on loopback whose ClusterService
// answers a script of snapshots, one per poll (the last one repeats).

let fake: FakeClusterService | undefined;
afterEach(async () => {
  await fake?.close();
  fake = undefined;
});

/** Answers `script[0]`, `script[1]`, …, then the last one forever; counts the calls. */
function scripted<T>(script: readonly (T | Error)[]): { next: () => T; calls: () => number } {
  let i = 0;
  return {
    next() {
      const item = script[Math.min(i, script.length - 1)] as T | Error;
      i++;
      if (item instanceof Error) throw item;
      return item;
    },
    calls: () => i,
  };
}

function status(
  revision: number,
  desired: number,
  replicas: Replica[],
  rollout?: { state: RolloutState; from: number; to: number; message?: string },
): DeploymentStatus {
  return create(DeploymentStatusSchema, {
    spec: create(DeploymentSchema, {
      name: "chat",
      model: "m",
      engine: 4,
      revision: BigInt(revision),
    }),
    desiredReplicas: desired,
    readyReplicas: replicas.filter((r) => r.state === 4 && !r.retirement).length,
    replicas,
    ...(rollout
      ? {
          rollout: create(RolloutSchema, {
            state: rollout.state,
            fromRevision: BigInt(rollout.from),
            toRevision: BigInt(rollout.to),
            message: rollout.message ?? "",
          }),
        }
      : {}),
  });
}

/** Output as lines, without the final newline. */
const lines = (text: string) => text.trimEnd().split("\n");

const DEPLOY = ["deploy", "chat", "--model", "m", "--engine", "sim", "--replicas", "2", "--wait"];

describe("llmgw deploy --wait", () => {
  const rollingUpdate = [
    status(
      3,
      2,
      [
        replica("chat-0", { revision: 2, endpoint: "10.0.0.1:1" }),
        replica("chat-1", { revision: 2, endpoint: "10.0.0.1:2" }),
        replica("chat-2", { revision: 3, state: 1, nodes: ["node-b"] }),
      ],
      { state: RolloutState.IN_PROGRESS, from: 2, to: 3 },
    ),
    status(
      3,
      2,
      [
        replica("chat-0", { revision: 2, endpoint: "10.0.0.1:1" }),
        replica("chat-1", { revision: 2, endpoint: "10.0.0.1:2" }),
        replica("chat-2", { revision: 3, state: 3, nodes: ["node-b"] }),
      ],
      { state: RolloutState.IN_PROGRESS, from: 2, to: 3 },
    ),
    status(
      3,
      2,
      [
        replica("chat-0", { revision: 2, draining: { reason: "rollout", inFlight: 3 } }),
        replica("chat-1", { revision: 2, endpoint: "10.0.0.1:2" }),
        replica("chat-2", { revision: 3, nodes: ["node-b"], endpoint: "10.0.0.2:1" }),
        replica("chat-3", { revision: 3, state: 1, nodes: ["node-c"] }),
      ],
      { state: RolloutState.IN_PROGRESS, from: 2, to: 3 },
    ),
    status(
      3,
      2,
      [
        replica("chat-1", { revision: 2, waiting: "rollout" }),
        replica("chat-2", { revision: 3, nodes: ["node-b"], endpoint: "10.0.0.2:1" }),
        replica("chat-3", { revision: 3, nodes: ["node-c"], endpoint: "10.0.0.3:1" }),
      ],
      { state: RolloutState.IN_PROGRESS, from: 2, to: 3 },
    ),
    status(
      3,
      2,
      [
        replica("chat-2", { revision: 3, nodes: ["node-b"], endpoint: "10.0.0.2:1" }),
        replica("chat-3", { revision: 3, nodes: ["node-c"], endpoint: "10.0.0.3:1" }),
      ],
      { state: RolloutState.COMPLETE, from: 2, to: 3 },
    ),
  ];

  it("follows a rolling update step by step until the old replicas are gone", async () => {
    const polls = scripted(rollingUpdate);
    fake = await startFakeClusterService({
      applyDeployment: () => ({ changed: true, deployment: rollingUpdate[0] }),
      getDeployment: () => ({ deployment: polls.next() }),
    });
    const io = capturedIo(fake.env);
    expect(await runCli(DEPLOY, io)).toBe(0);
    const got = lines(io.err());
    expect(got.slice(0, -1)).toEqual([
      "applied chat (revision 3); waiting for 2 replica(s)",
      "chat-0  on node-a[0] (revision 2): ready at 10.0.0.1:1",
      "chat-1  on node-a[0] (revision 2): ready at 10.0.0.1:2",
      "chat-2  placed on node-b[0] (revision 3)",
      "chat: rollout r2 → r3 in progress",
      "chat: 0/2 ready at revision 3, 2 at an older revision",
      "chat-2  loading",
      "chat-0  ready,draining (rollout, 3 in flight)",
      "chat-2  ready at 10.0.0.2:1",
      "chat-3  placed on node-c[0] (revision 3)",
      "chat: 1/2 ready at revision 3, 1 at an older revision, 1 draining, 3 in flight",
      "chat-1  ready,waiting (rollout): serves until its replacement is ready",
      "chat-3  ready at 10.0.0.3:1",
      "chat-0  stopped",
      "chat: 2/2 ready at revision 3, 1 waiting",
      "chat-1  stopped",
      "chat: rollout r2 → r3 complete",
    ]);
    expect(got.at(-1)).toMatch(/^chat: 2\/2 ready after \d+s$/);
    expect(io.out()).toBe("");
  });

  it("with --json, the final status goes to stdout", async () => {
    const done = rollingUpdate.at(-1) as DeploymentStatus;
    fake = await startFakeClusterService({
      applyDeployment: () => ({ changed: false, deployment: done }),
      getDeployment: () => ({ deployment: done }),
    });
    const io = capturedIo(fake.env);
    expect(await runCli([...DEPLOY, "--json"], io)).toBe(0);
    const json = JSON.parse(io.out());
    expect(json.rollout).toEqual({
      state: "ROLLOUT_STATE_COMPLETE",
      fromRevision: "2",
      toRevision: "3",
    });
    expect(json.replicas.map((r: { replicaId: string }) => r.replicaId)).toEqual([
      "chat-2",
      "chat-3",
    ]);
  });

  it("exits 1 with the control plane's reason when the rollout is rolled back", async () => {
    const polls = scripted([
      rollingUpdate[0] as DeploymentStatus,
      status(
        2,
        2,
        [
          replica("chat-0", { revision: 2, endpoint: "10.0.0.1:1" }),
          replica("chat-1", { revision: 2, endpoint: "10.0.0.1:2" }),
        ],
        {
          state: RolloutState.ROLLED_BACK,
          from: 2,
          to: 3,
          message: "chat-2 failed: CUDA out of memory",
        },
      ),
    ]);
    fake = await startFakeClusterService({
      applyDeployment: () => ({ changed: true, deployment: rollingUpdate[0] }),
      getDeployment: () => ({ deployment: polls.next() }),
    });
    const io = capturedIo(fake.env);
    expect(await runCli(DEPLOY, io)).toBe(1);
    expect(lines(io.err()).slice(-3)).toEqual([
      "chat-2  removed",
      "chat: rolled back from r3 to r2: chat-2 failed: CUDA out of memory",
      "chat: revision 3 did not roll out; see 'llmgw events'",
    ]);
  });

  it("an earlier rollout's rollback is not this one's", async () => {
    const ready = status(3, 1, [replica("chat-0", { revision: 3 })], {
      state: RolloutState.ROLLED_BACK,
      from: 1,
      to: 2,
      message: "old news",
    });
    fake = await startFakeClusterService({
      applyDeployment: () => ({ changed: true, deployment: ready }),
      getDeployment: () => ({ deployment: ready }),
    });
    const io = capturedIo(fake.env);
    expect(await runCli(DEPLOY, io)).toBe(0);
    expect(io.err()).not.toContain("old news");
  });

  it("exits 1 when another change replaced the revision it waits for", async () => {
    fake = await startFakeClusterService({
      applyDeployment: () => ({ changed: true, deployment: rollingUpdate[0] }),
      getDeployment: () => ({ deployment: status(4, 2, []) }),
    });
    const io = capturedIo(fake.env);
    expect(await runCli(DEPLOY, io)).toBe(1);
    expect(lines(io.err()).at(-1)).toBe("chat: revision 4 replaced revision 3 while waiting");
  });

  it("exits 1 on a failed replica, with its engine's lines", async () => {
    const failed = status(1, 1, [replica("chat-0", { state: 8, message: "exit 1" })]);
    failed.failed = [
      create(ReasonSchema, {
        code: "LLMGW_CONTROL_PLANE_REPLICA_FAILED",
        message: "chat-0 failed: CUDA OOM",
      }),
    ];
    fake = await startFakeClusterService({
      applyDeployment: () => ({ changed: true, deployment: failed }),
      getDeployment: () => ({ deployment: failed }),
    });
    const io = capturedIo(fake.env);
    expect(await runCli(DEPLOY, io)).toBe(1);
    expect(lines(io.err()).slice(1)).toEqual([
      "chat-0  on node-a[0] (revision 1): failed (exit 1)",
      "chat-0 failed: CUDA OOM",
      "chat: 1 replica(s) failed; see 'llmgw events' and the agent's engine logs",
    ]);
  });

  it("exits 1 on timeout, saying how far it got", async () => {
    const loading = status(1, 1, [replica("chat-0", { state: 3 })]);
    fake = await startFakeClusterService({
      applyDeployment: () => ({ changed: true, deployment: loading }),
      getDeployment: () => ({ deployment: loading }),
    });
    const io = capturedIo(fake.env);
    expect(await runCli([...DEPLOY, "--timeout", "0"], io)).toBe(1);
    expect(lines(io.err()).at(-1)).toMatch(
      /^chat: timed out after 0s: chat: 0\/1 ready at revision 1$/,
    );
  });

  it("keeps waiting through a control plane outage and says when it answers again", async () => {
    const ready = status(1, 1, [replica("chat-0")]);
    const polls = scripted<DeploymentStatus>([
      new ConnectError("restarting", Code.Unavailable),
      new ConnectError("restarting", Code.Unavailable),
      ready,
    ]);
    fake = await startFakeClusterService({
      applyDeployment: () => ({ changed: true, deployment: ready }),
      getDeployment: () => ({ deployment: polls.next() }),
    });
    const io = capturedIo(fake.env);
    expect(await runCli(DEPLOY, io)).toBe(0);
    const got = lines(io.err());
    expect(got.slice(1, 3)).toEqual([
      "control plane unavailable (restarting); still waiting",
      `control plane ${fake.url} answers again`,
    ]);
    expect(polls.calls()).toBe(3);
  });

  it("stops at a refusal that asking again cannot fix", async () => {
    fake = await startFakeClusterService({
      applyDeployment: () => ({ changed: true, deployment: status(1, 1, []) }),
      getDeployment: () => {
        throw new ConnectError("deployment chat not found", Code.NotFound);
      },
    });
    const io = capturedIo(fake.env);
    expect(await runCli(DEPLOY, io)).toBe(1);
    expect(lines(io.err()).at(-1)).toBe("llmgw: deployment chat not found");
  });

  it("Ctrl-C stops the wait with 130; the rollout goes on", async () => {
    const loading = status(1, 1, [replica("chat-0", { state: 3 })]);
    const interrupt = new AbortController();
    fake = await startFakeClusterService({
      applyDeployment: () => ({ changed: true, deployment: loading }),
      getDeployment: () => {
        interrupt.abort();
        return { deployment: loading };
      },
    });
    const io = { ...capturedIo(fake.env), signal: interrupt.signal };
    expect(await runCli(DEPLOY, io)).toBe(130);
    expect(lines(io.err()).at(-1)).toBe("interrupted; the deployment keeps rolling out");
  });

  it.each([
    [["--timeout", "soon"], '--timeout must be whole seconds 0–86400, got "soon"'],
    [["--timeout", "86401"], '--timeout must be whole seconds 0–86400, got "86401"'],
  ])("rejects %j with a usage error", async (flags, message) => {
    const io = capturedIo({ LLMGW_ADMIN_TOKEN: "t" });
    expect(await runCli([...DEPLOY, ...flags], io)).toBe(2);
    expect(io.err()).toContain(`llmgw deploy: ${message}\n`);
  });
});

describe("--wait against a control plane that stops answering (a frozen leader, a black hole)", () => {
  const loading = status(3, 2, [replica("chat-0", { revision: 3, state: 3 })]);
  const SCALE = ["scale", "chat", "2", "--wait", "--timeout", "1"];
  /** Never answers, until the test closes the server. */
  const silent = () => new Promise<never>(() => {});

  it("ends at --timeout with the control plane's silence when it never answered", async () => {
    fake = await startFakeClusterService({
      scaleDeployment: () => ({ deployment: loading }),
      getDeployment: silent,
    });
    const io = capturedIo(fake.env);
    expect(await runCli(SCALE, io)).toBe(1);
    expect(lines(io.err()).at(-1)).toMatch(
      /^llmgw: the control plane at http:\/\/127\.0\.0\.1:\d+ did not answer in time \(.+\) — is it overloaded, or is the network to it dropping packets\?$/,
    );
  });

  it("ends at --timeout saying how far it got when it stopped answering", async () => {
    let calls = 0;
    fake = await startFakeClusterService({
      scaleDeployment: () => ({ deployment: loading }),
      getDeployment: () => (calls++ === 0 ? { deployment: loading } : silent()),
    });
    const io = capturedIo(fake.env);
    expect(await runCli(SCALE, io)).toBe(1);
    expect(lines(io.err()).at(-1)).toMatch(
      /^chat: timed out after \ds: chat: 0\/2 ready at revision 3$/,
    );
  });

  it("Ctrl-C stops a read that gets no answer (130); the scale goes on", async () => {
    fake = await startFakeClusterService({
      scaleDeployment: () => ({ deployment: loading }),
      getDeployment: silent,
    });
    const io = capturedIo(fake.env);
    setTimeout(() => io.abort.abort(), 300);
    expect(await runCli([...SCALE.slice(0, -1), "600"], io)).toBe(130);
    expect(lines(io.err()).at(-1)).toBe("interrupted; the deployment keeps scaling");
  });

  it.each([
    ["scale", SCALE, { scaleDeployment: silent }],
    ["deploy", DEPLOY, { applyDeployment: silent }],
  ] as const)(
    "Ctrl-C stops %s's own call when it gets no answer (130)",
    async (_, argv, routes) => {
      fake = await startFakeClusterService(routes);
      const io = capturedIo(fake.env);
      setTimeout(() => io.abort.abort(), 300);
      expect(await runCli([...argv], io)).toBe(130);
      expect(lines(io.err()).at(-1)).toBe("llmgw: interrupted");
    },
  );
});

describe("llmgw drain --wait", () => {
  const node = create(NodeSchema, {
    nodeId: "gpu-07-1f2e",
    hostname: "gpu-07",
    state: NodeState.READY,
    cordoned: true,
    draining: true,
  });
  const ON = ["gpu-07-1f2e"];
  const drainScript = [
    [
      replica("chat-0", { nodes: ON, waiting: "node-draining" }),
      replica("chat-1", { nodes: ["gpu-08"] }),
      replica("embed-0", { nodes: ["gpu-08"] }),
    ],
    [
      replica("chat-0", { nodes: ON, waiting: "node-draining" }),
      replica("chat-1", { nodes: ["gpu-08"] }),
      replica("chat-2", { nodes: ["gpu-09"], state: 1 }),
      replica("embed-0", { nodes: ["gpu-08"], state: 5 }),
    ],
    [
      replica("chat-0", { nodes: ON, draining: { reason: "node-draining", inFlight: 2 } }),
      replica("chat-1", { nodes: ["gpu-08"] }),
      replica("chat-2", { nodes: ["gpu-09"], endpoint: "10.0.0.9:1" }),
    ],
    [replica("chat-1", { nodes: ["gpu-08"] }), replica("chat-2", { nodes: ["gpu-09"] })],
  ];

  it("follows the node's replicas and their replacements until none is left on it", async () => {
    const polls = scripted(drainScript);
    fake = await startFakeClusterService({
      drainNode: (req) => {
        expect(req.node).toBe("gpu-07");
        return { node };
      },
      listReplicas: (req) => {
        expect([req.deployment, req.node]).toEqual(["", ""]);
        return { replicas: polls.next() };
      },
    });
    const io = capturedIo(fake.env);
    expect(await runCli(["drain", "gpu-07", "--wait"], io)).toBe(0);
    expect(io.out()).toBe("gpu-07 (gpu-07-1f2e): ready,draining\n");
    const got = lines(io.err());
    expect(got.slice(0, -1)).toEqual([
      "chat-0  on gpu-07-1f2e[0] (revision 1): ready,waiting (node-draining): serves until its replacement is ready",
      "chat-1  on gpu-08[0] (revision 1): ready",
      "gpu-07: 1 replica(s) left (1 waiting); 1 ready elsewhere",
      "chat-2  placed on gpu-09[0] (revision 1)",
      "chat-0  ready,draining (node-draining, 2 in flight)",
      "chat-2  ready at 10.0.0.9:1",
      "gpu-07: 1 replica(s) left (1 draining, 2 in flight); 2 ready elsewhere",
      "chat-0  stopped",
    ]);
    expect(got.at(-1)).toMatch(/^gpu-07: no replica left on the node after \d+s$/);
  });

  it("exits 1 on timeout, naming each replica still on the node", async () => {
    fake = await startFakeClusterService({
      drainNode: () => ({ node }),
      listReplicas: () => ({ replicas: drainScript[0] as Replica[] }),
    });
    const io = capturedIo(fake.env);
    expect(await runCli(["drain", "gpu-07", "--wait", "--timeout", "0"], io)).toBe(1);
    expect(lines(io.err()).at(-1)).toBe(
      "gpu-07: timed out after 0s with 1 replica(s) on the node: chat-0 ready,waiting (node-draining)",
    );
  });

  it("without --wait, drains and returns at once", async () => {
    let listed = 0;
    fake = await startFakeClusterService({
      drainNode: () => ({ node }),
      listReplicas: () => {
        listed++;
        return { replicas: [] };
      },
    });
    const io = capturedIo(fake.env);
    expect(await runCli(["drain", "gpu-07"], io)).toBe(0);
    expect(io.out()).toBe("gpu-07 (gpu-07-1f2e): ready,draining\n");
    expect(listed).toBe(0);
  });

  it.each([
    [["drain", "gpu-07", "--timeout", "5"], "--timeout applies only with --wait"],
    [
      ["drain", "gpu-07", "--wait", "--timeout=-1"],
      '--timeout must be whole seconds 0–86400, got "-1"',
    ],
    [["drain", "--wait"], "expected exactly one NODE"],
  ])("%j is a usage error", async (argv, message) => {
    const io = capturedIo({ LLMGW_ADMIN_TOKEN: "t" });
    expect(await runCli(argv, io)).toBe(2);
    expect(io.err()).toContain(message);
  });
});

describe("llmgw undeploy --wait and scale --wait", () => {
  it("undeploy follows each replica draining until none is left", async () => {
    const polls = scripted([
      [
        replica("chat-0", { draining: { reason: "deployment-deleted", inFlight: 1 } }),
        replica("chat-1", { draining: { reason: "deployment-deleted" } }),
      ],
      [replica("chat-1", { draining: { reason: "deployment-deleted", inFlight: 0 } })],
      [],
    ]);
    fake = await startFakeClusterService({
      deleteDeployment: () => ({}),
      listReplicas: (req) => {
        expect(req.deployment).toBe("chat");
        return { replicas: polls.next() };
      },
    });
    const io = capturedIo(fake.env);
    expect(await runCli(["undeploy", "chat", "--wait"], io)).toBe(0);
    expect(io.out()).toBe("deleted chat\n");
    const got = lines(io.err());
    expect(got.slice(0, -1)).toEqual([
      "chat-0  on node-a[0] (revision 1): ready,draining (deployment-deleted, 1 in flight)",
      "chat-1  on node-a[0] (revision 1): ready,draining (deployment-deleted)",
      "chat: 2 replica(s) left (2 draining, 1 in flight)",
      "chat-1  ready,draining (deployment-deleted, 0 in flight)",
      "chat-0  stopped",
      "chat: 1 replica(s) left (1 draining, 0 in flight)",
      "chat-1  stopped",
    ]);
    expect(got.at(-1)).toMatch(/^chat: every replica stopped after \d+s$/);
  });

  it("undeploy --wait exits 1 on timeout with what is left", async () => {
    fake = await startFakeClusterService({
      deleteDeployment: () => ({}),
      listReplicas: () => ({
        replicas: [replica("chat-0", { draining: { reason: "deployment-deleted" } })],
      }),
    });
    const io = capturedIo(fake.env);
    expect(await runCli(["undeploy", "chat", "--wait", "--timeout", "0"], io)).toBe(1);
    expect(lines(io.err()).at(-1)).toBe(
      "chat: timed out after 0s with 1 replica(s) left: chat-0 ready,draining (deployment-deleted)",
    );
  });

  it("scale --wait follows a scale-down until the removed replica is gone", async () => {
    const polls = scripted([
      status(1, 1, [
        replica("chat-0"),
        replica("chat-1", { draining: { reason: "scale-down", inFlight: 4 } }),
      ]),
      status(1, 1, [replica("chat-0")]),
    ]);
    fake = await startFakeClusterService({
      scaleDeployment: (req) => {
        expect([req.name, req.replicas]).toEqual(["chat", 1]);
        return { deployment: status(1, 1, [replica("chat-0"), replica("chat-1")]) };
      },
      getDeployment: () => ({ deployment: polls.next() }),
    });
    const io = capturedIo(fake.env);
    expect(await runCli(["scale", "chat", "1", "--wait"], io)).toBe(0);
    const got = lines(io.err());
    expect(got.slice(0, -1)).toEqual([
      "chat: scaling to 1 replica(s)",
      "chat-0  on node-a[0] (revision 1): ready",
      "chat-1  on node-a[0] (revision 1): ready,draining (scale-down, 4 in flight)",
      "chat: 1/1 ready at revision 1, 1 draining, 4 in flight",
      "chat-1  stopped",
    ]);
    expect(got.at(-1)).toMatch(/^chat: 1\/1 ready after \d+s$/);
  });
});

describe("leaving replicas and rollouts in the read commands", () => {
  const draining = replica("chat-0", {
    draining: { reason: "rollout", inFlight: 3, deadlineMs: Date.now() + 3_600_000 },
  });

  it("llmgw replicas shows the phase, reason and in-flight count in STATE", async () => {
    fake = await startFakeClusterService({ listReplicas: () => ({ replicas: [draining] }) });
    const io = capturedIo(fake.env);
    expect(await runCli(["replicas"], io)).toBe(0);
    expect(lines(io.out())[1]).toMatch(
      /^chat-0 +chat +ready,draining \(rollout, 3 in flight, 59m [0-5]\ds left\) +node-a\[0\] +- +\S+( \S+)?$/,
    );
  });

  it("llmgw replicas --json carries the retirement", async () => {
    fake = await startFakeClusterService({ listReplicas: () => ({ replicas: [draining] }) });
    const io = capturedIo(fake.env);
    expect(await runCli(["replicas", "--json"], io)).toBe(0);
    const retirement = JSON.parse(io.out()).replicas[0].retirement;
    expect(retirement).toMatchObject({
      reason: { code: "rollout" },
      phase: "RETIREMENT_PHASE_DRAINING",
      inFlight: 3,
    });
    expect(typeof retirement.drainDeadlineUnixMs).toBe("string");
  });

  it("llmgw deployments NAME shows the rollout; the list shows it in STATUS", async () => {
    const d = status(3, 2, [draining], {
      state: RolloutState.ROLLED_BACK,
      from: 2,
      to: 3,
      message: "chat-2 failed",
    });
    fake = await startFakeClusterService({
      getDeployment: (req) => {
        expect(req.name).toBe("chat");
        return { deployment: d };
      },
      listDeployments: () => ({ deployments: [d] }),
    });
    const one = capturedIo(fake.env);
    expect(await runCli(["deployments", "chat"], one)).toBe(0);
    expect(lines(one.out())[1]).toBe("  rolled back from r3 to r2: chat-2 failed");
    const all = capturedIo(fake.env);
    expect(await runCli(["deployments"], all)).toBe(0);
    expect(lines(all.out())[1]).toMatch(/ 0\/2 +3 +rolled back from r3 to r2: chat-2 failed$/);
  });
});

describe("callAgainAfterBreak (llmgw deploy's apply across a leader's death)", () => {
  const broken = () => new ConnectError("read ECONNRESET", Code.Internal);
  const calls = (answers: (Error | string)[]) => {
    let n = 0;
    return {
      call: async () => {
        const a = answers[Math.min(n++, answers.length - 1)] as Error | string;
        if (a instanceof Error) throw a;
        return a;
      },
      count: () => n,
    };
  };

  it("asks again when the connection broke mid-call, and says so once", async () => {
    const io = capturedIo({});
    const c = calls([
      broken(),
      new ConnectError("connect ECONNREFUSED", Code.Unavailable),
      "applied",
    ]);
    expect(await callAgainAfterBreak(io, "the apply", c.call)).toBe("applied");
    expect(c.count()).toBe(3);
    expect(io.err()).toBe(
      "the control plane's connection broke during the apply (ECONNRESET); asking again\n",
    );
  });

  it("fails at once when no control plane took the call, or one refused it", async () => {
    const refused = calls([new ConnectError("connect ECONNREFUSED", Code.Unavailable), "applied"]);
    await expect(callAgainAfterBreak(capturedIo({}), "the apply", refused.call)).rejects.toThrow(
      /ECONNREFUSED/,
    );
    expect(refused.count()).toBe(1);
    const denied = calls([
      broken(),
      new ConnectError("bad token", Code.PermissionDenied),
      "applied",
    ]);
    await expect(callAgainAfterBreak(capturedIo({}), "the apply", denied.call)).rejects.toThrow(
      /bad token/,
    );
    expect(denied.count()).toBe(2);
  });

  it("gives up once the break has lasted the window", async () => {
    const c = calls([broken()]);
    await expect(callAgainAfterBreak(capturedIo({}), "the apply", c.call, 600)).rejects.toThrow(
      /ECONNRESET/,
    );
    expect(c.count()).toBeGreaterThanOrEqual(2);
  });
});
