import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isControlPlaneError } from "../errors.js";
import { postgresUnavailable, startTestPostgres, type TestPostgres } from "../testing/postgres.js";
import { startTcpProxy } from "../testing/tcp-proxy.js";
import { MIGRATIONS } from "./migrations.js";
import { startLeaderLease } from "./postgres-lease.js";
import {
  MAX_STATEMENTS_PER_COMMIT,
  openPostgresDatabase,
  openPostgresStore,
  type PostgresDatabase,
  redactStoreUrl,
} from "./postgres-store.js";
import { snapshotStore } from "./snapshot-store.js";
import {
  AVOIDED,
  deployment,
  LIFECYCLE,
  lifecycleKeys,
  node,
  placement,
  putAvoidedRecords,
  putLifecycleRecords,
  putTenancyRecords,
  revision,
  TENANCY,
} from "./test-records.js";
import { startWarmCopy } from "./warm-copy.js";

const skip = postgresUnavailable();
const TOKENS = ["join-aaaaaaaaaaaaaaaa", "admin-bbbbbbbbbbbbbb", "router-cccccccccccc"];

let server: TestPostgres;
beforeAll(async () => {
  if (!skip) server = await startTestPostgres();
});
afterAll(() => server?.destroy());

/** Takes the lease directly, as a lease loop would, and returns the epoch. */
async function takeLease(db: PostgresDatabase, holder: string): Promise<number> {
  const c = await db.connect();
  try {
    const r = await c.query<{ epoch: number }>(
      `UPDATE llmgw_leader SET holder = $1, holder_url = 'http://x', epoch = epoch + 1,
         expires_at = clock_timestamp() + interval '1 hour' WHERE id = 1 RETURNING epoch`,
      [holder],
    );
    return r.rows[0]?.epoch as number;
  } finally {
    await c.end();
  }
}

/** Runs `sql` on its own connection to `url`, returning the rows. */
async function query(
  url: string,
  sql: string,
  values: unknown[] = [],
): Promise<pg.QueryResultRow[]> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    return (await c.query(sql, values)).rows;
  } finally {
    await c.end();
  }
}

/**
 * `db` with the connects numbered in `slow` (from 1) waiting `delayMs` first and those in
 * `refused` failing; every client it made, to check none is left open.
 */
function slowConnects(
  db: PostgresDatabase,
  slow: ReadonlySet<number>,
  delayMs: number,
  refused: ReadonlySet<number> = new Set(),
) {
  const clients: pg.Client[] = [];
  let n = 0;
  const database: PostgresDatabase = {
    location: db.location,
    async connect(o) {
      const i = ++n;
      if (refused.has(i))
        throw Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" });
      if (slow.has(i)) await new Promise((r) => setTimeout(r, delayMs));
      const c = await db.connect(o);
      clients.push(c);
      return c;
    },
  };
  return { database, clients };
}

/** Whether `end()` was never called on `c` (pg keeps no public flag for it). */
const isOpen = (c: pg.Client) => (c as unknown as { _ending?: boolean })._ending !== true;

async function count(url: string, table: string): Promise<number> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    return Number((await c.query(`SELECT count(*) AS n FROM ${table}`)).rows[0].n);
  } finally {
    await c.end();
  }
}

/** A follower's warm copy of `db`, refreshed only when asked. */
const followerCopy = (db: PostgresDatabase) =>
  startWarmCopy({
    database: db,
    eventsKept: 100,
    build: (snapshot) => snapshotStore(snapshot, db.location),
    pollMs: 600_000,
  });

