import { ControlPlaneError } from "../errors.js";
import {
  addCounts,
  bucketStart,
  DEFAULT_USAGE_RETENTION,
  monthStart,
  type UsageBatch,
  type UsageCounts,
  type UsagePruneReport,
  type UsageQuery,
  type UsageRecordData,
  type UsageRetention,
  type UsageRollupRow,
  type UsageStore,
} from "../store/usage-store.js";

/** A UTC calendar period a token budget covers. */
export type BudgetPeriodName = "day" | "month";

/**
 * A token budget of a tenant or of a key (exactly one of the two is set): most prompt +
 * completion tokens per UTC day or month, of one model ("" for all models together).
 */
export interface BudgetSpec {
  readonly tenant?: string;
  readonly keyId?: string;
  readonly period: BudgetPeriodName;
  readonly model: string;
  readonly tokens: number;
}

/** What a budget's subject used in its current period, cluster-wide, as stored. */
export interface BudgetStandingData {
  readonly tenant?: string;
  readonly keyId?: string;
  readonly period: BudgetPeriodName;
  readonly model: string;
  /** Start of the current UTC day or month. */
  readonly periodStartMs: number;
  readonly usedTokens: number;
}

/** The answer to a stored (or already stored) batch. */
export interface UsageReport {
  /** The batch id was stored before: nothing was counted this time. */
  readonly duplicate: boolean;
  readonly standings: readonly BudgetStandingData[];
  readonly asOfMs: number;
}

/** Options of {@link ClusterUsage}. */
export interface ClusterUsageOptions {
  readonly store: UsageStore;
  readonly clock: { now(): number };
  /** Every budget of every tenant and key now (read on each answer). */
  readonly budgets: () => readonly BudgetSpec[];
  /**
   * When the tenant of this name now was created, epoch ms (undefined: none now). A tenant
   * created again under a deleted one's name starts its budgets from the hour it was created:
   * usage of earlier hours is the old tenant's. Absent: tenants are their names.
   */
  readonly tenantCreatedAt?: (tenant: string) => number | undefined;
  /** Told the records of each batch stored (once per batch id, never for a duplicate). */
  readonly onStored?: (records: readonly UsageRecordData[]) => void;
  /** Default {@link DEFAULT_USAGE_RETENTION}. */
  readonly retention?: UsageRetention;
  /** How often old rows are pruned, ms; default one hour. Never per batch. */
  readonly pruneEveryMs?: number;
  /** Most rows one {@link ClusterUsage.query} answers; default {@link MAX_USAGE_ROWS}. */
  readonly maxRows?: number;
  readonly log?: (line: string) => void;
}

/** Most rows one {@link ClusterUsage.query} answers. */
export const MAX_USAGE_ROWS = 100_000;

const HOUR_MS = 3_600_000;
const DAY_MS = 24 * HOUR_MS;
/** Models one tenant's creation day is read for, per hour (more are a store gone wrong). */
const MAX_MODELS_PER_TENANT_DAY = 10_000;

const ALL_MODELS = "";

/**
 * The control plane's usage: stores the routers' batches (each once, by id), answers what
 * every budget used in its current period, and reads rollups back for `GetUsage`.
 *
 * Standings cost O(budgets) per answer: tokens per period (today, this month) and subject
 * (tenant or key, one model or all) are kept in memory, loaded from the day rollups on first
 * use and added to by each batch this instance stores. Only the leader stores batches, and a
 * new leader loads again, so the totals are the cluster's. A tenant's totals count from the
 * hour it was created (usage records carry its name only): the rollups of its creation day
 * are read by the hour, and a tenant found created again since the totals were read has them
 * read again.
 */
export class ClusterUsage {
  readonly #o: ClusterUsageOptions;
  readonly #retention: UsageRetention;
  readonly #pruneEveryMs: number;
  /** "day:<start>" | "month:<start>" → subject ("t|k", id, model or "") → tokens. */
  readonly #periods = new Map<string, Map<string, number>>();
  #loaded: Promise<void> | undefined;
  /** Whether {@link load} finished and nothing made the totals stale since. */
  #ready = false;
  /** The last report queued ({@link report}: one at a time), and how many are. */
  #reports: Promise<unknown> = Promise.resolve();
  #queued = 0;
  /** Creation time of each tenant whose usage the totals hold, as when it was counted. */
  readonly #counted = new Map<string, number | undefined>();
  #lastPruneMs: number;
  #pruning: Promise<UsagePruneReport> | undefined;

