/**
 * Zero-loss lifecycle, end to end (issue 21's acceptance tests): a real control plane with
 * `--no-public-api`, two real agents on simulated nodes running real engine processes, two
 * real `llmgw router` processes, and the official `openai` client in closed loops against both
 * routers, half of them streaming (no client retries: every failure counts, and a stream that
 * ends without its finish reason is a failure). One cluster is shared by the steps below, in
 * order; each planned change must cost no client a single error or truncated stream.
 */

import { writeFileSync } from "node:fs";
import path from "node:path";
import { create } from "@bufbuild/protobuf";
import {
  DeploymentSchema,
  type DeploymentStatus,
  Engine,
  NodeState,
  ReplicaState,
  RetirementPhase,
  RolloutState,
  RoutingPolicy,
} from "@llmgw/proto";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  ClosedLoopTraffic,
  deployment,
  describeFailures,
  type RoutersCluster,
  runLlmgw,
  startRoutersCluster,
  stopAll,
  tempRoot,
  waitFor,
} from "./cluster-harness.js";

const MODEL = "chat";
const root = tempRoot("llmgw-lifecycle-e2e-");
let c: RoutersCluster;
let traffic: ClosedLoopTraffic;

function chat(replicas: number) {
  return create(DeploymentSchema, {
    name: MODEL,
    model: `sim/${MODEL}`,
    engine: Engine.SIM,
    gpuClass: "h100-80g",
    replicas,
    // Both routers send to every replica all the time.
    routingPolicy: RoutingPolicy.ROUND_ROBIN,
  });
}

/** Ready replicas, and whether any replica is still leaving. */
function census(d: DeploymentStatus | undefined) {
  const replicas = d?.replicas ?? [];
  return {
    ready: replicas.filter((r) => r.state === ReplicaState.READY && !r.retirement).length,
    leaving: replicas.filter((r) => r.retirement !== undefined).length,
    revisions: new Set(replicas.map((r) => r.revision)),
  };
}

/**
 * Runs `change`, then polls the deployment until `done`, recording the fewest ready replicas
 * (not leaving) seen on the way; asserts that no request that ended meanwhile failed.
 */
async function step(
  what: string,
  change: () => Promise<unknown>,
  done: (d: DeploymentStatus | undefined) => boolean,
  timeoutMs = 120_000,
): Promise<{ minReady: number; tookMs: number }> {
  const t0 = performance.now();
  let minReady = Number.POSITIVE_INFINITY;
  await change();
  await waitFor(
    what,
    async () => {
      const d = await deployment(c.cp, MODEL).catch(() => undefined);
      minReady = Math.min(minReady, census(d).ready + leavingServing(d));
      return done(d) || undefined;
    },
    timeoutMs,
    100,
  );
  const tookMs = performance.now() - t0;
  // Requests in flight when the change finished end within a second or so.
  await traffic.waitForSuccesses(2, performance.now());
  const failures = traffic.since(t0).filter((o) => !o.ok);
  expect(failures, `${what}:\n${describeFailures(failures, t0)}`).toEqual([]);
  return { minReady, tookMs };
}

/** Leaving replicas that still take new requests (waiting for their replacement). */
function leavingServing(d: DeploymentStatus | undefined): number {
  return (d?.replicas ?? []).filter(
    (r) => r.state === ReplicaState.READY && r.retirement?.phase === RetirementPhase.WAITING,
  ).length;
}

/** `llmgw deploy -f … --wait` of chat (2 replicas, round robin) with `extraArgs`, as a process. */
async function llmgwDeploy(extraArgs: string[]): Promise<{ code: number | null; output: string }> {
  const file = path.join(root, `chat-${extraArgs.join("")}.json`);
  writeFileSync(
    file,
    JSON.stringify({
      name: MODEL,
      model: `sim/${MODEL}`,
      engine: "sim",
      gpuClass: "h100-80g",
      replicas: 2,
      routingPolicy: "round-robin",
      extraArgs,
    }),
  );
  const proc = runLlmgw(["deploy", "-f", file, "--wait", "--timeout", "170"], {
    LLMGW_CONTROL_PLANE: c.cp.controlUrl,
    LLMGW_ADMIN_TOKEN: c.cp.token("admin"),
  });
  const code = await proc.exited;
  return { code, output: proc.output() };
}

async function events(kind: string): Promise<string[]> {
  const res = await c.cp.admin().listEvents({ limit: 1000 }, c.cp.adminHeaders());
  return res.events.filter((e) => e.kind === kind).map((e) => `${e.subject}: ${e.message}`);
}

beforeAll(async () => {
  c = await startRoutersCluster(root);
  await c.cp.admin().applyDeployment({ deployment: chat(4) }, c.cp.adminHeaders());
  await waitFor(
    "4 replicas of chat to be ready",
    async () => (census(await deployment(c.cp, MODEL)).ready === 4 ? true : undefined),
    90_000,
  );
  traffic = new ClosedLoopTraffic(c.routers, c.apiKey, MODEL, {
    loops: 4,
    maxTokens: 24,
    streams: true,
  });
  traffic.start();
  await traffic.waitForSuccesses(4, performance.now());
}, 180_000);