describe.skipIf(skip)(`PostgreSQL store${skip ? ` (skipped: ${skip})` : ""}`, () => {
  it("migrates once, writes through on flush and reads everything back in a new instance", async () => {
    const url = await server.createDatabase();
    const db = await openPostgresDatabase({ url, tokens: TOKENS });
    // A second instance starting on the same database finds it migrated.
    await openPostgresDatabase({ url, tokens: TOKENS });
    const epoch = await takeLease(db, "a");
    const store = await openPostgresStore({ database: db, writer: { holder: "a", epoch } });
    store.transaction(() => {
      store.putDeployment({
        name: "chat",
        specJson: "{}",
        revision: 1,
        createdAtMs: 1,
        updatedAtMs: 1,
      });
      store.putPlacement({
        replicaId: "chat-0",
        deployment: "chat",
        revision: 1,
        ranks: [{ rank: 0, nodeId: "n1", gpuIndices: [0, 1] }],
        rendezvousPort: 29500,
        createdAtMs: 2,
      });
    });
    store.putNode({
      id: "n1",
      hostname: "h",
      credentialHash: "ee",
      inventory: new Uint8Array([1, 2, 3]),
      advertiseAddress: "10.0.0.1",
      cordoned: false,
      draining: true,
      revoked: false,
      registeredAtMs: 1_800_000_000_000,
    });
    store.putApiKey({
      id: "k1",
      name: "app",
      prefix: "sk",
      secretHash: "ff",
      models: ["chat"],
      budgets: [],
      createdAtMs: 3,
    });
    store.replaceFaultClears("GPU-1", [
      { gpuUuid: "GPU-1", faultKey: "xid:0:79", lastSeenUnixMs: 5, clearedAtMs: 6 },
    ]);
    store.putReplicaStatus({
      replicaId: "chat-0",
      rank: 0,
      nodeId: "n1",
      state: "ready",
      apiPort: 8000,
      stateSinceMs: 7,
      specHash: "abc",
      revision: 1,
    });
    for (let i = 0; i < 5; i++)
      store.appendEvent({ atMs: i, kind: "k", subject: "s", message: `m${i}`, severity: "info" });
    expect(store.pending).toBeGreaterThan(0);
    await store.flush();
    expect(store.pending).toBe(0);
    expect(await count(url, "events")).toBe(5);

    store.putNodeState("n1", "lost", 9);
    await store.flush();
    const again = await openPostgresStore({ database: db, writer: { holder: "a", epoch } });
    expect(again.listNodes()[0]).toMatchObject({ state: "lost", stateSinceMs: 9 });
    expect(again.listDeployments()).toEqual(store.listDeployments());
    expect(again.listPlacements()).toEqual(store.listPlacements());
    expect(again.listNodes()).toEqual(store.listNodes());
    expect(again.listNodes()[0]?.registeredAtMs).toBe(1_800_000_000_000);
    expect(again.listApiKeys()).toEqual(store.listApiKeys());
    expect(again.listFaultClears()).toEqual(store.listFaultClears());
    expect(again.listReplicaStatuses()).toEqual(store.listReplicaStatuses());
    expect(again.listEvents({ limit: 3 }).map((e) => e.message)).toEqual(["m2", "m3", "m4"]);
    // Paging: the oldest ones after the id, not the newest.
    expect(again.listEvents({ afterId: 1, limit: 2 }).map((e) => e.message)).toEqual(["m1", "m2"]);
    // Event ids continue after the last stored one.
    expect(
      again.appendEvent({ atMs: 9, kind: "k", subject: "s", message: "m5", severity: "info" }).id,
    ).toBe(6);
    store.close();
    again.close();
  });

  it("keeps retirements, rollouts, who drained a node and revision specs, for a new leader and a follower", async () => {
    const url = await server.createDatabase();
    const db = await openPostgresDatabase({ url, tokens: TOKENS });
    const epoch = await takeLease(db, "a");
    const store = await openPostgresStore({ database: db, writer: { holder: "a", epoch } });
    putLifecycleRecords(store);
    expect(store.listDeploymentRevisions()).toEqual(LIFECYCLE.revisions);
    await store.flush();
    const loaded = await openPostgresStore({ database: db, writer: { holder: "a", epoch } });
    expect(loaded.listDeployments()).toEqual(LIFECYCLE.deployments);
    expect(loaded.listDeploymentRevisions()).toEqual(LIFECYCLE.revisions);
    expect(loaded.listPlacements()).toEqual(LIFECYCLE.placements);
    expect(loaded.listNodes()).toEqual(LIFECYCLE.nodes);
    expect(lifecycleKeys(loaded)).toEqual(["chat", "chat-0", "chat-1", "a-1", "b-1"]);
    loaded.close();

    // Replaced, cleared and deleted; a failed transaction changes neither copy nor database.
    store.putDeploymentRevision({ ...revision("chat", 3), specJson: '{"replaced":true}' });
    store.deleteDeploymentRevision("chat", 10);
    store.deleteDeploymentRevision("none", 1);
    store.putPlacement(placement("chat-0"));
    store.putNode(node("a-1"));
    expect(() =>
      store.transaction(() => {
        store.putDeploymentRevision(revision("chat", 11));
        store.deleteDeploymentRevision("code", 1);
        throw new Error("domain says no");
      }),
    ).toThrow("domain says no");
    const expected = [
      { ...revision("chat", 3), specJson: '{"replaced":true}' },
      revision("code", 1),
    ];
    expect(store.listDeploymentRevisions()).toEqual(expected);
    await store.flush();
    expect(
      await query(url, "SELECT name, revision FROM deployment_revisions ORDER BY name, revision"),
    ).toEqual([
      { name: "chat", revision: "3" },
      { name: "code", revision: "1" },
    ]);

    const copy = followerCopy(db);
    try {
      const follower = (await copy.refreshed()).value;
      expect(follower.listDeploymentRevisions()).toEqual(expected);
      expect(follower.listDeployments()).toEqual(LIFECYCLE.deployments);
      expect(follower.listPlacements().map((p) => p.retirement)).toEqual([
        undefined,
        LIFECYCLE.placements[1]?.retirement,
        undefined,
      ]);
      expect(lifecycleKeys(follower)).toEqual(["chat", "chat-1", "b-1"]);
      expect(() => follower.putDeploymentRevision(revision("chat", 12))).toThrow(
        expect.objectContaining({ code: "LLMGW_CONTROL_PLANE_NOT_LEADER" }),
      );
    } finally {
      await copy.close();
      store.close();
    }
  });

  it("keeps avoided nodes (schema v8) for a new leader and a follower", async () => {
    const url = await server.createDatabase();
    const db = await openPostgresDatabase({ url, tokens: TOKENS });
    const epoch = await takeLease(db, "a");
    const store = await openPostgresStore({ database: db, writer: { holder: "a", epoch } });
    const want = putAvoidedRecords(store);
    expect(store.listAvoidedNodes()).toEqual(want);
    await store.flush();
    expect(
      await query(url, "SELECT deployment, node_id, moves FROM avoided_nodes ORDER BY 1, 2"),
    ).toEqual([
      { deployment: "chat", node_id: "a-1", moves: "1" },
      { deployment: "chat", node_id: "b-1", moves: "3" },
      { deployment: "code", node_id: "a-1", moves: "1" },
    ]);
    const loaded = await openPostgresStore({ database: db, writer: { holder: "a", epoch } });
    expect(loaded.listAvoidedNodes()).toEqual(AVOIDED);
    loaded.close();
    const copy = followerCopy(db);
    try {
      const follower = (await copy.refreshed()).value;
      expect(follower.listAvoidedNodes()).toEqual(AVOIDED);
      expect(() => follower.deleteAvoidedNode("chat", "a-1")).toThrow(
        expect.objectContaining({ code: "LLMGW_CONTROL_PLANE_NOT_LEADER" }),
      );
    } finally {
      await copy.close();
      store.close();
    }
  });

  it("keeps tenants and the keys' tenant, budgets and priority, for a new leader and a follower", async () => {
    const url = await server.createDatabase();
    const db = await openPostgresDatabase({ url, tokens: TOKENS });
    const epoch = await takeLease(db, "a");
    const store = await openPostgresStore({ database: db, writer: { holder: "a", epoch } });
    putTenancyRecords(store);
    expect(store.listTenants()).toEqual(TENANCY.tenants);
    await store.flush();
    const loaded = await openPostgresStore({ database: db, writer: { holder: "a", epoch } });
    expect(loaded.listTenants()).toEqual(TENANCY.tenants);
    expect(loaded.listApiKeys()).toEqual(TENANCY.keys);
    expect(loaded.listApiKeys()[1]).not.toHaveProperty("tenant");
    loaded.close();

    // Replaced (keeping its creation time) and deleted; a failed transaction changes neither.
    const [batch, search] = TENANCY.tenants;
    const replaced = { ...(search as (typeof TENANCY.tenants)[number]), weight: 3, createdAtMs: 1 };
    store.putTenant(replaced);
    store.deleteTenant("batch-jobs");
    expect(() =>
      store.transaction(() => {
        store.deleteTenant("search");
        store.putTenant({ ...(batch as (typeof TENANCY.tenants)[number]), name: "other" });
        throw new Error("domain says no");
      }),
    ).toThrow("domain says no");
    const expected = [{ ...replaced, createdAtMs: search?.createdAtMs }];
    expect(store.listTenants()).toEqual(expected);
    await store.flush();
    expect(await query(url, "SELECT name, weight, created_at_ms FROM tenants")).toEqual([
      { name: "search", weight: "3", created_at_ms: String(search?.createdAtMs) },
    ]);

    const copy = followerCopy(db);
    try {
      const follower = (await copy.refreshed()).value;
      expect(follower.listTenants()).toEqual(expected);
      expect(follower.listApiKeys()).toEqual(TENANCY.keys);
      expect(() => follower.deleteTenant("search")).toThrow(
        expect.objectContaining({ code: "LLMGW_CONTROL_PLANE_NOT_LEADER" }),
      );
    } finally {
      await copy.close();
      store.close();
    }
  });

  it("instances starting together run each migration once, in one of them, and all open", async () => {
    const url = await server.createDatabase();
    await query(url, "CREATE TABLE migration_runs (version INT NOT NULL)");
    // Each version also records that it ran: a second run would record it twice (or fail).
    const counted = MIGRATIONS.map(
      (m, i) => `${m};\nINSERT INTO migration_runs VALUES (${i + 1});`,
    );
    await Promise.all(
      Array.from({ length: 4 }, () =>
        openPostgresDatabase({ url, tokens: TOKENS, migrations: counted }),
      ),
    );
    expect(await query(url, "SELECT version FROM migration_runs ORDER BY version")).toEqual(
      MIGRATIONS.map((_, i) => ({ version: i + 1 })),
    );
    expect(await query(url, "SELECT version FROM llmgw_schema")).toEqual([
      { version: MIGRATIONS.length },
    ]);
  });

  it("upgrades a database of schema version 5: its rows read back with the new fields absent", async () => {
    const url = await server.createDatabase();
    await openPostgresDatabase({ url, tokens: TOKENS, migrations: MIGRATIONS.slice(0, 5) });
    await query(
      url,
      `INSERT INTO deployments VALUES ('chat', '{"name":"chat"}', 2, 1, 2);
       INSERT INTO placements VALUES
         ('chat-0', 'chat', 2, '[{"rank":0,"nodeId":"a-1","gpuIndices":[0]}]', NULL, NULL, 3);
       INSERT INTO nodes VALUES ('a-1', 'a', 'ee', decode('010203', 'hex'), '10.0.0.1', 0, 1, 0, 5, 0, 'ready', 6);`,
    );
    const db = await openPostgresDatabase({ url, tokens: TOKENS });
    expect(await query(url, "SELECT version FROM llmgw_schema")).toEqual([
      { version: MIGRATIONS.length },
    ]);
    const store = await openPostgresStore({ database: db, writer: { holder: "a", epoch: 0 } });
    expect(store.listDeployments()).toEqual([
      { name: "chat", specJson: '{"name":"chat"}', revision: 2, createdAtMs: 1, updatedAtMs: 2 },
    ]);
    expect(store.listPlacements().map((p) => p.replicaId)).toEqual(["chat-0"]);
    expect(store.listNodes()).toMatchObject([{ id: "a-1", draining: true, state: "ready" }]);
    expect([...(store.listNodes()[0]?.inventory ?? [])]).toEqual([1, 2, 3]);
    expect(lifecycleKeys(store)).toEqual([]);
    expect(store.listDeploymentRevisions()).toEqual([]);
    store.close();
  });

  it("rolls back an interrupted migration to version 6 and finishes it on the next start", async () => {
    const url = await server.createDatabase();
    await openPostgresDatabase({ url, tokens: TOKENS, migrations: MIGRATIONS.slice(0, 5) });
    // The last statement of version 6 fails after the others ran.
    await query(url, "ALTER TABLE nodes ADD COLUMN drained_by TEXT");
    const error = await openPostgresDatabase({ url, tokens: TOKENS }).catch((e: unknown) => e);
    expect(isControlPlaneError(error) && error.code).toBe("LLMGW_CONTROL_PLANE_STORE_FAILED");
    expect((error as Error).message).toContain("migration to schema version 6");
    expect((error as Error).message).toContain(
      'column "drained_by" of relation "nodes" already exists',
    );
    expect(await query(url, "SELECT version FROM llmgw_schema")).toEqual([{ version: 5 }]);
    expect(await query(url, "SELECT to_regclass('deployment_revisions') AS t")).toEqual([
      { t: null },
    ]);
    expect(
      await query(
        url,
        `SELECT table_name, column_name FROM information_schema.columns
         WHERE column_name IN ('retirement_json', 'rollout_json')`,
      ),
    ).toEqual([]);
    await query(url, "ALTER TABLE nodes DROP COLUMN drained_by");
    const db = await openPostgresDatabase({ url, tokens: TOKENS });
    const epoch = await takeLease(db, "a");
    const store = await openPostgresStore({ database: db, writer: { holder: "a", epoch } });
    putLifecycleRecords(store);
    await store.flush();
    store.close();
    expect(await query(url, "SELECT id, drained_by FROM nodes ORDER BY id")).toEqual([
      { id: "a-1", drained_by: "agent" },
      { id: "b-1", drained_by: "operator" },
      { id: "c-1", drained_by: null },
    ]);
  });

  it("a stored record that does not decode stops the load, naming the row", async () => {
    const url = await server.createDatabase();
    const db = await openPostgresDatabase({ url, tokens: TOKENS });
    const epoch = await takeLease(db, "a");
    const store = await openPostgresStore({ database: db, writer: { holder: "a", epoch } });
    putLifecycleRecords(store);
    await store.flush();
    store.close();
    await query(url, "UPDATE placements SET retirement_json = $1 WHERE replica_id = 'chat-1'", [
      '{"phase":"draining"}',
    ]);
    const error = await openPostgresStore({ database: db, writer: { holder: "a", epoch } }).catch(
      (e: unknown) => e,
    );
    expect(isControlPlaneError(error) && error.code).toBe("LLMGW_CONTROL_PLANE_STORE_CORRUPT");
    expect((error as Error).message).toContain(
      "the stored placement chat-1 does not decode: placements.retirement_json field code is missing, not a non-empty string",
    );
  });

  it("a warm copy is read again after each commit the leader notifies, and after an outage", async () => {
    const url = await server.createDatabase();
    const db = await openPostgresDatabase({ url, tokens: TOKENS });
    const epoch = await takeLease(db, "a");
    const store = await openPostgresStore({ database: db, writer: { holder: "a", epoch } });
    const lines: string[] = [];
    const copy = startWarmCopy({
      database: db,
      eventsKept: 100,
      build: (s) => s.deployments.map((d) => d.name),
      log: (line) => lines.push(line),
      minIntervalMs: 20,
      // Only a notification can bring a change within the test's time.
      pollMs: 600_000,
    });
    try {
      expect((await copy.refreshed()).value).toEqual([]);
      const put = (name: string) =>
        store.putDeployment({ name, specJson: "{}", revision: 1, createdAtMs: 1, updatedAtMs: 1 });
      put("chat");
      await store.flush();
      await expect.poll(() => copy.current?.value, { timeout: 5_000 }).toEqual(["chat"]);

      server.stop();
      void copy.refreshed();
      // The database is down: the copy keeps what it had, and says why once.
      await expect.poll(() => lines.length, { timeout: 5_000 }).toBeGreaterThan(0);
      expect(copy.current?.value).toEqual(["chat"]);
      expect(lines[0]).toContain("cannot be read");
      server.start();
      put("code");
      await store.flush(15_000);
      await expect.poll(() => copy.current?.value, { timeout: 10_000 }).toEqual(["chat", "code"]);
      expect(lines.at(-1)).toContain("current again");
    } finally {
      await copy.close();
      store.close();
    }
  }, 40_000);

  it("a warm copy whose connection goes silent gives it up and reads over a new one", async () => {
    const url = await server.createDatabase();
    const db = await openPostgresDatabase({ url, tokens: TOKENS });
    const epoch = await takeLease(db, "a");
    const store = await openPostgresStore({ database: db, writer: { holder: "a", epoch } });
    const proxy = await startTcpProxy(server.port);
    const viaProxy = await openPostgresDatabase({
      url: url.replace(`:${server.port}/`, `:${proxy.port}/`),
      tokens: TOKENS,
    });
    const lines: string[] = [];
    const copy = startWarmCopy({
      database: viaProxy,
      eventsKept: 100,
      build: (s) => s.deployments.map((d) => d.name),
      log: (line) => lines.push(line),
      minIntervalMs: 20,
      pollMs: 600_000,
      queryTimeoutMs: 500,
    });
    try {
      expect((await copy.refreshed()).value).toEqual([]);
      // The copy's connection hears nothing more, and is told nothing: no reset, no close.
      proxy.strand();
      store.putDeployment({
        name: "chat",
        specJson: "{}",
        revision: 1,
        createdAtMs: 1,
        updatedAtMs: 1,
      });
      await store.flush();
      void copy.refreshed();
      await expect.poll(() => copy.current?.value, { timeout: 10_000 }).toEqual(["chat"]);
      expect(lines[0]).toMatch(/cannot be read \(Query read timeout\)/);
      expect(lines.at(-1)).toContain("current again");
    } finally {
      await copy.close();
      store.close();
      await proxy.close();
    }
  }, 30_000);

  it("a failed transaction leaves neither the copy nor the database changed", async () => {
    const url = await server.createDatabase();
    const db = await openPostgresDatabase({ url, tokens: TOKENS });
    const epoch = await takeLease(db, "a");
    const store = await openPostgresStore({ database: db, writer: { holder: "a", epoch } });
    expect(() =>
      store.transaction(() => {
        store.putDeployment({
          name: "x",
          specJson: "{}",
          revision: 1,
          createdAtMs: 1,
          updatedAtMs: 1,
        });
        throw new Error("domain says no");
      }),
    ).toThrow("domain says no");
    expect(store.listDeployments()).toEqual([]);
    await store.flush();
    expect(await count(url, "deployments")).toBe(0);
    store.close();
  });

  it("refuses a second key with the same secret, as SQLite's unique index does, and keeps the first", async () => {
    const url = await server.createDatabase();
    const db = await openPostgresDatabase({ url, tokens: TOKENS });
    const epoch = await takeLease(db, "a");
    const store = await openPostgresStore({ database: db, writer: { holder: "a", epoch } });
    const key = {
      id: "k1",
      name: "a",
      prefix: "sk",
      secretHash: "ff",
      models: [],
      budgets: [],
      createdAtMs: 1,
    };
    store.putApiKey(key);
    let code = "";
    try {
      store.putApiKey({ ...key, id: "k2", name: "b" });
    } catch (error) {
      code = (error as { code?: string }).code ?? "";
    }
    expect(code).toBe("LLMGW_CONTROL_PLANE_STORE_FAILED");
    expect(store.listApiKeys().map((k) => k.id)).toEqual(["k1"]);
    await store.flush();
    expect(await count(url, "api_keys")).toBe(1);
    store.close();
  });

  it("resigning hands the lease over at once and keeps the resigner out for three ttls", async () => {
    const url = await server.createDatabase();
    const db = await openPostgresDatabase({ url, tokens: TOKENS });
    const lease = (id: string) =>
      startLeaderLease({
        database: db,
        instanceId: id,
        url: `http://${id}`,
        version: "test",
        ttlMs: 600,
        pollMs: 50,
        onElected: () => {},
        onDeposed: () => {},
      });
    const a = lease("a");
    await expect.poll(() => a.writer?.epoch, { timeout: 5_000 }).toBe(1);
    const b = lease("b");
    await expect.poll(() => b.leader?.holder, { timeout: 5_000 }).toBe("a");
    const resignedAt = performance.now();
    await a.resign("its state failed to load");
    expect(a.writer).toBeUndefined();
    await expect.poll(() => b.writer?.epoch, { timeout: 5_000 }).toBe(2);
    expect(performance.now() - resignedAt).toBeLessThan(600);
    // b stops: a takes the lease again, but only once its three ttls are over.
    await b.close();
    await expect.poll(() => a.writer?.epoch, { timeout: 5_000 }).toBe(3);
    expect(performance.now() - resignedAt).toBeGreaterThanOrEqual(3 * 600);
    await a.close();
  });

  it("fences: after another instance takes the lease the old writer commits nothing", async () => {
    const url = await server.createDatabase();
    const db = await openPostgresDatabase({ url, tokens: TOKENS });
    const epoch = await takeLease(db, "old");
    const fenced: string[] = [];
    const old = await openPostgresStore({
      database: db,
      writer: { holder: "old", epoch },
      onFenced: (e) => fenced.push(e.code),
    });
    old.putDeployment({
      name: "before",
      specJson: "{}",
      revision: 1,
      createdAtMs: 1,
      updatedAtMs: 1,
    });
    await old.flush();
    await takeLease(db, "new");
    old.putDeployment({
      name: "after",
      specJson: "{}",
      revision: 1,
      createdAtMs: 1,
      updatedAtMs: 1,
    });
    const error = await old.flush().catch((e: unknown) => e);
    expect(isControlPlaneError(error) && error.code).toBe("LLMGW_CONTROL_PLANE_NOT_LEADER");
    expect(fenced).toEqual(["LLMGW_CONTROL_PLANE_NOT_LEADER"]);
    // Later writes are refused too, never queued behind the fence.
    old.putDeployment({
      name: "later",
      specJson: "{}",
      revision: 1,
      createdAtMs: 1,
      updatedAtMs: 1,
    });
    await expect(old.flush()).rejects.toThrow(/no longer holds the leader lease/);
    const c = new pg.Client({ connectionString: url });
    await c.connect();
    const names = (await c.query("SELECT name FROM deployments ORDER BY name")).rows.map(
      (r) => r.name,
    );
    await c.end();
    expect(names).toEqual(["before"]);
  });

  it("holds writes while the database is down and commits them, in order, when it returns", async () => {
    const own = await startTestPostgres();
    try {
      const url = await own.createDatabase();
      const db = await openPostgresDatabase({ url, tokens: TOKENS });
      const epoch = await takeLease(db, "a");
      const lines: string[] = [];
      const store = await openPostgresStore({
        database: db,
        writer: { holder: "a", epoch },
        log: (l) => lines.push(l),
      });
      own.stop();
      store.putDeployment({
        name: "d",
        specJson: "{}",
        revision: 1,
        createdAtMs: 1,
        updatedAtMs: 1,
      });
      store.putDeployment({
        name: "d",
        specJson: "{}",
        revision: 2,
        createdAtMs: 1,
        updatedAtMs: 2,
      });
      const early = await store.flush(300).catch((e: unknown) => e);
      expect(isControlPlaneError(early) && early.code).toBe(
        "LLMGW_CONTROL_PLANE_STORE_UNAVAILABLE",
      );
      own.start();
      await store.flush(10_000);
      const c = new pg.Client({ connectionString: url });
      await c.connect();
      const rows = (await c.query("SELECT revision FROM deployments")).rows;
      await c.end();
      expect(rows.map((r) => Number(r.revision))).toEqual([2]);
      expect(lines.some((l) => l.includes("unreachable"))).toBe(true);
      expect(lines.some((l) => l.includes("takes writes again"))).toBe(true);
      // The password never reaches a log line.
      expect(lines.join("\n")).not.toContain(own.password);
      store.close();
    } finally {
      own.destroy();
    }
  });

  it("an interrupted migration is rolled back and the store still opens at the previous version", async () => {
    const url = await server.createDatabase();
    const broken = [...MIGRATIONS, "CREATE TABLE extra (a BIGINT); SELECT no_such_function();"];
    const error = await openPostgresDatabase({ url, tokens: TOKENS, migrations: broken }).catch(
      (e: unknown) => e,
    );
    expect(isControlPlaneError(error) && error.code).toBe("LLMGW_CONTROL_PLANE_STORE_FAILED");
    expect((error as Error).message).toContain(
      `migration to schema version ${MIGRATIONS.length + 1}`,
    );
    expect((error as Error).message).not.toContain(server.password);
    const c = new pg.Client({ connectionString: url });
    await c.connect();
    expect((await c.query("SELECT version FROM llmgw_schema")).rows[0].version).toBe(
      MIGRATIONS.length,
    );
    expect((await c.query("SELECT to_regclass('extra') AS t")).rows[0].t).toBeNull();
    await c.end();
    await openPostgresDatabase({ url, tokens: TOKENS });
  });

  it("refuses a schema newer than this build and an instance with other tokens", async () => {
    const url = await server.createDatabase();
    await openPostgresDatabase({ url, tokens: TOKENS });
    await expect(openPostgresDatabase({ url, tokens: ["other"] })).rejects.toThrow(
      /other tokens than this data dir's/,
    );
    const c = new pg.Client({ connectionString: url });
    await c.connect();
    await c.query("UPDATE llmgw_schema SET version = 999");
    await c.end();
    const error = await openPostgresDatabase({ url, tokens: TOKENS }).catch((e: unknown) => e);
    expect(isControlPlaneError(error) && error.code).toBe("LLMGW_CONTROL_PLANE_STORE_TOO_NEW");
  });

  it("a database that cannot be reached is a clear error without the password", async () => {
    const url = `postgres://llmgw:${server.password}@127.0.0.1:1/none`;
    const error = await openPostgresDatabase({ url, tokens: TOKENS }).catch((e: unknown) => e);
    expect(isControlPlaneError(error) && error.code).toBe("LLMGW_CONTROL_PLANE_STORE_FAILED");
    expect((error as Error).message).toContain("postgres://llmgw:***@127.0.0.1:1/none");
    expect((error as Error).message).not.toContain(server.password);
    expect(redactStoreUrl("postgres://u:p@h/d?password=q")).toBe("postgres://u:***@h/d");
  });

  it("resigns only the term it is told, when given one", async () => {
    const url = await server.createDatabase();
    const db = await openPostgresDatabase({ url, tokens: TOKENS });
    const lease = startLeaderLease({
      database: db,
      instanceId: "a",
      url: "http://a",
      version: "test",
      ttlMs: 600,
      pollMs: 50,
      onElected: () => {},
      onDeposed: () => {},
    });
    await expect.poll(() => lease.writer?.epoch, { timeout: 5_000 }).toBe(1);
    // A store of an earlier term failing late: not this term's business.
    await lease.resign("a closed term's commit failed", 0);
    expect(lease.writer?.epoch).toBe(1);
    await lease.resign("this term's commit failed", 1);
    expect(lease.writer).toBeUndefined();
    await lease.close();
  });

  it("a lease closed while it connects takes nothing and leaves no connection", async () => {
    const url = await server.createDatabase();
    const db = await openPostgresDatabase({ url, tokens: TOKENS });
    // The first attempt is refused; the next one, started by the loop's timer, is slow.
    const { database, clients } = slowConnects(db, new Set([2]), 400, new Set([1]));
    const elected: number[] = [];
    const lease = startLeaderLease({
      database,
      instanceId: "a",
      url: "http://a",
      version: "test",
      ttlMs: 2_000,
      pollMs: 50,
      onElected: (w) => elected.push(w.epoch),
      onDeposed: () => {},
    });
    await new Promise((r) => setTimeout(r, 150)); // its second attempt is connecting
    await lease.close();
    await expect.poll(() => clients.length, { timeout: 5_000 }).toBe(1);
    await new Promise((r) => setTimeout(r, 200)); // what it would do once connected
    expect(elected).toEqual([]);
    expect(
      await query(url, "SELECT expires_at > clock_timestamp() AS live FROM llmgw_leader"),
    ).toEqual([{ live: false }]);
    expect(await query(url, "SELECT id FROM llmgw_instances")).toEqual([]);
    expect(clients.filter(isOpen)).toEqual([]);
  });

  it("a store closed while its writer connects commits nothing, says nothing, and leaves no connection", async () => {
    const url = await server.createDatabase();
    const db = await openPostgresDatabase({ url, tokens: TOKENS });
    const epoch = await takeLease(db, "a");
    // Connect 1 loads the state; 2 is the writer's, slow (a reconnect during a blip).
    const { database, clients } = slowConnects(db, new Set([2]), 400);
    const fenced: string[] = [];
    const store = await openPostgresStore({
      database,
      writer: { holder: "a", epoch },
      onFenced: (e) => fenced.push(e.code),
    });
    store.putDeployment(deployment("after-close"));
    const flushed = store.flush(5_000).then(
      () => "flushed",
      (e: Error) => e.message,
    );
    await new Promise((r) => setTimeout(r, 50));
    store.close();
    // The lease moves on meanwhile: the closed store's fence check must not report it.
    await takeLease(db, "b");
    expect(await flushed).toBe("the control plane is shutting down");
    await expect.poll(() => clients.length, { timeout: 5_000 }).toBe(2);
    await new Promise((r) => setTimeout(r, 200)); // what the writer would do once connected
    expect(clients.filter(isOpen)).toEqual([]);
    expect(await count(url, "deployments")).toBe(0);
    expect(fenced).toEqual([]);
  });

  it("sends a batch again when its COMMIT's answer is lost, events included, and fails nothing", async () => {
    const url = await server.createDatabase();
    const db = await openPostgresDatabase({ url, tokens: TOKENS });
    const epoch = await takeLease(db, "a");
    let loseCommit = false;
    const database: PostgresDatabase = {
      location: db.location,
      async connect(o) {
        const c = await db.connect(o);
        const query = c.query.bind(c) as (...a: unknown[]) => Promise<unknown>;
        (c as unknown as { query: unknown }).query = async (...a: unknown[]) => {
          const result = await query(...a);
          if (a[0] === "COMMIT" && loseCommit) {
            loseCommit = false;
            throw Object.assign(new Error("Connection terminated unexpectedly"), {
              code: "ECONNRESET",
            });
          }
          return result;
        };
        return c;
      },
    };
    const fenced: string[] = [];
    const store = await openPostgresStore({
      database,
      writer: { holder: "a", epoch },
      onFenced: (e) => fenced.push(e.message),
    });
    loseCommit = true;
    store.appendEvent({ atMs: 1, kind: "k", subject: "s", message: "m", severity: "info" });
    store.putDeployment(deployment("chat"));
    await store.flush(5_000);
    expect(fenced).toEqual([]);
    expect(await query(url, "SELECT id FROM events")).toEqual([{ id: "1" }]);
    expect(await count(url, "deployments")).toBe(1);
    store.close();
  });

  it("commits a backlog in transactions of at most MAX_STATEMENTS_PER_COMMIT statements", async () => {
    const url = await server.createDatabase();
    const db = await openPostgresDatabase({ url, tokens: TOKENS });
    const epoch = await takeLease(db, "a");
    const sizes: number[] = [];
    let open = 0;
    const database: PostgresDatabase = {
      location: db.location,
      async connect(o) {
        const c = await db.connect(o);
        const query = c.query.bind(c) as (...a: unknown[]) => Promise<unknown>;
        (c as unknown as { query: unknown }).query = (...a: unknown[]) => {
          if (a[0] === "BEGIN") open = 0;
          else if (a[0] === "COMMIT") sizes.push(open);
          else open++;
          return query(...a);
        };
        return c;
      },
    };
    const store = await openPostgresStore({ database, writer: { holder: "a", epoch } });
    const n = 3 * MAX_STATEMENTS_PER_COMMIT + 7;
    for (let i = 0; i < n; i++) store.putDeployment(deployment(`d${i}`));
    await store.flush(30_000);
    expect(await count(url, "deployments")).toBe(n);
    // Each commit: its statements plus the fence check and the NOTIFY.
    expect(sizes.length).toBeGreaterThanOrEqual(4);
    expect(Math.max(...sizes)).toBeLessThanOrEqual(MAX_STATEMENTS_PER_COMMIT + 2);
    store.close();
  });

  it("a leader cut off from the database stops leading within its ttl, on its own clock", async () => {
    const own = await startTestPostgres();
    try {
      const db = await openPostgresDatabase({ url: await own.createDatabase(), tokens: TOKENS });
      let deposedAt: number | undefined;
      const reasons: string[] = [];
      const lease = startLeaderLease({
        database: db,
        instanceId: "a",
        url: "http://a",
        version: "test",
        ttlMs: 800,
        onElected: () => {},
        onDeposed: (why) => {
          deposedAt = performance.now();
          reasons.push(why);
        },
      });
      await expect.poll(() => lease.writer?.epoch, { timeout: 5_000 }).toBe(1);
      const stoppedAt = performance.now();
      own.stop();
      await expect.poll(() => deposedAt, { timeout: 5_000 }).toBeDefined();
      expect((deposedAt as number) - stoppedAt).toBeLessThanOrEqual(800);
      expect(reasons).toEqual(["not renewed within 800 ms (the database is slow or unreachable)"]);
      // Back: it contends again like any follower and wins a new epoch.
      own.start();
      await expect.poll(() => lease.writer?.epoch, { timeout: 10_000 }).toBe(2);
      await lease.close();
    } finally {
      own.destroy();
    }
  });

  it("one leader at a time: a planned stop hands the lease over at once, with a higher epoch", async () => {
    const url = await server.createDatabase();
    const db = await openPostgresDatabase({ url, tokens: TOKENS });
    const events: string[] = [];
    const lease = (id: string) =>
      startLeaderLease({
        database: db,
        instanceId: id,
        url: `http://${id}`,
        version: "test",
        ttlMs: 600,
        pollMs: 50,
        onElected: (w) => events.push(`${id} elected ${w.epoch}`),
        onDeposed: (why) => events.push(`${id} deposed: ${why}`),
      });
    const a = lease("a");
    await expect.poll(() => a.writer?.epoch, { timeout: 5_000 }).toBe(1);
    const b = lease("b");
    await expect.poll(() => b.leader?.holder, { timeout: 5_000 }).toBe("a");
    expect(b.writer).toBeUndefined();
    expect((await b.instances()).map((i) => i.id).sort()).toEqual(["a", "b"]);
    const stoppedAt = performance.now();
    await a.close();
    await expect.poll(() => b.writer?.epoch, { timeout: 5_000 }).toBe(2);
    expect(performance.now() - stoppedAt).toBeLessThan(600);
    expect(events).toEqual([
      "a elected 1",
      "a deposed: this control plane is stopping",
      "b elected 2",
    ]);
    await b.close();
  });
});
