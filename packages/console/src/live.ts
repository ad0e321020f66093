/**
 * What keeps the pages current: a poll hook for state (readings change with every heartbeat
 * and are no events), and one `WatchEvents` stream shared by every page, reconnected with
 * backoff, which also tells the pages to look again when something happened.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import type { Event } from "@llmgw/proto";
import { useEffect, useRef, useState } from "preact/hooks";
import { cluster, describeError } from "./api.js";

export interface Polled<T> {
  readonly data: T | undefined;
  readonly error: string | undefined;
  /** Fetches again now (after an action). */
  readonly refresh: () => void;
}

/**
 * Calls `load` now, then every `intervalMs` while the tab is visible, and whenever an event
 * of interest arrives (`onEvent`, coalesced). A failed call keeps the last data and says why.
 */
export function usePoll<T>(
  load: (signal: AbortSignal) => Promise<T>,
  intervalMs: number,
  deps: readonly unknown[] = [],
  onEvent?: (event: Event) => boolean,
): Polled<T> {
  const [data, setData] = useState<T | undefined>(undefined);
  const [error, setError] = useState<string | undefined>(undefined);
  const kick = useRef<() => void>(() => {});
  useEffect(() => {
    const abort = new AbortController();
    let timer: ReturnType<typeof setTimeout> | undefined;
    let running = false;
    let again = false;
    const run = async () => {
      if (running) {
        again = true;
        return;
      }
      running = true;
      clearTimeout(timer);
      try {
        const value = await load(abort.signal);
        if (!abort.signal.aborted) {
          setData(value);
          setError(undefined);
        }
      } catch (e) {
        if (!abort.signal.aborted) setError(describeError(e));
      } finally {
        running = false;
        if (!abort.signal.aborted) {
          if (again) {
            again = false;
            void run();
          } else timer = setTimeout(tick, intervalMs);
        }
      }
    };
    const tick = () => {
      if (document.visibilityState === "hidden") timer = setTimeout(tick, intervalMs);
      else void run();
    };
    kick.current = () => void run();
    const onVisible = () => {
      if (document.visibilityState === "visible") void run();
    };
    document.addEventListener("visibilitychange", onVisible);
    let pending: ReturnType<typeof setTimeout> | undefined;
    const unsubscribe =
      onEvent === undefined
        ? () => {}
        : events.subscribe((batch) => {
            if (pending === undefined && batch.some(onEvent))
              pending = setTimeout(() => {
                pending = undefined;
                void run();
              }, 150);
          });
    void run();
    return () => {
      abort.abort();
      clearTimeout(timer);
      clearTimeout(pending);
      unsubscribe();
      document.removeEventListener("visibilitychange", onVisible);
    };
  }, deps);
  return { data, error, refresh: () => kick.current() };
}

type Listener = (batch: readonly Event[]) => void;

/** Events kept for the pages (newest last). */
const KEPT = 2_000;

/** The shared event stream: `start` once logged in, `stop` at logout. */
export const events = (() => {
  let kept: Event[] = [];
  let connected = false;
  let lastError: string | undefined;
  const listeners = new Set<Listener>();
  const statusListeners = new Set<() => void>();
  let abort: AbortController | undefined;
  const setStatus = (up: boolean, error: string | undefined) => {
    connected = up;
    lastError = error;
    for (const l of statusListeners) l();
  };
  const publish = (batch: Event[]) => {
    kept = kept.concat(batch);
    if (kept.length > KEPT) kept = kept.slice(kept.length - KEPT);
    for (const l of listeners) l(batch);
  };
  const loop = async (signal: AbortSignal) => {
    let backoffMs = 500;
    while (!signal.aborted) {
      try {
        // After a reconnect, only what this page has not seen yet.
        const lastId = kept.at(-1)?.id ?? 0n;
        const stream = cluster.watchEvents({ backlog: lastId === 0n ? 500 : 200 }, { signal });
        setStatus(true, undefined);
        backoffMs = 500;
        let batch: Event[] = [];
        let flush: ReturnType<typeof setTimeout> | undefined;
        for await (const message of stream) {
          const event = message.event;
          if (event === undefined || event.id <= lastId) continue;
          batch.push(event);
          // Bursts (a backlog, a node joining with 8 GPUs) reach the pages as one update.
          flush ??= setTimeout(() => {
            flush = undefined;
            const out = batch;
            batch = [];
            publish(out);
          }, 50);
        }
        clearTimeout(flush);
        if (batch.length > 0) publish(batch);
      } catch (e) {
        if (signal.aborted) return;
        const code = ConnectError.from(e).code;
        setStatus(false, describeError(e));
        if (code === Code.Unauthenticated) return;
      }
      if (signal.aborted) return;
      setStatus(false, lastError);
      await new Promise((r) => setTimeout(r, backoffMs));
      backoffMs = Math.min(backoffMs * 2, 10_000);
    }
  };
  return {
    start() {
      if (abort !== undefined) return;
      abort = new AbortController();
      void loop(abort.signal);
    },
    stop() {
      abort?.abort();
      abort = undefined;
      kept = [];
      setStatus(false, undefined);
    },
    all: (): readonly Event[] => kept,
    subscribe(listener: Listener): () => void {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
    status: () => ({ connected, error: lastError }),
    onStatus(listener: () => void): () => void {
      statusListeners.add(listener);
      return () => statusListeners.delete(listener);
    },
  };
})();

/** The kept events, re-rendering on each new batch. */
export function useEvents(): readonly Event[] {
  const [list, setList] = useState(events.all());
  useEffect(() => {
    setList(events.all());
    return events.subscribe(() => setList(events.all()));
  }, []);
  return list;
}

/** The current time, ticking every `everyMs` (for "12 s ago"). */
export function useNow(everyMs = 1_000): number {
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    const timer = setInterval(() => setNow(Date.now()), everyMs);
    return () => clearInterval(timer);
  }, [everyMs]);
  return now;
}
