import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import {
  MAX_USAGE_BATCH_RECORDS,
  type UsageAnswer,
  type UsageBatch,
  UsageLedger,
} from "@llmgw/router";
import { afterEach, describe, expect, it, vi } from "vitest";
import { startUsageReporter, type UsageReporter } from "./usage-reporter.js";

const answer: UsageAnswer = { duplicate: false, standings: [], asOfMs: 1 };
const used = {
  promptTokens: 10,
  cachedTokens: 0,
  completionTokens: 5,
  gpuMs: 0,
  estimated: false,
  refused: false,
};
const record = {
  minuteMs: 60_000,
  keyId: "k",
  tenant: "t",
  model: "m",
  requests: 1,
  promptTokens: 10,
  cachedTokens: 0,
  cachedReported: 1,
  completionTokens: 5,
  gpuMs: 0,
  estimatedRequests: 0,
  refusedUsage: 0,
};

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function tempDir(): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), "llmgw-usage-"));
  cleanups.push(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

/** A send that records each batch with records and answers or refuses as `ok` says. */
function recordingSend() {
  const batches: UsageBatch[] = [];
  let calls = 0;
  const state = { ok: true };
  const send = async (batch: UsageBatch): Promise<UsageAnswer> => {
    calls += 1;
    if (!state.ok) throw new Error("control plane unreachable");
    if (batch.records.length > 0) batches.push(batch);
    return answer;
  };
  return { send, batches, state, calls: () => calls };
}

/** Lets a finished tick clear (its last steps are promise callbacks); `sealNow` skips a busy one. */
const settled = () => new Promise<void>((resolve) => setImmediate(resolve));

async function start(options: Parameters<typeof startUsageReporter>[0]): Promise<UsageReporter> {
  const reporter = await startUsageReporter({ intervalMs: 3_600_000, ...options });
  cleanups.push(() => reporter.close(100));
  return reporter;
}

describe("usage reporter", () => {
  it("moves a corrupt batch file aside, says so, and sends the others", async () => {
    const dir = path.join(await tempDir(), "usage");
    await mkdir(dir);
    const file = (id: string, body: unknown) =>
      writeFile(
        path.join(dir, `${id}.json`),
        typeof body === "string" ? body : JSON.stringify(body),
      );
    await file("a-0", { batchId: "a-0", records: [record] });
    await file("a-1", "{ not json");
    await file("a-2", { batchId: "a-2", records: [{ ...record, requests: -1 }] });
    await file("a-3", { batchId: "someone-else", records: [record] });
    await file("a-4", { batchId: "a-4", records: [{ ...record, model: 7 }] });
    await file("a-5", { batchId: "a-5", records: [record] });
    await file("a-6", { batchId: "a-6", records: [{ ...record, cachedReported: -1 }] });
    // Written before records counted the requests whose cached tokens were reported.
    const { cachedReported: _, ...legacy } = record;
    await file("a-7", {
      batchId: "a-7",
      records: [{ ...legacy, requests: 3, estimatedRequests: 1 }],
    });
    await file("a-8", { batchId: "a-8", records: [{ ...legacy, estimatedRequests: 2 }] });
    await file("a-9", { batchId: "a-9", records: [{ ...record, cachedReported: 2 }] });
    const log: Record<string, unknown>[] = [];
    const sent = recordingSend();
    const reporter = await start({
      ledger: new UsageLedger(),
      send: sent.send,
      dir,
      log: (e) => log.push({ ...e }),
    });
    await vi.waitFor(() => expect(reporter.pending).toBe(0));
    expect(sent.batches.map((b) => b.batchId)).toEqual(["a-0", "a-5", "a-7"]);
    expect(sent.batches[0]?.records).toEqual([record]);
    expect(sent.batches[2]?.records).toEqual([
      { ...record, requests: 3, estimatedRequests: 1, cachedReported: 2 },
    ]);
    const corrupt = log.filter((e) => e.event === "usage_batch_unreadable");
    expect(corrupt.map((e) => [e.batchId, e.code])).toEqual([
      ["a-1", "LLMGW_ROUTER_STATE_CORRUPT"],
      ["a-2", "LLMGW_ROUTER_STATE_CORRUPT"],
      ["a-3", "LLMGW_ROUTER_STATE_CORRUPT"],
      ["a-4", "LLMGW_ROUTER_STATE_CORRUPT"],
      ["a-6", "LLMGW_ROUTER_STATE_CORRUPT"],
      ["a-8", "LLMGW_ROUTER_STATE_CORRUPT"],
      ["a-9", "LLMGW_ROUTER_STATE_CORRUPT"],
    ]);
    expect(String(corrupt[1]?.message)).toContain("record 0: requests is not a count");
    expect(String(corrupt[3]?.message)).toContain("record 0: model is not a string");
    expect(String(corrupt[4]?.message)).toContain("record 0: cachedReported is not a count");
    expect(String(corrupt[5]?.message)).toContain("record 0: more estimated or refused requests");
    expect(String(corrupt[6]?.message)).toContain("record 0: cachedReported does not fit");
    // Kept for a person to look at, never read again; the sent ones are gone.
    expect((await readdir(dir)).sort()).toEqual([
      "a-1.json.corrupt",
      "a-2.json.corrupt",
      "a-3.json.corrupt",
      "a-4.json.corrupt",
      "a-6.json.corrupt",
      "a-8.json.corrupt",
      "a-9.json.corrupt",
    ]);
  });

  it("without a state dir, drops the oldest batch past the bound and says so", async () => {
    const ledger = new UsageLedger();
    const sent = recordingSend();
    sent.state.ok = false;
    const log: Record<string, unknown>[] = [];
    const reporter = await start({
      ledger,
      send: sent.send,
      maxBatchesInMemory: 2,
      log: (e) => log.push({ ...e }),
    });
    await vi.waitFor(() => expect(sent.calls()).toBe(1)); // the first tick's ask
    await settled();
    for (let i = 1; i <= 3; i++) {
      ledger.add(60_000 * i, "k", "t", "m", used);
      reporter.sealNow();
      await vi.waitFor(() => expect(sent.calls()).toBe(1 + i));
      await settled();
    }
    expect([reporter.pending, reporter.dropped]).toEqual([2, 1]);
    const dropped = log.filter((e) => e.event === "usage_batch_dropped");
    expect(dropped).toHaveLength(1);
    expect(dropped[0]?.records).toBe(1);
    // The outage was logged once, not per try.
    expect(log.filter((e) => e.event === "usage_report_failed")).toHaveLength(1);
    sent.state.ok = true;
    reporter.sealNow();
    await vi.waitFor(() => expect(reporter.pending).toBe(0));
    // The two kept, oldest first: minutes 2 and 3.
    expect(sent.batches.map((b) => b.records[0]?.minuteMs)).toEqual([120_000, 180_000]);
    expect(sent.batches.map((b) => b.batchId)).not.toContain(dropped[0]?.batchId);
  });

  it("sends a batch it could not write from memory, and reports what it includes", async () => {
    const root = await tempDir();
    const ledger = new UsageLedger();
    const sent = recordingSend();
    const log: Record<string, unknown>[] = [];
    const standings: number[] = [];
    const reporter = await start({
      ledger,
      send: sent.send,
      dir: path.join(root, "usage"),
      log: (e) => log.push({ ...e }),
      onStandings: (_answer, includedUpToMs) => standings.push(includedUpToMs),
    });
    await vi.waitFor(() => expect(standings).toHaveLength(1));
    await settled();
    expect(standings[0]).toBe(0); // the ask: nothing acknowledged yet
    // The state dir turned into a regular file: every write fails.
    await writeFile(path.join(root, "usage"), "");
    const before = Date.now();
    ledger.add(Date.now(), "k", "t", "m", used);
    reporter.sealNow();
    await vi.waitFor(() => expect(sent.batches).toHaveLength(1));
    expect(log.some((e) => e.event === "usage_batch_not_saved")).toBe(true);
    expect(reporter.pending).toBe(0);
    await vi.waitFor(() => expect(standings).toHaveLength(2));
    expect(standings[1]).toBeGreaterThanOrEqual(before);
    // Sent and acknowledged: neither an outage nor a lost batch, and no file to remove.
    expect(log.some((e) => e.event === "usage_report_failed")).toBe(false);
    expect(log.some((e) => e.event === "usage_batch_not_removed")).toBe(false);
  });

  it("keeps a batch it could not write in memory, and drops it past the bound, counted", async () => {
    const root = await tempDir();
    const ledger = new UsageLedger();
    const sent = recordingSend();
    const log: Record<string, unknown>[] = [];
    const reporter = await start({
      ledger,
      send: sent.send,
      dir: path.join(root, "usage"),
      maxBatchesInMemory: 1,
      log: (e) => log.push({ ...e }),
    });
    await vi.waitFor(() => expect(sent.calls()).toBe(1));
    await settled();
    await writeFile(path.join(root, "usage"), ""); // every write fails from now on
    sent.state.ok = false;
    for (let i = 1; i <= 2; i++) {
      ledger.add(60_000 * i, "k", "t", "m", used);
      reporter.sealNow();
      await vi.waitFor(() => expect(sent.calls()).toBe(1 + i));
      await settled();
    }
    // The older one had no file to fall back on: dropped and said so, not taken for a
    // corrupt file.
    expect([reporter.pending, reporter.dropped]).toEqual([1, 1]);
    expect(log.filter((e) => e.event === "usage_batch_dropped")).toHaveLength(1);
    expect(log.some((e) => e.event === "usage_batch_unreadable")).toBe(false);
    sent.state.ok = true;
    reporter.sealNow();
    await vi.waitFor(() => expect(reporter.pending).toBe(0));
    expect(sent.batches.map((b) => b.records[0]?.minuteMs)).toEqual([120_000]);
  });

  it("sends a sealed ledger larger than one batch may be as several", async () => {
    const ledger = new UsageLedger({ maxEntries: 30_000 });
    const sent = recordingSend();
    const reporter = await start({
      ledger,
      // As the control plane does: more records than a batch may hold are refused.
      send: (batch) =>
        batch.records.length > MAX_USAGE_BATCH_RECORDS
          ? Promise.reject(new Error("too many records"))
          : sent.send(batch),
    });
    await vi.waitFor(() => expect(sent.calls()).toBe(1)); // the first tick's ask
    await settled();
    for (let i = 0; i <= 2 * MAX_USAGE_BATCH_RECORDS; i++)
      ledger.add(60_000, `k${i}`, "t", "m", used);
    reporter.sealNow();
    await vi.waitFor(() => expect(sent.batches).toHaveLength(3));
    expect(sent.batches.map((b) => b.records.length)).toEqual([
      MAX_USAGE_BATCH_RECORDS,
      MAX_USAGE_BATCH_RECORDS,
      1,
    ]);
    expect(new Set(sent.batches.map((b) => b.batchId)).size).toBe(3);
    expect(reporter.pending).toBe(0);
  });

  it("sets a batch the control plane refuses for good aside, and sends the ones behind it", async () => {
    const dir = path.join(await tempDir(), "usage");
    const ledger = new UsageLedger();
    const sent = recordingSend();
    const log: Record<string, unknown>[] = [];
    let refuseNext = true;
    const reporter = await start({
      ledger,
      send: (batch) => {
        if (batch.records.length > 0 && refuseNext) {
          refuseNext = false;
          return Promise.reject(Object.assign(new Error("a minute too old"), { forGood: true }));
        }
        return sent.send(batch);
      },
      refused: (error) => (error as { forGood?: boolean }).forGood === true,
      dir,
      log: (e) => log.push({ ...e }),
    });
    await vi.waitFor(() => expect(sent.calls()).toBe(1)); // the first tick's ask
    await settled();
    // Three requests in two records: what the batch took with it.
    ledger.add(60_000, "k", "t", "m", used);
    ledger.add(60_000, "k", "t", "m", used);
    ledger.add(60_000, "k2", "t", "m", used);
    reporter.sealNow();
    await vi.waitFor(() => expect(reporter.refusedBatches).toBe(1));
    expect(reporter.refusedRequests).toBe(3);
    await settled();
    ledger.add(120_000, "k", "t", "m", used);
    reporter.sealNow();
    await vi.waitFor(() => expect(sent.batches).toHaveLength(1));
    expect(sent.batches[0]?.records[0]?.minuteMs).toBe(120_000);
    const refused = log.filter((e) => e.event === "usage_batch_refused");
    expect(refused).toHaveLength(1);
    expect(refused[0]?.records).toBe(2);
    expect(String(refused[0]?.message)).toContain("a minute too old; set aside");
    // The batch behind it is sent: nothing more is counted as refused.
    expect([reporter.refusedBatches, reporter.refusedRequests]).toEqual([1, 3]);
    // Kept for a person to look at, never sent again.
    expect(await readdir(dir)).toEqual([`${refused[0]?.batchId}.json.refused`]);
  });
});
