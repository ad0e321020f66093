/**
 * Three control planes on one real PostgreSQL, an agent and a router given all three, real
 * processes throughout. Killing the leader with SIGKILL during `llmgw deploy --wait` and
 * under traffic: a follower leads within the lease's bounds, nothing stored is lost or
 * duplicated, engines keep their pids, traffic never fails. Stopping the database: every
 * instance stops leading and says why, the agent and the router keep serving, and everything
 * converges once the database is back.
 */
import { copyFileSync, mkdirSync, writeFileSync } from "node:fs";
import path from "node:path";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import {
  postgresUnavailable,
  startTestPostgres,
  type TestPostgres,
} from "@llmgw/control-plane/testing";
import { ClusterService, NodeState } from "@llmgw/proto";
import { createFailoverTransport } from "@llmgw/wire";
import { afterAll, describe, expect, it } from "vitest";
import {
  AgentProc,
  allReady,
  ClosedLoopTraffic,
  ControlPlaneProc,
  describeFailures,
  enginePids,
  ensureCliBuilt,
  freePort,
  RouterProc,
  runLlmgw,
  stopAll,
  tempRoot,
  waitFor,
} from "./cluster-harness.js";

const skip = postgresUnavailable();
const roots: string[] = [];
let database: TestPostgres | undefined;
afterAll(async () => {
  await stopAll(roots);
  database?.destroy();
});

const TOKENS = ["join", "admin", "router"] as const;

