import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { Engine, NodeState, ReplicaState } from "@llmgw/proto";
import { afterEach, describe, expect, it } from "vitest";
import type { ControlPlane } from "../src/run.js";
import { startControlPlane } from "../src/run.js";
import { FakeAgent } from "../src/testing/fake-agent.js";
import { adminClient, eventually, simAgent, startTestControlPlane, tempDir } from "./helpers.js";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

async function setup(extra: { nodeLostAfterMs?: number; heartbeatIntervalMs?: number } = {}) {
  const tmp = tempDir();
  cleanups.push(tmp.cleanup);
  const cp = await startTestControlPlane(tmp.dir, extra);
  cleanups.push(() => cp.close().then(() => {}));
  return { cp, dir: tmp.dir, admin: adminClient(cp, cp.adminToken) };
}

/** Heartbeats every agent until stopped (like real agents would). */
function keepBeating(agents: FakeAgent[], everyMs = 50): () => void {
  let stopped = false;
  const loop = async () => {
    while (!stopped) {
      await Promise.all(agents.map((a) => a.heartbeat().catch(() => undefined)));
      await new Promise((r) => setTimeout(r, everyMs));
    }
  };
  void loop();
  const stop = () => {
    stopped = true;
  };
  cleanups.push(stop);
  return stop;
}

async function expectConnectError(p: Promise<unknown>, code: Code, message: RegExp): Promise<void> {
  const error = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(ConnectError);
  expect((error as ConnectError).code).toBe(code);
  expect((error as ConnectError).rawMessage).toMatch(message);
}

