// AgentService.ReportLoad through Connect's in-memory transport with the real service and
// error mapping: credentials as Heartbeat, bounds, and load reaching what routers read.
import { create } from "@bufbuild/protobuf";
import { Code, createClient } from "@connectrpc/connect";
import { createWritableIterable } from "@connectrpc/connect/protocol";
import { simulateInventory } from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import {
  AgentService,
  type ReplicaLoadReport,
  ReplicaLoadReportSchema,
  ReplicaState,
  ReplicaStatusSchema,
} from "@llmgw/proto";
import type { ReplicaLoadSample } from "@llmgw/router";
import { schedule } from "@llmgw/scheduler";
import { inventoryToProto } from "@llmgw/wire";
import { describe, expect, it } from "vitest";
import { AGENT_LIMITS } from "../domain/agent-limits.js";
import { Cluster } from "../domain/cluster.js";
import { DRAIN_SETTLE_MS } from "../domain/drains.js";
import { LOAD_REFRESH_MS } from "../domain/replica-loads.js";
import type { ClusterStore } from "../store/types.js";
import { createAgentServiceTransport } from "../testing/agent-service-transport.js";
import type { ManualClock } from "../testing/manual-clock.js";
import { refusal } from "../testing/refusal.js";
import { sqliteStoreEachTest } from "../testing/sqlite-fixture.js";
import { ERROR_CODE_HEADER } from "./errors.js";

const JOIN_TOKEN = "llmgw-join-test";

let store: ClusterStore;
let clock: ManualClock;

sqliteStoreEachTest("llmgw-agent-service-", (f) => {
  ({ store, clock } = f);
});

/** Two nodes joined over the wire, one replica each, both heartbeating it ready. */
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
  const client = createClient(AgentService, createAgentServiceTransport(cluster, JOIN_TOKEN));
  const join_ = async (hostname: string, address: string) => {
    const res = await client.register(
      {
        inventory: inventoryToProto(
          simulateInventory("1xh100-80g", { hostname, addresses: [address], nowMs: clock.now() }),
        ),
        advertiseAddress: address,
      },
      { headers: { authorization: `Bearer ${JOIN_TOKEN}` } },
    );
    return { nodeId: res.nodeId, auth: { authorization: `Bearer ${res.nodeCredential}` } };
  };
  const a = await join_("node-a", "10.0.0.1");
  const b = await join_("node-b", "10.0.0.2");
  cluster.applyDeployment(
    parseDeploymentSpecOrThrow({
      name: "chat",
      engine: "sim",
      model: "org/model",
      gpuClass: "h100-80g",
      replicas: 2,
    }),
  );
  for (const n of [a, b]) {
    await client.heartbeat(
      {
        nodeId: n.nodeId,
        replicas: cluster.desiredSet(n.nodeId).assignments.map((x) =>
          create(ReplicaStatusSchema, {
            replicaId: x.replicaId,
            rank: 0,
            state: ReplicaState.READY,
            apiPort: 8000,
          }),
        ),
      },
      { headers: n.auth },
    );
  }
  const servedBy = (nodeId: string) =>
    cluster.placements().find((p) => p.ranks[0]?.nodeId === nodeId)?.replicaId as string;
  const samples: ReplicaLoadSample[] = [];
  cluster.onLoad((s) => samples.push(s));
  const report = (replicaId: string, load: Record<string, number>, scrapedAtMs = clock.now()) =>
    create(ReplicaLoadReportSchema, { replicaId, load, scrapedAtUnixMs: BigInt(scrapedAtMs) });
  return { cluster, client, a, b, servedBy, samples, report };
}

