/**
 * Routers and the control plane on loopback: a real control listener streaming WatchRouting to
 * a raw Connect client and to a real `llmgw router` (`startRouter` with `controlPlanes`),
 * alongside the control plane's own in-process router.
 */
import { statSync } from "node:fs";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import {
  DeploymentSchema,
  Engine,
  ReplicaState,
  RouterService,
  type WatchRoutingResponse,
} from "@llmgw/proto";
import type { RoutingMessage } from "@llmgw/router";
import { type RunningRouter, startRouter } from "@llmgw/router-server";
import { routingMessageFromProto } from "@llmgw/wire";
import { afterEach, describe, expect, it } from "vitest";
import type { ControlPlaneOptions } from "../src/config.js";
import { type ControlPlane, startControlPlane } from "../src/run.js";
import { adminClient, eventually, simAgent, tempDir } from "./helpers.js";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const fn of cleanups.splice(0).reverse()) await fn();
});

async function controlPlane(options: Partial<ControlPlaneOptions> = {}): Promise<ControlPlane> {
  const tmp = tempDir("llmgw-routers-");
  cleanups.push(tmp.cleanup);
  const cp = await startControlPlane({
    dataDir: tmp.dir,
    listen: "127.0.0.1:0",
    controlListen: "127.0.0.1:0",
    shutdownGraceMs: 1_000,
    routingKeepaliveMs: 200,
    ...options,
  });
  cleanups.push(() => cp.close().then(() => {}));
  return cp;
}

/** A raw WatchRouting stream over the control listener (HTTP/1.1, as a router may dial it). */
function watch(cp: ControlPlane, routerId: string, token = cp.routerToken, json = false) {
  const abort = new AbortController();
  cleanups.push(() => abort.abort());
  const client = createClient(
    RouterService,
    createConnectTransport({
      httpVersion: "1.1",
      baseUrl: cp.controlUrl,
      useBinaryFormat: !json,
    }),
  );
  const received: RoutingMessage[] = [];
  const done = (async () => {
    try {
      for await (const res of client.watchRouting(
        { routerId, address: "127.0.0.1:9999", version: "0.1.0" },
        { headers: { authorization: `Bearer ${token}` }, signal: abort.signal },
      )) {
        received.push(routingMessageFromProto(res as WatchRoutingResponse));
      }
      return undefined;
    } catch (error) {
      return ConnectError.from(error);
    }
  })();
  return { received, done };
}

const lastRouters = (ms: readonly RoutingMessage[]) => {
  let n: number | undefined;
  for (const m of ms) {
    if (m.kind === "snapshot") n = m.routers;
    if (m.kind === "delta" && m.routers !== undefined) n = m.routers;
  }
  return n;
};

