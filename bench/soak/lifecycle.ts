/**
 * The planned changes of the soak's `lifecycle` phase (issue 21): each one is asked for the way
 * an operator would (the admin API, or a signal to an agent) and observed by polling
 * GetDeployment every 100 ms until it is done, recording the fewest replicas that took new
 * requests on the way. No client may notice any of them.
 */
import { rolloutLimits } from "@llmgw/engines";
import {
  type DeploymentStatus,
  NodeState,
  ReplicaState,
  RetirementPhase,
  RolloutState,
} from "@llmgw/proto";
import { deploymentSpecFromProto } from "@llmgw/wire";
import { allReady, deployment } from "../../apps/cli/test/cluster-harness.js";
import { type SoakCluster, simDeployment } from "./faults.js";
import type { FaultRecord, PlannedKind } from "./report.js";

/** How the planned changes run. */
export interface LifecycleOptions {
  /** How long one change may take before its wait gives up (then reported as never done), ms. */
  readonly waitMs: number;
  /** The second deployment serving the same model, applied at phase start and undeployed last. */
  readonly extraDeployment: string;
}

/** Replicas of `d` that take new requests: READY, and not leaving or leaving but still WAITING. */
export function capacity(d: DeploymentStatus | undefined): number {
  return (d?.replicas ?? []).filter(
    (r) =>
      r.state === ReplicaState.READY &&
      (r.retirement === undefined || r.retirement.phase === RetirementPhase.WAITING),
  ).length;
}

/**
 * The deployment is whole: `count` replicas, every rank READY, all at the current revision,
 * none leaving.
 */
export function whole(d: DeploymentStatus | undefined, count: number): boolean {
  if (d === undefined || !allReady(d, count)) return false;
  return d.replicas.every((r) => r.revision === d.spec?.revision && r.retirement === undefined);
}

/**
 * Replicas (any deployment) seen leaving during one change: replica id → when a poll last saw
 * it with `retirement` set, ms. Ids are reused once a replica is gone, so a request answered
 * under that id counts as the leaving replica's only when it started by then.
 */
type LeavingLog = Map<string, number>;

interface Observed {
  readonly doneAtMs: number | undefined;
  readonly minCapacity: number | undefined;
  readonly last: DeploymentStatus | undefined;
  readonly error?: string;
}

/**
 * Polls the main deployment every 100 ms (a poll that throws counts as no answer) until
 * `done(d)`, or `waitMs`; tracks the fewest replicas taking new requests, and (ListReplicas,
 * in the same poll) every replica leaving, into `leaving`.
 */
async function observe(
  c: SoakCluster,
  what: string,
  done: (d: DeploymentStatus | undefined) => Promise<boolean> | boolean,
  waitMs: number,
  leaving: LeavingLog,
): Promise<Observed> {
  const deadline = performance.now() + waitMs;
  let minCapacity: number | undefined;
  let last: DeploymentStatus | undefined;
  let lastError: string | undefined;
  for (;;) {
    const polledMs = performance.now();
    try {
      const [d, all] = await Promise.all([
        deployment(c.cp, c.deployment),
        c.cp.admin().listReplicas({}, c.cp.adminHeaders()),
      ]);
      last = d;
      const seenMs = c.now();
      for (const r of all.replicas) if (r.retirement) leaving.set(r.replicaId, seenMs);
      const n = capacity(last);
      minCapacity = minCapacity === undefined ? n : Math.min(minCapacity, n);
      if (await done(last)) return { doneAtMs: c.now(), minCapacity, last };
    } catch (error) {
      lastError = (error as Error).message;
    }
    if (performance.now() > deadline) {
      return {
        doneAtMs: undefined,
        minCapacity,
        last,
        error: `not done after ${waitMs} ms: ${what}${lastError ? ` (last error: ${lastError})` : ""}`,
      };
    }
    await new Promise((r) => setTimeout(r, Math.max(0, 100 - (performance.now() - polledMs))));
  }
}

/** "chat-0 r3 READY, chat-1 r2 READY draining (1 in flight)" for the notes. */
function describeReplicas(d: DeploymentStatus | undefined): string {
  return (d?.replicas ?? [])
    .map((r) => {
      const leaving = r.retirement
        ? ` ${RetirementPhase[r.retirement.phase]?.toLowerCase()}${r.retirement.inFlight === undefined ? "" : ` (${r.retirement.inFlight} in flight)`}`
        : "";
      return `${r.replicaId} r${r.revision} ${ReplicaState[r.state]} on ${r.ranks[0]?.nodeId ?? "?"}${leaving}`;
    })
    .join(", ");
}

/** Replica ranks each node holds (any deployment), from ListNodes. */
async function placedPerNode(
  c: SoakCluster,
): Promise<{ nodeId: string; hostname: string; placed: number }[]> {
  const res = await c.cp.admin().listNodes({}, c.cp.adminHeaders());
  return res.nodes
    .map((n) => ({ nodeId: n.nodeId, hostname: n.hostname, placed: n.placed.length }))
    .sort((a, b) => b.placed - a.placed || a.hostname.localeCompare(b.hostname));
}

