/**
 * Replica choice. Pure: the caller gathers live numbers (in-flight counts, engine load, error
 * rates, prefix matches) and gets back the candidates with room, best first.
 *
 * `llmgw` score = affinity·wA − pendingPrefill·wP − utilisation·wL − engineQueue·wQ −
 * kvUsage·wK − errorRate·wE − latencyPenalty·wT, where affinity is the share of the prompt's
 * block chain the replica holds, and pendingPrefill the prompt tokens this router sent it that
 * have not produced a first byte yet, in units of this request's own prompt. Together the first
 * two are the time to first token this request would see there, up to a constant: the work
 * queued ahead of it plus its own uncached part (a full miss costs 1, as much as a full prefix
 * match saves). Without them a prefix-blind choice was the luck of a hash: with unique prompts
 * the rendezvous preference spread requests at random, and random spreads queue unevenly (p90
 * ~2× round robin's on 16 replicas); counting queued prefill balances them as tightly as the
 * work itself. Affinity is BOUNDED: a replica whose utilisation reaches
 * `affinityMaxUtilization`, or exceeds the least-utilised candidate's by more than
 * `affinitySlack`, loses its affinity claim, so a shared prefix cannot pile load onto one replica
 * (the cache-aware "death spiral" peers reported).
 *
 * Plus rendezvous·wR for one candidate while the prompt's anchor is new to this router (no live
 * affinity claim reaches the anchor block): the one with the highest rendezvous weight
 * (rendezvous.ts) among those within the same bounds. It makes routers that share no prefix
 * index agree where a new prefix goes; once a router has sent it, its own bounded affinity
 * decides, as with one router (a bonus on top of affinity piled a hot prefix onto one replica
 * in simulation). A preference, not an exact tie-break: each router counts only its own
 * in-flight requests, so their scores never tie exactly. The default 0.25 outweighs a
 * utilisation lead of 0.25 and the latency term (at most 0.2), and yields to an engine queue
 * over half the capacity, KV usage 0.83 above another's, an error rate over 12.5% and the load
 * bounds, which pass it to the next rendezvous choice, the same one on every router.
 *
 * A request that names its affinity (a hint: `prompt_cache_key`, the session header, `user`)
 * goes to the hint's home (hint-homes.ts: the first replica in the hint's rendezvous order with
 * fewer than its share of the deployment's hints), which gets hint·wH (default 0.5, half a full
 * prefix match) whether or not the prompt is new: the client said these requests belong
 * together. The home keeps them while its utilisation leads the least utilised candidate's by
 * at most `affinitySlack` and its share of recent requests stays within `homeLoadFactor` (2) —
 * hints are already spread by count, so a busy moment there moves no request — and spills to
 * the hint's next rendezvous choice otherwise. A hint busier than its home may take (picker.ts)
 * has no home: it takes the hint's highest rendezvous choice under the ordinary bounds at a
 * load factor of 1, filling replicas to their fair share and leaving the rest to their homed
 * hints. Where the router may place by time (`placementWait`), that choice is instead a replica
 * holding the hint's prefix whose engine step ends soonest, then any (bench/routing hot-prefix:
 * the hot tenant's cached first turns' TTFT p50 went from 26–27 to 23–25 ms, max/mean from
 * 1.21–1.27 to 1.08–1.17). And a request one replica holds more of than any other (its
 * conversation's earlier turns went there; the hint's shared prefix is on all it reached) goes
 * there within the ordinary factor (bench/routing hot-prefix: the hot tenant's second turns had
 * 145 of ~1,190 prompt tokens uncached, a miss of their first turn, and now ~100, as with the
 * header hash; their TTFT p50 went from 35 to 29–30 ms; the approximate index tells the
 * conversation apart by where its first turn ended, `PrefixIndex.match` with quarters).
 * Neither the rendezvous preference nor a hot hint's goes to a replica with more prefill
 * queued than the least queued one by over a quarter of this prompt: a request would wait
 * behind it, and nothing cached there yet makes up for that. A home keeps its preference with
 * prefill queued (its hints' prefixes are there); only the score's own terms move such a
 * request.
 */