describe("routers", () => {
  it("streams to a remote router beside the in-process one: both counted, both listed", async () => {
    const cp = await controlPlane();
    const admin = adminClient(cp, cp.adminToken);
    expect(cp.publicUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    const a = watch(cp, "router-a");
    await eventually(() => (lastRouters(a.received) === 2 ? true : undefined));
    expect(a.received[0]).toMatchObject({ kind: "snapshot", epoch: cp.routing.epoch });

    const { routers } = await admin.listRouters({});
    expect(
      routers.map((r) => ({
        id: r.id,
        connected: r.connected,
        inProcess: r.inProcess,
        epoch: r.epoch,
      })),
    ).toEqual([
      { id: "in-process", connected: true, inProcess: true, epoch: cp.routing.epoch },
      { id: "router-a", connected: true, inProcess: false, epoch: cp.routing.epoch },
    ]);
    expect(routers[0]?.address).toBe(new URL(cp.publicUrl as string).host);
    const metrics = await (await fetch(`${cp.controlUrl}/metrics`)).text();
    expect(metrics).toContain('llmgw_routers{state="connected"} 2');
    // The in-process router takes its share too.
    await eventually(() => (cp.router?.runtime.state.routers === 2 ? true : undefined));

    // A quiet stream carries keepalives: one right after the snapshot, then more while
    // nothing else happens.
    await eventually(() =>
      a.received.filter((m) => m.kind === "keepalive").length >= 2 ? true : undefined,
    );
  });

  it("streams the same messages to a JSON client as to a binary one", async () => {
    const cp = await controlPlane();
    const admin = adminClient(cp, cp.adminToken);
    await admin.createApiKey({ name: "team-a" });
    await eventually(() => (cp.routing.version >= 2 ? true : undefined));
    const binary = watch(cp, "router-a");
    const json = watch(cp, "router-j", cp.routerToken, true);
    for (const s of [binary, json])
      await eventually(() => (s.received.length > 0 ? true : undefined));
    expect(json.received[0]).toMatchObject({ kind: "snapshot", keys: [{ name: "team-a" }] });
    expect({ ...json.received[0], routers: 0, sentAtMs: 0 }).toEqual({
      ...binary.received[0],
      routers: 0,
      sentAtMs: 0,
    });
  });

  it("refuses the join and admin tokens on the real listener", async () => {
    const cp = await controlPlane();
    for (const token of [cp.joinToken, cp.adminToken]) {
      const error = await watch(cp, "router-a", token).done;
      expect(error?.code).toBe(Code.Unauthenticated);
      expect(error?.rawMessage).toBe(
        "wrong token; this call needs the router token (llmgw control-plane token --router; LLMGW_ROUTER_TOKEN)",
      );
    }
  });

  it("gets a new deployment and a revoked key to a real llmgw router and the in-process one", async () => {
    const cp = await controlPlane({ routingCoalesceMs: 10 });
    const admin = adminClient(cp, cp.adminToken);
    const stateDir = tempDir("llmgw-routers-state-");
    cleanups.push(stateDir.cleanup);
    const remote: RunningRouter = await startRouter({
      routing: {
        controlPlanes: [cp.controlUrl],
        routerToken: cp.routerToken,
        routerId: "router-b",
        version: "0.1.0",
        stateDir: stateDir.dir,
      },
    });
    cleanups.push(() => remote.close(0));
    await eventually(() => (remote.runtime.readiness().ready ? true : undefined));

    const agent = simAgent(cp, "node-a", "1xh100-80g");
    await agent.register();
    await admin.applyDeployment({
      deployment: create(DeploymentSchema, {
        name: "chat",
        model: "sim/m",
        servedModelName: "org/chat",
        engine: Engine.SIM,
        gpuClass: "h100-80g",
        replicas: 1,
      }),
    });
    await agent.heartbeat();
    const [assignment] = agent.assignments;
    if (!assignment) throw new Error("no assignment");
    agent.report(assignment.replicaId, 0, { state: ReplicaState.READY, apiPort: 41_000 });
    const { key } = await admin.createApiKey({ name: "team-a" });
    const started = performance.now();
    await agent.heartbeat();
    for (const state of [remote.runtime.state, cp.router?.runtime.state]) {
      await eventually(() =>
        state?.routeTable.resolve("org/chat")?.replicas.length === 1 ? true : undefined,
      );
    }
    expect(performance.now() - started).toBeLessThan(1_000);
    expect(remote.runtime.state.routeTable.resolve("org/chat")?.replicas[0]).toMatchObject({
      id: assignment.replicaId,
      baseUrl: "http://127.0.0.1:41000",
    });
    expect(remote.runtime.state.routers).toBe(2);

    const holds = (state: typeof remote.runtime.state | undefined) =>
      state?.snapshot()?.keys.some((k) => k.id === key?.id) === true;
    expect(holds(remote.runtime.state)).toBe(true);
    const revokedAt = performance.now();
    await admin.revokeApiKey({ key: key?.id ?? "" });
    for (const state of [remote.runtime.state, cp.router?.runtime.state]) {
      await eventually(() => (holds(state) ? undefined : true));
    }
    expect(performance.now() - revokedAt).toBeLessThan(1_000);
  });

  it("ends the routing streams at shutdown, and the in-process router keeps its state", async () => {
    const cp = await controlPlane();
    const a = watch(cp, "router-a");
    await eventually(() => (a.received.length > 0 ? true : undefined));
    const report = await cp.close();
    expect(report.forced).toBe(false);
    const error = await a.done;
    expect(error?.code).toBe(Code.Unavailable);
    expect(error?.rawMessage).toBe("the control plane is shutting down");
    const dir = join(cp.options.dataDir, "router");
    expect(statSync(dir).mode & 0o777).toBe(0o700);
    expect(statSync(join(dir, "routing-state.json")).mode & 0o777).toBe(0o600);
  });

  it("starts no public listener and no in-process router with publicApi: false", async () => {
    const cp = await controlPlane({ publicApi: false });
    expect(cp.publicUrl).toBeUndefined();
    expect(cp.router).toBeUndefined();
    const a = watch(cp, "router-a");
    await eventually(() => (a.received.length > 0 ? true : undefined));
    expect(a.received[0]).toMatchObject({ kind: "snapshot", routers: 1 });
    const { routers } = await adminClient(cp, cp.adminToken).listRouters({});
    expect(routers.map((r) => [r.id, r.inProcess])).toEqual([["router-a", false]]);
  });
});
