/**
 * The data plane apart, end to end (issue 17's acceptance tests, part 1: control-plane
 * outages): a real control plane with `--no-public-api`, two real agents on simulated nodes
 * running real engine processes, two real `llmgw router` processes, and the official `openai`
 * client in closed loops against both routers (no client retries: every failure counts).
 * One cluster is shared by the steps below, in order.
 *
 * The outage of the second step lasts LLMGW_E2E_OUTAGE_S seconds: 15 by default so that CI
 * stays reasonable, 60 (the issue's figure) with LLMGW_E2E_OUTAGE_S=60.
 */

import { statSync } from "node:fs";
import path from "node:path";
import { create } from "@bufbuild/protobuf";
import { DeploymentSchema, Engine, RoutingPolicy } from "@llmgw/proto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  allReady,
  ClosedLoopTraffic,
  deployment,
  describeFailures,
  engineKeyOf,
  enginePids,
  metricSamples,
  type RoutersCluster,
  startRoutersCluster,
  stopAll,
  tempRoot,
  waitFor,
} from "./cluster-harness.js";

const OUTAGE_S = Number(process.env.LLMGW_E2E_OUTAGE_S ?? "15");
if (!Number.isInteger(OUTAGE_S) || OUTAGE_S < 6 || OUTAGE_S > 600) {
  throw new Error(
    `LLMGW_E2E_OUTAGE_S must be a whole number of seconds from 6 to 600, got "${process.env.LLMGW_E2E_OUTAGE_S}"`,
  );
}
const OUTAGE_MS = OUTAGE_S * 1000;
const MODEL = "chat";

const root = tempRoot("llmgw-routers-e2e-");
let c: RoutersCluster;
/** The engines' API keys (the routers hold them; they must never reach a log). */
const engineKeys: string[] = [];

beforeAll(async () => {
  c = await startRoutersCluster(root);
  await c.cp.admin().applyDeployment(
    {
      // Round robin, so that both routers send to both replicas all the time.
      deployment: create(DeploymentSchema, {
        name: MODEL,
        model: `sim/${MODEL}`,
        engine: Engine.SIM,
        gpuClass: "h100-80g",
        replicas: 2,
        routingPolicy: RoutingPolicy.ROUND_ROBIN,
      }),
    },
    c.cp.adminHeaders(),
  );
  const d = await waitFor(
    "chat to be ready on both nodes",
    async () => {
      const dep = await deployment(c.cp, MODEL);
      return allReady(dep, 2) ? dep : undefined;
    },
    90_000,
  );
  expect(new Set(d.replicas.map((r) => r.ranks[0]?.nodeId)).size).toBe(2);
  for (const pid of enginePids(d).values()) {
    const key = engineKeyOf(pid);
    if (key !== undefined) engineKeys.push(key);
  }
  expect(engineKeys).toHaveLength(2);
  // Both routers route to both replicas before any fault.
  const warm = new ClosedLoopTraffic(c.routers, c.apiKey, MODEL, { loops: 1 });
  warm.start();
  try {
    await waitFor(
      "each router to answer from both replicas",
      () =>
        c.routers.every(
          (r) => new Set(warm.since(0, r.id).flatMap((o) => (o.ok ? [o.replica] : []))).size === 2,
        ) || undefined,
      30_000,
      50,
    );
  } finally {
    await warm.stop();
  }
}, 180_000);

afterAll(async () => {
  await stopAll([root]);
});

/** Both routers' readiness satisfies `accept`. */
const routersSay = (what: string, accept: (body: { connected?: boolean }) => boolean) =>
  waitFor(
    what,
    async () => {
      const all = await Promise.all(c.routers.map((r) => r.readiness()));
      return all.every((r) => r.status === 200 && accept(r.body)) || undefined;
    },
    30_000,
    50,
  );

