import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isControlPlaneError } from "../errors.js";
import { postgresUnavailable, startTestPostgres, type TestPostgres } from "../testing/postgres.js";
import { openPostgresDatabase, type PostgresDatabase } from "./postgres-store.js";
import { openPostgresUsageStore } from "./postgres-usage-store.js";
import { openSqliteStore, type SqliteStore } from "./sqlite-store.js";
import {
  buildUsageDeltas,
  DEFAULT_USAGE_RETENTION,
  type UsageQuery,
  type UsageRecordData,
  type UsageStore,
} from "./usage-store.js";

const MIN = 60_000;
const HOUR = 3_600_000;
const DAY = 86_400_000;
/** 2026-12-03T00:00:00Z */
const D3 = Date.UTC(2026, 11, 3);
const TOKENS = ["join-aaaaaaaaaaaaaaaa", "admin-bbbbbbbbbbbbbb", "router-cccccccccccc"];

function record(over: Partial<UsageRecordData> = {}): UsageRecordData {
  return {
    minuteMs: D3 + 10 * HOUR,
    keyId: "k1",
    tenant: "search",
    model: "chat",
    requests: 2,
    promptTokens: 100,
    cachedTokens: 40,
    cachedReported: 1,
    completionTokens: 30,
    gpuMs: 1_500,
    estimatedRequests: 1,
    refusedUsage: 0,
    ...over,
  };
}

const ALL = { tenant: true, key: true, model: true };
const query = (over: Partial<UsageQuery> = {}): UsageQuery => ({
  bucket: "day",
  sinceMs: 0,
  untilMs: D3 + 30 * DAY,
  groupBy: ALL,
  limit: 1_000,
  ...over,
});

/** A store and how to get it back as a restarted control plane would. */
interface Engine {
  readonly usage: UsageStore;
  reopen(): Promise<Engine>;
  close(): Promise<void>;
}

const pgSkip = postgresUnavailable();
let server: TestPostgres | undefined;
beforeAll(async () => {
  if (!pgSkip) server = await startTestPostgres();
}, 60_000);
afterAll(() => server?.destroy());

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

function sqliteEngine(): Engine {
  const dir = mkdtempSync(join(tmpdir(), "llmgw-usage-"));
  const file = join(dir, "state.db");
  const open = (): Engine => {
    const store: SqliteStore = openSqliteStore({ file });
    return {
      usage: store.usage,
      reopen: async () => {
        store.close();
        return open();
      },
      close: async () => {
        store.close();
        rmSync(dir, { recursive: true, force: true });
      },
    };
  };
  return open();
}

async function postgresEngine(): Promise<Engine> {
  const url = await (server as TestPostgres).createDatabase();
  const database = await openPostgresDatabase({ url, tokens: TOKENS });
  const open = async (): Promise<Engine> => {
    const epoch = await takeLease(database, "a");
    const usage = openPostgresUsageStore({ database, writer: { holder: "a", epoch } });
    return {
      usage,
      reopen: async () => {
        await usage.close();
        return open();
      },
      close: () => usage.close(),
    };
  };
  return open();
}

const engines: [string, () => Promise<Engine>, string | undefined][] = [
  ["SQLite", async () => sqliteEngine(), undefined],
  ["PostgreSQL", postgresEngine, pgSkip],
];

describe("buildUsageDeltas", () => {
  it("sums a batch into one delta per row touched, in minute, hour and UTC day buckets", () => {
    const deltas = buildUsageDeltas([
      record({ minuteMs: D3 - MIN }),
      record({ minuteMs: D3 - MIN, requests: 1 }),
      record({ minuteMs: D3 }),
    ]);
    const starts = (bucket: string) =>
      deltas.filter((d) => d.bucket === bucket).map((d) => [d.startMs, d.requests]);
    expect(starts("minute")).toEqual([
      [D3 - MIN, 3],
      [D3, 2],
    ]);
    expect(starts("hour")).toEqual([
      [D3 - HOUR, 3],
      [D3, 2],
    ]);
    expect(starts("day")).toEqual([
      [D3 - DAY, 3],
      [D3, 2],
    ]);
  });
});

/** Stands in for `it` where a test does not apply to an engine: declares nothing. */
const NOT_DECLARED = (_name: string, _fn: () => Promise<void>): void => {};