describe("AgentService.ReportLoad", () => {
  it("applies the reporting node's load without bumping any version, and asks for no interval", async () => {
    const { cluster, client, a, servedBy, samples, report } = await setup();
    const version = cluster.version;
    const routingVersion = cluster.routingVersion;
    const onA = servedBy(a.nodeId);
    const res = await client.reportLoad(
      {
        nodeId: a.nodeId,
        replicas: [
          report(onA, { running: 3, waiting: 1, kvCacheUsage: 0.5, prefixCacheHitRate: 0.25 }),
          report("chat-gone", { running: 1 }),
        ],
      },
      { headers: a.auth },
    );
    expect(res.loadIntervalMs).toBe(0);
    expect(samples).toEqual([
      {
        replicaId: onA,
        load: { running: 3, waiting: 1, kvCacheUsage: 0.5, prefixCacheHitRate: 0.25 },
        reportedAtMs: clock.now(),
      },
    ]);
    expect(cluster.routingMembership().replicas.find((r) => r.id === onA)?.load).toEqual({
      running: 3,
      waiting: 1,
      kvCacheUsage: 0.5,
      prefixCacheHitRate: 0.25,
    });
    expect([cluster.version, cluster.routingVersion]).toEqual([version, routingVersion]);
  });

  it("ignores load a node reports for a replica another node serves", async () => {
    const { cluster, client, a, b, servedBy, samples, report } = await setup();
    const onA = servedBy(a.nodeId);
    await client.reportLoad(
      { nodeId: b.nodeId, replicas: [report(onA, { running: 999 })] },
      { headers: b.auth },
    );
    expect(samples).toEqual([]);
    expect(cluster.routingMembership().replicas.find((r) => r.id === onA)).not.toHaveProperty(
      "load",
    );
  });

  it.each([
    ["no credential", {}, Code.Unauthenticated, "LLMGW_CONTROL_PLANE_UNAUTHENTICATED"],
    [
      "the join token",
      { authorization: `Bearer ${JOIN_TOKEN}` },
      Code.Unauthenticated,
      "LLMGW_CONTROL_PLANE_UNAUTHENTICATED",
    ],
  ])("refuses %s", async (_name, headers, code, errorCode) => {
    const { client, a, servedBy, samples, report } = await setup();
    const error = await refusal(
      client.reportLoad(
        { nodeId: a.nodeId, replicas: [report(servedBy(a.nodeId), { running: 1 })] },
        { headers },
      ),
    );
    expect(error.code).toBe(code);
    expect(error.metadata.get(ERROR_CODE_HEADER)).toBe(errorCode);
    expect(samples).toEqual([]);
  });

  it("refuses another node's credential and an unknown node", async () => {
    const { client, a, b, servedBy, report } = await setup();
    const replicas = [report(servedBy(a.nodeId), { running: 1 })];
    const wrong = await refusal(
      client.reportLoad({ nodeId: a.nodeId, replicas }, { headers: b.auth }),
    );
    expect(wrong.rawMessage).toContain(`wrong credential for node ${a.nodeId}`);
    const unknown = await refusal(
      client.reportLoad({ nodeId: "ghost", replicas }, { headers: a.auth }),
    );
    expect(unknown.metadata.get(ERROR_CODE_HEADER)).toBe("LLMGW_CONTROL_PLANE_NODE_UNKNOWN");
  });

  const DAY = 24 * 60 * 60_000;
  it.each([
    [
      "a NaN",
      { running: Number.NaN },
      0,
      "replicas[0].load.running is NaN; it must be a number within [0, 1000000]",
    ],
    [
      "an infinity",
      { waiting: Number.POSITIVE_INFINITY },
      0,
      "replicas[0].load.waiting is Infinity; it must be a number within [0, 1000000]",
    ],
    [
      "a negative queue",
      { waiting: -1 },
      0,
      "replicas[0].load.waiting is -1; it must be a number within [0, 1000000]",
    ],
    [
      "a queue over a million",
      { running: 1_000_001 },
      0,
      "replicas[0].load.running is 1000001; it must be a number within [0, 1000000]",
    ],
    [
      "a KV usage over 1",
      { kvCacheUsage: 1.01 },
      0,
      "replicas[0].load.kvCacheUsage is 1.01; it must be a number within [0, 1]",
    ],
    [
      "a negative hit rate",
      { prefixCacheHitRate: -0.1 },
      0,
      "replicas[0].load.prefixCacheHitRate is -0.1; it must be a number within [0, 1]",
    ],
    [
      "a scrape time a day ahead",
      { running: 1 },
      DAY + 1,
      "replicas[0].scrapedAtUnixMs is 1700086400001, more than a day from the control plane's clock (1700000000000); check the agent's clock",
    ],
    [
      "a scrape time a day behind",
      { running: 1 },
      -DAY - 1,
      "replicas[0].scrapedAtUnixMs is 1699913599999, more than a day from the control plane's clock (1700000000000); check the agent's clock",
    ],
  ])("refuses %s", async (_name, load, skewMs, message) => {
    const { client, a, servedBy, samples, report } = await setup();
    const error = await refusal(
      client.reportLoad(
        { nodeId: a.nodeId, replicas: [report(servedBy(a.nodeId), load, clock.now() + skewMs)] },
        { headers: a.auth },
      ),
    );
    expect(error.code).toBe(Code.InvalidArgument);
    expect(error.metadata.get(ERROR_CODE_HEADER)).toBe("LLMGW_CONTROL_PLANE_INVALID_ARGUMENT");
    expect(error.rawMessage).toBe(`ReportLoadRequest.${message}`);
    expect(samples).toEqual([]);
  });

  it("accepts the edges: 0 and 1 for fractions, a million queued, a scrape time a day off", async () => {
    const { client, a, servedBy, samples, report } = await setup();
    const id = servedBy(a.nodeId);
    await client.reportLoad(
      {
        nodeId: a.nodeId,
        replicas: [
          report(
            id,
            { running: 1_000_000, waiting: 0, kvCacheUsage: 1, prefixCacheHitRate: 0 },
            clock.now() - DAY,
          ),
        ],
      },
      { headers: a.auth },
    );
    // Accepted, but stamped with the control plane's clock: the agent's never orders load.
    expect(samples.map((s) => s.reportedAtMs)).toEqual([clock.now()]);
  });

  it("refuses a report without a replica id, an over-long id and more reports than the limit", async () => {
    const { client, a, servedBy, report } = await setup();
    const send = (replicas: ReturnType<typeof report>[]) =>
      refusal(client.reportLoad({ nodeId: a.nodeId, replicas }, { headers: a.auth }));
    expect((await send([report("", { running: 1 })])).rawMessage).toBe(
      "ReportLoadRequest.replicas[0].replicaId is required",
    );
    expect((await send([report("r".repeat(257), { running: 1 })])).rawMessage).toBe(
      "ReportLoadRequest.replicas[0].replicaId has 257 characters; the limit is 256",
    );
    const max = AGENT_LIMITS.requestItems.ReportLoadRequest?.replicas as number;
    expect(max).toBe(1_024);
    const many = (n: number) =>
      Array.from({ length: n }, () => report(servedBy(a.nodeId), { running: 1 }));
    expect((await send(many(max + 1))).rawMessage).toBe(
      `ReportLoadRequest.replicas has ${max + 1} entries; the limit is ${max}`,
    );
    await client.reportLoad({ nodeId: a.nodeId, replicas: many(max) }, { headers: a.auth });
  });

  it("takes a report without load as load now unknown", async () => {
    const { cluster, client, a, servedBy, samples, report } = await setup();
    const id = servedBy(a.nodeId);
    await client.reportLoad(
      { nodeId: a.nodeId, replicas: [report(id, { running: 2 })] },
      { headers: a.auth },
    );
    await client.reportLoad(
      {
        nodeId: a.nodeId,
        replicas: [
          create(ReplicaLoadReportSchema, { replicaId: id, scrapedAtUnixMs: BigInt(clock.now()) }),
        ],
      },
      { headers: a.auth },
    );
    expect(samples.map((s) => s.load)).toEqual([{ running: 2 }, {}]);
    expect(cluster.routingMembership().replicas.find((r) => r.id === id)).not.toHaveProperty(
      "load",
    );
  });
});

