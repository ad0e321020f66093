/**
 * Where each affinity hint lives: consistent hashing with bounded loads over *keys*, not
 * requests.
 *
 * A hint (`prompt_cache_key`, the session header, `user`) names requests that share a prefix.
 * The first time a router sees one, it gives the hint a home: the first replica in the hint's
 * rendezvous order (rendezvous.ts) that holds fewer than `ceil(factor × (homes + 1) ÷ replicas)`
 * of the deployment's hints. The hint keeps that home while it is used; it leaves it only when
 * it has been idle for `idleMs`, when the replica leaves the route table, or when the map is
 * full and it is the least recently used.
 *
 * Why keys and not requests: bounding each replica's share of recent *requests* (the rule
 * scoring.ts keeps for prompts without a hint) moves single requests of a tenant whose replica
 * is momentarily busy, and each moved request is a cache miss there and a prefix that later
 * requests are split over. A header hash (HAProxy `balance hdr()` with consistent hashing)
 * never moves one, and so kept 78–88% of prompt tokens cached where llmgw kept 65–79%
 * (bench/routing, `shared-prefix`); but hashing alone gave one replica 1.5× the mean of 64
 * tenants. Bounding the hints per replica keeps every tenant on one replica *and* spreads the
 * tenants evenly; scoring.ts still sends a single request elsewhere when its home's queued
 * prefill or utilisation says it would wait there longer than a cache miss costs.
 *
 * Routers agree on a hint's home when they see the fleet's hints in a similar order: the
 * rendezvous order is the same on every router, and a hint is moved down it only where a
 * replica is full. Where they do not (each router places a hint the first time *it* sees it,
 * and two routers see tenants in different orders: 71% of prompt tokens cached with two routers
 * against 78% with one, bench/routing `shared-prefix`), routers that are peers tell each other
 * the homes they chose ({@link HintHomes.adopt}, peer-exchange.ts in the router server: 78%
 * with two routers, as with one). Without peers, the engines' own blocks settle it in precise
 * mode: a new hint whose prompt a replica already holds, at least half of it, is homed there
 * (the longest holder under the bound first), so a router that meets a tenant late follows
 * where another router sent it.
 *
 * A router alone, or one that tells its peers its homes, needs no agreement by hashing, and
 * homes a new hint by time instead (`HomePlacement.wait`): among the replicas below their fair
 * share of hints, where the engine's current step ends soonest, since the hint's first request
 * waits for that step before its prefill starts. On `unique` (every request its own hint,
 * bench/routing) that took TTFT p50 from 129 to 126–127 ms, below round robin's 127–129, and
 * keeping the hints at their fair share spread requests 24 a replica where the rendezvous order
 * gave 20–28. Routers without peers keep the rendezvous order, and peers take the replicas each
 * owns first (picker.ts, `PickRequest.timedPlacement`, `ReplicaPickerOptions.routerId`).
 *
 * A hint's key is its 32-bit `hintAnchor`: two hints that collide share a home, which costs
 * balance, never correctness, and keeps the map's memory independent of hint length.
 */
import { LruMap } from "./lru-map.js";
import { rendezvousWeight, replicaSeed } from "./rendezvous.js";
import { UNKNOWN_WAIT_SHARE } from "./step-phase.js";

/** Added to the step wait of a candidate another router owns (`HomePlacement.owned`). */
const NOT_OWNED = 1;

/** Added to the step wait of a candidate at its fair share of hints: it ranks after the others. */
const OVER_FAIR_SHARE = 2;

/** Options of {@link HintHomes}. */
export interface HintHomesOptions {
  /** Hints per deployment remembered (least recently used dropped first; default 16 384). */
  readonly maxHints?: number;
  /** A hint unused this long loses its home (ms, default 10 minutes). */
  readonly idleMs?: number;
  /** A replica holds at most `ceil(factor × (hints + 1) ÷ replicas)` hints (default 1.25). */
  readonly loadFactor?: number;
}

interface Home {
  replica: string;
  lastMs: number;
}

/** One deployment's hints and how many each replica holds. */
interface DeploymentHomes {
  readonly homes: LruMap<number, Home>;
  readonly counts: Map<string, number>;
}

/** A candidate for a hint's home: a replica id and the hint's rendezvous weight for it. */
export interface HomeCandidate {
  readonly id: string;
  /** `rendezvousWeight(hintAnchor(hint), replicaSeed(id))`; absent reads as 0. */
  readonly rendezvous?: number;
}