import { checkRange, RouterError } from "./errors.js";
import { DEFAULT_RENDEZVOUS_ANCHOR_BLOCKS } from "./rendezvous.js";
import type { ReplicaLoad, RoutingPolicy } from "./route-table.js";
import { UNKNOWN_WAIT_SHARE } from "./step-phase.js";

/** Live numbers about one routable replica. */
export interface ScoringCandidate {
  readonly id: string;
  /** Max concurrent requests the router sends it. */
  readonly capacity: number;
  /** Requests in flight through this router. */
  readonly inFlight: number;
  readonly load?: ReplicaLoad;
  /** Leading blocks of this prompt's chain the replica recently received. */
  readonly prefixBlocks: number;
  /** Recent upstream error rate 0..1 (EWMA). */
  readonly errorRate: number;
  /** Recent latency to first byte in ms (EWMA); absent before the first response. */
  readonly latencyMs?: number;
  /**
   * Prompt tokens this router sent the replica that have not produced a first byte yet (still
   * queued or in prefill); absent counts as 0.
   */
  readonly pendingPrefillTokens?: number;
  /** Of the deployment's recent requests through this router, how many went here. */
  readonly recent?: number;
  /**
   * Of a step, how long a request sent now waits for the replica's current engine step to end
   * (`StepPhase.waitShare`, 0–1); set only for a request that asks for its first token before
   * load balance (`PickRequest.latencyFirst`), absent when unknown.
   */
  readonly stepWait?: number;
  /**
   * For a hot hint's request (see `rankCandidates`), how long a request sent now waits for the
   * replica's current engine step to end (`StepPhase.waitShare`, 0–1); absent when unknown, or
   * when the hint's requests must follow the rendezvous order (routers that tell each other
   * nothing). Given, the hint's preference goes to the eligible replica that holds its prefix,
   * then where this wait is shortest, and only then by the rendezvous order.
   */
  readonly placementWait?: number;
  /**
   * The prompt's rendezvous weight for this replica (`rendezvousWeight`, unsigned 32-bit);
   * absent when the prompt has no chain or the preference is off.
   */
  readonly rendezvous?: number;
  /**
   * The replica the request's hint lives on (hint-homes.ts): the hint's preference goes here
   * first, under the looser `homeLoadFactor` bounds (the hints per replica are bounded
   * already; a hint busier than that still spreads).
   */
  readonly home?: boolean;
}

/** Weights of the `llmgw` score. */
export interface ScoringWeights {
  readonly affinity: number;
  readonly load: number;
  readonly queue: number;
  readonly kvCache: number;
  readonly errors: number;
  readonly latency: number;
  /** The rendezvous preference; 0 turns it off. */
  readonly rendezvous: number;
  /** The rendezvous preference of a hinted request (see above); 0 ignores hints. */
  readonly hint: number;
  /** Queued prefill ahead of the request, per prompt of its own (see above). */
  readonly prefill: number;
  /** The wait for the current engine step to end, per step (`stepWait`). */
  readonly step: number;
}

