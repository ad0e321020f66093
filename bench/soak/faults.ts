/**
 * The faults the soak injects into a live cluster, each observed until the cluster is whole
 * again (or a deadline passes). They use the end-to-end harness's real processes and admin API.
 */
import { create } from "@bufbuild/protobuf";
import { DeploymentSchema, type DeploymentStatus, Engine, ReplicaState } from "@llmgw/proto";
import {
  type AgentProc,
  allReady,
  type ControlPlaneProc,
  deployment,
  enginePids,
  waitFor,
} from "../../apps/cli/test/cluster-harness.js";
import type { FaultRecord } from "./report.js";
import type { RouterProc } from "./routers.js";

/** The cluster the faults act on. */
export interface SoakCluster {
  readonly cp: ControlPlaneProc;
  readonly agents: readonly AgentProc[];
  /** The main deployment and its replica count. */
  readonly deployment: string;
  readonly replicas: number;
  /** The served model name every deployment of the soak shares. */
  readonly model: string;
  /** ms since the run started. */
  readonly now: () => number;
  /** How long a fault may take to heal before it is reported as not recovered, ms. */
  readonly healTimeoutMs: number;
  /**
   * `llmgw router` processes serving the load (the control plane runs `--no-public-api`);
   * none: the control plane's in-process router serves it.
   */
  readonly routers?: readonly RouterProc[];
}

/** True when every router (if any) streams live state from the control plane again. */
async function routersLive(c: SoakCluster): Promise<boolean> {
  const live = await Promise.all((c.routers ?? []).map((r) => r.live()));
  return live.every(Boolean);
}

/** What each router's /readyz says, for the notes. */
async function describeRouters(c: SoakCluster): Promise<string> {
  const states = await Promise.all(
    (c.routers ?? []).map(async (r) => {
      const x = await r.readiness();
      return x === undefined
        ? `${r.name} not answering`
        : `${r.name} ${x.status} source=${x.source} connected=${x.connected} age=${x.stateAgeMs === undefined ? "-" : `${(x.stateAgeMs / 1000).toFixed(1)}s`}`;
    }),
  );
  return states.join(", ");
}

/** A sim deployment serving `model`. */
export function simDeployment(
  name: string,
  model: string,
  replicas: number,
  extraArgs: string[] = [],
): ReturnType<typeof create<typeof DeploymentSchema>> {
  return create(DeploymentSchema, {
    name,
    model: `sim/${name}`,
    servedModelName: model,
    engine: Engine.SIM,
    gpuClass: "h100-80g",
    replicas,
    extraArgs,
  });
}

/** Applies a deployment and waits until all its replicas are READY. */
export async function deployAndWait(
  c: SoakCluster,
  spec: ReturnType<typeof simDeployment>,
  timeoutMs: number,
): Promise<DeploymentStatus> {
  await c.cp.admin().applyDeployment({ deployment: spec }, c.cp.adminHeaders());
  return waitFor(
    `${spec.name} to be ready`,
    async () => {
      const d = await deployment(c.cp, spec.name);
      return allReady(d, spec.replicas) ? d : undefined;
    },
    timeoutMs,
  );
}

const describePids = (pids: Map<string, number>) =>
  [...pids].map(([replica, pid]) => `${replica}=${pid}`).join(" ");

/** SIGKILLs the engine of the main deployment's first replica; healed when it is READY with a new pid. */
export async function killEngine(c: SoakCluster): Promise<FaultRecord> {
  const before = await deployment(c.cp, c.deployment);
  const victim = before?.replicas[0];
  const pid = victim?.ranks[0]?.status?.pid;
  const atMs = c.now();
  if (!victim || !pid) {
    return {
      kind: "engine-kill",
      atMs,
      readyAtMs: undefined,
      adopted: null,
      notes: ["no engine pid reported"],
    };
  }
  process.kill(pid, "SIGKILL");
  const notes = [`killed ${victim.replicaId} pid ${pid} on ${victim.ranks[0]?.nodeId}`];
  try {
    const status = await waitFor(
      "the killed engine to be relaunched and ready",
      async () => {
        const d = await deployment(c.cp, c.deployment);
        const r = d?.replicas.find((x) => x.replicaId === victim.replicaId);
        const s = r?.ranks[0]?.status;
        return r?.state === ReplicaState.READY && s?.pid !== undefined && s.pid !== pid
          ? s
          : undefined;
      },
      c.healTimeoutMs,
      100,
    );
    notes.push(`relaunched as pid ${status.pid}, restarts ${status.restarts}`);
    return { kind: "engine-kill", atMs, readyAtMs: c.now(), adopted: null, notes };
  } catch (error) {
    notes.push((error as Error).message);
    return { kind: "engine-kill", atMs, readyAtMs: undefined, adopted: null, notes };
  }
}

