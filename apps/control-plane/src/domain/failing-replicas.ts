/**
 * Replicas whose engines keep failing where they are placed, and the nodes their deployments
 * avoid afterwards.
 *
 * An agent relaunches a failed replica on its own node, with a backoff (`--relaunch-failed`).
 * That mends what passes: GPU memory a dying process held, a mount that came back. It cannot
 * mend a node whose fault no health check sees (a broken driver for this model, a disk that
 * fills again, a missing engine build). So the control plane keeps, per replica, the first
 * failure of its current streak: a failure {@link STABLE_MS} or more after the replica last
 * turned ready (and after the streak began) starts a new one. Once a streak is older than
 * `moveAfterMs` and the replica is failed, the reconcile offers it to the scheduler to move
 * (`ScheduleInput.failing`), with its failed nodes avoided; the scheduler moves it only where
 * its deployment fits on another node.
 * A moved replica's nodes stay avoided for its deployment for {@link AVOID_MS}: its
 * replacement and later replicas go elsewhere when they fit there (Nomad's reschedule with a
 * node penalty, in spirit). A move off a node again, while it is avoided or within
 * {@link AVOID_MEMORY_MS} after, doubles the period, up to {@link MAX_AVOID_MS}: a deployment
 * that fails on two nodes swaps between them less and less often, not every hour. An operator who
 * mended the node lifts the avoidance ({@link FailingReplicas.unavoid}, `llmgw unavoid`).
 *
 * Avoided nodes are stored (`avoided_nodes`), so a new leader keeps avoiding them. Streaks are
 * memory only: a control plane that starts counts a stored failed status as a streak that
 * began when it loaded.
 */
import type { AvoidedNodeRecord } from "../store/types.js";

/** A failure this long after the replica last turned ready starts a new streak, ms. */
export const STABLE_MS = 10 * 60_000;

/** How long a moved replica's nodes are avoided by its deployment after a first move, ms. */
export const AVOID_MS = 60 * 60_000;

/** The longest a repeated move makes an avoidance, ms. */
export const MAX_AVOID_MS = 24 * 60 * 60_000;

/** A move off a node this long after its avoidance ended counts as a first one again, ms. */
export const AVOID_MEMORY_MS = 24 * 60 * 60_000;

/** How long the `moves`-th move in a row off a node avoids it, ms. */
export function avoidPeriodMs(moves: number): number {
  return Math.min(MAX_AVOID_MS, AVOID_MS * 2 ** Math.max(0, Math.min(moves - 1, 30)));
}

/** An avoidance period as events say it: "60 min", "2 h". */
export function periodText(ms: number): string {
  return ms < 2 * 60 * 60_000
    ? `${Math.round(ms / 60_000)} min`
    : `${Math.round(ms / (60 * 60_000))} h`;
}

/** Where {@link FailingReplicas} keeps avoided nodes (the cluster's store, failures logged). */
export interface AvoidedNodesSink {
  put(record: AvoidedNodeRecord): void;
  delete(deployment: string, nodeId: string): void;
}

/** Default of `ClusterOptions.moveFailedAfterMs`. */
export const DEFAULT_MOVE_FAILED_AFTER_MS = 5 * 60_000;

interface Streak {
  /** The streak's first failure. */
  readonly sinceMs: number;
  /** Nodes whose rank failed during the streak. */
  readonly nodes: Set<string>;
  /** Offered to the scheduler once due: ticks do not reconcile for it again. */
  offered: boolean;
}

/** A replica to offer for a move, with the nodes its deployment should avoid. */
export interface DueReplica {
  readonly replicaId: string;
  readonly sinceMs: number;
  readonly nodes: readonly string[];
}

export class FailingReplicas {
  readonly #moveAfterMs: number;
  readonly #streaks = new Map<string, Streak>();
  /** Replica id → when a rank of it last turned ready, for replicas in a streak. */
  readonly #readySince = new Map<string, number>();
  /** Deployment → node id → its avoidance, kept {@link AVOID_MEMORY_MS} past its end. */
  readonly #avoided = new Map<string, Map<string, AvoidedNodeRecord>>();
  readonly #sink: AvoidedNodesSink | undefined;
  /**
   * When the earliest avoidance the last plan saw ends: a replica that stayed for want of a
   * node it does not avoid may move then.
   */
  #avoidanceEndsMs = Number.POSITIVE_INFINITY;

