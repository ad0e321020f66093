// The last reported replica statuses survive a control-plane restart: what routing needs is
// kept in the store (written on change, deleted with the placement) and restored at start, so
// routers are not told "no replicas" until every agent has heartbeated.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { simulateInventory } from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import { schedule } from "@llmgw/scheduler";
import Database from "better-sqlite3";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { openSqliteStore } from "../store/sqlite-store.js";
import type { ClusterStore, ReplicaStatusRecord } from "../store/types.js";
import { fillDisk } from "../testing/full-disk.js";
import { createManualClock, type ManualClock } from "../testing/manual-clock.js";
import { rankStatus } from "../testing/reports.js";
import { Cluster } from "./cluster.js";
import { DRAIN_SETTLE_MS } from "./drains.js";
import type { ReplicaStateName } from "./replica-state.js";

let dir: string;
let file: string;
let store: ClusterStore;
let clock: ManualClock;

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "llmgw-restore-"));
  file = join(dir, "state.db");
  store = openSqliteStore({ file });
  clock = createManualClock();
});
afterEach(() => {
  store.close();
  rmSync(dir, { recursive: true, force: true });
});

/** A control plane over `s` (default: the test's store). */
function start(s: ClusterStore = store, log?: (line: string) => void) {
  return new Cluster({
    store: s,
    schedule,
    clock,
    log,
    heartbeatIntervalMs: 1000,
    unreachableAfterMs: 3000,
    nodeLostAfterMs: 10_000,
    rendezvousPortMin: 29_500,
    rendezvousPortMax: 29_999,
  });
}

/** The store closed and opened again from its file, as a restarted process does. */
function reopen(): ClusterStore {
  store.close();
  store = openSqliteStore({ file, expectExisting: true });
  return store;
}

const spec = (input: Record<string, unknown>) =>
  parseDeploymentSpecOrThrow({ engine: "sim", model: "org/model", gpuClass: "h100-80g", ...input });

function join_(cluster: Cluster, hostname: string, address: string, sim = "1xh100-80g@ib-a") {
  return cluster.register({
    inventory: simulateInventory(sim, { hostname, addresses: [address], nowMs: clock.now() }),
    advertiseAddress: address,
    replicas: [],
  }).nodeId;
}

/** Node `nodeId` reports every rank it runs in `state` on port 8000. */
function beat(
  cluster: Cluster,
  nodeId: string,
  state: ReplicaStateName = "ready",
  extra: { load?: { running: number }; stateSinceMs?: number; pid?: number } = {},
) {
  return cluster.heartbeat(nodeId, {
    gpus: [],
    problems: [],
    replicas: cluster.desiredSet(nodeId).assignments.map((x) =>
      rankStatus({
        replicaId: x.replicaId,
        rank: x.rank,
        state,
        apiPort: 8000,
        stateSinceMs: extra.stateSinceMs ?? 1,
        specHash: "spec-1",
        revision: 1,
        pid: extra.pid ?? 4242,
        startedAtMs: 5,
        message: "serving",
        logTail: ["a line of output"],
        ...(extra.load ? { load: extra.load } : {}),
      }),
    ),
    engineCredentials: cluster
      .desiredSet(nodeId)
      .assignments.filter((x) => x.rank === 0)
      .map((x) => ({ replicaId: x.replicaId, apiKey: `engine-key-${x.replicaId}` })),
  });
}

/** One node serving one ready replica of "chat", then a restart over the same file. */
function readyThenRestart() {
  const first = start();
  const a = join_(first, "node-a", "10.0.0.1");
  first.applyDeployment(spec({ name: "chat" }));
  beat(first, a, "ready", { load: { running: 3 } });
  const before = first.routingMembership();
  const lines: string[] = [];
  const again = start(reopen(), (line) => lines.push(line));
  return { first, again, a, before, lines };
}

