import { createServer, type Server } from "node:net";
import type { Clock, SupervisorLogger, TimerHandle } from "../clock.js";

interface PendingTimer {
  readonly atMs: number;
  readonly seq: number;
  readonly callback: () => void;
  cancelled: boolean;
}

/**
 * A clock that only moves when told to. Timers fire in due order during {@link advance};
 * a real fake for backoff, deadlines and polling tests.
 */
export class ManualClock implements Clock {
  #now: number;
  #seq = 0;
  #timers: PendingTimer[] = [];

  constructor(startMs = 1_700_000_000_000) {
    this.#now = startMs;
  }

  now(): number {
    return this.#now;
  }

  setTimer(callback: () => void, delayMs: number): TimerHandle {
    const timer: PendingTimer = {
      atMs: this.#now + Math.max(0, delayMs),
      seq: this.#seq++,
      callback,
      cancelled: false,
    };
    this.#timers.push(timer);
    return {
      cancel: () => {
        timer.cancelled = true;
      },
    };
  }

  /** Number of live timers. */
  pending(): number {
    return this.#timers.filter((t) => !t.cancelled).length;
  }

  /** Delay until the next live timer, if any. */
  nextDelayMs(): number | undefined {
    const live = this.#timers.filter((t) => !t.cancelled).map((t) => t.atMs - this.#now);
    return live.length === 0 ? undefined : Math.max(0, Math.min(...live));
  }

  /** Moves time forward by `ms`, firing every timer that comes due, in order. */
  advance(ms: number): void {
    const target = this.#now + ms;
    for (;;) {
      const due = this.#timers
        .filter((t) => !t.cancelled && t.atMs <= target)
        .sort((a, b) => a.atMs - b.atMs || a.seq - b.seq)[0];
      if (due === undefined) break;
      due.cancelled = true;
      this.#now = Math.max(this.#now, due.atMs);
      due.callback();
    }
    this.#timers = this.#timers.filter((t) => !t.cancelled);
    this.#now = target;
  }
}

/** A logger that records every line, for asserting on transitions. */
export class RecordingLogger implements SupervisorLogger {
  readonly lines: {
    level: "info" | "warn";
    message: string;
    fields?: Readonly<Record<string, unknown>>;
  }[] = [];
  info(message: string, fields?: Readonly<Record<string, unknown>>): void {
    this.lines.push({ level: "info", message, ...(fields === undefined ? {} : { fields }) });
  }
  warn(message: string, fields?: Readonly<Record<string, unknown>>): void {
    this.lines.push({ level: "warn", message, ...(fields === undefined ? {} : { fields }) });
  }
}

/**
 * Absolute path of the fixture engine (a node script; run it with `process.execPath`). Flags:
 * `--grandchildren N` with `--grandchildren-ignore-term`, `--grandchildren-linger MS` (they
 * close their port MS after SIGTERM) or `--grandchildren-thread-linger MS` (python3 ones whose
 * main thread exits at SIGTERM, another thread holding the port MS longer), `--group-squatter`
 * (a python3 grandchild that leaves the group, keeps its id in use and moves back in on
 * SIGUSR1), `--ignore-term`,
 * `--lines N`, `--flood BYTES`, `--exit-after MS --exit-code C`, `--port P --model ID` with `--load-ms M`
 * or `--ready-file F` (serves `/health`, and lists ID in `/v1/models` once loaded). It prints
 * `engine <pid> up` once its signal handlers are installed.
 */
export const FIXTURE_ENGINE_PATH: string = decodeURIComponent(
  new URL("../../test/fixtures/engine.mjs", import.meta.url).pathname,
);

/**
 * Listens on `host:port` as soon as it is free (a process holding it died), polling every
 * 2 ms for up to `timeoutMs`: a test's way to take an engine's port away between its crash
 * and the supervisor's restart. Resolves the server; close it to give the port back.
 */
export async function holdPortOnceFree(
  port: number,
  host = "127.0.0.1",
  timeoutMs = 5_000,
): Promise<Server> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const server = createServer();
    const error = await new Promise<Error | undefined>((resolve) => {
      server.once("error", resolve);
      server.listen(port, host, () => resolve(undefined));
    });
    if (error === undefined) return server;
    if (Date.now() > deadline) throw error;
    await new Promise((r) => setTimeout(r, 2));
  }
}
