/**
 * Precise mode's feeds: one `KvCacheService.WatchBlocks` stream per replica whose route names a
 * `kvEventsUrl` (its agent), authorised with that replica's engine key, applied to the picker's
 * {@link PreciseIndex}. Replicas come and go with the route table; a stream that breaks (or
 * sends a delta out of order) marks its replica unusable for precise matching and is opened
 * again, after a backoff, for a fresh snapshot. Every replica of every model is watched, not only
 * those requests named yet: a router that starts late is warm once the snapshots arrive.
 */
import { type Client, createClient, type Transport } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { KvCacheService } from "@llmgw/proto";
import type { PreciseIndex, RouteTable } from "@llmgw/router";

/** Options of {@link startKvWatch}. */
export interface KvWatchOptions {
  readonly routeTable: RouteTable;
  readonly index: PreciseIndex;
  readonly log?: (event: Readonly<Record<string, unknown>>) => void;
  /** Default: Connect over HTTP/1.1 to the URL. */
  readonly transportFor?: (url: string) => Transport;
  /** First and longest wait before a broken stream is opened again (default 500 / 10 000 ms). */
  readonly retryMs?: { readonly min: number; readonly max: number };
}

/** The running watches. */
export interface KvWatch {
  /** Replica ids with a stream open or being retried. */
  watching(): string[];
  close(): void;
}

/** Largest `WatchBlocks` message accepted: a snapshot of ~3.5 M keys. */
const MAX_MESSAGE_BYTES = 32 * 1024 * 1024;

interface Watched {
  readonly url: string;
  readonly authorization: string | undefined;
  readonly abort: AbortController;
}

/** Starts watching the route table's replicas with a KV-event feed. */
export function startKvWatch(options: KvWatchOptions): KvWatch {
  const { routeTable, index } = options;
  const log = options.log ?? (() => {});
  const retry = options.retryMs ?? { min: 500, max: 10_000 };
  const clients = new Map<string, Client<typeof KvCacheService>>();
  const clientFor = (url: string): Client<typeof KvCacheService> => {
    let client = clients.get(url);
    if (client === undefined) {
      const transport =
        options.transportFor?.(url) ??
        createConnectTransport({
          baseUrl: url,
          httpVersion: "1.1",
          readMaxBytes: MAX_MESSAGE_BYTES,
        });
      client = createClient(KvCacheService, transport);
      clients.set(url, client);
    }
    return client;
  };
  const watched = new Map<string, Watched>();

  const run = async (replicaId: string, w: Watched): Promise<void> => {
    const signal = w.abort.signal;
    let delay = retry.min;
    while (!signal.aborted) {
      let reason = "ended";
      try {
        const headers =
          w.authorization === undefined ? undefined : { authorization: w.authorization };
        const stream = clientFor(w.url).watchBlocks(
          { replicaId },
          { signal, ...(headers === undefined ? {} : { headers }) },
        );
        for await (const m of stream) {
          const result = index.apply(replicaId, {
            epoch: m.epoch,
            version: Number(m.version),
            snapshot: m.snapshot,
            added: m.added,
            removed: m.removed,
            blockSizeTokens: m.blockSizeTokens,
            stale: m.stale,
          });
          if (result === "out_of_order") {
            reason = "out_of_order";
            break; // reopened below for a fresh snapshot
          }
          delay = retry.min;
        }
      } catch (error) {
        if (signal.aborted) return;
        reason = error instanceof Error ? error.message : String(error);
      }
      index.invalidate(replicaId);
      if (signal.aborted) return;
      log({ event: "kv_watch_retry", replica: replicaId, reason, retryInMs: delay });
      await new Promise<void>((resolve) => {
        // The signal lives as long as the replica is watched: a listener left behind by each
        // retry would pile up for as long as its agent is unreachable.
        const onAbort = (): void => {
          clearTimeout(timer);
          resolve();
        };
        const timer = setTimeout(() => {
          signal.removeEventListener("abort", onAbort);
          resolve();
        }, delay);
        timer.unref();
        signal.addEventListener("abort", onAbort, { once: true });
      });
      delay = Math.min(retry.max, delay * 2);
    }
  };

  const sync = (): void => {
    const want = new Map<string, { url: string; authorization: string | undefined }>();
    for (const model of routeTable.models()) {
      for (const r of routeTable.resolve(model)?.replicas ?? []) {
        if (r.kvEventsUrl === undefined) continue;
        want.set(r.id, {
          url: r.kvEventsUrl,
          authorization:
            r.authorization ?? (r.apiKey === undefined ? undefined : `Bearer ${r.apiKey}`),
        });
      }
    }
    for (const [id, w] of watched) {
      const next = want.get(id);
      if (next?.url === w.url && next.authorization === w.authorization) continue;
      w.abort.abort();
      watched.delete(id);
      if (next === undefined) index.forget(id);
    }
    for (const [id, next] of want) {
      if (watched.has(id)) continue;
      const w: Watched = { ...next, abort: new AbortController() };
      watched.set(id, w);
      void run(id, w);
    }
  };
  const unsubscribe = routeTable.subscribe(sync);
  sync();
  return {
    watching: () => [...watched.keys()].sort(),
    close() {
      unsubscribe();
      for (const w of watched.values()) w.abort.abort();
      watched.clear();
    },
  };
}
