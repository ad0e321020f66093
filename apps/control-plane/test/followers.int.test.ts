// Followers over PostgreSQL answer reads from a warm copy of the state, kept current by the
// leader's commit notifications, and refuse writes naming the leader.
import { Code, ConnectError } from "@connectrpc/connect";
import { Engine, NodeState } from "@llmgw/proto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type ControlPlane, startControlPlane } from "../src/run.js";
import {
  postgresUnavailable,
  startTestPostgres,
  type TestPostgres,
} from "../src/testing/postgres.js";
import { startTcpProxy } from "../src/testing/tcp-proxy.js";
import { adminClient, eventually, simAgent, tempDir, whenServed } from "./helpers.js";

const skip = postgresUnavailable();
let server: TestPostgres;
beforeAll(async () => {
  if (!skip) server = await startTestPostgres();
});
afterAll(() => server?.destroy());

function start(dataDir: string, store: string, leaseTtlMs = 3_000): Promise<ControlPlane> {
  return startControlPlane({
    dataDir,
    store,
    controlListen: "127.0.0.1:0",
    publicApi: false,
    heartbeatIntervalMs: 200,
    nodeLostAfterMs: 60_000,
    leaseTtlMs,
    shutdownGraceMs: 1_000,
  });
}

/** An agent with two GPUs joins `cp`, which places one replica of `chat` on it. */
async function joinAndDeploy(cp: ControlPlane) {
  const agent = simAgent(cp, "node-a", "2xh100-80g");
  await agent.register();
  await adminClient(cp, cp.adminToken).applyDeployment({
    deployment: { name: "chat", model: "m", engine: Engine.SIM, gpuClass: "h100-80g", replicas: 1 },
  });
  return agent;
}

/** Calls `read` on `cp`'s admin API and returns the answer with its response headers. */
async function withHeaders<T>(
  read: (
    client: ReturnType<typeof adminClient>,
    options: { onHeader: (h: Headers) => void },
  ) => Promise<T>,
  cp: ControlPlane,
): Promise<{ answer: T; headers: Headers }> {
  let headers = new Headers();
  const answer = await read(adminClient(cp, cp.adminToken), {
    onHeader: (h) => {
      headers = h;
    },
  });
  return { answer, headers };
}