  /**
   * `moveAfterMs`: 0 never moves a replica. `stored`: the avoided nodes the store holds;
   * `sink`: where changes to them go (none: memory only).
   */
  constructor(
    moveAfterMs: number,
    stored: readonly AvoidedNodeRecord[] = [],
    sink?: AvoidedNodesSink,
  ) {
    this.#moveAfterMs = moveAfterMs;
    this.#sink = sink;
    for (const r of stored) this.#byNode(r.deployment).set(r.nodeId, r);
  }

  #byNode(deployment: string): Map<string, AvoidedNodeRecord> {
    let byNode = this.#avoided.get(deployment);
    if (byNode === undefined) {
      byNode = new Map();
      this.#avoided.set(deployment, byNode);
    }
    return byNode;
  }

  /** A rank of `replicaId` turned ready at `nowMs` (kept only while it is in a streak). */
  ready(replicaId: string, nowMs: number): void {
    if (this.#streaks.has(replicaId)) this.#readySince.set(replicaId, nowMs);
  }

  /** A rank of `replicaId` on `nodeId` turned failed at `nowMs` (or was loaded failed). */
  failed(replicaId: string, nodeId: string, nowMs: number): void {
    const streak = this.#streaks.get(replicaId);
    const ready = this.#readySince.get(replicaId);
    if (
      streak === undefined ||
      (ready !== undefined && ready > streak.sinceMs && nowMs - ready >= STABLE_MS)
    ) {
      this.#streaks.set(replicaId, { sinceMs: nowMs, nodes: new Set([nodeId]), offered: false });
      return;
    }
    streak.nodes.add(nodeId);
    // Failed again: a move the scheduler could not make then may be possible now.
    streak.offered = false;
  }

  /** The placement is gone: nothing more to know of it. */
  forget(replicaId: string): void {
    this.#streaks.delete(replicaId);
    this.#readySince.delete(replicaId);
  }

  /**
   * The replicas to offer for a move now: failed (`isFailed`), in a streak older than
   * `moveAfterMs`. Tell {@link offered} once the plan that took them is made.
   */
  due(nowMs: number, isFailed: (replicaId: string) => boolean): DueReplica[] {
    const out: DueReplica[] = [];
    for (const [replicaId, streak] of this.#streaks) {
      if (!this.#due(replicaId, streak, nowMs, isFailed)) continue;
      out.push({ replicaId, sinceMs: streak.sinceMs, nodes: [...streak.nodes].sort() });
    }
    return out;
  }

  #due(
    replicaId: string,
    streak: Streak,
    nowMs: number,
    isFailed: (replicaId: string) => boolean,
  ): boolean {
    return (
      this.#moveAfterMs > 0 && nowMs - streak.sinceMs >= this.#moveAfterMs && isFailed(replicaId)
    );
  }

  /** A plan was made with these offered: ticks do not reconcile for them again. */
  offered(due: readonly DueReplica[]): void {
    for (const d of due) {
      const streak = this.#streaks.get(d.replicaId);
      if (streak !== undefined) streak.offered = true;
    }
  }

  /**
   * True when some replica became due and was not offered since, or an avoidance ended since
   * it was: a tick should reconcile.
   */
  anyNewlyDue(nowMs: number, isFailed: (replicaId: string) => boolean): boolean {
    const ended = nowMs >= this.#avoidanceEndsMs;
    for (const [replicaId, streak] of this.#streaks)
      if ((ended || !streak.offered) && this.#due(replicaId, streak, nowMs, isFailed)) return true;
    return false;
  }

  /** `deployment` was deleted: a new one of the same name avoids nothing. */
  deploymentGone(deployment: string): void {
    for (const nodeId of this.#avoided.get(deployment)?.keys() ?? [])
      this.#sink?.delete(deployment, nodeId);
    this.#avoided.delete(deployment);
  }

  /**
   * How many moves in a row a move of `deployment` off `nodeId` at `nowMs` would be: one more
   * than the last while it is avoided or was within {@link AVOID_MEMORY_MS}, else 1. Moves of
   * one plan (several replicas failing on one node) are one move.
   */
  #movesAfter(deployment: string, nodeId: string, nowMs: number): number {
    const last = this.#avoided.get(deployment)?.get(nodeId);
    if (last === undefined || nowMs - last.untilMs >= AVOID_MEMORY_MS) return 1;
    return last.movedAtMs === nowMs ? last.moves : last.moves + 1;
  }

  /** How long a move of `deployment` off `nodes` at `nowMs` would avoid them (the longest). */
  periodMs(deployment: string, nodes: readonly string[], nowMs: number): number {
    let moves = 1;
    for (const node of nodes) moves = Math.max(moves, this.#movesAfter(deployment, node, nowMs));
    return avoidPeriodMs(moves);
  }

  /** `deployment` moved a replica off `nodes`: each is avoided for {@link avoidPeriodMs}. */
  moved(deployment: string, nodes: readonly string[], nowMs: number): void {
    const byNode = this.#byNode(deployment);
    for (const nodeId of nodes) {
      const moves = this.#movesAfter(deployment, nodeId, nowMs);
      const record = {
        deployment,
        nodeId,
        untilMs: nowMs + avoidPeriodMs(moves),
        moves,
        movedAtMs: nowMs,
      };
      byNode.set(nodeId, record);
      this.#sink?.put(record);
      // A replica that stays failing in this plan, for want of this node, may move when it ends.
      this.#avoidanceEndsMs = Math.min(this.#avoidanceEndsMs, record.untilMs);
    }
  }

  /** `nodeId` is gone (revoked: it joins again under a new id): nothing avoids it any more. */
  nodeGone(nodeId: string): void {
    for (const [deployment, byNode] of this.#avoided) {
      if (!byNode.delete(nodeId)) continue;
      this.#sink?.delete(deployment, nodeId);
      if (byNode.size === 0) this.#avoided.delete(deployment);
    }
  }

  /** Every avoidance kept, ended ones still remembered included: what the store should hold. */
  records(): AvoidedNodeRecord[] {
    return [...this.#avoided.values()].flatMap((byNode) => [...byNode.values()]);
  }

  /**
   * Lifts `deployment`'s avoidance of `nodeId` (of every node when undefined), and forgets its
   * moves there: the next move off it counts as a first. Returns the nodes that were avoided
   * at `nowMs`, by node id.
   */
  unavoid(deployment: string, nodeId: string | undefined, nowMs: number): string[] {
    const byNode = this.#avoided.get(deployment);
    if (byNode === undefined) return [];
    const lifted: string[] = [];
    for (const [id, record] of [...byNode]) {
      if (nodeId !== undefined && id !== nodeId) continue;
      if (record.untilMs > nowMs) lifted.push(id);
      byNode.delete(id);
      this.#sink?.delete(deployment, id);
    }
    if (byNode.size === 0) this.#avoided.delete(deployment);
    return lifted.sort();
  }

  /** The nodes `deployment` avoids at `nowMs`, by node id. */
  avoidedBy(deployment: string, nowMs: number): AvoidedNodeRecord[] {
    const out: AvoidedNodeRecord[] = [];
    for (const record of this.#avoided.get(deployment)?.values() ?? [])
      if (record.untilMs > nowMs) out.push(record);
    return out.sort((a, b) => (a.nodeId < b.nodeId ? -1 : a.nodeId > b.nodeId ? 1 : 0));
  }

  /**
   * The nodes each deployment avoids now, for a plan. Avoidances {@link AVOID_MEMORY_MS} past
   * their end are forgotten (and deleted from the store).
   */
  avoided(nowMs: number): { deployment: string; nodeId: string }[] {
    const out: { deployment: string; nodeId: string }[] = [];
    this.#avoidanceEndsMs = Number.POSITIVE_INFINITY;
    for (const [deployment, byNode] of this.#avoided) {
      for (const [nodeId, record] of byNode) {
        if (record.untilMs > nowMs) {
          out.push({ deployment, nodeId });
          this.#avoidanceEndsMs = Math.min(this.#avoidanceEndsMs, record.untilMs);
        } else if (nowMs - record.untilMs >= AVOID_MEMORY_MS) {
          byNode.delete(nodeId);
          this.#sink?.delete(deployment, nodeId);
        }
      }
      if (byNode.size === 0) this.#avoided.delete(deployment);
    }
    return out;
  }
}