describe("replica statuses across a control-plane restart", () => {
  it("route the replica that was ready before any agent has heartbeated", () => {
    const { again, a, before, lines } = readyThenRestart();
    expect(again.nodeState(a)).toBe("unreachable");
    const [replica] = again.routingMembership().replicas;
    // Engine keys and load are not kept: routers keep the key they hold; load comes back
    // with the next report.
    const {
      apiKey: _key,
      load: _load,
      loadReportedAtMs: _at,
      ...routed
    } = before.replicas[0] ?? {};
    expect(replica).toEqual(routed);
    expect(replica).toMatchObject({
      id: "chat-0",
      baseUrl: "http://10.0.0.1:8000",
      state: "ready",
    });
    expect(again.readyModels()).toEqual(["chat"]);
    expect(again.listReplicas()[0]?.ranks[0]?.status).toMatchObject({
      state: "ready",
      apiPort: 8000,
      stateSinceMs: 1,
      specHash: "spec-1",
      revision: 1,
      pid: 4242,
      startedAtMs: 5,
      message: "",
      logTail: [],
    });
    expect(lines).toContain(
      "restored the last reported status of 1 replica rank; each holds until its node reports again or is lost",
    );
  });

  it("take the node's next heartbeat as news only where it differs", () => {
    const { again, a } = readyThenRestart();
    const version = again.routingVersion;
    const eventsBefore = again.events.list({ limit: 100 }).length;
    beat(again, a);
    // Same states: no replica.state event; only the learnt engine key moves the routing.
    expect(
      again.events
        .list({ limit: 100 })
        .slice(eventsBefore)
        .map((e) => e.kind),
    ).toEqual(["node.ready"]);
    expect(again.routingVersion).toBe(version + 1);
    expect(again.routingMembership().replicas[0]?.apiKey).toBe("engine-key-chat-0");
  });

  it("drop the replica when its node then reports it failed", () => {
    const { again, a } = readyThenRestart();
    expect(again.routingMembership().replicas.map((r) => r.id)).toEqual(["chat-0"]);
    beat(again, a, "failed");
    expect(again.routingMembership().replicas).toEqual([]);
    expect(store.listReplicaStatuses().map((r) => r.state)).toEqual(["failed"]);
  });

  it("drop the replica, and its kept status, when its node is declared lost", () => {
    const first = start();
    const a = join_(first, "node-a", "10.0.0.1");
    first.applyDeployment(spec({ name: "chat" }));
    beat(first, a);
    const again = start(reopen());
    clock.advance(3_000);
    again.tick();
    expect(again.nodeState(a)).toBe("unreachable");
    expect(again.routingMembership().replicas.map((r) => r.id)).toEqual(["chat-0"]);
    clock.advance(10_000);
    again.tick();
    expect(again.nodeState(a)).toBe("lost");
    expect(again.routingMembership().replicas).toEqual([]);
    expect(store.listReplicaStatuses()).toEqual([]);
  });

  it("restore every rank of a multi-node replica, on the node each rank is placed on", () => {
    const first = start();
    const a = join_(first, "node-a", "10.0.0.1");
    const b = join_(first, "node-b", "10.0.0.2");
    first.applyDeployment(spec({ name: "big", tensorParallel: 2, nodesPerReplica: 2 }));
    beat(first, a);
    beat(first, b);
    const [p] = first.placements();
    const rank0Address = p?.ranks[0]?.nodeId === a ? "10.0.0.1" : "10.0.0.2";
    const again = start(reopen());
    expect(again.routingMembership().replicas.map((r) => r.baseUrl)).toEqual([
      `http://${rank0Address}:8000`,
    ]);
    expect(
      store
        .listReplicaStatuses()
        .map((r) => `${r.rank}@${r.nodeId}`)
        .sort(),
    ).toEqual(p?.ranks.map((r) => `${r.rank}@${r.nodeId}`).sort());
  });
});