/** Options of {@link rankCandidates}. */
export interface ScoringOptions {
  readonly weights?: Partial<ScoringWeights>;
  /** Utilisation (in-flight ÷ capacity) at which affinity is void (default 0.75). */
  readonly affinityMaxUtilization?: number;
  /** Utilisation lead over the least-utilised candidate at which affinity is void (default 0.5). */
  readonly affinitySlack?: number;
  /**
   * Bounded load (consistent hashing with bounded loads): a replica keeps its affinity claim
   * only while its share of the deployment's recent requests through this router, with this
   * one, stays at or below `ceil(factor × (recent + 1) ÷ candidates)`; and, once more requests
   * are in flight than twice the candidates, while its in-flight count with this one stays at or
   * below `ceil(factor × (total in flight + 1) ÷ candidates)`. Default 1.25.
   *
   * Counting recent requests rather than those in flight is what keeps a tenant on its replica
   * at low concurrency: with 16 replicas and 8 requests in flight the in-flight bound is 1, so
   * any replica already serving one lost its claim, and a tenant's prefix was spread over the
   * fleet (58% engine hits against a header hash's 78% on `shared-prefix`, bench/routing). The
   * recent share still spreads a prefix hot enough to take more than its share of requests.
   */
  readonly affinityLoadFactor?: number;
  /**
   * The bounded-load factor of a hint's home (hint-homes.ts), in place of
   * `affinityLoadFactor` (default 2): hints are spread over replicas by count, so a replica
   * takes more than its share of recent requests only while its tenants are busier than the
   * others for a moment, and moving one of their requests then costs a cache miss for nothing.
   * A single hint busier than two replicas' share still spreads.
   */
  readonly homeLoadFactor?: number;
  /**
   * Block of the prompt's chain whose key anchors the rendezvous choice: block
   * `min(chain length, this)`, an integer in [1, 512] (default 2, i.e. the first 2 KiB).
   */
  readonly rendezvousAnchorBlocks?: number;
}

/** Resolved {@link ScoringOptions}. */
export interface ResolvedScoringOptions {
  readonly weights: ScoringWeights;
  readonly affinityMaxUtilization: number;
  readonly affinitySlack: number;
  readonly affinityLoadFactor: number;
  readonly homeLoadFactor: number;
  readonly rendezvousAnchorBlocks: number;
}

/**
 * Queued prefill, in prompts of the request's own, by which a replica may exceed the least
 * queued one and still take the rendezvous or hint preference.
 */
const QUEUED_SLACK = 0.25;

/**
 * Whether a replica with `pending` prefill tokens queued is behind the least queued candidate
 * (`leastQueued`) by more than {@link QUEUED_SLACK} prompts of `promptTokens`.
 */
export function queuedBehind(
  pending: number | undefined,
  leastQueued: number,
  promptTokens: number,
): boolean {
  return ((pending ?? 0) - leastQueued) / Math.max(1, promptTokens) > QUEUED_SLACK;
}

/** Default weights of the `llmgw` score. */
export const DEFAULT_SCORING_WEIGHTS: ScoringWeights = {
  affinity: 1,
  load: 1,
  queue: 0.5,
  kvCache: 0.3,
  errors: 2,
  latency: 0.2,
  rendezvous: 0.25,
  hint: 0.5,
  prefill: 1,
  step: 0.5,
};

/** Validates scoring options and fills defaults. */
export function resolveScoringOptions(options: ScoringOptions = {}): ResolvedScoringOptions {
  const weights = { ...DEFAULT_SCORING_WEIGHTS, ...options.weights };
  for (const [name, w] of Object.entries(weights)) checkRange(`weights.${name}`, w, 0, 100);
  const anchorBlocks = options.rendezvousAnchorBlocks ?? DEFAULT_RENDEZVOUS_ANCHOR_BLOCKS;
  if (!Number.isInteger(anchorBlocks) || anchorBlocks < 1 || anchorBlocks > 512) {
    throw new RouterError(
      "LLMGW_ROUTER_INVALID_OPTIONS",
      `option rendezvousAnchorBlocks must be an integer in [1, 512], got ${String(anchorBlocks)}`,
    );
  }
  return {
    weights,
    affinityMaxUtilization: checkRange(
      "affinityMaxUtilization",
      options.affinityMaxUtilization ?? 0.75,
      0,
      1,
    ),
    affinitySlack: checkRange("affinitySlack", options.affinitySlack ?? 0.5, 0, 1),
    affinityLoadFactor: checkRange(
      "affinityLoadFactor",
      options.affinityLoadFactor ?? 1.25,
      1,
      100,
    ),
    homeLoadFactor: checkRange("homeLoadFactor", options.homeLoadFactor ?? 2, 1, 100),
    rendezvousAnchorBlocks: anchorBlocks,
  };
}

