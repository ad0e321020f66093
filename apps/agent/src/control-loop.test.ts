import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { Cluster, type ClusterStore, openSqliteStore } from "@llmgw/control-plane";
import { createAgentServiceTransport } from "@llmgw/control-plane/testing";
import { simulateInventory } from "@llmgw/discovery";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import type {
  HeartbeatRequest,
  HeartbeatResponse,
  RegisterRequest,
  RegisterResponse,
} from "@llmgw/proto";
import { schedule } from "@llmgw/scheduler";
import { ManualClock } from "@llmgw/supervisor/testing";
import { inventoryFromProto, inventoryToProto } from "@llmgw/wire";
import { afterEach, describe, expect, it } from "vitest";
import { type ChannelState, ControlChannel } from "./control-channel.js";
import { type NodeIdentity, saveIdentity } from "./identity.js";

/**
 * The agent's control loop against the control plane's real AgentService and Cluster (in
 * memory, over Connect's router transport, on a temp-dir SQLite store), with one manual clock
 * for both: every heartbeat interval and backoff is a timer the driver fires by hand, so each
 * row's trace records the exact waits, the calls the service saw, and what the agent applied.
 */

const URL = "http://control-plane.test:7070";
const JOIN = "join-token-0123456789abcdef";
const INTERVAL = 2_000;

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

/** What a row does while the channel sleeps; "wait" fires the pending timer. */
type Step = "wait" | ((h: Harness) => void);

interface Row {
  readonly name: string;
  /** Before the agent starts: the control plane's state and the agent's state dir. */
  readonly given?: (h: Harness) => Promise<void> | void;
  /** Jitter draws, used in turn (default: always 0.5, a factor of 1). */
  readonly random?: readonly number[];
  /** How many applyDesired calls reject before they succeed. */
  readonly applyFailures?: number;
  readonly steps: readonly Step[];
  /**
   * Everything in order: `register(asks X) → Y | ✗ CODE`, `heartbeat X seen=gN → gM | ✗ CODE`,
   * `apply gN (k)` / `apply gN ✗` (k assignments), `wait MS` (a timer the driver fired),
   * `state S` (each change), and last `asleep MS` (the timer the channel then waits on).
   */
  readonly trace: readonly string[];
  /** Details the channel reported with a state, each matched as a whole. */
  readonly details?: readonly (string | RegExp)[];
}

interface Harness {
  readonly cluster: Cluster;
  readonly clock: ManualClock;
  readonly stateDir: string;
  readonly trace: string[];
  readonly details: string[];
  readonly outage: { down: boolean; refuseHeartbeats: boolean };
  channel: ControlChannel;
  /** A stable label (A, B, …) for a node id. */
  node(id: string): string;
  /** The node id behind a label. */
  idOf(label: string): string;
  saveIdentity(identity: Omit<NodeIdentity, "controlPlaneUrl">): Promise<void>;
}

const inventory = (hostname = "node-a") =>
  inventoryToProto(simulateInventory("1xh100-80g", { hostname, addresses: ["10.0.0.1"] }));

const errorCode = (error: unknown) => {
  const err = ConnectError.from(error);
  return err.metadata.get("llmgw-error-code") ?? Code[err.code];
};