/** The node takes new replicas: READY, neither cordoned nor draining. */
async function schedulable(c: SoakCluster, nodeId: string): Promise<boolean> {
  const res = await c.cp.admin().getNode({ node: nodeId }, c.cp.adminHeaders());
  const n = res.node;
  return n !== undefined && n.state === NodeState.READY && !n.cordoned && !n.draining;
}

function record(
  kind: PlannedKind,
  atMs: number,
  commandAtMs: number,
  leaving: LeavingLog,
  seen: Observed,
  notes: string[],
  extra: { readyAtMs?: number | undefined; capacityFloor?: number } = {},
): FaultRecord {
  if (seen.error) notes.push(`${seen.error}; last seen ${describeReplicas(seen.last)}`);
  const left = [...leaving].map(([replicaId, lastSeenMs]) => ({ replicaId, lastSeenMs }));
  if (left.length > 0) notes.push(`left: ${left.map((l) => l.replicaId).join(" ")}`);
  return {
    kind,
    atMs,
    readyAtMs: "readyAtMs" in extra ? extra.readyAtMs : seen.doneAtMs,
    adopted: null,
    notes,
    planned: {
      commandAtMs,
      doneAtMs: seen.doneAtMs,
      minCapacity: seen.minCapacity,
      ...(extra.capacityFloor === undefined ? {} : { capacityFloor: extra.capacityFloor }),
      left,
    },
  };
}

/** Scales the main deployment to `replicas`; done when it is whole at that count. */
export async function scaleMain(
  c: SoakCluster,
  kind: "scale-down" | "scale-up",
  replicas: number,
  o: LifecycleOptions,
): Promise<FaultRecord> {
  const leaving: LeavingLog = new Map();
  const atMs = c.now();
  await c.cp.admin().scaleDeployment({ name: c.deployment, replicas }, c.cp.adminHeaders());
  const seen = await observe(
    c,
    `${c.deployment} whole at ${replicas}`,
    (d) => whole(d, replicas),
    o.waitMs,
    leaving,
  );
  return record(kind, atMs, atMs, leaving, seen, [`${c.deployment} scaled to ${replicas}`]);
}

/**
 * Applies a new revision of the main deployment that changes how its engines run (the sim's
 * `--seed`); done when it is whole at the new revision. The capacity floor is the rolled-out
 * spec's `replicas − maxUnavailable`.
 */
export async function rollingUpdate(c: SoakCluster, o: LifecycleOptions): Promise<FaultRecord> {
  const leaving: LeavingLog = new Map();
  const atMs = c.now();
  const from = (await deployment(c.cp, c.deployment))?.spec?.revision;
  await c.cp
    .admin()
    .applyDeployment(
      { deployment: simDeployment(c.deployment, c.model, c.replicas, ["--seed", "7"]) },
      c.cp.adminHeaders(),
    );
  const seen = await observe(
    c,
    `${c.deployment} whole at a revision after ${from}`,
    (d) => whole(d, c.replicas) && from !== undefined && (d?.spec?.revision ?? 0n) > from,
    o.waitMs,
    leaving,
  );
  const spec = seen.last?.spec;
  const floor = spec
    ? spec.replicas - rolloutLimits(deploymentSpecFromProto(spec)).maxUnavailable
    : undefined;
  const rollout = seen.last?.rollout;
  const notes = [
    `revision ${from} → ${spec?.revision} (--seed 7)`,
    `rollout ${rollout ? RolloutState[rollout.state] : "none"}${rollout?.message ? `: ${rollout.message}` : ""}`,
  ];
  return record("rolling-update", atMs, atMs, leaving, seen, notes, {
    ...(floor === undefined ? {} : { capacityFloor: floor }),
  });
}

/**
 * Drains the node holding the most replicas (DrainNode); done when none is placed on it; then
 * uncordons it. Healed when the node is schedulable again and the main deployment whole.
 */
export async function drainNode(c: SoakCluster, o: LifecycleOptions): Promise<FaultRecord> {
  const [node] = await placedPerNode(c);
  const leaving: LeavingLog = new Map();
  const atMs = c.now();
  if (!node) return record("node-drain", atMs, atMs, leaving, noNode, ["no node"]);
  await c.cp.admin().drainNode({ node: node.nodeId }, c.cp.adminHeaders());
  const notes = [`drained ${node.hostname} (${node.placed} replica ranks)`];
  const seen = await observe(
    c,
    `no replica on ${node.hostname}`,
    async () => (await placedPerNode(c)).find((n) => n.nodeId === node.nodeId)?.placed === 0,
    o.waitMs,
    leaving,
  );
  await c.cp.admin().uncordonNode({ node: node.nodeId }, c.cp.adminHeaders());
  const healed = await observe(
    c,
    `${node.hostname} schedulable and ${c.deployment} whole`,
    async (d) => whole(d, c.replicas) && (await schedulable(c, node.nodeId)),
    o.waitMs,
    leaving,
  );
  notes.push(`uncordoned; then ${describeReplicas(healed.last)}`);
  if (healed.error) notes.push(healed.error);
  return record("node-drain", atMs, atMs, leaving, seen, notes, { readyAtMs: healed.doneAtMs });
}

