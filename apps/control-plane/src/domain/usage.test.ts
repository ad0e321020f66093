import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { ControlPlaneError, isControlPlaneError } from "../errors.js";
import { openSqliteStore, type SqliteStore } from "../store/sqlite-store.js";
import type { UsageRecordData, UsageRollupRow } from "../store/usage-store.js";
import { createManualClock, type ManualClock } from "../testing/manual-clock.js";
import { type BudgetSpec, ClusterUsage, type ClusterUsageOptions } from "./usage.js";

const MIN = 60_000;
const HOUR = 3_600_000;
const DAY = 86_400_000;
/** 2026-12-03T00:00:00Z */
const D3 = Date.UTC(2026, 11, 3);
const DEC = Date.UTC(2026, 11, 1);

function record(over: Partial<UsageRecordData> = {}): UsageRecordData {
  return {
    minuteMs: D3 + 10 * HOUR,
    keyId: "k1",
    tenant: "search",
    model: "chat",
    requests: 1,
    promptTokens: 100,
    cachedTokens: 0,
    cachedReported: 1,
    completionTokens: 10,
    gpuMs: 0,
    estimatedRequests: 0,
    refusedUsage: 0,
    ...over,
  };
}

const BUDGETS: BudgetSpec[] = [
  { tenant: "search", period: "day", model: "", tokens: 1_000 },
  { tenant: "search", period: "month", model: "chat", tokens: 10_000 },
  { keyId: "k1", period: "day", model: "code", tokens: 500 },
  { keyId: "k2", period: "month", model: "", tokens: 500 },
];

let dir: string;
let store: SqliteStore;
let clock: ManualClock;
let stored: (readonly UsageRecordData[])[];

const open = (over: Partial<ClusterUsageOptions> = {}) =>
  new ClusterUsage({
    store: store.usage,
    clock,
    budgets: () => BUDGETS,
    onStored: (records) => stored.push(records),
    ...over,
  });
/** Usage of tenant "search" (created December 1) whose creation time a test changes. */
function recreatable() {
  const created = new Map([["search", DEC]]);
  const tenantCreatedAt = (name: string) => created.get(name);
  return { created, tenantCreatedAt, usage: open({ tenantCreatedAt }) };
}
/** Reports one record of `keyId` (and tenant "search") at each of `minutes`. */
const reportAt = (usage: ClusterUsage, batchId: string, keyId: string, ...minutes: number[]) =>
  usage.report({
    routerId: "r",
    batchId,
    records: minutes.map((minuteMs) => record({ keyId, minuteMs })),
  });
/** The used tokens of each budget's standing, in `BUDGETS` order. */
const used = (usage: ClusterUsage) => usage.standings().map((s) => s.usedTokens);

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "llmgw-usage-domain-"));
  store = openSqliteStore({ file: join(dir, "state.db") });
  clock = createManualClock(D3 + 11 * HOUR);
  stored = [];
});
afterEach(() => {
  store.close();
  rmSync(dir, { recursive: true, force: true });
});