/**
 * SIGKILLs the agent hosting the most replicas and starts it again at once; healed when its
 * replicas are READY and reported by the new agent. Adopted when every pid is unchanged.
 */
export async function restartAgent(c: SoakCluster): Promise<FaultRecord> {
  const before = await deployment(c.cp, c.deployment);
  const nodes = await c.cp.admin().listNodes({}, c.cp.adminHeaders());
  const perNode = new Map<string, number>();
  for (const r of before?.replicas ?? []) {
    const node = r.ranks[0]?.nodeId ?? "";
    perNode.set(node, (perNode.get(node) ?? 0) + 1);
  }
  const [nodeId] = [...perNode].sort((a, b) => b[1] - a[1])[0] ?? [""];
  const hostname = nodes.nodes.find((n) => n.nodeId === nodeId)?.hostname;
  const agent = c.agents.find((a) => a.name === hostname) ?? c.agents[0];
  const onNode = new Map(
    [...enginePids(before)].filter(([key]) =>
      before?.replicas.some(
        (r) => key.startsWith(`${r.replicaId}/`) && r.ranks[0]?.nodeId === nodeId,
      ),
    ),
  );
  const atMs = c.now();
  if (!agent)
    return {
      kind: "agent-restart",
      atMs,
      readyAtMs: undefined,
      adopted: null,
      notes: ["no agent"],
    };
  await agent.kill("SIGKILL");
  agent.start();
  const notes = [
    `SIGKILLed and restarted agent ${agent.name}; its engines ${describePids(onNode)}`,
  ];
  let seen = "";
  try {
    const after = await waitFor(
      "the restarted agent to report its engines",
      async () => {
        const d = await deployment(c.cp, c.deployment);
        const ranks = (d?.replicas ?? []).flatMap((r) => r.ranks);
        const mine = ranks.filter((k) => onNode.has(`${k.replicaId}/${k.rank}`));
        seen = mine
          .map((k) => `${k.replicaId}:${k.status?.pid}:adopted=${k.status?.adopted}`)
          .join(" ");
        const reported = mine.every(
          (k) =>
            k.status?.adopted === true || k.status?.pid !== onNode.get(`${k.replicaId}/${k.rank}`),
        );
        return allReady(d, c.replicas) && mine.length === onNode.size && reported ? d : undefined;
      },
      c.healTimeoutMs,
      100,
    );
    const pids = new Map([...enginePids(after)].filter(([key]) => onNode.has(key)));
    const adopted = describePids(pids) === describePids(onNode);
    notes.push(`after: ${describePids(pids)}`);
    return { kind: "agent-restart", atMs, readyAtMs: c.now(), adopted, notes };
  } catch (error) {
    notes.push(`${(error as Error).message}; last seen ${seen}`);
    return { kind: "agent-restart", atMs, readyAtMs: undefined, adopted: false, notes };
  }
}

/**
 * SIGTERMs the control plane (and with it the router) and starts it again on the same ports
 * and data dir; healed when every replica is READY again. Adopted when no engine pid changed.
 */
export async function restartControlPlane(c: SoakCluster): Promise<FaultRecord> {
  const before = enginePids(await deployment(c.cp, c.deployment));
  const atMs = c.now();
  await c.cp.stop("SIGTERM");
  const stoppedMs = c.now();
  await c.cp.start();
  const upMs = c.now();
  const notes = [
    `stopped in ${Math.round(stoppedMs - atMs)} ms, listening again after ${Math.round(upMs - atMs)} ms`,
  ];
  try {
    const after = await waitFor(
      "every replica to be reported READY again",
      async () => {
        const d = await deployment(c.cp, c.deployment);
        return allReady(d, c.replicas) ? d : undefined;
      },
      c.healTimeoutMs,
      100,
    );
    const pids = enginePids(after);
    notes.push(`engines before ${describePids(before)}, after ${describePids(pids)}`);
    return {
      kind: "control-plane-restart",
      atMs,
      readyAtMs: c.now(),
      adopted: describePids(pids) === describePids(before),
      notes,
      outage: { fromMs: atMs, toMs: upMs },
    };
  } catch (error) {
    notes.push((error as Error).message);
    return {
      kind: "control-plane-restart",
      atMs,
      readyAtMs: undefined,
      adopted: false,
      notes,
      outage: { fromMs: atMs, toMs: upMs },
    };
  }
}

