/**
 * The rate sweep of the routing benchmark (llm-d's method): each target runs at increasing
 * Poisson rates until its TTFT p90 leaves the SLO, and its **goodput** is the highest rate it
 * served within the SLO. Pure: the rungs are measured by `run.ts`.
 */

/** One measured rung of one target's sweep. */
export interface Rung {
  /** Offered arrival rate, simulated requests per second. */
  readonly rate: number;
  readonly requests: number;
  readonly ok: number;
  /** TTFT p90 over the answered requests, simulated ms (NaN when none answered). */
  readonly ttftP90Ms: number;
  /**
   * Share of the offered rate the client actually sent: scheduled ÷ actual span of the
   * arrivals (1 when every arrival left on time; below 1 when arrivals waited for an idle
   * conversation, i.e. answers came back too slowly and the client held the load back).
   */
  readonly offeredShare: number;
}

/** Why a rung passed or did not. */
export type RungVerdict = "pass" | "slo" | "failed-requests" | "held-back";

/** Options of the verdict. */
export interface SweepCriteria {
  /** TTFT p90 bound, simulated ms. */
  readonly sloTtftP90Ms: number;
  /**
   * The least share of the offered rate a passing rung must have sent (default 0.9): below
   * it the target's slow answers throttled the client, so the rate was never offered.
   */
  readonly minOfferedShare?: number;
}

/**
 * A rung passes when every request succeeded, the whole rate was offered and TTFT p90 is
 * within the SLO; otherwise the first reason it did not.
 */
export function judgeRung(rung: Rung, criteria: SweepCriteria): RungVerdict {
  if (rung.ok < rung.requests || rung.requests === 0) return "failed-requests";
  if (rung.offeredShare < (criteria.minOfferedShare ?? 0.9)) return "held-back";
  if (!(rung.ttftP90Ms <= criteria.sloTtftP90Ms)) return "slo";
  return "pass";
}

/** Failed rungs after which a target stops climbing. */
export const MAX_FAILED_RUNGS = 2;

/** Whether a target whose rungs so far are `rungs` climbs to the next rate. */
export function keepClimbing(rungs: readonly Rung[], criteria: SweepCriteria): boolean {
  return rungs.filter((r) => judgeRung(r, criteria) !== "pass").length < MAX_FAILED_RUNGS;
}

/**
 * The highest passing rate, or 0 when no rung passed. When it is the ladder's top rung the
 * true goodput may be higher (see {@link goodputIsCensored}).
 */
export function goodput(rungs: readonly Rung[], criteria: SweepCriteria): number {
  return rungs
    .filter((r) => judgeRung(r, criteria) === "pass")
    .reduce((best, r) => Math.max(best, r.rate), 0);
}

/**
 * Parses `--sweep-rates` (comma-separated positive numbers, simulated req/s) into an
 * ascending ladder without repeats; throws naming the flag and echoing the bad value.
 */
export function parseRates(text: string): number[] {
  const rates = text.split(",").map((t) => Number(t.trim()));
  if (rates.length === 0 || rates.some((r) => !Number.isFinite(r) || r <= 0))
    throw new Error(
      `--sweep-rates ${JSON.stringify(text)}: expected positive numbers, e.g. 4,8,16`,
    );
  return [...new Set(rates)].sort((a, b) => a - b);
}

/**
 * The default ladder for `replicas` engines: per-replica rates 3, 6, 12, 18, 24, 32, 40 req/s,
 * so one ladder spans "every target passes" (an uncached ~1.1k-token prompt costs a sim
 * engine ~0.11 s of prefill: ~9 req/s per replica without cache hits) to past where
 * cache-affine routing saturates (with ~90% of the prompt cached a sim engine sustained 20
 * req/s per replica within a 250 ms TTFT p90, on the hottest replica 30).
 */
export function defaultRates(replicas: number): number[] {
  return [3, 6, 12, 18, 24, 32, 40].map((perReplica) => perReplica * replicas);
}

/** Whether the goodput is only a lower bound: the top rung of `ladder` passed. */
export function goodputIsCensored(
  rungs: readonly Rung[],
  ladder: readonly number[],
  criteria: SweepCriteria,
): boolean {
  const top = ladder[ladder.length - 1];
  return top !== undefined && goodput(rungs, criteria) === top;
}