/** One candidate with its score, as returned by {@link rankCandidates}. */
export interface RankedCandidate {
  readonly id: string;
  readonly score: number;
  /** Share of the chain held (0..1) before the load bound. */
  readonly affinity: number;
  /** True when the replica held a prefix but lost its claim to the load bound. */
  readonly affinityVoided: boolean;
  /** True for the candidate that got the rendezvous preference (at most one, see above). */
  readonly rendezvousPreferred: boolean;
  readonly utilization: number;
}

/** Result of {@link rankCandidates}. */
export interface Ranking {
  /** Candidates with room (in-flight < capacity), best first. */
  readonly ranked: readonly RankedCandidate[];
  /** True when a `llmgw` decision had no engine load signals for some candidate (router-only numbers used). */
  readonly missingLoadSignals: boolean;
}

/**
 * Ranks `candidates` under `policy`. `chainLength` is the prompt's block count; `turn` is a
 * per-deployment counter that rotates round-robin order and breaks ties. `hinted`: the
 * candidates' rendezvous weights come from the request's hint, not its prompt. `promptTokens`:
 * the request's prompt size, the unit of queued prefill (at least 1). `recentTotal`: the
 * deployment's recent picks when the window is full (a hot hint's: once it holds one pick per
 * replica). `hot`: the hint takes more of the hinted requests than its home may (picker.ts), so
 * it has no home and spreads, filling each replica only to its fair share.
 */
