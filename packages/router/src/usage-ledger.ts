/**
 * What each request used, summed in memory per minute, key and model until the router sends
 * it to the control plane as one batch (`RouterService.ReportUsage`): never a write per
 * request (a per-request row update is what stalls LiteLLM near 500 req/s, litellm#31866).
 * Memory is bounded by {@link UsageLedgerOptions.maxEntries}: a full ledger asks to be sealed
 * early rather than drop or merge anything.
 */
import { checkRange } from "./errors.js";

/** Usage summed over one UTC minute for one key and model, as this router saw it. */
export interface UsageEntry {
  /** Start of the UTC minute, epoch ms. */
  readonly minuteMs: number;
  readonly keyId: string;
  /** The key's tenant when the requests ran; "" for none. */
  readonly tenant: string;
  readonly model: string;
  requests: number;
  promptTokens: number;
  /** Cached prompt tokens of the {@link cachedReported} requests. */
  cachedTokens: number;
  /** Requests whose engine reported its cached tokens (0: {@link cachedTokens} unknown). */
  cachedReported: number;
  completionTokens: number;
  /** GPU-milliseconds, fractional until sealed. */
  gpuMs: number;
  /** Requests charged an estimate (cut short, or no usage reported). */
  estimatedRequests: number;
  /** Answers whose reported usage was refused. */
  refusedUsage: number;
}

/** One request's usage, as {@link UsageLedger.add} takes it. */
export interface RequestUsage {
  readonly promptTokens: number;
  /** Absent: the engine did not report its cached tokens (not 0). */
  readonly cachedTokens?: number;
  readonly completionTokens: number;
  readonly gpuMs: number;
  readonly estimated: boolean;
  readonly refused: boolean;
}

/** Options of {@link UsageLedger}. */
export interface UsageLedgerOptions {
  /** Most (minute, key, model) entries held before a seal (default 20 000). */
  readonly maxEntries?: number;
}

const MINUTE_MS = 60_000;

/**
 * Records one `ReportUsage` batch may carry (the control plane refuses more): a sealed ledger
 * larger than this is sent as several batches.
 */
export const MAX_USAGE_BATCH_RECORDS = 10_000;

/** Usage since the last {@link UsageLedger.seal}. */
export class UsageLedger {
  readonly maxEntries: number;
  #entries = new Map<string, UsageEntry>();

  constructor(options: UsageLedgerOptions = {}) {
    this.maxEntries = checkRange("maxEntries", options.maxEntries ?? 20_000, 1, 1_000_000);
  }

  /** Entries held now. */
  get size(): number {
    return this.#entries.size;
  }

  /** Whether the ledger holds as many entries as it may: seal it now. */
  get full(): boolean {
    return this.#entries.size >= this.maxEntries;
  }

  /**
   * Adds one request that ended at `atMs` (epoch ms). Always counted: a full ledger goes over
   * its bound by the entries added before the owner seals it (it checks {@link full} after
   * each add), never by dropping usage.
   */
  add(atMs: number, keyId: string, tenant: string, model: string, usage: RequestUsage): void {
    const minuteMs = atMs - (atMs % MINUTE_MS);
    const id = `${minuteMs}\u0000${keyId}\u0000${tenant}\u0000${model}`;
    let e = this.#entries.get(id);
    if (e === undefined) {
      e = {
        minuteMs,
        keyId,
        tenant,
        model,
        requests: 0,
        promptTokens: 0,
        cachedTokens: 0,
        cachedReported: 0,
        completionTokens: 0,
        gpuMs: 0,
        estimatedRequests: 0,
        refusedUsage: 0,
      };
      this.#entries.set(id, e);
    }
    e.requests += 1;
    e.promptTokens += usage.promptTokens;
    if (usage.cachedTokens !== undefined) {
      e.cachedTokens += usage.cachedTokens;
      e.cachedReported += 1;
    }
    e.completionTokens += usage.completionTokens;
    e.gpuMs += usage.gpuMs;
    if (usage.estimated) e.estimatedRequests += 1;
    if (usage.refused) e.refusedUsage += 1;
  }