/**
 * SIGKILLs the control plane and starts it again on the same ports and data dir after `downMs`
 * (0: at once); healed when every replica is READY again and every router streams live state
 * again. Adopted when no engine pid changed. Without routers the public API went down with it
 * (an outage, during which an immediate reset is excused); with routers nothing is excused.
 */
export async function killControlPlane(c: SoakCluster, downMs: number): Promise<FaultRecord> {
  const kind = downMs > 0 ? "control-plane-down" : "control-plane-kill";
  const before = enginePids(await deployment(c.cp, c.deployment));
  const atMs = c.now();
  await c.cp.stop("SIGKILL");
  const notes = [`SIGKILLed after ${Math.round(c.now() - atMs)} ms`];
  if (downMs > 0) {
    await new Promise((r) => setTimeout(r, downMs));
    if (c.routers) notes.push(`after ${downMs / 1000} s down: ${await describeRouters(c)}`);
  }
  const restartMs = c.now();
  await c.cp.start();
  const upMs = c.now();
  notes.push(
    `started again at +${Math.round(restartMs - atMs)} ms, listening at +${Math.round(upMs - atMs)} ms`,
  );
  const outage = c.routers ? {} : { outage: { fromMs: atMs, toMs: upMs } };
  try {
    const after = await waitFor(
      c.routers
        ? "every replica READY again and every router live"
        : "every replica to be reported READY again",
      async () => {
        const d = await deployment(c.cp, c.deployment);
        return allReady(d, c.replicas) && (await routersLive(c)) ? d : undefined;
      },
      c.healTimeoutMs,
      100,
    );
    const pids = enginePids(after);
    notes.push(`engines before ${describePids(before)}, after ${describePids(pids)}`);
    return {
      kind,
      atMs,
      readyAtMs: c.now(),
      adopted: describePids(pids) === describePids(before),
      notes,
      ...outage,
    };
  } catch (error) {
    notes.push((error as Error).message);
    if (c.routers) notes.push(await describeRouters(c));
    return { kind, atMs, readyAtMs: undefined, adopted: false, notes, ...outage };
  }
}

/**
 * SIGKILLs router `index` and starts it again (same port and state dir) after `downMs`, long
 * enough for the balancer's health check to take it out of the pool; healed when it streams
 * live state again (the balancer re-adds it after its `rise` checks). Only requests in flight
 * on it may fail.
 */
export async function killRouter(
  c: SoakCluster,
  index: number,
  downMs: number,
): Promise<FaultRecord> {
  const router = c.routers?.[index];
  const atMs = c.now();
  if (router === undefined) {
    return { kind: "router-kill", atMs, readyAtMs: undefined, adopted: null, notes: ["no router"] };
  }
  await router.kill("SIGKILL");
  const notes = [`SIGKILLed ${router.name}`];
  await new Promise((r) => setTimeout(r, downMs));
  const restartMs = c.now();
  await router.start();
  const first = await router.readiness();
  notes.push(
    `started again at +${Math.round(restartMs - atMs)} ms, listening at +${Math.round(c.now() - atMs)} ms (${first?.status ?? "?"}, source ${first?.source ?? "?"})`,
  );
  try {
    await waitFor(`${router.name} to stream live state`, () => router.live(), c.healTimeoutMs, 100);
    return { kind: "router-kill", atMs, readyAtMs: c.now(), adopted: null, notes };
  } catch (error) {
    notes.push((error as Error).message);
    return { kind: "router-kill", atMs, readyAtMs: undefined, adopted: null, notes };
  }
}

/**
 * Adds one slow replica to the model: a second deployment with the same served model name whose
 * engine runs with the sim's `--slow-token-ms` (the SIM adapter passes `extraArgs` through).
 * The running replicas cannot be slowed in place: the sim reads its fault flags at start.
 */
export async function addSlowReplica(c: SoakCluster, slowTokenMs: number): Promise<FaultRecord> {
  const atMs = c.now();
  const name = `${c.deployment}-slow`;
  const notes = [`deployment ${name}: 1 replica with --slow-token-ms ${slowTokenMs}`];
  try {
    const d = await deployAndWait(
      c,
      simDeployment(name, c.model, 1, ["--slow-token-ms", String(slowTokenMs)]),
      c.healTimeoutMs,
    );
    notes.push(
      `slow replica ${d.replicas[0]?.replicaId} ready on ${d.replicas[0]?.ranks[0]?.nodeId}`,
    );
    return { kind: "slow-replica", atMs, readyAtMs: c.now(), adopted: null, notes };
  } catch (error) {
    notes.push((error as Error).message);
    return { kind: "slow-replica", atMs, readyAtMs: undefined, adopted: null, notes };
  }
}
