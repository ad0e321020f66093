import { afterEach, describe, expect, it } from "vitest";
import { Publisher, Router, Subscriber } from "zeromq";
import { createReplicaBlockSet } from "../src/block-set.js";
import type { DecodedKvEventBatch } from "../src/decode.js";
import { encodeKvEventBatch } from "../src/encode.js";
import { createKvBlockFeed, type KvFeedUpdate } from "../src/feed.js";
import type { KvEvent } from "../src/kv-event.js";
import { createKvEventPublisher, type KvEventPublisher, seqFrame } from "../src/publisher.js";
import {
  createKvEventSubscriber,
  type KvEventSubscriber,
  type KvEventSubscriberOptions,
  type KvEventsResetReason,
} from "../src/subscriber.js";
import { tokenBlockKeys } from "../src/token-blocks.js";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

/** Polls `condition` until it holds (each poll yields to I/O), or fails after `ms`. */
async function waitFor(condition: () => boolean, what: string, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

async function publisher(options: Partial<Parameters<typeof createKvEventPublisher>[0]> = {}) {
  const pub = await createKvEventPublisher({
    endpoint: "tcp://127.0.0.1:0",
    topic: "kv@test",
    ...options,
  });
  cleanups.push(() => pub.close());
  return pub;
}

interface Recorded {
  sub: KvEventSubscriber;
  batches: { seq: bigint; batch: DecodedKvEventBatch }[];
  resets: KvEventsResetReason[];
  warnings: string[];
}

function subscribe(options: Partial<KvEventSubscriberOptions> & { endpoint: string }): Recorded {
  const rec: Omit<Recorded, "sub"> = { batches: [], resets: [], warnings: [] };
  const sub = createKvEventSubscriber({
    topic: "kv@test",
    onBatch: (batch, seq) => rec.batches.push({ seq, batch }),
    onReset: (reason) => rec.resets.push(reason),
    logger: { info: () => {}, warn: (m) => rec.warnings.push(m) },
    ...options,
  });
  cleanups.push(() => sub.close());
  return { ...rec, sub };
}

/** PUB→SUB drops messages until the subscription has propagated: publish empty batches until one arrives. */
async function join(pub: KvEventPublisher, rec: Recorded): Promise<void> {
  const before = rec.sub.stats().received;
  while (rec.sub.stats().received === before) {
    await pub.publish([]);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
  await waitFor(() => rec.sub.lastSeq === pub.nextSeq - 1n, "the join batches");
}

/** The frames of a batch of `events` at `seq`, as a publisher sends them. */
const batchFrames = (seq: bigint, events: KvEvent[], topic = "kv@test") => [
  topic,
  seqFrame(seq),
  encodeKvEventBatch({ ts: 1, events }, { encoding: "tagged" }),
];

/**
 * A lossy link: a SUB→PUB relay in front of a real publisher that drops the seqs `drop` says.
 * The replay endpoint stays the real publisher's.
 */
async function lossyRelay(upstream: string, drop: (seq: bigint) => boolean) {
  const inbound = new Subscriber({ linger: 0 });
  inbound.connect(upstream);
  inbound.subscribe();
  const outbound = new Publisher({ linger: 0 });
  await outbound.bind("tcp://127.0.0.1:*");
  let forwarded = 0;
  const loop = (async () => {
    try {
      for await (const frames of inbound) {
        if (drop((frames[1] as Buffer).readBigUInt64BE(0))) continue;
        await outbound.send(frames);
        forwarded++;
      }
    } catch {
      // closed
    }
  })();
  cleanups.push(async () => {
    inbound.close();
    outbound.close();
    await loop;
  });
  return {
    endpoint: outbound.lastEndpoint as string,
    forwarded: () => forwarded,
    /** Sends a batch at `seq` as if the publisher had, for seqs it would never send. */
    inject: (seq: bigint, events: KvEvent[]) => outbound.send(batchFrames(seq, events)),
  };
}

const BS = 4;
const TOKENS = Array.from({ length: 24 }, (_, i) => 500 + i);
const KEYS = [...tokenBlockKeys(TOKENS, BS)];
/** BlockStored of block i of TOKENS, engine hash 1000+i chained on 1000+i-1. */
function block(i: number): KvEvent {
  return {
    type: "BlockStored",
    blockHashes: [BigInt(1000 + i)],
    ...(i > 0 ? { parentBlockHash: BigInt(999 + i) } : {}),
    tokenIds: TOKENS.slice(i * BS, (i + 1) * BS),
    blockSize: BS,
    medium: "GPU",
  };
}

describe("KV-event subscriber over real ZMQ sockets", () => {
  it("applies batches in order; a block set fed by it holds what the engine stored", async () => {
    const pub = await publisher({ encoding: "positional" });
    expect(pub.endpoint).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+$/);
    const set = createReplicaBlockSet();
    const rec = subscribe({ endpoint: pub.endpoint });
    const sub = rec.sub;
    await join(pub, rec);
    const firstSeq = pub.nextSeq;
    const start = rec.batches.length;
    for (let i = 0; i < 6; i++) await pub.publish([block(i)]);
    await pub.publish([{ type: "BlockRemoved", blockHashes: [1005n], medium: "GPU" }]);
    await waitFor(() => sub.lastSeq === pub.nextSeq - 1n, "all batches");
    for (const { batch } of rec.batches.slice(start)) set.apply(batch);
    expect(rec.batches.slice(start).map((b) => b.seq)).toEqual(
      Array.from({ length: 7 }, (_, i) => firstSeq + BigInt(i)),
    );
    expect(set.snapshot().sort()).toEqual(KEYS.slice(0, 5).sort());
    expect(rec.resets).toEqual([]);
    expect(sub.stats()).toMatchObject({ gaps: 0, resets: 0, malformed: 0 });
  });

  it("closes a gap by replay from last (which must match what was applied), in order, and skips the live copies", async () => {
    const pub = await publisher({ replayEndpoint: "tcp://127.0.0.1:0", bufferSteps: 100 });
    expect(pub.replayEndpoint).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+$/);
    const lost = new Set<bigint>();
    const relay = await lossyRelay(pub.endpoint, (seq) => lost.has(seq));
    const rec = subscribe({
      endpoint: relay.endpoint,
      replayEndpoint: pub.replayEndpoint as string,
    });
    await join(pub, rec);
    const base = pub.nextSeq;
    lost.add(base + 1n).add(base + 2n);
    for (let i = 0; i < 6; i++) await pub.publish([block(i)]);
    await waitFor(() => rec.sub.lastSeq === pub.nextSeq - 1n, "the resync");
    const seqs = rec.batches.map((b) => b.seq).filter((s) => s >= base);
    expect(seqs).toEqual([0n, 1n, 2n, 3n, 4n, 5n].map((i) => base + i));
    const set = createReplicaBlockSet();
    for (const { batch, seq } of rec.batches) if (seq >= base) set.apply(batch);
    expect(set.snapshot().sort()).toEqual([...KEYS].sort());
    expect(rec.resets).toEqual([]);
    // The replay returns base onwards as far as the publisher had got (at least base+3, the
    // live message that showed the gap); base itself only proves the same engine sent it, and
    // live copies of replayed batches are skipped.
    const stats = rec.sub.stats();
    expect(stats).toMatchObject({ gaps: 1, resets: 0 });
    expect(stats.duplicates).toBe(stats.replayed - 3);
    expect(stats.replayed).toBeGreaterThanOrEqual(3);
  });

  it.each([
    ["no replay endpoint", false, 100],
    ["a replay buffer that no longer holds the gap", true, 1],
  ])(
    "resets on a gap with %s, and takes the live message as the new baseline",
    async (_n, withReplay, bufferSteps) => {
      const pub = await publisher(
        withReplay ? { replayEndpoint: "tcp://127.0.0.1:0", bufferSteps } : {},
      );
      const lost = new Set<bigint>();
      const relay = await lossyRelay(pub.endpoint, (seq) => lost.has(seq));
      const rec = subscribe({
        endpoint: relay.endpoint,
        ...(withReplay ? { replayEndpoint: pub.replayEndpoint as string } : {}),
      });
      await join(pub, rec);
      const base = pub.nextSeq;
      lost.add(base + 1n);
      for (let i = 0; i < 4; i++) await pub.publish([block(i)]);
      await waitFor(() => rec.sub.lastSeq === pub.nextSeq - 1n, "the last batch");
      expect(rec.resets).toEqual(["gap"]);
      expect(rec.batches.map((b) => b.seq).filter((s) => s >= base)).toEqual([
        base,
        base + 2n,
        base + 3n,
      ]);
      expect(rec.sub.stats()).toMatchObject({ gaps: 1, resets: 1, replayed: 0 });
    },
  );

  it.each([
    [
      "drips replies past the whole replay's deadline",
      "drip",
      400,
      "replay took longer than 400 ms",
    ],
    // A deadline the flood cannot reach even on a loaded machine: the byte bound must end it.
    ["sends more bytes than a replay may hold", "flood", 30_000, "replay exceeded 3000000 bytes"],
  ] as const)(
    "gives up on a replay socket that %s, and resets",
    async (_name, how, deadlineMs, warning) => {
      const pub = await publisher();
      const lost = new Set<bigint>();
      const relay = await lossyRelay(pub.endpoint, (seq) => lost.has(seq));
      // A hostile replay socket: every reply well within the per-reply timeout, but without end.
      const replaySocket = new Router({ linger: 0 });
      await replaySocket.bind("tcp://127.0.0.1:*");
      let sent = 0;
      const serving = (async () => {
        try {
          for await (const [client, , start] of replaySocket) {
            let seq = (start as Buffer).readBigUInt64BE(0);
            for (;;) {
              const payload =
                how === "flood"
                  ? Buffer.alloc(1_000_000)
                  : encodeKvEventBatch({ ts: 0, events: [] }, { encoding: "tagged" });
              await replaySocket.send([client as Buffer, "", seqFrame(seq++), payload]);
              sent++;
              if (how === "drip") await new Promise((resolve) => setTimeout(resolve, 50));
            }
          }
        } catch {
          // closed
        }
      })();
      cleanups.push(async () => {
        replaySocket.close();
        await serving;
      });
      const rec = subscribe({
        endpoint: relay.endpoint,
        replayEndpoint: replaySocket.lastEndpoint as string,
        replayTimeoutMs: how === "drip" ? 1000 : 10_000,
        replayDeadlineMs: deadlineMs,
        maxReplayBytes: 3_000_000,
      });
      await join(pub, rec);
      const base = pub.nextSeq;
      lost.add(base + 1n);
      const started = Date.now();
      for (let i = 0; i < 3; i++) await pub.publish([block(i)]);
      await waitFor(() => rec.resets.length === 1, "the reset");
      expect(rec.resets).toEqual(["gap"]);
      expect(rec.warnings).toContain(`kv-events: ${warning}`);
      expect(Date.now() - started).toBeLessThan(how === "drip" ? 5_000 : 20_000);
      await waitFor(() => rec.sub.lastSeq === pub.nextSeq - 1n, "the live batches after it");
      expect(rec.sub.stats()).toMatchObject({ gaps: 1, resets: 1, replayed: 0 });
      expect(sent).toBeGreaterThan(how === "flood" ? 3 : 4);
    },
  );

  it("resets with 'restart' when a new publisher on the same endpoint starts again from seq 0", async () => {
    const first = await publisher();
    const infos: string[] = [];
    const rec = subscribe({
      endpoint: first.endpoint,
      logger: { info: (m) => infos.push(m), warn: () => {} },
    });
    await join(first, rec);
    // Raise last well above what the new publisher will send while the SUB reconnects.
    while (first.nextSeq < 200n) await first.publish([block(0)]);
    await waitFor(() => rec.sub.lastSeq === 199n, "seq 199");
    await first.close();
    // The port is free once the closed socket's I/O thread lets go of it.
    let second: KvEventPublisher | undefined;
    while (!second) {
      second = await publisher({ endpoint: first.endpoint }).catch(() => undefined);
    }
    while (rec.resets.length === 0 && second.nextSeq < 150n) {
      await second.publish([]);
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    expect(rec.resets).toEqual(["restart"]);
    await waitFor(() => rec.sub.lastSeq === second.nextSeq - 1n, "the new publisher's batches");
    expect(rec.sub.stats().resets).toBe(1);
    // A lost peer: ZMQ connected again by itself (connecting anew would drop what it queued).
    expect(infos.filter((m) => m.includes("connecting again"))).toEqual([]);
  });

  it("resets with 'restart' when a restarted engine's first batches are lost and its replay socket offers the rest", async () => {
    // vLLM's seq starts again at 0 in a new process. If its first batches go out before the
    // SUB socket has reconnected, the first seq seen is past last + 1: it looks like a gap, and
    // the replay socket (the new process's) has batches for it. Only the batch at `last`, which
    // the old process sent, tells the two apart.
    const first = await publisher({ replayEndpoint: "tcp://127.0.0.1:0" });
    let dropThrough = -1n;
    const relay = await lossyRelay(first.endpoint, (seq) => seq <= dropThrough);
    const rec = subscribe({
      endpoint: relay.endpoint,
      replayEndpoint: first.replayEndpoint as string,
    });
    await join(first, rec);
    while (first.nextSeq < 20n) await first.publish([block(0)]);
    await waitFor(() => rec.sub.lastSeq === 19n, "seq 19");
    await first.close();
    // The relay loses the new process's seqs up to 20, as a reconnecting SUB socket would.
    dropThrough = 20n;
    let second: KvEventPublisher | undefined;
    while (!second) {
      second = await publisher({
        endpoint: first.endpoint,
        replayEndpoint: first.replayEndpoint as string,
      }).catch(() => undefined);
    }
    while (rec.resets.length === 0 && second.nextSeq < 500n) {
      await second.publish([]);
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    expect(rec.resets).toEqual(["restart"]);
    expect(rec.sub.stats()).toMatchObject({ gaps: 1, resets: 1, replayed: 0 });
    await waitFor(() => rec.sub.lastSeq === second.nextSeq - 1n, "the new publisher's batches");
  });

  it("counts and logs malformed messages and keeps going", async () => {
    const raw = new Publisher({ linger: 0 });
    await raw.bind("tcp://127.0.0.1:*");
    cleanups.push(() => raw.close());
    const rec = subscribe({ endpoint: raw.lastEndpoint as string, topic: "kv@a" });
    const good = (seq: bigint) => batchFrames(seq, [], "kv@a");
    let seq = 0n;
    while (rec.sub.stats().applied === 0) {
      await raw.send(good(seq++));
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    await waitFor(() => rec.sub.lastSeq === seq - 1n, "the join batches");
    const applied = rec.sub.stats().applied;
    await raw.send(["kv@a"]);
    await raw.send(["kv@a", Buffer.alloc(4), Buffer.alloc(1)]);
    await raw.send(["kv@a", seqFrame(seq), Buffer.alloc(1), Buffer.alloc(1)]);
    await raw.send(["kv@ab", ...good(seq).slice(1)]);
    await raw.send(["kv@a", seqFrame(seq++), Uint8Array.of(0xc1)]);
    await raw.send(good(seq++));
    await waitFor(() => rec.sub.lastSeq === seq - 1n, "the batch after the bad ones");
    expect(rec.sub.stats()).toMatchObject({ malformed: 5, applied: applied + 1, resets: 1 });
    expect(rec.resets).toEqual(["undecodable"]);
    expect(rec.warnings).toEqual([
      "kv-events: message of 1 frames, expected [topic, seq, payload]",
      "kv-events: seq frame of 4 bytes, expected 8",
      "kv-events: message of 4 frames, expected [topic, seq, payload]",
      'kv-events: message for topic "kv@ab"',
      `kv-events: undecodable payload at seq ${seq - 2n}: payload is not valid msgpack: Unrecognized type byte: 0xc1`,
    ]);
  });

  it("never takes in a frame over maxPayloadBytes: ZMQ drops the connection, and the lost message is a gap", async () => {
    const raw = new Publisher({ linger: 0 });
    await raw.bind("tcp://127.0.0.1:*");
    cleanups.push(() => raw.close());
    const infos: string[] = [];
    const rec = subscribe({
      endpoint: raw.lastEndpoint as string,
      topic: "kv@a",
      decodeLimits: { maxPayloadBytes: 1024 },
      logger: { info: (m) => infos.push(m), warn: () => {} },
    });
    const batch = (seq: bigint) => batchFrames(seq, [block(0)], "kv@a");
    let seq = 0n;
    while (rec.sub.stats().applied === 0) {
      await raw.send(batch(seq++));
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    await waitFor(() => rec.sub.lastSeq === seq - 1n, "the join batches");
    // 64 KiB of msgpack nil after the batch: a payload far over the bound.
    await raw.send(["kv@a", seqFrame(seq++), Buffer.alloc(64 * 1024, 0xc0)]);
    // The SUB socket reconnects; the publisher's messages meanwhile are lost too.
    const resumed = seq;
    while (rec.sub.lastSeq === undefined || rec.sub.lastSeq < resumed) {
      await raw.send(batch(seq++));
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    expect(rec.resets).toEqual(["gap"]);
    // The big one never arrived: read whole, it would be a malformed, undecodable message.
    expect(rec.sub.stats()).toMatchObject({ malformed: 0, gaps: 1 });
    // ZMQ never connects again after a protocol error: the subscriber did, once.
    expect(infos.filter((m) => m.includes("connecting again"))).toHaveLength(1);
  });

  it("keeps receiving when onBatch throws", async () => {
    const pub = await publisher();
    let calls = 0;
    const rec = subscribe({
      endpoint: pub.endpoint,
      onBatch: () => {
        calls++;
        throw new Error("owner bug");
      },
    });
    await join(pub, rec);
    const before = calls;
    await pub.publish([]);
    await waitFor(() => calls === before + 1, "the next batch");
    expect(rec.warnings).toContain("kv-events: onBatch threw");
  });

  it.each(["replayTimeoutMs", "maxReplayBatches", "replayDeadlineMs", "maxReplayBytes"])(
    "refuses a %s that is not a positive integer",
    (name) => {
      for (const bad of [0, 1.5]) {
        expect(() =>
          createKvEventSubscriber({
            endpoint: "tcp://127.0.0.1:1",
            onBatch: () => {},
            onReset: () => {},
            [name]: bad,
          }),
        ).toThrow(
          expect.objectContaining({
            code: "LLMGW_KV_EVENTS_INVALID_OPTIONS",
            message: `${name} must be a positive integer, got ${bad}`,
          }),
        );
      }
    },
  );

  it("refuses publish after close, and a bad bufferSteps", async () => {
    const pub = await publisher();
    await pub.close();
    await expect(pub.publish([])).rejects.toMatchObject({ code: "LLMGW_KV_EVENTS_CLOSED" });
    await expect(
      createKvEventPublisher({ endpoint: "tcp://127.0.0.1:0", bufferSteps: -1 }),
    ).rejects.toMatchObject({
      code: "LLMGW_KV_EVENTS_INVALID_OPTIONS",
      message: "bufferSteps must be a non-negative integer, got -1",
    });
    await expect(createKvEventPublisher({ endpoint: "nonsense" })).rejects.toMatchObject({
      code: "LLMGW_KV_EVENTS_SOCKET_FAILED",
    });
  });
});

describe("a feed told its engine was replaced", () => {
  /** A raw PUB, so each test picks the seqs a new engine process's first message carries. */
  async function rawPublisher() {
    const raw = new Publisher({ linger: 0 });
    await raw.bind("tcp://127.0.0.1:*");
    cleanups.push(() => raw.close());
    const send = (seq: bigint, events: KvEvent[]) => raw.send(batchFrames(seq, events));
    return { endpoint: raw.lastEndpoint as string, send };
  }

  /** A feed on `raw`, and the updates it emits. */
  function watchedFeed(raw: { endpoint: string }) {
    const feed = createKvBlockFeed({ endpoint: raw.endpoint, topic: "kv@test" });
    cleanups.push(() => feed.close());
    const updates: KvFeedUpdate[] = [];
    feed.subscribe((u) => updates.push(u));
    return { feed, updates };
  }

  it("drops the dead process's blocks at once and takes the new process's next seq as its baseline", async () => {
    const raw = await rawPublisher();
    const { feed, updates } = watchedFeed(raw);
    let seq = 0n;
    while (!feed.blocks.has(KEYS[0] as number)) {
      await raw.send(seq++, [block(0)]);
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    await raw.send(seq++, [block(1)]);
    await waitFor(() => feed.blocks.has(KEYS[1] as number), "block 1");
    const before = feed.stats();

    feed.engineReplaced();
    // Before the new process publishes anything: an empty set under a new epoch, announced.
    const after = feed.stats();
    expect(after.epoch).not.toBe(before.epoch);
    expect(after.resets).toBe(before.resets + 1);
    expect(feed.blocks.snapshot()).toEqual([]);
    expect(updates.at(-1)).toMatchObject({ epoch: after.epoch, snapshot: true, added: [] });

    // The new process's first batches were lost while the socket reconnected; its next seq is
    // past the old `last + 1`. Forgotten, the sequence takes it as the baseline: no gap reset.
    await raw.send(seq + 5n, [block(0)]);
    await waitFor(() => feed.blocks.has(KEYS[0] as number), "the new process's block");
    expect(feed.stats()).toMatchObject({ epoch: after.epoch, resets: after.resets });
    expect(feed.blocks.has(KEYS[1] as number)).toBe(false);
  });

  it("does nothing to a feed that has had no batch yet (an engine's first start)", async () => {
    const { feed, updates } = watchedFeed(await rawPublisher());
    const before = feed.stats();
    feed.engineReplaced();
    expect(feed.stats()).toEqual(before);
    expect(updates).toEqual([]);
  });
});

describe("a subscriber told to forget its sequence", () => {
  it("abandons a replay in progress with the message that opened it, and takes a lower seq as a new baseline, not a restart", async () => {
    const pub = await publisher({ replayEndpoint: "tcp://127.0.0.1:0" });
    // A replay endpoint that never answers: the gap's replay waits for its timeout.
    const silent = new Router({ linger: 0 });
    await silent.bind("tcp://127.0.0.1:*");
    cleanups.push(() => silent.close());
    let dropNext = false;
    const relay = await lossyRelay(pub.endpoint, () => {
      const drop = dropNext;
      dropNext = false;
      return drop;
    });
    const rec = subscribe({
      endpoint: relay.endpoint,
      replayEndpoint: silent.lastEndpoint as string,
      replayTimeoutMs: 60_000,
    });
    await join(pub, rec);
    dropNext = true;
    await pub.publish([block(0)]); // lost
    await pub.publish([block(0)]); // a gap: the replay starts and hangs
    await waitFor(() => rec.sub.stats().gaps === 1, "the gap");
    const applied = rec.batches.length;
    rec.sub.forgetSequence();
    // The message that opened the gap came before the owner's word: the replaced engine's,
    // dropped. The next one sets the baseline.
    await pub.publish([block(0)]);
    await waitFor(() => rec.sub.lastSeq === pub.nextSeq - 1n, "the next message as baseline");
    expect(rec.batches.slice(applied).map((b) => b.seq)).toEqual([pub.nextSeq - 1n]);
    expect(rec.resets).toEqual([]);
    expect(rec.sub.stats()).toMatchObject({ gaps: 1, resets: 0, replayed: 0 });

    // A new process starts again from seq 0: after forgetting, that is a baseline, no restart.
    rec.sub.forgetSequence();
    await relay.inject(0n, [block(0)]);
    await waitFor(() => rec.sub.lastSeq === 0n, "seq 0 as the baseline");
    expect(rec.resets).toEqual([]);
  });
});
