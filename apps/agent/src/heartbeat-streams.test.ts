import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { Cluster, openSqliteStore } from "@llmgw/control-plane";
import { createAgentServiceTransport } from "@llmgw/control-plane/testing";
import { simulateInventory } from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import { type HeartbeatResponse, ProblemSchema } from "@llmgw/proto";
import { schedule } from "@llmgw/scheduler";
import { ManualClock } from "@llmgw/supervisor/testing";
import { inventoryToProto } from "@llmgw/wire";
import { afterEach, describe, expect, it } from "vitest";
import { ControlChannel, MIN_HURRIED_BEAT_SPACING_MS } from "./control-channel.js";

/**
 * Heartbeats on `StreamHeartbeat` and desired sets from `WatchDesired`, against the control
 * plane's real AgentService and Cluster in memory; the heartbeat interval is a manual clock's
 * timer, so each beat happens when the test says.
 */

const JOIN = "join-token-0123456789abcdef";
const INTERVAL = 2_000;

const cleanups: (() => Promise<void> | void)[] = [];
const chat = parseDeploymentSpecOrThrow({
  name: "chat",
  engine: "sim",
  model: "org/model",
  gpuClass: "h100-80g",
});
/** `expect.poll` with room for a busy CI box. */
const poll = <T>(fn: () => T) => expect.poll(fn, { timeout: 5_000 });
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

async function start(options: { applyFailures?: number } = {}) {
  let applyFailures = options.applyFailures ?? 0;
  const stateDir = await mkdtemp(path.join(tmpdir(), "llmgw-heartbeat-streams-"));
  cleanups.push(() => rm(stateDir, { recursive: true, force: true }));
  const store = openSqliteStore({ file: path.join(stateDir, "control-plane.db") });
  cleanups.push(() => store.close());
  const clock = new ManualClock();
  const cluster = new Cluster({
    store,
    schedule,
    clock,
    heartbeatIntervalMs: INTERVAL,
    unreachableAfterMs: 3 * INTERVAL,
    nodeLostAfterMs: 10 * INTERVAL,
    rendezvousPortMin: 29_500,
    rendezvousPortMax: 29_999,
  });
  const calls: string[] = [];
  /** Set to cut every StreamHeartbeat request (a proxy or a control plane gone wrong). */
  const cut = { beatStreams: false };
  const recorder: Interceptor = (next) => async (req) => {
    calls.push(req.method.name);
    if (cut.beatStreams && req.method.name === "StreamHeartbeat") {
      throw new ConnectError("cut (test)", Code.Unavailable);
    }
    return next(req);
  };
  let beat = 0;
  const applied: HeartbeatResponse[] = [];
  const details: string[] = [];
  const channel = new ControlChannel(
    {
      controlPlaneUrl: "http://control-plane.test:7070",
      joinToken: JOIN,
      stateDir,
      advertiseAddress: "10.0.0.1",
      initialBackoffMs: 500,
      maxBackoffMs: 4_000,
      callTimeoutMs: 5_000,
      transport: createAgentServiceTransport(cluster, JOIN, {
        interceptors: [recorder],
        loadStreamMs: 20_000,
        heartbeatStreams: true,
      }),
      random: () => 0.5,
      clock,
    },
    {
      inventory: async () =>
        inventoryToProto(
          simulateInventory("1xh100-80g", { hostname: "node-a", addresses: ["10.0.0.1"] }),
        ),
      // Every snapshot carries its number (the first is Register's), so the test sees which
      // heartbeats the cluster took.
      snapshot: async () => ({
        gpus: [],
        replicas: [],
        problems: [create(ProblemSchema, { code: `beat-${++beat}`, source: "test" })],
      }),
      applyDesired: async (response) => {
        if (response.assignments.length > 0 && applyFailures > 0) {
          applyFailures--;
          throw new Error("disk full (test)");
        }
        applied.push(response);
      },
      onState: (_state, detail) => details.push(detail),
    },
  );
  const abort = new AbortController();
  const running = channel.run(abort.signal);
  cleanups.push(async () => {
    abort.abort();
    await running;
  });
  /** The code of the last heartbeat the cluster took from this node. */
  const lastBeat = () =>
    channel.nodeId === undefined ? undefined : cluster.getNode(channel.nodeId).problems[0]?.code;
  /** Resolves once the channel waits for its next beat. */
  const asleep = () => poll(() => clock.pending()).toBe(1);
  const count = (method: string) => calls.filter((c) => c === method).length;
  return { cluster, clock, channel, calls, count, applied, details, lastBeat, asleep, cut };
}