/** How {@link HintHomes.homeOf} places a hint that has no home. */
export interface HomePlacement<C extends HomeCandidate> {
  /**
   * Candidates a new hint's first request would not wait behind others at; the home is one of
   * them, or a holder of its prompt (`held`), when any is.
   */
  readonly placeable?: (candidate: C) => boolean;
  /**
   * Leading blocks of the request's prompt the candidate holds, and of how many: one holding at
   * least half is preferred, the longest first, over the rendezvous order.
   */
  readonly held?: (candidate: C) => number;
  /** The prompt's blocks (for `held`). */
  readonly blocks?: number;
  /**
   * How long a request sent to the candidate now waits for its engine's current step to end,
   * as a share of a step (`StepPhase.waitShare`, 0–1; undefined when unknown, read as half a
   * step). Given, a hint no candidate holds is homed where the wait is shortest among the
   * candidates below their fair share of hints (`ceil((hints + 1) ÷ replicas)`, not the
   * bound's 1.25×), then among those at it, and by the rendezvous order only among equals.
   * Leave it out where routers that tell each other nothing must agree on homes.
   */
  readonly wait?: (candidate: C) => number | undefined;
  /**
   * With `wait`: whether this router places new hints on the candidate first (the replicas it
   * owns among its peers, picker.ts); the others rank after every owned one below the fair
   * share. Default: all.
   */
  readonly owned?: (candidate: C) => boolean;
}

/** The hints of every deployment a router serves, each with its replica. */
export class HintHomes {
  readonly #deployments = new Map<string, DeploymentHomes>();
  readonly #maxHints: number;
  readonly #idleMs: number;
  readonly #factor: number;

  constructor(options: HintHomesOptions = {}) {
    this.#maxHints = options.maxHints ?? 16_384;
    this.#idleMs = options.idleMs ?? 10 * 60_000;
    this.#factor = options.loadFactor ?? 1.25;
  }

  /**
   * The home of the hint with key `key` in `deployment`, giving it one among `candidates` when
   * it has none (or `routable` says its home cannot take requests now: not ready, or its
   * circuit open); undefined when `candidates` is empty. A home not among `candidates` but still
   * routable (a retry excluded it) is kept, and undefined returned: this request goes
   * elsewhere, the hint stays. `placement`: how a new hint's home is chosen.
   */
  homeOf<C extends HomeCandidate>(
    deployment: string,
    key: number,
    candidates: readonly C[],
    routable: (replicaId: string) => boolean,
    nowMs: number,
    placement: HomePlacement<C> = {},
  ): string | undefined {
    const d = this.#deploymentOf(deployment);
    this.#expire(d, nowMs);
    const home = d.homes.use(key);
    if (home !== undefined) {
      if (routable(home.replica)) {
        home.lastMs = nowMs;
        return candidates.some((c) => c.id === home.replica) ? home.replica : undefined;
      }
      // Its replica cannot take requests now (not ready, or its circuit is open): find another.
      this.#drop(d, key, home);
    }
    const chosen = this.#place(d, candidates, placement);
    if (chosen === undefined) return undefined;
    this.#setHome(d, key, chosen, nowMs);
    return chosen;
  }

  /**
   * Another router sent the hint with key `key` to its home `replicaId` (peer-exchange.ts):
   * a hint with no home here takes that one, and one homed elsewhere moves there when
   * `replicaId` comes first in the hint's rendezvous order ({@link firstInOrder}). Two routers
   * that placed a hint apart (each met it first, at the same moment) so settle on the same
   * home from each other's next request, whichever of them hears first, at one cache miss.
   * Returns whether the hint is now homed on `replicaId`.
   */
  adopt(deployment: string, key: number, replicaId: string, nowMs: number): boolean {
    const d = this.#deploymentOf(deployment);
    const home = d.homes.use(key);
    if (home !== undefined) {
      if (home.replica === replicaId) {
        home.lastMs = nowMs;
        return true;
      }
      if (firstInOrder(key, home.replica, replicaId) === home.replica) return false;
      this.#drop(d, key, home);
    }
    this.#setHome(d, key, replicaId, nowMs);
    return true;
  }

  /** Hints of `deployment` homed on `replicaId` (for tests and metrics). */
  count(deployment: string, replicaId: string): number {
    return this.#deployments.get(deployment)?.counts.get(replicaId) ?? 0;
  }

  /** Hints of `deployment` with a home. */
  size(deployment: string): number {
    return this.#deployments.get(deployment)?.homes.size ?? 0;
  }

  /** Drops every home on `replicaId` (it left the route table); O(hints). */
  forget(replicaId: string): void {
    for (const d of this.#deployments.values()) {
      if (!d.counts.has(replicaId)) continue;
      for (const [key, home] of d.homes.entries()) {
        if (home.replica === replicaId) this.#drop(d, key, home);
      }
    }
  }

