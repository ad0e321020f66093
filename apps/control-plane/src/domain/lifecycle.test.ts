// How replicas leave, on a real Cluster over SQLite: drains held open by routers' in-flight
// reports and by the engine's own load, make-before-break moves, rolling updates through the
// desired sets agents receive, rollback of a failed revision, and an agent leaving.
import { simulateInventory } from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import { schedule } from "@llmgw/scheduler";
import { describe, expect, it } from "vitest";
import type { ClusterStore } from "../store/types.js";
import type { ManualClock } from "../testing/manual-clock.js";
import { rankStatus } from "../testing/reports.js";
import { sqliteStoreEachTest } from "../testing/sqlite-fixture.js";
import { Cluster } from "./cluster.js";
import { DRAIN_SETTLE_MS, SILENT_ROUTER_MS } from "./drains.js";
import type { ReplicaStateName } from "./replica-state.js";

let store: ClusterStore;
let clock: ManualClock;
let routers: string[];

sqliteStoreEachTest("llmgw-lifecycle-", (f) => {
  ({ store, clock } = f);
  routers = ["r1"];
});

const spec = (input: Record<string, unknown>) =>
  parseDeploymentSpecOrThrow({
    engine: "sim",
    model: "org/model",
    name: "chat",
    gpuClass: "h100-80g",
    ...input,
  });

function setup(
  nodes = ["node-a", "node-b"],
  sim = "2xh100-80g",
  options: { rolloutProgressDeadlineMs?: number } = {},
) {
  const newCluster = () =>
    new Cluster({
      store,
      schedule,
      clock,
      heartbeatIntervalMs: 1000,
      unreachableAfterMs: 3000,
      nodeLostAfterMs: 10_000,
      rendezvousPortMin: 29_500,
      rendezvousPortMax: 29_999,
      connectedRouters: () => routers,
      ...options,
    });
  const cluster = newCluster();
  const ids = nodes.map(
    (hostname, i) =>
      cluster.register({
        inventory: simulateInventory(sim, {
          hostname,
          addresses: [`10.0.0.${i + 1}`],
          nowMs: clock.now(),
        }),
        advertiseAddress: `10.0.0.${i + 1}`,
        replicas: [],
      }).nodeId,
  );
  /** Every node reports every rank it was given as `state` (per replica id when a map). */
  const beat = (
    states: Record<string, ReplicaStateName> = {},
    load: Record<string, { running?: number; waiting?: number }> = {},
  ) => {
    for (const nodeId of ids) {
      cluster.heartbeat(nodeId, {
        gpus: [],
        problems: [],
        replicas: cluster.desiredSet(nodeId).assignments.map((x) =>
          rankStatus({
            replicaId: x.replicaId,
            rank: x.rank,
            state: states[x.replicaId] ?? "ready",
            apiPort: 8000 + Number(x.replicaId.split("-").at(-1)),
            revision: x.spec.revision,
            ...(load[x.replicaId] ? { load: load[x.replicaId] } : {}),
          }),
        ),
      });
    }
  };
  const desired = () =>
    ids.flatMap((id) =>
      cluster.desiredSet(id).assignments.map((a) => `${a.replicaId}@r${a.spec.revision}`),
    );
  const replicas = () =>
    cluster.listReplicas().map((r) => {
      const phase =
        r.retirement === undefined
          ? ""
          : r.retirement.phase === "waiting"
            ? ":waiting"
            : ":draining";
      return `${r.replicaId}@r${r.revision}${phase}`;
    });
  const routed = () =>
    cluster
      .routingMembership()
      .replicas.map((r) => `${r.id}:${r.state}`)
      .sort();
  const kinds = () => cluster.events.list({ limit: 500 }).map((e) => e.kind);
  /** `ms` pass, every node heartbeating and the cluster ticking each 30 s. */
  const wait = (ms: number) => {
    for (let left = ms; left > 0; left -= 30_000) {
      clock.advance(Math.min(30_000, left));
      beat();
      cluster.tick();
    }
  };
  let stateVersion = 0;
  /** `rounds` times: 30 s pass, then a router reports every draining replica idle. */
  const drainIdle = (rounds: number) => {
    for (let i = 0; i < rounds; i++) {
      wait(30_000);
      clock.advance(DRAIN_SETTLE_MS);
      for (const r of cluster.listReplicas())
        if (r.retirement?.phase === "draining")
          cluster.reportInFlight("r1", {
            epoch: "e1",
            stateVersion: ++stateVersion,
            draining: [{ replicaId: r.replicaId, inFlight: 0 }],
          });
    }
  };
  return { cluster, ids, beat, desired, replicas, routed, kinds, newCluster, wait, drainIdle };
}

