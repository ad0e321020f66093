// The order in which AgentService takes one node's heartbeats, through Connect's in-memory
// transport with the real service: heartbeats travel on calls and on StreamHeartbeat streams,
// so an older one can arrive after a newer one (a stalled connection, the stream before the
// current one, an agent's previous run); what it says must not replace what is newer.
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createWritableIterable } from "@connectrpc/connect/protocol";
import { simulateInventory } from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import {
  AgentService,
  GpuReadingSchema,
  type HeartbeatRequest,
  HeartbeatRequestSchema,
  ReplicaState,
  ReplicaStatusSchema,
  type StreamHeartbeatRequest,
} from "@llmgw/proto";
import { schedule } from "@llmgw/scheduler";
import { inventoryToProto } from "@llmgw/wire";
import { describe, expect, it } from "vitest";
import { Cluster } from "../domain/cluster.js";
import type { ClusterStore } from "../store/types.js";
import { createAgentServiceTransport } from "../testing/agent-service-transport.js";
import type { ManualClock } from "../testing/manual-clock.js";
import { sqliteStoreEachTest } from "../testing/sqlite-fixture.js";

const JOIN_TOKEN = "llmgw-join-test";
const GiB = 1024 ** 3;

let store: ClusterStore;
let clock: ManualClock;

sqliteStoreEachTest("llmgw-heartbeat-order-", (f) => {
  ({ store, clock } = f);
});

/** What one heartbeat of the test node says; unset: an older agent's heartbeat. */
interface Beat {
  readonly session?: string;
  readonly sequence?: number;
  /** State of the one replica; "none": the heartbeat does not list it (the engine is gone). */
  readonly state: ReplicaState | "none";
  readonly memoryUsedGiB?: number;
}

/** One node joined over the wire with one replica of `chat` placed on it. */
async function setup() {
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
  const client = createClient(
    AgentService,
    createAgentServiceTransport(cluster, JOIN_TOKEN, {
      loadStreamMs: 20_000,
      heartbeatStreams: true,
    }),
  );
  const inventory = inventoryToProto(
    simulateInventory("1xh100-80g", { hostname: "node-a", addresses: ["10.0.0.1"] }),
  );
  const joined = await client.register(
    { inventory, advertiseAddress: "10.0.0.1" },
    { headers: { authorization: `Bearer ${JOIN_TOKEN}` } },
  );
  const nodeId = joined.nodeId;
  const headers = { authorization: `Bearer ${joined.nodeCredential}` };
  cluster.applyDeployment(
    parseDeploymentSpecOrThrow({
      name: "chat",
      engine: "sim",
      model: "org/model",
      gpuClass: "h100-80g",
    }),
  );
  const [assignment] = cluster.desiredSet(nodeId).assignments;
  if (!assignment) throw new Error("chat was not placed");
  const request = (beat: Beat): HeartbeatRequest =>
    create(HeartbeatRequestSchema, {
      nodeId,
      gpus: [
        create(GpuReadingSchema, {
          index: 0,
          uuid: inventory.gpus[0]?.uuid ?? "",
          healthy: true,
          memoryUsedBytes: BigInt((beat.memoryUsedGiB ?? 1) * GiB),
        }),
      ],
      replicas:
        beat.state === "none"
          ? []
          : [
              create(ReplicaStatusSchema, {
                replicaId: assignment.replicaId,
                rank: 0,
                state: beat.state,
                apiPort: 8000,
              }),
            ],
      ...(beat.session === undefined ? {} : { sessionId: beat.session }),
      ...(beat.sequence === undefined ? {} : { sequence: BigInt(beat.sequence) }),
    });
  /** Sends one heartbeat as a Heartbeat call. */
  const call = (beat: Beat) => client.heartbeat(request(beat), { headers });
  /** Sends heartbeats as the messages of one StreamHeartbeat request. */
  const stream = async (...beats: Beat[]) => {
    const messages = createWritableIterable<StreamHeartbeatRequest>();
    const done = client.streamHeartbeat(messages, { headers });
    for (const beat of beats) await messages.write({ heartbeat: request(beat) } as never);
    messages.close();
    await done;
  };
  const shown = () => cluster.listReplicas({ deployment: "chat" })[0]?.state;
  const memoryUsed = () => cluster.getNode(nodeId).gpuReadings[0]?.memoryUsedBytes;
  return { cluster, nodeId, call, stream, shown, memoryUsed };
}

type Delivery = "call" | "stream";

describe("the order of a node's heartbeats", () => {
  it.each<Delivery>(["call", "stream"])(
    "an older heartbeat of the same agent session arriving late (as a %s) changes nothing",
    async (late) => {
      const h = await setup();
      await h.call({ session: "s1", sequence: 1, state: ReplicaState.STARTING });
      await h.call({ session: "s1", sequence: 3, state: ReplicaState.READY, memoryUsedGiB: 70 });
      expect([h.shown(), h.memoryUsed()]).toEqual(["ready", 70 * GiB]);
      const older = { session: "s1", sequence: 2, state: ReplicaState.STARTING } as const;
      if (late === "call") {
        // Still answered with the node's desired set.
        const answer = await h.call(older);
        expect(answer.generation).toBe(h.cluster.desiredSet(h.nodeId).generation);
        expect(answer.assignments.map((a) => a.deployment?.name)).toEqual(["chat"]);
      } else {
        await h.stream(older);
      }
      expect([h.shown(), h.memoryUsed()]).toEqual(["ready", 70 * GiB]);
      // No replica.state event of a step back either.
      expect(h.cluster.events.list().map((e) => e.message)).not.toContainEqual(
        expect.stringContaining("ready → starting"),
      );
    },
  );

  it("a heartbeat of an agent's previous run, arriving after the new run's first, resurrects nothing", async () => {
    const h = await setup();
    await h.call({ session: "run-1", sequence: 41, state: ReplicaState.READY });
    expect(h.shown()).toBe("ready");
    // The agent restarts (same node identity, a new session) without the engine.
    await h.call({ session: "run-2", sequence: 1, state: "none" });
    const after = h.shown();
    expect(after).not.toBe("ready");
    // The previous run's last heartbeat, held up on its dead connection, arrives now.
    await h.stream({ session: "run-1", sequence: 42, state: ReplicaState.READY });
    expect(h.shown()).toBe(after);
    await h.call({ session: "run-2", sequence: 2, state: ReplicaState.LOADING });
    expect(h.shown()).toBe("loading");
  });

  it("heartbeats without an order (older agents) are taken as they arrive; ordered ones are not", async () => {
    const h = await setup();
    await h.call({ session: "s1", sequence: 5, state: ReplicaState.READY });
    await h.call({ session: "s1", sequence: 4, state: ReplicaState.STARTING });
    expect(h.shown()).toBe("ready");
    // An agent downgraded to a version that sends no order: each heartbeat is taken.
    await h.call({ state: ReplicaState.LOADING });
    expect(h.shown()).toBe("loading");
    await h.call({ state: ReplicaState.READY });
    expect(h.shown()).toBe("ready");
  });
});