describe("two routers, one control plane, two agents", { timeout: 240_000 }, () => {
  it("a control plane SIGKILLed during steady traffic and restarted: zero failed requests through either router", async () => {
    const traffic = new ClosedLoopTraffic(c.routers, c.apiKey, MODEL, { loops: 2 });
    const t0 = performance.now();
    traffic.start();
    try {
      await traffic.waitForSuccesses(10, t0);
      const killedAt = performance.now();
      await c.cp.stop("SIGKILL");
      await routersSay("both routers to notice the control plane is gone", (b) => !b.connected);
      await traffic.waitForSuccesses(5, performance.now());
      await c.cp.start();
      const restartedAt = performance.now();
      await routersSay("both routers to stream from the restarted control plane", (b) =>
        Boolean(b.connected),
      );
      await waitFor(
        "the agents to report both replicas to the restarted control plane",
        async () => allReady(await deployment(c.cp, MODEL), 2) || undefined,
        60_000,
      );
      // Traffic well past the restart: the first snapshots, the agents' first heartbeats and
      // their engine keys have all reached the routers by now.
      const settled = performance.now();
      await traffic.waitForSuccesses(20, settled);
      await traffic.stop();
      const failures = traffic.failures();
      expect(failures, describeFailures(failures, t0)).toEqual([]);
      // Nothing was dropped from the routing state: both replicas served after the restart.
      for (const r of c.routers) {
        const replicas = new Set(traffic.since(restartedAt, r.id).map((o) => o.replica));
        expect(replicas.size, r.id).toBe(2);
      }
      console.info(
        `control-plane SIGKILL: ${traffic.outcomes.length} requests, 0 failed; down ${Math.round(restartedAt - killedAt)} ms, settled ${Math.round(settled - restartedAt)} ms after the restart`,
      );
    } finally {
      await traffic.stop();
    }
  });

  let killed: { replicaId: string; pid: number } | undefined;

  it(`the control plane down ${OUTAGE_MS / 1000} s: both routers serve, and stop sending to an engine SIGKILLed meanwhile`, {
    timeout: OUTAGE_MS + 120_000,
  }, async () => {
    const before = await deployment(c.cp, MODEL);
    const victim = before?.replicas[0];
    const pid = victim?.ranks[0]?.status?.pid;
    expect(pid).toBeGreaterThan(0);
    killed = { replicaId: victim?.replicaId as string, pid: pid as number };
    const traffic = new ClosedLoopTraffic(c.routers, c.apiKey, MODEL, { loops: 2 });
    traffic.start();
    try {
      await traffic.waitForSuccesses(5, performance.now());
      await c.cp.stop("SIGKILL");
      const downAt = performance.now();
      await routersSay("both routers to notice the control plane is gone", (b) => !b.connected);
      // A third of the outage in, the engine dies; nobody can tell the routers.
      await waitFor(
        "a third of the outage",
        () => performance.now() - downAt > OUTAGE_MS / 3 || undefined,
        OUTAGE_MS,
      );
      process.kill(killed.pid, "SIGKILL");
      const killAt = performance.now();
      await waitFor(
        "both routers to open the killed replica's circuit",
        async () => {
          for (const r of c.routers) {
            const opened = metricSamples(
              await r.metrics(),
              "llmgw_router_circuit_transitions_total",
            )
              .filter((s) => s.labels.replica === killed?.replicaId && s.labels.to === "open")
              .reduce((sum, s) => sum + s.value, 0);
            if (opened < 1) return undefined;
          }
          return true;
        },
        20_000,
        100,
      );
      const openAt = performance.now();
      const errorsAt = async () =>
        Promise.all(
          c.routers.map(async (r) =>
            metricSamples(await r.metrics(), "llmgw_router_upstream_errors_total")
              .filter((s) => s.labels.replica === killed?.replicaId)
              .reduce((sum, s) => sum + s.value, 0),
          ),
        );
      const errorsAtOpen = await errorsAt();
      await waitFor(
        "the end of the outage",
        () => performance.now() - downAt > OUTAGE_MS || undefined,
        OUTAGE_MS + 10_000,
      );
      await traffic.stop();
      // An open circuit sends one probe per 5 s cooldown, nothing else: the engine errors each
      // router saw after the circuit opened are those probes at most.
      const probes = Math.ceil((performance.now() - openAt) / 5_000) + 1;
      const errorsAtEnd = await errorsAt();
      for (const [i, r] of c.routers.entries()) {
        expect(
          (errorsAtEnd[i] as number) - (errorsAtOpen[i] as number),
          `${r.id} engine errors after the circuit opened`,
        ).toBeLessThanOrEqual(probes);
      }
      // Only requests already at the engine when it died may fail; every later one succeeds.
      const failures = traffic.failures();
      const late = failures.filter((f) => f.startedAt >= killAt);
      expect(late, describeFailures(late, downAt)).toEqual([]);
      expect(failures.length, describeFailures(failures, downAt)).toBeLessThanOrEqual(4);
      const afterOpen = traffic.since(openAt).filter((o) => o.startedAt > openAt);
      for (const r of c.routers) {
        const served = afterOpen.filter((o) => o.router === r.id);
        expect(served.length, r.id).toBeGreaterThan(10);
        expect(served.every((o) => o.ok)).toBe(true);
      }
      // The other replica carried the traffic.
      const survivor = before?.replicas.find((r) => r.replicaId !== killed?.replicaId)?.replicaId;
      expect(afterOpen.filter((o) => o.replica === survivor).length).toBeGreaterThan(0);
      // Still no control plane: the routers say how old their state is.
      for (const r of c.routers) {
        const ready = await r.readiness();
        expect(ready.status).toBe(200);
        expect(ready.body.connected).toBe(false);
        expect(ready.body.stateAgeMs).toBeGreaterThanOrEqual(OUTAGE_MS - 3_000);
      }
      console.info(
        `control plane down ${OUTAGE_MS} ms: ${traffic.outcomes.length} requests, ${failures.length} failed (in flight at the engine kill); circuit open on both routers ${Math.round(openAt - killAt)} ms after the kill`,
      );
    } finally {
      await traffic.stop();
    }
  });

  it("a router SIGKILLed and started again while the control plane is down serves at once from its saved state", async () => {
    if (c.cp.proc?.child.exitCode === null) await c.cp.stop("SIGKILL");
    const r = c.routers[1];
    if (r === undefined) throw new Error("no second router");
    await r.kill();
    const startedAt = performance.now();
    await r.start({ ready: false });
    const ready = await r.waitReady(10_000);
    const readyMs = performance.now() - startedAt;
    expect(ready.body).toMatchObject({
      status: "ready",
      ready: true,
      source: "saved",
      connected: false,
    });
    expect(ready.body.stateAgeMs).toBeGreaterThan(0);
    expect(r.output()).toContain("routing_state_loaded");
    const traffic = new ClosedLoopTraffic([r], c.apiKey, MODEL, { loops: 1 });
    traffic.start();
    await traffic.waitForSuccesses(5, startedAt, 20_000).finally(() => traffic.stop());
    // The killed engine's replica is still in the saved state: the fresh router finds out
    // itself (connect refused → the other replica) and nothing fails.
    expect(traffic.failures(), describeFailures(traffic.failures())).toEqual([]);
    console.info(
      `router restarted during the outage: ready from saved state in ${Math.round(readyMs)} ms`,
    );
    // The saved state holds engine keys: owner-only, and no secret in any router's log.
    expect(statSync(r.stateDir).mode & 0o777).toBe(0o700);
    expect(statSync(path.join(r.stateDir, "routing-state.json")).mode & 0o777).toBe(0o600);
    for (const router of c.routers) {
      for (const secret of [c.apiKey, c.cp.token("router"), ...engineKeys])
        expect(router.output().includes(secret), `a secret in ${router.id}'s log`).toBe(false);
    }
    // The control plane comes back: the routers go live again.
    await c.cp.start();
    await routersSay("both routers to stream from the control plane again", (b) =>
      Boolean(b.connected),
    );
    expect((await r.readiness()).body.source).toBe("live");
  });
});
