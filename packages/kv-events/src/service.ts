/**
 * `KvCacheService` (proto/llmgw/v1/kv.proto): routers watch a replica's {@link KvBlockFeed}.
 * A call needs the replica's engine API key as `Authorization: Bearer <key>`, compared in
 * constant time: the blocks a replica holds say something about other tenants' prompts, so only
 * whoever may call the engine may see them.
 *
 * A watcher gets the snapshot, then every update, then a keepalive (an empty delta at the
 * current version) every {@link KV_KEEPALIVE_MS} so it can tell a quiet engine from a dead
 * stream. A watcher that falls {@link MAX_PENDING_UPDATES} updates, or
 * {@link MAX_PENDING_KEYS} keys, behind is cut off (`ResourceExhausted`): it reconnects and
 * starts again from a snapshot, rather than the agent buffering without bound. A watch of a feed that is closed (its replica retired or
 * relaunched) ends with `Unavailable`: the watcher drops the replica's blocks and reconnects,
 * reaching the relaunched replica's new feed.
 */
import { timingSafeEqual } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type ServiceImpl } from "@connectrpc/connect";
import {
  type KvCacheService,
  type WatchBlocksResponse,
  WatchBlocksResponseSchema,
} from "@llmgw/proto";
import type { KvBlockFeed, KvFeedUpdate } from "./feed.js";

/** How often an idle watch gets a keepalive. */
export const KV_KEEPALIVE_MS = 5_000;
/** Updates queued for one watcher before it is cut off. */
export const MAX_PENDING_UPDATES = 10_000;
/**
 * Keys (added and removed) of the updates queued for one watcher before it is cut off: 32 MiB
 * of doubles, room for a snapshot of a full set (1,048,576 blocks by default) and more. One
 * batch's delta may carry a million keys, so counting updates alone let a watcher that stopped
 * reading pin gigabytes for as long as its connection stayed open.
 */
export const MAX_PENDING_KEYS = 4_194_304;

/** What the service serves: one feed and its engine key per replica id. */
export interface KvFeedRegistry {
  get(
    replicaId: string,
  ): { readonly feed: KvBlockFeed; readonly apiKey: string | undefined } | undefined;
}

function sameSecret(given: string, expected: string): boolean {
  const a = Buffer.from(given);
  const b = Buffer.from(expected);
  return a.length === b.length && timingSafeEqual(a, b);
}

const toProto = (u: KvFeedUpdate): WatchBlocksResponse =>
  create(WatchBlocksResponseSchema, {
    epoch: u.epoch,
    version: BigInt(u.version),
    snapshot: u.snapshot,
    added: [...u.added],
    removed: [...u.removed],
    blockSizeTokens: u.blockSizeTokens,
    stale: u.stale,
  });

/** The service implementation over `registry`. */
export function createKvCacheService(
  registry: KvFeedRegistry,
  options: { readonly keepaliveMs?: number } = {},
): ServiceImpl<typeof KvCacheService> {
  const keepaliveMs = options.keepaliveMs ?? KV_KEEPALIVE_MS;
  return {
    async *watchBlocks(req, ctx) {
      const entry = registry.get(req.replicaId);
      // Unknown replica and wrong key answer alike: the service does not say which ids exist.
      const header = ctx.requestHeader.get("authorization") ?? "";
      const given = header.startsWith("Bearer ") ? header.slice(7) : undefined;
      if (entry === undefined || given === undefined) {
        throw new ConnectError("a replica's engine key is required", Code.Unauthenticated);
      }
      if (entry.apiKey === undefined || !sameSecret(given, entry.apiKey)) {
        throw new ConnectError("a replica's engine key is required", Code.Unauthenticated);
      }
      const feedClosed = entry.feed.closedSignal;
      const closedError = (): ConnectError =>
        new ConnectError(
          "the replica's KV-event feed was closed; reconnect for its new feed",
          Code.Unavailable,
        );
      // A retired replica's feed may still be registered for a moment: serve none of it.
      if (feedClosed.aborted) throw closedError();
      const pending: KvFeedUpdate[] = [];
      /** Keys of `pending`'s updates. */
      let pendingKeys = 0;
      let wake: (() => void) | undefined;
      let overflow: string | undefined;
      const unsubscribe = entry.feed.subscribe((u) => {
        const keys = u.added.length + u.removed.length;
        if (pending.length >= MAX_PENDING_UPDATES) {
          overflow = `${MAX_PENDING_UPDATES} updates`;
        } else if (pendingKeys + keys > MAX_PENDING_KEYS) {
          overflow = `${MAX_PENDING_KEYS} keys`;
        } else {
          pending.push(u);
          pendingKeys += keys;
        }
        if (overflow !== undefined) {
          // It starts again from a snapshot: keep nothing for it, even if it never reads again.
          pending.length = 0;
          pendingKeys = 0;
          unsubscribe();
        }
        wake?.();
      });
      const onAbort = (): void => wake?.();
      ctx.signal.addEventListener("abort", onAbort);
      feedClosed.addEventListener("abort", onAbort);
      try {
        let last = entry.feed.snapshot();
        yield toProto(last);
        while (!ctx.signal.aborted) {
          if (feedClosed.aborted) throw closedError();
          if (overflow !== undefined) {
            throw new ConnectError(
              `watcher fell ${overflow} behind; reconnect for a snapshot`,
              Code.ResourceExhausted,
            );
          }
          if (pending.length === 0) {
            const timedOut = await new Promise<boolean>((resolve) => {
              const timer = setTimeout(() => resolve(true), keepaliveMs);
              wake = () => {
                clearTimeout(timer);
                resolve(false);
              };
            });
            wake = undefined;
            if (timedOut && pending.length === 0 && !ctx.signal.aborted && !feedClosed.aborted) {
              yield toProto({ ...last, snapshot: false, added: [], removed: [] });
            }
            continue;
          }
          const u = pending.shift() as KvFeedUpdate;
          pendingKeys -= u.added.length + u.removed.length;
          // Updates from before the snapshot was taken are already in it.
          if (u.epoch === last.epoch && !u.snapshot && u.version <= last.version) continue;
          last = u;
          yield toProto(u);
        }
      } finally {
        unsubscribe();
        ctx.signal.removeEventListener("abort", onAbort);
        feedClosed.removeEventListener("abort", onAbort);
      }
    },
  };
}
