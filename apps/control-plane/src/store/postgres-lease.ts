import type pg from "pg";
import type { PostgresDatabase, WriterIdentity } from "./postgres-store.js";

/*
 * The leader lease: one row in `llmgw_leader` with a holder, an epoch and an expiry set by
 * PostgreSQL's clock (never an instance's). An instance takes the row only once it has
 * expired, raising the epoch; the holder renews it well before. Writes are fenced by the
 * epoch (postgres-store.ts locks the row in each commit), and the holder also stops leading
 * on its own clock: once `ttlMs` have passed since the start of its last renewal that
 * PostgreSQL confirmed, whether or not it heard anything since. Both bounds hold with a
 * partitioned leader, a stalled process or a dead database.
 */

/** The leader as the lease row names it. */
export interface LeaderInfo {
  readonly holder: string;
  readonly url: string;
  readonly epoch: number;
}

/** A control-plane instance as it last announced itself. */
export interface InstanceInfo {
  readonly id: string;
  readonly url: string;
  readonly version: string;
  readonly startedAtMs: number;
  /** How long ago PostgreSQL last heard from it. */
  readonly seenAgoMs: number;
}

/** Options of {@link startLeaderLease}. */
export interface LeaderLeaseOptions {
  readonly database: PostgresDatabase;
  /** This instance: unique per process. */
  readonly instanceId: string;
  /** Its control URL, handed to clients of followers. */
  readonly url: string;
  readonly version: string;
  /** How long a lease holds without renewal. Default 2,000 ms. */
  readonly ttlMs?: number;
  /** How often the holder renews. Default ttl / 4. */
  readonly renewMs?: number;
  /** How often a follower checks whether the lease expired. Default 250 ms. */
  readonly pollMs?: number;
  /** This instance won the lease at `writer.epoch`. */
  readonly onElected: (writer: WriterIdentity) => void;
  /** It no longer leads (expired on its clock, taken, or `close`): stop writing at once. */
  readonly onDeposed: (reason: string) => void;
  readonly log?: (line: string) => void;
}

/** A running lease loop. */
export interface LeaderLease {
  /** Set while this instance leads. */
  readonly writer: WriterIdentity | undefined;
  /** The leader the lease row last named (this instance included); undefined when none holds it. */
  readonly leader: LeaderInfo | undefined;
  /** Every instance heard from in the last minute, this one included. */
  instances(): Promise<InstanceInfo[]>;
  /**
   * Gives the lease up while this instance cannot lead (its state failed to load, a commit
   * failed for good): another instance takes over at once, and this one waits three ttls
   * before contending again. With `epoch`, only the term won at that epoch: a failure of a
   * term that is over must not end the one this instance holds now.
   */
  resign(reason: string, epoch?: number): Promise<void>;
  /** Gives the lease up (a planned stop hands over at once) and stops the loop. */
  close(): Promise<void>;
}

