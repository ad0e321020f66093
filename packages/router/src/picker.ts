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
import { DEFAULT_BLOCK_BYTES } from "./block-hash.js";
import { type Clock, systemClock } from "./clock.js";
import { checkRange } from "./errors.js";
import { HintHomes, type HintHomesOptions } from "./hint-homes.js";
import { createInFlightCounters, type InFlightCounters } from "./in-flight.js";
import { createPreciseIndex, type PreciseIndex } from "./precise-index.js";
import { createPrefixIndex, type PrefixIndex, type PrefixIndexOptions } from "./prefix-index.js";
import { chainAnchor, hintAnchor, rendezvousWeight, replicaSeed } from "./rendezvous.js";
import {
  createReplicaHealth,
  type ReplicaHealth,
  type ReplicaHealthOptions,
} from "./replica-health.js";
import type { ReplicaRoute, RouteResolution, RoutingPolicy } from "./route-table.js";
import {
  queuedBehind,
  type ResolvedScoringOptions,
  rankCandidates,
  resolveScoringOptions,
  type ScoringCandidate,
  type ScoringOptions,
} from "./scoring.js";
import { StepPhase } from "./step-phase.js";

/** Options of {@link createReplicaPicker}. */
export interface ReplicaPickerOptions {
  readonly scoring?: ScoringOptions;
  readonly prefixIndex?: PrefixIndexOptions;
  readonly health?: ReplicaHealthOptions;
  /** Shared counters (default: a fresh set). */
  readonly inFlight?: InFlightCounters;
  /**
   * Tokens one prefix-index block stands for, to size each replica's share of the index from
   * its engine's reported KV capacity (default: the default block of 1 024 bytes at ~4 bytes a
   * token, 256).
   */
  readonly blockTokens?: number;
  /** Where hints live (hint-homes.ts). */
  readonly hintHomes?: HintHomesOptions;
  /**
   * This router's id on its peers' books (peer-exchange.ts in the router server): with peers,
   * a new hint homed by time (`PickRequest.timedPlacement`) goes to a replica this router owns
   * first, each replica owned by the router first in its rendezvous order of router ids.
   * Peers' events take a millisecond or more, and routers placing new hints in that window all
   * picked the replica whose step ends soonest (bench/routing `unique`, two routers: TTFT p90
   * 138–156 ms, against 136–138 homed by the rendezvous order).
   */
  readonly routerId?: string;
}

/** What {@link ReplicaPicker.pick} may know of a request besides its chain. */
export interface PickRequest {
  /**
   * The request's affinity hint (`RequestHint.value`), which anchors the rendezvous choice in
   * place of the prompt (scoring.ts).
   */
  readonly hint?: string;
  /**
   * The prompt's token-block keys at the engines' block size ({@link ReplicaPicker.preciseBlockSize});
   * affinity then comes from the engines' own blocks ({@link ReplicaPicker.preciseIndex})
   * instead of the approximate index.
   */
  readonly precise?: ArrayLike<number>;
  /**
   * The prompt's quarter-block keys (`PromptKeys.quarters`): the approximate index then also
   * matches a prompt that ended inside the block after a replica's last (`PrefixIndex.match`),
   * and the prompt's length counts its partial block.
   */
  readonly quarters?: ArrayLike<number>;
  /** Estimated prompt tokens: the unit of queued prefill in the score (default: from the chain). */
  readonly promptTokens?: number;
  /**
   * How far past each replica's capacity this request may go, as a fraction of it (rounded
   * up): a `critical` request's admission headroom (`AdmissionOptions.criticalHeadroom`).
   */
  readonly headroom?: number;
  /**
   * The request's first token matters more than load balance (a `critical` one): where the
   * engine's current step ends soonest counts in the score ({@link ReplicaPicker.stepPhase}).
   */
  readonly latencyFirst?: boolean;
  /**
   * A new hint may be homed by its replicas' step phases (hint-homes.ts, `HomePlacement.wait`):
   * set when this router is the only one or tells its peers the homes it chooses (then on the
   * replicas it owns first, {@link ReplicaPickerOptions.routerId}). Routers that share nothing
   * agree on a hint's home only through its rendezvous order, which timing would break.
   */
  readonly timedPlacement?: boolean;
}

