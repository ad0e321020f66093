/**
 * The lost-node phase: silence the agent holding the most replica ranks and time, from the
 * moment the control plane declares it `lost`, until its replicas are placed on other nodes
 * (server event timestamps, and as an admin polling ListDeployments sees it) and READY again.
 */
import { performance } from "node:perf_hooks";
import type { Client } from "@connectrpc/connect";
import type { ClusterService, DeploymentStatus, Event } from "@llmgw/proto";
import { quantile } from "../lib/table.js";
import type { Fleet } from "./fleet.js";
import { log } from "./processes.js";

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** What the lost-node phase measured. Times are ms; server timestamps share this host's clock. */
export interface LostNodeResult {
  readonly node: string;
  readonly ranksOnNode: number;
  /** `replica.placed` events (ListEvents) for the affected deployments after `node.lost`. */
  readonly replicasMoved: number;
  readonly silencedToUnreachableMs: number | undefined;
  readonly silencedToLostMs: number;
  /** Declared lost → the last of those `replica.placed` events (the reconciler's own time). */
  readonly lostToPlacedServerMs: number | undefined;
  /** Declared lost → ListDeployments shows every affected replica placed off the node. */
  readonly lostToPlacedObservedMs: number;
  /** Declared lost → every affected replica READY elsewhere (needs the new nodes' heartbeats). */
  readonly lostToReadyMs: number;
  /** ListDeployments round trips while polling (they bound the "observed" figures). */
  readonly listDeployments: {
    readonly calls: number;
    readonly p50Ms?: number;
    readonly maxMs?: number;
  };
  readonly watchError?: string;
}

/** Polls `check` every `everyMs` until it returns a value, or throws after `timeoutMs`. */
export async function until<T>(
  what: string,
  check: () => Promise<T | undefined>,
  timeoutMs: number,
  everyMs: number,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await check();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`${what}: not within ${timeoutMs / 1000} s`);
    await sleep(everyMs);
  }
}

/** Watches the event stream in the background, keeping every event with its arrival time. */
function watchEvents(admin: Client<typeof ClusterService>) {
  const events: { event: Event; receivedAtMs: number }[] = [];
  const abort = new AbortController();
  let failure: string | undefined;
  const done = (async () => {
    try {
      // backlog 1: the first message proves the stream is open before the node is silenced.
      for await (const res of admin.watchEvents({ backlog: 1 }, { signal: abort.signal })) {
        if (res.event) events.push({ event: res.event, receivedAtMs: Date.now() });
      }
    } catch (error) {
      if (!abort.signal.aborted) failure = (error as Error).message;
    }
  })();
  return {
    events,
    failure: () => failure,
    async close() {
      abort.abort();
      await done;
    },
  };
}

/** True when every affected deployment has all replicas placed off `lostNode` (and READY). */
export function affectedSettled(
  deployments: readonly DeploymentStatus[],
  affected: ReadonlySet<string>,
  lostNode: string,
  needReady: boolean,
): boolean {
  for (const d of deployments) {
    if (!affected.has(d.spec?.name ?? "")) continue;
    if (d.replicas.length !== d.desiredReplicas) return false;
    for (const r of d.replicas) {
      if (r.ranks.length === 0 || r.ranks.some((k) => k.nodeId === lostNode)) return false;
    }
    if (needReady && d.readyReplicas !== d.desiredReplicas) return false;
  }
  return true;
}

/** Runs the lost-node phase on a converged fleet (the silenced agent stays silent). */
export async function measureLostNode(
  fleet: Fleet,
  admin: Client<typeof ClusterService>,
  timing: { heartbeatIntervalS: number; nodeLostAfterS: number },
): Promise<LostNodeResult> {
  const { index, ranks } = fleet.busiest();
  const victim = fleet.agents[index];
  if (!victim || ranks <= 0) throw new Error("no agent holds a replica: nothing to re-place");
  const node = victim.nodeId;
  const affected = new Set(victim.assignments.map((a) => a.deployment?.name ?? ""));
  const watch = watchEvents(admin);
  try {
    await until("event stream open", async () => watch.events.length > 0 || undefined, 30_000, 50);
    const silencedAt = Date.now();
    fleet.silence(index);
    log(`silenced ${victim.hostname} (${node}, ${ranks} replica ranks); waiting for it to be lost`);
    const lost = await until(
      `node ${node} declared lost`,
      async () => {
        const f = watch.failure();
        if (f) throw new Error(`event stream failed: ${f}`);
        return watch.events.find((e) => e.event.kind === "node.lost" && e.event.subject === node);
      },
      (3 * timing.heartbeatIntervalS + timing.nodeLostAfterS) * 1000 + 60_000,
      20,
    );
    const lostAt = Number(lost.event.atUnixMs);
    // The last unreachable before lost: a heartbeat still in flight when the agent was
    // silenced can land late and make the node ready once more.
    const unreachable = watch.events
      .filter(
        (e) =>
          e.event.kind === "node.unreachable" &&
          e.event.subject === node &&
          e.event.id < lost.event.id,
      )
      .at(-1);
    const callMs: number[] = [];
    let placedAt: number | undefined;
    let last: readonly DeploymentStatus[] = [];
    const readyAt = await until(
      "replicas of the lost node READY elsewhere",
      async () => {
        const t0 = performance.now();
        const { deployments } = await admin.listDeployments({});
        callMs.push(performance.now() - t0);
        last = deployments;
        const now = Date.now();
        if (placedAt === undefined && affectedSettled(deployments, affected, node, false)) {
          placedAt = now;
        }
        return affectedSettled(deployments, affected, node, true) ? now : undefined;
      },
      120_000,
      100,
    );
    // Replica ids of the affected deployments now (the reconciler may reuse or mint ids).
    const ids = new Set(
      last
        .filter((d) => affected.has(d.spec?.name ?? ""))
        .flatMap((d) => d.replicas.map((r) => r.replicaId)),
    );
    // From the store, not the stream: on a saturated box the stream can trail the state.
    const { events: after } = await admin.listEvents({ afterId: lost.event.id, limit: 10_000 });
    const placed = after.filter((e) => e.kind === "replica.placed" && ids.has(e.subject));
    const failure = watch.failure();
    return {
      node: `${victim.hostname} (${node})`,
      ranksOnNode: ranks,
      replicasMoved: placed.length,
      silencedToUnreachableMs: unreachable
        ? Number(unreachable.event.atUnixMs) - silencedAt
        : undefined,
      silencedToLostMs: lostAt - silencedAt,
      lostToPlacedServerMs:
        placed.length > 0 ? Math.max(...placed.map((e) => Number(e.atUnixMs))) - lostAt : undefined,
      lostToPlacedObservedMs: (placedAt ?? readyAt) - lostAt,
      lostToReadyMs: readyAt - lostAt,
      listDeployments: {
        calls: callMs.length,
        p50Ms: quantile(callMs, 0.5),
        maxMs: callMs.length ? Math.max(...callMs) : undefined,
      },
      ...(failure ? { watchError: failure } : {}),
    };
  } finally {
    await watch.close();
  }
}
