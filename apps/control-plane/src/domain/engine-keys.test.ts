// Engine API keys: reported by agents, kept in memory, put on the routes of the replicas the
// reporting node serves, and nowhere else (store, events, admin views).
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { toJsonString } from "@bufbuild/protobuf";
import { simulateInventory } from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import { ReplicaSchema } from "@llmgw/proto";
import { schedule } from "@llmgw/scheduler";
import { describe, expect, it } from "vitest";
import { replicaToProto } from "../convert/views.js";
import { openSqliteStore } from "../store/sqlite-store.js";
import type { ClusterStore } from "../store/types.js";
import type { ManualClock } from "../testing/manual-clock.js";
import { rankStatus } from "../testing/reports.js";
import { sqliteStoreEachTest } from "../testing/sqlite-fixture.js";
import { Cluster, type EngineCredentialInput } from "./cluster.js";

let dir: string;
let store: ClusterStore;
let clock: ManualClock;

sqliteStoreEachTest("llmgw-engine-keys-", (f) => {
  ({ dir, store, clock } = f);
});

function setup() {
  const cluster = new Cluster({
    store,
    schedule,
    clock,
    heartbeatIntervalMs: 1000,
    unreachableAfterMs: 3000,
    nodeLostAfterMs: 10_000,
    rendezvousPortMin: 29_500,
    rendezvousPortMax: 29_999,
  });
  const join_ = (hostname: string, address: string) =>
    cluster.register({
      inventory: simulateInventory("1xh100-80g@ib-a", {
        hostname,
        addresses: [address],
        nowMs: clock.now(),
      }),
      advertiseAddress: address,
      replicas: [],
    }).nodeId;
  const a = join_("node-a", "10.0.0.1");
  const b = join_("node-b", "10.0.0.2");
  /** Node `nodeId` reports every rank it runs as ready, plus `credentials`. */
  const beat = (nodeId: string, credentials: EngineCredentialInput[]) =>
    cluster.heartbeat(nodeId, {
      gpus: [],
      problems: [],
      replicas: cluster.desiredSet(nodeId).assignments.map((x) =>
        rankStatus({
          replicaId: x.replicaId,
          rank: x.rank,
          state: "ready",
          apiPort: 8000,
        }),
      ),
      engineCredentials: credentials,
    });
  const servedBy = (nodeId: string) =>
    cluster.placements().find((p) => p.ranks[0]?.nodeId === nodeId)?.replicaId as string;
  const keys = (model: string) =>
    Object.fromEntries(cluster.readyReplicas(model).map((r) => [r.replicaId, r.apiKey]));
  return { cluster, a, b, beat, servedBy, keys };
}

const spec = (input: Record<string, unknown>) =>
  parseDeploymentSpecOrThrow({ engine: "sim", model: "org/model", gpuClass: "h100-80g", ...input });

describe("engine API keys", () => {
  it("put each replica's key on its route, as its serving node last reported it", () => {
    const { cluster, a, b, beat, servedBy, keys } = setup();
    cluster.applyDeployment(spec({ name: "chat", replicas: 2 }));
    const onA = servedBy(a);
    const onB = servedBy(b);
    beat(a, [{ replicaId: onA, apiKey: "key-a-1" }]);
    beat(b, [{ replicaId: onB, apiKey: "key-b-1" }]);
    expect(keys("chat")).toEqual({ [onA]: "key-a-1", [onB]: "key-b-1" });

    // A restarted engine drew a new key: the route follows at the next heartbeat.
    beat(a, [{ replicaId: onA, apiKey: "key-a-2" }]);
    expect(keys("chat")[onA]).toBe("key-a-2");
    // An engine that reports no key any more (replaced by one without) has none on its route.
    beat(a, []);
    expect(keys("chat")).toEqual({ [onA]: undefined, [onB]: "key-b-1" });
  });

  it("ignore a key a node reports for a replica another node serves", () => {
    const { cluster, a, b, beat, servedBy, keys } = setup();
    cluster.applyDeployment(spec({ name: "chat", replicas: 2 }));
    const onA = servedBy(a);
    beat(a, [{ replicaId: onA, apiKey: "key-a" }]);
    beat(b, [{ replicaId: onA, apiKey: "planted-by-b" }]);
    expect(keys("chat")[onA]).toBe("key-a");
  });

  it("take a multi-node replica's key from its rank 0 only (the rank that serves the API)", () => {
    const { cluster, beat, keys } = setup();
    cluster.applyDeployment(spec({ name: "big", tensorParallel: 2, nodesPerReplica: 2 }));
    const [p] = cluster.placements();
    const rank0 = p?.ranks[0]?.nodeId as string;
    const rank1 = p?.ranks[1]?.nodeId as string;
    beat(rank1, [{ replicaId: p!.replicaId, apiKey: "from-rank-1" }]);
    beat(rank0, []);
    expect(keys("big")).toEqual({ [p!.replicaId]: undefined });
    beat(rank0, [{ replicaId: p!.replicaId, apiKey: "from-rank-0" }]);
    beat(rank1, [{ replicaId: p!.replicaId, apiKey: "from-rank-1" }]);
    expect(keys("big")).toEqual({ [p!.replicaId]: "from-rank-0" });
  });

  it("never reach the store, the events or the admin views", () => {
    const { cluster, a, b, beat, servedBy } = setup();
    cluster.applyDeployment(spec({ name: "chat", replicas: 2 }));
    const secret = "llmgw-engine-must-stay-in-memory";
    beat(a, [{ replicaId: servedBy(a), apiKey: secret }]);
    beat(b, []);
    expect(cluster.readyReplicas("chat").some((r) => r.apiKey === secret)).toBe(true);
    const views = [
      ...cluster.listReplicas().map((r) => JSON.stringify(r)),
      // As the admin API sends them.
      ...cluster.listReplicas().map((r) => toJsonString(ReplicaSchema, replicaToProto(r))),
      ...cluster.events.list().map((e) => JSON.stringify(e)),
      JSON.stringify(cluster.listNodes(), (_, v) => (typeof v === "bigint" ? String(v) : v)),
    ];
    for (const view of views) expect(view).not.toContain(secret);
    store.close();
    for (const file of [join(dir, "state.db"), join(dir, "state.db-wal")]) {
      let bytes: Buffer;
      try {
        bytes = readFileSync(file);
      } catch {
        continue;
      }
      expect(bytes.includes(secret)).toBe(false);
    }
    store = openSqliteStore({ file: join(dir, "state.db") });
  });
});
