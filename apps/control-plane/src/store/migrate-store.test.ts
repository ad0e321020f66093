import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { DATA_DIR_FILES, initDataDir, readToken } from "../domain/tokens.js";
import { postgresUnavailable, startTestPostgres, type TestPostgres } from "../testing/postgres.js";
import { migrateStore } from "./migrate-store.js";
import { MIGRATIONS } from "./migrations.js";
import { openPostgresDatabase, openPostgresStore, type PostgresStore } from "./postgres-store.js";
import { openPostgresUsageStore } from "./postgres-usage-store.js";
import { openSqliteStore } from "./sqlite-store.js";
import {
  AVOIDED,
  DRAINING,
  LIFECYCLE,
  lifecycleKeys,
  placement,
  putAvoidedRecords,
  putLifecycleRecords,
  putTenancyRecords,
  TENANCY,
} from "./test-records.js";

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});
const dir = () => {
  const d = mkdtempSync(join(tmpdir(), "llmgw-migrate-unit-"));
  dirs.push(d);
  return d;
};

// What migrate-store refuses before it reaches any database; a whole cluster moving runs in
// apps/cli/test/migrate-store.e2e.test.ts.
describe("migrateStore refuses a source it cannot copy", () => {
  // Nothing listens on port 1: reaching the database would fail differently.
  const toUrl = "postgres://llmgw@127.0.0.1:1/llmgw";

  it("a data dir without tokens: never started", async () => {
    const d = dir();
    await expect(migrateStore({ fromDataDir: d, toUrl })).rejects.toMatchObject({
      code: "LLMGW_CONTROL_PLANE_NOT_FOUND",
      message: expect.stringContaining(`no join token in ${d}`),
    });
  });

  it("a data dir with tokens but no state.db", async () => {
    const d = join(dir(), "cp");
    initDataDir(d);
    await expect(migrateStore({ fromDataDir: d, toUrl })).rejects.toMatchObject({
      code: "LLMGW_CONTROL_PLANE_NOT_FOUND",
      message: expect.stringContaining(`no SQLite store in ${d}`),
    });
  });
});

const skip = postgresUnavailable();

