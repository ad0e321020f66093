/**
 * The cluster end to end: a real control plane and two real agents on simulated nodes (one
 * shared IB fabric, different GPU mixes) running real simulated-engine processes, driven
 * through the admin API. One cluster is shared by the steps below, in order, because each
 * start costs seconds; each step leaves the cluster converged for the next.
 */
import { existsSync, readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import path from "node:path";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { ensureTinyModel, findLlamaServer } from "@llmgw/engine-sim";
import {
  AgentService,
  DeploymentSchema,
  Engine,
  HeartbeatRequestSchema,
  NodeState,
  RegisterRequestSchema,
  RoutingPolicy,
} from "@llmgw/proto";
import { holdPortOnceFree } from "@llmgw/supervisor/testing";
import OpenAI from "openai";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  AgentProc,
  allReady,
  ControlPlaneProc,
  deployment,
  enginePids,
  ensureCliBuilt,
  freePort,
  runLlmgw,
  simDeployment,
  stopAll,
  tempRoot,
  waitFor,
} from "./cluster-harness.js";

const root = tempRoot("llmgw-e2e-");
let cp: ControlPlaneProc;
let agentA: AgentProc;
let agentB: AgentProc;

const sim = simDeployment;

async function nodeIdOf(name: string): Promise<string> {
  const res = await cp.admin().listNodes({}, cp.adminHeaders());
  const node = res.nodes.find((n) => n.hostname === name);
  if (!node) throw new Error(`node ${name} not registered`);
  return node.nodeId;
}

/** The engine API key the agent handed engine process `pid` (read from its environment). */
function engineKeyOf(pid: number): string | undefined {
  const entry = readFileSync(`/proc/${pid}/environ`, "utf8")
    .split("\0")
    .find((e) => e.startsWith("LLMGW_ENGINE_API_KEY="));
  return entry?.slice("LLMGW_ENGINE_API_KEY=".length);
}

/** Local addresses (hex, as /proc/net/tcp writes them) listening on `port`. */
function listenAddresses(port: number): string[] {
  const hexPort = port.toString(16).toUpperCase().padStart(4, "0");
  return ["/proc/net/tcp", "/proc/net/tcp6"].flatMap((file) =>
    readFileSync(file, "utf8")
      .split("\n")
      .slice(1)
      .map((line) => line.trim().split(/\s+/))
      .filter((f) => f[1]?.endsWith(`:${hexPort}`) && f[3] === "0A")
      .map((f) => f[1]?.split(":")[0] as string),
  );
}

/** Rank 0 of every replica of `name`: id, pid, API port and the engine's key. */
async function servingEngines(name: string) {
  const d = await deployment(cp, name);
  return (d?.replicas ?? []).map((r) => {
    const status = r.ranks[0]?.status;
    const pid = status?.pid as number;
    return { replicaId: r.replicaId, pid, port: status?.apiPort as number, key: engineKeyOf(pid) };
  });
}

let routerKey: string | undefined;
/** `n` chat completions through the router with a real llmgw key; every one must succeed. */
async function chatThroughRouter(model: string, n = 4): Promise<Set<string>> {
  routerKey ??= (await cp.admin().createApiKey({ name: "e2e-engine-keys" }, cp.adminHeaders()))
    .secret;
  const replicas = new Set<string>();
  for (let i = 0; i < n; i++) {
    const res = await fetch(`${cp.publicUrl}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${routerKey}`, "content-type": "application/json" },
      body: JSON.stringify({
        model,
        max_tokens: 4,
        messages: [{ role: "user", content: `hi ${i}` }],
      }),
    });
    const body = await res.text();
    expect(res.status, body).toBe(200);
    replicas.add(res.headers.get("x-llmgw-replica") ?? "");
  }
  return replicas;
}

/** Status of a request straight to an engine, bypassing the router. */
async function direct(port: number, authorization?: string): Promise<number> {
  const res = await fetch(`http://127.0.0.1:${port}/v1/models`, {
    ...(authorization === undefined ? {} : { headers: { authorization } }),
  });
  await res.arrayBuffer();
  return res.status;
}

const keysBeforeRestart = new Map<string, string | undefined>();

async function placedNodes(name: string): Promise<string[]> {
  const d = await deployment(cp, name);
  return (d?.replicas ?? []).flatMap((r) => r.ranks.map((k) => k.nodeId)).sort();
}