describe("AgentService.StreamLoad", () => {
  /** A request stream the test feeds one message at a time, and ends. */
  function feed() {
    const messages = createWritableIterable<{ nodeId: string; replicas: ReplicaLoadReport[] }>();
    return {
      messages,
      send(m: { nodeId: string; replicas: ReplicaLoadReport[] }) {
        // Resolves once the service took it; a refused stream rejects the writes after it.
        messages.write(m).catch(() => {});
      },
      end: () => messages.close(),
    };
  }

  it("applies each report as it arrives, before the stream ends, and answers at the end", async () => {
    const { cluster, client, a, servedBy, samples, report } = await setup();
    const routingVersion = cluster.routingVersion;
    const onA = servedBy(a.nodeId);
    const f = feed();
    const call = client.streamLoad(f.messages, { headers: a.auth });
    f.send({ nodeId: a.nodeId, replicas: [report(onA, { running: 1, waiting: 0 })] });
    await expect.poll(() => samples.length).toBe(1);
    f.send({ nodeId: a.nodeId, replicas: [report(onA, { running: 5, kvCacheUsage: 0.5 })] });
    await expect.poll(() => samples.length).toBe(2);
    expect(cluster.routingMembership().replicas.find((r) => r.id === onA)?.load).toEqual({
      running: 5,
      kvCacheUsage: 0.5,
    });
    f.end();
    const res = await call;
    expect(res.loadIntervalMs).toBe(0);
    expect(cluster.routingVersion).toBe(routingVersion);
  });

  it("ends with the error of a bad report and keeps the reports before it", async () => {
    const { client, a, b, servedBy, samples, report } = await setup();
    const onA = servedBy(a.nodeId);
    const cases = [
      {
        bad: { nodeId: a.nodeId, replicas: [report(onA, { kvCacheUsage: 2 })] },
        code: "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
        message:
          "StreamLoadRequest.replicas[0].load.kvCacheUsage is 2; it must be a number within [0, 1]",
      },
      {
        bad: { nodeId: b.nodeId, replicas: [report(onA, { running: 1 })] },
        code: "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
        message: `StreamLoadRequest.nodeId changed from ${a.nodeId} to ${b.nodeId} within one stream`,
      },
    ];
    for (const [i, { bad, code, message }] of cases.entries()) {
      samples.length = 0;
      const f = feed();
      const call = refusal(client.streamLoad(f.messages, { headers: a.auth }));
      // A new value each time: unchanged load is no news to the cluster.
      f.send({ nodeId: a.nodeId, replicas: [report(onA, { running: 2 + i })] });
      f.send(bad);
      const error = await call;
      expect(error.metadata.get(ERROR_CODE_HEADER)).toBe(code);
      expect(error.rawMessage).toBe(message);
      expect(samples.map((s) => s.load)).toEqual([{ running: 2 + i }]);
    }
  });

  it("refuses another node's credential, and a node revoked mid-stream", async () => {
    const { cluster, client, a, b, servedBy, samples, report } = await setup();
    const onA = servedBy(a.nodeId);
    const wrong = feed();
    const refused = refusal(client.streamLoad(wrong.messages, { headers: b.auth }));
    wrong.send({ nodeId: a.nodeId, replicas: [report(onA, { running: 1 })] });
    expect((await refused).rawMessage).toContain(`wrong credential for node ${a.nodeId}`);
    expect(samples).toEqual([]);

    const f = feed();
    const call = refusal(client.streamLoad(f.messages, { headers: a.auth }));
    f.send({ nodeId: a.nodeId, replicas: [report(onA, { running: 1 })] });
    await expect.poll(() => samples.length).toBe(1);
    cluster.revokeNode(a.nodeId);
    f.send({ nodeId: a.nodeId, replicas: [report(onA, { running: 7 })] });
    const error = await call;
    expect(error.metadata.get(ERROR_CODE_HEADER)).toBe("LLMGW_CONTROL_PLANE_NODE_REVOKED");
    expect(samples.map((s) => s.load)).toEqual([{ running: 1 }]);
  });

  it("tells agents in every heartbeat answer how long a stream may stay open", async () => {
    const cluster = (await setup()).cluster;
    const withStreams = createClient(
      AgentService,
      createAgentServiceTransport(cluster, JOIN_TOKEN, { loadStreamMs: 20_000 }),
    );
    const res = await withStreams.register(
      {
        inventory: inventoryToProto(
          simulateInventory("1xh100-80g", { hostname: "node-c", nowMs: clock.now() }),
        ),
        advertiseAddress: "10.0.0.3",
      },
      { headers: { authorization: `Bearer ${JOIN_TOKEN}` } },
    );
    const auth = { authorization: `Bearer ${res.nodeCredential}` };
    const beat = await withStreams.heartbeat({ nodeId: res.nodeId }, { headers: auth });
    expect(beat.loadStreamMs).toBe(20_000);
  });
});