describe.skipIf(skip)(
  `three control planes on one PostgreSQL${skip ? ` (skipped: ${skip})` : ""}`,
  () => {
    it("survive a SIGKILLed leader and a database outage without losing state, engines or requests", async () => {
      ensureCliBuilt();
      database = await startTestPostgres();
      const pg = database;
      const root = tempRoot("llmgw-pg-ha-");
      roots.push(root);
      const urlFile = path.join(root, "store-url");
      writeFileSync(urlFile, `${await pg.createDatabase()}\n`, { mode: 0o600 });
      const ports = await Promise.all([0, 1, 2].map(() => freePort()));
      const cps = ports.map(
        (port, i) =>
          new ControlPlaneProc(path.join(root, `cp${i}`), port, 0, [
            "--store-url-file",
            urlFile,
            "--no-public-api",
            "--heartbeat-interval",
            "500ms",
            "--lease-ttl",
            "2s",
            "--node-lost-after",
            "120s",
            "--advertise-url",
            `http://127.0.0.1:${port}`,
          ]),
      );
      const [first, ...rest] = cps as [ControlPlaneProc, ...ControlPlaneProc[]];
      await first.start();
      // Instances of one cluster share its tokens: the others get the first one's.
      for (const cp of rest) {
        mkdirSync(cp.dataDir, { recursive: true, mode: 0o700 });
        for (const kind of TOKENS)
          copyFileSync(
            path.join(first.dataDir, `${kind}-token`),
            path.join(cp.dataDir, `${kind}-token`),
          );
        await cp.start();
      }
      const urls = cps.map((cp) => cp.controlUrl);
      const admin = createClient(
        ClusterService,
        createFailoverTransport({
          urls,
          transportFor: (baseUrl) => createConnectTransport({ baseUrl, httpVersion: "1.1" }),
        }),
      );
      const auth = first.adminHeaders();
      const leaderOf = async () => {
        const s = await admin.getClusterStatus({}, { ...auth, timeoutMs: 2_000 });
        const leaders = s.controlPlanes.filter((c) => c.leader);
        return leaders.length === 1 && s.controlPlanes.length === 3 ? leaders[0]?.url : undefined;
      };
      const step = (what: string) => console.log(`[pg-ha ${new Date().toISOString()}] ${what}`);
      step("three instances started");
      const leader0 = await waitFor("one leader among three instances", leaderOf, 20_000);
      expect(urls).toContain(leader0);
      // `llmgw status` given every instance names the store and each instance's role.
      const status = runLlmgw(["status", "--control-plane", urls.join(",")], {
        LLMGW_ADMIN_TOKEN: first.token("admin"),
      });
      expect(await status.exited, status.output()).toBe(0);
      expect(status.output()).toContain("postgres store, 3 instances");
      expect(status.output().match(/ leader /g)).toHaveLength(1);
      expect(status.output().match(/ follower /g)).toHaveLength(2);
      // A follower answers reads from its copy and refuses writes, naming the leader.
      const follower = cps.find((cp) => cp.controlUrl !== leader0) as ControlPlaneProc;
      const refusal = await follower
        .admin()
        .scaleDeployment({ name: "chat", replicas: 1 }, auth)
        .catch((e: unknown) => e as Error);
      expect(String(refusal)).toContain(`is a follower: the leader is ${leader0}`);
      const servedBy = await waitFor("a follower's read from its copy", async () => {
        let header: string | null = null;
        await follower
          .admin()
          .listNodes(
            {},
            {
              ...auth,
              onHeader: (h) => {
                header = h.get("llmgw-served-by");
              },
            },
          )
          .catch(() => undefined);
        return header ?? undefined;
      });
      expect(servedBy).toBe("follower");

      const agent = new AgentProc(root, "node-a", "2xh100-80g", first);
      agent.controlPlane = urls.join(",");
      agent.start();
      await waitFor("the agent's node to be ready", async () => {
        const nodes = (await admin.listNodes({}, auth)).nodes;
        return nodes.length === 1 && nodes[0]?.state === NodeState.READY ? true : undefined;
      });
      const key = (await admin.createApiKey({ name: "app" }, auth)).secret;

      // --- kill -9 the leader while `llmgw deploy --wait` follows a rollout
      const spec = path.join(root, "chat.yaml");
      writeFileSync(
        spec,
        "name: chat\nmodel: sim/chat\nengine: sim\ngpuClass: h100-80g\nreplicas: 2\nextraArgs: [--load-seconds, '4']\n",
      );
      const deploy = runLlmgw(
        ["deploy", "-f", spec, "--wait", "--timeout", "60", "--control-plane", urls.join(",")],
        { LLMGW_ADMIN_TOKEN: first.token("admin") },
      );
      await waitFor("the deployment to be placed", async () => {
        if (deploy.child.exitCode !== null) throw new Error(`deploy exited:\n${deploy.output()}`);
        const d = (await admin.getDeployment({ name: "chat" }, auth)).deployment;
        return d && d.replicas.length === 2 ? true : undefined;
      });
      const killed = cps.find((cp) => cp.controlUrl === leader0) as ControlPlaneProc;
      const killedAt = Date.now();
      await killed.stop("SIGKILL");
      const leader1 = await waitFor(
        "a follower to lead",
        async () => {
          const l = await leaderOf().catch(() => undefined);
          return l !== undefined && l !== leader0 ? l : undefined;
        },
        15_000,
        50,
      );
      const ledAfterMs = Date.now() - killedAt;
      const nodeBack = await waitFor(
        "the first heartbeat the new leader accepts",
        async () => {
          const n = (await admin.listNodes({}, auth)).nodes[0];
          return n?.state === NodeState.READY && Number(n.lastHeartbeatUnixMs) > killedAt
            ? Date.now() - killedAt
            : undefined;
        },
        15_000,
        50,
      );
      console.log(
        `failover: leader ${leader0} killed; ${leader1} leads after ${ledAfterMs} ms, first heartbeat accepted after ${nodeBack} ms`,
      );
      // The lease holds 2 s; a follower polls every 250 ms, then loads the state.
      expect(ledAfterMs).toBeLessThanOrEqual(5_000);
      expect(await deploy.exited, deploy.output()).toBe(0);
      expect(deploy.output()).toContain("chat: 2/2 ready");
      const ready = (await admin.getDeployment({ name: "chat" }, auth)).deployment;
      expect(allReady(ready, 2)).toBe(true);
      const pids = enginePids(ready);
      expect(pids.size).toBe(2);
      // Nothing lost or doubled: the key, the placements, the events.
      const keys = (await admin.listApiKeys({}, auth)).keys;
      expect(keys.map((k) => k.name)).toEqual(["app"]);
      const events = (await admin.listEvents({ limit: 1000 }, auth)).events;
      const ids = events.map((e) => e.id);
      expect(new Set(ids).size).toBe(ids.length);
      expect(events.some((e) => e.kind === "node.joined")).toBe(true);

      // --- traffic through a router that knows all three, then the database goes away
      const router = new RouterProc(root, "r1", first, await freePort(), await freePort(), {
        controlPlanes: urls,
      });
      await router.start();
      const traffic = new ClosedLoopTraffic([router], key, "chat", { loops: 2, maxTokens: 4 });
      const trafficFrom = performance.now();
      traffic.start();
      await traffic.waitForSuccesses(10, trafficFrom);
      const downAt = Date.now();
      pg.stop();
      await waitFor(
        "every instance to stop leading",
        async () => {
          // A write (a no-op if it landed): followers answer reads from their copies even now.
          const e = await admin
            .scaleDeployment({ name: "chat", replicas: 2 }, { ...auth, timeoutMs: 1_000 })
            .catch((x: unknown) => x);
          if (e instanceof Error && e.message.includes("no instance holds the leader lease"))
            return true;
          throw new Error(`still: ${e instanceof Error ? e.message : "answered"}`);
        },
        10_000,
        100,
      );
      const steppedDownMs = Date.now() - downAt;
      // `llmgw status` still answers, from a follower's copy, and says so.
      const copyStatus = runLlmgw(["status", "--control-plane", urls.join(",")], {
        LLMGW_ADMIN_TOKEN: first.token("admin"),
      });
      expect(await copyStatus.exited, copyStatus.output()).toBe(0);
      expect(copyStatus.output()).toContain("answered by a follower from its copy of the state");
      expect(copyStatus.output()).toContain("deployments  1/1 fully ready");
      // Serving goes on from what the router and the agent hold.
      const duringOutage = performance.now();
      await traffic.waitForSuccesses(10, duringOutage);
      pg.start();
      await waitFor(
        "a leader and the node back",
        async () => {
          if ((await leaderOf().catch(() => undefined)) === undefined) return undefined;
          const n = (await admin.listNodes({}, auth)).nodes[0];
          return n?.state === NodeState.READY && Number(n.lastHeartbeatUnixMs) > Date.now() - 2_000
            ? true
            : undefined;
        },
        30_000,
      );
      const after = (await admin.getDeployment({ name: "chat" }, auth)).deployment;
      expect(allReady(after, 2)).toBe(true);
      // Engines never restarted: the same processes through both failovers.
      expect(enginePids(after)).toEqual(pids);
      expect((await admin.listApiKeys({}, auth)).keys.map((k) => k.name)).toEqual(["app"]);
      const outcomes = await traffic.stop();
      const failures = outcomes.filter((o) => !o.ok);
      console.log(
        `database outage: instances stepped down after ${steppedDownMs} ms; ${outcomes.length} requests, ${failures.length} failed`,
      );
      expect(failures, describeFailures(failures, trafficFrom)).toEqual([]);
    }, 180_000);
  },
);