describe("draining", () => {
  it("a scale-down keeps the replica running and routed as draining until routers report none in flight", () => {
    const { cluster, beat, desired, routed, replicas, kinds } = setup();
    cluster.applyDeployment(spec({ replicas: 2 }));
    beat();
    expect(routed()).toEqual(["chat-0:ready", "chat-1:ready"]);
    cluster.scaleDeployment("chat", 1);
    // Still on its node (the agent keeps the engine), routed as draining.
    expect(desired().sort()).toEqual(["chat-0@r1", "chat-1@r1"]);
    expect(replicas()).toEqual(["chat-0@r1", "chat-1@r1:draining"]);
    expect(routed()).toEqual(["chat-0:ready", "chat-1:draining"]);
    const view = cluster.listReplicas().find((r) => r.replicaId === "chat-1");
    expect(view?.retirement?.reason?.code).toBe("scale-down");
    expect(view?.retirement?.inFlight).toBeUndefined();

    cluster.reportInFlight("r1", {
      epoch: "e1",
      stateVersion: 1,
      draining: [{ replicaId: "chat-1", inFlight: 2 }],
    });
    expect(cluster.listReplicas()[1]?.retirement?.inFlight).toBe(2);
    clock.advance(DRAIN_SETTLE_MS);
    cluster.tick();
    expect(replicas()).toContain("chat-1@r1:draining");
    // Nothing in flight, but the settle time had passed only with the old report: a fresh
    // report of 0 ends it.
    cluster.reportInFlight("r1", {
      epoch: "e1",
      stateVersion: 1,
      draining: [{ replicaId: "chat-1", inFlight: 0 }],
    });
    expect(replicas()).toEqual(["chat-0@r1"]);
    expect(desired()).toEqual(["chat-0@r1"]);
    expect(kinds()).toContain("replica.drained");
  });

  it("waits for every connected router, and for the engine's own load", () => {
    routers = ["r1", "r2"];
    const { cluster, beat, replicas } = setup();
    cluster.applyDeployment(spec({ replicas: 1 }));
    beat();
    cluster.scaleDeployment("chat", 0);
    clock.advance(DRAIN_SETTLE_MS);
    cluster.reportInFlight("r1", {
      epoch: "e1",
      stateVersion: 1,
      draining: [{ replicaId: "chat-0", inFlight: 0 }],
    });
    expect(replicas()).toEqual(["chat-0@r1:draining"]);
    // r2 does not hold it as draining yet.
    cluster.reportInFlight("r2", { epoch: "e1", stateVersion: 1, draining: [] });
    expect(replicas()).toEqual(["chat-0@r1:draining"]);
    // The engine still runs a request (a router that lost its control plane sent it).
    beat({}, { "chat-0": { running: 1, waiting: 0 } });
    cluster.reportInFlight("r2", {
      epoch: "e1",
      stateVersion: 1,
      draining: [{ replicaId: "chat-0", inFlight: 0 }],
    });
    expect(replicas()).toEqual(["chat-0@r1:draining"]);
    beat({}, { "chat-0": { running: 0, waiting: 0 } });
    cluster.tick();
    expect(replicas()).toEqual([]);
  });

  it("goes by the engine for a router that never reports (an older release), not the deadline", () => {
    routers = ["r1", "old"];
    const { cluster, beat, replicas } = setup();
    cluster.applyDeployment(spec({ replicas: 1 }));
    beat({}, { "chat-0": { running: 0, waiting: 0 } });
    cluster.scaleDeployment("chat", 0);
    clock.advance(DRAIN_SETTLE_MS);
    cluster.reportInFlight("r1", {
      epoch: "e1",
      stateVersion: 1,
      draining: [{ replicaId: "chat-0", inFlight: 0 }],
    });
    expect(replicas()).toEqual(["chat-0@r1:draining"]);
    clock.advance(SILENT_ROUTER_MS - DRAIN_SETTLE_MS - 1);
    cluster.tick();
    expect(replicas()).toEqual(["chat-0@r1:draining"]);
    clock.advance(1);
    cluster.tick();
    expect(replicas()).toEqual([]);
  });

  it("stops a replica at its drain deadline, reporting what was still in flight", () => {
    const { cluster, beat, replicas } = setup();
    cluster.applyDeployment(spec({ replicas: 1, drainTimeoutSeconds: 5 }));
    beat();
    cluster.scaleDeployment("chat", 0);
    cluster.reportInFlight("r1", {
      epoch: "e1",
      stateVersion: 1,
      draining: [{ replicaId: "chat-0", inFlight: 3 }],
    });
    clock.advance(4_999);
    cluster.tick();
    expect(replicas()).toEqual(["chat-0@r1:draining"]);
    clock.advance(1);
    cluster.tick();
    expect(replicas()).toEqual([]);
    const event = cluster.events
      .list({ limit: 100 })
      .find((e) => e.kind === "replica.drain-timeout");
    expect(event?.message).toMatch(/after 5s with 3 request\(s\) in flight/);
  });

  it("undeploy: the model leaves routers at once, the replicas drain on their own spec", () => {
    const { cluster, beat, routed, desired, replicas } = setup();
    cluster.applyDeployment(spec({ replicas: 1 }));
    beat();
    cluster.deleteDeployment("chat");
    expect(cluster.routingMembership().models).toEqual([]);
    expect(routed()).toEqual(["chat-0:draining"]);
    expect(desired()).toEqual(["chat-0@r1"]);
    expect(replicas()).toEqual(["chat-0@r1:draining"]);
    clock.advance(DRAIN_SETTLE_MS);
    cluster.reportInFlight("r1", {
      epoch: "e1",
      stateVersion: 1,
      draining: [{ replicaId: "chat-0", inFlight: 0 }],
    });
    expect(replicas()).toEqual([]);
    expect(desired()).toEqual([]);
    expect(store.listDeploymentRevisions()).toEqual([]);
  });

  it("undeploy during a node drain or a rolling update: the replica waiting for its replacement drains too", () => {
    for (const during of ["node drain", "rolling update"]) {
      const { cluster, beat, replicas, desired, kinds } = setup();
      cluster.applyDeployment(spec({ replicas: 1 }));
      beat();
      if (during === "node drain") {
        cluster.drainNode(cluster.placements()[0]?.ranks[0]?.nodeId as string);
      } else {
        cluster.applyDeployment(spec({ replicas: 1, extraArgs: ["--seed", "2"] }));
      }
      beat({ "chat-1": "loading" });
      expect(replicas(), during).toEqual([
        "chat-0@r1:waiting",
        `chat-1@r${during === "node drain" ? 1 : 2}`,
      ]);
      cluster.deleteDeployment("chat");
      // Its replacement went with the deployment: nothing is left to wait for.
      expect(replicas(), during).toEqual(["chat-0@r1:draining"]);
      expect(
        cluster.listReplicas({ deployment: "chat" }).map((r) => r.retirement?.reason?.code),
        during,
      ).toEqual(["deployment-deleted"]);
      clock.advance(DRAIN_SETTLE_MS);
      cluster.reportInFlight("r1", {
        epoch: "e1",
        stateVersion: 1,
        draining: [{ replicaId: "chat-0", inFlight: 0 }],
      });
      expect(replicas(), during).toEqual([]);
      expect(desired(), during).toEqual([]);
      expect(kinds(), during).toContain("replica.drained");
    }
  });

  it("a deployment made again under a draining one's name never hands its spec to the old replicas", () => {
    const { cluster, beat, desired, replicas } = setup();
    cluster.applyDeployment(spec({ replicas: 1 }));
    beat();
    cluster.deleteDeployment("chat");
    cluster.applyDeployment(spec({ replicas: 1, extraArgs: ["--seed", "9"] }));
    expect(cluster.deploymentStatus("chat").spec.revision).toBe(2);
    expect(replicas()).toEqual(["chat-0@r1:draining", "chat-1@r2"]);
    expect(desired().sort()).toEqual(["chat-0@r1", "chat-1@r2"]);
    const old = cluster.desiredSet(cluster.placements()[0]?.ranks[0]?.nodeId as string);
    expect(old.assignments.find((a) => a.replicaId === "chat-0")?.spec.extraArgs).toEqual([]);
  });

  it("a drain survives a control-plane restart", () => {
    const { cluster, beat, newCluster } = setup();
    cluster.applyDeployment(spec({ replicas: 1 }));
    beat();
    cluster.deleteDeployment("chat");
    const again = newCluster();
    expect(again.listReplicas().map((r) => r.retirement?.phase)).toEqual(["draining"]);
    clock.advance(DRAIN_SETTLE_MS);
    again.reportInFlight("r1", {
      epoch: "e1",
      stateVersion: 1,
      draining: [{ replicaId: "chat-0", inFlight: 0 }],
    });
    expect(again.listReplicas()).toEqual([]);
  });
});

