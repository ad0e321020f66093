/**
 * The routing core the HTTP layer calls: filters routable replicas (ready + circuit allows; a
 * `draining` replica is never one, for a first pick or a retry),
 * matches the prefix chain, ranks under the deployment's policy, and keeps the books (shared
 * in-flight counters, prefix index, replica health) as requests start and end.
 *
 * Under `llmgw` each candidate also carries the prompt's rendezvous weight (rendezvous.ts):
 * one anchor mix per request and one integer mix per replica, with replica seeds cached by id,
 * so routers that do not share a prefix index still agree where a new prefix goes.
 */
import { createInFlightCounters, type InFlightCounters } from "./in-flight.js";
import { createPrefixIndex, type PrefixIndex, type PrefixIndexOptions } from "./prefix-index.js";
import { chainAnchor, rendezvousWeight, replicaSeed } from "./rendezvous.js";
import {
  createReplicaHealth,
  type ReplicaHealth,
  type ReplicaHealthOptions,
} from "./replica-health.js";
import type { ReplicaRoute, RouteResolution, RoutingPolicy } from "./route-table.js";
import {
  type ResolvedScoringOptions,
  rankCandidates,
  resolveScoringOptions,
  type ScoringCandidate,
  type ScoringOptions,
} from "./scoring.js";

/** Options of {@link createReplicaPicker}. */
export interface ReplicaPickerOptions {
  readonly scoring?: ScoringOptions;
  readonly prefixIndex?: PrefixIndexOptions;
  readonly health?: ReplicaHealthOptions;
  /** Shared counters (default: a fresh set). */
  readonly inFlight?: InFlightCounters;
}

/** A chosen replica plus what led there. */
export interface PickDecision {
  readonly replica: ReplicaRoute;
  readonly policy: RoutingPolicy;
  readonly score: number;
  readonly prefixBlocks: number;
  readonly affinityVoided: boolean;
  /** True when the replica got the prompt's rendezvous preference (see scoring.ts). */
  readonly rendezvousPreferred: boolean;
  readonly missingLoadSignals: boolean;
}

/** How a dispatched request ended, for {@link ReplicaPicker.finished}. */
export type DispatchOutcome = "success" | "failure" | "abandoned";

/** The routing core. */
export interface ReplicaPicker {
  /** Ready replicas whose circuit lets traffic through. */
  routable(resolution: RouteResolution): ReplicaRoute[];
  /** Sum of routable replicas' capacities (the deployment's ready capacity). */
  capacity(resolution: RouteResolution): number;
  /**
   * Requests this router has in flight on the resolution's replicas that take no new ones (any
   * state but `ready`, e.g. `draining`). Each holds an admission slot until it ends, so the
   * deployment's admission capacity is {@link capacity} plus this: a replica turned draining
   * with its streams still running must not shut new requests out of the ready ones.
   */
  drainingInFlight(resolution: RouteResolution): number;
  /**
   * Best replica with room for a prompt with `chain`, skipping `exclude`; undefined when none.
   * `routable`: this resolution's {@link routable} replicas when the caller just computed them.
   */
  pick(
    resolution: RouteResolution,
    chain: ArrayLike<number>,
    exclude?: ReadonlySet<string>,
    routable?: readonly ReplicaRoute[],
  ): PickDecision | undefined;
  /** Books a request sent to `replicaId`; returns its in-flight count. */
  dispatched(replicaId: string, chain: ArrayLike<number>): number;
  /** Books its end; returns the in-flight count after it. */
  finished(replicaId: string, outcome: DispatchOutcome, firstByteMs?: number): number;
  /**
   * Drops what is known of a replica that left the route table: its health, its prefix-index
   * entries, its rendezvous seed and, once its last in-flight request has finished, its shared
   * in-flight slot.
   */
  forget(replicaId: string): void;
  readonly inFlight: InFlightCounters;
  readonly prefixIndex: PrefixIndex;
  readonly health: ReplicaHealth;
  readonly scoring: ResolvedScoringOptions;
}