describe("control plane over Connect", () => {
  it("places deployments on the right nodes and gang-places a two-node replica", async () => {
    const { cp, admin } = await setup();
    const a = simAgent(cp, "node-a", "1xh100-80g@ib-a");
    const b = simAgent(cp, "node-b", "1xh100-80g@ib-a");
    const c = simAgent(cp, "node-c", "1xl40s-45g");
    for (const agent of [a, b, c]) await agent.register();

    await admin.applyDeployment({
      deployment: {
        name: "small",
        model: "org/small",
        engine: Engine.VLLM,
        gpuClass: "l40s-45g",
        replicas: 1,
      },
    });
    const applied = await admin.applyDeployment({
      deployment: {
        name: "big",
        model: "org/big",
        engine: Engine.SIM,
        gpuClass: "h100-80g",
        tensorParallel: 2,
        nodesPerReplica: 2,
        replicas: 1,
      },
    });
    expect(applied.changed).toBe(true);
    expect(applied.deployment?.replicas.map((r) => r.replicaId)).toEqual(["big-0"]);

    await Promise.all([a.heartbeat(), b.heartbeat(), c.heartbeat()]);
    expect(c.replicaIds()).toEqual(["small-0"]);
    expect(a.replicaIds()).toEqual(["big-0"]);
    expect(b.replicaIds()).toEqual(["big-0"]);
    const ranks = [a.assignments[0], b.assignments[0]].map((x) => x?.rank).sort();
    expect(ranks).toEqual([0, 1]);
    const world = a.assignments[0]?.world;
    expect(world).toMatchObject({ nnodes: 2, rank0Address: "127.0.0.1" });
    expect(world?.rendezvousPort).toBeGreaterThan(0);
    expect(a.assignments[0]?.fabricId).toBe("ib-a");

    // Ranks report progress; the replica is as far as its least advanced rank.
    const rank0 = a.assignments[0]?.rank === 0 ? a : b;
    const rank1 = rank0 === a ? b : a;
    rank0.report("big-0", 0, { state: ReplicaState.READY, apiPort: 41_234 });
    rank1.report("big-0", 1, { state: ReplicaState.LOADING });
    await Promise.all([a.heartbeat(), b.heartbeat()]);
    let big = (await admin.getDeployment({ name: "big" })).deployment;
    expect(big?.replicas[0]?.state).toBe(ReplicaState.LOADING);
    rank1.report("big-0", 1, { state: ReplicaState.READY });
    await rank1.heartbeat();
    big = (await admin.getDeployment({ name: "big" })).deployment;
    expect(big?.replicas[0]).toMatchObject({
      state: ReplicaState.READY,
      endpoint: "127.0.0.1:41234",
    });
    expect(big?.readyReplicas).toBe(1);
    expect(cp.cluster.readyReplicas("big").map((r) => r.endpoint)).toEqual(["127.0.0.1:41234"]);

    const status = await admin.getClusterStatus({});
    expect(status).toMatchObject({
      nodesTotal: 3,
      nodesReady: 3,
      gpusTotal: 3,
      gpusAllocated: 3,
      deploymentsTotal: 2,
    });
  });

  it("marks a silent node unreachable, then lost, and moves its replicas", async () => {
    const { cp, admin } = await setup({ nodeLostAfterMs: 600, heartbeatIntervalMs: 200 });
    const a = simAgent(cp, "node-a", "1xh100-80g");
    await a.register();
    await admin.applyDeployment({
      deployment: {
        name: "chat",
        model: "m",
        engine: Engine.VLLM,
        replicas: 1,
        gpuClass: "h100-80g",
      },
    });
    await a.heartbeat();
    expect(a.replicaIds()).toEqual(["chat-0"]);
    const b = simAgent(cp, "node-b", "1xh100-80g");
    await b.register();
    keepBeating([b]);
    // node-a stops heartbeating.
    await eventually(async () => {
      const node = (await admin.getNode({ node: "node-a" })).node;
      return node?.state === NodeState.UNREACHABLE ? node : undefined;
    });
    // Unreachable: the replica stays where it runs.
    expect((await admin.listReplicas({ deployment: "chat" })).replicas[0]?.ranks[0]?.nodeId).toBe(
      a.nodeId,
    );
    await eventually(async () =>
      (await admin.getNode({ node: "node-a" })).node?.state === NodeState.LOST ? true : undefined,
    );
    // Its replacement, under a new id (a replacement never takes the id it replaces).
    const moved = await eventually(() => (b.replicaIds().length === 1 ? true : undefined));
    expect(moved).toBe(true);
    expect(b.replicaIds()).toEqual(["chat-1"]);
    const events = (await admin.listEvents({ limit: 100 })).events.map((e) => e.kind);
    expect(events.indexOf("node.unreachable")).toBeLessThan(events.indexOf("node.lost"));
  });

  it("drains a node and its replicas leave", async () => {
    const { cp, admin } = await setup();
    const a = simAgent(cp, "node-a", "2xh100-80g");
    const b = simAgent(cp, "node-b", "2xh100-80g");
    await a.register();
    await admin.applyDeployment({
      deployment: {
        name: "chat",
        model: "m",
        engine: Engine.VLLM,
        replicas: 2,
        gpuClass: "h100-80g",
      },
    });
    await b.register();
    await a.heartbeat();
    expect(a.replicaIds()).toEqual(["chat-0", "chat-1"]);
    const drained = await admin.drainNode({ node: "node-a" });
    expect(drained.node).toMatchObject({ cordoned: true, draining: true });
    await Promise.all([a.heartbeat(), b.heartbeat()]);
    expect(a.replicaIds()).toEqual([]);
    expect(b.replicaIds()).toEqual(["chat-2", "chat-3"]);
  });

  it("keeps deployments, placements and node identities across a restart", async () => {
    const tmp = tempDir();
    cleanups.push(tmp.cleanup);
    let cp: ControlPlane = await startTestControlPlane(tmp.dir);
    const a = simAgent(cp, "node-a", "1xh100-80g@ib-a");
    const b = simAgent(cp, "node-b", "1xh100-80g@ib-a");
    await a.register();
    await b.register();
    const admin = adminClient(cp, cp.adminToken);
    await admin.applyDeployment({
      deployment: {
        name: "big",
        model: "m",
        engine: Engine.SIM,
        gpuClass: "h100-80g",
        tensorParallel: 2,
        nodesPerReplica: 2,
        replicas: 1,
      },
    });
    await Promise.all([a.heartbeat(), b.heartbeat()]);
    const before = [a.assignments[0], b.assignments[0]];
    const { joinToken, adminToken } = cp;
    await cp.close();

    cp = await startTestControlPlane(tmp.dir);
    cleanups.push(() => cp.close().then(() => {}));
    expect(cp.joinToken).toBe(joinToken);
    expect(cp.adminToken).toBe(adminToken);
    const admin2 = adminClient(cp, adminToken);
    const listed = (await admin2.listDeployments({})).deployments;
    expect(listed.map((d) => d.spec?.name)).toEqual(["big"]);
    expect(listed[0]?.replicas.map((r) => r.replicaId)).toEqual(["big-0"]);

    const a2 = new FakeAgent({ ...a.options, controlUrl: cp.controlUrl });
    const b2 = new FakeAgent({ ...b.options, controlUrl: cp.controlUrl });
    a2.nodeId = a.nodeId;
    a2.credential = a.credential;
    b2.nodeId = b.nodeId;
    b2.credential = b.credential;
    expect(await a2.register()).toBe(a.nodeId);
    expect(await b2.register()).toBe(b.nodeId);
    await Promise.all([a2.heartbeat(), b2.heartbeat()]);
    expect(
      [a2.assignments[0], b2.assignments[0]].map((x) => [
        x?.replicaId,
        x?.rank,
        x?.world?.rendezvousPort,
      ]),
    ).toEqual(before.map((x) => [x?.replicaId, x?.rank, x?.world?.rendezvousPort]));
  });

  it("refuses a wrong join token, a revoked node and a missing admin token with clear errors", async () => {
    const { cp, admin } = await setup();
    const a = simAgent(cp, "node-a", "1xh100-80g");
    await expectConnectError(
      a.register("llmgw-join-wrong"),
      Code.Unauthenticated,
      /wrong token; this call needs the join token/,
    );
    await a.register();
    await admin.revokeNode({ node: "node-a" });
    await expectConnectError(
      a.heartbeat(),
      Code.Unauthenticated,
      /revoked by an operator; register again with the join token/,
    );
    await expectConnectError(
      adminClient(cp).listNodes({}),
      Code.Unauthenticated,
      /missing Authorization: Bearer header; this call needs the admin token/,
    );
    await expectConnectError(
      adminClient(cp, cp.joinToken).listNodes({}),
      Code.Unauthenticated,
      /wrong token/,
    );
    await expectConnectError(
      admin.getDeployment({ name: "nope" }),
      Code.NotFound,
      /no deployment named "nope"/,
    );
    await expectConnectError(
      admin.applyDeployment({
        deployment: { name: "Bad Name", model: "m", engine: Engine.VLLM, replicas: 1 },
      }),
      Code.InvalidArgument,
      /name must be a DNS label/,
    );
    // UnavoidNode: a deployment is required and must exist; a named node must exist.
    await expectConnectError(
      admin.unavoidNode({ deployment: "" }),
      Code.InvalidArgument,
      /deployment is required/,
    );
    await expectConnectError(
      admin.unavoidNode({ deployment: "nope" }),
      Code.NotFound,
      /no deployment named "nope"/,
    );
    await admin.applyDeployment({
      deployment: { name: "chat", model: "m", engine: Engine.VLLM, replicas: 1 },
    });
    await expectConnectError(
      admin.unavoidNode({ deployment: "chat", node: "node-z" }),
      Code.NotFound,
      /no node with id or hostname "node-z"/,
    );
    expect((await admin.unavoidNode({ deployment: "chat" })).nodeIds).toEqual([]);
  });

  it("refuses a Register that names a live node without its credential; the node keeps serving", async () => {
    const { cp, admin } = await setup();
    const real = simAgent(cp, "node-a", "1xh100-80g");
    real.defaultReport = { state: ReplicaState.READY, apiPort: 41_000 };
    await real.register();
    await admin.applyDeployment({
      deployment: { name: "chat", model: "m", engine: Engine.VLLM, replicas: 1 },
    });
    await real.heartbeat();
    await real.heartbeat();
    expect(cp.cluster.readyReplicas("chat").map((r) => r.endpoint)).toEqual(["127.0.0.1:41000"]);
    const before = (await admin.getNode({ node: real.nodeId ?? "" })).node;

    // Node ids are public (/metrics, events); the join token is shared by every agent.
    const attacker = new FakeAgent({
      controlUrl: cp.controlUrl,
      joinToken: cp.joinToken,
      inventory: { ...real.options.inventory, hostname: "evil" },
      advertiseAddress: "127.0.0.66",
    });
    attacker.nodeId = real.nodeId;
    for (const credential of [undefined, "llmgw-node-guess"]) {
      attacker.credential = credential;
      const error = ConnectError.from(await attacker.register().catch((e: unknown) => e));
      expect(error.code).toBe(Code.PermissionDenied);
      expect(error.rawMessage).toBe(
        `node ${real.nodeId} is registered; re-joining it needs its node credential, or an operator's \`llmgw nodes reset ${real.nodeId}\``,
      );
      expect(error.metadata.get("llmgw-error-code")).toBe("LLMGW_CONTROL_PLANE_NODE_ID_TAKEN");
    }

    await real.heartbeat();
    expect(cp.cluster.readyReplicas("chat").map((r) => r.endpoint)).toEqual(["127.0.0.1:41000"]);
    const after = (await admin.getNode({ node: real.nodeId ?? "" })).node;
    expect(after?.advertiseAddress).toBe("127.0.0.1");
    expect(after?.hostname).toBe("node-a");
    expect(after?.registeredAtUnixMs).toBe(before?.registeredAtUnixMs);
    const events = (await admin.listEvents({ limit: 100 })).events;
    expect(events.filter((e) => e.kind === "node.takeover_refused")).toHaveLength(1);

    // An invalid advertise address is refused before anything else.
    const bad = new FakeAgent({ ...attacker.options, advertiseAddress: "127.0.0.1:9/x" });
    const invalid = ConnectError.from(await bad.register().catch((e: unknown) => e));
    expect(invalid.code).toBe(Code.InvalidArgument);
    expect(invalid.rawMessage).toMatch(/^RegisterRequest\.advertise_address must be an IP address/);
  });

  it("streams events, serves /healthz and /metrics, and runs the router on the public listener", async () => {
    const { cp, admin } = await setup();
    const controller = new AbortController();
    const seen: string[] = [];
    const watching = (async () => {
      try {
        for await (const res of admin.watchEvents({ backlog: 10 }, { signal: controller.signal })) {
          seen.push(res.event?.kind ?? "");
          if (seen.includes("apikey.created")) break;
        }
      } catch {}
    })();
    await new Promise((r) => setTimeout(r, 100));
    await admin.createApiKey({ name: "app" });
    await watching;
    controller.abort();
    expect(seen).toContain("apikey.created");

    const health = await fetch(`${cp.controlUrl}/healthz`);
    expect(health.status).toBe(200);
    expect((await fetch(`${cp.publicUrl}/healthz`)).status).toBe(200);
    const metrics = await fetch(`${cp.controlUrl}/metrics`);
    expect(metrics.status).toBe(200);
    expect(metrics.headers.get("content-type")).toContain("text/plain");
    const text = await metrics.text();
    expect(text).toMatch(/^# HELP llmgw_/m);
    // The leader's own work: at least its start's reconcile, timed.
    const reconciles = Number(
      /^llmgw_control_plane_reconcile_duration_seconds_count (\d+)$/m.exec(text)?.[1],
    );
    expect(reconciles).toBeGreaterThanOrEqual(1);
    expect(
      Number(/^llmgw_control_plane_reconcile_duration_seconds_sum (\S+)$/m.exec(text)?.[1]),
    ).toBeGreaterThan(0);
    // The public listener is the in-process router: ready on the feed's first snapshot, and
    // it wants an API key.
    const ready = await fetch(`${cp.publicUrl}/readyz`);
    expect(ready.status).toBe(200);
    expect(await ready.json()).toMatchObject({ ready: true, source: "live", connected: true });
    const models = await fetch(`${cp.publicUrl}/v1/models`);
    expect(models.status).toBe(401);
  });

  it("refuses a scale past the spec's bounds as invalid_argument, and starts again from its store", async () => {
    const tmp = tempDir();
    cleanups.push(tmp.cleanup);
    let cp: ControlPlane = await startTestControlPlane(tmp.dir);
    const admin = adminClient(cp, cp.adminToken);
    await admin.applyDeployment({
      deployment: { name: "chat", model: "org/m", engine: Engine.SIM, replicas: 0 },
    });
    await expectConnectError(
      admin.scaleDeployment({ name: "chat", replicas: 100_001 }),
      Code.InvalidArgument,
      /cannot scale chat to 100001 replicas: .*replicas/,
    );
    await cp.close();
    cp = await startTestControlPlane(tmp.dir);
    cleanups.push(() => cp.close().then(() => {}));
    const listed = (await adminClient(cp, cp.adminToken).listDeployments({})).deployments;
    expect(listed.map((d) => d.spec?.replicas)).toEqual([0]);
  });

  it("lists an undeployed deployment's replicas while they drain, as undeploy --wait polls", async () => {
    const { cp, admin } = await setup();
    const a = simAgent(cp, "node-a", "1xh100-80g");
    await a.register();
    await admin.applyDeployment({
      deployment: { name: "chat", model: "org/m", engine: Engine.SIM, replicas: 1 },
    });
    await a.heartbeat();
    a.report("chat-0", 0, { state: ReplicaState.READY, apiPort: 41_000 });
    await a.heartbeat();
    await admin.deleteDeployment({ name: "chat" });
    // The in-process router holds it as draining until it reports nothing in flight.
    const listed = (await admin.listReplicas({ deployment: "chat" })).replicas;
    expect(listed.map((r) => [r.replicaId, r.retirement?.reason?.code])).toEqual([
      ["chat-0", "deployment-deleted"],
    ]);
    await expectConnectError(
      admin.listReplicas({ deployment: "other" }),
      Code.NotFound,
      /no deployment named "other"/,
    );
  });

  it("pages events: afterId answers the oldest ones after it, no afterId the newest", async () => {
    const { admin } = await setup();
    for (const name of ["a", "b", "c", "d"]) await admin.createApiKey({ name });
    const all = (await admin.listEvents({ limit: 10_000 })).events.map((e) => e.id);
    expect(all.length).toBeGreaterThanOrEqual(4);
    const page = async (afterId: bigint) =>
      (await admin.listEvents({ afterId, limit: 2 })).events.map((e) => e.id);
    expect(await page(0n)).toEqual(all.slice(-2));
    const paged: bigint[] = [];
    for (let next = await page(all[0] as bigint); next.length > 0; ) {
      paged.push(...next);
      next = await page(next.at(-1) as bigint);
    }
    expect(paged).toEqual(all.slice(1));
  });

  it("refuses to start on a corrupt store and names the file", async () => {
    const tmp = tempDir();
    cleanups.push(tmp.cleanup);
    const cp = await startTestControlPlane(tmp.dir);
    await cp.close();
    writeFileSync(join(tmp.dir, "state.db"), Buffer.alloc(4096, 0x41));
    await expect(
      startControlPlane({ dataDir: tmp.dir, listen: "127.0.0.1:0", controlListen: "127.0.0.1:0" }),
    ).rejects.toMatchObject({
      code: "LLMGW_CONTROL_PLANE_STORE_CORRUPT",
      message: expect.stringContaining(join(tmp.dir, "state.db")),
    });
  });
});