/** Starts contending for the lease; the first attempt runs at once. */
export function startLeaderLease(options: LeaderLeaseOptions): LeaderLease {
  const ttlMs = options.ttlMs ?? 2_000;
  const renewMs = options.renewMs ?? Math.max(50, Math.floor(ttlMs / 4));
  const pollMs = options.pollMs ?? 250;
  const log = options.log ?? (() => {});
  const startedAtMs = Date.now();
  let writer: WriterIdentity | undefined;
  let leader: LeaderInfo | undefined;
  let client: pg.Client | undefined;
  let closed = false;
  let timer: NodeJS.Timeout | undefined;
  /** Set while leading: when the lease ends on this instance's clock. */
  let deadline: NodeJS.Timeout | undefined;
  let unreachableLogged = false;
  /** Until when (performance.now) this instance does not contend, after resigning. */
  let resignedUntil = 0;

  const depose = (reason: string) => {
    if (writer === undefined) return;
    writer = undefined;
    clearTimeout(deadline);
    log(`leader lease lost: ${reason}`);
    options.onDeposed(reason);
  };
  /** The lease holds until `sentAt + ttl` at most (PostgreSQL set its expiry after `sentAt`). */
  const holdUntil = (sentAt: number) => {
    clearTimeout(deadline);
    const left = sentAt + ttlMs - performance.now();
    deadline = setTimeout(
      () => depose(`not renewed within ${ttlMs} ms (the database is slow or unreachable)`),
      Math.max(0, left),
    );
    deadline.unref?.();
  };

  const attempt = async (): Promise<void> => {
    client ??= await options.database.connect({ queryTimeoutMs: Math.max(200, ttlMs / 2) });
    // Closed while connecting: `close` ends the client; nothing may be taken or announced.
    if (closed) return;
    const c = client;
    const sentAt = performance.now();
    const interval = `${ttlMs} milliseconds`;
    if (writer !== undefined) {
      const held = writer;
      const renewed = await c.query(
        `UPDATE llmgw_leader SET expires_at = clock_timestamp() + $3::interval
         WHERE id = 1 AND holder = $1 AND epoch = $2 AND expires_at > clock_timestamp()`,
        [held.holder, held.epoch, interval],
      );
      if (writer !== held) return;
      if (renewed.rowCount === 1) holdUntil(sentAt);
      else depose("another instance holds the lease");
    } else if (performance.now() >= resignedUntil) {
      const won = await c.query<{ epoch: number }>(
        `UPDATE llmgw_leader SET holder = $1, holder_url = $2, epoch = epoch + 1,
           expires_at = clock_timestamp() + $3::interval
         WHERE id = 1 AND expires_at <= clock_timestamp() RETURNING epoch`,
        [options.instanceId, options.url, interval],
      );
      const epoch = won.rows[0]?.epoch;
      if (epoch !== undefined && closed) {
        // Won as `close` began: hand it over at once rather than hold it for a ttl unled.
        await c.query(
          "UPDATE llmgw_leader SET expires_at = '-infinity' WHERE id = 1 AND holder = $1 AND epoch = $2",
          [options.instanceId, epoch],
        );
        return;
      }
      if (epoch !== undefined) {
        writer = { holder: options.instanceId, epoch };
        holdUntil(sentAt);
        log(`leader lease won (epoch ${epoch})`);
        options.onElected(writer);
      }
    }
    if (closed) return;
    const row = (
      await c.query<{ holder: string; holder_url: string; epoch: number; live: boolean }>(
        "SELECT holder, holder_url, epoch, expires_at > clock_timestamp() AS live FROM llmgw_leader WHERE id = 1",
      )
    ).rows[0];
    leader = row?.live ? { holder: row.holder, url: row.holder_url, epoch: row.epoch } : undefined;
    await c.query(
      `INSERT INTO llmgw_instances (id, url, version, started_at_ms, seen_at)
       VALUES ($1, $2, $3, $4, clock_timestamp())
       ON CONFLICT (id) DO UPDATE SET url = excluded.url, seen_at = excluded.seen_at`,
      [options.instanceId, options.url, options.version, startedAtMs],
    );
    if (unreachableLogged) log(`the state store ${options.database.location} answers again`);
    unreachableLogged = false;
  };

  const loop = async () => {
    timer = undefined;
    if (closed) return;
    try {
      await attempt();
    } catch (error) {
      const c = client;
      client = undefined;
      void c?.end().catch(() => {});
      leader = writer === undefined ? undefined : leader;
      if (!unreachableLogged) {
        unreachableLogged = true;
        log(
          `cannot reach the state store ${options.database.location} for the leader lease: ${(error as Error).message}`,
        );
      }
    }
    if (closed) return;
    // `running` is always the attempt in flight, so that `close` waits for it.
    timer = setTimeout(
      () => {
        running = loop();
      },
      writer === undefined ? pollMs : renewMs,
    );
    timer.unref?.();
  };
  let running = loop();

  return {
    get writer() {
      return writer;
    },
    get leader() {
      return leader;
    },
    async instances() {
      const c = await options.database.connect({ queryTimeoutMs: 2_000 });
      try {
        const rows = (
          await c.query<{
            id: string;
            url: string;
            version: string;
            started_at_ms: number;
            seen_ago_ms: number;
          }>(
            `SELECT id, url, version, started_at_ms,
               (EXTRACT(EPOCH FROM clock_timestamp() - seen_at) * 1000)::bigint AS seen_ago_ms
             FROM llmgw_instances WHERE seen_at > clock_timestamp() - interval '1 minute'
             ORDER BY started_at_ms, id`,
          )
        ).rows;
        return rows.map((r) => ({
          id: r.id,
          url: r.url,
          version: r.version,
          startedAtMs: r.started_at_ms,
          seenAgoMs: r.seen_ago_ms,
        }));
      } finally {
        await c.end().catch(() => {});
      }
    },
    async resign(reason, epoch) {
      const held = writer;
      if (held === undefined || (epoch !== undefined && held.epoch !== epoch)) return;
      resignedUntil = performance.now() + 3 * ttlMs;
      depose(`resigned: ${reason}`);
      try {
        const c = await options.database.connect({ queryTimeoutMs: 2_000 });
        try {
          await c.query(
            "UPDATE llmgw_leader SET expires_at = '-infinity' WHERE id = 1 AND holder = $1 AND epoch = $2",
            [held.holder, held.epoch],
          );
        } finally {
          await c.end().catch(() => {});
        }
      } catch {
        // The database is gone: the lease expires on its own.
      }
    },
    async close() {
      if (closed) return;
      closed = true;
      clearTimeout(timer);
      await running.catch(() => {});
      running = Promise.resolve();
      const held = writer;
      depose("this control plane is stopping");
      const c = client;
      client = undefined;
      if (c === undefined) return;
      try {
        // Hand over now rather than after the ttl; the instance row goes with it.
        if (held !== undefined)
          await c.query(
            "UPDATE llmgw_leader SET expires_at = '-infinity' WHERE id = 1 AND holder = $1 AND epoch = $2",
            [held.holder, held.epoch],
          );
        await c.query("DELETE FROM llmgw_instances WHERE id = $1", [options.instanceId]);
      } catch {
        // The database is gone: the lease expires on its own.
      } finally {
        await c.end().catch(() => {});
      }
    },
  };
}