describe.each(engines)("usage store on %s", (name, open, skip) => {
  it.skipIf(skip)("counts a batch stored twice once, across a restart too", async () => {
    let engine = await open();
    try {
      const batch = { routerId: "r1", batchId: "r1-1", records: [record()] };
      expect(await engine.usage.storeBatch(batch, D3 + 11 * HOUR)).toEqual({ duplicate: false });
      expect(await engine.usage.storeBatch(batch, D3 + 11 * HOUR)).toEqual({ duplicate: true });
      engine = await engine.reopen();
      // Same id, other records: still the batch already counted.
      expect(
        await engine.usage.storeBatch(
          { ...batch, records: [record({ requests: 99 })] },
          D3 + 12 * HOUR,
        ),
      ).toEqual({ duplicate: true });
      // Another router may use the same batch id.
      expect(await engine.usage.storeBatch({ ...batch, routerId: "r2" }, D3 + 12 * HOUR)).toEqual({
        duplicate: false,
      });
      expect(await engine.usage.query(query())).toEqual([
        {
          startMs: D3,
          tenant: "search",
          keyId: "k1",
          model: "chat",
          requests: 4,
          promptTokens: 200,
          cachedTokens: 80,
          cachedReported: 2,
          completionTokens: 60,
          gpuMs: 3_000,
          estimatedRequests: 2,
          refusedUsage: 0,
        },
      ]);
    } finally {
      await engine.close();
    }
  });

  it.skipIf(skip)(
    "puts a batch spanning an hour and a day boundary in the right buckets",
    async () => {
      const engine = await open();
      try {
        await engine.usage.storeBatch(
          {
            routerId: "r1",
            batchId: "b",
            records: [
              record({ minuteMs: D3 - MIN, requests: 1 }),
              record({ minuteMs: D3, requests: 2 }),
              record({ minuteMs: D3 + HOUR - MIN, requests: 4 }),
              record({ minuteMs: D3 + HOUR, requests: 8 }),
            ],
          },
          D3 + 2 * HOUR,
        );
        const requests = async (bucket: UsageQuery["bucket"]) =>
          (await engine.usage.query(query({ bucket }))).map((r) => [r.startMs, r.requests]);
        expect(await requests("minute")).toEqual([
          [D3 - MIN, 1],
          [D3, 2],
          [D3 + HOUR - MIN, 4],
          [D3 + HOUR, 8],
        ]);
        expect(await requests("hour")).toEqual([
          [D3 - HOUR, 1],
          [D3, 6],
          [D3 + HOUR, 8],
        ]);
        expect(await requests("day")).toEqual([
          [D3 - DAY, 1],
          [D3, 14],
        ]);
        expect(await engine.usage.dayTokens(D3)).toEqual([
          { dayMs: D3, tenant: "search", keyId: "k1", model: "chat", tokens: 3 * 130 },
        ]);
      } finally {
        await engine.close();
      }
    },
  );

  it.skipIf(skip)("answers filters and groupings as sums over the rollup asked for", async () => {
    const engine = await open();
    try {
      await engine.usage.storeBatch(
        {
          routerId: "r1",
          batchId: "b",
          records: [
            record({ keyId: "k1", tenant: "search", model: "chat", requests: 1 }),
            record({ keyId: "k1", tenant: "search", model: "code", requests: 2 }),
            record({ keyId: "k2", tenant: "search", model: "chat", requests: 4 }),
            record({ keyId: "k3", tenant: "", model: "chat", requests: 8 }),
            record({ keyId: "k3", tenant: "", model: "chat", requests: 16, minuteMs: D3 + DAY }),
          ],
        },
        D3 + 2 * DAY,
      );
      const shape = (rows: Awaited<ReturnType<UsageStore["query"]>>) =>
        rows.map((r) => [r.startMs === D3 ? "d3" : "d4", r.tenant, r.keyId, r.model, r.requests]);
      expect(
        shape(
          await engine.usage.query(query({ groupBy: { tenant: true, key: false, model: true } })),
        ),
      ).toEqual([
        ["d3", "", "", "chat", 8],
        ["d3", "search", "", "chat", 5],
        ["d3", "search", "", "code", 2],
        ["d4", "", "", "chat", 16],
      ]);
      expect(
        shape(
          await engine.usage.query(
            query({ tenant: "search", groupBy: { tenant: false, key: true, model: false } }),
          ),
        ),
      ).toEqual([
        ["d3", "", "k1", "", 3],
        ["d3", "", "k2", "", 4],
      ]);
      expect(
        shape(
          await engine.usage.query(
            query({ keyIds: ["k1", "k3"], model: "chat", sinceMs: D3 + DAY, groupBy: ALL }),
          ),
        ),
      ).toEqual([["d4", "", "k3", "chat", 16]]);
      expect(await engine.usage.query(query({ keyIds: [] }))).toEqual([]);
      expect(
        await engine.usage.query(query({ groupBy: { tenant: false, key: false, model: false } })),
      ).toHaveLength(2);
      expect(await engine.usage.query(query({ limit: 1 }))).toHaveLength(1);
    } finally {
      await engine.close();
    }
  });

  it.skipIf(skip)(
    "prunes minute rows after 48 h, hour rows after 90 days, batch ids after 8 days",
    async () => {
      const engine = await open();
      try {
        await engine.usage.storeBatch({ routerId: "r", batchId: "old", records: [record()] }, D3);
        const count = async (bucket: UsageQuery["bucket"]) =>
          (await engine.usage.query(query({ bucket, untilMs: D3 + 400 * DAY }))).length;
        const prune = (at: number) => engine.usage.prune(at, DEFAULT_USAGE_RETENTION);
        expect(await prune(D3 + 10 * HOUR + 48 * HOUR)).toEqual({
          minuteRows: 0,
          hourRows: 0,
          batchIds: 0,
        });
        expect(await prune(D3 + 10 * HOUR + 48 * HOUR + 1)).toEqual({
          minuteRows: 1,
          hourRows: 0,
          batchIds: 0,
        });
        expect(await prune(D3 + 8 * DAY + 1)).toEqual({ minuteRows: 0, hourRows: 0, batchIds: 1 });
        // Its id gone, the batch would count again: that is why records older than 7 days are refused.
        expect(
          await engine.usage.storeBatch(
            { routerId: "r", batchId: "old", records: [] },
            D3 + 8 * DAY + 1,
          ),
        ).toEqual({ duplicate: false });
        expect(await prune(D3 + 10 * HOUR + 90 * DAY + 1)).toMatchObject({ hourRows: 1 });
        expect([await count("minute"), await count("hour"), await count("day")]).toEqual([0, 0, 1]);
      } finally {
        await engine.close();
      }
    },
  );

  it.skipIf(skip)("exports and imports every row and batch id", async () => {
    const from = await open();
    const to = await open();
    try {
      await from.usage.storeBatch(
        { routerId: "r", batchId: "b1", records: [record(), record({ keyId: "k2" })] },
        D3 + 11 * HOUR,
      );
      const data = await from.usage.exportAll();
      expect(data.rollups).toHaveLength(6);
      expect(data.batches).toEqual([{ routerId: "r", batchId: "b1", storedAtMs: D3 + 11 * HOUR }]);
      await to.usage.importAll(data);
      expect(await to.usage.exportAll()).toEqual(data);
      expect(
        await to.usage.storeBatch({ routerId: "r", batchId: "b1", records: [] }, D3 + 12 * HOUR),
      ).toEqual({ duplicate: true });
    } finally {
      await from.close();
      await to.close();
    }
  });

  // PostgreSQL only (fencing, outages): not declared at all for SQLite, so nothing reads as skipped.
  (name === "PostgreSQL" ? it.skipIf(skip) : NOT_DECLARED)(
    "stores nothing once another instance took the lease (fenced)",
    async () => {
      const url = await (server as TestPostgres).createDatabase();
      const database = await openPostgresDatabase({ url, tokens: TOKENS });
      const epoch = await takeLease(database, "a");
      const fenced: string[] = [];
      const usage = openPostgresUsageStore({
        database,
        writer: { holder: "a", epoch },
        onFenced: (e) => fenced.push(e.code),
      });
      try {
        await takeLease(database, "b");
        const error = await usage
          .storeBatch({ routerId: "r", batchId: "b", records: [record()] }, D3 + 11 * HOUR)
          .catch((e: unknown) => e);
        expect(isControlPlaneError(error) && error.code).toBe("LLMGW_CONTROL_PLANE_NOT_LEADER");
        expect(fenced).toEqual(["LLMGW_CONTROL_PLANE_NOT_LEADER"]);
        expect(await usage.exportAll()).toEqual({ rollups: [], batches: [] });
      } finally {
        await usage.close();
      }
    },
  );

  // PostgreSQL only (fencing, outages): not declared at all for SQLite, so nothing reads as skipped.
  (name === "PostgreSQL" ? it.skipIf(skip) : NOT_DECLARED)(
    "answers STORE_UNAVAILABLE while the database is down, and stores once it is back",
    async () => {
      const engine = await open();
      const pg = server as TestPostgres;
      try {
        await engine.usage.query(query());
        pg.stop();
        const batch = { routerId: "r", batchId: "b", records: [record()] };
        const error = await engine.usage.storeBatch(batch, D3 + 11 * HOUR).catch((e: unknown) => e);
        expect(isControlPlaneError(error) && error.code).toBe(
          "LLMGW_CONTROL_PLANE_STORE_UNAVAILABLE",
        );
        pg.start();
        expect(await engine.usage.storeBatch(batch, D3 + 11 * HOUR)).toEqual({ duplicate: false });
      } finally {
        await engine.close();
      }
    },
    30_000,
  );
});