/** A prefill sent to a replica whose first byte has not come yet. */
interface PendingPrefill {
  readonly tokens: number;
  readonly sentAtMs: number;
  /** The router that sent it, when another one did ({@link ReplicaPicker.peerDispatched}). */
  readonly peer?: string;
}

/**
 * What another router of the cluster sent where (peer-exchange.ts in the router server): each
 * router books the others' requests as it books its own, so that N routers see one fleet's
 * queued prefill, prompt placement and hint homes rather than their own share of it.
 */
export interface PeerDispatch {
  readonly replicaId: string;
  /** Its prompt tokens the replica does not hold ({@link PickDecision.prefillTokens}). */
  readonly prefillTokens: number;
  /** Its prompt's prefix chain (block-hash.ts), recorded in the approximate index. */
  readonly chain?: ArrayLike<number>;
  /** Its prompt's key past the chain (`quarterTail`), recorded with it. */
  readonly tail?: number;
  /** Its hint's key ({@link PickDecision.hint}). */
  readonly hint?: number;
  /** The replica is the hint's home on the sending router ({@link PickDecision.home}). */
  readonly home?: boolean;
}

/**
 * A peer's prefill that never got its "first byte" message (the peer died, or the message was
 * lost) stops counting after this long: 20 times a slow prefill.
 */
export const PEER_PREFILL_MAX_MS = 30_000;

/**
 * The least a pending prefill counts, as a share of its tokens, however old: until its first
 * byte comes it may still be queued (a request sent there shares its step) or running (a
 * request sent there waits for its step's end), and either costs more than the end of a
 * decode step on a replica with none (bench/tenants: critical requests sent where a prefill
 * was "nearly done" by the time alone had TTFTs of 50–62 ms, where those sent to a replica
 * with none stayed under 48).
 */
const LEAST_PENDING_PREFILL_SHARE = 0.5;

/** The fewest recent requests of one hint that make it hot (see `pick`). */
const HOT_HINT_LEAST = 4;

/** `capacity` plus `headroom` of it, rounded up. */
const withHeadroom = (capacity: number, headroom: number): number =>
  headroom > 0 ? capacity + Math.ceil(capacity * headroom) : capacity;

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
  /**
   * Where `prefixBlocks` came from: the engines' own KV events (`precise`, blocks of the
   * engine's size) or the router's model of their caches (`approximate`).
   */
  readonly prefixSource: "precise" | "approximate";
  /**
   * The prompt's length in the blocks `prefixBlocks` counts: the engine's blocks when
   * `prefixSource` is `precise`, else the index's (a partial block in quarters, when the
   * request gave them): `prefixBlocks ÷ chainLength` is the share of the prompt held.
   */
  readonly chainLength: number;
  /** Estimated prompt tokens the replica must still compute (the prompt less its held prefix). */
  readonly prefillTokens: number;
  /** The request's hint key (`hintAnchor` of its hint), under `llmgw` with a hint. */
  readonly hint?: number;
  /** The chosen replica is the hint's home (false for a hot hint, or a request moved off it). */
  readonly home?: boolean;
}

/**
 * How a dispatched request ended, for {@link ReplicaPicker.finished}: `"answered"` is a success
 * whose health verdict {@link ReplicaPicker.answered} booked when its head arrived.
 */
