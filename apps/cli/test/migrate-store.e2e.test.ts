/**
 * `llmgw control-plane migrate-store` on a real populated store: a control plane on SQLite
 * with an agent, a ready deployment and a key is stopped, its store copied into a real
 * PostgreSQL, and a control plane on the same data dir started on PostgreSQL instead. The
 * agent keeps its node id and its engine, and nothing is missing.
 */
import { writeFileSync } from "node:fs";
import path from "node:path";
import {
  postgresUnavailable,
  startTestPostgres,
  type TestPostgres,
} from "@llmgw/control-plane/testing";
import { NodeState } from "@llmgw/proto";
import { afterAll, describe, expect, it } from "vitest";
import {
  AgentProc,
  allReady,
  ControlPlaneProc,
  enginePids,
  ensureCliBuilt,
  freePort,
  runLlmgw,
  simDeployment,
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

async function llmgw(args: string[], env: Record<string, string> = {}) {
  const proc = runLlmgw(args, env);
  const code = await proc.exited;
  return { code, output: proc.output() };
}

describe.skipIf(skip)(
  `llmgw control-plane migrate-store${skip ? ` (skipped: ${skip})` : ""}`,
  () => {
    it("moves a running cluster from SQLite to PostgreSQL without an engine restart", async () => {
      ensureCliBuilt();
      database = await startTestPostgres();
      const root = tempRoot("llmgw-migrate-");
      roots.push(root);
      const url = await database.createDatabase();
      const urlFile = path.join(root, "store-url");
      writeFileSync(urlFile, `${url}\n`, { mode: 0o600 });
      const base = ["--no-public-api", "--heartbeat-interval", "500ms"];
      const cp = new ControlPlaneProc(root, await freePort(), 0, base);
      await cp.start();
      const agent = new AgentProc(root, "node-a", "1xh100-80g", cp);
      agent.start();
      const admin = cp.admin();
      const auth = cp.adminHeaders();
      await waitFor("the node", async () =>
        (await admin.listNodes({}, auth)).nodes[0]?.state === NodeState.READY ? true : undefined,
      );
      await admin.applyDeployment(
        {
          deployment: simDeployment("chat", { gpuClass: "h100-80g", replicas: 1 }),
        },
        auth,
      );
      await admin.createApiKey({ name: "app", models: ["chat"] }, auth);
      const before = await waitFor("the replica ready", async () => {
        const d = (await admin.getDeployment({ name: "chat" }, auth)).deployment;
        return allReady(d, 1) ? d : undefined;
      });
      const nodeId = (await admin.listNodes({}, auth)).nodes[0]?.nodeId;
      const eventsBefore = (await admin.listEvents({ limit: 1000 }, auth)).events;
      await cp.stop();

      // A password on the command line is refused, and never echoed.
      const onArgv = await llmgw([
        "control-plane",
        "migrate-store",
        "--from",
        `sqlite:${cp.dataDir}`,
        "--to",
        url,
      ]);
      expect(onArgv.code).toBe(2);
      expect(onArgv.output).toContain("process list");
      expect(onArgv.output).not.toContain(database.password);

      const migrate = (extra: string[] = []) =>
        llmgw([
          "control-plane",
          "migrate-store",
          "--from",
          `sqlite:${cp.dataDir}`,
          "--to-file",
          urlFile,
          ...extra,
        ]);
      const copied = await migrate(["--json"]);
      expect(copied.code, copied.output).toBe(0);
      const report = JSON.parse(copied.output) as { counts: Record<string, number> };
      expect(report.counts).toMatchObject({
        deployments: 1,
        placements: 1,
        api_keys: 1,
        nodes: 1,
      });
      // Every event seen before the stop, and any the stop itself wrote.
      expect(report.counts.events).toBeGreaterThanOrEqual(eventsBefore.length);
      expect(report.counts.replica_statuses).toBeGreaterThanOrEqual(1);
      // Again: the target holds state now.
      const again = await migrate();
      expect(again.code).toBe(1);
      expect(again.output).toContain("already holds state (1 deployments");
      expect(again.output).not.toContain(database.password);

      // The same data dir and control port, on PostgreSQL: the agent reconnects on its own.
      const onPg = new ControlPlaneProc(root, cp.controlPort, 0, [
        ...base,
        "--store-url-file",
        urlFile,
      ]);
      await onPg.start();
      const after = await waitFor("the replica ready again, heard from the agent", async () => {
        const node = (await admin.listNodes({}, auth)).nodes[0];
        if (node?.state !== NodeState.READY) return undefined;
        const d = (await admin.getDeployment({ name: "chat" }, auth)).deployment;
        return allReady(d, 1) ? d : undefined;
      });
      expect((await admin.listNodes({}, auth)).nodes.map((n) => n.nodeId)).toEqual([nodeId]);
      expect(after?.replicas.map((r) => r.replicaId)).toEqual(
        before.replicas.map((r) => r.replicaId),
      );
      expect(enginePids(after)).toEqual(enginePids(before));
      expect((await admin.listApiKeys({}, auth)).keys.map((k) => k.name)).toEqual(["app"]);
      const eventsAfter = (await admin.listEvents({ limit: 1000 }, auth)).events;
      expect(eventsAfter.slice(0, eventsBefore.length).map((e) => [e.id, e.message])).toEqual(
        eventsBefore.map((e) => [e.id, e.message]),
      );
      // A target a control plane leads is refused even with --force.
      const leading = await migrate(["--force"]);
      expect(leading.code).toBe(1);
      expect(leading.output).toContain("leads on");
      await agent.kill();
    }, 120_000);
  },
);