describe.skipIf(skip)(`followers${skip ? ` (skipped: ${skip})` : ""}`, () => {
  it("answer reads from a warm copy, show the leader's node states and refuse writes", async () => {
    const url = await server.createDatabase();
    const tmp = tempDir();
    const leader = await start(tmp.dir, url);
    const started = [leader];
    try {
      // The follower starts once the leader leads: started together, either may win the lease
      // (on a loaded machine the second one sometimes did, and the first never led).
      await eventually(() => (leader.leading ? true : undefined), 20_000);
      const follower = await start(tmp.dir, url);
      started.push(follower);
      expect(follower.leading).toBe(false);

      const agent = await joinAndDeploy(leader);

      // The copy follows the leader's commits. Until it is first read, the follower refuses
      // reads too (`Unavailable`, naming the leader), as it refuses writes.
      const { answer, headers } = await eventually(async () => {
        const r = await whenServed(() => withHeaders((c, o) => c.listDeployments({}, o), follower));
        return r?.answer.deployments.some((d) => d.spec?.name === "chat") &&
          (await adminClient(follower, follower.adminToken).listReplicas({})).replicas.length > 0
          ? r
          : undefined;
      });
      expect(answer.deployments.map((d) => d.spec?.name)).toEqual(["chat"]);
      expect(headers.get("llmgw-served-by")).toBe("follower");
      expect(headers.get("llmgw-leader")).toBe(leader.controlUrl);
      expect(Number(headers.get("llmgw-copy-age-ms"))).toBeGreaterThanOrEqual(0);
      const replicas = await adminClient(follower, follower.adminToken).listReplicas({});
      expect(replicas.replicas.map((r) => r.replicaId)).toEqual(["chat-0"]);
      expect(replicas.replicas.map((r) => r.ranks[0]?.nodeId)).toEqual([agent.nodeId]);

      // Node liveness as the leader recorded it: ready while the agent heartbeats, then
      // unreachable once it falls silent.
      const nodeOnFollower = async () =>
        (await adminClient(follower, follower.adminToken).getNode({ node: "node-a" })).node;
      const beating = setInterval(() => void agent.heartbeat().catch(() => {}), 50);
      try {
        await eventually(async () =>
          leader.cluster.nodeState("node-a") === "ready" &&
          (await nodeOnFollower())?.state === NodeState.READY
            ? true
            : undefined,
        );
      } finally {
        clearInterval(beating);
      }
      await eventually(async () =>
        (await nodeOnFollower())?.state === NodeState.UNREACHABLE ? true : undefined,
      );
      const events = await adminClient(follower, follower.adminToken).listEvents({ limit: 100 });
      expect(events.events.map((e) => e.kind)).toContain("node.unreachable");

      // Writes go to the leader, which the refusal names; the admin token is still required.
      const refused = await adminClient(follower, follower.adminToken)
        .scaleDeployment({ name: "chat", replicas: 2 })
        .catch((e: unknown) => ConnectError.from(e));
      expect(refused).toBeInstanceOf(ConnectError);
      expect((refused as ConnectError).code).toBe(Code.Unavailable);
      expect((refused as ConnectError).metadata.get("llmgw-error-code")).toBe(
        "LLMGW_CONTROL_PLANE_NOT_LEADER",
      );
      expect((refused as ConnectError).metadata.get("llmgw-leader")).toBe(leader.controlUrl);
      const unauthenticated = await adminClient(follower, "wrong")
        .listNodes({})
        .catch((e: unknown) => ConnectError.from(e));
      expect((unauthenticated as ConnectError).code).toBe(Code.Unauthenticated);

      // The leader stops: the follower leads and answers as the leader.
      await leader.close();
      await eventually(() => (follower.leading ? true : undefined), 10_000);
      const after = await withHeaders((c, o) => c.listDeployments({}, o), follower);
      expect(after.answer.deployments.map((d) => d.spec?.name)).toEqual(["chat"]);
      expect(after.headers.get("llmgw-served-by")).toBeNull();
    } finally {
      for (const cp of started) await cp.close();
      tmp.cleanup();
    }
  }, 60_000);

  it("a leader cut off from the database steps down before another leads, and follows once back", async () => {
    const url = await server.createDatabase();
    // The first instance reaches PostgreSQL through a proxy that can black-hole it alone.
    const proxy = await startTcpProxy(server.port);
    const viaProxy = url.replace(`:${server.port}/`, `:${proxy.port}/`);
    const tmp = tempDir();
    const a = await start(tmp.dir, viaProxy, 1_500);
    let b: ControlPlane | undefined;
    let twoLeaders = false;
    const watch = setInterval(() => {
      if (a.leading && b?.leading) twoLeaders = true;
    }, 2);
    try {
      await eventually(() => (a.leading ? true : undefined));
      b = await start(tmp.dir, url, 1_500);
      await joinAndDeploy(a);

      proxy.cut();
      const follower = b;
      await eventually(() => (follower.leading ? true : undefined), 20_000);
      expect(a.leading).toBe(false);
      // Cut off, the old leader still answers reads, from the state it led with.
      const frozen = await withHeaders((c, o) => c.getDeployment({ name: "chat" }, o), a);
      expect(frozen.answer.deployment?.desiredReplicas).toBe(1);
      expect(frozen.headers.get("llmgw-served-by")).toBe("follower");
      // The new leader has what the old one answered, and takes writes; the old one refuses.
      const admin = adminClient(follower, follower.adminToken);
      expect((await admin.getDeployment({ name: "chat" })).deployment?.desiredReplicas).toBe(1);
      await admin.scaleDeployment({ name: "chat", replicas: 2 });
      const refused = await adminClient(a, a.adminToken)
        .scaleDeployment({ name: "chat", replicas: 3 })
        .catch((e: unknown) => ConnectError.from(e));
      expect((refused as ConnectError).metadata.get("llmgw-error-code")).toBe(
        "LLMGW_CONTROL_PLANE_NOT_LEADER",
      );

      // Back on the network, it follows: its copy catches up with the new leader's writes.
      proxy.restore();
      await eventually(async () => {
        const d = await adminClient(a, a.adminToken)
          .getDeployment({ name: "chat" })
          .catch(() => undefined);
        return d?.deployment?.desiredReplicas === 2 ? true : undefined;
      }, 20_000);
      expect(a.leading).toBe(false);
      expect(follower.leading).toBe(true);
      expect(twoLeaders).toBe(false);
    } finally {
      clearInterval(watch);
      await a.close();
      await b?.close();
      await proxy.close();
      tmp.cleanup();
    }
  }, 90_000);
});
