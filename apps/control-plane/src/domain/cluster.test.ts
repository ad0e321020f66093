import { join } from "node:path";
import { simulateInventory } from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import { type SchedulerNode, schedule } from "@llmgw/scheduler";
import { describe, expect, it } from "vitest";
import { inventoryRecord } from "../convert/inventory-record.js";
import { ControlPlaneError } from "../errors.js";
import type { ClusterStore } from "../store/types.js";
import { fillDisk } from "../testing/full-disk.js";
import type { ManualClock } from "../testing/manual-clock.js";
import { gpuReading, rankStatus } from "../testing/reports.js";
import { sqliteStoreEachTest } from "../testing/sqlite-fixture.js";
import { Cluster, type ClusterOptions } from "./cluster.js";
import type { RankStatus } from "./views.js";

let dir: string;
let store: ClusterStore;
let clock: ManualClock;

const INTERVAL = 1_000;
function newCluster(
  log?: (line: string) => void,
  options?: Partial<
    Pick<
      ClusterOptions,
      | "maxNodes"
      | "unwrittenEventsKept"
      | "maxApiKeys"
      | "store"
      | "readOnly"
      | "inventories"
      | "onReconciled"
      | "moveFailedAfterMs"
    >
  >,
): Cluster {
  return new Cluster({
    store,
    ...options,
    log,
    schedule,
    clock,
    heartbeatIntervalMs: INTERVAL,
    unreachableAfterMs: 3 * INTERVAL,
    nodeLostAfterMs: 10_000,
    rendezvousPortMin: 29_500,
    rendezvousPortMax: 29_999,
  });
}

function join_(
  cluster: Cluster,
  hostname: string,
  sim: string,
  address: string,
  previous?: { nodeId: string; nodeCredential?: string },
) {
  return cluster.register({
    inventory: simulateInventory(sim, { hostname, addresses: [address], nowMs: clock.now() }),
    advertiseAddress: address,
    previousNodeId: previous?.nodeId,
    previousNodeCredential: previous?.nodeCredential,
    replicas: [],
  });
}

const spec = (input: Record<string, unknown>) =>
  parseDeploymentSpecOrThrow({
    engine: "vllm",
    model: "org/model",
    gpuClass: "h100-80g",
    ...input,
  });

const placedOn = (cluster: Cluster, deployment: string) =>
  cluster
    .placements()
    .filter((p) => p.deployment === deployment)
    .flatMap((p) => p.ranks.map((r) => r.nodeId))
    .sort();

sqliteStoreEachTest("llmgw-cluster-", (f) => {
  ({ dir, store, clock } = f);
});