export type DispatchOutcome = "success" | "answered" | "failure" | "abandoned";

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
   * with its streams still running must not shut new requests out of the ready ones. So do
   * the requests still running on a replica of the deployment that left the table outright
   * ({@link forget} with its deployment): a node lost takes its replica out at once, and its
   * requests, until they end, held the slots of the ready ones.
   */
  drainingInFlight(resolution: RouteResolution): number;
  /**
   * Best replica with room for a prompt with `chain`, skipping `exclude`; undefined when none.
   * `routable`: this resolution's {@link routable} replicas when the caller just computed them.
   * `request`: what else is known of the request (see {@link PickRequest}).
   */
  pick(
    resolution: RouteResolution,
    chain: ArrayLike<number>,
    exclude?: ReadonlySet<string>,
    routable?: readonly ReplicaRoute[],
    request?: PickRequest,
  ): PickDecision | undefined;
  /**
   * Whether precise mode can match for `replicas`: `undefined` unless every one has a fresh
   * block feed and those that stored blocks agree on a block size; then that size, or
   * `"empty"` while none has stored anything (nothing to match: no engine holds a prefix).
   */
  preciseBlockSize(replicas: readonly ReplicaRoute[]): number | "empty" | undefined;
  /**
   * Books a request sent to `replicaId`; returns its in-flight count. `prefillTokens`: its
   * prompt tokens the replica does not hold ({@link PickDecision.prefillTokens}), queued there
   * until {@link prefillDone}. `precise`: its token-block keys when it was matched on them
   * ({@link PickRequest.precise}), held on the replica until it ends ({@link PreciseIndex.hold}).
   * `tail`: the prompt's key past its chain (`quarterTail`), recorded with it.
   */
  dispatched(
    replicaId: string,
    chain: ArrayLike<number>,
    prefillTokens?: number,
    precise?: ArrayLike<number>,
    tail?: number,
  ): number;
  /**
   * `replicaId`'s step rhythm: the caller {@link StepPhase.observe}s each chunk the replica
   * streams (kept until the replica is forgotten).
   */
  stepPhase(replicaId: string): StepPhase;
  /** The request's first byte came (or it ended without one): its prefill is no longer queued. */
  prefillDone(replicaId: string, prefillTokens: number): void;
  /**
   * Books another router's request on `resolution`'s replica ({@link PeerDispatch}): its queued
   * prefill until {@link peerPrefillDone} (or {@link PEER_PREFILL_MAX_MS}), its prompt in the
   * prefix index, its pick in the bounded-load window, its hint in the hot-hint window, and the
   * hint's home when the peer sent it home. Ignored for a replica not in `resolution`.
   */
  peerDispatched(peer: string, resolution: RouteResolution, dispatch: PeerDispatch): void;
  /** The first byte of a prefill `peer` {@link peerDispatched} came. */
  peerPrefillDone(peer: string, replicaId: string, prefillTokens: number): void;
  /** A request `peer` {@link peerDispatched} ended. */
  peerFinished(peer: string, replicaId: string): void;
  /**
   * What `peer` says it has in flight now, per replica (absent: none): replaces what its
   * dispatches and ends added up to, so that an end lost on the way counts only until then.
   */
  peerInFlightReset(peer: string, counts: ReadonlyMap<string, number>): void;
  /** `peer` went away: the prefills and requests it booked stop counting. */
  peerGone(peer: string): void;
  /**
   * An answer's head arrived with a status below 500: books the replica's health verdict now
   * rather than at the answer's end, so a half-open replica whose probe streams for minutes
   * takes requests again from its first byte. Its end is then `finished(…, "answered")`.
   */
  answered(replicaId: string, firstByteMs: number): void;
  /**
   * Books its end; returns the in-flight count after it. `precise`: the keys it was
   * {@link dispatched} with.
   */
  finished(
    replicaId: string,
    outcome: DispatchOutcome,
    firstByteMs?: number,
    precise?: ArrayLike<number>,
  ): number;
  /**
   * Drops what is known of a replica that left the route table: its health, its prefix-index
   * entries, its rendezvous seed and, once its last in-flight request has finished, its shared
   * in-flight slot (unless it is {@link relisted} by then). `deployment`: the one it served,
   * whose {@link drainingInFlight} counts its requests until they end.
   */
  forget(replicaId: string, deployment?: string): void;
  /**
   * `replicaId` is in the route table (call for each on every change). One {@link forget}ten
   * with requests still in flight that is back (same id: an agent's heartbeat lost, then
   * restored) keeps its in-flight slot, and what is learnt of it from now on is no longer
   * dropped when its last old request ends: forget it again if it leaves again. Returns
   * whether it was such a replica.
   */
  relisted(replicaId: string): boolean;
  readonly inFlight: InFlightCounters;
  readonly prefixIndex: PrefixIndex;
  /** The engines' own blocks, from their agents' KV-event feeds. */
  readonly preciseIndex: PreciseIndex;
  readonly health: ReplicaHealth;
  /** Each hint's replica. */
  readonly hintHomes: HintHomes;
  readonly scoring: ResolvedScoringOptions;
  /** Tokens one prefix-index block stands for ({@link ReplicaPickerOptions.blockTokens}). */
  readonly blockTokens: number;
}

