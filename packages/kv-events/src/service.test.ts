import { Code, ConnectError, createClient, createRouterTransport } from "@connectrpc/connect";
import { KvCacheService } from "@llmgw/proto";
import { describe, expect, it } from "vitest";
import type { KvBlockFeed, KvFeedUpdate } from "./feed.js";
import { createKvCacheService, MAX_PENDING_KEYS, MAX_PENDING_UPDATES } from "./service.js";

/** A feed without an engine: `emit` hands an update to every listener, as a batch would. */
function fakeFeed() {
  const listeners = new Set<(u: KvFeedUpdate) => void>();
  const closing = new AbortController();
  let version = 0;
  const update = (keys: readonly number[], at = ++version): KvFeedUpdate => ({
    epoch: "e1",
    version: at,
    snapshot: false,
    added: keys,
    removed: [],
    blockSizeTokens: 16,
    stale: false,
  });
  const feed = {
    snapshot: () => ({ ...update([], version), snapshot: true }),
    subscribe(listener: (u: KvFeedUpdate) => void) {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
    closedSignal: closing.signal,
  } as unknown as KvBlockFeed;
  return {
    feed,
    listeners,
    emit: (keys: readonly number[]) => {
      const u = update(keys);
      for (const listener of listeners) listener(u);
    },
  };
}

function watch(feed: KvBlockFeed) {
  const transport = createRouterTransport(({ service }) => {
    service(
      KvCacheService,
      createKvCacheService({ get: () => ({ feed, apiKey: "k" }) }, { keepaliveMs: 60_000 }),
    );
  });
  const stream = createClient(KvCacheService, transport).watchBlocks(
    { replicaId: "r" },
    { headers: { authorization: "Bearer k" } },
  );
  return stream[Symbol.asyncIterator]();
}

describe("KvCacheService.WatchBlocks", () => {
  it("cuts off a watcher whose queued updates hold more than MAX_PENDING_KEYS keys, and lets them go", async () => {
    // Counting updates alone let one slow watcher pin 10,000 deltas of up to a million keys
    // each (gigabytes) for as long as its connection stayed open.
    const { feed, listeners, emit } = fakeFeed();
    const it = watch(feed);
    expect((await it.next()).value).toMatchObject({ snapshot: true });
    const big = Array.from({ length: 1_000_000 }, (_, i) => i);
    const updates = Math.ceil(MAX_PENDING_KEYS / big.length) + 1;
    expect(updates).toBeLessThan(MAX_PENDING_UPDATES);
    // All queued before the watch reads on: the watcher is that far behind.
    for (let i = 0; i < updates; i++) emit(big);
    // Nothing is kept for it any more: it starts again from a snapshot.
    expect(listeners.size).toBe(0);
    const error = await it.next().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(ConnectError);
    expect((error as ConnectError).code).toBe(Code.ResourceExhausted);
    expect((error as ConnectError).rawMessage).toMatch(/keys behind; reconnect for a snapshot/);
  });

  it("still sends a watcher within the bounds every update in order", async () => {
    const { feed, emit } = fakeFeed();
    const it = watch(feed);
    expect((await it.next()).value).toMatchObject({ snapshot: true, version: 0n });
    emit([1, 2]);
    emit([3]);
    expect((await it.next()).value).toMatchObject({ version: 1n, added: [1, 2] });
    expect((await it.next()).value).toMatchObject({ version: 2n, added: [3] });
    await it.return?.();
  });
});