/** Creates a {@link ReplicaPicker}. */
export function createReplicaPicker(options: ReplicaPickerOptions = {}): ReplicaPicker {
  const scoring = resolveScoringOptions(options.scoring);
  const prefixIndex = createPrefixIndex(options.prefixIndex);
  const health = createReplicaHealth(options.health);
  const inFlight = options.inFlight ?? createInFlightCounters();
  const turns = new Map<string, number>();
  /** Replica id → rendezvous seed (bounded by the replicas in the table: `forget` drops one). */
  const seeds = new Map<string, number>();
  const seedOf = (replicaId: string): number => {
    let seed = seeds.get(replicaId);
    if (seed === undefined) {
      seed = replicaSeed(replicaId);
      seeds.set(replicaId, seed);
    }
    return seed;
  };
  /** Forgotten replicas with requests still in flight: their slot is freed by the last one. */
  const retiring = new Set<string>();
  const routable = (resolution: RouteResolution): ReplicaRoute[] =>
    resolution.replicas.filter((r) => r.state === "ready" && health.isRoutable(r.id));
  const forget = (replicaId: string): void => {
    health.forget(replicaId);
    prefixIndex.forget(replicaId);
    seeds.delete(replicaId);
    if (inFlight.get(replicaId) > 0) retiring.add(replicaId);
    else inFlight.forget(replicaId);
  };
  return {
    routable,
    capacity(resolution) {
      let sum = 0;
      for (const r of routable(resolution)) sum += Math.max(1, r.capacity);
      return sum;
    },
    drainingInFlight(resolution) {
      let sum = 0;
      for (const r of resolution.replicas) if (r.state !== "ready") sum += inFlight.get(r.id);
      return sum;
    },
    pick(resolution, chain, exclude, known) {
      const all = known ?? routable(resolution);
      const replicas =
        exclude === undefined || exclude.size === 0 ? all : all.filter((r) => !exclude.has(r.id));
      if (replicas.length === 0) return undefined;
      const byPrefix = resolution.policy === "llmgw" && chain.length > 0;
      const matches = byPrefix ? prefixIndex.match(chain) : undefined;
      const anchor =
        byPrefix && scoring.weights.rendezvous > 0
          ? chainAnchor(chain, scoring.rendezvousAnchorBlocks)
          : undefined;
      const candidates: ScoringCandidate[] = new Array(replicas.length);
      for (let i = 0; i < replicas.length; i++) {
        const r = replicas[i] as ReplicaRoute;
        const candidate: {
          -readonly [K in keyof ScoringCandidate]: ScoringCandidate[K];
        } = {
          id: r.id,
          capacity: Math.max(1, r.capacity),
          inFlight: inFlight.get(r.id),
          prefixBlocks: matches?.get(r.id) ?? 0,
          errorRate: health.errorRate(r.id),
        };
        if (r.load !== undefined) candidate.load = r.load;
        if (anchor !== undefined) candidate.rendezvous = rendezvousWeight(anchor, seedOf(r.id));
        const latencyMs = health.latencyMs(r.id);
        if (latencyMs !== undefined) candidate.latencyMs = latencyMs;
        candidates[i] = candidate;
      }
      const turn = turns.get(resolution.deployment) ?? 0;
      turns.set(resolution.deployment, turn + 1);
      const ranking = rankCandidates(resolution.policy, candidates, chain.length, turn, scoring);
      const best = ranking.ranked[0];
      if (best === undefined) return undefined;
      const replica = replicas.find((r) => r.id === best.id) as ReplicaRoute;
      return {
        replica,
        policy: resolution.policy,
        score: best.score,
        prefixBlocks: matches?.get(best.id) ?? 0,
        affinityVoided: best.affinityVoided,
        rendezvousPreferred: best.rendezvousPreferred,
        missingLoadSignals: ranking.missingLoadSignals,
      };
    },
    dispatched(replicaId, chain) {
      health.onDispatch(replicaId);
      if (chain.length > 0) prefixIndex.record(chain, replicaId);
      return inFlight.increment(replicaId);
    },
    finished(replicaId, outcome, firstByteMs) {
      if (outcome === "success") health.onSuccess(replicaId, firstByteMs ?? 0);
      else if (outcome === "failure") health.onFailure(replicaId);
      else health.onAbandon(replicaId);
      const left = inFlight.decrement(replicaId);
      if (left === 0 && retiring.size > 0 && retiring.delete(replicaId)) forget(replicaId);
      return left;
    },
    forget,
    inFlight,
    prefixIndex,
    health,
    scoring,
  };
}
