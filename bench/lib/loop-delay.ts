/**
 * Event-loop delay the way the benchmarks report it: how late the loop ran a timer, in ms.
 *
 * `monitorEventLoopDelay` records the time between two ticks of its interval timer, so every
 * value includes the sampling interval itself (an idle process at resolution 5 shows p50
 * 5.6 ms, at resolution 10 shows 10.1 ms; nodejs/node#34661, and Node's own per-iteration
 * mode in nodejs/node#62935 calls it "an implicit floor of resolution ms"). Monitoring tools
 * subtract it (Elastic APM, OpenTelemetry discussion #2794); so do we, once, here.
 */
import { type IntervalHistogram, monitorEventLoopDelay } from "node:perf_hooks";

/** A running monitor; percentiles are lateness in ms (never below 0). */
export interface LoopDelayMonitor {
  readonly histogram: IntervalHistogram;
  /** The `p`-th percentile (0–100) of lateness, ms. */
  percentileMs(p: number): number;
  /** The largest lateness seen, ms. */
  maxMs(): number;
  reset(): void;
  /** Starts the sampling timer again after `disable`. */
  enable(): void;
  /** Stops the sampling timer (an interval timer wakes the process every `resolutionMs`). */
  disable(): void;
}

/** Starts monitoring with a timer every `resolutionMs`. */
export function monitorLoopDelay(resolutionMs: number): LoopDelayMonitor {
  const histogram = monitorEventLoopDelay({ resolution: resolutionMs });
  histogram.enable();
  const late = (ns: number): number => Math.max(0, ns / 1e6 - resolutionMs);
  return {
    histogram,
    percentileMs: (p) => late(histogram.percentile(p)),
    maxMs: () => late(histogram.max),
    reset: () => histogram.reset(),
    enable: () => histogram.enable(),
    disable: () => histogram.disable(),
  };
}