async function harness(row: Row): Promise<Harness> {
  const stateDir = await mkdtemp(path.join(tmpdir(), "llmgw-control-loop-"));
  const store: ClusterStore = openSqliteStore({ file: path.join(stateDir, "control-plane.db") });
  cleanups.push(() => rm(stateDir, { recursive: true, force: true }));
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
  const labels = new Map<string, string>();
  const generations = new Map<bigint, string>([[0n, "g0"]]);
  const node = (id: string) => {
    if (!labels.has(id)) labels.set(id, String.fromCharCode(65 + labels.size));
    return labels.get(id) as string;
  };
  const gen = (g: bigint) => {
    if (!generations.has(g)) generations.set(g, `g${generations.size}`);
    return generations.get(g) as string;
  };
  const trace: string[] = [];
  const outage = { down: false, refuseHeartbeats: false };
  // The credential the last good Register issued: every heartbeat must present it.
  let issued: string | undefined;
  const recorder: Interceptor = (next) => async (req) => {
    const auth = req.header.get("authorization");
    if (req.method.name === "Register") {
      const message = req.message as RegisterRequest;
      expect(auth, "Register carries the join token").toBe(`Bearer ${JOIN}`);
      const line = `register(asks ${message.previousNodeId ? node(message.previousNodeId) : "-"})`;
      try {
        if (outage.down) throw new ConnectError("control plane down (test)", Code.Unavailable);
        const res = await next(req);
        const answer = res.message as RegisterResponse;
        issued = answer.nodeCredential;
        trace.push(`${line} → ${node(answer.nodeId)}`);
        return res;
      } catch (error) {
        trace.push(`${line} ✗ ${errorCode(error)}`);
        throw error;
      }
    }
    const message = req.message as HeartbeatRequest;
    expect(message.sentAtUnixMs, "sentAtUnixMs is the injected clock's").toBe(BigInt(clock.now()));
    if (issued !== undefined) expect(auth).toBe(`Bearer ${issued}`);
    const line = `heartbeat ${node(message.nodeId)} seen=${gen(message.generationSeen)}`;
    try {
      if (outage.down) throw new ConnectError("control plane down (test)", Code.Unavailable);
      if (outage.refuseHeartbeats) throw new ConnectError("refused (test)", Code.Unauthenticated);
      const res = await next(req);
      trace.push(`${line} → ${gen((res.message as HeartbeatResponse).generation)}`);
      return res;
    } catch (error) {
      trace.push(`${line} ✗ ${errorCode(error)}`);
      throw error;
    }
  };
  const draws = [...(row.random ?? [])];
  let applyFailures = row.applyFailures ?? 0;
  let lastState: ChannelState = "registering";
  const details: string[] = [];
  const h: Harness = {
    cluster,
    clock,
    stateDir,
    trace,
    details,
    outage,
    node,
    idOf: (label) => [...labels].find(([, l]) => l === label)?.[0] ?? "",
    saveIdentity: (identity) => saveIdentity(stateDir, { ...identity, controlPlaneUrl: URL }),
    channel: new ControlChannel(
      {
        controlPlaneUrl: URL,
        joinToken: JOIN,
        stateDir,
        advertiseAddress: "10.0.0.1",
        initialBackoffMs: 500,
        maxBackoffMs: 4_000,
        callTimeoutMs: 5_000,
        transport: createAgentServiceTransport(cluster, JOIN, { interceptors: [recorder] }),
        random: () => draws.shift() ?? 0.5,
        clock,
      },
      {
        inventory: async () => inventory(),
        snapshot: async () => ({ gpus: [], replicas: [], problems: [] }),
        applyDesired: async (response) => {
          const what = `apply ${gen(response.generation)}`;
          if (applyFailures > 0) {
            applyFailures--;
            trace.push(`${what} ✗`);
            throw new Error("disk full (test)");
          }
          trace.push(`${what} (${response.assignments.length})`);
        },
        onState: (state, detail) => {
          details.push(detail);
          if (state !== lastState) trace.push(`state ${state}`);
          lastState = state;
        },
      },
    ),
  };
  return h;
}

/** Resolves once the channel waits on a timer (the only timer on the clock), with its delay. */
async function asleep(clock: ManualClock): Promise<number> {
  const deadline = Date.now() + 5_000;
  while (clock.pending() !== 1) {
    if (Date.now() > deadline) throw new Error(`the channel never slept (${clock.pending()})`);
    await new Promise((resolve) => setImmediate(resolve));
  }
  return clock.nextDelayMs() as number;
}

const deployment = parseDeploymentSpecOrThrow({
  name: "chat",
  engine: "sim",
  model: "org/model",
  gpuClass: "h100-80g",
});

