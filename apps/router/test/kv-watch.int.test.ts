/**
 * Precise mode's feed path, every piece real: an engine's KV events on a ZMQ socket → the
 * agent's block feed and `KvCacheService` over HTTP → the router's watch → its picker, which
 * then sends a prompt to the replica whose engine holds its token blocks.
 */

import { getEventListeners } from "node:events";
import { Code, ConnectError, createRouterTransport, type Transport } from "@connectrpc/connect";
import {
  createKvBlockFeed,
  createKvEventPublisher,
  type KvBlockFeed,
  type KvEventPublisher,
  startKvCacheServer,
} from "@llmgw/kv-events";
import { tokenBlockKeys } from "@llmgw/kv-events/token-blocks";
import { KvCacheService } from "@llmgw/proto";
import { createReplicaPicker, createStaticRouteTable, type RouteResolution } from "@llmgw/router";
import { afterEach, describe, expect, it } from "vitest";
import { startKvWatch } from "../src/kv-watch.js";

/** Polls `predicate` (which may publish on the way) until it holds. */
async function waitFor(predicate: () => unknown, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await predicate())) {
    if (Date.now() > deadline) throw new Error("timed out");
    await new Promise((r) => setTimeout(r, 20));
  }
}

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const BLOCK = 4;
const tokens = Array.from({ length: 12 }, (_, i) => 100 + i);

async function engine(): Promise<{ pub: KvEventPublisher; feed: KvBlockFeed }> {
  const pub = await createKvEventPublisher({ endpoint: "tcp://127.0.0.1:0" });
  const feed = createKvBlockFeed({ endpoint: pub.endpoint });
  cleanups.push(
    () => pub.close(),
    () => feed.close(),
  );
  return { pub, feed };
}

/** Publishes until the (slow-joining) SUB socket has seen a batch: the feed turns fresh. */
async function warm(pub: KvEventPublisher, feed: KvBlockFeed): Promise<void> {
  await waitFor(async () => {
    await pub.publish([]);
    return feed.stats().received > 0;
  });
}

