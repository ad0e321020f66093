/**
 * Sends what the router's requests used to the control plane, in batches: every
 * `intervalMs` (and at once when the ledger fills) the ledger is sealed into a batch with a
 * fresh id, written to the state dir, and sent with `ReportUsage`; the file goes once the
 * control plane acknowledged it. A batch is sent until acknowledged, in order, across control
 * plane outages and this router's restarts (the files are read back at start), and the
 * control plane counts each id once: no loss, no double count. What a `kill -9` takes is what
 * was not sealed yet (at most one interval); a graceful stop seals and sends first.
 *
 * Each answer carries every budget's cluster-wide standing, handed to `onStandings` (the
 * limiter). While nothing is pending the reporter still asks every `intervalMs` with an empty
 * batch, so budgets stay current on a router that serves nothing of them.
 *
 * Memory is bounded: at most `maxBatchesInMemory` batches keep their records in memory; older
 * ones are read back from their files when their turn comes. A batch with no file (no state
 * dir, or its file could not be written) is dropped past that bound, logged and counted.
 *
 * A sealed ledger larger than {@link MAX_USAGE_BATCH_RECORDS} goes as several batches. A batch
 * the control plane refuses for good (`refused`: an invalid argument, say records older than it
 * keeps batch ids for) is logged, counted with the requests in it (the router's
 * `llmgw_router_usage_batches_refused_total` and `…_requests_refused_total`) and set aside
 * (`<id>.json.refused`), so the batches behind it are still sent.
 */