afterAll(async () => {
  await traffic?.stop();
  await stopAll([root]);
});

describe("planned changes under steady streaming and non-streaming traffic", () => {
  it("scale 4 → 2 drains the two that go: no client sees it", async () => {
    const { minReady } = await step(
      "chat to be at 2 replicas, none leaving",
      () => c.cp.admin().scaleDeployment({ name: MODEL, replicas: 2 }, c.cp.adminHeaders()),
      (d) => (d?.replicas.length ?? 0) === 2 && census(d).ready === 2,
    );
    expect(minReady).toBeGreaterThanOrEqual(2);
    expect(await events("replica.draining")).toHaveLength(2);
    expect(await events("replica.drained")).toHaveLength(2);
  }, 180_000);

  it("a rolling update starts each new replica before the old one drains", async () => {
    const before = await deployment(c.cp, MODEL);
    const from = before?.spec?.revision ?? 0n;
    let cli = { code: null as number | null, output: "" };
    const { minReady } = await step(
      "every replica of chat at the new revision, ready",
      async () => {
        // Through the operator's command, which follows each step until the rollout is done.
        cli = await llmgwDeploy(["--seed", "7"]);
      },
      (d) => {
        const x = census(d);
        return (
          x.ready === 2 &&
          x.leaving === 0 &&
          (d?.replicas.length ?? 0) === 2 &&
          x.revisions.size === 1 &&
          x.revisions.has(d?.spec?.revision ?? -1n) &&
          d?.rollout?.state === RolloutState.COMPLETE
        );
      },
    );
    // maxSurge 1, maxUnavailable 0: never fewer than 2 replicas taking new requests.
    expect(minReady).toBeGreaterThanOrEqual(2);
    expect(cli.code, cli.output).toBe(0);
    expect(cli.output).toMatch(/draining/);
    expect(cli.output).toMatch(/stopped/);
    const d = await deployment(c.cp, MODEL);
    expect(d?.rollout?.fromRevision).toBe(from);
    expect(d?.rollout?.toRevision).toBe(d?.spec?.revision);
  }, 180_000);

  it("a node drain moves its replicas, ready elsewhere before the old ones drain", async () => {
    const onA = (d: DeploymentStatus | undefined) =>
      (d?.replicas ?? []).filter((r) => r.ranks.some((k) => k.nodeId === nodeA)).length;
    const nodes = await c.cp.admin().listNodes({}, c.cp.adminHeaders());
    const nodeA = nodes.nodes.find((n) => n.hostname === "node-a")?.nodeId ?? "";
    expect(onA(await deployment(c.cp, MODEL))).toBeGreaterThan(0);
    const { minReady } = await step(
      "no replica of chat on node-a, 2 ready",
      () => c.cp.admin().drainNode({ node: "node-a" }, c.cp.adminHeaders()),
      (d) => onA(d) === 0 && census(d).ready === 2 && census(d).leaving === 0,
    );
    expect(minReady).toBeGreaterThanOrEqual(2);
    await c.cp.admin().uncordonNode({ node: "node-a" }, c.cp.adminHeaders());
  }, 180_000);

  it("an agent stopped with --stop-engines drains its node first, and takes work again when back", async () => {
    const agent = c.agents[1];
    if (agent === undefined) throw new Error("no second agent");
    const nodes = await c.cp.admin().listNodes({}, c.cp.adminHeaders());
    const nodeId = nodes.nodes.find((n) => n.hostname === agent.name)?.nodeId ?? "";
    const onNode = (d: DeploymentStatus | undefined) =>
      (d?.replicas ?? []).filter((r) => r.ranks.some((k) => k.nodeId === nodeId)).length;
    // Put a replica there, and restart its agent with --stop-engines (it adopts its engines).
    await c.cp.admin().drainNode({ node: "node-a" }, c.cp.adminHeaders());
    await waitFor(
      "chat to run on node-b only",
      async () => {
        const d = await deployment(c.cp, MODEL);
        return onNode(d) === 2 && census(d).ready === 2 && census(d).leaving === 0
          ? true
          : undefined;
      },
      60_000,
    );
    await c.cp.admin().uncordonNode({ node: "node-a" }, c.cp.adminHeaders());
    await agent.kill("SIGTERM");
    agent.start(["--stop-engines"]);
    await waitFor(
      "the agent to be back with its engines",
      async () => {
        const n = await c.cp.admin().getNode({ node: nodeId }, c.cp.adminHeaders());
        const d = await deployment(c.cp, MODEL);
        return n.node?.state === NodeState.READY &&
          d?.replicas.every((r) => r.ranks[0]?.status?.adopted)
          ? true
          : undefined;
      },
      60_000,
    );
    let exited = false;
    const proc = agent.proc;
    const { minReady } = await step(
      "node-b's agent to leave, chat whole on node-a",
      async () => {
        void agent.kill("SIGTERM").then(() => {
          exited = true;
        });
      },
      (d) => exited && onNode(d) === 0 && census(d).ready === 2 && census(d).leaving === 0,
    ).catch((error: Error) => {
      throw new Error(`${error.message}\nagent output:\n${proc?.output().slice(-6000)}`);
    });
    expect(minReady).toBeGreaterThanOrEqual(2);
    expect(agent.proc?.output()).toMatch(/left the cluster in .*: every replica drained/);
    expect((await c.cp.admin().getNode({ node: nodeId }, c.cp.adminHeaders())).node?.draining).toBe(
      true,
    );
    // Back without the flag: its own drain ends.
    agent.start();
    await waitFor(
      "node-b to take work again",
      async () => {
        const n = await c.cp.admin().getNode({ node: nodeId }, c.cp.adminHeaders());
        return n.node?.draining === false && n.node.cordoned === false ? true : undefined;
      },
      60_000,
    );
  }, 240_000);

  it("a new revision that fails to load rolls back; the old replicas serve throughout", async () => {
    const good = (await deployment(c.cp, MODEL))?.spec?.revision ?? 0n;
    let cli = { code: null as number | null, output: "" };
    await step(
      "chat rolled back, 2 ready replicas at the good spec",
      async () => {
        cli = await llmgwDeploy(["--fail-load"]);
      },
      (d) =>
        d?.rollout?.state === RolloutState.ROLLED_BACK &&
        census(d).ready === 2 &&
        census(d).leaving === 0 &&
        (d?.replicas.length ?? 0) === 2 &&
        !(d?.spec?.extraArgs ?? []).includes("--fail-load"),
      180_000,
    );
    const d = await deployment(c.cp, MODEL);
    expect(d?.rollout?.message).toMatch(/failed/);
    // `llmgw deploy --wait` says so and fails.
    expect(cli.code, cli.output).toBe(1);
    expect(cli.output).toMatch(/rolled back/);
    expect(d?.spec?.revision).toBeGreaterThan(good + 1n);
    expect(await events("deployment.rolled-back")).toHaveLength(1);
  }, 240_000);

  it("a drain that never finishes is cut at drainTimeoutSeconds, with the count reported", async () => {
    await c.cp.admin().applyDeployment(
      {
        deployment: create(DeploymentSchema, {
          name: "slow",
          model: "sim/slow",
          engine: Engine.SIM,
          gpuClass: "h100-80g",
          replicas: 1,
          drainTimeoutSeconds: 2,
          extraArgs: ["--slow-token-ms", "1000"],
        }),
      },
      c.cp.adminHeaders(),
    );
    await waitFor(
      "slow to be ready",
      async () => (census(await deployment(c.cp, "slow")).ready === 1 ? true : undefined),
      90_000,
    );
    const client = new OpenAI({
      baseURL: `${c.routers[0]?.url}/v1`,
      apiKey: c.apiKey,
      maxRetries: 0,
    });
    // The router learns that the replica is ready from its watch, a moment after the control
    // plane says so; until then it answers 503 `model_loading` (its documented answer), and
    // `waitFor` tries again.
    const s = await waitFor(
      "the router to route to slow",
      () =>
        client.chat.completions.create({
          model: "slow",
          max_tokens: 200,
          stream: true,
          messages: [{ role: "user", content: "never done" }],
        }),
      30_000,
    );
    let first = false;
    const stream = (async () => {
      try {
        for await (const _ of s) first = true;
        return "ended";
      } catch {
        return "cut";
      }
    })();
    await waitFor("the slow stream to start", () => first || undefined, 30_000);
    const t0 = Date.now();
    await c.cp.admin().scaleDeployment({ name: "slow", replicas: 0 }, c.cp.adminHeaders());
    await waitFor(
      "slow's replica to be stopped",
      async () => ((await deployment(c.cp, "slow"))?.replicas.length === 0 ? true : undefined),
      30_000,
    );
    const tookMs = Date.now() - t0;
    expect(tookMs).toBeGreaterThanOrEqual(2_000);
    const timedOut = await events("replica.drain-timeout");
    expect(timedOut).toHaveLength(1);
    expect(timedOut[0]).toMatch(/slow-0: drain timed out after 2s with 1 request\(s\) in flight/);
    expect(await stream).toBe("cut");
    await c.cp.admin().deleteDeployment({ name: "slow" }, c.cp.adminHeaders());
  }, 180_000);

  it("undeploy: requests in flight finish; new ones get a clear 404", async () => {
    const t0 = performance.now();
    await c.cp.admin().deleteDeployment({ name: MODEL }, c.cp.adminHeaders());
    await waitFor(
      "chat's replicas to be gone",
      async () => {
        const res = await c.cp.admin().listReplicas({}, c.cp.adminHeaders());
        return res.replicas.every((r) => r.deployment !== MODEL) || undefined;
      },
      60_000,
    );
    await traffic.stop();
    const failures = traffic
      .since(t0)
      .filter((o) => !o.ok && !(o.status === 404 && /model/i.test(o.error ?? "")));
    expect(failures, describeFailures(failures, t0)).toEqual([]);
    expect(traffic.since(t0).some((o) => o.status === 404)).toBe(true);
  }, 120_000);
});