export function rankCandidates(
  policy: RoutingPolicy,
  candidates: readonly ScoringCandidate[],
  chainLength: number,
  turn: number,
  options: ResolvedScoringOptions,
  hinted = false,
  promptTokens = 1,
  recentTotal?: number,
  hot = false,
): Ranking {
  const n = candidates.length;
  const withRoom: { c: ScoringCandidate; order: number; utilization: number }[] = [];
  for (let i = 0; i < n; i++) {
    const c = candidates[i] as ScoringCandidate;
    if (c.inFlight >= c.capacity) continue;
    // Rotating the tie-break order spreads equal scores instead of favouring the first replica.
    withRoom.push({ c, order: (i - (turn % n) + n) % n, utilization: c.inFlight / c.capacity });
  }
  if (policy === "round-robin") {
    withRoom.sort((a, b) => a.order - b.order);
    return { ranked: withRoom.map((x) => plain(x.c, x.utilization, 0)), missingLoadSignals: false };
  }
  if (policy === "least-loaded") {
    withRoom.sort(
      (a, b) =>
        a.utilization - b.utilization ||
        (a.c.load?.waiting ?? 0) - (b.c.load?.waiting ?? 0) ||
        a.order - b.order,
    );
    return {
      ranked: withRoom.map((x) => plain(x.c, x.utilization, -x.utilization)),
      missingLoadSignals: false,
    };
  }
  const { weights, affinityMaxUtilization, affinitySlack, affinityLoadFactor, homeLoadFactor } =
    options;
  let minUtil = Number.POSITIVE_INFINITY;
  let minLatency = Number.POSITIVE_INFINITY;
  let missing = false;
  let totalInFlight = 0;
  let leastQueued = Number.POSITIVE_INFINITY;
  for (const x of withRoom) {
    totalInFlight += x.c.inFlight;
    leastQueued = Math.min(leastQueued, x.c.pendingPrefillTokens ?? 0);
    minUtil = Math.min(minUtil, x.utilization);
    if (x.c.latencyMs !== undefined) minLatency = Math.min(minLatency, x.c.latencyMs);
    if (x.c.load?.waiting === undefined && x.c.load?.kvCacheUsage === undefined) missing = true;
  }
  const k = withRoom.length;
  // A hot hint fills replicas to their fair share only: the hints homed there need the rest.
  const factor = hot ? 1 : affinityLoadFactor;
  const loadBound = Math.ceil((factor * (totalInFlight + 1)) / k);
  const fullWindow = recentTotal !== undefined && recentTotal >= k;
  const shareBound = fullWindow ? Math.ceil((factor * (recentTotal + 1)) / k) : undefined;
  // A hot hint's request at the one replica holding the most of its prompt: the ordinary bounds.
  const holderLoadBound = Math.ceil((affinityLoadFactor * (totalInFlight + 1)) / k);
  const holderShareBound = fullWindow
    ? Math.ceil((affinityLoadFactor * (recentTotal + 1)) / k)
    : undefined;
  const homeShareBound = fullWindow
    ? Math.ceil((homeLoadFactor * (recentTotal + 1)) / k)
    : undefined;
  /** Enough in flight for counting them to say where the load is. */
  const concurrent = totalInFlight + 1 > 2 * k;
  // Built once, field by field, and sorted through an index: stripping the tie-break order with
  // a rest spread copied every candidate (scoring allocated ~1 KB per request, now ~0.6 KB).
  const scored: { -readonly [K in keyof RankedCandidate]: RankedCandidate[K] }[] = [];
  /** The anchor's depth: a live claim this deep means the prefix is not new to this router. */
  const anchorBlocks = Math.min(chainLength, options.rendezvousAnchorBlocks);
  let anchorHeld = false;
  let preferred = -1;
  let preferredWeight = -1;
  /** The hint's home, when it may take the preference. */
  let home = -1;
  const holder = hot ? soleLongestHolder(withRoom) : -1;
  /** The holder took the preference (see below): the rendezvous order no longer decides. */
  let holderPreferred = false;
  // A hot hint's preference by time: holders of its prefix first, then the soonest step end.
  const timedHot = hot && withRoom.some((x) => x.c.placementWait !== undefined);
  let preferredHolds = -1;
  let preferredWait = Number.POSITIVE_INFINITY;
  for (let i = 0; i < withRoom.length; i++) {
    const { c, utilization } = withRoom[i] as (typeof withRoom)[number];
    const affinity = chainLength > 0 ? Math.min(1, c.prefixBlocks / chainLength) : 0;
    const overUtilized =
      utilization >= affinityMaxUtilization || utilization - minUtil > affinitySlack;
    // A hot hint's conversation stays where its earlier turns are, under the ordinary bounds:
    // moved, its history is a miss, and the one replica holding it is as good a place for its
    // share of the hint's requests as the next in the hint's order.
    const sticky = i === holder;
    const overInFlight = c.inFlight + 1 > (sticky ? holderLoadBound : loadBound);
    const share = sticky ? holderShareBound : shareBound;
    // What a held prefix or a hint may pile on a replica: its recent share, and what it has
    // in flight once there is real concurrency.
    const overBound =
      overUtilized ||
      ((concurrent || share === undefined) && overInFlight) ||
      (share !== undefined && (c.recent ?? 0) + 1 > share);
    const isHome = hinted && c.home === true;
    // No in-flight bound: homes are spread by count, and a replica's in-flight requests are
    // mostly decodes, whose count swings more than its share of arrivals (moving a request
    // for it cost ~5 points of cache hits at 64 req/s in bench/routing). Nor the absolute
    // utilisation bound, only the lead over the least utilised: when every replica is that
    // busy, a request moved off its home is a miss that adds a prefill to a fleet with no room
    // for one (at 640 req/s, TTFT p90 went from 195 ms at 512 to 847, and the cache hits from
    // 88% to 78%, where the header hash, which moves nothing, read 290 ms).
    const overHomeBound =
      isHome &&
      (utilization - minUtil > affinitySlack ||
        (homeShareBound !== undefined && (c.recent ?? 0) + 1 > homeShareBound));
    const voided = affinity > 0 && (isHome ? overHomeBound : overBound);
    if (affinity > 0 && !voided && c.prefixBlocks >= anchorBlocks) anchorHeld = true;
    const w = c.rendezvous;
    // A new prefix's rendezvous choice keeps the in-flight bound alone: every router agrees on
    // it without knowing the others' recent picks, and new prefixes hash evenly anyway. A
    // holder whose claim the bound voided gets no preference either, or it would keep the prefix.
    // Nor does a replica with prefill queued ahead when another has less: the preference is a
    // tie-break among equals, and an aged prefill (half a prompt at least) plus a hint's bonus
    // (half a prompt) tied with a free replica, so unique sessions queued behind each other.
    const behind = queuedBehind(c.pendingPrefillTokens, leastQueued, promptTokens);
    // The home keeps the preference with prefill queued: its hints' prefixes are there, and
    // sending one elsewhere is a miss that costs the fleet a whole prefill (the score's own
    // terms still move a request whose home is queued deeper than its prefix is worth).
    if (isHome && !overHomeBound) home = scored.length;
    const eligible = !behind && (hinted ? !overBound : !(overUtilized || overInFlight || voided));
    if (sticky && eligible) {
      preferred = scored.length;
      holderPreferred = true;
    } else if (w !== undefined && !isHome && !holderPreferred && eligible) {
      // First by what it holds and when its step ends (a hot hint placed by time), then by the
      // rendezvous weight, then the id.
      const holds = timedHot && affinity > 0 ? 1 : 0;
      const wait = timedHot ? (c.placementWait ?? UNKNOWN_WAIT_SHARE) : 0;
      const order =
        preferredHolds - holds ||
        wait - preferredWait ||
        preferredWeight - w ||
        (c.id < (scored[preferred]?.id ?? "") ? -1 : 1);
      if (order < 0) {
        preferred = scored.length;
        preferredWeight = w;
        preferredHolds = holds;
        preferredWait = wait;
      }
    }
    const queue = Math.min(1, (c.load?.waiting ?? 0) / c.capacity);
    const kv = Math.min(1, Math.max(0, c.load?.kvCacheUsage ?? 0));
    const latency =
      c.latencyMs !== undefined && minLatency > 0 && Number.isFinite(minLatency)
        ? Math.min(1, c.latencyMs / minLatency - 1)
        : 0;
    const prefill = (c.pendingPrefillTokens ?? 0) / Math.max(1, promptTokens);
    const score =
      (voided ? 0 : affinity) * weights.affinity -
      prefill * weights.prefill -
      utilization * weights.load -
      queue * weights.queue -
      kv * weights.kvCache -
      c.errorRate * weights.errors -
      latency * weights.latency -
      (c.stepWait ?? 0) * weights.step;
    scored.push({
      id: c.id,
      score,
      affinity,
      affinityVoided: voided,
      rendezvousPreferred: false,
      utilization,
    });
  }
  const chosen = scored[home >= 0 ? home : preferred];
  const bonus = hinted ? weights.hint : anchorHeld ? 0 : weights.rendezvous;
  if (chosen !== undefined && bonus > 0) {
    chosen.score += bonus;
    chosen.rendezvousPreferred = true;
  }
  if (scored.length < 2) return { ranked: scored, missingLoadSignals: missing };
  const byRank = scored.map((_, i) => i);
  byRank.sort(
    (a, b) => scored[b]!.score - scored[a]!.score || withRoom[a]!.order - withRoom[b]!.order,
  );
  return { ranked: byRank.map((i) => scored[i]!), missingLoadSignals: missing };
}

/**
 * The index of the one candidate holding more of the prompt than every other, or -1 (none
 * holds any, or two hold the most). Of a hot hint's requests, that is where the conversation's
 * earlier turns went: the hint's shared prefix is on every replica it has reached.
 */
function soleLongestHolder(withRoom: readonly { readonly c: ScoringCandidate }[]): number {
  let most = 0;
  let second = 0;
  let at = -1;
  for (let i = 0; i < withRoom.length; i++) {
    const blocks = (withRoom[i] as { readonly c: ScoringCandidate }).c.prefixBlocks;
    if (blocks > most) {
      second = most;
      most = blocks;
      at = i;
    } else if (blocks > second) second = blocks;
  }
  return most > second ? at : -1;
}

function plain(c: ScoringCandidate, utilization: number, score: number): RankedCandidate {
  return {
    id: c.id,
    score,
    affinity: 0,
    affinityVoided: false,
    rendezvousPreferred: false,
    utilization,
  };
}