import { randomBytes } from "node:crypto";
import { mkdir, readdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import {
  MAX_USAGE_BATCH_RECORDS,
  type UsageAnswer,
  type UsageBatch,
  type UsageEntry,
  type UsageLedger,
} from "@llmgw/router";

/** Inputs of {@link startUsageReporter}. */
export interface UsageReporterOptions {
  readonly ledger: UsageLedger;
  /** Sends one batch (see `RoutingRuntime.reportUsage`); rejects when none takes it now. */
  readonly send: (batch: UsageBatch) => Promise<UsageAnswer>;
  /**
   * Whether `send`'s error refuses the batch for good (sending it again would be refused
   * again); anything else is an outage, and the batch is sent again. Default: none is.
   */
  readonly refused?: (error: unknown) => boolean;
  /**
   * Each answer's standings (the limiter's `applyStandings`), with when the newest batch the
   * control plane has acknowledged was sealed (this process's `Date.now`; 0 before any): the
   * standings hold every token settled before it, and none settled after.
   */
  readonly onStandings?: (answer: UsageAnswer, includedUpToMs: number) => void;
  /** Where unacknowledged batches are kept (`<state dir>/usage`); undefined: memory only. */
  readonly dir?: string;
  /** Default 5 000 ms. */
  readonly intervalMs?: number;
  /** Default 1 000. */
  readonly maxBatchesInMemory?: number;
  readonly log?: (event: Readonly<Record<string, unknown>>) => void;
}

/** A running reporter. */
export interface UsageReporter {
  /** Seals the ledger now and starts sending (the ledger filled up). */
  sealNow(): void;
  /** Batches not acknowledged yet. */
  readonly pending: number;
  /** Batches dropped (memory only, over the bound). */
  readonly dropped: number;
  /** Batches the control plane refused for good, set aside. */
  readonly refusedBatches: number;
  /** Requests in those batches: their usage is charged to no one. */
  readonly refusedRequests: number;
  /** Seals, sends what it can within `timeoutMs`, and stops; unsent batches stay in `dir`. */
  close(timeoutMs?: number): Promise<void>;
}

interface Pending {
  readonly batchId: string;
  /** When it was sealed (`Date.now`); 0 for one a previous run left. */
  readonly sealedAtMs: number;
  /** Undefined: only in its file (over the memory bound). */
  records: readonly UsageEntry[] | undefined;
  /** Whether its file was written (one a previous run left: yes). */
  readonly saved: boolean;
}

/** Largest batch file read back; a sealed batch is far smaller. */
const MAX_FILE_BYTES = 64 << 20;
const BATCH_ID = /^[A-Za-z0-9._-]{1,128}$/;

/** Starts reporting; reads back batches a previous run left in `dir` first. */
export async function startUsageReporter(options: UsageReporterOptions): Promise<UsageReporter> {
  const { ledger, send, dir } = options;
  const log = options.log ?? (() => {});
  const intervalMs = options.intervalMs ?? 5_000;
  const maxInMemory = options.maxBatchesInMemory ?? 1_000;
  // A fresh prefix per run: ids never repeat across restarts, whatever the clock does.
  const run = `${Date.now().toString(36)}-${randomBytes(4).toString("hex")}`;
  let seq = 0;
  const queue: Pending[] = [];
  let dropped = 0;
  let refusedBatches = 0;
  let refusedRequests = 0;
  let closed = false;
  let sending: Promise<void> | undefined;
  let lastAskedAt = 0;
  /** When the newest acknowledged batch was sealed. */
  let includedUpToMs = 0;
  let failures = 0;
  /** Set once `close` gave up waiting: nothing more is sent. */
  let closedForGood = false;

  if (dir !== undefined) {
    // Made with the first batch written: a router that never holds one leaves no dir.
    const names = await readdir(dir).catch((error: NodeJS.ErrnoException) => {
      if (error.code === "ENOENT") return [] as string[];
      throw error;
    });
    for (const name of names.sort()) {
      if (!name.endsWith(".json")) continue;
      const batchId = name.slice(0, -".json".length);
      if (!BATCH_ID.test(batchId)) continue;
      queue.push({ batchId, sealedAtMs: 0, records: undefined, saved: true });
    }
    if (queue.length > 0) {
      log({ event: "usage_batches_found", count: queue.length, dir });
    }
  }

  const fileOf = (batchId: string): string => path.join(dir as string, `${batchId}.json`);

  /** Writes `records` as `batchId`'s file; false when it could not be (logged). */
  const save = async (batchId: string, records: readonly UsageEntry[]): Promise<boolean> => {
    if (dir === undefined) return false;
    const file = fileOf(batchId);
    const tmp = `${file}.tmp`;
    try {
      await mkdir(dir, { recursive: true, mode: 0o700 });
      await writeFile(tmp, JSON.stringify({ batchId, records }), { mode: 0o600 });
      await rename(tmp, file);
      return true;
    } catch (error) {
      // Still sent from memory while it is kept there (below); a restart before it is
      // acknowledged would lose it.
      log({ event: "usage_batch_not_saved", batchId, message: (error as Error).message });
      return false;
    }
  };

  const seal = async (): Promise<void> => {
    if (ledger.size === 0) return;
    const sealedAtMs = Date.now();
    const sealed = ledger.seal();
    for (let at = 0; at < sealed.length; at += MAX_USAGE_BATCH_RECORDS) {
      const records =
        sealed.length <= MAX_USAGE_BATCH_RECORDS
          ? sealed
          : sealed.slice(at, at + MAX_USAGE_BATCH_RECORDS);
      const batchId = `${run}-${(seq++).toString(36)}`;
      queue.push({ batchId, sealedAtMs, records, saved: await save(batchId, records) });
    }
    // Past the bound, the oldest batches live in their files only (or, without one, go).
    let inMemory = 0;
    for (let i = queue.length - 1; i >= 0; i--) {
      const p = queue[i] as Pending;
      if (p.records === undefined) continue;
      if (++inMemory <= maxInMemory) continue;
      if (p.saved) p.records = undefined;
      else {
        queue.splice(i, 1);
        dropped += 1;
        log({ event: "usage_batch_dropped", batchId: p.batchId, records: p.records.length });
      }
    }
  };

  const recordsOf = async (p: Pending): Promise<readonly UsageEntry[] | undefined> => {
    if (p.records !== undefined) return p.records;
    try {
      const text = await readFile(fileOf(p.batchId));
      if (text.length > MAX_FILE_BYTES) throw new Error(`${text.length} bytes`);
      return parseBatchFile(text.toString("utf8"), p.batchId);
    } catch (error) {
      log({
        event: "usage_batch_unreadable",
        code: "LLMGW_ROUTER_STATE_CORRUPT",
        batchId: p.batchId,
        message: `${(error as Error).message}; moved aside, not sent`,
      });
      await rename(fileOf(p.batchId), `${fileOf(p.batchId)}.corrupt`).catch(() => {});
      return undefined;
    }
  };

  /** Sends every pending batch in order; stops at the first failure (the next tick retries). */
  const drain = async (): Promise<void> => {
    while (queue.length > 0 && !closedForGood) {
      const p = queue[0] as Pending;
      const records = await recordsOf(p);
      if (records === undefined) {
        queue.shift();
        continue;
      }
      let answer: UsageAnswer;
      try {
        answer = await send({ batchId: p.batchId, records });
      } catch (error) {
        if (options.refused?.(error) === true) {
          // Sent again it would be refused again, and hold up every batch behind it.
          refusedBatches += 1;
          for (const r of records) refusedRequests += r.requests;
          queue.shift();
          log({
            event: "usage_batch_refused",
            batchId: p.batchId,
            records: records.length,
            message: `${(error as Error).message}; set aside, not sent again`,
          });
          if (p.saved) {
            await rename(fileOf(p.batchId), `${fileOf(p.batchId)}.refused`).catch(() => {});
          }
          continue;
        }
        failures += 1;
        // Logged on the first failure of a run of them, then every 60th (about 5 min).
        if (failures === 1 || failures % 60 === 0) {
          log({
            event: "usage_report_failed",
            code: "LLMGW_ROUTER_CONTROL_PLANE_UNREACHABLE",
            pending: queue.length,
            message: `${(error as Error).message}; usage is kept and sent again`,
          });
        }
        return;
      }
      lastAskedAt = Date.now();
      failures = 0;
      queue.shift();
      includedUpToMs = Math.max(includedUpToMs, p.sealedAtMs);
      options.onStandings?.(answer, includedUpToMs);
      if (p.saved) {
        // Acknowledged: a file left behind would only be sent again and counted once.
        await rm(fileOf(p.batchId), { force: true }).catch((error: unknown) =>
          log({
            event: "usage_batch_not_removed",
            batchId: p.batchId,
            message: (error as Error).message,
          }),
        );
      }
    }
    // Nothing pending: ask anyway now and then, for the budgets' standings.
    if (queue.length === 0 && Date.now() - lastAskedAt >= intervalMs && !closedForGood) {
      try {
        const answer = await send({ batchId: `${run}-ask`, records: [] });
        lastAskedAt = Date.now();
        options.onStandings?.(answer, includedUpToMs);
      } catch {
        // Same outage as above; the next tick asks again.
      }
    }
  };

  const tick = (): void => {
    if (sending !== undefined || closed) return;
    sending = seal()
      .then(drain)
      .catch((error: unknown) => log({ event: "usage_reporter_error", message: String(error) }))
      .finally(() => {
        sending = undefined;
      });
  };
  const timer = setInterval(tick, intervalMs);
  timer.unref();
  tick();

  return {
    sealNow: tick,
    get pending() {
      return queue.length;
    },
    get dropped() {
      return dropped;
    },
    get refusedBatches() {
      return refusedBatches;
    },
    get refusedRequests() {
      return refusedRequests;
    },
    async close(timeoutMs = 2_000) {
      if (closed) return;
      closed = true;
      clearInterval(timer);
      await sending;
      const last = seal().then(drain);
      let timeout: NodeJS.Timeout | undefined;
      await Promise.race([
        last,
        new Promise<void>((resolve) => {
          timeout = setTimeout(resolve, timeoutMs);
        }),
      ]);
      clearTimeout(timeout);
      closedForGood = true;
      await last.catch(() => {});
    },
  };
}

/** A batch file written by {@link startUsageReporter}, checked field by field. */
function parseBatchFile(text: string, batchId: string): UsageEntry[] {
  const parsed = JSON.parse(text) as { batchId?: unknown; records?: unknown };
  if (parsed.batchId !== batchId || !Array.isArray(parsed.records)) {
    throw new Error("not a usage batch file");
  }
  const counts = [
    "minuteMs",
    "requests",
    "promptTokens",
    "cachedTokens",
    "completionTokens",
    "gpuMs",
    "estimatedRequests",
    "refusedUsage",
  ] as const;
  return parsed.records.map((r: unknown, i: number) => {
    const o = r as Record<string, unknown>;
    for (const k of counts) {
      const v = o?.[k];
      if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0) {
        throw new Error(`record ${i}: ${k} is not a count`);
      }
    }
    const requests = o.requests as number;
    const exact = requests - (o.estimatedRequests as number);
    if (exact < 0 || (o.refusedUsage as number) > requests)
      throw new Error(`record ${i}: more estimated or refused requests than requests`);
    // A file written before routers counted the requests whose engine reported cached
    // tokens: then every exact answer counted them (absent as 0), an estimate counted 0.
    o.cachedReported ??= exact;
    const reported = o.cachedReported;
    if (typeof reported !== "number" || !Number.isSafeInteger(reported) || reported < 0)
      throw new Error(`record ${i}: cachedReported is not a count`);
    if (reported > exact || (reported === 0 && (o.cachedTokens as number) > 0))
      throw new Error(`record ${i}: cachedReported does not fit its requests and cached tokens`);
    for (const k of ["keyId", "tenant", "model"] as const) {
      if (typeof o[k] !== "string" || (o[k] as string).length > 512) {
        throw new Error(`record ${i}: ${k} is not a string`);
      }
    }
    return o as unknown as UsageEntry;
  });
}