  /**
   * The candidate below the bound that holds the longest prefix of the prompt (at least half
   * of it), else among the `placeable` ones when any is: with `wait`, the soonest step end
   * below the fair share; otherwise, and among equals, the first in rendezvous order (highest
   * weight, then id).
   */
  #place<C extends HomeCandidate>(
    d: DeploymentHomes,
    candidates: readonly C[],
    { placeable, held, blocks = 0, wait, owned }: HomePlacement<C>,
  ): string | undefined {
    const k = candidates.length;
    if (k === 0) return undefined;
    let total = 0;
    for (const c of candidates) total += d.counts.get(c.id) ?? 0;
    const bound = Math.ceil((this.#factor * (total + 1)) / k);
    const fairShare = Math.ceil((total + 1) / k);
    let best: string | undefined;
    let bestHeld = 0;
    let bestWeight = -1;
    let bestWait = Number.POSITIVE_INFINITY; // in steps, plus NOT_OWNED and OVER_FAIR_SHARE
    let anyPlaceable = false;
    if (placeable !== undefined) for (const c of candidates) anyPlaceable ||= placeable(c);
    for (const c of candidates) {
      const count = d.counts.get(c.id) ?? 0;
      if (count + 1 > bound) continue;
      const h = held === undefined ? 0 : held(c);
      // Under half the prompt is a preamble many hints share, not this hint's own prefix.
      const holds = blocks > 0 && 2 * h >= blocks ? h : 0;
      // A holder saves this request more prefill than the queue there may cost it.
      if (anyPlaceable && holds === 0 && !(placeable as (c: C) => boolean)(c)) continue;
      const w = c.rendezvous ?? 0;
      // Timing decides only between equals in what they hold, and keeps the hints even.
      const steps =
        holds > 0 || wait === undefined
          ? 0
          : (wait(c) ?? UNKNOWN_WAIT_SHARE) +
            (owned === undefined || owned(c) ? 0 : NOT_OWNED) +
            (count + 1 > fairShare ? OVER_FAIR_SHARE : 0);
      if (
        holds > bestHeld ||
        (holds === bestHeld &&
          (steps < bestWait ||
            (steps === bestWait &&
              (w > bestWeight || (w === bestWeight && best !== undefined && c.id < best)))))
      ) {
        best = c.id;
        bestHeld = holds;
        bestWeight = w;
        bestWait = steps;
      }
    }
    // The bound always leaves one (the candidates' mean is below it), unless the placeable
    // ones are all full: then the first of those.
    if (best === undefined && anyPlaceable) {
      return candidates.find((c) => (placeable as (c: C) => boolean)(c))?.id;
    }
    return best ?? candidates[0]?.id;
  }

  #deploymentOf(deployment: string): DeploymentHomes {
    let d = this.#deployments.get(deployment);
    if (d === undefined) {
      d = { homes: new LruMap(), counts: new Map() };
      this.#deployments.set(deployment, d);
    }
    return d;
  }

  /** Homes `key` (which has no home) on `replica`, dropping the least recently used past the cap. */
  #setHome(d: DeploymentHomes, key: number, replica: string, nowMs: number): void {
    d.homes.set(key, { replica, lastMs: nowMs });
    d.counts.set(replica, (d.counts.get(replica) ?? 0) + 1);
    while (d.homes.size > this.#maxHints) {
      const [oldKey, oldHome] = d.homes.oldest() as [number, Home];
      this.#drop(d, oldKey, oldHome);
    }
  }

  #expire(d: DeploymentHomes, nowMs: number): void {
    for (let old = d.homes.oldest(); old !== undefined; old = d.homes.oldest()) {
      if (nowMs - old[1].lastMs < this.#idleMs) return;
      this.#drop(d, old[0], old[1]);
    }
  }

  #drop(d: DeploymentHomes, key: number, home: Home): void {
    d.homes.delete(key);
    const n = (d.counts.get(home.replica) ?? 0) - 1;
    if (n > 0) d.counts.set(home.replica, n);
    else d.counts.delete(home.replica);
  }
}

/**
 * Of two replicas, the one first in the rendezvous order of the hint with key `key` (the higher
 * weight, then the lower id): the same on every router, and a different replica for each hint.
 * Settling on the lower id instead gave the replicas that sort first every contested hint.
 */
export function firstInOrder(key: number, a: string, b: string): string {
  const wa = rendezvousWeight(key, replicaSeed(a));
  const wb = rendezvousWeight(key, replicaSeed(b));
  return wa > wb || (wa === wb && a < b) ? a : b;
}
