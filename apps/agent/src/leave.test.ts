import { mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { create } from "@bufbuild/protobuf";
import {
  Code,
  ConnectError,
  type ConnectRouter,
  type HandlerContext,
  type ServiceImpl,
} from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { parseDeploymentSpecOrThrow } from "@llmgw/engines";
import {
  AgentService,
  HeartbeatResponseSchema,
  RegisterResponseSchema,
  type ReplicaAssignment,
  ReplicaAssignmentSchema,
  SetLeavingResponseSchema,
} from "@llmgw/proto";
import { RecordingLogger } from "@llmgw/supervisor/testing";
import { deploymentSpecToProto } from "@llmgw/wire";
import { afterEach, describe, expect, it } from "vitest";
import { parseAgentConfig } from "./config.js";
import { hasLeavingMarker, LEAVING_MARKER_FILE, writeLeavingMarker } from "./leaving-marker.js";
import { type RunningAgent, startAgent } from "./run.js";

/**
 * `llmgw agent --stop-engines` leaving the cluster before its engines stop, against a real
 * Connect server on loopback that serves what the agent calls (Register, Heartbeat,
 * SetLeaving) and whose desired set the test changes, with real supervised engine processes.
 */

const JOIN = "join-token-0123456789abcdef";
/** Heartbeats every 100 ms, so a changed desired set reaches the agent within a beat. */
const INTERVAL_MS = 100;

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

const assignment = (replicaId: string): ReplicaAssignment =>
  create(ReplicaAssignmentSchema, {
    replicaId,
    rank: 0,
    gpuIndices: [0],
    deployment: deploymentSpecToProto(
      parseDeploymentSpecOrThrow({ name: "m", model: "org/model", engine: "sim" }),
    ),
  });

/** How the service answers SetLeaving. */
type LeavingMode = "serve" | "unimplemented" | "unavailable";

/** A control plane that knows one node; the test sets its desired set and its answers. */
function leavingService() {
  let credential: string | undefined;
  const svc = {
    /** The node's desired set; each change bumps the generation. */
    assignments: [] as ReplicaAssignment[],
    generation: 1n,
    /** `replicas` of SetLeaving(true) answers. */
    placed: 1,
    leavingMode: "serve" as LeavingMode,
    /** Every SetLeaving that reached the service, answered or not: its `leaving`. */
    leavingCalls: [] as boolean[],
    heartbeats: 0,
    setDesired(assignments: ReplicaAssignment[]) {
      svc.assignments = assignments;
      svc.generation += 1n;
    },
  };
  const authorize = (ctx: HandlerContext) => {
    if (ctx.requestHeader.get("authorization") !== `Bearer ${credential}`) {
      throw new ConnectError("unknown node credential", Code.Unauthenticated);
    }
  };
  const impl: Partial<ServiceImpl<typeof AgentService>> = {
    register(_req, ctx) {
      if (ctx.requestHeader.get("authorization") !== `Bearer ${JOIN}`) {
        throw new ConnectError("join token required", Code.Unauthenticated);
      }
      credential = `node-credential-${Math.random()}`;
      return create(RegisterResponseSchema, {
        nodeId: "node-1",
        nodeCredential: credential,
        heartbeatIntervalMs: INTERVAL_MS,
      });
    },
    heartbeat(_req, ctx) {
      authorize(ctx);
      svc.heartbeats += 1;
      return create(HeartbeatResponseSchema, {
        generation: svc.generation,
        assignments: svc.assignments,
        heartbeatIntervalMs: INTERVAL_MS,
      });
    },
    setLeaving(req, ctx) {
      authorize(ctx);
      svc.leavingCalls.push(req.leaving);
      if (svc.leavingMode === "unimplemented") {
        throw new ConnectError("SetLeaving is not served", Code.Unimplemented);
      }
      if (svc.leavingMode === "unavailable") {
        throw new ConnectError("overloaded", Code.Unavailable);
      }
      return create(SetLeavingResponseSchema, { replicas: req.leaving ? svc.placed : 0 });
    },
  };
  return { svc, routes: (router: ConnectRouter) => router.service(AgentService, impl) };
}

async function listen(routes: (router: ConnectRouter) => void): Promise<Server> {
  const server = createServer(connectNodeAdapter({ routes }));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  cleanups.push(
    () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  );
  return server;
}

/**
 * An agent joined to a fresh {@link leavingService} on loopback, connected, with the given
 * desired set running (each replica's engine started). `stateDir` reuses a state dir.
 */
async function joinedAgent(
  options: {
    assignments?: ReplicaAssignment[];
    leaveTimeoutMs?: number;
    stateDir?: string;
    leavingMode?: LeavingMode;
  } = {},
) {
  const { svc, routes } = leavingService();
  svc.assignments = options.assignments ?? [];
  svc.leavingMode = options.leavingMode ?? "serve";
  const server = await listen(routes);
  const stateDir = options.stateDir ?? mkdtempSync(path.join(tmpdir(), "llmgw-leave-"));
  if (options.stateDir === undefined) {
    cleanups.push(() => rmSync(stateDir, { recursive: true, force: true }));
  }
  const logger = new RecordingLogger();
  const agent: RunningAgent = await startAgent(
    parseAgentConfig({
      controlPlaneUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
      joinToken: JOIN,
      stateDir,
      simulate: "1xh100-80g",
      nodeName: "node-a",
      advertiseAddress: "127.0.0.1",
      stopEngines: true,
      probeIntervalMs: 50,
      ...(options.leaveTimeoutMs === undefined ? {} : { leaveTimeoutMs: options.leaveTimeoutMs }),
      // A real engine process that serves nothing: readiness is not under test.
      engines: { simCommand: [process.execPath, "-e", "setInterval(() => {}, 1000)", "--"] },
    }),
    {
      logger,
      probes: { probe: async () => "ready", scrapeLoad: async () => ({}) },
      baseEnv: { PATH: process.env.PATH ?? "/usr/bin:/bin" },
      secretEnv: {},
      agentVersion: "0.0.0-test",
    },
  );
  cleanups.push(async () => {
    await agent.close({ stopEngines: true, leaveTimeoutMs: 0 });
  });
  await expect.poll(() => agent.channelState(), { timeout: 10_000 }).toBe("connected");
  const pids = () => agent.manager.statuses().map((s) => s.pid);
  await expect
    .poll(() => pids().filter((p) => p !== undefined && p > 0).length, { timeout: 10_000 })
    .toBe(svc.assignments.length);
  /** The leave's log lines, in order (the agent logs much else). */
  const leaveLines = () =>
    logger.lines
      .filter((l) => /leav|left the cluster|drain/.test(l.message))
      .map((l) => `${l.level} ${l.message}`);
  return { svc, server, agent, stateDir, logger, leaveLines, pids: pids() as number[] };
}

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

describe("an agent that stops its engines leaves the cluster first", () => {
  it("keeps its engines serving until the control plane's desired set holds none, then stops and records the leave", async () => {
    const h = await joinedAgent({ assignments: [assignment("m-0")] });
    const [enginePid] = h.pids as [number];
    let closed = false;
    const closing = h.agent.close({ stopEngines: true }).finally(() => {
      closed = true;
    });
    await expect.poll(() => h.svc.leavingCalls).toEqual([true]);
    // Draining: the engine keeps serving and the agent keeps heartbeating.
    const beats = h.svc.heartbeats;
    await expect.poll(() => h.svc.heartbeats).toBeGreaterThanOrEqual(beats + 3);
    expect([closed, alive(enginePid), await hasLeavingMarker(h.stateDir)]).toEqual([
      false,
      true,
      true,
    ]);

    // Replacement ready elsewhere and this replica drained: it leaves the node's desired set.
    h.svc.setDesired([]);
    const report = await closing;
    expect(report).toMatchObject({ outcome: "drained", replicasPlaced: 1, replicasLeft: 0 });
    expect(alive(enginePid)).toBe(false);
    expect(h.leaveLines()).toEqual([
      "info leaving the cluster: the control plane drains 1 replica(s) off this node before its engines stop (at most 600.0 s)",
      expect.stringMatching(/^info left the cluster in \d+\.\d s: every replica drained$/),
    ]);
    const marker = path.join(h.stateDir, LEAVING_MARKER_FILE);
    expect(statSync(marker).mode & 0o777).toBe(0o600);
  }, 30_000);

  it("leaves at once when the control plane has nothing placed on the node", async () => {
    const h = await joinedAgent();
    h.svc.placed = 0;
    expect(await h.agent.close({ stopEngines: true })).toMatchObject({
      outcome: "drained",
      replicasPlaced: 0,
    });
    expect(h.leaveLines()).toEqual([
      "info leaving the cluster: the control plane drains 0 replica(s) off this node before its engines stop (at most 600.0 s)",
      expect.stringMatching(/^info left the cluster in \d+\.\d s: nothing to drain$/),
    ]);
  }, 30_000);

  it("stops what is left after --leave-timeout", async () => {
    const h = await joinedAgent({ assignments: [assignment("m-0")], leaveTimeoutMs: 400 });
    const [enginePid] = h.pids as [number];
    const report = await h.agent.close({ stopEngines: true });
    expect(report).toMatchObject({ outcome: "timed-out", replicasPlaced: 1, replicasLeft: 1 });
    // Node fires a 400 ms timer on its own millisecond clock; Date.now() can read 399 ms of it.
    expect(report?.durationMs).toBeGreaterThanOrEqual(399);
    expect(alive(enginePid)).toBe(false);
    expect(h.leaveLines()).toEqual([
      "info leaving the cluster: the control plane drains 1 replica(s) off this node before its engines stop (at most 0.4 s)",
      expect.stringMatching(
        /^warn leave timed out after \d+\.\d s with 1 replica\(s\) still on this node; stopping them now$/,
      ),
    ]);
    // The control plane took the leave: the next start must end it.
    expect(await hasLeavingMarker(h.stateDir)).toBe(true);
  }, 30_000);

  it("stops at once when interrupted during the wait (a second signal)", async () => {
    const h = await joinedAgent({ assignments: [assignment("m-0")] });
    const [enginePid] = h.pids as [number];
    const interrupt = new AbortController();
    const closing = h.agent.close({ stopEngines: true, interrupt: interrupt.signal });
    await expect.poll(() => h.leaveLines().length).toBe(1);
    expect(alive(enginePid)).toBe(true);
    interrupt.abort();
    expect(await closing).toMatchObject({ outcome: "interrupted", replicasLeft: 1 });
    expect(alive(enginePid)).toBe(false);
    expect(h.leaveLines()[1]).toMatch(
      /^warn leave interrupted after \d+\.\d s \(asked to stop at once\) with 1 replica\(s\) still on this node; stopping them now$/,
    );
  }, 30_000);

  it.each([
    [
      "answers Unimplemented (an older control plane)",
      "unimplemented",
      "unsupported",
      "warn the control plane does not support leaving (SetLeaving is Unimplemented: an older version); stopping engines without draining them first",
    ],
    [
      "answers Unavailable",
      "unavailable",
      "not-asked",
      "warn cannot tell the control plane this node is leaving (Unavailable: overloaded); stopping engines without draining them first",
    ],
    [
      // Refused, or a kept-alive socket found closed (EPIPE, ECONNRESET): whichever comes first.
      "is gone",
      "gone",
      "not-asked",
      expect.stringMatching(
        /^warn cannot tell the control plane this node is leaving \((Internal|Unavailable|Unknown): .+\); stopping engines without draining them first$/,
      ),
    ],
  ] as const)(
    "stops engines as before, without waiting, when the control plane %s",
    async (_name, mode, outcome, line) => {
      const h = await joinedAgent({
        assignments: [assignment("m-0")],
        ...(mode === "gone" ? {} : { leavingMode: mode }),
      });
      const [enginePid] = h.pids as [number];
      if (mode === "gone") {
        h.server.closeAllConnections();
        await new Promise<void>((resolve) => h.server.close(() => resolve()));
      }
      const report = await h.agent.close({ stopEngines: true });
      expect(report?.outcome).toBe(outcome);
      expect(report?.replicasPlaced).toBeUndefined();
      expect(alive(enginePid)).toBe(false);
      expect(h.leaveLines()).toEqual([line]);
      expect(await hasLeavingMarker(h.stateDir)).toBe(false);
    },
    30_000,
  );

  it("does not leave with --leave-timeout 0", async () => {
    const h = await joinedAgent({ assignments: [assignment("m-0")], leaveTimeoutMs: 0 });
    expect(await h.agent.close({ stopEngines: true })).toEqual({
      outcome: "skipped",
      durationMs: 0,
    });
    expect(h.svc.leavingCalls).toEqual([]);
  }, 30_000);

  it("neither leaves nor stops engines when engines keep running", async () => {
    const h = await joinedAgent({ assignments: [assignment("m-0")] });
    const [enginePid] = h.pids as [number];
    expect(await h.agent.close({ stopEngines: false })).toBeUndefined();
    expect([h.svc.leavingCalls, alive(enginePid)]).toEqual([[], true]);
    // Adopted and stopped by the next agent (the cleanup), not left behind.
    const next = await joinedAgent({ stateDir: h.stateDir, assignments: [assignment("m-0")] });
    expect(next.pids).toEqual([enginePid]);
  }, 30_000);
});

describe("the next start ends the leave its marker records", () => {
  const withMarker = async () => {
    const stateDir = mkdtempSync(path.join(tmpdir(), "llmgw-leave-"));
    cleanups.push(() => rmSync(stateDir, { recursive: true, force: true }));
    await writeLeavingMarker(stateDir, { nodeId: "node-1", sinceUnixMs: 1 });
    return stateDir;
  };

  it("asks SetLeaving(false) once registered and heartbeating, then removes the marker", async () => {
    const h = await joinedAgent({ stateDir: await withMarker() });
    await expect.poll(() => hasLeavingMarker(h.stateDir)).toBe(false);
    expect(h.svc.leavingCalls).toEqual([false]);
    expect(h.leaveLines()).toEqual([
      "info the last agent left the cluster with its engines; the control plane takes this node back",
    ]);
  }, 30_000);

  it("retries after each heartbeat until the control plane takes it, logging the failure once", async () => {
    const h = await joinedAgent({ stateDir: await withMarker(), leavingMode: "unavailable" });
    await expect.poll(() => h.svc.leavingCalls.length).toBeGreaterThanOrEqual(3);
    expect(await hasLeavingMarker(h.stateDir)).toBe(true);
    h.svc.leavingMode = "serve";
    await expect.poll(() => hasLeavingMarker(h.stateDir)).toBe(false);
    const calls = h.svc.leavingCalls.length;
    expect(h.svc.leavingCalls).toEqual(Array(calls).fill(false));
    expect(h.leaveLines()).toEqual([
      "warn cannot end the leave the last agent began (Unavailable: overloaded); retrying after the next heartbeat",
      "info the last agent left the cluster with its engines; the control plane takes this node back",
    ]);
    // Done: later heartbeats ask nothing more.
    const beats = h.svc.heartbeats;
    await expect.poll(() => h.svc.heartbeats).toBeGreaterThanOrEqual(beats + 3);
    expect(h.svc.leavingCalls).toHaveLength(calls);
  }, 30_000);

  it("removes the marker when the control plane answers Unimplemented", async () => {
    const h = await joinedAgent({ stateDir: await withMarker(), leavingMode: "unimplemented" });
    await expect.poll(() => hasLeavingMarker(h.stateDir)).toBe(false);
    expect(h.svc.leavingCalls).toEqual([false]);
    expect(h.leaveLines()).toEqual([
      "info the last agent left the cluster with its engines, and this control plane does not support leaving (an older version): nothing to end",
    ]);
  }, 30_000);

  it("asks nothing when the state dir holds no marker, even a hand-made empty file counts", async () => {
    const h = await joinedAgent();
    const beats = h.svc.heartbeats;
    await expect.poll(() => h.svc.heartbeats).toBeGreaterThanOrEqual(beats + 3);
    expect(h.svc.leavingCalls).toEqual([]);
    // A marker torn to nothing still ends the leave at the next start.
    writeFileSync(path.join(h.stateDir, LEAVING_MARKER_FILE), "");
    await h.agent.close({ stopEngines: false });
    const next = await joinedAgent({ stateDir: h.stateDir });
    await expect.poll(() => hasLeavingMarker(next.stateDir)).toBe(false);
    expect(next.svc.leavingCalls).toEqual([false]);
  }, 30_000);
});