describe.skipIf(skip)(`migrateStore into PostgreSQL${skip ? ` (skipped: ${skip})` : ""}`, () => {
  let server: TestPostgres;
  beforeAll(async () => {
    server = await startTestPostgres();
  });
  afterAll(() => server?.destroy());

  /** A data dir whose SQLite store `fill` wrote. */
  const dataDir = (fill: (file: string) => void) => {
    const d = join(dir(), "cp");
    initDataDir(d);
    fill(join(d, DATA_DIR_FILES.database));
    return d;
  };
  /** The target's records, loaded as a leader would. */
  const target = async (fromDataDir: string, url: string): Promise<PostgresStore> => {
    const tokens = (["join", "admin", "router"] as const).map((k) => readToken(fromDataDir, k));
    const database = await openPostgresDatabase({ url, tokens });
    return openPostgresStore({ database, writer: { holder: "test", epoch: 0 } });
  };

  it("copies a store the previous release wrote (schema 5), leaving the source as it was", async () => {
    const from = dataDir((file) => {
      const db = new Database(file);
      for (const m of MIGRATIONS.slice(0, 5)) db.exec(m);
      db.pragma("user_version = 5");
      db.exec(
        `INSERT INTO deployments VALUES ('chat', '{"name":"chat"}', 2, 1, 2);
         INSERT INTO placements VALUES
           ('chat-0', 'chat', 2, '[{"rank":0,"nodeId":"a-1","gpuIndices":[0]}]', NULL, NULL, 3);
         INSERT INTO nodes VALUES ('a-1', 'a', 'ee', x'010203', '10.0.0.1', 0, 1, 0, 5, 0, 'ready', 6);
         INSERT INTO events (at_ms, kind, subject, message, severity)
           VALUES (7, 'node.joined', 'a-1', 'joined', 'info');`,
      );
      db.close();
    });
    const url = await server.createDatabase();
    const report = await migrateStore({ fromDataDir: from, toUrl: url });
    expect(report.counts).toEqual({
      deployments: 1,
      deployment_revisions: 0,
      placements: 1,
      api_keys: 0,
      tenants: 0,
      nodes: 1,
      gpu_fault_clears: 0,
      replica_statuses: 0,
      avoided_nodes: 0,
      events: 1,
      usage_rollups: 0,
      usage_batches: 0,
    });
    const store = await target(from, url);
    expect(store.listDeployments().map((d) => d.name)).toEqual(["chat"]);
    expect(store.listPlacements()[0]?.ranks).toEqual([{ rank: 0, nodeId: "a-1", gpuIndices: [0] }]);
    expect(store.listNodes()).toMatchObject([{ id: "a-1", draining: true, state: "ready" }]);
    expect(lifecycleKeys(store)).toEqual([]);
    store.close();
    const source = new Database(join(from, DATA_DIR_FILES.database), { readonly: true });
    expect(source.pragma("user_version", { simple: true })).toBe(5);
    source.close();
  });

  it("copies revision specs, retirements, rollouts and who drained a node, all in the checksum", async () => {
    const write = (records: (file: string) => void) => dataDir(records);
    const lifecycle = (file: string) => {
      const store = openSqliteStore({ file });
      putLifecycleRecords(store);
      putAvoidedRecords(store);
      store.close();
    };
    const from = write(lifecycle);
    const url = await server.createDatabase();
    const report = await migrateStore({ fromDataDir: from, toUrl: url });
    expect(report.counts).toMatchObject({
      deployments: 2,
      deployment_revisions: 3,
      placements: 3,
      nodes: 3,
      avoided_nodes: 3,
    });
    const store = await target(from, url);
    expect(store.listDeployments()).toEqual(LIFECYCLE.deployments);
    expect(store.listDeploymentRevisions()).toEqual(LIFECYCLE.revisions);
    expect(store.listPlacements()).toEqual(LIFECYCLE.placements);
    expect(store.listNodes()).toEqual(LIFECYCLE.nodes);
    expect(lifecycleKeys(store)).toEqual(["chat", "chat-0", "chat-1", "a-1", "b-1"]);
    expect(store.listAvoidedNodes()).toEqual(AVOIDED);
    store.close();

    // The same records copied again sum the same; one nested field apart, they do not.
    const same = await migrateStore({
      fromDataDir: write(lifecycle),
      toUrl: await server.createDatabase(),
    });
    expect(same.checksum).toBe(report.checksum);
    const later = write((file) => {
      lifecycle(file);
      const s = openSqliteStore({ file });
      s.putPlacement(placement("chat-0", { retirement: { ...DRAINING, deadlineMs: 1 } }));
      s.close();
    });
    const other = await migrateStore({ fromDataDir: later, toUrl: await server.createDatabase() });
    expect(other.counts).toEqual(report.counts);
    expect(other.checksum).not.toBe(report.checksum);
  });

  it("copies tenants and the keys' tenant, budgets and priority, all in the checksum", async () => {
    const tenancy = (file: string) => {
      const store = openSqliteStore({ file });
      putTenancyRecords(store);
      store.close();
    };
    const url = await server.createDatabase();
    const from = dataDir(tenancy);
    const report = await migrateStore({ fromDataDir: from, toUrl: url });
    expect(report.counts).toMatchObject({ tenants: 2, api_keys: 2 });
    const store = await target(from, url);
    expect(store.listTenants()).toEqual(TENANCY.tenants);
    expect(store.listApiKeys()).toEqual(TENANCY.keys);
    store.close();

    // A key's budget apart: the same counts, another sum.
    const later = dataDir((file) => {
      tenancy(file);
      const s = openSqliteStore({ file });
      const [key] = TENANCY.keys;
      if (key) s.putApiKey({ ...key, budgets: [{ period: "day", model: "chat", tokens: 6 }] });
      s.close();
    });
    const other = await migrateStore({ fromDataDir: later, toUrl: await server.createDatabase() });
    expect(other.counts).toEqual(report.counts);
    expect(other.checksum).not.toBe(report.checksum);
  });

  it("copies usage rollups and batch ids (a batch sent again still counts once), in the checksum", async () => {
    const minute = Date.UTC(2026, 11, 3, 10, 59);
    const record = {
      minuteMs: minute,
      keyId: "k1",
      tenant: "search",
      model: "chat",
      requests: 2,
      promptTokens: 100,
      cachedTokens: 40,
      cachedReported: 1,
      completionTokens: 20,
      gpuMs: 1_500,
      estimatedRequests: 0,
      refusedUsage: 0,
    };
    const usage = (requests: number) => async (file: string) => {
      const s = openSqliteStore({ file });
      await s.usage.storeBatch(
        { routerId: "r1", batchId: "r1-1", records: [{ ...record, requests }] },
        minute + 60_000,
      );
      s.close();
    };
    const withUsage = async (requests: number) => {
      const d = join(dir(), "cp");
      initDataDir(d);
      await usage(requests)(join(d, DATA_DIR_FILES.database));
      return d;
    };
    const from = await withUsage(2);
    const url = await server.createDatabase();
    const report = await migrateStore({ fromDataDir: from, toUrl: url });
    expect(report.counts).toMatchObject({ usage_rollups: 3, usage_batches: 1 });
    const tokens = (["join", "admin", "router"] as const).map((k) => readToken(from, k));
    const database = await openPostgresDatabase({ url, tokens });
    const copied = openPostgresUsageStore({ database, writer: { holder: "test", epoch: 0 } });
    try {
      const rows = await copied.query({
        bucket: "hour",
        sinceMs: 0,
        untilMs: minute + 86_400_000,
        groupBy: { tenant: true, key: true, model: true },
        limit: 10,
      });
      expect(rows.map((r) => [r.startMs, r.requests, r.gpuMs])).toEqual([
        [Date.UTC(2026, 11, 3, 10), 2, 1_500],
      ]);
      // The lease row is not held by "test" here: reading the export is not a write.
      expect((await copied.exportAll()).batches).toEqual([
        { routerId: "r1", batchId: "r1-1", storedAtMs: minute + 60_000 },
      ]);
    } finally {
      await copied.close();
    }
    const other = await migrateStore({
      fromDataDir: await withUsage(3),
      toUrl: await server.createDatabase(),
    });
    expect(other.counts).toEqual(report.counts);
    expect(other.checksum).not.toBe(report.checksum);
  });
});
