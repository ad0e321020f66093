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
 * node penalty, in spirit).
 *
 * Memory only: a control plane that starts counts a stored failed status as a streak that
 * began when it loaded, and avoids nothing.
 */

/** A failure this long after the replica last turned ready starts a new streak, ms. */
export const STABLE_MS = 10 * 60_000;

/** How long a moved replica's nodes are avoided by its deployment, ms. */
export const AVOID_MS = 60 * 60_000;

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
  /** Deployment → node id → avoided until, ms. */
  readonly #avoided = new Map<string, Map<string, number>>();

  /** `moveAfterMs`: 0 never moves a replica. */
  constructor(moveAfterMs: number) {
    this.#moveAfterMs = moveAfterMs;
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

  /** True when some replica became due and was not offered since: a tick should reconcile. */
  anyNewlyDue(nowMs: number, isFailed: (replicaId: string) => boolean): boolean {
    for (const [replicaId, streak] of this.#streaks)
      if (!streak.offered && this.#due(replicaId, streak, nowMs, isFailed)) return true;
    return false;
  }

  /** `deployment` was deleted: a new one of the same name avoids nothing. */
  deploymentGone(deployment: string): void {
    this.#avoided.delete(deployment);
  }

  /** `deployment` moved a replica off `nodes`: they are avoided for {@link AVOID_MS}. */
  moved(deployment: string, nodes: readonly string[], nowMs: number): void {
    let byNode = this.#avoided.get(deployment);
    if (byNode === undefined) {
      byNode = new Map();
      this.#avoided.set(deployment, byNode);
    }
    for (const node of nodes) byNode.set(node, nowMs + AVOID_MS);
  }

  /** The nodes `deployment` avoids at `nowMs`, and until when, by node id. */
  avoidedBy(deployment: string, nowMs: number): { nodeId: string; untilMs: number }[] {
    const out: { nodeId: string; untilMs: number }[] = [];
    for (const [nodeId, untilMs] of this.#avoided.get(deployment) ?? [])
      if (untilMs > nowMs) out.push({ nodeId, untilMs });
    return out.sort((a, b) => (a.nodeId < b.nodeId ? -1 : a.nodeId > b.nodeId ? 1 : 0));
  }

  /** The nodes each deployment avoids now; expired entries are dropped. */
  avoided(nowMs: number): { deployment: string; nodeId: string }[] {
    const out: { deployment: string; nodeId: string }[] = [];
    for (const [deployment, byNode] of this.#avoided) {
      for (const [nodeId, untilMs] of byNode) {
        if (untilMs <= nowMs) byNode.delete(nodeId);
        else out.push({ deployment, nodeId });
      }
      if (byNode.size === 0) this.#avoided.delete(deployment);
    }
    return out;
  }
}