describe("kept replica statuses", () => {
  /** The test's store, counting status writes. */
  function counting() {
    const writes: string[] = [];
    const counted: ClusterStore = {
      ...store,
      putReplicaStatus: (r: ReplicaStatusRecord) => {
        writes.push(`put ${r.replicaId}#${r.rank} ${r.state}`);
        store.putReplicaStatus(r);
      },
      deleteReplicaStatuses: (replicaId: string, rank?: number) => {
        writes.push(`delete ${replicaId}${rank === undefined ? "" : `#${rank}`}`);
        store.deleteReplicaStatuses(replicaId, rank);
      },
    };
    return { counted, writes };
  }

  it("are written when a kept field changes, not per heartbeat", () => {
    const { counted, writes } = counting();
    const cluster = start(counted);
    const a = join_(cluster, "node-a", "10.0.0.1");
    cluster.applyDeployment(spec({ name: "chat" }));
    beat(cluster, a, "loading");
    beat(cluster, a, "loading", { load: { running: 1 } });
    beat(cluster, a, "ready", { stateSinceMs: 2 });
    for (let i = 0; i < 5; i++)
      beat(cluster, a, "ready", { stateSinceMs: 2, load: { running: i } });
    // A restarted engine: same state, a new process.
    beat(cluster, a, "ready", { stateSinceMs: 2, pid: 4343 });
    expect(writes).toEqual(["put chat-0#0 loading", "put chat-0#0 ready", "put chat-0#0 ready"]);
    expect(store.listReplicaStatuses()).toEqual([
      {
        replicaId: "chat-0",
        rank: 0,
        nodeId: a,
        state: "ready",
        apiPort: 8000,
        stateSinceMs: 2,
        specHash: "spec-1",
        revision: 1,
        pid: 4343,
        startedAtMs: 5,
      },
    ]);
  });

  it("are deleted with their placement, and when the node stops reporting the rank", () => {
    const { counted, writes } = counting();
    const cluster = start(counted);
    const a = join_(cluster, "node-a", "10.0.0.1", "2xh100-80g@ib-a");
    cluster.applyDeployment(spec({ name: "chat", replicas: 2 }));
    beat(cluster, a);
    expect(store.listReplicaStatuses().map((r) => r.replicaId)).toEqual(["chat-0", "chat-1"]);
    cluster.scaleDeployment("chat", 1);
    // The surplus replica drains first; with no router connected it stops once the settle
    // time passed.
    clock.advance(DRAIN_SETTLE_MS);
    cluster.tick();
    const kept = cluster.placements().map((p) => p.replicaId);
    expect(kept).toHaveLength(1);
    expect(store.listReplicaStatuses().map((r) => r.replicaId)).toEqual(kept);
    writes.length = 0;
    cluster.heartbeat(a, { gpus: [], problems: [], replicas: [] });
    expect(writes).toEqual([`delete ${kept[0]}#0`]);
    expect(store.listReplicaStatuses()).toEqual([]);
  });

  it("are neither restored nor kept for a placement that is gone", () => {
    const cluster = start();
    const a = join_(cluster, "node-a", "10.0.0.1");
    cluster.applyDeployment(spec({ name: "chat" }));
    beat(cluster, a);
    store.putReplicaStatus({
      replicaId: "ghost-0",
      rank: 0,
      nodeId: a,
      state: "ready",
      apiPort: 9000,
      stateSinceMs: 1,
      specHash: "",
      revision: 1,
    });
    store.putReplicaStatus({
      replicaId: "chat-0",
      rank: 1,
      nodeId: a,
      state: "ready",
      stateSinceMs: 1,
      specHash: "",
      revision: 1,
    });
    const again = start(reopen());
    expect(again.routingMembership().replicas.map((r) => r.id)).toEqual(["chat-0"]);
    expect(store.listReplicaStatuses().map((r) => `${r.replicaId}#${r.rank}`)).toEqual([
      "chat-0#0",
    ]);
  });

  it("wait in memory while the store is full and are written at the first tick after", () => {
    const lines: string[] = [];
    const cluster = start(store, (line) => lines.push(line));
    const a = join_(cluster, "node-a", "10.0.0.1");
    cluster.applyDeployment(spec({ name: "chat" }));
    beat(cluster, a, "loading");
    const free = fillDisk(file);
    const db = new Database(file);
    for (const op of ["INSERT", "UPDATE", "DELETE"]) {
      db.exec(
        `CREATE TRIGGER full_statuses_${op.toLowerCase()} BEFORE ${op} ON replica_statuses
         BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END;`,
      );
    }
    expect(() => beat(cluster, a, "ready")).not.toThrow();
    expect(cluster.routingMembership().replicas.map((r) => r.id)).toEqual(["chat-0"]);
    expect(store.listReplicaStatuses().map((r) => r.state)).toEqual(["loading"]);
    expect(lines.some((l) => l.startsWith("replica statuses kept in memory only"))).toBe(true);
    cluster.tick();
    expect(store.listReplicaStatuses().map((r) => r.state)).toEqual(["loading"]);
    for (const op of ["insert", "update", "delete"]) db.exec(`DROP TRIGGER full_statuses_${op}`);
    db.close();
    free();
    cluster.tick();
    expect(store.listReplicaStatuses().map((r) => r.state)).toEqual(["ready"]);
    expect(lines).toContain("replica statuses written to the state store again (1)");
  });
});
