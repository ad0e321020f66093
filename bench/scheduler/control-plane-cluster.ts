/**
 * The control plane's own cluster for the scheduler benchmarks: a real `Cluster` over a real
 * SQLite store, nodes registered as agents register them (simulated 8-GPU inventories) and
 * deployments applied through `applyDeployment`, so the scheduler sees the input the control
 * plane builds (node objects cached per node, placements mapped afresh per reconcile).
 */
import { join } from "node:path";
import {
  Cluster,
  type ClusterStore,
  type InventoryLookup,
  openSqliteStore,
} from "@llmgw/control-plane";
import { simulateInventory } from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import { type ScheduleInput, schedule } from "@llmgw/scheduler";

/** A cluster built and placed by {@link buildPlacedCluster}. */
export interface PlacedCluster {
  readonly cluster: Cluster;
  readonly store: ClusterStore;
  readonly nodeIds: readonly string[];
  /** The scheduler's last input, as the cluster built it. */
  lastInput(): ScheduleInput;
}

/** What {@link newCluster} records: the scheduler's last input, and each reconcile's ms as the
 * control plane times it (`onReconciled`, its `llmgw_control_plane_reconcile_duration_seconds`). */
export interface Recorded {
  input?: ScheduleInput;
  reconcileMs?: number[];
}

/**
 * A `Cluster` on `store` at a fixed clock that records each scheduler input and reconcile time
 * in `recorded` and queues its reconciles in `deferred` (run them to reconcile).
 */
export function newCluster(
  store: ClusterStore,
  recorded: Recorded,
  deferred: (() => void)[],
  readOnly = false,
  inventories?: InventoryLookup,
) {
  const now = 1_800_000_000_000;
  return new Cluster({
    store,
    schedule: (input) => {
      recorded.input = input;
      return schedule(input);
    },
    clock: { now: () => now },
    onReconciled: (ms) => {
      recorded.reconcileMs?.push(ms);
    },
    heartbeatIntervalMs: 2_000,
    unreachableAfterMs: 6_000,
    nodeLostAfterMs: 60_000,
    rendezvousPortMin: 29_500,
    rendezvousPortMax: 29_999,
    maxNodes: 1_000_000,
    // Registering thousands of nodes reconciles once, as the production defer coalesces.
    defer: (run) => deferred.push(run),
    readOnly,
    ...(inventories === undefined ? {} : { inventories }),
  });
}

/** `nodes` 8-GPU nodes on four fabrics and `deployments` of 1–8 GPUs, placed. */
export function buildPlacedCluster(dir: string, nodes: number, deployments: number): PlacedCluster {
  const store = openSqliteStore({ file: join(dir, `state-${nodes}.db`) });
  const recorded: Recorded = {};
  const deferred: (() => void)[] = [];
  const cluster = newCluster(store, recorded, deferred);
  // Deployments first, then the nodes in one coalesced reconcile: one plan places them all
  // (applying 2,000 deployments to 10,000 registered nodes one by one took minutes).
  const tps = [1, 2, 4, 8];
  for (let i = 0; i < deployments; i++) {
    cluster.applyDeployment(
      parseDeploymentSpecOrThrow({
        name: `m${String(i).padStart(4, "0")}`,
        engine: "vllm",
        model: "org/m",
        gpuClass: "h100-80g",
        tensorParallel: tps[i % 4],
        replicas: 2 + ((i * 3) % 7),
      }),
    );
    for (const run of deferred.splice(0)) run();
  }
  const nodeIds: string[] = [];
  store.transaction(() => {
    for (let i = 0; i < nodes; i++) {
      const fabric = `ib-${"abcd"[i % 4]}`;
      const r = cluster.register({
        inventory: simulateInventory(`8xh100-80g@${fabric}`, {
          hostname: `n${String(i).padStart(5, "0")}`,
          addresses: ["10.0.0.1"],
          nowMs: 1_800_000_000_000,
        }),
        advertiseAddress: "10.0.0.1",
        replicas: [],
      });
      nodeIds.push(r.nodeId);
    }
  });
  for (const run of deferred.splice(0)) run();
  return {
    cluster,
    store,
    nodeIds,
    lastInput: () => recorded.input as ScheduleInput,
  };
}

/** A fresh copy of each node object: what the scheduler sees with nothing cached. */
export function coldInput(input: ScheduleInput): ScheduleInput {
  return { ...input, nodes: input.nodes.map((n) => ({ ...n })) };
}