  /** Everything added since the last seal (GPU-ms rounded to whole ms), and starts over. */
  seal(): UsageEntry[] {
    const out = [...this.#entries.values()];
    for (const e of out) e.gpuMs = Math.round(e.gpuMs);
    this.#entries = new Map();
    return out;
  }
}

interface ReplicaShare {
  /** GPU-ms one request holding the replica alone would have accumulated since it appeared. */
  total: number;
  /** When {@link total} was last brought up to date, ms (performance clock). */
  at: number;
  /** Requests of this router running on the replica. */
  running: number;
  /** Requests the engine last reported running (every router's), 0: unknown. */
  engine: number;
  gpus: number;
}

/**
 * Each request's share of its replica's GPUs over its duration: while `n` requests run on a
 * replica of `g` GPUs, each accrues `g / n` GPU-seconds per second. Kept as one running total
 * per replica (fair-share virtual time): a request's share is the total at its end less the
 * total at its start, O(1) per request whatever the concurrency. A replica's state is dropped
 * when nothing runs on it. Counts this router's requests only: where several routers send to
 * one replica, each request is charged as if its router's requests were all there was, an
 * overcharge that the engine's own count of running requests corrects where it reports one
 * (the larger of the two divides).
 */
export class GpuShares {
  #replicas = new Map<string, ReplicaShare>();

  /**
   * A request starts on `replicaId` (`gpus` GPUs) at `now` ms, while its engine last reported
   * `engineRunning` requests running (undefined: unknown); returns the request's start mark.
   */
  start(replicaId: string, gpus: number, now: number, engineRunning?: number): number {
    let r = this.#replicas.get(replicaId);
    if (r === undefined) {
      r = { total: 0, at: now, running: 0, engine: 0, gpus };
      this.#replicas.set(replicaId, r);
    } else this.#advance(r, now);
    r.gpus = gpus;
    r.engine = engineRunning ?? 0;
    r.running += 1;
    return r.total;
  }

  /** The request that started at `mark` on `replicaId` ends at `now`: its GPU-ms. */
  end(replicaId: string, mark: number, now: number): number {
    const r = this.#replicas.get(replicaId);
    if (r === undefined) return 0;
    this.#advance(r, now);
    r.running -= 1;
    const share = r.total - mark;
    if (r.running <= 0) this.#replicas.delete(replicaId);
    return Math.max(share, 0);
  }

  /** Replicas with requests running (bounded by the replicas routed to). */
  get size(): number {
    return this.#replicas.size;
  }

  #advance(r: ReplicaShare, now: number): void {
    const elapsed = now - r.at;
    if (elapsed > 0 && r.running > 0) {
      r.total += (elapsed * r.gpus) / Math.max(r.running, r.engine);
    }
    r.at = now;
  }
}

/** A sealed ledger on its way to the control plane (`RouterService.ReportUsage`). */
export interface UsageBatch {
  /** Unique per batch; the same id is sent again until acknowledged, and counts once. */
  readonly batchId: string;
  readonly records: readonly UsageEntry[];
}

/** What one budget of a tenant or key has used in its current period, cluster-wide. */
export interface BudgetStanding {
  /** Set for a tenant's budget. */
  readonly tenant?: string;
  /** Set for a key's budget. */
  readonly keyId?: string;
  readonly period: "day" | "month";
  /** "" for every model together. */
  readonly model: string;
  /** Start of the UTC day or month, epoch ms. */
  readonly periodStartMs: number;
  readonly usedTokens: number;
}

/** The control plane's answer to a {@link UsageBatch}. */
export interface UsageAnswer {
  /** The batch id was stored before: nothing was counted again. */
  readonly duplicate: boolean;
  readonly standings: readonly BudgetStanding[];
  /** When the standings were read, epoch ms. */
  readonly asOfMs: number;
}
