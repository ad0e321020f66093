import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { simulateInventory } from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import { schedule } from "@llmgw/scheduler";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { createClusterView } from "./cluster-view.js";
import { Cluster } from "./domain/cluster.js";
import type { ReplicaStateName } from "./domain/replica-state.js";
import { openSqliteStore } from "./store/sqlite-store.js";
import type { ClusterStore } from "./store/types.js";
import { createManualClock } from "./testing/manual-clock.js";
import { gpuReading, rankStatus } from "./testing/reports.js";

let dir: string;
let store: ClusterStore;

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "llmgw-cluster-view-"));
  store = openSqliteStore({ file: join(dir, "state.db") });
});
afterEach(() => {
  store.close();
  rmSync(dir, { recursive: true, force: true });
});

function setup() {
  const cluster = new Cluster({
    store,
    schedule,
    clock: createManualClock(),
    heartbeatIntervalMs: 1_000,
    unreachableAfterMs: 3_000,
    nodeLostAfterMs: 10_000,
    rendezvousPortMin: 29_500,
    rendezvousPortMax: 29_999,
  });
  const { nodeId } = cluster.register({
    inventory: simulateInventory("2xh100-80g", { hostname: "node-a", addresses: ["10.0.0.1"] }),
    advertiseAddress: "10.0.0.1",
    replicas: [],
  });
  const deploy = (name: string, replicas: number) =>
    cluster.applyDeployment(
      parseDeploymentSpecOrThrow({
        name,
        engine: "vllm",
        model: "org/model",
        gpuClass: "h100-80g",
        replicas,
      }),
    );
  const heartbeat = (states: Record<string, ReplicaStateName>) =>
    cluster.heartbeat(nodeId, {
      gpus: [],
      replicas: Object.entries(states).map(([replicaId, state]) =>
        rankStatus({ replicaId, rank: 0, state, apiPort: 41_000 }),
      ),
      problems: [],
    });
  return { cluster, nodeId, deploy, heartbeat, view: createClusterView(cluster) };
}

describe("createClusterView: deployments and replicas", () => {
  it("follows replica states and deployments across heartbeats", () => {
    const { deploy, heartbeat, view } = setup();
    deploy("chat", 1);
    expect(view.replicas()).toEqual([{ id: "chat-0", deployment: "chat", state: "pending" }]);
    expect(view.deployments()).toMatchObject([{ name: "chat", desired: 1, ready: 0 }]);

    heartbeat({ "chat-0": "ready" });
    expect(view.replicas()).toEqual([{ id: "chat-0", deployment: "chat", state: "ready" }]);
    expect(view.deployments()).toMatchObject([{ name: "chat", desired: 1, ready: 1 }]);

    // A heartbeat that changes nothing routers see keeps the same lists.
    const replicas = view.replicas();
    heartbeat({ "chat-0": "ready" });
    expect(view.replicas()).toBe(replicas);

    heartbeat({ "chat-0": "unhealthy" });
    expect(view.replicas()).toEqual([{ id: "chat-0", deployment: "chat", state: "unhealthy" }]);
    expect(view.deployments()).toMatchObject([{ name: "chat", ready: 0 }]);

    deploy("batch", 1);
    deploy("chat", 2);
    expect(view.deployments().map((d) => [d.name, d.desired])).toEqual([
      ["batch", 1],
      ["chat", 2],
    ]);
    // Placed replicas only: two GPUs, batch's one and chat's first.
    expect(view.replicas().map((r) => r.id)).toEqual(["batch-0", "chat-0"]);
  });

  it("says which replicas are leaving, and how", () => {
    const { deploy, heartbeat, view } = setup();
    deploy("chat", 1);
    heartbeat({ "chat-0": "ready" });
    deploy("chat", 0);
    expect(view.replicas()).toEqual([
      { id: "chat-0", deployment: "chat", state: "ready", leaving: "draining" },
    ]);
  });

  it("reads unschedulable at every call", () => {
    const { cluster, deploy, view } = setup();
    deploy("chat", 1);
    expect(view.deployments()).toMatchObject([{ name: "chat", unschedulable: false }]);
    // Two GPUs on the only node: a third replica of one GPU cannot be placed.
    deploy("chat", 3);
    expect(cluster.unschedulableReasons("chat").length).toBeGreaterThan(0);
    expect(view.deployments()).toMatchObject([{ name: "chat", unschedulable: true }]);
  });

  it("hands over the same GPU views while only readings move, and new ones when more does", () => {
    const { cluster, nodeId, deploy, view } = setup();
    const uuids = view.nodes()[0]?.gpus.map((g) => g.uuid) ?? [];
    const beat = (util: number, healthy = true) =>
      cluster.heartbeat(nodeId, {
        gpus: uuids.map((uuid, index) =>
          gpuReading({
            index,
            uuid,
            utilizationPercent: util,
            ...(healthy || index === 0
              ? {}
              : {
                  healthy: false,
                  healthProblems: [{ code: "X", message: "ECC", source: "nvidia-smi" }],
                }),
          }),
        ),
        replicas: [],
        problems: [],
      });
    beat(10);
    const first = view.nodes()[0];
    expect(first?.gpuReadings?.map((r) => r?.utilizationPercent)).toEqual([10, 10]);
    expect(first?.gpus[0]).not.toHaveProperty("utilizationPercent");

    beat(20);
    const second = view.nodes()[0];
    expect(second?.gpus).toBe(first?.gpus);
    expect(second?.gpuReadings?.map((r) => r?.utilizationPercent)).toEqual([20, 20]);

    deploy("chat", 1);
    const placed = view.nodes()[0];
    expect(placed?.gpus).not.toBe(second?.gpus);
    expect(placed?.gpus.map((g) => g.allocatedDeployment)).toEqual(["chat", undefined]);
    // The GPU whose inputs did not move keeps its view.
    expect(placed?.gpus[1]).toBe(second?.gpus[1]);

    beat(20, false);
    const sick = view.nodes()[0];
    expect(sick?.gpus.map((g) => g.healthy)).toEqual([true, false]);
    expect(sick?.gpus[1]?.healthProblems).toEqual(["X"]);
    expect(sick?.healthy).toBe(false);
  });

  it("lists the GPUs a placement holds by deployment", () => {
    const { deploy, view } = setup();
    deploy("chat", 1);
    const gpus = view.nodes()[0]?.gpus ?? [];
    expect(gpus.map((g) => g.allocatedDeployment)).toEqual(["chat", undefined]);
    expect(gpus.every((g) => g.healthy)).toBe(true);
  });
});