const rows: Row[] = [
  {
    name: "joins with the join token, then heartbeats every interval with the node credential",
    steps: ["wait", "wait"],
    trace: [
      "register(asks -) → A",
      "heartbeat A seen=g0 → g1",
      "state connected",
      "apply g1 (0)",
      "wait 2000",
      "heartbeat A seen=g1 → g1",
      "wait 2000",
      "heartbeat A seen=g1 → g1",
      "asleep 2000",
    ],
  },
  {
    name: "applies each new generation once, not again with every heartbeat",
    steps: ["wait", (h) => void h.cluster.applyDeployment(deployment), "wait", "wait"],
    trace: [
      "register(asks -) → A",
      "heartbeat A seen=g0 → g1",
      "state connected",
      "apply g1 (0)",
      "wait 2000",
      "heartbeat A seen=g1 → g1",
      "wait 2000",
      "heartbeat A seen=g1 → g2",
      "apply g2 (1)",
      "wait 2000",
      "heartbeat A seen=g2 → g2",
      "asleep 2000",
    ],
  },
  {
    name: "a desired set it failed to apply is applied again after the next heartbeat",
    applyFailures: 1,
    steps: ["wait", "wait"],
    trace: [
      "register(asks -) → A",
      "heartbeat A seen=g0 → g1",
      "state connected",
      "apply g1 ✗",
      "wait 2000",
      "heartbeat A seen=g0 → g1",
      "apply g1 (0)",
      "wait 2000",
      "heartbeat A seen=g1 → g1",
      "asleep 2000",
    ],
    details: [
      "cannot apply desired generation 1700000000000: disk full (test); retrying after the next heartbeat",
    ],
  },
  {
    name: "revoked: registers again at once with the join token, asking for its old id",
    steps: [(h) => h.cluster.revokeNode(h.idOf("A")), "wait"],
    trace: [
      "register(asks -) → A",
      "heartbeat A seen=g0 → g1",
      "state connected",
      "apply g1 (0)",
      "wait 2000",
      "heartbeat A seen=g1 ✗ LLMGW_CONTROL_PLANE_NODE_REVOKED",
      "state registering",
      // The control plane gives a revoked id out never again; the agent takes the new one
      // and applies its first desired set whatever its generation.
      "register(asks A) → B",
      "heartbeat B seen=g0 → g2",
      "state connected",
      "apply g2 (0)",
      "asleep 2000",
    ],
    details: [
      /^control plane refused the node credential: node \S+ was revoked by an operator; register again with the join token$/,
    ],
  },
  {
    name: "unknown to the control plane (its data dir lost): registers again asking for the saved id",
    given: (h) => h.saveIdentity({ nodeId: "node-a-0ld1d0", credential: "llmgw-node-old" }),
    steps: ["wait"],
    trace: [
      "heartbeat A seen=g0 ✗ LLMGW_CONTROL_PLANE_NODE_UNKNOWN",
      "register(asks A) → B",
      "heartbeat B seen=g0 → g1",
      "state connected",
      "apply g1 (0)",
      "wait 2000",
      "heartbeat B seen=g1 → g1",
      "asleep 2000",
    ],
  },
  {
    name: "NODE_ID_TAKEN: backs off doubling to 4 s, applies nothing (engines keep running), keeps the id after a reset",
    given: async (h) => {
      // The control plane holds node-a with a credential this agent no longer has.
      const held = h.cluster.register({
        inventory: inventoryFromProto(inventory()),
        advertiseAddress: "10.0.0.1",
        replicas: [],
      });
      await h.saveIdentity({ nodeId: held.nodeId, credential: "llmgw-node-stale" });
    },
    steps: [
      "wait",
      "wait",
      "wait",
      "wait",
      "wait",
      (h) => h.cluster.resetNode(h.idOf("A")),
      "wait",
    ],
    trace: [
      "heartbeat A seen=g0 ✗ LLMGW_CONTROL_PLANE_UNAUTHENTICATED",
      "register(asks A) ✗ LLMGW_CONTROL_PLANE_NODE_ID_TAKEN",
      "wait 500",
      "register(asks A) ✗ LLMGW_CONTROL_PLANE_NODE_ID_TAKEN",
      "wait 1000",
      "register(asks A) ✗ LLMGW_CONTROL_PLANE_NODE_ID_TAKEN",
      "wait 2000",
      "register(asks A) ✗ LLMGW_CONTROL_PLANE_NODE_ID_TAKEN",
      "wait 4000",
      "register(asks A) ✗ LLMGW_CONTROL_PLANE_NODE_ID_TAKEN",
      "wait 4000",
      "register(asks A) ✗ LLMGW_CONTROL_PLANE_NODE_ID_TAKEN",
      "wait 4000",
      "register(asks A) → A",
      "heartbeat A seen=g0 → g1",
      "state connected",
      "apply g1 (0)",
      "asleep 2000",
    ],
    details: [
      /^the control plane refused to re-join this node \(LLMGW_CONTROL_PLANE_NODE_ID_TAKEN\): node \S+ is registered; re-joining it needs its node credential, or an operator's `llmgw nodes reset \S+`\. Engines keep running; retrying with backoff \(at most every 4 s\)$/,
    ],
  },
  {
    name: "unavailable: jittered backoff doubling, never over 4 s, reset by a good heartbeat",
    // Factors 0.5 + draw: 0.5, 1.25, 1, 1.499 (capped), 0.75, 1; then 0.5 after recovery.
    random: [0, 0.75, 0.5, 0.999, 0.25, 0.5, 0],
    steps: [
      (h) => {
        h.outage.down = true;
      },
      "wait",
      "wait",
      "wait",
      "wait",
      "wait",
      "wait",
      (h) => {
        h.outage.down = false;
      },
      "wait",
      (h) => {
        h.outage.down = true;
      },
      "wait",
    ],
    trace: [
      "register(asks -) → A",
      "heartbeat A seen=g0 → g1",
      "state connected",
      "apply g1 (0)",
      "wait 2000",
      "heartbeat A seen=g1 ✗ Unavailable",
      "state reconnecting",
      "wait 250",
      "heartbeat A seen=g1 ✗ Unavailable",
      "wait 1250",
      "heartbeat A seen=g1 ✗ Unavailable",
      "wait 2000",
      "heartbeat A seen=g1 ✗ Unavailable",
      "wait 4000",
      "heartbeat A seen=g1 ✗ Unavailable",
      "wait 3000",
      "heartbeat A seen=g1 ✗ Unavailable",
      "wait 4000",
      "heartbeat A seen=g1 → g1",
      "state connected",
      "wait 2000",
      "heartbeat A seen=g1 ✗ Unavailable",
      "state reconnecting",
      "asleep 250",
    ],
    details: [`cannot reach the control plane at ${URL}: control plane down (test)`],
  },
  {
    name: "a credential refused right after its Register waits out the backoff (no tight loop)",
    steps: [
      (h) => {
        h.outage.refuseHeartbeats = true;
      },
      "wait",
      "wait",
    ],
    trace: [
      "register(asks -) → A",
      "heartbeat A seen=g0 → g1",
      "state connected",
      "apply g1 (0)",
      "wait 2000",
      "heartbeat A seen=g1 ✗ Unauthenticated",
      "state registering",
      "register(asks A) → A",
      "heartbeat A seen=g0 ✗ Unauthenticated",
      "wait 500",
      "register(asks A) → A",
      "heartbeat A seen=g0 ✗ Unauthenticated",
      "asleep 1000",
    ],
  },
  {
    name: "beatSoon: the next heartbeat goes at once, a burst coalesces, the interval starts over",
    steps: [
      (h) => {
        h.clock.advance(500);
        h.channel.beatSoon();
        h.channel.beatSoon();
      },
    ],
    trace: [
      "register(asks -) → A",
      "heartbeat A seen=g0 → g1",
      "state connected",
      "apply g1 (0)",
      "heartbeat A seen=g1 → g1",
      "asleep 2000",
    ],
  },
  {
    name: "beatSoon right after a heartbeat waits out the 250 ms spacing from that heartbeat's start",
    steps: [(h) => h.channel.beatSoon(), "wait"],
    trace: [
      "register(asks -) → A",
      "heartbeat A seen=g0 → g1",
      "state connected",
      "apply g1 (0)",
      "wait 250",
      "heartbeat A seen=g1 → g1",
      "asleep 2000",
    ],
  },
  {
    name: "ten beatSoon calls within 100 ms: one heartbeat 250 ms after the last (at most two in the next 300 ms)",
    steps: [
      ...Array.from(
        { length: 10 },
        (): Step => (h) => {
          h.clock.advance(10);
          h.channel.beatSoon();
        },
      ),
      "wait",
    ],
    trace: [
      "register(asks -) → A",
      "heartbeat A seen=g0 → g1",
      "state connected",
      "apply g1 (0)",
      // The first call came at +10 ms and the last at +100 ms; all ride on the beat at +250.
      "wait 150",
      "heartbeat A seen=g1 → g1",
      "asleep 2000",
    ],
  },
  {
    name: "beatSoon while reconnecting keeps the backoff; the first heartbeat through carries the news",
    steps: [
      (h) => {
        h.outage.down = true;
      },
      "wait",
      (h) => h.channel.beatSoon(),
      (h) => {
        h.outage.down = false;
      },
      "wait",
    ],
    trace: [
      "register(asks -) → A",
      "heartbeat A seen=g0 → g1",
      "state connected",
      "apply g1 (0)",
      "wait 2000",
      "heartbeat A seen=g1 ✗ Unavailable",
      "state reconnecting",
      "wait 500",
      "heartbeat A seen=g1 → g1",
      "state connected",
      "asleep 2000",
    ],
  },
];

describe("the agent's control loop against the real AgentService", () => {
  it.each(rows)("$name", async (row) => {
    const h = await harness(row);
    await row.given?.(h);
    const abort = new AbortController();
    const running = h.channel.run(abort.signal);
    cleanups.push(async () => {
      abort.abort();
      await running;
    });
    for (const step of row.steps) {
      const delay = await asleep(h.clock);
      if (step === "wait") {
        h.trace.push(`wait ${delay}`);
        h.clock.advance(delay);
      } else {
        step(h);
      }
    }
    h.trace.push(`asleep ${await asleep(h.clock)}`);
    expect(h.trace).toEqual(row.trace);
    for (const detail of row.details ?? []) {
      expect(h.details).toContainEqual(
        typeof detail === "string" ? detail : expect.stringMatching(detail),
      );
    }
    abort.abort();
    await running;
    expect(h.channel.state).toBe("stopped");
  });
});