describe("Cluster", () => {
  it("places a deployment and hands each node its desired set with GPU uuids", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "2xh100-80g", "10.0.0.1");
    const b = join_(cluster, "node-b", "2xh100-80g", "10.0.0.2");
    const before = cluster.desiredSet(a.nodeId).generation;
    const { status, changed } = cluster.applyDeployment(
      spec({ name: "chat", replicas: 2, tensorParallel: 2 }),
    );
    expect(changed).toBe(true);
    expect(status.replicas.map((r) => r.replicaId)).toEqual(["chat-0", "chat-1"]);
    expect(placedOn(cluster, "chat")).toEqual([a.nodeId, b.nodeId].sort());
    const desired = cluster.desiredSet(a.nodeId);
    expect(desired.generation).toBeGreaterThan(before);
    expect(desired.assignments).toHaveLength(1);
    const [assignment] = desired.assignments;
    expect(assignment?.gpuIndices).toEqual([0, 1]);
    expect(assignment?.gpuUuids.every((u) => u.startsWith("GPU-"))).toBe(true);
    expect(assignment?.spec.revision).toBe(1);
    expect(assignment?.world?.nnodes).toBe(1);
    // Applying the same spec again changes nothing.
    expect(
      cluster.applyDeployment(spec({ name: "chat", replicas: 2, tensorParallel: 2 })).changed,
    ).toBe(false);
    expect(cluster.desiredSet(a.nodeId).generation).toBe(desired.generation);
  });

  it("gang-places a two-node replica on one fabric with a rendezvous port on rank 0", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "1xh100-80g@ib-a", "10.0.0.1");
    const b = join_(cluster, "node-b", "1xh100-80g@ib-a", "10.0.0.2");
    cluster.applyDeployment(
      spec({ name: "big", engine: "sim", tensorParallel: 2, nodesPerReplica: 2 }),
    );
    const [p] = cluster.placements();
    expect(p?.ranks.map((r) => r.nodeId).sort()).toEqual([a.nodeId, b.nodeId].sort());
    expect(p?.fabricId).toBe("ib-a");
    expect(p?.rendezvousPort).toBe(29_500);
    const rank0Node = p?.ranks[0]?.nodeId as string;
    const rank0Address = rank0Node === a.nodeId ? "10.0.0.1" : "10.0.0.2";
    for (const id of [a.nodeId, b.nodeId]) {
      const [assignment] = cluster.desiredSet(id).assignments;
      expect(assignment?.world).toMatchObject({ nnodes: 2, rank0Address, rendezvousPort: 29_500 });
      expect(assignment?.world?.nodeIds).toEqual(p?.ranks.map((r) => r.nodeId));
    }
  });

  it("gives two-node replicas placed in one pass distinct rendezvous ports on a shared rank 0 node", () => {
    const cluster = newCluster();
    join_(cluster, "node-a", "2xh100-80g@ib-a", "10.0.0.1");
    join_(cluster, "node-b", "2xh100-80g@ib-a", "10.0.0.2");
    cluster.applyDeployment(
      spec({ name: "big", engine: "sim", tensorParallel: 2, nodesPerReplica: 2, replicas: 2 }),
    );
    const placed = cluster.placements();
    expect(placed).toHaveLength(2);
    const byRank0 = new Map<string, number[]>();
    for (const p of placed) {
      const rank0 = p.ranks[0]?.nodeId as string;
      byRank0.set(rank0, [...(byRank0.get(rank0) ?? []), p.rendezvousPort as number]);
    }
    for (const ports of byRank0.values()) expect(new Set(ports).size).toBe(ports.length);
  });

  it("keeps replicas on an unreachable node and moves them once it is lost", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    cluster.applyDeployment(spec({ name: "chat" }));
    expect(placedOn(cluster, "chat")).toEqual([a.nodeId]);
    const b = join_(cluster, "node-b", "1xh100-80g", "10.0.0.2");

    clock.advance(3 * INTERVAL);
    cluster.heartbeat(b.nodeId, { gpus: [], replicas: [], problems: [] });
    cluster.tick();
    expect(cluster.nodeState(a.nodeId)).toBe("unreachable");
    expect(placedOn(cluster, "chat")).toEqual([a.nodeId]);

    clock.advance(10_000);
    cluster.heartbeat(b.nodeId, { gpus: [], replicas: [], problems: [] });
    cluster.tick();
    expect(cluster.nodeState(a.nodeId)).toBe("lost");
    expect(placedOn(cluster, "chat")).toEqual([b.nodeId]);
    const kinds = cluster.events.list({ limit: 100 }).map((e) => `${e.kind} ${e.subject}`);
    expect(kinds).toContain(`node.unreachable ${a.nodeId}`);
    expect(kinds).toContain(`node.lost ${a.nodeId}`);
    expect(kinds.indexOf(`node.unreachable ${a.nodeId}`)).toBeLessThan(
      kinds.indexOf(`node.lost ${a.nodeId}`),
    );

    // The lost node comes back: ready again, but its old replica stays where it moved.
    cluster.heartbeat(a.nodeId, { gpus: [], replicas: [], problems: [] });
    expect(cluster.nodeState(a.nodeId)).toBe("ready");
    expect(placedOn(cluster, "chat")).toEqual([b.nodeId]);
  });

  it("records each node's liveness when it changes, never per heartbeat, for followers to show", () => {
    const writes: string[] = [];
    const counted: ClusterStore = {
      ...store,
      putNode: (r) => {
        writes.push(`node ${r.hostname} ${r.state}`);
        store.putNode(r);
      },
      putNodeState: (id, state, sinceMs) => {
        writes.push(`state ${id} ${state} ${sinceMs}`);
        store.putNodeState(id, state, sinceMs);
      },
    };
    const joinedAt = clock.now();
    const cluster = newCluster(undefined, { store: counted });
    const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    expect(writes).toEqual(["node node-a ready"]);
    for (let i = 0; i < 3; i++) {
      clock.advance(INTERVAL);
      cluster.heartbeat(a.nodeId, { gpus: [], replicas: [], problems: [] });
      cluster.tick();
    }
    expect(writes).toEqual(["node node-a ready"]);
    clock.advance(3 * INTERVAL);
    cluster.tick();
    const silentAt = clock.now();
    cluster.heartbeat(a.nodeId, { gpus: [], replicas: [], problems: [] });
    expect(writes.slice(1)).toEqual([
      `state ${a.nodeId} unreachable ${silentAt}`,
      `state ${a.nodeId} ready ${silentAt}`,
    ]);

    // A follower's read-only copy shows what was recorded; a leader starting does not trust it.
    expect(store.listNodes()[0]).toMatchObject({ state: "ready", stateSinceMs: silentAt });
    expect(joinedAt).toBeLessThan(silentAt);
    clock.advance(5 * INTERVAL);
    const readOnly = newCluster(undefined, { readOnly: true });
    expect(readOnly.getNode(a.nodeId).state).toBe("ready");
    expect(newCluster().nodeState(a.nodeId)).toBe("unreachable");
  });

  it("keeps node states in memory while the store is full and writes them at a tick once it frees", () => {
    const lines: string[] = [];
    const cluster = newCluster((line) => lines.push(line));
    const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    clock.advance(3 * INTERVAL);
    const free = fillDisk(join(dir, "state.db"));
    cluster.tick();
    expect(cluster.nodeState(a.nodeId)).toBe("unreachable");
    // The heartbeat that brings it back is answered though the state cannot be written.
    expect(cluster.heartbeat(a.nodeId, { gpus: [], replicas: [], problems: [] }).generation).toBe(
      cluster.desiredSet(a.nodeId).generation,
    );
    expect(cluster.nodeState(a.nodeId)).toBe("ready");
    expect(lines.some((l) => l.startsWith("node states kept in memory only"))).toBe(true);
    expect(store.listNodes()[0]?.state).toBe("ready");
    expect(store.listNodes()[0]?.stateSinceMs).toBeLessThan(clock.now());
    free();
    cluster.tick();
    expect(store.listNodes()[0]).toMatchObject({ state: "ready", stateSinceMs: clock.now() });
  });

  it("takes another cluster's decoded inventory when the stored bytes are the same", () => {
    const first = newCluster();
    const a = join_(first, "node-a", "1xh100-80g", "10.0.0.1");
    const b = join_(first, "node-b", "1xh100-80g", "10.0.0.2");
    const inventoryOf = (c: Cluster, id: string) =>
      c.nodeSnapshots().find((n) => n.id === id)?.inventory;
    const lookup = first.inventories();
    // node-b registers again with another inventory: first's decoded one no longer matches.
    const second = newCluster();
    join_(second, "node-b", "2xh100-80g", "10.0.0.2", b);
    const third = newCluster(undefined, { inventories: lookup });
    expect(inventoryOf(third, a.nodeId)).toBe(inventoryOf(first, a.nodeId));
    expect(inventoryOf(third, b.nodeId)).not.toBe(inventoryOf(first, b.nodeId));
    expect(inventoryOf(third, b.nodeId)?.gpus).toHaveLength(2);
  });

  it("hands the scheduler the same object for a node that did not change, a new one for a node that did", () => {
    const seen: (readonly SchedulerNode[])[] = [];
    const cluster = new Cluster({
      store,
      schedule: (input) => {
        seen.push(input.nodes);
        return schedule(input);
      },
      clock,
      heartbeatIntervalMs: INTERVAL,
      unreachableAfterMs: 3 * INTERVAL,
      nodeLostAfterMs: 10_000,
      rendezvousPortMin: 29_500,
      rendezvousPortMax: 29_999,
    });
    const a = join_(cluster, "node-a", "2xh100-80g", "10.0.0.1");
    join_(cluster, "node-b", "2xh100-80g", "10.0.0.2");
    cluster.applyDeployment(spec({ name: "chat", replicas: 1 }));
    const before = seen.at(-1) as readonly SchedulerNode[];
    cluster.applyDeployment(spec({ name: "chat", replicas: 2 }));
    const same = seen.at(-1) as readonly SchedulerNode[];
    expect(same).not.toBe(before);
    expect(same[0]).toBe(before[0]);
    expect(same[1]).toBe(before[1]);
    cluster.cordonNode(a.nodeId);
    const cordoned = seen.at(-1) as readonly SchedulerNode[];
    expect(cordoned.find((n) => n.id === a.nodeId)).not.toBe(before[0]);
    expect(cordoned.find((n) => n.id === a.nodeId)?.cordoned).toBe(true);
    expect(cordoned.find((n) => n.id !== a.nodeId)).toBe(before[1]);
  });

  it("times every reconcile, the start's included, and none on a follower's copy", () => {
    const times: number[] = [];
    const onReconciled = (ms: number) => times.push(ms);
    const cluster = newCluster(undefined, { onReconciled });
    // The start's reconcile, over whatever the store holds (nothing yet).
    expect(times).toHaveLength(1);
    const a = join_(cluster, "node-a", "2xh100-80g", "10.0.0.1");
    cluster.applyDeployment(spec({ name: "chat", replicas: 1 }));
    cluster.cordonNode(a.nodeId);
    expect(times.length).toBeGreaterThanOrEqual(4);
    for (const ms of times) {
      expect(Number.isFinite(ms)).toBe(true);
      expect(ms).toBeGreaterThanOrEqual(0);
    }
    const before = times.length;
    newCluster(undefined, { onReconciled, readOnly: true });
    expect(times).toHaveLength(before);
  });

  it("drains a node: cordoned, and its replicas move", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "2xh100-80g", "10.0.0.1");
    cluster.applyDeployment(spec({ name: "chat", replicas: 2 }));
    expect(placedOn(cluster, "chat")).toEqual([a.nodeId, a.nodeId]);
    const b = join_(cluster, "node-b", "2xh100-80g", "10.0.0.2");
    const node = cluster.drainNode("node-a");
    expect(node.cordoned && node.draining).toBe(true);
    expect(placedOn(cluster, "chat")).toEqual([b.nodeId, b.nodeId]);
    expect(cluster.desiredSet(a.nodeId).assignments).toEqual([]);
    cluster.uncordonNode(a.nodeId);
    expect(cluster.getNode(a.nodeId).cordoned).toBe(false);
  });

  it("records why a deployment cannot be placed, and clears it when capacity arrives", () => {
    const cluster = newCluster();
    join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    const status = cluster.applyDeployment(spec({ name: "big", tensorParallel: 2 })).status;
    expect(status.replicas).toEqual([]);
    expect(status.unschedulable.length).toBeGreaterThan(0);
    expect(status.unschedulable[0]?.message).toMatch(/\d/);
    join_(cluster, "node-b", "2xh100-80g", "10.0.0.2");
    expect(cluster.deploymentStatus("big").unschedulable).toEqual([]);
    expect(cluster.events.list({ limit: 100 }).map((e) => e.kind)).toContain(
      "deployment.unschedulable",
    );
  });

  it("scales without bumping the revision and deletes", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "4xh100-80g", "10.0.0.1");
    cluster.applyDeployment(spec({ name: "chat", replicas: 1 }));
    const scaled = cluster.scaleDeployment("chat", 3);
    expect(scaled.replicas.map((r) => r.replicaId)).toEqual(["chat-0", "chat-1", "chat-2"]);
    expect(scaled.spec.revision).toBe(1);
    expect(cluster.scaleDeployment("chat", 1).replicas.map((r) => r.replicaId)).toHaveLength(1);
    cluster.deleteDeployment("chat");
    expect(cluster.desiredSet(a.nodeId).assignments).toEqual([]);
    expect(() => cluster.deleteDeployment("chat")).toThrow(/no deployment named "chat"/);
  });

  it("refuses a scale the spec schema refuses, naming replicas, and keeps a store it can start from", () => {
    const cluster = newCluster();
    join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    cluster.applyDeployment(spec({ name: "chat", replicas: 1 }));
    expect(() => cluster.scaleDeployment("chat", 100_001)).toThrow(
      expect.objectContaining({
        code: "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
        message: expect.stringMatching(/replicas.*100001/),
      }),
    );
    expect(cluster.deploymentStatus("chat").desiredReplicas).toBe(1);
    expect(cluster.scaleDeployment("chat", 100_000).desiredReplicas).toBe(100_000);
    expect(newCluster().deploymentStatus("chat").desiredReplicas).toBe(100_000);
  });

  it("lists a deleted deployment's replicas while they drain, and knows the name no more after", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    cluster.applyDeployment(spec({ name: "chat", replicas: 1, drainTimeoutSeconds: 5 }));
    const ready = rankStatus({ replicaId: "chat-0", rank: 0, state: "ready", apiPort: 41_000 });
    cluster.heartbeat(a.nodeId, { gpus: [], replicas: [ready], problems: [] });
    cluster.deleteDeployment("chat");
    const draining = cluster.listReplicas({ deployment: "chat" });
    expect(draining.map((r) => [r.replicaId, r.retirement?.phase])).toEqual([
      ["chat-0", "draining"],
    ]);
    expect(cluster.listReplicas({ deployment: "chat", node: "node-a" })).toHaveLength(1);
    expect(() => cluster.listReplicas({ deployment: "other" })).toThrow(
      expect.objectContaining({ code: "LLMGW_CONTROL_PLANE_NOT_FOUND" }),
    );
    clock.advance(5_000);
    cluster.tick();
    expect(() => cluster.listReplicas({ deployment: "chat" })).toThrow(
      expect.objectContaining({ code: "LLMGW_CONTROL_PLANE_NOT_FOUND" }),
    );
  });

  it("aggregates reported states, exposes ready endpoints and surfaces failures", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    cluster.applyDeployment(spec({ name: "chat", servedModelName: "org/chat" }));
    const status = (state: RankStatus["state"], extra: Partial<RankStatus> = {}) =>
      rankStatus({ replicaId: "chat-0", rank: 0, state, apiPort: 41_000, ...extra });
    cluster.heartbeat(a.nodeId, {
      gpus: [],
      replicas: [status("loading")],
      problems: [],
    });
    expect(cluster.hasLoadingReplicas("org/chat")).toBe(true);
    expect(cluster.readyReplicas("org/chat")).toEqual([]);
    cluster.heartbeat(a.nodeId, {
      gpus: [],
      replicas: [status("ready", { load: { running: 3, kvCacheUsage: 0.5 } })],
      problems: [],
    });
    expect(cluster.readyReplicas("org/chat")).toEqual([
      {
        replicaId: "chat-0",
        deployment: "chat",
        model: "org/chat",
        endpoint: "10.0.0.1:41000",
        state: "ready",
        load: { running: 3, waiting: undefined, kvCacheUsage: 0.5, prefixCacheHitRate: undefined },
        routingPolicy: "llmgw",
        capacity: 64,
      },
    ]);
    expect(cluster.readyModels()).toEqual(["org/chat"]);
    cluster.heartbeat(a.nodeId, {
      gpus: [],
      replicas: [status("failed", { message: "exited 3 times", logTail: ["CUDA out of memory"] })],
      problems: [],
    });
    const d = cluster.deploymentStatus("chat");
    expect(d.replicas[0]?.state).toBe("failed");
    expect(d.failed.map((r) => r.code)).toEqual(["LLMGW_CONTROL_PLANE_REPLICA_FAILED"]);
    expect(d.failed[0]?.message).toContain("CUDA out of memory");
    // Still listed with the placement problems too, for CLIs that read only those.
    expect(d.unschedulable.map((r) => r.message).join("\n")).toContain("CUDA out of memory");
    const failed = cluster.events.list({ limit: 100 }).find((e) => e.severity === "error");
    expect(failed?.message).toContain("ready → failed");
  });

  it.each([0, 65_536, 4_000_000_000])(
    "publishes no endpoint for a reported apiPort of %d (outside 1–65535)",
    (apiPort) => {
      const cluster = newCluster();
      const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
      cluster.applyDeployment(spec({ name: "chat", servedModelName: "org/chat" }));
      const status = (port: number) =>
        rankStatus({ replicaId: "chat-0", rank: 0, state: "ready", apiPort: port, pid: 10 });
      cluster.heartbeat(a.nodeId, { gpus: [], replicas: [status(apiPort)], problems: [] });
      expect(cluster.readyModels()).toEqual([]);
      expect(cluster.readyReplicas("org/chat")).toEqual([]);
      cluster.heartbeat(a.nodeId, { gpus: [], replicas: [status(65_535)], problems: [] });
      expect(cluster.readyReplicas("org/chat").map((r) => r.endpoint)).toEqual(["10.0.0.1:65535"]);
    },
  );

  it("takes no status of a replica from a node it is not placed on, nor of a rank it does not run", () => {
    const MOVE_AFTER = 5 * 60_000;
    const cluster = newCluster(undefined, { moveFailedAfterMs: MOVE_AFTER });
    const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    const b = join_(cluster, "node-b", "1xh100-80g", "10.0.0.2");
    cluster.applyDeployment(spec({ name: "chat", servedModelName: "org/chat" }));
    const [owner, other] = placedOn(cluster, "chat")[0] === a.nodeId ? [a, b] : [b, a];
    const status = (state: RankStatus["state"], rank = 0) =>
      rankStatus({ replicaId: "chat-0", rank, state, apiPort: 41_000, pid: 10 });
    const beat = (nodeId: string, replicas: RankStatus[]) =>
      cluster.heartbeat(nodeId, { gpus: [], replicas, problems: [] });
    beat(owner.nodeId, [status("ready")]);
    // Another node, and a rank 1 the single-node replica does not have, say it failed.
    beat(other.nodeId, [status("failed")]);
    beat(owner.nodeId, [status("ready"), status("failed", 1)]);
    const states = () =>
      cluster.events
        .list({ limit: 1000 })
        .filter((e) => e.kind === "replica.state")
        .map((e) => e.message);
    const host = owner === a ? "node-a" : "node-b";
    expect(states()).toEqual([`rank 0 on ${host}: reported → ready`]);
    expect(cluster.deploymentStatus("chat").replicas[0]?.state).toBe("ready");
    // Long after, the engine fails on its own node for the first time: no streak began
    // earlier, so it is not moved yet, and no node is avoided for it.
    for (let t = 0; t < MOVE_AFTER + 60_000; t += 10_000) {
      clock.advance(10_000);
      beat(other.nodeId, []);
      beat(owner.nodeId, [status("ready")]);
    }
    beat(owner.nodeId, [status("failed")]);
    cluster.tick();
    expect(
      cluster.events.list({ limit: 1000 }).filter((e) => e.kind === "replica.removed"),
    ).toEqual([]);
    expect(placedOn(cluster, "chat")).toEqual([owner.nodeId]);
    expect(cluster.deploymentStatus("chat").avoided).toEqual([]);
  });

  it("a scale-down removes a failed replica rather than drain a serving one", () => {
    const cluster = newCluster();
    const ids = ["a", "b", "c"].map(
      (h, i) => join_(cluster, `node-${h}`, "1xh100-80g", `10.0.0.${i + 1}`).nodeId,
    );
    cluster.applyDeployment(spec({ name: "chat", replicas: 3 }));
    for (const [i, nodeId] of ids.entries()) {
      cluster.heartbeat(nodeId, {
        gpus: [],
        problems: [],
        replicas: cluster.desiredSet(nodeId).assignments.map((x) =>
          rankStatus({
            replicaId: x.replicaId,
            rank: x.rank,
            // The newest and the one whose removal frees the most are serving.
            state: x.replicaId === "chat-0" ? "failed" : "ready",
            apiPort: 41_000 + i,
            pid: 10 + i,
          }),
        ),
      });
    }
    cluster.scaleDeployment("chat", 2);
    expect(
      cluster
        .placements()
        .map((p) => `${p.replicaId}${p.retirement ? ` ${p.retirement.phase}` : ""}`),
    ).toEqual(["chat-1", "chat-2"]);
  });

  describe("a replica that keeps failing", () => {
    const MOVE_AFTER = 5 * 60_000;
    /** Node a and b, one GPU each, and `chat` placed on a (its replica failing from now). */
    function failingOnA(options: { moveFailedAfterMs?: number } = {}) {
      let reconciles = 0;
      const cluster = newCluster(undefined, {
        ...options,
        onReconciled: () => {
          reconciles += 1;
        },
      });
      const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
      const b = join_(cluster, "node-b", "1xh100-80g", "10.0.0.2");
      cluster.applyDeployment(spec({ name: "chat", servedModelName: "org/chat" }));
      const [first] = cluster.placements();
      const onA = first?.ranks[0]?.nodeId === a.nodeId;
      const [here, there] = onA ? [a, b] : [b, a];
      /** Reports `replicaId` in `state` from `node`, and heartbeats the other node. */
      const report = (node: typeof a, replicaId: string, state: RankStatus["state"]) => {
        for (const n of [a, b]) {
          cluster.heartbeat(n.nodeId, {
            gpus: [],
            replicas:
              n === node
                ? [
                    rankStatus({
                      replicaId,
                      rank: 0,
                      state,
                      apiPort: 41_000,
                      ...(state === "failed" ? { message: "restart policy gave up" } : {}),
                    }),
                  ]
                : [],
            problems: [],
          });
        }
      };
      const hereName = onA ? "node-a" : "node-b";
      return { cluster, here, there, hereName, report, reconciles: () => reconciles };
    }

    it("moves once its failures last past moveFailedAfterMs, and its deployment avoids the node", () => {
      const { cluster, here, there, hereName, report, reconciles } = failingOnA();
      report(here, "chat-0", "failed");
      clock.advance(MOVE_AFTER - 1_000);
      report(here, "chat-0", "starting"); // the agent's relaunch
      report(here, "chat-0", "failed");
      cluster.tick();
      expect(placedOn(cluster, "chat")).toEqual([here.nodeId]);

      clock.advance(1_000);
      report(here, "chat-0", "failed");
      const before = reconciles();
      cluster.tick();
      expect(reconciles()).toBe(before + 1);
      expect(cluster.placements().map((p) => p.replicaId)).toEqual(["chat-1"]);
      expect(placedOn(cluster, "chat")).toEqual([there.nodeId]);
      const removed = cluster.events.list({ limit: 100 }).find((e) => e.kind === "replica.removed");
      expect(removed?.subject).toBe("chat-0");
      expect(removed?.severity).toBe("warning");
      expect(removed?.message).toMatch(
        new RegExp(
          `^its engine kept failing on ${hereName} since \\S+Z \\(restart policy gave up\\): moved, and chat avoids ${hereName} for 60 min$`,
        ),
      );

      expect(cluster.deploymentStatus("chat").avoided).toEqual([
        {
          code: "LLMGW_CONTROL_PLANE_NODE_AVOIDED",
          message: `${hereName} is avoided until ${new Date(clock.now() + 60 * 60_000).toISOString()}: a replica kept failing there and moved; 'llmgw unavoid chat ${here.nodeId}' lifts it`,
        },
      ]);
      // Stored: a new leader over the same store avoids it too.
      expect(newCluster(undefined, {}).deploymentStatus("chat").avoided).toEqual(
        cluster.deploymentStatus("chat").avoided,
      );

      // The replacement fails too, past the same time: the only other node is avoided, so it
      // stays (no churn back onto the first node), and ticks do not reconcile for it again.
      report(there, "chat-1", "failed");
      clock.advance(MOVE_AFTER);
      report(there, "chat-1", "failed");
      cluster.tick();
      const offered = reconciles();
      cluster.tick();
      clock.advance(1_000);
      report(there, "chat-1", "failed");
      cluster.tick();
      expect(reconciles()).toBe(offered);
      expect(cluster.placements().map((p) => p.replicaId)).toEqual(["chat-1"]);
    });

    it("avoids a node longer after each move in a row off it, so two bad nodes do not swap hourly", () => {
      const { cluster, here, there, hereName, report } = failingOnA();
      const thereName = hereName === "node-a" ? "node-b" : "node-a";
      const removals = () =>
        cluster.events
          .list({ limit: 100 })
          .filter((e) => e.kind === "replica.removed")
          .map((e) => e.message);
      /** Fails the replica on `node` past moveFailedAfterMs, then `laterMs` more. */
      const failPast = (node: typeof here, laterMs = 0) => {
        const id = cluster.placements()[0]?.replicaId as string;
        report(node, id, "failed");
        clock.advance(MOVE_AFTER);
        report(node, id, "failed");
        cluster.tick();
        if (laterMs === 0) return;
        clock.advance(laterMs);
        report(node, id, "failed");
        cluster.tick();
      };
      failPast(here);
      expect(removals()).toEqual([expect.stringMatching(`avoids ${hereName} for 60 min$`)]);
      // It fails on the other node too: the first is avoided, so it stays until that ends
      // (the tick after the end moves it, with nothing else changed).
      failPast(there);
      expect(placedOn(cluster, "chat")).toEqual([there.nodeId]);
      clock.advance(60 * 60_000);
      report(there, cluster.placements()[0]?.replicaId as string, "failed"); // a heartbeat
      cluster.tick();
      expect(placedOn(cluster, "chat")).toEqual([here.nodeId]);
      expect(removals()[1]).toMatch(new RegExp(`avoids ${thereName} for 60 min$`));
      // Back on the first node and failing again: its second move off it avoids it for 2 h.
      failPast(here, 60 * 60_000);
      expect(placedOn(cluster, "chat")).toEqual([there.nodeId]);
      expect(removals()[2]).toMatch(new RegExp(`avoids ${hereName} for 2 h$`));
      expect(cluster.deploymentStatus("chat").avoided.map((a) => a.message)).toEqual([
        expect.stringMatching(
          new RegExp(`^${hereName} is avoided until .*\\(2 moves in a row\\);`),
        ),
      ]);
    });

    it("lifts an avoidance on the operator's word, for this leader and the next", () => {
      const { cluster, here, hereName, report } = failingOnA();
      report(here, "chat-0", "failed");
      clock.advance(MOVE_AFTER);
      report(here, "chat-0", "failed");
      cluster.tick();
      expect(cluster.deploymentStatus("chat").avoided).toHaveLength(1);
      expect(() => cluster.unavoid("nope", hereName)).toThrow(/no deployment named "nope"/);
      expect(() => cluster.unavoid("chat", "node-z")).toThrow(/no node with id or hostname/);
      expect(cluster.unavoid("chat", hereName)).toEqual([here.nodeId]);
      expect(cluster.unavoid("chat", hereName)).toEqual([]);
      expect(cluster.deploymentStatus("chat").avoided).toEqual([]);
      const lifted = cluster.events
        .list({ limit: 100 })
        .filter((e) => e.kind === "deployment.unavoided");
      expect(lifted.map((e) => [e.subject, e.message])).toEqual([
        ["chat", `chat no longer avoids ${hereName}: lifted by an operator`],
      ]);
      expect(newCluster(undefined, {}).deploymentStatus("chat").avoided).toEqual([]);
    });

    /** Nodes a, b and c with one GPU each, `chat` with `replicas` placed. */
    function threeNodes(replicas: number, options: { store?: ClusterStore } = {}) {
      const cluster = newCluster(undefined, options);
      const nodes = ["node-a", "node-b", "node-c"].map((name, i) =>
        join_(cluster, name, "1xh100-80g", `10.0.0.${i + 1}`),
      );
      cluster.applyDeployment(spec({ name: "chat", servedModelName: "org/chat", replicas }));
      /** Heartbeats every node, each reporting its placed ranks in `state` (or `on`'s in `other`). */
      const beat = (state: RankStatus["state"], on?: string, other?: RankStatus["state"]) => {
        for (const n of nodes) {
          const here = cluster.placements().filter((p) => p.ranks[0]?.nodeId === n.nodeId);
          cluster.heartbeat(n.nodeId, {
            gpus: [],
            replicas: here.map((p) =>
              rankStatus({
                replicaId: p.replicaId,
                rank: 0,
                state: n.nodeId === on && other !== undefined ? other : state,
                apiPort: 41_000,
              }),
            ),
            problems: [],
          });
        }
      };
      return { cluster, nodes, beat };
    }

    it("offers a replica that stayed for want of a node again once an avoidance of the same plan ends", () => {
      const { cluster, nodes, beat } = threeNodes(2);
      const free = nodes.find((n) => placedOn(cluster, "chat").indexOf(n.nodeId) < 0);
      beat("failed");
      clock.advance(MOVE_AFTER);
      beat("failed");
      cluster.tick();
      // One moved to the free node; the other had nowhere to go: both failed nodes avoided.
      expect(placedOn(cluster, "chat")).toContain(free?.nodeId);
      const stayed = cluster.placements().find((p) => p.ranks[0]?.nodeId !== free?.nodeId);
      expect(cluster.deploymentStatus("chat").avoided).toHaveLength(1);
      // The moved one serves; nothing else changes for an hour.
      beat("failed", free?.nodeId, "ready");
      cluster.tick();
      clock.advance(60 * 60_000);
      beat("failed", free?.nodeId, "ready");
      cluster.tick();
      expect(cluster.placements().map((p) => p.replicaId)).not.toContain(stayed?.replicaId);
    });

    it("counts replicas moved off one node in one plan as one move", () => {
      const cluster = newCluster(undefined, {});
      const a = join_(cluster, "node-a", "2xh100-80g", "10.0.0.1");
      cluster.applyDeployment(spec({ name: "chat", servedModelName: "org/chat", replicas: 2 }));
      const b = join_(cluster, "node-b", "2xh100-80g", "10.0.0.2");
      const beat = () => {
        cluster.heartbeat(a.nodeId, {
          gpus: [],
          replicas: ["chat-0", "chat-1"].map((replicaId) =>
            rankStatus({ replicaId, rank: 0, state: "failed", apiPort: 41_000 }),
          ),
          problems: [],
        });
        cluster.heartbeat(b.nodeId, { gpus: [], replicas: [], problems: [] });
      };
      beat();
      clock.advance(MOVE_AFTER);
      beat();
      cluster.tick();
      expect(cluster.placements().map((p) => p.ranks[0]?.nodeId)).not.toContain(a.nodeId);
      expect(cluster.deploymentStatus("chat").avoided.map((r) => r.message)).toEqual([
        expect.stringMatching(
          `^node-a is avoided until ${new Date(clock.now() + 60 * 60_000).toISOString()}: a replica kept failing there and moved; `,
        ),
      ]);
    });

    it("moves a replica that stayed for want of a node once the operator lifts the avoidance", () => {
      const { cluster, here, there, hereName, report } = failingOnA();
      report(here, "chat-0", "failed");
      clock.advance(MOVE_AFTER);
      report(here, "chat-0", "failed");
      cluster.tick();
      report(there, "chat-1", "failed");
      clock.advance(MOVE_AFTER);
      report(there, "chat-1", "failed");
      cluster.tick();
      expect(placedOn(cluster, "chat")).toEqual([there.nodeId]);
      cluster.unavoid("chat", hereName);
      expect(placedOn(cluster, "chat")).toEqual([here.nodeId]);
    });

    it("forgets avoidances of deployments that are gone as a leader loads, not as a follower", () => {
      const gone = { deployment: "gone", nodeId: "n1", untilMs: 1e15, moves: 1, movedAtMs: 0 };
      store.putAvoidedNode(gone);
      newCluster(undefined, { readOnly: true });
      expect(store.listAvoidedNodes()).toEqual([gone]);
      newCluster(undefined, {});
      expect(store.listAvoidedNodes()).toEqual([]);
    });

    it("writes avoidances the store refused at the next tick that finds it writable", () => {
      let refuse = true;
      const flaky: ClusterStore = {
        ...store,
        putAvoidedNode: (r) => {
          if (refuse)
            throw new ControlPlaneError("LLMGW_CONTROL_PLANE_STORE_FAILED", "disk full (test)");
          store.putAvoidedNode(r);
        },
      };
      const { cluster, beat } = threeNodes(1, { store: flaky });
      beat("failed");
      clock.advance(MOVE_AFTER);
      beat("failed");
      cluster.tick();
      expect(cluster.deploymentStatus("chat").avoided).toHaveLength(1);
      expect(store.listAvoidedNodes()).toEqual([]);
      cluster.tick();
      expect(store.listAvoidedNodes()).toEqual([]);
      refuse = false;
      cluster.tick();
      expect(store.listAvoidedNodes()).toHaveLength(1);
      expect(newCluster(undefined, {}).deploymentStatus("chat").avoided).toEqual(
        cluster.deploymentStatus("chat").avoided,
      );
    });

    it("forgets what a revoked node was avoided for", () => {
      const { cluster, here, report } = failingOnA();
      report(here, "chat-0", "failed");
      clock.advance(MOVE_AFTER);
      report(here, "chat-0", "failed");
      cluster.tick();
      expect(store.listAvoidedNodes()).toHaveLength(1);
      cluster.revokeNode(here.nodeId);
      expect(cluster.deploymentStatus("chat").avoided).toEqual([]);
      expect(store.listAvoidedNodes()).toEqual([]);
    });

    it.each([
      { when: "while its agent relaunches it", moveFailedAfterMs: MOVE_AFTER, now: "loading" },
      { when: "when moveFailedAfterMs is 0", moveFailedAfterMs: 0, now: "failed" },
    ] as const)("stays $when", ({ moveFailedAfterMs, now }) => {
      const { cluster, here, report } = failingOnA({ moveFailedAfterMs });
      report(here, "chat-0", "failed");
      clock.advance(10 * MOVE_AFTER);
      report(here, "chat-0", now);
      cluster.tick();
      expect(cluster.placements().map((p) => p.replicaId)).toEqual(["chat-0"]);
    });

    it("counts a failed status stored before a restart as a streak begun at the start", () => {
      const { here, there, report } = failingOnA();
      report(here, "chat-0", "failed");
      clock.advance(MOVE_AFTER);
      // A new leader (same store): the stored failed status is all it knows of the streak.
      const again = newCluster(undefined, { moveFailedAfterMs: MOVE_AFTER });
      const heartbeat = (node: typeof here) =>
        again.heartbeat(node.nodeId, {
          gpus: [],
          replicas:
            node === here
              ? [rankStatus({ replicaId: "chat-0", rank: 0, state: "failed", apiPort: 41_000 })]
              : [],
          problems: [],
        });
      heartbeat(here);
      heartbeat(there);
      again.tick();
      expect(again.placements().map((p) => p.replicaId)).toEqual(["chat-0"]);
      clock.advance(MOVE_AFTER);
      heartbeat(here);
      heartbeat(there);
      again.tick();
      expect(placedOn(again, "chat")).toEqual([there.nodeId]);
    });

    it("moves a two-node replica whose rank keeps failing off that rank's node", () => {
      const cluster = newCluster();
      const nodes = ["node-a", "node-b", "node-c"].map((name, i) =>
        join_(cluster, name, "1xh100-80g@ib-a", `10.0.0.${i + 1}`),
      );
      cluster.applyDeployment(
        spec({ name: "big", engine: "sim", tensorParallel: 2, nodesPerReplica: 2 }),
      );
      const before = cluster.placements()[0];
      const rank1 = before?.ranks[1]?.nodeId as string;
      const beat = () => {
        for (const n of nodes) {
          const ranks = (before?.ranks ?? []).filter((r) => r.nodeId === n.nodeId);
          cluster.heartbeat(n.nodeId, {
            gpus: [],
            replicas: ranks.map((r) =>
              rankStatus({
                replicaId: "big-0",
                rank: r.rank,
                state: r.rank === 1 ? "failed" : "starting",
                apiPort: 41_000,
              }),
            ),
            problems: [],
          });
        }
      };
      beat();
      clock.advance(MOVE_AFTER);
      beat();
      cluster.tick();
      const after = cluster.placements();
      expect(after.map((p) => p.replicaId)).toEqual(["big-1"]);
      const placed = after[0]?.ranks.map((r) => r.nodeId).sort();
      expect(placed).not.toContain(rank1);
      expect(placed).toHaveLength(2);
    });

    it("starts a new streak after ten minutes served", () => {
      const { cluster, here, report } = failingOnA();
      report(here, "chat-0", "failed");
      clock.advance(60_000);
      report(here, "chat-0", "ready");
      clock.advance(10 * 60_000);
      report(here, "chat-0", "failed");
      clock.advance(MOVE_AFTER - 1_000);
      report(here, "chat-0", "failed");
      cluster.tick();
      expect(cluster.placements().map((p) => p.replicaId)).toEqual(["chat-0"]);
      clock.advance(1_000);
      report(here, "chat-0", "failed");
      cluster.tick();
      expect(cluster.placements().map((p) => p.replicaId)).toEqual(["chat-1"]);
    });
  });

  it("keeps replicas on a change engines do not see, replaces them on one they do", () => {
    const cluster = newCluster();
    join_(cluster, "node-a", "2xh100-80g", "10.0.0.1");
    const b = join_(cluster, "node-b", "1xa100-80g", "10.0.0.2");
    cluster.applyDeployment(spec({ name: "chat" }));
    const first = cluster.placements()[0];
    cluster.applyDeployment(spec({ name: "chat", routingPolicy: "round-robin" }));
    expect(cluster.placements()).toEqual([{ ...first, revision: 2 }]);
    // Not serving yet (no agent reported it ready): replaced at once, under a new id.
    cluster.applyDeployment(
      spec({ name: "chat", routingPolicy: "round-robin", maxModelLen: 4096 }),
    );
    expect(cluster.placements().map((p) => `${p.replicaId}@r${p.revision}`)).toEqual(["chat-1@r3"]);
    cluster.applyDeployment(
      spec({ name: "chat", routingPolicy: "round-robin", maxModelLen: 4096, gpuClass: "a100-80g" }),
    );
    expect(placedOn(cluster, "chat")).toEqual([b.nodeId]);
    expect(cluster.placements()[0]?.revision).toBe(4);
  });

  it("moves a replica off a GPU that turned unhealthy", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "2xh100-80g", "10.0.0.1");
    cluster.applyDeployment(spec({ name: "chat" }));
    const before = cluster.placements()[0]?.ranks[0]?.gpuIndices[0] as number;
    cluster.heartbeat(a.nodeId, {
      gpus: [
        gpuReading({
          index: before,
          uuid: "",
          healthy: false,
          healthProblems: [{ code: "X", message: "ECC", source: "nvidia-smi" }],
        }),
      ],
      replicas: [],
      problems: [],
    });
    expect(cluster.placements()[0]?.ranks[0]?.gpuIndices).toEqual([before === 0 ? 1 : 0]);
    expect(cluster.events.list({ limit: 100 }).map((e) => e.kind)).toContain("gpu.health");
  });

  it("refuses to start on a stored inventory that does not decode, naming the node", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    const [record] = store.listNodes();
    if (!record) throw new Error("no node stored");
    // A length-delimited field whose length runs past the end: not an inventory.
    store.putNode({ ...record, inventory: new Uint8Array([0x0a, 0x7f, 0x01]) });
    expect(() => newCluster()).toThrow(
      expect.objectContaining({
        code: "LLMGW_CONTROL_PLANE_STORE_CORRUPT",
        message: expect.stringContaining(`the stored inventory of node ${a.nodeId}`),
      }),
    );
  });

  it("survives a restart: same placements, rejoining nodes keep their identity", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "2xh100-80g", "10.0.0.1");
    cluster.applyDeployment(spec({ name: "chat", replicas: 2 }));
    const placements = cluster.placements();
    const again = newCluster();
    expect(again.placements()).toEqual(placements);
    expect(again.nodeState(a.nodeId)).toBe("unreachable");
    const back = join_(again, "node-a", "2xh100-80g", "10.0.0.1", a);
    expect(back).toMatchObject({ nodeId: a.nodeId, rejoined: true });
    expect(again.desiredSet(a.nodeId).assignments.map((x) => x.replicaId)).toEqual([
      "chat-0",
      "chat-1",
    ]);
    expect(again.getNode(a.nodeId).state).toBe("ready");
  });

  it("refuses revoked and unknown nodes and wrong credentials", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    expect(() => cluster.authenticateNode(a.nodeId, "nope")).toThrow(/wrong credential/);
    cluster.authenticateNode(a.nodeId, a.nodeCredential);
    cluster.revokeNode("node-a");
    expect(() => cluster.authenticateNode(a.nodeId, a.nodeCredential)).toThrow(
      /revoked by an operator/,
    );
    expect(() => cluster.authenticateNode("ghost", "x")).toThrow(/not known to this control plane/);
    // …and still after a control-plane restart.
    expect(() => newCluster().authenticateNode(a.nodeId, a.nodeCredential)).toThrow(
      /revoked by an operator/,
    );
    // A revoked id is not reused: the node joins as a new one.
    expect(join_(cluster, "node-a", "1xh100-80g", "10.0.0.1", a).nodeId).not.toBe(a.nodeId);
  });

  it("keeps a passed credential's hash good until the node registers again or is revoked", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    const passed = cluster.authenticateNode(a.nodeId, a.nodeCredential);
    expect(cluster.stillAuthenticated(a.nodeId, passed)).toBe(true);
    expect(cluster.stillAuthenticated("ghost", passed)).toBe(false);
    // A new Register issues a new credential: a stream that passed with the old one is done.
    const again = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1", a);
    expect(cluster.stillAuthenticated(a.nodeId, passed)).toBe(false);
    const renewed = cluster.authenticateNode(a.nodeId, again.nodeCredential);
    expect(cluster.stillAuthenticated(a.nodeId, renewed)).toBe(true);
    cluster.revokeNode("node-a");
    expect(cluster.stillAuthenticated(a.nodeId, renewed)).toBe(false);
  });

  it("refuses to re-register a held id without its credential and leaves the node untouched", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    cluster.applyDeployment(spec({ name: "chat", replicas: 1 }));
    const before = cluster.getNode(a.nodeId);
    for (const credential of [undefined, "llmgw-node-guessed"]) {
      expect(() =>
        join_(cluster, "evil", "8xh100-80g", "10.6.6.6", {
          nodeId: a.nodeId,
          nodeCredential: credential,
        }),
      ).toThrow(
        expect.objectContaining({
          code: "LLMGW_CONTROL_PLANE_NODE_ID_TAKEN",
          message: `node ${a.nodeId} is registered; re-joining it needs its node credential, or an operator's \`llmgw nodes reset ${a.nodeId}\``,
        }),
      );
    }
    expect(cluster.getNode(a.nodeId)).toEqual(before);
    cluster.authenticateNode(a.nodeId, a.nodeCredential);
    expect(cluster.desiredSet(a.nodeId).assignments.map((x) => x.replicaId)).toEqual(["chat-0"]);
    // One event for the attempts of a minute, so repeating them cannot flood the event log.
    const refused = cluster.events
      .list({ limit: 100 })
      .filter((e) => e.kind === "node.takeover_refused");
    expect(refused.map((e) => e.message)).toEqual([
      `a Register from evil (advertising 10.6.6.6) named node ${a.nodeId} without its node credential; the node is unchanged`,
    ]);
  });

  it("lets an agent whose Register answer was lost retry with the credential before it", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    const lost = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1", a);
    const again = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1", a);
    expect(again.nodeId).toBe(a.nodeId);
    expect(lost.nodeId).toBe(a.nodeId);
    // Once the newest credential is used, every older one is retired.
    cluster.authenticateNode(a.nodeId, again.nodeCredential);
    for (const old of [a, lost]) {
      expect(() => join_(cluster, "node-a", "1xh100-80g", "10.0.0.1", old)).toThrow(
        /needs its node credential/,
      );
    }
  });

  it("keeps accepting the credential an agent holds however many Register answers in a row are lost", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    // The agent never receives an answer, so it keeps presenting its first credential.
    const lost = [1, 2, 3, 4].map(() => join_(cluster, "node-a", "1xh100-80g", "10.0.0.1", a));
    expect(lost.map((r) => r.nodeId)).toEqual([a.nodeId, a.nodeId, a.nodeId, a.nodeId]);
    const received = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1", a);
    expect(received).toMatchObject({ nodeId: a.nodeId, rejoined: true });
    cluster.authenticateNode(a.nodeId, received.nodeCredential);
    // Credentials the agent never received were never accepted as the prior one.
    for (const never of lost) {
      expect(() => join_(cluster, "node-a", "1xh100-80g", "10.0.0.1", never)).toThrow(
        /needs its node credential/,
      );
    }
  });

  it("refuses a new node beyond maxNodes, still letting held nodes re-register", () => {
    const cluster = newCluster(undefined, { maxNodes: 2 });
    const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    join_(cluster, "node-b", "1xh100-80g", "10.0.0.2");
    for (const previous of [undefined, { nodeId: "node-gone-0000" }]) {
      expect(() => join_(cluster, "node-c", "8xh100-80g", "10.0.0.3", previous)).toThrow(
        expect.objectContaining({
          code: "LLMGW_CONTROL_PLANE_NODE_LIMIT",
          message:
            "this control plane holds its most nodes (2); revoke nodes that are gone (llmgw nodes revoke NODE) or raise --max-nodes",
        }),
      );
    }
    expect(cluster.listNodes().map((n) => n.hostname)).toEqual(["node-a", "node-b"]);
    expect(join_(cluster, "node-a", "1xh100-80g", "10.0.0.1", a).nodeId).toBe(a.nodeId);
    // A revoked node frees its place.
    cluster.revokeNode(a.nodeId);
    expect(join_(cluster, "node-c", "8xh100-80g", "10.0.0.3").nodeId).toMatch(/^node-c-/);
  });

  it("lets a reset lapse when no Register uses it within 15 minutes", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    cluster.resetNode("node-a");
    expect(cluster.events.list({ limit: 100 }).at(-1)?.message).toBe(
      "node-a reset by an operator: the next Register naming " +
        `${a.nodeId} in the next 15 minutes may take it with the join token alone`,
    );
    clock.advance(15 * 60_000);
    // Also after a restart: the expiry is stored, not only the mark.
    for (const c of [cluster, newCluster()]) {
      expect(() => join_(c, "evil", "8xh100-80g", "10.6.6.6", { nodeId: a.nodeId })).toThrow(
        expect.objectContaining({ code: "LLMGW_CONTROL_PLANE_NODE_ID_TAKEN" }),
      );
    }
    cluster.authenticateNode(a.nodeId, a.nodeCredential);
    // A new reset opens a new window, one millisecond short of which the join token suffices.
    cluster.resetNode("node-a");
    clock.advance(15 * 60_000 - 1);
    expect(
      join_(newCluster(), "node-a", "1xh100-80g", "10.0.0.9", { nodeId: a.nodeId }),
    ).toMatchObject({ nodeId: a.nodeId, rejoined: true });
  });

  it("after an operator's reset takes the node with the join token alone, once, keeping placements", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    cluster.applyDeployment(spec({ name: "chat", replicas: 1 }));
    cluster.resetNode("node-a");
    // The reset survives a control-plane restart.
    const restarted = newCluster();
    const back = join_(restarted, "node-a", "1xh100-80g", "10.0.0.9", { nodeId: a.nodeId });
    expect(back).toMatchObject({ nodeId: a.nodeId, rejoined: true });
    expect(restarted.desiredSet(a.nodeId).assignments.map((x) => x.replicaId)).toEqual(["chat-0"]);
    expect(restarted.getNode(a.nodeId).advertiseAddress).toBe("10.0.0.9");
    expect(() => restarted.authenticateNode(a.nodeId, a.nodeCredential)).toThrow(
      /wrong credential/,
    );
    expect(() =>
      join_(restarted, "node-a", "1xh100-80g", "10.0.0.9", { nodeId: a.nodeId }),
    ).toThrow(/needs its node credential/);
    // Nor does the credential from before the reset open it again.
    expect(() => join_(restarted, "node-a", "1xh100-80g", "10.0.0.9", a)).toThrow(
      /needs its node credential/,
    );
    const kinds = restarted.events.list({ limit: 100 }).map((e) => e.kind);
    expect(kinds).toContain("node.reset");
    expect(kinds.indexOf("node.reset")).toBeLessThan(kinds.lastIndexOf("node.rejoined"));
  });

  it.each([
    ["10.0.0.1", true],
    ["fd00::1", true],
    ["gpu-01.example.internal", true],
    ["gpu_01", true],
    ["http://10.0.0.1", false],
    ["10.0.0.1:8000", false],
    ["evil.example/x", false],
    ["[::1]", false],
    ["fe80::1%eth0", false],
    ["a b", false],
    ["host\n", false],
    ["-bad.example", false],
    [`${"a".repeat(63)}.${"b".repeat(63)}.${"c".repeat(63)}.${"d".repeat(63)}`, false],
  ])("advertise address %j accepted: %s", (address, ok) => {
    const cluster = newCluster();
    const register = () => join_(cluster, "node-a", "1xh100-80g", address);
    if (ok) expect(register().nodeId).toMatch(/^node-a-/);
    else
      expect(register).toThrow(
        expect.objectContaining({
          code: "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
          message: expect.stringMatching(
            /^RegisterRequest\.advertise_address must be an IP address or a DNS host name/,
          ),
        }),
      );
  });

  it.each([
    [
      "the same index twice",
      [0, 0],
      "RegisterRequest.inventory.gpus[1].index is 0, the same as RegisterRequest.inventory.gpus[0].index; each GPU needs its own index",
    ],
    [
      "a negative index",
      [0, -1],
      "RegisterRequest.inventory.gpus[1].index is -1; it must be a whole number within [0, 1023]",
    ],
    [
      "an index past any host",
      [4_000_000_000, 1],
      "RegisterRequest.inventory.gpus[0].index is 4000000000; it must be a whole number within [0, 1023]",
    ],
  ])(
    "refuses a Register whose inventory has %s, and schedules on as before",
    (_name, indices, message) => {
      const cluster = newCluster();
      const good = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
      const inventory = simulateInventory("2xh100-80g", {
        hostname: "node-b",
        addresses: ["10.0.0.2"],
        nowMs: clock.now(),
      });
      const register = () =>
        cluster.register({
          inventory: {
            ...inventory,
            gpus: inventory.gpus.map((g, i) => ({ ...g, index: indices[i] as number })),
          },
          advertiseAddress: "10.0.0.2",
          replicas: [],
        });
      expect(register).toThrow(
        expect.objectContaining({ code: "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT", message }),
      );
      expect(cluster.listNodes().map((n) => n.nodeId)).toEqual([good.nodeId]);
      expect(store.listNodes().map((n) => n.id)).toEqual([good.nodeId]);
      cluster.applyDeployment(spec({ name: "chat" }));
      expect(placedOn(cluster, "chat")).toEqual([good.nodeId]);
    },
  );

  it("leaves a stored node whose GPU indices repeat out of scheduling after a restart", () => {
    const first = newCluster();
    const good = join_(first, "node-a", "1xh100-80g", "10.0.0.1");
    const bad = join_(first, "node-b", "2xh100-80g", "10.0.0.2");
    first.applyDeployment(spec({ name: "chat", replicas: 1 }));
    // Stored before Register checked indices (or written by hand).
    const record = store.listNodes().find((n) => n.id === bad.nodeId);
    const inventory = simulateInventory("2xh100-80g", {
      hostname: "node-b",
      addresses: ["10.0.0.2"],
      nowMs: clock.now(),
    });
    store.putNode({
      ...(record as NonNullable<typeof record>),
      inventory: inventoryRecord({
        ...inventory,
        gpus: inventory.gpus.map((g) => ({ ...g, index: 0 })),
      }),
    });
    const lines: string[] = [];
    const restarted = newCluster((line) => lines.push(line));
    restarted.applyDeployment(spec({ name: "chat", replicas: 2 }));
    restarted.tick();
    expect(placedOn(restarted, "chat")).toEqual([good.nodeId]);
    const events = restarted.events
      .list({ limit: 1000 })
      .filter((e) => e.kind === "node.unschedulable")
      .map((e) => `${e.subject} ${e.severity}: ${e.message}`);
    expect(events).toEqual([
      `${bad.nodeId} error: node-b is left out of scheduling: inventory.gpus[1].index is 0, the same as inventory.gpus[0].index; each GPU needs its own index; its agent must register again with a valid inventory`,
    ]);
    expect(lines.filter((l) => l.startsWith("node.unschedulable"))).toHaveLength(1);
  });

  it("keeps GPU readings only of the GPUs its inventory lists, and drops those gone on re-register", () => {
    const cluster = newCluster();
    const a = join_(cluster, "node-a", "2xh100-80g", "10.0.0.1");
    const uuids = cluster.getNode(a.nodeId).inventory.gpus.map((g) => g.uuid);
    const readings = () => cluster.getNode(a.nodeId).gpuReadings.map((r) => `${r.index} ${r.uuid}`);
    cluster.heartbeat(a.nodeId, {
      gpus: [
        gpuReading({ index: 0, uuid: uuids[0] as string }),
        gpuReading({ index: 1, uuid: uuids[1] as string }),
        ...Array.from({ length: 64 }, (_, i) =>
          gpuReading({ index: 2 + i, uuid: `GPU-not-here-${i}` }),
        ),
      ],
      replicas: [],
      problems: [],
    });
    expect(readings()).toEqual([`0 ${uuids[0]}`, `1 ${uuids[1]}`]);
    // Back with one GPU: the other's reading goes.
    const again = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1", a);
    expect(readings()).toEqual([`0 ${uuids[0]}`]);
    // Index 0 now names another GPU: its reading is not that GPU's.
    const inventory = simulateInventory("1xh100-80g", {
      hostname: "node-a",
      addresses: ["10.0.0.1"],
      nowMs: clock.now(),
    });
    cluster.register({
      inventory: { ...inventory, gpus: inventory.gpus.map((g) => ({ ...g, uuid: "GPU-swapped" })) },
      advertiseAddress: "10.0.0.1",
      previousNodeId: again.nodeId,
      previousNodeCredential: again.nodeCredential,
      replicas: [],
    });
    expect(readings()).toEqual([]);
  });

  it("coalesces agent-caused reconciles when given a defer function", () => {
    const queued: (() => void)[] = [];
    let runs = 0;
    const cluster = new Cluster({
      store,
      schedule: (input) => {
        runs++;
        return schedule(input);
      },
      clock,
      heartbeatIntervalMs: INTERVAL,
      unreachableAfterMs: 3 * INTERVAL,
      nodeLostAfterMs: 10_000,
      rendezvousPortMin: 29_500,
      rendezvousPortMax: 29_999,
      defer: (run) => queued.push(run),
    });
    cluster.applyDeployment(spec({ name: "chat", replicas: 3 }));
    runs = 0;
    const ids = ["a", "b", "c"].map(
      (h, i) => join_(cluster, `node-${h}`, "1xh100-80g", `10.0.0.${i}`).nodeId,
    );
    expect(runs).toBe(0);
    expect(queued).toHaveLength(1);
    queued.shift()?.();
    expect(runs).toBe(1);
    expect(placedOn(cluster, "chat")).toEqual([...ids].sort());
  });

  it("manages API keys by hash", () => {
    const cluster = newCluster();
    const { key, secret } = cluster.apiKeys.create({
      name: "app",
      models: ["chat"],
      requestsPerMinute: 60,
    });
    expect(secret.startsWith(key.prefix)).toBe(true);
    expect(cluster.apiKeys.authenticate(secret)).toMatchObject({
      name: "app",
      models: ["chat"],
      requestsPerMinute: 60,
    });
    expect(cluster.apiKeys.authenticate(`${secret}x`)).toBeUndefined();
    expect(() => cluster.apiKeys.create({ name: "app", models: [] })).toThrow(/already exists/);
    cluster.apiKeys.revoke("app");
    expect(cluster.apiKeys.authenticate(secret)).toBeUndefined();
    expect(cluster.apiKeys.list()).toEqual([]);
    expect(cluster.apiKeys.list(true)).toHaveLength(1);
  });

  it.each<[string, Partial<Parameters<Cluster["apiKeys"]["create"]>[0]>, string]>([
    [
      "rpm 0",
      { requestsPerMinute: 0 },
      "API key requestsPerMinute must be a whole number in 1–4294967295, or unset for no limit (got 0)",
    ],
    [
      "a fractional tpm",
      { tokensPerMinute: 1.5 },
      "API key tokensPerMinute must be a whole number in 1–4294967295, or unset for no limit (got 1.5)",
    ],
    [
      "maxConcurrency past uint32",
      { maxConcurrency: 2 ** 32 },
      "API key maxConcurrency must be a whole number in 1–4294967295, or unset for no limit (got 4294967296)",
    ],
    [
      "maxConcurrency 0",
      { maxConcurrency: 0 },
      "API key maxConcurrency must be a whole number in 1–4294967295, or unset for no limit (got 0)",
    ],
    [
      "an empty model name",
      { models: ["org/chat", ""] },
      'API key models[1] must be a served model name of 1–256 characters (got "")',
    ],
    [
      "a 300-character model name",
      { models: ["m".repeat(300)] },
      `API key models[0] must be a served model name of 1–256 characters (got "${"m".repeat(64)}"… (300 characters))`,
    ],
    [
      "more models than routers hold",
      { models: Array.from({ length: 100_001 }, (_, i) => `m${i}`) },
      "API key models must list at most 100000 names (got 100001)",
    ],
  ])("refuses an API key routers would refuse: %s", (_name, input, message) => {
    const cluster = newCluster();
    expect(() => cluster.apiKeys.create({ name: "app", models: [], ...input })).toThrow(
      expect.objectContaining({ code: "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT", message }),
    );
    expect(cluster.apiKeys.list(true)).toEqual([]);
    expect(store.listApiKeys()).toEqual([]);
  });

  it("accepts the limits' ends, and refuses a key beyond maxApiKeys active ones", () => {
    const cluster = newCluster(undefined, { maxApiKeys: 2 });
    cluster.apiKeys.create({
      name: "a",
      models: ["m".repeat(256)],
      requestsPerMinute: 1,
      tokensPerMinute: 2 ** 32 - 1,
      maxConcurrency: 1,
    });
    cluster.apiKeys.create({ name: "b", models: [] });
    expect(() => cluster.apiKeys.create({ name: "c", models: [] })).toThrow(
      expect.objectContaining({
        code: "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
        message: "2 API keys are active, the most this control plane holds (2); revoke one first",
      }),
    );
    // A revoked key frees its place.
    cluster.apiKeys.revoke("a");
    expect(cluster.apiKeys.create({ name: "c", models: [] }).key.name).toBe("c");
  });

  it("answers heartbeats while the store is full and writes their events and placements once it frees", () => {
    const lines: string[] = [];
    const cluster = newCluster((line) => lines.push(line));
    const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    cluster.applyDeployment(spec({ name: "chat" }));
    const b = join_(cluster, "node-b", "1xh100-80g", "10.0.0.2");
    expect(placedOn(cluster, "chat")).toEqual([a.nodeId]);
    const ready = rankStatus({ replicaId: "chat-0", rank: 0, state: "ready", apiPort: 41_000 });
    cluster.heartbeat(a.nodeId, { gpus: [], replicas: [ready], problems: [] });
    const eventsBefore = cluster.events.list({ limit: 1_000 }).length;

    const free = fillDisk(join(dir, "state.db"));
    // An operator's change is refused whole, with the store's code.
    expect(() => cluster.scaleDeployment("chat", 2)).toThrow(
      expect.objectContaining({ code: "LLMGW_CONTROL_PLANE_STORE_FAILED" }),
    );
    expect(cluster.deploymentStatus("chat").desiredReplicas).toBe(1);
    // A heartbeat reporting a crash and a broken GPU is answered and applied in memory.
    const gpu = cluster.getNode(a.nodeId).inventory.gpus[0];
    const desired = cluster.heartbeat(a.nodeId, {
      gpus: [
        gpuReading({
          index: 0,
          uuid: gpu?.uuid ?? "",
          healthy: false,
          healthProblems: [
            { code: "xid", message: "Xid 79: GPU has fallen off the bus", source: "kernel-log" },
          ],
        }),
      ],
      replicas: [{ ...ready, state: "failed", logTail: ["boom"] }],
      problems: [],
    });
    expect(desired.assignments).toEqual([]);
    expect(placedOn(cluster, "chat")).toEqual([b.nodeId]);
    expect(cluster.desiredSet(b.nodeId).assignments.map((x) => x.replicaId)).toEqual(["chat-1"]);
    expect(cluster.events.list({ limit: 1_000 })).toHaveLength(eventsBefore);
    // One line per kind of write held back: events, replica statuses, placements.
    expect(
      lines.filter((l) => l.includes("kept in memory only")).map((l) => l.split(" kept")[0]),
    ).toEqual(["events", "replica statuses", "placements"]);
    expect(lines.some((l) => l.startsWith("gpu.health ") && l.includes("fallen off the bus"))).toBe(
      true,
    );
    // Nothing is lost while the disk stays full; the next tick that finds it writable
    // stores the held events in order and the placements as memory has them.
    cluster.tick();
    free();
    cluster.tick();
    const kinds = cluster.events
      .list({ limit: 1_000 })
      .slice(eventsBefore)
      .map((e) => e.kind);
    expect(kinds).toEqual(
      expect.arrayContaining(["gpu.health", "replica.state", "replica.removed", "replica.placed"]),
    );
    expect(kinds.indexOf("gpu.health")).toBeLessThan(kinds.indexOf("replica.placed"));
    expect(lines).toContain("events written to the state store again");
    expect(placedOn(newCluster(), "chat")).toEqual([b.nodeId]);
  });

  it("keeps only the newest unwritten events while the disk is full, and says how many it dropped", () => {
    const lines: string[] = [];
    const cluster = newCluster((line) => lines.push(line), { unwrittenEventsKept: 3 });
    const a = join_(cluster, "node-a", "1xh100-80g", "10.0.0.1");
    const free = fillDisk(join(dir, "state.db"));
    // Refused takeovers raise an event each (one a minute per node) and write nothing else.
    for (let i = 0; i < 5; i++) {
      clock.advance(60_000);
      expect(() =>
        join_(cluster, `evil-${i}`, "1xh100-80g", "10.6.6.6", { nodeId: a.nodeId }),
      ).toThrow(/needs its node credential/);
    }
    expect(lines.filter((l) => l.startsWith("events kept in memory only (up to 3),"))).toHaveLength(
      1,
    );
    free();
    cluster.tick();
    const refused = cluster.events
      .list({ limit: 1_000 })
      .filter((e) => e.kind === "node.takeover_refused")
      .map((e) => e.message.split(" ")[3]);
    expect(refused).toEqual(["evil-2", "evil-3", "evil-4"]);
    expect(lines).toContain(
      "events written to the state store again; 2 older ones were dropped while it failed",
    );
  });
});