describe("heartbeat streams", () => {
  it("after one Heartbeat call, beats go on the stream and desired sets come on the watch", async () => {
    const h = await start();
    await h.asleep();
    expect(h.count("Heartbeat")).toBe(1);
    await poll(() => h.channel.heartbeatsStreamed).toBe(true);
    expect(h.count("WatchDesired")).toBe(1);
    for (const n of [3, 4, 5]) {
      h.clock.advance(INTERVAL);
      await poll(h.lastBeat).toBe(`beat-${n}`);
      await h.asleep();
    }
    // Three beats on one stream, no more calls.
    expect(h.count("Heartbeat")).toBe(1);
    expect(h.count("StreamHeartbeat")).toBe(1);
    // A new deployment reaches the agent without waiting for a beat.
    const before = h.applied.length;
    h.cluster.applyDeployment(chat);
    await poll(() => h.applied.length).toBe(before + 1);
    expect(h.applied.at(-1)?.assignments.map((a) => a.deployment?.name)).toEqual(["chat"]);
    expect(h.count("Heartbeat")).toBe(1);
    // The next beat tells the generation the watch delivered.
    h.clock.advance(INTERVAL);
    await poll(h.lastBeat).toBe("beat-6");
  });

  it("a new stream opens once the open one is as old as the control plane allows", async () => {
    const h = await start();
    await h.asleep();
    await poll(() => h.channel.heartbeatsStreamed).toBe(true);
    h.clock.advance(INTERVAL);
    await poll(h.lastBeat).toBe("beat-3");
    await h.asleep();
    // 20 s later (load_stream_ms), the beat ends the stream it would have used.
    h.clock.advance(20_000);
    await poll(h.lastBeat).toBe("beat-4");
    expect(h.count("StreamHeartbeat")).toBe(2);
    expect(h.count("Heartbeat")).toBe(1);
  });

  it("a revoked node's streams end, and it registers again and streams with its new credential", async () => {
    const h = await start();
    await h.asleep();
    await poll(() => h.channel.heartbeatsStreamed).toBe(true);
    const first = h.channel.nodeId as string;
    h.cluster.revokeNode(first);
    // The watch ends at once: the next beat is a call, refused, and the agent joins again.
    await poll(() => h.channel.heartbeatsStreamed).toBe(false);
    h.clock.advance(INTERVAL);
    await poll(() => h.channel.registrations).toBe(2);
    await poll(() => h.channel.heartbeatsStreamed).toBe(true);
    expect(h.details.some((d) => d.startsWith("desired-set watch ended:"))).toBe(true);
    await h.asleep();
    const calls = h.count("Heartbeat");
    h.clock.advance(INTERVAL);
    await poll(h.lastBeat).toMatch(/^beat-\d+$/);
    const now = h.lastBeat();
    h.clock.advance(INTERVAL);
    await poll(h.lastBeat).not.toBe(now);
    expect(h.count("Heartbeat")).toBe(calls);
  });

  it("a desired set the watch brought but that failed to apply comes again with the next beat, a call", async () => {
    const h = await start({ applyFailures: 1 });
    await h.asleep();
    await poll(() => h.channel.heartbeatsStreamed).toBe(true);
    h.cluster.applyDeployment(chat);
    await poll(() => h.details.some((d) => d.startsWith("cannot apply desired generation"))).toBe(
      true,
    );
    expect(h.applied.filter((r) => r.assignments.length > 0)).toEqual([]);
    h.clock.advance(INTERVAL);
    await poll(() => h.count("Heartbeat")).toBe(2);
    await poll(() => h.applied.at(-1)?.assignments.map((a) => a.deployment?.name)).toEqual([
      "chat",
    ]);
    // Applied: the beat after it goes on the stream again.
    await h.asleep();
    h.clock.advance(INTERVAL);
    await poll(h.lastBeat).toBe("beat-4");
    expect(h.count("Heartbeat")).toBe(2);
  });

  it("a heartbeat stream that fails sends the next beat as a call at once, then streams again", async () => {
    const h = await start();
    await h.asleep();
    await poll(() => h.channel.heartbeatsStreamed).toBe(true);
    h.cut.beatStreams = true;
    h.clock.advance(INTERVAL);
    await poll(() =>
      h.details.some((d) => d.startsWith("heartbeat stream failed: cut (test)")),
    ).toBe(true);
    // The hurried beat waits out the shortest spacing, then goes as a call: the cluster has it.
    await h.asleep();
    h.clock.advance(MIN_HURRIED_BEAT_SPACING_MS);
    await poll(() => h.count("Heartbeat")).toBe(2);
    await poll(h.lastBeat).toBe("beat-4");
    // Its answer opened a new watch; the stream is whole again, and so are the beats.
    h.cut.beatStreams = false;
    await poll(() => h.channel.heartbeatsStreamed).toBe(true);
    await h.asleep();
    h.clock.advance(INTERVAL);
    await poll(h.lastBeat).toBe("beat-5");
    expect(h.count("Heartbeat")).toBe(2);
  });
});