/** Creates a {@link ReplicaPicker}. */
export function createReplicaPicker(options: ReplicaPickerOptions = {}): ReplicaPicker {
  const scoring = resolveScoringOptions(options.scoring);
  const prefixIndex = createPrefixIndex(options.prefixIndex);
  const health = createReplicaHealth(options.health);
  const inFlight = options.inFlight ?? createInFlightCounters();
  const blockTokens = checkRange(
    "blockTokens",
    options.blockTokens ?? DEFAULT_BLOCK_BYTES / 4,
    1,
    1 << 20,
  );
  const clock: Clock = options.health?.clock ?? systemClock;
  const preciseIndex = createPreciseIndex({ clock });
  const hintHomes = new HintHomes(options.hintHomes);
  const turns = new Map<string, number>();
  /** Replica id → the prefills sent there without a first byte yet, oldest first. */
  const pendingPrefill = new Map<string, PendingPrefill[]>();
  /**
   * Prompt tokens still expected to be in prefill at `replicaId`: each pending prefill counts
   * in full when just sent and less as it ages towards the replica's usual time to first
   * byte. A request sent where a prefill is nearly done waits for its end; one sent where a
   * prefill has just begun waits for all of it, or shares its step: under a burst every
   * replica often has one prefill queued, and which one ends first is what a new request's
   * first token waits for (bench/tenants).
   */
  const remainingPrefill = (
    list: readonly PendingPrefill[],
    expectedMs: number | undefined,
    nowMs: number,
  ): number => {
    let sum = 0;
    for (const p of list) {
      if (p.peer !== undefined && nowMs - p.sentAtMs > PEER_PREFILL_MAX_MS) continue;
      const left =
        expectedMs === undefined || expectedMs <= 0 ? 1 : 1 - (nowMs - p.sentAtMs) / expectedMs;
      sum += p.tokens * Math.max(LEAST_PENDING_PREFILL_SHARE, Math.min(1, left));
    }
    return sum;
  };
  const routerSeed = (id: string): number => replicaSeed(`router ${id}`);
  /** The peers heard from and not gone, by the id on their events, with their rendezvous seeds. */
  const peers = new Map<string, number>();
  const heardFrom = (peer: string): void => {
    if (!peers.has(peer)) peers.set(peer, routerSeed(peer));
  };
  const selfId = options.routerId;
  const selfSeed = selfId === undefined ? 0 : routerSeed(selfId);
  /**
   * Whether this router is first in `replicaId`'s rendezvous order of router ids (itself and
   * the peers heard from; `selfId` is set when `peers` can be non-empty).
   */
  const ownedHere = (replicaId: string): boolean => {
    const seed = seedOf(replicaId);
    const mine = rendezvousWeight(selfSeed, seed);
    for (const [p, peerSeed] of peers) {
      const theirs = rendezvousWeight(peerSeed, seed);
      if (theirs > mine || (theirs === mine && p < (selfId as string))) return false;
    }
    return true;
  };
  /** Peer → replica id → requests it has in flight there (its `sent` less its `end`s). */
  const peerInFlight = new Map<string, Map<string, number>>();
  const peersInFlightOn = (replicaId: string): number => {
    let n = 0;
    for (const counts of peerInFlight.values()) n += counts.get(replicaId) ?? 0;
    return n;
  };
  /** Replica id → its engine's step rhythm, from the chunks streamed through this router. */
  const phases = new Map<string, StepPhase>();
  /**
   * How much of a step a request sent to `replicaId` now waits (`StepPhase.waitShare`), or
   * undefined when unknown. A replica this router has heard nothing from for a few steps is
   * idle, unless a peer has requests in flight there: their chunks go to the peer, and the
   * steps go on unseen here. Read as idle, such a replica drew the new hints of a router that
   * happened to stream nothing from it.
   */
  const stepWait = (replicaId: string, nowMs: number): number | undefined => {
    const phase = phases.get(replicaId);
    if (phase === undefined) return undefined;
    if (phase.silent(nowMs) && peersInFlightOn(replicaId) > 0) return undefined;
    return phase.waitShare(nowMs);
  };
  /** Deployment → its recent picks (the bounded-load window of scoring.ts). */
  const windows = new Map<string, RecentPicks<string>>();
  /** Deployment → the hints of its recent hinted requests (which hints are hot). */
  const hintWindows = new Map<string, RecentPicks<number>>();
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
  /**
   * Forgotten replicas with requests still in flight, each with its deployment ("" unknown):
   * their slot is freed by the last one.
   */
  const retiring = new Map<string, string>();
  const routable = (resolution: RouteResolution): ReplicaRoute[] =>
    resolution.replicas.filter((r) => r.state === "ready" && health.isRoutable(r.id));
  /** The oldest pending prefill of this size from `peer` (this router's own: undefined) ends. */
  const endPrefill = (replicaId: string, tokens: number, peer: string | undefined): void => {
    const list = pendingPrefill.get(replicaId);
    if (list === undefined) return;
    // First bytes come about in the order prompts were sent: the oldest of this size ends.
    const at = list.findIndex((p) => p.tokens === tokens && p.peer === peer);
    if (at >= 0) list.splice(at, 1);
    if (list.length === 0) pendingPrefill.delete(replicaId);
  };
  const forget = (replicaId: string, deployment = ""): void => {
    health.forget(replicaId);
    prefixIndex.forget(replicaId);
    preciseIndex.forget(replicaId);
    pendingPrefill.delete(replicaId);
    for (const counts of peerInFlight.values()) counts.delete(replicaId);
    phases.delete(replicaId);
    seeds.delete(replicaId);
    hintHomes.forget(replicaId);
    if (inFlight.get(replicaId) > 0) retiring.set(replicaId, deployment);
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
      if (retiring.size > 0) {
        for (const [id, deployment] of retiring)
          if (deployment === resolution.deployment) sum += inFlight.get(id);
      }
      return sum;
    },
    preciseBlockSize(list) {
      let size: number | undefined;
      for (const r of list) {
        const s = preciseIndex.state(r.id);
        if (s === undefined || !s.fresh) return undefined;
        if (s.blockSizeTokens === undefined) continue; // stored nothing yet: matches nothing
        if (size !== undefined && s.blockSizeTokens !== size) return undefined;
        size = s.blockSizeTokens;
      }
      return size ?? "empty";
    },
    pick(resolution, chain, exclude, known, request) {
      const hint = request?.hint;
      const headroom = request?.headroom ?? 0;
      const precise = request?.precise;
      const nowMs = clock.now();
      const latencyFirst = request?.latencyFirst === true;
      const all = known ?? routable(resolution);
      const replicas =
        exclude === undefined || exclude.size === 0 ? all : all.filter((r) => !exclude.has(r.id));
      if (replicas.length === 0) return undefined;
      const scored = resolution.policy === "llmgw";
      const byPrefix = scored && chain.length > 0;
      const byEngine = scored && precise !== undefined && precise.length > 0;
      if (byPrefix) {
        // Each replica's share of the index is its engine's KV cache (unchanged capacities
        // return at once; a smaller one trims that replica's share before matching).
        for (const r of replicas) {
          const kvTokens = r.load?.kvCacheTokens;
          if (kvTokens !== undefined) prefixIndex.setCapacity(r.id, kvTokens / blockTokens);
        }
      }
      const matches = byEngine
        ? preciseIndex.match(
            replicas.map((r) => r.id),
            precise,
          )
        : byPrefix
          ? prefixIndex.match(chain, request?.quarters)
          : undefined;
      const quarters = request?.quarters?.length ?? 0;
      const chainLength = byEngine ? precise.length : Math.max(chain.length, quarters / 4);
      const hinted = scored && hint !== undefined && scoring.weights.hint > 0;
      const anchor = hinted
        ? hintAnchor(hint)
        : byPrefix && scoring.weights.rendezvous > 0
          ? chainAnchor(chain, scoring.rendezvousAnchorBlocks)
          : undefined;
      // Built here and filled in below (placementWait, once the hint is known to be hot).
      const candidates: { -readonly [K in keyof ScoringCandidate]: ScoringCandidate[K] }[] =
        new Array(replicas.length);
      for (let i = 0; i < replicas.length; i++) {
        const r = replicas[i] as ReplicaRoute;
        const candidate: (typeof candidates)[number] = {
          id: r.id,
          capacity: withHeadroom(Math.max(1, r.capacity), headroom),
          inFlight: inFlight.get(r.id),
          prefixBlocks: matches?.get(r.id) ?? 0,
          errorRate: health.errorRate(r.id),
        };
        if (r.load !== undefined) candidate.load = r.load;
        if (anchor !== undefined) candidate.rendezvous = rendezvousWeight(anchor, seedOf(r.id));
        const latencyMs = health.latencyMs(r.id);
        if (latencyMs !== undefined) candidate.latencyMs = latencyMs;
        const pending = pendingPrefill.get(r.id);
        if (pending !== undefined)
          candidate.pendingPrefillTokens = remainingPrefill(pending, latencyMs, nowMs);
        if (latencyFirst) {
          const wait = stepWait(r.id, nowMs);
          if (wait !== undefined) candidate.stepWait = wait;
        }
        candidates[i] = candidate;
      }
      const promptTokens = Math.max(1, request?.promptTokens ?? chain.length * blockTokens);
      let hot = false;
      let homeId: string | undefined;
      if (hinted && anchor !== undefined) {
        let hints = hintWindows.get(resolution.deployment);
        if (hints === undefined) {
          hints = new RecentPicks();
          hintWindows.set(resolution.deployment, hints);
        }
        const size = windowOf(resolution);
        // A hint with more of the recent hinted requests than its home may take (twice a
        // replica's share: `homeLoadFactor`) is hot: no one replica can hold all of it, so it
        // spreads, each replica filled to its fair share. Judged on the hints seen so far
        // while the window fills, so a hot hint spreads from its fourth request, not after
        // filling its home; and never below four, which one tenant's parallel conversations
        // reach by chance (as do 9 of 128 when 64 tenants share them: one replica's share).
        // Only while the deployment has as many requests in flight as replicas: a tenant
        // alone on a quiet deployment has all of its hinted requests, and spreading those
        // would only cost it its cache. Counted as the engines report them where that is more
        // than this router's own: with two routers each has half in flight, and a hot tenant
        // judged quiet on both piled 2.5–3.5× the mean on its home (bench/routing hot-prefix).
        // With peers, what they have in flight counts too (they say when each request ends).
        let inFlightNow = 0;
        for (const c of candidates) {
          const fleet = peerInFlight.size === 0 ? c.inFlight : c.inFlight + peersInFlightOn(c.id);
          inFlightNow += Math.max(fleet, c.load?.running ?? 0);
        }
        hot =
          inFlightNow >= candidates.length &&
          hints.count(anchor) + 1 >
            Math.max(
              HOT_HINT_LEAST,
              Math.ceil((scoring.homeLoadFactor * (hints.size + 1)) / candidates.length),
            );
        hints.add(anchor, size);
        // A hot hint spreads, each request a new prefill somewhere: by the engines' steps where
        // this router may place by time, as it homes a new hint.
        if (hot && request?.timedPlacement === true) {
          for (const c of candidates) {
            const wait = stepWait(c.id, nowMs);
            if (wait !== undefined) c.placementWait = wait;
          }
        }
        if (!hot) {
          let leastQueued = Number.POSITIVE_INFINITY;
          for (const c of candidates)
            leastQueued = Math.min(leastQueued, c.pendingPrefillTokens ?? 0);
          const home = hintHomes.homeOf(
            resolution.deployment,
            anchor,
            candidates,
            (id) => all.some((r) => r.id === id),
            nowMs,
            {
              // A new hint's first request goes where it waits least, and its home with it…
              placeable: (c) => !queuedBehind(c.pendingPrefillTokens, leastQueued, promptTokens),
              // …or where its prompt is already (another router sent it there).
              held: (c) => c.prefixBlocks,
              blocks: chainLength,
              // …and, among the replicas below their fair share of hints, where the engine's
              // step ends soonest, when this router is the only one or tells its peers (then
              // on the replicas it owns first).
              ...(request?.timedPlacement === true
                ? {
                    wait: (c: ScoringCandidate) => stepWait(c.id, nowMs),
                    ...(selfId === undefined || peers.size === 0
                      ? {}
                      : { owned: (c: ScoringCandidate) => ownedHere(c.id) }),
                  }
                : {}),
            },
          );
          const at = home === undefined ? -1 : candidates.findIndex((c) => c.id === home);
          if (at >= 0) (candidates[at] as { home?: boolean }).home = true;
          homeId = home;
        }
      }
      let recent = windows.get(resolution.deployment);
      if (recent === undefined) {
        recent = new RecentPicks();
        windows.set(resolution.deployment, recent);
      }
      if (scored) {
        for (const c of candidates) {
          const n = recent.count(c.id);
          if (n > 0) (c as { recent?: number }).recent = n;
        }
      }
      const turn = turns.get(resolution.deployment) ?? 0;
      turns.set(resolution.deployment, turn + 1);
      const ranking = rankCandidates(
        resolution.policy,
        candidates,
        chainLength,
        turn,
        scoring,
        hinted,
        promptTokens,
        // Only a full window says what a fair share is; before that, the in-flight bound —
        // except for a hot hint, whose requests are enough to fill a replica before the window
        // does (bench/routing hot-prefix: 18 of the first 128 picks on one replica, 2.25× its
        // share, and 1.33–1.40 max/mean over the run): it is bounded by the picks so far once
        // there is one per replica.
        scored && (recent.size >= windowOf(resolution) || (hot && recent.size >= candidates.length))
          ? recent.size
          : undefined,
        hot,
      );
      const best = ranking.ranked[0];
      if (best === undefined) return undefined;
      const replica = replicas.find((r) => r.id === best.id) as ReplicaRoute;
      // Eight picks per replica: long enough to see a tenant's share, short enough to follow it.
      recent.add(best.id, windowOf(resolution));
      return {
        replica,
        policy: resolution.policy,
        score: best.score,
        prefixBlocks: matches?.get(best.id) ?? 0,
        affinityVoided: best.affinityVoided,
        rendezvousPreferred: best.rendezvousPreferred,
        missingLoadSignals: ranking.missingLoadSignals,
        prefixSource: byEngine ? "precise" : "approximate",
        chainLength,
        prefillTokens: Math.round(promptTokens * (1 - best.affinity)),
        ...(hinted && anchor !== undefined ? { hint: anchor, home: best.id === homeId } : {}),
      };
    },
    dispatched(replicaId, chain, prefillTokens = 0, precise, tail) {
      health.onDispatch(replicaId);
      if (precise !== undefined) preciseIndex.hold(replicaId, precise);
      if (prefillTokens > 0) {
        const entry = { tokens: prefillTokens, sentAtMs: clock.now() };
        const list = pendingPrefill.get(replicaId);
        if (list === undefined) pendingPrefill.set(replicaId, [entry]);
        else list.push(entry);
      }
      if (chain.length > 0 || tail !== undefined) prefixIndex.record(chain, replicaId, tail);
      return inFlight.increment(replicaId);
    },
    stepPhase(replicaId) {
      let phase = phases.get(replicaId);
      if (phase === undefined) {
        phase = new StepPhase();
        phases.set(replicaId, phase);
      }
      return phase;
    },
    prefillDone(replicaId, prefillTokens) {
      endPrefill(replicaId, prefillTokens, undefined);
    },
    peerDispatched(peer, resolution, d) {
      heardFrom(peer);
      if (!resolution.replicas.some((r) => r.id === d.replicaId)) return;
      const nowMs = clock.now();
      let counts = peerInFlight.get(peer);
      if (counts === undefined) {
        counts = new Map();
        peerInFlight.set(peer, counts);
      }
      counts.set(d.replicaId, (counts.get(d.replicaId) ?? 0) + 1);
      if (d.prefillTokens > 0) {
        const entry = { tokens: d.prefillTokens, sentAtMs: nowMs, peer };
        const list = pendingPrefill.get(d.replicaId);
        // The peers' entries past their age go first: a first byte lost on the way must not
        // grow the list.
        const kept =
          list?.filter((p) => p.peer === undefined || nowMs - p.sentAtMs <= PEER_PREFILL_MAX_MS) ??
          [];
        kept.push(entry);
        pendingPrefill.set(d.replicaId, kept);
      }
      if (resolution.policy !== "llmgw") return;
      if ((d.chain !== undefined && d.chain.length > 0) || d.tail !== undefined)
        prefixIndex.record(d.chain ?? [], d.replicaId, d.tail);
      const size = windowOf(resolution);
      let recent = windows.get(resolution.deployment);
      if (recent === undefined) {
        recent = new RecentPicks();
        windows.set(resolution.deployment, recent);
      }
      recent.add(d.replicaId, size);
      if (d.hint === undefined) return;
      let hints = hintWindows.get(resolution.deployment);
      if (hints === undefined) {
        hints = new RecentPicks();
        hintWindows.set(resolution.deployment, hints);
      }
      hints.add(d.hint, size);
      if (d.home === true) hintHomes.adopt(resolution.deployment, d.hint, d.replicaId, nowMs);
    },
    peerPrefillDone(peer, replicaId, prefillTokens) {
      endPrefill(replicaId, prefillTokens, peer);
    },
    peerFinished(peer, replicaId) {
      const counts = peerInFlight.get(peer);
      const n = counts?.get(replicaId);
      if (counts === undefined || n === undefined) return;
      if (n > 1) counts.set(replicaId, n - 1);
      else counts.delete(replicaId);
    },
    peerInFlightReset(peer, counts) {
      heardFrom(peer);
      const next = new Map<string, number>();
      for (const [id, n] of counts) if (n > 0) next.set(id, n);
      if (next.size === 0) peerInFlight.delete(peer);
      else peerInFlight.set(peer, next);
    },
    peerGone(peer) {
      peers.delete(peer);
      peerInFlight.delete(peer);
      for (const [id, list] of pendingPrefill) {
        const kept = list.filter((p) => p.peer !== peer);
        if (kept.length === 0) pendingPrefill.delete(id);
        else if (kept.length < list.length) pendingPrefill.set(id, kept);
      }
    },
    answered(replicaId, firstByteMs) {
      health.onSuccess(replicaId, firstByteMs);
    },
    finished(replicaId, outcome, firstByteMs, precise) {
      const served = outcome === "success" || outcome === "answered";
      if (precise !== undefined) preciseIndex.release(replicaId, precise, served);
      if (outcome === "success") health.onSuccess(replicaId, firstByteMs ?? 0);
      else if (outcome === "failure") health.onFailure(replicaId);
      else if (outcome === "abandoned") health.onAbandon(replicaId);
      const left = inFlight.decrement(replicaId);
      if (left === 0 && retiring.size > 0 && retiring.delete(replicaId)) forget(replicaId);
      return left;
    },
    forget,
    relisted(replicaId) {
      return retiring.size > 0 && retiring.delete(replicaId);
    },
    inFlight,
    prefixIndex,
    preciseIndex,
    health,
    hintHomes,
    scoring,
    blockTokens,
  };
}

/** Picks the bounded-load window of a deployment holds: eight per replica, 32 to 4 096. */
function windowOf(resolution: RouteResolution): number {
  return Math.min(4096, Math.max(32, 8 * resolution.replicas.length));
}

/** The last picks of one deployment (replica ids, or hint keys), oldest first, with counts. */
class RecentPicks<K> {
  readonly #ids: K[] = [];
  readonly #counts = new Map<K, number>();
  #head = 0;

  get size(): number {
    return this.#ids.length - this.#head;
  }

  count(id: K): number {
    return this.#counts.get(id) ?? 0;
  }

  /** Adds `id`, dropping the oldest picks past `limit`. */
  add(id: K, limit: number): void {
    this.#ids.push(id);
    this.#counts.set(id, this.count(id) + 1);
    while (this.size > limit) {
      const old = this.#ids[this.#head++] as K;
      const n = this.count(old) - 1;
      if (n > 0) this.#counts.set(old, n);
      else this.#counts.delete(old);
    }
    // Compact now and then, so the array does not grow with every pick.
    if (this.#head > limit) {
      this.#ids.splice(0, this.#head);
      this.#head = 0;
    }
  }
}