describe("ClusterUsage", () => {
  it("answers an empty batch (a router asking for standings) without keeping its id", async () => {
    const usage = open();
    const ask = { routerId: "r", batchId: "ask", records: [] };
    expect((await usage.report(ask)).duplicate).toBe(false);
    expect((await usage.report(ask)).duplicate).toBe(false);
    expect((await store.usage.exportAll()).batches).toEqual([]);
    expect(stored).toEqual([]);
    await usage.close();
  });

  it("answers every budget's standing in its current UTC day or month, a duplicate adding nothing", async () => {
    const usage = open();
    await usage.load();
    const batch = {
      routerId: "r1",
      batchId: "1",
      records: [
        record(),
        record({ model: "code", promptTokens: 50, completionTokens: 5 }),
        record({ keyId: "k2", minuteMs: D3 - DAY }),
        record({ keyId: "k3", tenant: "" }),
      ],
    };
    const first = await usage.report(batch);
    expect(first.duplicate).toBe(false);
    expect(first.asOfMs).toBe(D3 + 11 * HOUR);
    expect(first.standings).toEqual([
      { tenant: "search", period: "day", model: "", periodStartMs: D3, usedTokens: 165 },
      { tenant: "search", period: "month", model: "chat", periodStartMs: DEC, usedTokens: 220 },
      { keyId: "k1", period: "day", model: "code", periodStartMs: D3, usedTokens: 55 },
      { keyId: "k2", period: "month", model: "", periodStartMs: DEC, usedTokens: 110 },
    ]);
    const again = await usage.report(batch);
    expect(again.duplicate).toBe(true);
    expect(again.standings).toEqual(first.standings);
    expect(stored).toHaveLength(1);
  });

  it("reads the same standings back after a restart, and counts a batch resent then once", async () => {
    const batch = { routerId: "r1", batchId: "1", records: [record(), record({ keyId: "k2" })] };
    await open().report(batch);
    store.close();
    store = openSqliteStore({ file: join(dir, "state.db") });
    const restarted = open();
    await restarted.load();
    expect(used(restarted)).toEqual([220, 220, 0, 110]);
    expect((await restarted.report(batch)).duplicate).toBe(true);
    expect(used(restarted)).toEqual([220, 220, 0, 110]);
  });

  it("reads the totals again after a store failure: a batch stored whose answer was lost counts", async () => {
    let loseAnswers = true;
    const usage = open({
      store: {
        ...store.usage,
        storeBatch: async (batch, nowMs) => {
          const stored = await store.usage.storeBatch(batch, nowMs);
          if (!loseAnswers) return stored;
          throw new ControlPlaneError("LLMGW_CONTROL_PLANE_STORE_UNAVAILABLE", "answer lost");
        },
      },
    });
    const batch = { routerId: "r1", batchId: "1", records: [record()] };
    await expect(usage.report(batch)).rejects.toThrow("answer lost");
    loseAnswers = false;
    const resent = await usage.report(batch);
    expect(resent.duplicate).toBe(true);
    expect(resent.standings[0]?.usedTokens).toBe(110);
  });

  it("starts a tenant created again under a deleted one's name from the hour it was created", async () => {
    const { created, tenantCreatedAt, usage } = recreatable();
    // The first tenant "search": yesterday and this morning, 110 tokens each.
    await reportAt(usage, "1", "k1", D3 - DAY + 10 * HOUR, D3 + 10 * HOUR);
    expect(used(usage)).toEqual([110, 220, 0, 0]);
    // Deleted, and created again at 12:30; its key k9 sends at 12:10 (the creation hour, which
    // counts: records say the minute, rollups the hour) and at 13:00.
    created.set("search", D3 + 12 * HOUR + 30 * MIN);
    clock.set(D3 + 13 * HOUR + 30 * MIN);
    await reportAt(usage, "2", "k9", D3 + 12 * HOUR + 10 * MIN, D3 + 13 * HOUR);
    expect(used(usage)).toEqual([220, 220, 0, 0]);
    // The same after a restart, from the rollups: the creation day by the hour.
    const restarted = open({ tenantCreatedAt });
    await restarted.load();
    expect(used(restarted)).toEqual([220, 220, 0, 0]);
    // Keys are ids, never reused: k1's usage of the old tenant is still k1's.
    const k1 = open({
      tenantCreatedAt,
      budgets: () => [{ keyId: "k1", period: "month", model: "", tokens: 1 }],
    });
    await k1.load();
    expect(used(k1)).toEqual([220]);
    // Without creation times, a tenant is its name.
    const byName = open();
    await byName.load();
    expect(used(byName)).toEqual([330, 440, 0, 0]);
  });

  it("counts a tenant created again on an earlier day of the month from then on, restarted or not", async () => {
    const { created, tenantCreatedAt, usage } = recreatable();
    // The old tenant: December 1 and 2, 10:00.
    await reportAt(usage, "1", "k1", DEC + 10 * HOUR, D3 - DAY + 10 * HOUR);
    // Created again December 2 at 12:30: 13:00 that day and 10:00 today.
    created.set("search", D3 - DAY + 12 * HOUR + 30 * MIN);
    await reportAt(usage, "2", "k9", D3 - DAY + 13 * HOUR, D3 + 10 * HOUR);
    expect(used(usage)).toEqual([110, 220, 0, 0]);
    let reads = 0;
    const counting = {
      ...store.usage,
      dayTokens: (since: number) => {
        reads += 1;
        return store.usage.dayTokens(since);
      },
    };
    const restarted = open({ tenantCreatedAt, store: counting });
    await restarted.load();
    expect(used(restarted)).toEqual([110, 220, 0, 0]);
    // Created once more, with the totals read by the hour at the last start.
    created.set("search", D3 + 10 * HOUR + 30 * MIN);
    await reportAt(restarted, "3", "k10", D3 + 10 * HOUR + 40 * MIN);
    // 10:00 is the creation hour: counted, as the rollups cannot tell it apart.
    expect(used(restarted)).toEqual([220, 220, 0, 0]);
    // Deleted: nothing is read again; its totals go on until a tenant of its name is created.
    created.delete("search");
    const readsBefore = reads;
    await restarted.report({ routerId: "r", batchId: "ask", records: [] });
    expect(reads).toBe(readsBefore);
  });

  it("loses no batch stored while another router's report reads the totals again", async () => {
    const created = new Map([["search", DEC]]);
    const wait = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
    const usage = open({
      tenantCreatedAt: (name) => created.get(name),
      store: {
        ...store.usage,
        // As PostgreSQL answers, later: a read that took its rows before a batch committed
        // answers after that batch was added to the totals.
        dayTokens: async (since) => {
          const rows = await store.usage.dayTokens(since);
          await wait(40);
          return rows;
        },
        storeBatch: async (batch, nowMs) => {
          await wait(20);
          return store.usage.storeBatch(batch, nowMs);
        },
      },
    });
    await usage.report({ routerId: "r", batchId: "0", records: [record()] });
    // Key k2's: its month budget is read from the day rows, not the creation day's hours.
    const storing = usage.report({
      routerId: "a",
      batchId: "1",
      records: [record({ keyId: "k2" })],
    });
    // Router b asks for its standings once "search" was created again, while a's is stored.
    await wait(5);
    created.set("search", D3 + 10 * HOUR + 30 * MIN);
    await Promise.all([storing, usage.report({ routerId: "b", batchId: "ask", records: [] })]);
    const fresh = open({ tenantCreatedAt: (name) => created.get(name) });
    await fresh.load();
    expect(used(fresh)).toEqual([220, 220, 0, 110]);
    expect(used(usage)).toEqual(used(fresh));
  });

  it("reads the totals again when a tenant is created again while its batch is stored", async () => {
    const created = new Map([["search", DEC]]);
    const tenantCreatedAt = (name: string) => created.get(name);
    let hold = false;
    let storing: (() => void) | undefined;
    const usage = open({
      tenantCreatedAt,
      store: {
        ...store.usage,
        storeBatch: async (batch, nowMs) => {
          const stored = await store.usage.storeBatch(batch, nowMs);
          if (hold)
            await new Promise<void>((resolve) => {
              storing = resolve;
            });
          return stored;
        },
      },
    });
    // The old tenant's usage is counted, by its creation time.
    await reportAt(usage, "0", "k1", D3 + 8 * HOUR);
    expect(used(usage)).toEqual([110, 110, 0, 0]);
    hold = true;
    const report = reportAt(usage, "1", "k1", D3 + 9 * HOUR);
    await vi.waitFor(() => expect(storing).toBeDefined());
    created.set("search", D3 + 10 * HOUR + 30 * MIN);
    storing?.();
    await report;
    // The 9:00 usage was the old tenant's: the new one starts at 0 (k1's own budget is for
    // another model).
    expect(used(usage)).toEqual([0, 0, 0, 0]);
    expect(stored).toHaveLength(2);
    const fresh = open({ tenantCreatedAt });
    await fresh.load();
    expect(used(fresh)).toEqual(used(usage));
  });

  it("refuses to load a creation day with more hour rows than it reads, instead of cutting them", async () => {
    const created = new Map([["search", DEC]]);
    await reportAt(open(), "1", "k1", D3 + 10 * HOUR);
    created.set("search", D3 + 9 * HOUR);
    let asked = 0;
    const usage = open({
      tenantCreatedAt: (name) => created.get(name),
      store: {
        ...store.usage,
        // A store holding more rows than the limit asked for: it answers limit + 1.
        query: async (q) => {
          asked = q.limit;
          const [row] = await store.usage.query(q);
          return Array.from({ length: q.limit }, () => row as UsageRollupRow);
        },
      },
    });
    const error = await usage.load().catch((e: unknown) => e);
    expect(isControlPlaneError(error) && error.code).toBe("LLMGW_CONTROL_PLANE_STORE_FAILED");
    expect((error as Error).message).toBe(
      `usage: tenant search's creation day has more than ${asked - 1} hour rows`,
    );
  });

  it("starts each UTC day and month from zero", async () => {
    const usage = open();
    await usage.report({
      routerId: "r",
      batchId: "1",
      records: [record(), record({ keyId: "k2" })],
    });
    clock.set(D3 + DAY);
    expect(used(usage)).toEqual([0, 220, 0, 110]);
    clock.set(Date.UTC(2027, 0, 1));
    expect(used(usage)).toEqual([0, 0, 0, 0]);
    // A late batch of the old month counts in its rollups, not in the new month's standings.
    await usage.report({
      routerId: "r",
      batchId: "2",
      records: [record({ minuteMs: Date.UTC(2026, 11, 31, 23, 59) })],
    });
    expect(used(usage)).toEqual([0, 0, 0, 0]);
    expect(stored).toHaveLength(2);
  });

  it("prunes old rows at most once per interval, never per batch", async () => {
    const lines: string[] = [];
    const usage = open({ pruneEveryMs: HOUR, log: (l) => lines.push(l) });
    await usage.report({ routerId: "r", batchId: "1", records: [record()] });
    clock.advance(HOUR - 1);
    usage.tick();
    expect(await usage.prune()).toEqual({ minuteRows: 0, hourRows: 0, batchIds: 0 });
    clock.advance(48 * HOUR);
    // An interval after the last prune, the next batch starts one (in the background).
    await usage.report({ routerId: "r", batchId: "2", records: [] });
    await usage.close();
    expect(lines).toEqual(["usage: pruned 1 minute rows, 0 hour rows and 0 batch ids"]);
    const minuteRows = await usage.query({
      bucket: "minute",
      sinceMs: 0,
      untilMs: D3 + 10 * DAY,
      groupBy: { tenant: true, key: true, model: true },
    });
    expect(minuteRows).toEqual([]);
  });

  it("refuses a query matching more rows than it answers, saying how to narrow", async () => {
    const usage = open({ maxRows: 1 });
    await usage.report({
      routerId: "r",
      batchId: "1",
      records: [record(), record({ minuteMs: D3 + 10 * HOUR + MIN })],
    });
    const q = {
      sinceMs: 0,
      untilMs: D3 + DAY,
      groupBy: { tenant: true, key: true, model: true },
    };
    expect(await usage.query({ ...q, bucket: "day" })).toHaveLength(1);
    const error = await usage.query({ ...q, bucket: "minute" }).catch((e: unknown) => e);
    expect(isControlPlaneError(error) && error.code).toBe("LLMGW_CONTROL_PLANE_INVALID_ARGUMENT");
    expect((error as Error).message).toBe(
      "more than 1 usage rows match; narrow the period (since/until), use a coarser granularity, filter by tenant, key or model, or group by fewer dimensions",
    );
  });
});