beforeAll(async () => {
  ensureCliBuilt();
  cp = new ControlPlaneProc(root, await freePort(), await freePort(), [
    "--heartbeat-interval",
    "300ms",
    "--node-lost-after",
    // Long enough that a SIGKILLed agent restarting on a loaded 2-core machine comes back
    // before its node is declared lost (8 s was not, with the whole suite running in
    // parallel); the "lost" step waits this out on purpose.
    "20s",
  ]);
  await cp.start();
  agentA = new AgentProc(root, "node-a", "4xh100-80g,1xl40s-45g@ib-a", cp);
  agentB = new AgentProc(root, "node-b", "4xh100-80g@ib-a", cp);
  // A failed replica is launched afresh 2 s after its restarts gave up (default 60 s).
  agentA.start(["--relaunch-failed", "2"]);
  agentB.start(["--relaunch-failed", "2"]);
  await waitFor("both agents to register", async () => {
    const res = await cp.admin().listNodes({}, cp.adminHeaders());
    return res.nodes.filter((n) => n.state === NodeState.READY).length === 2 ? true : undefined;
  });
}, 120_000);

afterAll(async () => {
  await stopAll([root]);
});

describe("a control plane and two agents on simulated nodes", { timeout: 90_000 }, () => {
  it("deploys a replicated model: every replica becomes ready, spread over both nodes", async () => {
    await cp.admin().applyDeployment(
      {
        // Round-robin, so that a few requests through the router reach every replica.
        deployment: sim("chat", {
          gpuClass: "h100-80g",
          replicas: 2,
          routingPolicy: RoutingPolicy.ROUND_ROBIN,
        }),
      },
      cp.adminHeaders(),
    );
    const d = await waitFor("chat to be ready", async () => {
      const dep = await deployment(cp, "chat");
      return allReady(dep, 2) ? dep : undefined;
    });
    const nodes = new Set(d.replicas.map((r) => r.ranks[0]?.nodeId));
    expect(nodes.size).toBe(2);
  });

  it("engines answer only routers: keyed per replica, off argv, the store and admin views, bound to the advertise address", async () => {
    const engines = await servingEngines("chat");
    expect(engines).toHaveLength(2);
    const keys = engines.map((e) => e.key);
    for (const key of keys) expect(key).toMatch(/^llmgw-engine-[A-Za-z0-9_-]{43}$/);
    expect(new Set(keys).size).toBe(2);
    for (const e of engines) {
      keysBeforeRestart.set(e.replicaId, e.key);
      // Straight to the engine: refused without the key and with another replica's key.
      expect(await direct(e.port)).toBe(401);
      const other = keys.find((k) => k !== e.key);
      expect(await direct(e.port, `Bearer ${other}`)).toBe(401);
      expect(await direct(e.port, `Bearer ${e.key}`)).toBe(200);
      expect(readFileSync(`/proc/${e.pid}/cmdline`, "utf8")).not.toContain(e.key as string);
      // The agents advertise 127.0.0.1: the engine listens there, not on every interface.
      expect(listenAddresses(e.port)).toEqual(["0100007F"]);
    }
    // Through the router every request succeeds, on both replicas.
    const routedTo = await waitFor("the router to reach both replicas", async () => {
      const seen = await chatThroughRouter("chat", 6);
      return seen.size === 2 ? seen : undefined;
    });
    expect([...routedTo].sort()).toEqual(engines.map((e) => e.replicaId).sort());
    // Nowhere an operator or the store could leak it.
    const bigints = (_: string, v: unknown) => (typeof v === "bigint" ? String(v) : v);
    const views = JSON.stringify(
      [
        await cp.admin().listReplicas({}, cp.adminHeaders()),
        await cp.admin().listEvents({}, cp.adminHeaders()),
        await cp.admin().listNodes({}, cp.adminHeaders()),
        await cp.admin().getClusterStatus({}, cp.adminHeaders()),
      ],
      bigints,
    );
    for (const key of keys) expect(views).not.toContain(key);
    // The in-process router's saved routing state holds the engine keys on purpose (it serves
    // through a restart with them), owner-only like the tokens beside it; nothing else may.
    // Its temp file of an atomic save may be caught mid-write too: the whole router/ dir is its.
    const routerDir = path.join(cp.dataDir, "router");
    const routerState = path.join(routerDir, "routing-state.json");
    for (const file of readdirSync(cp.dataDir, { recursive: true, withFileTypes: true })) {
      if (!file.isFile()) continue;
      const where = path.join(file.parentPath, file.name);
      if (where.startsWith(`${routerDir}${path.sep}`)) continue;
      const bytes = readFileSync(where);
      for (const key of keys) expect(bytes.includes(key as string), file.name).toBe(false);
    }
    await waitFor("the in-process router to save its state", async () =>
      existsSync(routerState) ? true : undefined,
    );
    expect(statSync(routerState).mode & 0o777).toBe(0o600);
    expect(statSync(path.dirname(routerState)).mode & 0o777).toBe(0o700);
    expect(cp.proc?.output()).not.toContain(keys[0]);
  });

  it("gang-places a two-node replica on both agents and brings both ranks up", async () => {
    await cp.admin().applyDeployment(
      {
        deployment: sim("gang", {
          gpuClass: "h100-80g",
          tensorParallel: 2,
          pipelineParallel: 2,
          nodesPerReplica: 2,
          replicas: 1,
        }),
      },
      cp.adminHeaders(),
    );
    const d = await waitFor("gang to be ready", async () => {
      const dep = await deployment(cp, "gang");
      return allReady(dep, 1) ? dep : undefined;
    });
    const replica = d.replicas[0];
    expect(replica?.ranks.map((r) => r.rank)).toEqual([0, 1]);
    expect(new Set(replica?.ranks.map((r) => r.nodeId)).size).toBe(2);
    expect(replica?.fabricId).toBe("ib-a");
  });

  it("restarts a killed engine and reports the restart", async () => {
    const before = await deployment(cp, "chat");
    const victim = before?.replicas[0];
    const pid = victim?.ranks[0]?.status?.pid;
    expect(pid).toBeGreaterThan(0);
    process.kill(pid as number, "SIGKILL");
    const after = await waitFor("the killed engine to be replaced and ready", async () => {
      const d = await deployment(cp, "chat");
      const r = d?.replicas.find((x) => x.replicaId === victim?.replicaId);
      const status = r?.ranks[0]?.status;
      return allReady(d, 2) && status?.pid !== pid && (status?.restarts ?? 0) >= 1 ? d : undefined;
    });
    expect(
      after.replicas.find((x) => x.replicaId === victim?.replicaId)?.ranks[0]?.status?.restarts,
    ).toBeGreaterThanOrEqual(1);
    // The new process drew a new key: the old one opens nothing, and routing follows.
    const restarted = (await servingEngines("chat")).find((e) => e.replicaId === victim?.replicaId);
    const oldKey = keysBeforeRestart.get(victim?.replicaId as string);
    expect(restarted?.key).toMatch(/^llmgw-engine-/);
    expect(restarted?.key).not.toBe(oldKey);
    expect(await direct(restarted?.port as number, `Bearer ${oldKey}`)).toBe(401);
    await waitFor("the router to reach the restarted replica", async () => {
      const seen = await chatThroughRouter("chat", 6);
      return seen.has(victim?.replicaId as string) ? true : undefined;
    });
  });

  it("relaunches an engine on a new port when its own was taken while it restarted", {
    timeout: 90_000,
  }, async () => {
    const victim = (await deployment(cp, "chat"))?.replicas[0];
    const status = victim?.ranks[0]?.status;
    const pid = status?.pid as number;
    const port = status?.apiPort as number;
    expect(port).toBeGreaterThan(0);
    process.kill(pid, "SIGKILL");
    // Taken before the supervisor's restart (1 s later): every restart fails to listen, the
    // restart policy gives up after five quick ones, and 2 s later the agent starts afresh.
    const squatter = await holdPortOnceFree(port);
    try {
      const back = await waitFor(
        "the replica to be ready again on another port",
        async () => {
          const d = await deployment(cp, "chat");
          const s = d?.replicas.find((r) => r.replicaId === victim?.replicaId)?.ranks[0]?.status;
          return allReady(d, 2) && s?.apiPort !== port && s?.pid !== pid ? s : undefined;
        },
        80_000,
      );
      // At least the kill's restart and the relaunch.
      expect(back.restarts).toBeGreaterThanOrEqual((status?.restarts ?? 0) + 2);
      const events = (await cp.admin().listEvents({ limit: 1000 }, cp.adminHeaders())).events;
      expect(
        events.some(
          (e) =>
            e.subject === victim?.replicaId &&
            /→ failed \(restart policy gave up.*; the agent launches it afresh at /.test(e.message),
        ),
        events.map((e) => `${e.subject}: ${e.message}`).join("\n"),
      ).toBe(true);
      await waitFor("the router to reach it on its new port", async () => {
        const seen = await chatThroughRouter("chat", 6);
        return seen.has(victim?.replicaId as string) ? true : undefined;
      });
    } finally {
      squatter.close();
    }
  });

  it("adopts running engines after an agent is SIGKILLed and restarted: same pids", {
    timeout: 60_000,
  }, async () => {
    const before = new Map([
      ...enginePids(await deployment(cp, "chat")),
      ...enginePids(await deployment(cp, "gang")),
    ]);
    await agentA.kill("SIGKILL");
    agentA.start();
    let seen = "";
    const after = await waitFor("node-a's replicas to be reported adopted", async () => {
      const chat = await deployment(cp, "chat");
      const gang = await deployment(cp, "gang");
      const ranks = [...(chat?.replicas ?? []), ...(gang?.replicas ?? [])].flatMap((r) => r.ranks);
      seen = ranks
        .map(
          (k) =>
            `${k.replicaId}/${k.rank}@${k.nodeId}:${k.status?.state}:${k.status?.pid}:${k.status?.adopted}:${k.status?.message}`,
        )
        .join(" | ");
      const onA = ranks.filter((k) => k.status?.adopted);
      return allReady(chat, 2) && allReady(gang, 1) && onA.length >= 2
        ? new Map([...enginePids(chat), ...enginePids(gang)])
        : undefined;
    }).catch((error: unknown) => {
      throw new Error(
        `${(error as Error).message}; last seen: ${seen}\nagent log:\n${agentA.proc?.output().slice(-3000)}`,
      );
    });
    expect(after).toEqual(before);
    // The restarted agent read the adopted engines' keys back from its replica records.
    await waitFor("the router to reach both adopted chat replicas", async () => {
      const seen = await chatThroughRouter("chat", 6);
      return seen.size === 2 ? true : undefined;
    });
  });

  it("survives a control plane restart: deployments and placements persist, no engine restarts", {
    timeout: 60_000,
  }, async () => {
    const before = new Map([
      ...enginePids(await deployment(cp, "chat")),
      ...enginePids(await deployment(cp, "gang")),
    ]);
    await cp.stop("SIGTERM");
    await cp.start();
    const after = await waitFor("agents to report every replica again", async () => {
      const chat = await deployment(cp, "chat");
      const gang = await deployment(cp, "gang");
      return allReady(chat, 2) && allReady(gang, 1)
        ? new Map([...enginePids(chat), ...enginePids(gang)])
        : undefined;
    });
    expect(after).toEqual(before);
    // Engine keys live in the control plane's memory only: the agents' next heartbeats
    // bring them back, and routing with them.
    await waitFor("the router to reach both chat replicas again", async () => {
      const seen = await chatThroughRouter("chat", 6);
      return seen.size === 2 ? true : undefined;
    });
  });

  it("moves the replicas of an agent that stays away longer than the grace", {
    timeout: 180_000,
  }, async () => {
    const nodeB = await nodeIdOf("node-b");
    await agentB.kill("SIGKILL");
    let seen = "";
    await waitFor(
      "node-b to be lost and chat to be ready on node-a only",
      async () => {
        const nodes = await cp.admin().listNodes({}, cp.adminHeaders());
        const b = nodes.nodes.find((n) => n.nodeId === nodeB);
        const chat = await deployment(cp, "chat");
        const placed = await placedNodes("chat");
        seen = `node-b ${NodeState[b?.state ?? 0]}, chat on ${placed.join(",")}, states ${chat?.replicas.map((r) => r.state).join(",")} reasons ${chat?.unschedulable.map((u) => u.message).join("; ")}`;
        return b?.state === NodeState.LOST && allReady(chat, 2) && !placed.includes(nodeB)
          ? true
          : undefined;
      },
      60_000,
    ).catch((error: unknown) => {
      throw new Error(`${(error as Error).message}; last seen: ${seen}`);
    });
    // The gang needs two nodes: with one left it cannot be placed, and says why.
    const gang = await deployment(cp, "gang");
    expect(gang?.readyReplicas).toBe(0);
    expect(gang?.unschedulable.length).toBeGreaterThan(0);
    // node-b comes back: the engines it left behind are no longer wanted and are stopped.
    agentB.start();
    let seenGang = "";
    await waitFor(
      "the gang to be placed again across both nodes",
      async () => {
        const d = await deployment(cp, "gang");
        const nodes = await cp.admin().listNodes({}, cp.adminHeaders());
        seenGang = `nodes ${nodes.nodes.map((n) => `${n.hostname}:${NodeState[n.state]}`).join(",")}; gang replicas ${d?.replicas.map((r) => `${r.replicaId}:${r.state}:${r.ranks.map((k) => `${k.nodeId}/${k.status?.state}/${k.status?.message}`).join("+")}`).join(",")}; reasons ${d?.unschedulable.map((u) => u.message).join("; ")}`;
        return allReady(d, 1) ? true : undefined;
      },
      60_000,
    ).catch((error: unknown) => {
      throw new Error(
        `${(error as Error).message}; last seen: ${seenGang}\nagent b log:\n${agentB.proc?.output().slice(-2500)}`,
      );
    });
  });

  it("drains a node: its replicas leave it", async () => {
    const nodeA = await nodeIdOf("node-a");
    await cp.admin().drainNode({ node: nodeA }, cp.adminHeaders());
    await waitFor(
      "chat to leave node-a",
      async () => {
        const placed = await placedNodes("chat");
        const chat = await deployment(cp, "chat");
        return !placed.includes(nodeA) && allReady(chat, 2) ? true : undefined;
      },
      60_000,
    );
    await cp.admin().uncordonNode({ node: nodeA }, cp.adminHeaders());
  });

  it.skipIf(findLlamaServer() === undefined)(
    "runs the same deploy-to-ready path with the real llama-server, and serves it through the router",
    { timeout: 120_000 },
    async () => {
      const model = await ensureTinyModel("tiny");
      await cp.admin().applyDeployment(
        {
          deployment: create(DeploymentSchema, {
            name: "tiny",
            model,
            engine: Engine.LLAMACPP,
            replicas: 1,
            gpusPerReplica: 0,
            maxModelLen: 1024,
          }),
        },
        cp.adminHeaders(),
      );
      await waitFor(
        "the llama.cpp replica to be ready",
        async () => (allReady(await deployment(cp, "tiny"), 1) ? true : undefined),
        60_000,
      );
      const { secret } = await cp.admin().createApiKey({ name: "e2e" }, cp.adminHeaders());
      const client = new OpenAI({ baseURL: `${cp.publicUrl}/v1`, apiKey: secret });
      // Random weights and llama-server's default sampling: an end-of-sequence first token
      // (an empty answer) is a matter of chance, so the answer goes on past it
      // (llama-server's `ignore_eos`; the router forwards the body untouched).
      const answer = await client.chat.completions.create({
        model: "tiny",
        max_tokens: 8,
        messages: [{ role: "user", content: "hello" }],
        ...({ ignore_eos: true } as object),
      });
      expect(answer.choices[0]?.message.content?.length).toBeGreaterThan(0);
      const stream = await client.chat.completions.create({
        model: "tiny",
        max_tokens: 8,
        stream: true,
        messages: [{ role: "user", content: "hello again" }],
      });
      let chunks = 0;
      for await (const _ of stream) chunks += 1;
      expect(chunks).toBeGreaterThan(1);
      await cp.admin().deleteDeployment({ name: "tiny" }, cp.adminHeaders());
    },
  );

  it("the join token alone cannot take over a live node: it keeps its address, credential and traffic", async () => {
    const transport = createConnectTransport({ baseUrl: cp.controlUrl, httpVersion: "1.1" });
    const agents = createClient(AgentService, transport);
    const nodeB = await nodeIdOf("node-b");
    const before = (await cp.admin().getNode({ node: nodeB }, cp.adminHeaders())).node;
    // Node ids are public (on /metrics); the caller has the join token but not node-b's
    // credential, and asks for node-b's identity with its own address.
    const hijack = await agents
      .register(
        create(RegisterRequestSchema, {
          previousNodeId: nodeB,
          advertiseAddress: "127.0.0.9",
          inventory: { hostname: "node-b", agentVersion: "0.1.0" },
        }),
        { headers: { authorization: `Bearer ${cp.token()}` } },
      )
      .catch((e: unknown) => ConnectError.from(e));
    expect(hijack).toBeInstanceOf(ConnectError);
    expect((hijack as ConnectError).code).toBe(Code.PermissionDenied);
    expect((hijack as ConnectError).rawMessage).toContain(`llmgw nodes reset ${nodeB}`);
    // The real agent's credential still works: its heartbeats keep arriving.
    const after = await waitFor("node-b to heartbeat after the attempt", async () => {
      const n = (await cp.admin().getNode({ node: nodeB }, cp.adminHeaders())).node;
      return (n?.lastHeartbeatUnixMs ?? 0n) > (before?.lastHeartbeatUnixMs ?? 0n) ? n : undefined;
    });
    expect(after.state).toBe(NodeState.READY);
    expect(after.advertiseAddress).toBe(before?.advertiseAddress);
    expect(after.advertiseAddress).not.toBe("127.0.0.9");
    // Users' requests still reach the real engines.
    expect((await chatThroughRouter("chat", 4)).size).toBeGreaterThan(0);
  });

  it("refuses a wrong join token, a revoked node and a missing admin token, clearly", async () => {
    const transport = createConnectTransport({ baseUrl: cp.controlUrl, httpVersion: "1.1" });
    const agents = createClient(AgentService, transport);
    const wrong = await agents
      .register(create(RegisterRequestSchema, { advertiseAddress: "127.0.0.1" }), {
        headers: { authorization: "Bearer llmgw-join-not-the-token" },
      })
      .catch((e: unknown) => ConnectError.from(e));
    expect(wrong).toBeInstanceOf(ConnectError);
    expect((wrong as ConnectError).code).toBe(Code.Unauthenticated);
    expect((wrong as ConnectError).rawMessage).toMatch(/join token/i);

    const noAdmin = await cp
      .admin()
      .listNodes({})
      .catch((e: unknown) => ConnectError.from(e));
    expect((noAdmin as ConnectError).code).toBe(Code.Unauthenticated);
    expect((noAdmin as ConnectError).rawMessage).toMatch(/admin token/i);

    // A node registered by hand, then revoked: its credential stops working.
    const joined = await agents.register(
      create(RegisterRequestSchema, {
        advertiseAddress: "127.0.0.1",
        inventory: { hostname: "hand-made", agentVersion: "0.1.0" },
      }),
      { headers: { authorization: `Bearer ${cp.token()}` } },
    );
    await cp.admin().revokeNode({ node: joined.nodeId }, cp.adminHeaders());
    const revoked = await agents
      .heartbeat(create(HeartbeatRequestSchema, { nodeId: joined.nodeId }), {
        headers: { authorization: `Bearer ${joined.nodeCredential}` },
      })
      .catch((e: unknown) => ConnectError.from(e));
    expect((revoked as ConnectError).code).toBe(Code.Unauthenticated);
  });
});

describe("a control plane over a corrupt store", () => {
  it("refuses to start with a clear error instead of serving an empty cluster", async () => {
    const dir = tempRoot("llmgw-corrupt-");
    try {
      const { mkdirSync } = await import("node:fs");
      mkdirSync(path.join(dir, "cp"), { recursive: true, mode: 0o700 });
      writeFileSync(
        path.join(dir, "cp", "state.db"),
        "this is not a database, just garbage".repeat(200),
      );
      const proc = runLlmgw([
        "control-plane",
        "--data-dir",
        path.join(dir, "cp"),
        "--listen",
        `127.0.0.1:${await freePort()}`,
        "--control-listen",
        `127.0.0.1:${await freePort()}`,
      ]);
      const code = await proc.exited;
      expect(code).not.toBe(0);
      expect(proc.output()).toMatch(/LLMGW_CONTROL_PLANE_STORE_CORRUPT/);
      expect(proc.output()).toMatch(/state\.db/);
    } finally {
      await stopAll([dir]);
    }
  });
});
