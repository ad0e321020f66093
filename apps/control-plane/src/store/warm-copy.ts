import type pg from "pg";
import {
  type PostgresDatabase,
  readSnapshot,
  STATE_CHANGED_CHANNEL,
  type StoreSnapshot,
} from "./postgres-store.js";

/**
 * A follower's warm copy of the state: the database read whole, again each time the leader
 * commits (it sends {@link STATE_CHANGED_CHANNEL} in every write transaction), at most once per
 * `minIntervalMs` and never more often than four times the last read-and-build took, so a
 * large cluster's follower does not spend a core re-reading under constant change. A poll
 * every `pollMs` catches what a dropped connection missed.
 */

/** What a follower serves reads from, and when the database was read for it. */
export interface WarmCopyState<T> {
  readonly value: T;
  /** Epoch ms the snapshot was taken (read started). */
  readonly readAtMs: number;
}

export interface WarmCopy<T> {
  /** The newest copy; undefined until the first read completes. */
  readonly current: WarmCopyState<T> | undefined;
  /** Resolves once a copy newer than the call has been built (tests, `refresh` on demand). */
  refreshed(): Promise<WarmCopyState<T>>;
  /**
   * Serves `value` (the state as of `readAtMs`) until a read succeeds: a leader that stepped
   * down answers from its last state while the database is unreachable. Ignored once a copy
   * was read.
   */
  seed(value: T, readAtMs: number): void;
  close(): Promise<void>;
}

export interface WarmCopyOptions<T> {
  readonly database: PostgresDatabase;
  readonly eventsKept: number;
  /** Builds what reads are served from (e.g. a read-only `Cluster`); may throw. */
  readonly build: (snapshot: StoreSnapshot) => T;
  readonly log?: (line: string) => void;
  /** Default 500 ms. */
  readonly minIntervalMs?: number;
  /** Default 5 s. */
  readonly pollMs?: number;
  /**
   * How long one query of a read may wait for its answer (default 15 s). A connection whose
   * peer vanished without a reset (a partition, a database host gone) answers nothing, and the
   * operating system may take a quarter of an hour to say so; past this, the read fails, the
   * connection is given up and the next read opens another.
   */
  readonly queryTimeoutMs?: number;
  readonly now?: () => number;
}

export function startWarmCopy<T>(options: WarmCopyOptions<T>): WarmCopy<T> {
  const log = options.log ?? (() => {});
  const now = options.now ?? Date.now;
  const minIntervalMs = options.minIntervalMs ?? 500;
  const queryTimeoutMs = options.queryTimeoutMs ?? 15_000;
  let current: WarmCopyState<T> | undefined;
  let client: pg.Client | undefined;
  let connecting: Promise<pg.Client> | undefined;
  let closed = false;
  let reading = false;
  let wanted = false;
  let timer: NodeJS.Timeout | undefined;
  let lastStartMs = Number.NEGATIVE_INFINITY;
  let gapMs = minIntervalMs;
  let failing = false;
  const waiters: { after: number; resolve: (s: WarmCopyState<T>) => void }[] = [];

  const connected = (): Promise<pg.Client> => {
    if (client !== undefined) return Promise.resolve(client);
    connecting ??= (async () => {
      const c = await options.database.connect({ queryTimeoutMs });
      c.on("error", () => {
        if (client === c) client = undefined;
        void c.end().catch(() => {});
      });
      c.on("end", () => {
        if (client === c) client = undefined;
      });
      c.on("notification", request);
      try {
        await c.query(`LISTEN ${STATE_CHANGED_CHANNEL}`);
        if (closed) throw new Error("closed");
      } catch (error) {
        void c.end().catch(() => {});
        throw error;
      }
      client = c;
      return c;
    })().finally(() => {
      connecting = undefined;
    });
    return connecting;
  };

  function request(): void {
    wanted = true;
    if (closed || reading || timer !== undefined) return;
    timer = setTimeout(read, Math.max(0, lastStartMs + gapMs - now()));
    timer.unref?.();
  }

  async function read(): Promise<void> {
    timer = undefined;
    if (closed) return;
    wanted = false;
    reading = true;
    const startedAt = now();
    lastStartMs = startedAt;
    const t0 = performance.now();
    try {
      const c = await connected();
      const snapshot = await readSnapshot(c, options.eventsKept);
      const value = options.build(snapshot);
      current = { value, readAtMs: startedAt };
      gapMs = Math.max(minIntervalMs, 4 * (performance.now() - t0));
      if (failing) log(`the follower's copy of ${options.database.location} is current again`);
      failing = false;
      for (let i = waiters.length - 1; i >= 0; i--) {
        const w = waiters[i];
        if (w !== undefined && w.after <= startedAt) {
          waiters.splice(i, 1);
          w.resolve(current);
        }
      }
    } catch (error) {
      if (closed) return;
      // Whatever failed, the next read starts on a new connection: one that timed out may
      // never answer again, and its LISTEN with it.
      const c = client;
      client = undefined;
      void c?.end().catch(() => {});
      if (!failing)
        log(
          `the follower's copy of ${options.database.location} cannot be read (${(error as Error).message}); reads are answered from the copy of ${current === undefined ? "nothing" : new Date(current.readAtMs).toISOString()}, retrying`,
        );
      failing = true;
      wanted = true;
      gapMs = Math.max(gapMs, 1_000);
    } finally {
      reading = false;
    }
    if (wanted) request();
  }

  const poll = setInterval(request, options.pollMs ?? 5_000);
  poll.unref?.();
  request();

  return {
    get current() {
      return current;
    },
    seed(value, readAtMs) {
      current ??= { value, readAtMs };
    },
    refreshed() {
      const after = now();
      return new Promise((resolve) => {
        waiters.push({ after, resolve });
        request();
      });
    },
    async close() {
      closed = true;
      clearInterval(poll);
      clearTimeout(timer);
      const c = client ?? (await connecting?.catch(() => undefined));
      client = undefined;
      await c?.end().catch(() => {});
    },
  };
}
