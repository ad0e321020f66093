import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { simulateInventory } from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import { ReplicaState, ReplicaStatusSchema } from "@llmgw/proto";
import { schedule } from "@llmgw/scheduler";
import { inventoryToProto } from "@llmgw/wire";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { Cluster } from "./domain/cluster.js";
import { createClusterRouteTable } from "./public-api.js";
import { openSqliteStore } from "./store/sqlite-store.js";
import type { ClusterStore } from "./store/types.js";
import { createManualClock } from "./testing/manual-clock.js";

let dir: string;
let store: ClusterStore;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "llmgw-public-api-"));
  store = openSqliteStore({ file: join(dir, "state.db") });
});
afterEach(() => {
  store.close();
  rmSync(dir, { recursive: true, force: true });
});

describe("createClusterRouteTable", () => {
  it("resolves unknown, loading and ready models from the live cluster, cached per version", () => {
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
    const table = createClusterRouteTable(cluster);
    expect(table.resolve("org/chat")).toBeUndefined();

    cluster.applyDeployment(
      parseDeploymentSpecOrThrow({
        name: "chat",
        engine: "vllm",
        model: "org/model",
        servedModelName: "org/chat",
        gpuClass: "h100-80g",
        routingPolicy: "round-robin",
      }),
    );
    // Known but nowhere to run: the deployment's own name and policy, nothing loading.
    expect(table.resolve("org/chat")).toEqual({
      deployment: "chat",
      policy: "round-robin",
      replicas: [],
      loading: false,
    });

    const { nodeId } = cluster.register({
      inventory: inventoryToProto(
        simulateInventory("1xh100-80g", { hostname: "node-a", addresses: ["10.0.0.1"] }),
      ),
      advertiseAddress: "10.0.0.1",
      replicas: [],
    });
    const report = (state: ReplicaState) =>
      cluster.heartbeat(nodeId, {
        gpus: [],
        replicas: [
          create(ReplicaStatusSchema, { replicaId: "chat-0", rank: 0, state, apiPort: 41_000 }),
        ],
        problems: [],
      });
    report(ReplicaState.LOADING);
    expect(table.resolve("org/chat")).toMatchObject({ replicas: [], loading: true });

    report(ReplicaState.READY);
    const ready = table.resolve("org/chat");
    expect(ready).toMatchObject({
      deployment: "chat",
      policy: "round-robin",
      loading: false,
      replicas: [{ id: "chat-0", baseUrl: "http://10.0.0.1:41000", state: "ready" }],
    });
    expect(table.resolve("org/chat")).toBe(ready);
    expect(table.models()).toEqual(["org/chat"]);
  });
});