describe("the order of a node's load reports", () => {
  // Load reports travel on ReportLoad calls and StreamLoad streams (a call when the stream is
  // backed up, the tail of a rotated stream), so an older scrape can arrive after a newer one.
  type Delivery = "call" | "stream";

  /** Sends `replicas` from node `a` as one ReportLoad call or as one StreamLoad message. */
  async function send(
    f: Awaited<ReturnType<typeof setup>>,
    how: Delivery,
    replicas: ReplicaLoadReport[],
  ): Promise<void> {
    const request = { nodeId: f.a.nodeId, replicas };
    if (how === "call") {
      await f.client.reportLoad(request, { headers: f.a.auth });
      return;
    }
    const messages = createWritableIterable<{ nodeId: string; replicas: ReplicaLoadReport[] }>();
    const done = f.client.streamLoad(messages, { headers: f.a.auth });
    await messages.write(request);
    messages.close();
    await done;
  }

  it.each<Delivery>(["call", "stream"])(
    "an older scrape arriving after a newer one (as a %s) changes nothing routers read",
    async (late) => {
      const f = await setup();
      const id = f.servedBy(f.a.nodeId);
      const scrapedAt = clock.now();
      await send(f, "stream", [f.report(id, { running: 9, kvCacheUsage: 0.75 }, scrapedAt)]);
      clock.advance(300);
      const routes = f.cluster.readyReplicas("chat");
      await send(f, late, [f.report(id, { running: 1, kvCacheUsage: 0.25 }, scrapedAt - 500)]);
      expect(f.cluster.routingMembership().replicas.find((r) => r.id === id)).toMatchObject({
        load: { running: 9, kvCacheUsage: 0.75 },
        loadReportedAtMs: scrapedAt,
      });
      expect(routes.find((r) => r.replicaId === id)?.load).toEqual({
        running: 9,
        kvCacheUsage: 0.75,
      });
      expect(f.samples.map((s) => s.load)).toEqual([{ running: 9, kvCacheUsage: 0.75 }]);
      // The next scrape is taken as usual.
      await send(f, late, [f.report(id, { running: 4 }, scrapedAt + 500)]);
      expect(f.cluster.routingMembership().replicas.find((r) => r.id === id)?.load).toEqual({
        running: 4,
      });
    },
  );

  it("takes a re-send of the same scrape, and a heartbeat's load whatever was scraped before", async () => {
    const f = await setup();
    const id = f.servedBy(f.a.nodeId);
    const scrapedAt = clock.now();
    await send(f, "call", [f.report(id, { running: 2 }, scrapedAt)]);
    clock.advance(LOAD_REFRESH_MS);
    // The same scrape again (a call retried after the stream failed): it refreshes the load.
    await send(f, "stream", [f.report(id, { running: 2 }, scrapedAt)]);
    expect(f.samples.map((s) => s.reportedAtMs)).toEqual([scrapedAt, clock.now()]);
    // A heartbeat carries no scrape time: its load is taken as it arrives.
    await f.client.heartbeat(
      {
        nodeId: f.a.nodeId,
        replicas: [
          create(ReplicaStatusSchema, {
            replicaId: id,
            rank: 0,
            state: ReplicaState.READY,
            apiPort: 8000,
            load: { running: 6 },
          }),
        ],
      },
      { headers: f.a.auth },
    );
    expect(f.cluster.routingMembership().replicas.find((r) => r.id === id)?.load).toEqual({
      running: 6,
    });
  });

  it("orders a heartbeat's load against the load reports by the scrape it came from", async () => {
    const f = await setup();
    const id = f.servedBy(f.a.nodeId);
    const scrapedAt = clock.now();
    const beat = (running: number, loadScrapedAtUnixMs: bigint) =>
      f.client.heartbeat(
        {
          nodeId: f.a.nodeId,
          replicas: [
            create(ReplicaStatusSchema, {
              replicaId: id,
              rank: 0,
              state: ReplicaState.READY,
              apiPort: 8000,
              load: { running },
              loadScrapedAtUnixMs,
            }),
          ],
        },
        { headers: f.a.auth },
      );
    const load = () => f.cluster.routingMembership().replicas.find((r) => r.id === id)?.load;
    await send(f, "stream", [f.report(id, { running: 9 }, scrapedAt)]);
    clock.advance(300);
    // A heartbeat built before that scrape, delivered after it: the report's load stands.
    await beat(1, BigInt(scrapedAt - 500));
    expect(load()).toEqual({ running: 9 });
    // One carrying a newer scrape is taken, and then orders the reports in turn.
    await beat(5, BigInt(scrapedAt + 200));
    expect(load()).toEqual({ running: 5 });
    await send(f, "call", [f.report(id, { running: 7 }, scrapedAt + 100)]);
    expect(load()).toEqual({ running: 5 });
    // A scrape time more than a day off orders nothing: the heartbeat is answered and its
    // load taken as it arrives.
    await beat(3, BigInt(scrapedAt - AGENT_LIMITS.scrapedAtSkewMs - 1));
    expect(load()).toEqual({ running: 3 });
  });
});