describe("KV-event feeds into the router's picker", () => {
  it("routes to the replica whose engine stored the prompt's blocks, and follows evictions", async () => {
    const [a, b] = [await engine(), await engine()];
    const keyFor = new Map([
      ["ra", "key-a"],
      ["rb", "key-b"],
    ]);
    const feeds = new Map([
      ["ra", a.feed],
      ["rb", b.feed],
    ]);
    const server = await startKvCacheServer({
      registry: {
        get: (id) => {
          const feed = feeds.get(id);
          return feed === undefined ? undefined : { feed, apiKey: keyFor.get(id) };
        },
      },
      keepaliveMs: 200,
    });
    cleanups.push(() => server.close());
    for (const e of [a, b]) await warm(e.pub, e.feed);
    const route = (id: string, port: number) => ({
      id,
      baseUrl: `http://127.0.0.1:${port}`,
      state: "ready" as const,
      capacity: 8,
      apiKey: keyFor.get(id),
      kvEventsUrl: server.url,
    });
    const resolution: RouteResolution = {
      deployment: "d",
      policy: "llmgw",
      loading: false,
      tokenizer: "sim",
      replicas: [route("ra", 1), route("rb", 2)],
    };
    const table = createStaticRouteTable({ m: resolution });
    const picker = createReplicaPicker();
    const watch = startKvWatch({ routeTable: table, index: picker.preciseIndex });
    cleanups.push(() => watch.close());
    expect(watch.watching()).toEqual(["ra", "rb"]);
    // b stores the prompt's first two blocks (a parent chain, as vLLM sends it).
    await b.pub.publish([
      {
        type: "BlockStored",
        blockHashes: [11n, 12n],
        tokenIds: tokens.slice(0, 8),
        blockSize: BLOCK,
      },
    ]);
    await waitFor(() => picker.preciseBlockSize(resolution.replicas) === BLOCK);
    const keys = tokenBlockKeys(tokens, BLOCK);
    await waitFor(() => picker.preciseIndex.match(["rb"], keys).get("rb") === 2);
    const chosen = picker.pick(resolution, [], undefined, undefined, { precise: keys });
    expect(chosen).toMatchObject({
      replica: { id: "rb" },
      prefixBlocks: 2,
      prefixSource: "precise",
    });
    // b evicts the second block: one block left to match.
    await b.pub.publish([{ type: "BlockRemoved", blockHashes: [12n] }]);
    await waitFor(() => picker.preciseIndex.match(["rb"], keys).get("rb") === 1);
    // The engine restarts (its seq starts again at 0): the router drops b's blocks.
    await b.pub.close();
    // The port may take a moment to be free again.
    let again: KvEventPublisher | undefined;
    await waitFor(async () => {
      again = await createKvEventPublisher({ endpoint: b.pub.endpoint }).catch(() => undefined);
      return again !== undefined;
    });
    if (again === undefined) throw new Error("no publisher");
    const restarted = again;
    cleanups.push(() => restarted.close());
    await waitFor(async () => {
      await restarted.publish([]);
      return picker.preciseIndex.match(["rb"], keys).size === 0;
    });
  });

  it("refuses a watch without the replica's engine key, and says nothing of unknown ids", async () => {
    const a = await engine();
    const server = await startKvCacheServer({
      registry: { get: (id) => (id === "ra" ? { feed: a.feed, apiKey: "key-a" } : undefined) },
    });
    cleanups.push(() => server.close());
    const { createClient } = await import("@connectrpc/connect");
    const { createConnectTransport } = await import("@connectrpc/connect-node");
    const { KvCacheService } = await import("@llmgw/proto");
    const client = createClient(
      KvCacheService,
      createConnectTransport({ baseUrl: server.url, httpVersion: "1.1" }),
    );
    const first = async (replicaId: string, key?: string): Promise<string> => {
      try {
        for await (const m of client.watchBlocks(
          { replicaId },
          key === undefined ? {} : { headers: { authorization: `Bearer ${key}` } },
        )) {
          return m.snapshot ? "snapshot" : "delta";
        }
        return "ended";
      } catch (error) {
        return (error as Error).message;
      }
    };
    expect(await first("ra", "key-a")).toBe("snapshot");
    const refused = "[unauthenticated] a replica's engine key is required";
    expect(await first("ra")).toBe(refused);
    expect(await first("ra", "key-b")).toBe(refused);
    expect(await first("nope", "key-a")).toBe(refused);
  });

  it("drops a relaunched replica's old blocks and follows its new feed", async () => {
    const old = await engine();
    await warm(old.pub, old.feed);
    let current = old.feed;
    const server = await startKvCacheServer({
      registry: { get: (id) => (id === "ra" ? { feed: current, apiKey: "key-a" } : undefined) },
      keepaliveMs: 100,
    });
    cleanups.push(() => server.close());
    const resolution: RouteResolution = {
      deployment: "d",
      policy: "llmgw",
      loading: false,
      tokenizer: "sim",
      replicas: [
        {
          id: "ra",
          baseUrl: "http://127.0.0.1:1",
          state: "ready",
          capacity: 8,
          apiKey: "key-a",
          kvEventsUrl: server.url,
        },
      ],
    };
    const picker = createReplicaPicker();
    const watch = startKvWatch({
      routeTable: createStaticRouteTable({ m: resolution }),
      index: picker.preciseIndex,
      retryMs: { min: 20, max: 50 },
    });
    cleanups.push(() => watch.close());
    const keys = tokenBlockKeys(tokens, BLOCK);
    await old.pub.publish([
      {
        type: "BlockStored",
        blockHashes: [1n, 2n],
        tokenIds: tokens.slice(0, 8),
        blockSize: BLOCK,
      },
    ]);
    await waitFor(() => picker.preciseIndex.match(["ra"], keys).get("ra") === 2);
    // The agent relaunches the replica under the same id: the old feed closes, a new one is
    // served. The open watch must end so the router drops the old engine's blocks.
    await old.feed.close();
    const fresh = await engine();
    current = fresh.feed;
    await waitFor(() => picker.preciseIndex.match(["ra"], keys).size === 0);
    // …and reconnects to the new feed.
    await warm(fresh.pub, fresh.feed);
    await fresh.pub.publish([
      { type: "BlockStored", blockHashes: [7n], tokenIds: tokens.slice(0, 4), blockSize: BLOCK },
    ]);
    await waitFor(() => picker.preciseIndex.match(["ra"], keys).get("ra") === 1);
  });

  it("leaves no abort listener behind per retry while a replica's agent refuses the watch", async () => {
    // The watch's own signal reaches the transport; a router transport whose service always
    // fails stands in for an agent that is down.
    const signals = new Set<AbortSignal>();
    const refusing = createRouterTransport(({ service }) => {
      service(KvCacheService, {
        // biome-ignore lint/correctness/useYield: a watch that fails before its first message
        async *watchBlocks() {
          throw new ConnectError("agent down", Code.Unavailable);
        },
      });
    });
    const transportFor = (): Transport => ({
      unary: refusing.unary,
      stream: (method, signal, ...rest) => {
        if (signal !== undefined) signals.add(signal);
        return refusing.stream(method, signal, ...rest);
      },
    });
    const retries: unknown[] = [];
    const resolution: RouteResolution = {
      deployment: "d",
      policy: "llmgw",
      loading: false,
      tokenizer: "sim",
      replicas: [
        {
          id: "ra",
          baseUrl: "http://127.0.0.1:1",
          state: "ready",
          capacity: 8,
          kvEventsUrl: "http://agent.invalid",
        },
      ],
    };
    const watch = startKvWatch({
      routeTable: createStaticRouteTable({ m: resolution }),
      index: createReplicaPicker().preciseIndex,
      transportFor,
      retryMs: { min: 1, max: 1 },
      log: (e) => retries.push(e),
    });
    cleanups.push(() => watch.close());
    await waitFor(() => retries.length >= 30);
    expect(signals.size).toBe(1);
    const [signal] = [...signals] as [AbortSignal];
    // One listener at most: the retry wait in progress, or none between waits.
    expect(getEventListeners(signal, "abort").length).toBeLessThanOrEqual(1);
  });
});