const noNode: Observed = { doneAtMs: undefined, minCapacity: undefined, last: undefined };

/**
 * An agent leaves with its engines: the agent hosting the most replicas is restarted with
 * `--stop-engines` (SIGTERM, which leaves engines running; the new one adopts them), then
 * SIGTERMed: it drains its node (SetLeaving) and exits. Done when it exited and the main
 * deployment is whole again elsewhere; then it starts again without the flag, and the event is
 * healed when its node is schedulable again (the start ends the agent's own drain) and the
 * deployment whole.
 */
export async function agentLeave(c: SoakCluster, o: LifecycleOptions): Promise<FaultRecord> {
  const [node] = await placedPerNode(c);
  const agent = c.agents.find((a) => a.name === node?.hostname);
  const leaving: LeavingLog = new Map();
  const atMs = c.now();
  if (!node || !agent) return record("agent-leave", atMs, atMs, leaving, noNode, ["no agent"]);
  const leaveTimeoutS = Math.ceil(o.waitMs / 1000);
  await agent.kill("SIGTERM");
  agent.start(["--stop-engines", "--leave-timeout", String(leaveTimeoutS)]);
  const notes = [`${agent.name} (${node.placed} replica ranks) restarted with --stop-engines`];
  const adopted = await observe(
    c,
    `${agent.name}'s engines adopted`,
    async (d) => {
      const res = await c.cp.admin().getNode({ node: node.nodeId }, c.cp.adminHeaders());
      const ranks = res.node?.placed ?? [];
      return (
        whole(d, c.replicas) &&
        res.node?.state === NodeState.READY &&
        ranks.length === node.placed &&
        ranks.every((k) => k.status?.adopted === true)
      );
    },
    o.waitMs,
    leaving,
  );
  if (adopted.error) return record("agent-leave", atMs, atMs, leaving, adopted, notes);
  notes.push(`its engines adopted at +${((c.now() - atMs) / 1000).toFixed(1)} s`);
  const commandAtMs = c.now();
  const leavingProc = agent.proc;
  let exitedAtMs: number | undefined;
  void leavingProc?.exited.then(() => {
    exitedAtMs = c.now();
  });
  leavingProc?.child.kill("SIGTERM");
  // Polled while it drains, so the capacity of the whole leave is seen.
  const seen = await observe(
    c,
    `${agent.name} to exit and ${c.deployment} to be whole without it`,
    (d) => exitedAtMs !== undefined && whole(d, c.replicas),
    o.waitMs,
    leaving,
  );
  notes.push(
    exitedAtMs === undefined
      ? `SIGTERM: still running after ${o.waitMs} ms`
      : `SIGTERM: exited after ${((exitedAtMs - commandAtMs) / 1000).toFixed(1)} s (code ${leavingProc?.child.exitCode})`,
  );
  if (exitedAtMs === undefined) await agent.kill("SIGKILL");
  agent.start();
  const healed = await observe(
    c,
    `${agent.name}'s node schedulable and ${c.deployment} whole`,
    async (d) => whole(d, c.replicas) && (await schedulable(c, node.nodeId)),
    o.waitMs,
    leaving,
  );
  notes.push(`started again without the flag; then ${describeReplicas(healed.last)}`);
  if (healed.error) notes.push(healed.error);
  // Capacity from the first restart on: the adoption counts as much as the leave.
  const minCapacity =
    adopted.minCapacity === undefined || seen.minCapacity === undefined
      ? (adopted.minCapacity ?? seen.minCapacity)
      : Math.min(adopted.minCapacity, seen.minCapacity);
  return record("agent-leave", atMs, commandAtMs, leaving, { ...seen, minCapacity }, notes, {
    readyAtMs: healed.doneAtMs,
  });
}

/**
 * Deletes the second deployment serving the model; done when none of its replicas is left and
 * the main deployment is whole (it keeps serving the model throughout).
 */
export async function undeployExtra(c: SoakCluster, o: LifecycleOptions): Promise<FaultRecord> {
  const leaving: LeavingLog = new Map();
  const atMs = c.now();
  await c.cp.admin().deleteDeployment({ name: o.extraDeployment }, c.cp.adminHeaders());
  const seen = await observe(
    c,
    `no replica of ${o.extraDeployment} left`,
    async (d) => {
      const res = await c.cp.admin().listReplicas({}, c.cp.adminHeaders());
      return whole(d, c.replicas) && res.replicas.every((r) => r.deployment !== o.extraDeployment);
    },
    o.waitMs,
    leaving,
  );
  return record("undeploy", atMs, atMs, leaving, seen, [
    `deleted ${o.extraDeployment} (1 replica serving ${c.model})`,
  ]);
}