describe("AgentService.Heartbeat answers", () => {
  it("leave out the desired set the agent says it applied, and send it whole otherwise", async () => {
    const { client, a } = await setup();
    const beat = (generationSeen: bigint) =>
      client.heartbeat({ nodeId: a.nodeId, generationSeen }, { headers: a.auth });
    const first = await beat(0n);
    expect(first.unchanged).toBe(false);
    expect(first.assignments).toHaveLength(1);
    const same = await beat(first.generation);
    expect(same).toMatchObject({ generation: first.generation, unchanged: true, assignments: [] });
    // An older generation (a failed apply, another control plane's): the whole set again.
    const stale = await beat(first.generation - 1n);
    expect(stale.unchanged).toBe(false);
    expect(stale.assignments.map((x) => x.replicaId)).toEqual(
      first.assignments.map((x) => x.replicaId),
    );
  });
});

describe("AgentService heartbeat streams", () => {
  /** The setup's cluster behind a transport that serves heartbeat streams of `streamMs`. */
  async function streaming(streamMs = 20_000) {
    const s = await setup();
    const client = createClient(
      AgentService,
      createAgentServiceTransport(s.cluster, JOIN_TOKEN, {
        loadStreamMs: streamMs,
        heartbeatStreams: true,
      }),
    );
    return { ...s, client };
  }
  const problem = (code: string) => ({ code, message: `${code} (test)`, source: "host" });
  const heartbeatFeed = () => {
    const messages = createWritableIterable<{ heartbeat?: object }>();
    return {
      messages,
      send(heartbeat: object | undefined) {
        messages.write(heartbeat === undefined ? {} : { heartbeat }).catch(() => {});
      },
      end: () => messages.close(),
    };
  };

  it("are offered in heartbeat answers only when turned on with a stream length", async () => {
    const { cluster, a } = await setup();
    const answer = async (options: { loadStreamMs?: number; heartbeatStreams?: boolean }) => {
      const client = createClient(
        AgentService,
        createAgentServiceTransport(cluster, JOIN_TOKEN, options),
      );
      return (await client.heartbeat({ nodeId: a.nodeId }, { headers: a.auth })).heartbeatStreams;
    };
    expect(await answer({ loadStreamMs: 20_000, heartbeatStreams: true })).toBe(true);
    expect(await answer({ loadStreamMs: 0, heartbeatStreams: true })).toBe(false);
    expect(await answer({ loadStreamMs: 20_000 })).toBe(false);
    const off = createClient(AgentService, createAgentServiceTransport(cluster, JOIN_TOKEN));
    const watch = refusal(
      (async () => {
        for await (const _ of off.watchDesired({ nodeId: a.nodeId }, { headers: a.auth })) {
          // nothing comes
        }
      })(),
    );
    expect((await watch).code).toBe(Code.Unimplemented);
    const f = heartbeatFeed();
    const beats = refusal(off.streamHeartbeat(f.messages, { headers: a.auth }));
    f.send({ nodeId: a.nodeId });
    expect((await beats).code).toBe(Code.Unimplemented);
  });

  it("take each heartbeat as it arrives and end with the first bad one's error", async () => {
    const { cluster, client, a, b } = await streaming();
    const f = heartbeatFeed();
    const call = refusal(client.streamHeartbeat(f.messages, { headers: a.auth }));
    f.send({ nodeId: a.nodeId, problems: [problem("first")] });
    await expect
      .poll(() => cluster.getNode(a.nodeId).problems.map((p) => p.code))
      .toEqual(["first"]);
    f.send({ nodeId: a.nodeId, problems: [problem("second")] });
    await expect
      .poll(() => cluster.getNode(a.nodeId).problems.map((p) => p.code))
      .toEqual(["second"]);
    f.send({ nodeId: b.nodeId, problems: [problem("other node")] });
    const error = await call;
    expect(error.metadata.get(ERROR_CODE_HEADER)).toBe("LLMGW_CONTROL_PLANE_INVALID_ARGUMENT");
    expect(error.rawMessage).toBe(
      `StreamHeartbeatRequest.heartbeat.nodeId changed from ${a.nodeId} to ${b.nodeId} within one stream`,
    );
    expect(cluster.getNode(b.nodeId).problems).toEqual([]);

    const most = AGENT_LIMITS.items.problems as number;
    const cases = [
      { send: undefined, message: "StreamHeartbeatRequest.heartbeat is required" },
      {
        send: {
          nodeId: a.nodeId,
          problems: Array.from({ length: most + 1 }, () => problem("x")),
        },
        message: `HeartbeatRequest.problems has ${most + 1} entries; the limit is ${most}`,
      },
    ];
    for (const { send, message } of cases) {
      const g = heartbeatFeed();
      const refused = refusal(client.streamHeartbeat(g.messages, { headers: a.auth }));
      g.send(send);
      const e = await refused;
      expect(e.rawMessage).toBe(message);
    }
    expect(cluster.getNode(a.nodeId).problems.map((p) => p.code)).toEqual(["second"]);
  });

  it("refuse another node's credential and end once the node is revoked", async () => {
    const { cluster, client, a, b } = await streaming();
    const wrong = heartbeatFeed();
    const refused = refusal(client.streamHeartbeat(wrong.messages, { headers: b.auth }));
    wrong.send({ nodeId: a.nodeId });
    expect((await refused).rawMessage).toContain(`wrong credential for node ${a.nodeId}`);
    const f = heartbeatFeed();
    const call = refusal(client.streamHeartbeat(f.messages, { headers: a.auth }));
    f.send({ nodeId: a.nodeId, problems: [problem("before")] });
    await expect.poll(() => cluster.getNode(a.nodeId).problems.length).toBe(1);
    cluster.revokeNode(a.nodeId);
    f.send({ nodeId: a.nodeId });
    expect((await call).metadata.get(ERROR_CODE_HEADER)).toBe("LLMGW_CONTROL_PLANE_NODE_REVOKED");
  });

  it("WatchDesired answers at once, again on each new generation, and ends on time", async () => {
    const { cluster, client, a } = await streaming(1_000);
    const current = cluster.desiredSet(a.nodeId);
    const answers: { generation: bigint; unchanged: boolean; replicas: number }[] = [];
    const started = performance.now();
    const watching = (async () => {
      for await (const { desired } of client.watchDesired(
        { nodeId: a.nodeId, generationSeen: current.generation },
        { headers: a.auth },
      )) {
        answers.push({
          generation: desired?.generation ?? -1n,
          unchanged: desired?.unchanged ?? false,
          replicas: desired?.assignments.length ?? -1,
        });
      }
    })();
    // What the agent applied already: the first answer says so and sends no set.
    await expect
      .poll(() => answers)
      .toEqual([{ generation: current.generation, unchanged: true, replicas: 0 }]);
    // The deleted deployment's replicas drain first; with no router connected, they stop
    // once the settle time passed (their engines reported nothing in flight).
    cluster.deleteDeployment("chat");
    clock.advance(DRAIN_SETTLE_MS);
    cluster.tick();
    const next = cluster.desiredSet(a.nodeId);
    expect(next.generation).not.toBe(current.generation);
    await expect.poll(() => answers.length).toBe(2);
    expect(answers[1]).toEqual({
      generation: next.generation,
      unchanged: false,
      replicas: next.assignments.length,
    });
    await watching;
    // The 1 s stream length, not a test timeout, ended it.
    expect(performance.now() - started).toBeGreaterThanOrEqual(950);
    expect(answers).toHaveLength(2);
  });

  it("WatchDesired sends the whole set first to an agent behind, and ends when the node registers again", async () => {
    const { cluster, client, a } = await streaming();
    const answers: number[] = [];
    const watch = refusal(
      (async () => {
        for await (const { desired } of client.watchDesired(
          { nodeId: a.nodeId, generationSeen: 0n },
          { headers: a.auth },
        )) {
          answers.push(desired?.assignments.length ?? -1);
        }
      })(),
    );
    await expect.poll(() => answers).toEqual([cluster.desiredSet(a.nodeId).assignments.length]);
    expect(answers[0]).toBeGreaterThan(0);
    // The agent joins again (a new credential): the watch opened with the old one ends.
    await client.register(
      {
        inventory: inventoryToProto(
          simulateInventory("1xh100-80g", {
            hostname: "node-a",
            addresses: ["10.0.0.1"],
            nowMs: clock.now(),
          }),
        ),
        advertiseAddress: "10.0.0.1",
        previousNodeId: a.nodeId,
        previousNodeCredential: a.auth.authorization.slice("Bearer ".length),
      },
      { headers: { authorization: `Bearer ${JOIN_TOKEN}` } },
    );
    const error = await watch;
    expect(error.metadata.get(ERROR_CODE_HEADER)).toBe("LLMGW_CONTROL_PLANE_UNAUTHENTICATED");
    expect(error.rawMessage).toContain("no longer holds");
  });

  it("WatchDesired ends with shutting down when the control plane stops, and refuses a new one", async () => {
    const { cluster, a } = await setup();
    const shutdown = new AbortController();
    const client = createClient(
      AgentService,
      createAgentServiceTransport(cluster, JOIN_TOKEN, {
        loadStreamMs: 20_000,
        heartbeatStreams: true,
        shutdown: shutdown.signal,
      }),
    );
    const watch = (answers: unknown[]) =>
      refusal(
        (async () => {
          for await (const m of client.watchDesired({ nodeId: a.nodeId }, { headers: a.auth })) {
            answers.push(m);
          }
        })(),
      );
    const answers: unknown[] = [];
    const open = watch(answers);
    await expect.poll(() => answers.length).toBe(1);
    shutdown.abort();
    const error = await open;
    expect(error.metadata.get(ERROR_CODE_HEADER)).toBe("LLMGW_CONTROL_PLANE_SHUTTING_DOWN");
    const later: unknown[] = [];
    expect((await watch(later)).metadata.get(ERROR_CODE_HEADER)).toBe(
      "LLMGW_CONTROL_PLANE_SHUTTING_DOWN",
    );
    expect(later).toEqual([]);
  });
});