  constructor(options: ClusterUsageOptions) {
    this.#o = options;
    this.#retention = options.retention ?? DEFAULT_USAGE_RETENTION;
    this.#pruneEveryMs = options.pruneEveryMs ?? 3_600_000;
    // The first prune runs one interval after start: a restart loop does not prune each time.
    this.#lastPruneMs = options.clock.now();
  }

  /** Where usage lives, for messages. */
  get location(): string {
    return this.#o.store.location;
  }

  /**
   * Loads this month's day totals for standings (once; again after a failure). Every other
   * method waits for it; call it at start to have standings ready before the first batch.
   */
  load(): Promise<void> {
    this.#loaded ??= (async () => {
      const since = monthStart(this.#o.clock.now());
      const rows = await this.#o.store.dayTokens(since);
      // Each tenant's creation time as of this read, used throughout (a tenant created again
      // while the hours below are read is then found on the next report, and read again).
      const created = new Map<string, number | undefined>();
      for (const r of rows)
        if (r.tenant !== "" && !created.has(r.tenant))
          created.set(r.tenant, this.#createdAt(r.tenant));
      // Tenants created during a day whose rollup has usage: that day is read by the hour.
      const createdOn = new Map<string, number>();
      for (const r of rows) {
        const at = created.get(r.tenant);
        if (at !== undefined && bucketStart("day", at) === r.dayMs) createdOn.set(r.tenant, at);
      }
      const limit = 24 * MAX_MODELS_PER_TENANT_DAY;
      const hours = await Promise.all(
        [...createdOn].map(async ([tenant, at]) => {
          const rows = await this.#o.store.query({
            bucket: "hour",
            sinceMs: bucketStart("hour", at),
            untilMs: bucketStart("day", at) + DAY_MS,
            tenant,
            groupBy: { tenant: true, key: false, model: true },
            limit: limit + 1,
          });
          if (rows.length > limit)
            throw new ControlPlaneError(
              "LLMGW_CONTROL_PLANE_STORE_FAILED",
              `usage: tenant ${tenant}'s creation day has more than ${limit} hour rows`,
            );
          return rows;
        }),
      );
      this.#periods.clear();
      this.#counted.clear();
      for (const [tenant, at] of created) this.#counted.set(tenant, at);
      for (const r of rows) {
        // The creation day's row is replaced by its hours below; other days count as a whole
        // when they end after the creation hour.
        const at = created.get(r.tenant);
        const tenantCounts =
          r.tenant !== "" &&
          (at === undefined ||
            (bucketStart("day", at) !== r.dayMs && r.dayMs + DAY_MS > bucketStart("hour", at)));
        this.#add(r.dayMs, r.tenant, r.keyId, r.model, r.tokens, tenantCounts, true);
      }
      for (const r of hours.flat())
        this.#add(
          bucketStart("day", r.startMs),
          r.tenant,
          "",
          r.model,
          r.promptTokens + r.completionTokens,
          true,
          false,
        );
      this.#ready = true;
    })().catch((error: unknown) => {
      this.#stale();
      throw error;
    });
    return this.#loaded;
  }

  /**
   * Stores `batch` (validated: `validateReportUsageRequest`) unless its id was stored before,
   * then answers every budget's standing. Resolves once the batch is durable. Rejects as the
   * store does (`…_STORE_UNAVAILABLE`, `…_NOT_LEADER`, `…_STORE_FAILED`): the router sends
   * the batch again, and one stored after all (its answer lost) is then a duplicate.
   *
   * Batches are stored one at a time: a reload of the totals reads the store and then replaces
   * them, and a batch stored and added between the two would be lost from them. Each router
   * sends one batch at a time, so at most one waits per router. A router asking for its
   * standings (an empty batch) is answered at once when nothing needs reading again.
   */
  report(batch: UsageBatch): Promise<UsageReport> {
    if (batch.records.length === 0 && this.#queued === 0 && this.#ready && this.#current()) {
      this.tick();
      return Promise.resolve({
        duplicate: false,
        standings: this.standings(),
        asOfMs: this.#o.clock.now(),
      });
    }
    this.#queued += 1;
    const report = this.#reports.then(() => this.#report(batch));
    this.#reports = report
      .catch(() => {})
      .then(() => {
        this.#queued -= 1;
      });
    return report;
  }

  /** Whether no tenant counted in the totals was created again since. */
  #current(): boolean {
    for (const [tenant, created] of this.#counted) {
      const now = this.#createdAt(tenant);
      // One deleted and not created again has no budget: its totals can wait.
      if (now !== undefined && now !== created) return false;
    }
    return true;
  }

  async #report(batch: UsageBatch): Promise<UsageReport> {
    // A tenant deleted and created again since its usage was counted: the new one's totals
    // start over, from the rollups.
    if (this.#ready && !this.#current()) this.#stale();
    await this.load();
    // An empty batch is a router asking for the standings: nothing to store, no id to keep.
    if (batch.records.length === 0) {
      this.tick();
      return { duplicate: false, standings: this.standings(), asOfMs: this.#o.clock.now() };
    }
    const nowMs = this.#o.clock.now();
    let duplicate: boolean;
    try {
      ({ duplicate } = await this.#o.store.storeBatch(batch, nowMs));
    } catch (error) {
      // A commit whose answer was lost may have stored the batch (its resend is then a
      // duplicate, never added here): the totals are read from the store again first.
      this.#stale();
      throw error;
    }
    if (!duplicate && !this.#current()) {
      // Created again while the batch was stored: read again, the batch with the rest.
      this.#o.onStored?.(batch.records);
      this.#stale();
      await this.load();
    } else if (!duplicate) {
      for (const r of batch.records)
        this.#add(
          bucketStart("day", r.minuteMs),
          r.tenant,
          r.keyId,
          r.model,
          r.promptTokens + r.completionTokens,
          this.#counts(r.tenant, bucketStart("hour", r.minuteMs), HOUR_MS),
          true,
        );
      this.#o.onStored?.(batch.records);
    }
    this.tick();
    return { duplicate, standings: this.standings(), asOfMs: this.#o.clock.now() };
  }

  /**
   * What every budget used in its current UTC period, from the totals in memory (loaded:
   * call {@link load} first; before that every standing reads 0).
   */
  standings(): BudgetStandingData[] {
    const now = this.#o.clock.now();
    const day = bucketStart("day", now);
    const month = monthStart(now);
    // Periods before the current ones are never asked for again.
    for (const key of this.#periods.keys()) {
      const [kind, start] = key.split(":");
      if (Number(start) < (kind === "day" ? day : month)) this.#periods.delete(key);
    }
    return this.#o.budgets().map((b) => {
      const periodStartMs = b.period === "day" ? day : month;
      const subject =
        b.keyId !== undefined
          ? subjectKey("k", b.keyId, b.model)
          : subjectKey("t", b.tenant ?? "", b.model);
      const used = this.#periods.get(`${b.period}:${periodStartMs}`)?.get(subject) ?? 0;
      return {
        ...(b.tenant === undefined ? {} : { tenant: b.tenant }),
        ...(b.keyId === undefined ? {} : { keyId: b.keyId }),
        period: b.period,
        model: b.model,
        periodStartMs,
        usedTokens: used,
      };
    });
  }

  /**
   * Rows of `query`'s rollup, at most `maxRows`. Throws `LLMGW_CONTROL_PLANE_INVALID_ARGUMENT`
   * when more rows match, saying how to narrow the query.
   */
  async query(query: Omit<UsageQuery, "limit">): Promise<UsageRollupRow[]> {
    const maxRows = this.#o.maxRows ?? MAX_USAGE_ROWS;
    const rows = await this.#o.store.query({ ...query, limit: maxRows + 1 });
    if (rows.length > maxRows)
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
        `more than ${maxRows} usage rows match; narrow the period (since/until), use a coarser granularity, filter by tenant, key or model, or group by fewer dimensions`,
      );
    return rows;
  }

  /** Starts a prune when one is due (at most one at a time); failures are logged. */
  tick(): void {
    const now = this.#o.clock.now();
    if (this.#pruning !== undefined || now - this.#lastPruneMs < this.#pruneEveryMs) return;
    this.prune().catch((error: unknown) => {
      this.#o.log?.(
        `usage: pruning old rows failed (retried next time): ${(error as Error).message}`,
      );
    });
  }

  /**
   * Deletes minute rows, hour rows and batch ids older than the retention allows (day rows are
   * kept). Logs what it removed when anything was.
   */
  prune(): Promise<UsagePruneReport> {
    if (this.#pruning !== undefined) return this.#pruning;
    const now = this.#o.clock.now();
    this.#lastPruneMs = now;
    const pruning = this.#o.store.prune(now, this.#retention).then(
      (report) => {
        this.#pruning = undefined;
        if (report.minuteRows + report.hourRows + report.batchIds > 0)
          this.#o.log?.(
            `usage: pruned ${report.minuteRows} minute rows, ${report.hourRows} hour rows and ${report.batchIds} batch ids`,
          );
        return report;
      },
      (error: unknown) => {
        this.#pruning = undefined;
        throw error;
      },
    );
    this.#pruning = pruning;
    return pruning;
  }

  /** Waits for a prune in progress; the store itself is closed by its owner. */
  async close(): Promise<void> {
    await this.#pruning?.catch(() => {});
  }

  /** The totals are to be read again before they are used. */
  #stale(): void {
    this.#loaded = undefined;
    this.#ready = false;
  }

  #createdAt(tenant: string): number | undefined {
    return tenant === "" ? undefined : this.#o.tenantCreatedAt?.(tenant);
  }

  /**
   * Whether usage of `tenant` in [startMs, startMs + sizeMs) is the present tenant's: all of
   * it unless the tenant was created after that span began (the creation hour counts).
   * Remembers the creation time it judged by.
   */
  #counts(tenant: string, startMs: number, sizeMs: number): boolean {
    if (tenant === "") return false;
    // Checked by #current() just before: the creation time the totals were counted by.
    const created = this.#counted.has(tenant) ? this.#counted.get(tenant) : this.#createdAt(tenant);
    this.#counted.set(tenant, created);
    return created === undefined || startMs + sizeMs > bucketStart("hour", created);
  }

  /** Adds `tokens` to the key's totals (`forKey`) and the tenant's (`forTenant`). */
  #add(
    dayMs: number,
    tenant: string,
    keyId: string,
    model: string,
    tokens: number,
    forTenant: boolean,
    forKey: boolean,
  ): void {
    if (tokens === 0) return;
    for (const period of [`day:${dayMs}`, `month:${monthStart(dayMs)}`]) {
      let totals = this.#periods.get(period);
      if (totals === undefined) {
        totals = new Map();
        this.#periods.set(period, totals);
      }
      const subjects: string[] = [];
      if (forKey) subjects.push(subjectKey("k", keyId, model), subjectKey("k", keyId, ALL_MODELS));
      if (forTenant && tenant !== "")
        subjects.push(subjectKey("t", tenant, model), subjectKey("t", tenant, ALL_MODELS));
      for (const s of subjects) totals.set(s, (totals.get(s) ?? 0) + tokens);
    }
  }
}