describe("make before break", () => {
  it("a node drain starts the replacement and drains the old replica once it is ready", () => {
    const { cluster, ids, beat, replicas, routed } = setup();
    cluster.applyDeployment(spec({ replicas: 1 }));
    beat();
    const onA = cluster.placements()[0]?.ranks[0]?.nodeId === ids[0];
    cluster.drainNode(onA ? "node-a" : "node-b");
    expect(replicas()).toEqual(["chat-0@r1:waiting", "chat-1@r1"]);
    // Waiting still takes requests; the replacement is loading.
    beat({ "chat-1": "loading" });
    expect(routed()).toEqual(["chat-0:ready"]);
    beat();
    expect(replicas()).toEqual(["chat-0@r1:draining", "chat-1@r1"]);
    expect(routed()).toEqual(["chat-0:draining", "chat-1:ready"]);
  });

  it("a rolling update replaces one replica at a time, and never restarts one in place", () => {
    const { cluster, beat, desired, replicas, routed } = setup();
    cluster.applyDeployment(spec({ replicas: 2 }));
    beat();
    cluster.applyDeployment(spec({ replicas: 2, extraArgs: ["--seed", "2"] }));
    expect(cluster.deploymentStatus("chat").rollout?.state).toBe("in-progress");
    // The old replicas keep their revision's spec: no agent restarts them.
    expect(desired().sort()).toEqual(["chat-0@r1", "chat-1@r1", "chat-2@r2"]);
    expect(replicas()).toEqual(["chat-0@r1:waiting", "chat-1@r1", "chat-2@r2"]);
    beat({ "chat-2": "loading" });
    expect(routed()).toEqual(["chat-0:ready", "chat-1:ready"]);
    beat();
    expect(replicas()).toEqual(["chat-0@r1:draining", "chat-1@r1", "chat-2@r2"]);
    clock.advance(DRAIN_SETTLE_MS);
    cluster.reportInFlight("r1", {
      epoch: "e1",
      stateVersion: 1,
      draining: [{ replicaId: "chat-0", inFlight: 0 }],
    });
    // A drained replica's id is not reused in the same plan.
    expect(replicas()).toEqual(["chat-1@r1:waiting", "chat-2@r2", "chat-3@r2"]);
    beat();
    clock.advance(DRAIN_SETTLE_MS);
    cluster.reportInFlight("r1", {
      epoch: "e1",
      stateVersion: 1,
      draining: [{ replicaId: "chat-1", inFlight: 0 }],
    });
    expect(replicas()).toEqual(["chat-2@r2", "chat-3@r2"]);
    const status = cluster.deploymentStatus("chat");
    expect(status.rollout?.state).toBe("complete");
    // The old revision's spec is kept only while a replica runs it.
    expect(store.listDeploymentRevisions().map((r) => r.revision)).toEqual([2]);
    expect([status.rollout?.fromRevision, status.rollout?.toRevision]).toEqual([1, 2]);
  });

  it("the rollout's message counts the replicas replaced at a time (maxSurge + maxUnavailable)", () => {
    const { cluster, beat } = setup();
    const limits = { replicas: 2, maxSurge: 0, maxUnavailable: 1 };
    cluster.applyDeployment(spec(limits));
    beat();
    cluster.applyDeployment(spec({ ...limits, extraArgs: ["--seed", "2"] }));
    expect(cluster.deploymentStatus("chat").rollout?.message).toBe(
      "replacing 2 replica(s) at revision 1, 1 at a time",
    );
  });

  it("a new revision that only changes routing keeps every replica", () => {
    const { cluster, beat, replicas } = setup();
    cluster.applyDeployment(spec({ replicas: 2 }));
    beat();
    cluster.applyDeployment(spec({ replicas: 2, routingPolicy: "round-robin" }));
    expect(replicas()).toEqual(["chat-0@r2", "chat-1@r2"]);
    expect(cluster.deploymentStatus("chat").rollout).toBeUndefined();
  });

  it("a failed new revision rolls back; the old replicas serve throughout", () => {
    const { cluster, beat, replicas, routed, kinds } = setup();
    cluster.applyDeployment(spec({ replicas: 2 }));
    beat();
    cluster.applyDeployment(spec({ replicas: 2, extraArgs: ["--fail-load"] }));
    beat({ "chat-2": "failed" });
    const status = cluster.deploymentStatus("chat");
    expect(status.rollout?.state).toBe("rolled-back");
    expect(status.rollout?.message).toMatch(/revision 2 failed \(chat-2/);
    expect(status.spec.extraArgs).toEqual([]);
    expect(status.spec.revision).toBe(3);
    // The old replicas are kept at the rolled-back revision (same engines); the failed one went.
    expect(replicas()).toEqual(["chat-0@r3", "chat-1@r3"]);
    expect(routed()).toEqual(["chat-0:ready", "chat-1:ready"]);
    expect(kinds()).toContain("deployment.rolled-back");
  });

  it("a rollout is complete only once the new revision serves: an old replica dying mid-update still rolls back", () => {
    const { cluster, beat, replicas } = setup();
    cluster.applyDeployment(spec({ replicas: 1 }));
    beat();
    cluster.applyDeployment(spec({ replicas: 1, extraArgs: ["--fail-load"] }));
    // The old replica's engine crashes while its replacement loads: it serves nothing, so it
    // goes at once, and no replica of revision 1 is left.
    beat({ "chat-0": "failed", "chat-1": "loading" });
    expect(replicas().map((r) => r.replace(/^chat-\d+/, ""))).toEqual(["@r2"]);
    expect(cluster.deploymentStatus("chat").rollout?.state).toBe("in-progress");
    // Kept for a rollback, though no replica runs it any more.
    expect(store.listDeploymentRevisions().map((r) => r.revision)).toEqual([1, 2]);
    beat({ "chat-1": "failed" });
    const status = cluster.deploymentStatus("chat");
    expect([status.rollout?.state, status.spec.revision, status.spec.extraArgs]).toEqual([
      "rolled-back",
      3,
      [],
    ]);
  });

  it("maxUnavailable: the rollout stays in progress while the new replica loads, and completes once it serves", () => {
    const { cluster, beat, replicas } = setup();
    cluster.applyDeployment(spec({ replicas: 1, maxUnavailable: 1 }));
    beat();
    cluster.applyDeployment(spec({ replicas: 1, maxUnavailable: 1, extraArgs: ["--fail-load"] }));
    beat({ "chat-1": "loading" });
    // The old replica drains at once (maxUnavailable 1) and goes.
    clock.advance(DRAIN_SETTLE_MS);
    cluster.reportInFlight("r1", {
      epoch: "e1",
      stateVersion: 1,
      draining: [{ replicaId: "chat-0", inFlight: 0 }],
    });
    expect(replicas().map((r) => r.replace(/^chat-\d+/, ""))).toEqual(["@r2"]);
    expect(cluster.deploymentStatus("chat").rollout?.state).toBe("in-progress");
    beat({ "chat-1": "failed" });
    expect(cluster.deploymentStatus("chat").rollout?.state).toBe("rolled-back");

    // The same update, its new replica turning ready: complete then (the report reconciles).
    cluster.applyDeployment(spec({ replicas: 1, maxUnavailable: 1, extraArgs: ["--seed", "2"] }));
    beat();
    const status = cluster.deploymentStatus("chat");
    expect([status.rollout?.state, status.readyReplicas]).toEqual(["complete", 1]);
  });

  it("a routing-only change applied mid-update moves the update on: a failure still rolls back", () => {
    const { cluster, beat } = setup();
    cluster.applyDeployment(spec({ replicas: 1 }));
    beat();
    cluster.applyDeployment(spec({ replicas: 1, extraArgs: ["--fail-load"] }));
    beat({ "chat-1": "loading" });
    cluster.applyDeployment(
      spec({ replicas: 1, extraArgs: ["--fail-load"], routingPolicy: "round-robin" }),
    );
    const moved = cluster.deploymentStatus("chat").rollout;
    expect([moved?.state, moved?.fromRevision, moved?.toRevision]).toEqual(["in-progress", 1, 3]);
    beat({ "chat-1": "failed" });
    const status = cluster.deploymentStatus("chat");
    expect([status.rollout?.state, status.rollout?.toRevision, status.spec.extraArgs]).toEqual([
      "rolled-back",
      3,
      [],
    ]);
  });
});

describe("a rolling update that cannot place its new revision", () => {
  const DEADLINE = 10 * 60_000;
  /** One replica of revision 1 serving, then an update to a GPU class no node has. */
  function stalled(options: { rolloutProgressDeadlineMs?: number } = {}) {
    const s = setup(["node-a", "node-b"], "2xh100-80g", options);
    s.cluster.applyDeployment(spec({ replicas: 1 }));
    s.beat();
    s.cluster.applyDeployment(spec({ replicas: 1, gpuClass: "l40s-45g" }));
    s.beat();
    return s;
  }

  it("of a deployment already short of room completes once every placed replica runs it", () => {
    // Three replicas wanted, room for two: the update replaces both, and the third fits no
    // better after it. Going back would place no more than going on.
    const s = setup(["node-a"], "2xh100-80g");
    const { cluster, beat, kinds, wait, drainIdle } = s;
    cluster.applyDeployment(spec({ replicas: 3, maxUnavailable: 1 }));
    beat();
    expect(cluster.deploymentStatus("chat").readyReplicas).toBe(2);
    cluster.applyDeployment(spec({ replicas: 3, maxUnavailable: 1, extraArgs: ["--seed", "2"] }));
    drainIdle(6);
    expect(s.replicas().map((r) => r.replace(/^chat-\d+/, ""))).toEqual(["@r2", "@r2"]);
    wait(2 * DEADLINE);
    expect(kinds()).not.toContain("deployment.rolled-back");
    const status = cluster.deploymentStatus("chat");
    expect([status.spec.revision, status.rollout?.state, status.rollout?.message]).toEqual([
      2,
      "complete",
      "every placed replica runs revision 2; 1 cannot be placed",
    ]);
  });
  it("on a full mixed fleet, of a deployment that names no GPU class, completes by dips", () => {
    // Both H100 nodes full (no-free-gpus), the L40S node too small for a replica
    // (exceeds-node): each old replica's GPUs, once freed, take its replacement.
    const s = setup(["node-a", "node-b"], "2xh100-80g");
    const { cluster, ids, beat, kinds, wait, drainIdle } = s;
    ids.push(
      cluster.register({
        inventory: simulateInventory("1xl40s-45g", {
          hostname: "node-c",
          addresses: ["10.0.0.3"],
          nowMs: clock.now(),
        }),
        advertiseAddress: "10.0.0.3",
        replicas: [],
      }).nodeId,
    );
    const mixed = { replicas: 2, gpuClass: undefined, tensorParallel: 2, nodesPerReplica: 1 };
    cluster.applyDeployment(spec(mixed));
    beat();
    expect(cluster.deploymentStatus("chat").readyReplicas).toBe(2);
    cluster.applyDeployment(spec({ ...mixed, extraArgs: ["--seed", "2"] }));
    drainIdle(6);
    wait(2 * DEADLINE);
    expect(kinds()).toContain("deployment.capacity-dip");
    expect(kinds()).not.toContain("deployment.rolled-back");
    const status = cluster.deploymentStatus("chat");
    expect([status.spec.revision, status.rollout?.state, status.readyReplicas]).toEqual([
      2,
      "complete",
      2,
    ]);
    expect(s.replicas().map((r) => r.replace(/^chat-\d+/, ""))).toEqual(["@r2", "@r2"]);
  });

  it("does not roll back while a dip's replica drains for longer than the deadline", () => {
    // One node, full: the update dips one replica, whose engine stays busy for 25 minutes
    // (its drain timeout is 30). The room is coming all that time; the deadline counts no
    // progress from when it came.
    const s = setup(["node-a"], "2xh100-80g");
    const { cluster, beat, kinds } = s;
    const busy = new Set<string>();
    const wait = (ms: number) => {
      for (let left = ms; left > 0; left -= 30_000) {
        clock.advance(Math.min(30_000, left));
        const load: Record<string, { running: number }> = {};
        for (const r of cluster.listReplicas())
          if (r.retirement?.phase === "draining") {
            busy.add(r.replicaId);
            load[r.replicaId] = { running: 1 };
          }
        beat({}, load);
        cluster.tick();
      }
    };
    const chat = { replicas: 2, drainTimeoutSeconds: 1800 };
    cluster.applyDeployment(spec(chat));
    beat();
    expect(cluster.deploymentStatus("chat").readyReplicas).toBe(2);
    cluster.applyDeployment(spec({ ...chat, extraArgs: ["--seed", "2"] }));
    wait(25 * 60_000);
    expect(kinds()).toContain("deployment.capacity-dip");
    expect(busy.size).toBe(1);
    expect(kinds()).not.toContain("deployment.rolled-back");
    expect(cluster.deploymentStatus("chat").rollout?.state).toBe("in-progress");
    // The engine goes idle: the drain ends and the update goes on.
    s.drainIdle(6);
    expect(kinds()).not.toContain("deployment.rolled-back");
    const status = cluster.deploymentStatus("chat");
    expect([status.spec.revision, status.rollout?.state, status.readyReplicas]).toEqual([
      2,
      "complete",
      2,
    ]);
  });

  it("rolls back to the previous spec once the deadline passes, and not before", () => {
    const { cluster, replicas, kinds, wait } = stalled();
    expect(cluster.deploymentStatus("chat").rollout?.state).toBe("in-progress");
    wait(DEADLINE - 1);
    expect(cluster.deploymentStatus("chat").rollout?.state).toBe("in-progress");
    expect(kinds()).not.toContain("deployment.rolled-back");
    // The new revision fits no node, so freeing the old replica's GPUs would not help: it
    // keeps serving all along, undrained.
    expect(kinds()).not.toContain("deployment.capacity-dip");
    expect(cluster.deploymentStatus("chat").readyReplicas).toBe(1);
    wait(1);
    const status = cluster.deploymentStatus("chat");
    expect([status.rollout?.state, status.spec.revision, status.spec.gpuClass]).toEqual([
      "rolled-back",
      3,
      "h100-80g",
    ]);
    expect(status.rollout?.message).toMatch(
      /^revision 2 could not place 1 replica for 10m \(.+\); back to the spec of revision 1 as revision 3$/,
    );
    const event = cluster.events
      .list({ limit: 500 })
      .find((e) => e.kind === "deployment.rolled-back");
    expect(event?.message).toBe(status.rollout?.message);
    expect(replicas().map((r) => r.replace(/^chat-\d+/, ""))).toEqual(["@r3"]);
    expect(cluster.deploymentStatus("chat").unschedulable).toEqual([]);
  });

  it("completes normally when capacity comes before the deadline", () => {
    const { cluster, ids, replicas, kinds, wait } = stalled();
    wait(DEADLINE - 60_000);
    ids.push(
      cluster.register({
        inventory: simulateInventory("1xl40s-45g", {
          hostname: "node-c",
          addresses: ["10.0.0.3"],
          nowMs: clock.now(),
        }),
        advertiseAddress: "10.0.0.3",
        replicas: [],
      }).nodeId,
    );
    wait(DEADLINE);
    const status = cluster.deploymentStatus("chat");
    expect([status.rollout?.state, status.spec.revision]).toEqual(["complete", 2]);
    expect(replicas().map((r) => r.replace(/^chat-\d+/, ""))).toEqual(["@r2"]);
    expect(kinds()).not.toContain("deployment.rolled-back");
    // The next update that cannot place its replica gets a whole deadline of its own.
    cluster.applyDeployment(spec({ replicas: 1, gpuClass: "a100-40g" }));
    wait(DEADLINE - 30_000);
    expect(cluster.deploymentStatus("chat").rollout?.state).toBe("in-progress");
    wait(30_000);
    const back = cluster.deploymentStatus("chat");
    expect([back.rollout?.state, back.spec.revision, back.spec.gpuClass]).toEqual([
      "rolled-back",
      4,
      "l40s-45g",
    ]);
  });

  it.each([1, 2])(
    "a second update while the first cannot place its replicas goes on from the revision that served, and rolls back to it (%i replicas)",
    (n) => {
      const s = setup();
      const { cluster, beat, replicas, wait } = s;
      cluster.applyDeployment(spec({ replicas: n }));
      beat();
      // Revision 2 fits no node; before its deadline the operator tries revision 3, which
      // fails. (With one replica, the only old one is waiting: the update still rolls.)
      cluster.applyDeployment(spec({ replicas: n, gpuClass: "l40s-45g" }));
      wait(DEADLINE / 2);
      cluster.applyDeployment(spec({ replicas: n, extraArgs: ["--fail-load"] }));
      const rollout = cluster.deploymentStatus("chat").rollout;
      expect([rollout?.state, rollout?.fromRevision, rollout?.toRevision]).toEqual([
        "in-progress",
        1,
        3,
      ]);
      beat({ [`chat-${n}`]: "failed" });
      const status = cluster.deploymentStatus("chat");
      expect([status.rollout?.state, status.spec.revision]).toEqual(["rolled-back", 4]);
      expect(status.rollout?.message).toMatch(/^revision 3 failed \(chat-\d+: /);
      // Back to what served, not to revision 2 that never placed a replica.
      expect([status.spec.gpuClass, status.spec.extraArgs]).toEqual(["h100-80g", []]);
      wait(DEADLINE);
      expect(replicas().map((r) => r.replace(/^chat-\d+/, ""))).toEqual(Array(n).fill("@r4"));
      expect(cluster.deploymentStatus("chat").unschedulable).toEqual([]);
    },
  );

  it.each([
    { deadlineMs: 0, after: 10 * DEADLINE, state: "in-progress", message: undefined },
    {
      deadlineMs: 90_000,
      after: 90_000,
      state: "rolled-back",
      message: /^revision 2 could not place 1 replica for 90s \(/,
    },
  ])(
    "with a deadline of $deadlineMs ms: $state after $after ms",
    ({ deadlineMs, after, state, message }) => {
      const { cluster, wait } = stalled({ rolloutProgressDeadlineMs: deadlineMs });
      wait(after);
      const rollout = cluster.deploymentStatus("chat").rollout;
      expect(rollout?.state).toBe(state);
      if (message !== undefined) expect(rollout?.message).toMatch(message);
    },
  );
});

describe("an agent leaving with its engines", () => {
  it("drains its node, then ends its own drain when it is back, never an operator's", () => {
    const { cluster, ids, beat } = setup(["node-a", "node-b"], "1xh100-80g");
    cluster.applyDeployment(spec({ replicas: 1 }));
    beat();
    const home = cluster.placements()[0]?.ranks[0]?.nodeId as string;
    // Its replica waits there for its replacement on the other node.
    expect(cluster.setNodeLeaving(home, true)).toBe(1);
    expect(cluster.getNode(home).draining).toBe(true);
    cluster.setNodeLeaving(home, false);
    expect(cluster.getNode(home).draining).toBe(false);
    const other = ids.find((id) => id !== home) as string;
    cluster.drainNode(other);
    cluster.setNodeLeaving(other, false);
    expect(cluster.getNode(other).draining).toBe(true);
  });

  it("ends its own leave when the next agent registers again first, then says it is back", () => {
    const { cluster } = setup(["node-a"], "1xh100-80g");
    const inventory = () =>
      simulateInventory("1xh100-80g", {
        hostname: "node-x",
        addresses: ["10.0.0.9"],
        nowMs: clock.now(),
      });
    const identity = cluster.register({
      inventory: inventory(),
      advertiseAddress: "10.0.0.9",
      replicas: [],
    });
    cluster.setNodeLeaving(identity.nodeId, true);
    // The next agent: Register with its saved identity, then SetLeaving(false).
    clock.advance(5_000);
    const again = cluster.register({
      inventory: inventory(),
      advertiseAddress: "10.0.0.9",
      previousNodeId: identity.nodeId,
      previousNodeCredential: identity.nodeCredential,
      replicas: [],
    });
    expect(again.nodeId).toBe(identity.nodeId);
    cluster.setNodeLeaving(identity.nodeId, false);
    const node = cluster.getNode(identity.nodeId);
    expect([node.cordoned, node.draining]).toEqual([false, false]);
    // An operator's drain survives the same.
    cluster.drainNode(identity.nodeId);
    cluster.register({
      inventory: inventory(),
      advertiseAddress: "10.0.0.9",
      previousNodeId: identity.nodeId,
      previousNodeCredential: again.nodeCredential,
      replicas: [],
    });
    cluster.setNodeLeaving(identity.nodeId, false);
    expect(cluster.getNode(identity.nodeId).draining).toBe(true);
  });
});
