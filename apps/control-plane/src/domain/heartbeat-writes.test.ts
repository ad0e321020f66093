// A heartbeat that repeats what the node reported before (moving readings and load, the same
// statuses) writes nothing to the store: at 500 heartbeats a second every write would be a
// transaction per beat. The recording store below is the real SQLite store with every write
// method noted on the way through.
import { type Gpu, type GpuReading, simulateInventory } from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import { schedule } from "@llmgw/scheduler";
import { describe, expect, it } from "vitest";
import type { ClusterStore } from "../store/types.js";
import type { ManualClock } from "../testing/manual-clock.js";
import { gpuReading, rankStatus } from "../testing/reports.js";
import { sqliteStoreEachTest } from "../testing/sqlite-fixture.js";
import { Cluster } from "./cluster.js";
import type { RankStatus } from "./views.js";

let store: ClusterStore;
let clock: ManualClock;

sqliteStoreEachTest("llmgw-heartbeat-writes-", (f) => {
  ({ store, clock } = f);
});

/** The test's store, noting the name of every method that may write (all but reads). */
function recording(inner: ClusterStore) {
  const writes: string[] = [];
  const recorded = { ...inner } as Record<string, unknown>;
  for (const [name, fn] of Object.entries(inner)) {
    if (typeof fn !== "function" || /^(list|flush|close)/.test(name)) continue;
    recorded[name] = (...args: unknown[]) => {
      writes.push(name);
      return (fn as (...a: unknown[]) => unknown)(...args);
    };
  }
  return { store: recorded as unknown as ClusterStore, writes };
}

const plain = () =>
  simulateInventory("2xh100-80g@ib-a", {
    hostname: "node-a",
    addresses: ["10.0.0.1"],
    nowMs: clock.now(),
  });

/** What an agent reports of a discovered GPU with each heartbeat: its readings, not its facts. */
const readingOf = (g: Gpu): GpuReading =>
  gpuReading({
    index: g.index,
    uuid: g.uuid,
    memoryUsedBytes: g.memoryUsedBytes,
    utilizationPercent: g.utilizationPercent,
    eccUncorrectedErrors: g.eccUncorrectedErrors,
    temperatureCelsius: g.temperatureCelsius,
    powerWatts: g.powerWatts,
    healthy: g.healthy,
    healthProblems: g.healthProblems,
    unmanagedMemoryBytes: g.unmanagedMemoryBytes,
    lost: g.lost,
    health: g.health,
    faults: g.faults,
  });

/** One node with one replica of a sim deployment placed on it. */
function setup() {
  const { store: recorded, writes } = recording(store);
  const cluster = new Cluster({
    store: recorded,
    schedule,
    clock,
    heartbeatIntervalMs: 1_000,
    unreachableAfterMs: 3_000,
    nodeLostAfterMs: 10_000,
    rendezvousPortMin: 29_500,
    rendezvousPortMax: 29_999,
  });
  const { nodeId } = cluster.register({
    inventory: plain(),
    advertiseAddress: "10.0.0.1",
    replicas: [],
  });
  cluster.applyDeployment(
    parseDeploymentSpecOrThrow({
      name: "chat",
      engine: "sim",
      model: "org/model",
      gpuClass: "h100-80g",
      tensorParallel: 2,
    }),
  );
  return { cluster, nodeId, writes };
}

/** The node's beat `n`: readings and load that move every time, the rank READY since 5. */
function beat(cluster: Cluster, nodeId: string, n: number) {
  const desired = cluster.desiredSet(nodeId);
  const gpus: GpuReading[] = plain().gpus.map((g) => ({
    ...readingOf(g),
    utilizationPercent: 40 + n,
    temperatureCelsius: 35 + (n % 10),
    memoryUsedBytes: 60 * 1024 ** 3,
  }));
  const replicas: RankStatus[] = desired.assignments.map((a) =>
    rankStatus({
      replicaId: a.replicaId,
      rank: a.rank,
      state: "ready",
      apiPort: 8000,
      pid: 4242,
      startedAtMs: 5,
      stateSinceMs: 5,
      specHash: "spec-1",
      revision: a.spec.revision,
      load: { running: n, waiting: n % 3, kvCacheUsage: 0.5, prefixCacheHitRate: 0.25 },
    }),
  );
  return cluster.heartbeat(nodeId, {
    gpus,
    replicas,
    problems: [],
    generationSeen: desired.generation,
  });
}

describe("a heartbeat that changes nothing", () => {
  it("writes nothing to the store; the first that brings a status does", () => {
    const { cluster, nodeId, writes } = setup();
    writes.length = 0;
    beat(cluster, nodeId, 0);
    // What the recording sees: the rank's first status, and its event.
    expect(writes).toEqual(expect.arrayContaining(["putReplicaStatus", "appendEvent"]));
    writes.length = 0;
    for (let n = 1; n <= 5; n++) {
      clock.advance(1_000);
      beat(cluster, nodeId, n);
    }
    expect(writes).toEqual([]);
    expect(cluster.nodeState(nodeId)).toBe("ready");
  });

  it("writes again once a GPU turns unhealthy, and not for the next beat that repeats it", () => {
    const { cluster, nodeId, writes } = setup();
    beat(cluster, nodeId, 0);
    writes.length = 0;
    const sick: GpuReading = { ...readingOf(plain().gpus[1] as Gpu), lost: true };
    const again = () =>
      cluster.heartbeat(nodeId, {
        gpus: [readingOf(plain().gpus[0] as Gpu), sick],
        replicas: [],
        problems: [],
      });
    again();
    expect(cluster.events.list({ limit: 100 }).map((e) => e.kind)).toContain("gpu.health");
    expect(writes).toContain("appendEvent");
    writes.length = 0;
    again();
    expect(writes).toEqual([]);
  });
});