function subjectKey(kind: "t" | "k", id: string, model: string): string {
  return `${kind}\u0000${id}\u0000${model}`;
}

/** A tenant or key as far as its budgets go (`TenantGrant`, `KeyGrant` of `@llmgw/router`). */
interface BudgetHolder {
  readonly budgets?: readonly {
    readonly period: BudgetPeriodName;
    readonly model?: string;
    readonly tokens: number;
  }[];
}

/**
 * Every budget of `tenants()` and `keys()` (what routers enforce: active keys) as one list,
 * built again only when either list is a new array — `Cluster.routingTenants()` and
 * `routingKeys()` return the same array until a key or tenant changes, so an answer costs
 * O(budgets), not O(keys).
 */
export function budgetSpecs(
  tenants: () => readonly (BudgetHolder & { readonly name: string })[],
  keys: () => readonly (BudgetHolder & { readonly id: string })[],
): () => readonly BudgetSpec[] {
  let last: { tenants: unknown; keys: unknown; specs: readonly BudgetSpec[] } | undefined;
  return () => {
    const t = tenants();
    const k = keys();
    if (last?.tenants === t && last.keys === k) return last.specs;
    const specs: BudgetSpec[] = [];
    for (const tenant of t)
      for (const b of tenant.budgets ?? [])
        specs.push({
          tenant: tenant.name,
          period: b.period,
          model: b.model ?? "",
          tokens: b.tokens,
        });
    for (const key of k)
      for (const b of key.budgets ?? [])
        specs.push({ keyId: key.id, period: b.period, model: b.model ?? "", tokens: b.tokens });
    last = { tenants: t, keys: k, specs };
    return specs;
  };
}

/** A batch's records summed per tenant and model (what the `llmgw_usage_*` metrics count). */
export function usageByTenantAndModel(
  records: readonly UsageRecordData[],
): { tenant: string; model: string; counts: UsageCounts }[] {
  const sums = new Map<string, { tenant: string; model: string; counts: UsageCounts }>();
  for (const r of records) {
    const id = `${r.tenant}\u0000${r.model}`;
    const before = sums.get(id);
    sums.set(id, { tenant: r.tenant, model: r.model, counts: addCounts(before?.counts, r) });
  }
  return [...sums.values()];
}
