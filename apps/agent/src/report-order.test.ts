import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { create } from "@bufbuild/protobuf";
import type { Interceptor } from "@connectrpc/connect";
import { Cluster, openSqliteStore } from "@llmgw/control-plane";
import { createAgentServiceTransport } from "@llmgw/control-plane/testing";
import { simulateInventory } from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import {
  type ReplicaAssignment,
  ReplicaState,
  ReplicaStatusSchema,
  type StreamHeartbeatRequest,
} from "@llmgw/proto";
import { schedule } from "@llmgw/scheduler";
import { ManualClock } from "@llmgw/supervisor/testing";
import { inventoryToProto } from "@llmgw/wire";
import { afterEach, describe, expect, it } from "vitest";
import { ControlChannel } from "./control-channel.js";

/**
 * The order in which the control plane takes one agent's heartbeats. Heartbeats travel on
 * more than one request (a `StreamHeartbeat` stream, the next stream once it is as old as the
 * control plane allows, a `Heartbeat` call when the stream backs up), so a heartbeat held up
 * on a slow connection can reach the control plane after a newer one. The real channel
 * against the real AgentService and Cluster in memory; the slow connection is an interceptor
 * that holds a stream's messages until the test lets them go, as a congested or briefly
 * partitioned TCP connection holds bytes it has already accepted.
 */

const JOIN = "join-token-0123456789abcdef";
const INTERVAL = 2_000;
const STREAM_MS = 20_000;

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});
const poll = <T>(fn: () => T) => expect.poll(fn, { timeout: 5_000 });

const chat = parseDeploymentSpecOrThrow({
  name: "chat",
  engine: "sim",
  model: "org/model",
  gpuClass: "h100-80g",
});

/**
 * Holds the messages of the `StreamHeartbeat` requests open at {@link strand} until
 * {@link release}, as a stalled TCP connection holds bytes it already took; requests opened
 * later flow.
 */
function slowStreams() {
  const open = new Set<{ gate: Promise<void> | undefined; release: () => void }>();
  /** Messages the control plane has taken, on every stream. */
  let taken = 0;
  async function* delayed(messages: AsyncIterable<StreamHeartbeatRequest>) {
    const entry = { gate: undefined as Promise<void> | undefined, release: () => {} };
    open.add(entry);
    try {
      for await (const message of messages) {
        if (entry.gate) await entry.gate;
        // Resumed when the handler asks for the next one: it has taken this one.
        yield message;
        taken += 1;
      }
    } finally {
      open.delete(entry);
    }
  }
  const interceptor: Interceptor = (next) => async (req) => {
    if (req.stream && req.method.name === "StreamHeartbeat") {
      return next({
        ...req,
        message: delayed(req.message as AsyncIterable<StreamHeartbeatRequest>),
      } as typeof req);
    }
    return next(req);
  };
  return {
    interceptor,
    strand() {
      for (const entry of open) {
        entry.gate ??= new Promise<void>((resolve) => {
          entry.release = () => {
            entry.gate = undefined;
            resolve();
          };
        });
      }
    },
    release() {
      for (const entry of open) entry.release();
    },
    taken: () => taken,
  };
}

async function start() {
  const stateDir = await mkdtemp(path.join(tmpdir(), "llmgw-report-order-"));
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
  const slow = slowStreams();
  const calls: string[] = [];
  const recorder: Interceptor = (next) => (req) => {
    calls.push(req.method.name);
    return next(req);
  };
  /** What the engines of the node are doing now, as the next snapshot reports it. */
  const engine = { state: ReplicaState.STARTING };
  let assignments: readonly ReplicaAssignment[] = [];
  let beat = 0;
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
        interceptors: [recorder, slow.interceptor],
        loadStreamMs: STREAM_MS,
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
      snapshot: async () => {
        beat += 1;
        return {
          gpus: [],
          problems: [],
          replicas: assignments.map((a) =>
            create(ReplicaStatusSchema, {
              replicaId: a.replicaId,
              rank: a.rank,
              state: engine.state,
              revision: a.deployment?.revision ?? 0n,
              message: `beat-${beat}`,
            }),
          ),
        };
      },
      applyDesired: async (response) => {
        assignments = response.assignments;
      },
    },
  );
  const abort = new AbortController();
  const running = channel.run(abort.signal);
  cleanups.push(async () => {
    slow.release();
    abort.abort();
    await running;
  });
  const asleep = () => poll(() => clock.pending()).toBe(1);
  /** The state the control plane shows for the one replica of `chat`. */
  const shown = () => cluster.listReplicas({ deployment: "chat" })[0]?.state;
  /** Sends the next beat now and waits until the channel sleeps again. */
  const nextBeat = async (ms = INTERVAL) => {
    clock.advance(ms);
    await asleep();
  };
  const count = (method: string) => calls.filter((c) => c === method).length;
  return { cluster, clock, channel, engine, slow, shown, nextBeat, asleep, count };
}

/** A node whose one replica of `chat` the control plane shows as starting, beats streamed. */
async function startingOnStreams() {
  const h = await start();
  h.cluster.applyDeployment(chat);
  await h.asleep();
  await poll(() => h.channel.heartbeatsStreamed).toBe(true);
  await h.nextBeat();
  await poll(h.shown).toBe("starting");
  return h;
}

describe("the order of one agent's heartbeats at the control plane", () => {
  it("a heartbeat sent as a call while the stream backs up is not undone by the older ones on it", async () => {
    const h = await startingOnStreams();
    const calls = h.count("Heartbeat");
    const taken = h.slow.taken();
    // The stream's connection stalls with two beats (starting) on it; the engine turns ready,
    // and that beat cannot queue behind them: it goes as a Heartbeat call.
    h.slow.strand();
    await h.nextBeat();
    await h.nextBeat();
    h.engine.state = ReplicaState.READY;
    await h.nextBeat();
    expect(h.count("Heartbeat")).toBe(calls + 1);
    expect(h.slow.taken()).toBe(taken);
    expect(h.shown()).toBe("ready");
    // The connection recovers: the two older beats arrive after the newer one.
    h.slow.release();
    await poll(h.slow.taken).toBe(taken + 2);
    expect(h.shown()).toBe("ready");
  });

  it("a heartbeat on the next stream is not undone by an older one still on the previous stream", async () => {
    const h = await startingOnStreams();
    const taken = h.slow.taken();
    h.slow.strand();
    await h.nextBeat();
    // The engine turns ready; by the next beat the stream is as old as the control plane
    // allows, so that beat goes on a new stream (this one is slow too until released).
    h.engine.state = ReplicaState.READY;
    h.clock.advance(STREAM_MS);
    await h.asleep();
    expect(h.count("StreamHeartbeat")).toBe(2);
    // Only the beat on the new stream got through.
    expect(h.slow.taken()).toBe(taken + 1);
    expect(h.shown()).toBe("ready");
    // The previous stream's connection recovers: its beat arrives after the newer one.
    h.slow.release();
    await poll(h.slow.taken).toBe(taken + 2);
    expect(h.shown()).toBe("ready");
  });
});
