/**
 * Where each replica's engine is in its step, as seen in the chunks it streams back.
 *
 * An engine runs in steps, and every running sequence's token of a step is sent when that
 * step ends: a router streaming answers from a replica sees its chunks arrive in clusters, one
 * per step. A new request joins the engine's next step, so its first token waits for the
 * current step to end, then for its own prefill step: sent to the replica whose current step
 * ends soonest, it waits least. Under a burst every replica is mid-step, a decode step lasts
 * ~13 ms in `bench/tenants` (up to ~30 ms on real vLLM at 128 sequences), and a critical request
 * that arrives just after a step began waits all of it: that wait, and not the prefill it then
 * runs, was the rest of critical's TTFT p99 under the burst once the prefill reserve held.
 *
 * Known only from this router's own streams: a replica it has streamed nothing from for a few
 * steps is {@link StepPhase.silent} (idle, unless a peer streams from it: picker.ts), one it
 * never streamed from is unknown, and a step made long by another router's prefill shows only
 * as an overdue one.
 */

/** Chunks closer together than this are one step's (its streams' tokens), ms. */
export const SAME_STEP_MS = 3;

/** A step seen this many periods ago, with nothing since, means the engine went idle. */
const IDLE_PERIODS = 3;

/** A gap longer than this many periods is an idle spell, not a step: it moves no estimate. */
const LONGEST_STEP_PERIODS = 4;

/** Gaps above this are never steps (the first estimate needs a bound too), ms. */
const LONGEST_STEP_MS = 2_000;

/**
 * How long before its predicted end a step has likely ended already, ms: the time from an
 * engine's step end to this router reading its chunks, plus from sending a request to the
 * engine reading it. A request sent to a step "about to end" that in fact ended a moment ago
 * waits for all of the next one. Measured in bench/routing (16 simulated engines on a loaded
 * 2-core box, ~12 ms steps, requests sent round robin): of those predicted to end in under
 * 2.5 ms, 19 of 70 waited a whole step more; in 2.5–7.5 ms, 3 of 143. Picking the replica
 * whose step ends soonest picked exactly those: 40% of `unique`'s requests, and its TTFT p90
 * was behind round robin's.
 */
export const STEP_END_MARGIN_MS = 2.5;

/**
 * The wait of a replica whose step phase is unknown, as a share of a step: half, the mean of a
 * wait at a random moment, so that a known shorter wait goes first and a known longer one after.
 */
export const UNKNOWN_WAIT_SHARE = 0.5;

/** Weight of the newest step in the period's moving average. */
const ALPHA = 0.2;

/** One replica's step rhythm. */
export class StepPhase {
  /** When the latest cluster of chunks began (the latest step end seen), ms. */
  #stepEndMs = Number.NEGATIVE_INFINITY;
  /** When the latest chunk came, ms. */
  #lastChunkMs = Number.NEGATIVE_INFINITY;
  /** Moving average of the time between step ends, ms; undefined until two were seen. */
  #periodMs: number | undefined;

  /** A chunk from this replica arrived at `nowMs`. */
  observe(nowMs: number): void {
    const sinceLast = nowMs - this.#lastChunkMs;
    this.#lastChunkMs = nowMs;
    if (sinceLast < SAME_STEP_MS) return;
    const gap = nowMs - this.#stepEndMs;
    this.#stepEndMs = nowMs;
    const period = this.#periodMs;
    if (gap > LONGEST_STEP_MS || (period !== undefined && gap > LONGEST_STEP_PERIODS * period))
      return;
    this.#periodMs = period === undefined ? gap : period + ALPHA * (gap - period);
  }

  /**
   * Whether nothing came for {@link IDLE_PERIODS} steps: the engine ran out of work, as far as
   * these streams tell (false while the period is unknown).
   */
  silent(nowMs: number): boolean {
    const period = this.#periodMs;
    return period !== undefined && period > 0 && nowMs - this.#stepEndMs > IDLE_PERIODS * period;
  }

  /** The average step, ms; undefined until two step ends were seen. */
  periodMs(): number | undefined {
    return this.#periodMs;
  }

  /**
   * How much of a step a request sent now waits before the engine takes it, as a share of a
   * step: 0 when the current step ends just as the request arrives or the engine is idle, 1
   * when one just began or the current step runs past its usual length (a prefill in it).
   * A step due to end within {@link STEP_END_MARGIN_MS} (a quarter of a step at most) has
   * likely ended already: the request waits for the rest of the next one. Undefined when
   * unknown.
   */
  waitShare(nowMs: number): number | undefined {
    const period = this.#periodMs;
    if (period === undefined || period <= 0) return undefined;
    if (this.silent(nowMs)) return 0;
    const elapsed = nowMs - this.#stepEndMs;
    if (elapsed > period) return 1;
    const left = period - Math.max(0, elapsed) - Math.min(STEP_END_MARGIN_MS, period / 4);
    return (left >= 0 ? left : period + left) / period;
  }
}