describe("AgentService.SetLeaving: the node credential, as Heartbeat checks it", () => {
  it.each([
    [
      "no credential",
      {},
      "missing Authorization: Bearer header; SetLeaving needs the node credential from Register",
    ],
    [
      "the join token",
      { authorization: `Bearer ${JOIN_TOKEN}` },
      /^wrong credential for node node-a-[0-9a-f]+; register again with the join token$/,
    ],
    [
      "a credential no node holds",
      { authorization: "Bearer llmgw-node-not-issued" },
      /^wrong credential for node node-a-[0-9a-f]+; register again with the join token$/,
    ],
  ])("refuses %s", async (_name, headers, message) => {
    const { client, cluster, a } = await setup();
    const error = await refusal(
      client.setLeaving({ leaving: true, nodeId: a.nodeId }, { headers }),
    );
    expect(error.code).toBe(Code.Unauthenticated);
    expect(error.metadata.get(ERROR_CODE_HEADER)).toBe("LLMGW_CONTROL_PLANE_UNAUTHENTICATED");
    expect(error.rawMessage).toMatch(message);
    expect(cluster.getNode(a.nodeId).draining).toBe(false);
  });
});

describe("AgentService.SetLeaving drains the calling node, and only it", () => {
  it("leaves with the node's placed replicas counted, and comes back", async () => {
    const { client, cluster, a, b } = await setup();
    const left = await client.setLeaving({ leaving: true, nodeId: a.nodeId }, { headers: a.auth });
    expect(left.replicas).toBe(1);
    expect([cluster.getNode(a.nodeId).draining, cluster.getNode(b.nodeId).draining]).toEqual([
      true,
      false,
    ]);
    await client.setLeaving({ leaving: false, nodeId: a.nodeId }, { headers: a.auth });
    expect(cluster.getNode(a.nodeId).draining).toBe(false);
  });

  it("never ends an operator's drain", async () => {
    const { client, cluster, a } = await setup();
    cluster.drainNode(a.nodeId);
    await client.setLeaving({ leaving: false, nodeId: a.nodeId }, { headers: a.auth });
    expect(cluster.getNode(a.nodeId).draining).toBe(true);
  });
});
