import type { Clock } from "../domain/cluster.js";

/** A clock that moves only when told to. */
export interface ManualClock extends Clock {
  advance(ms: number): void;
  set(ms: number): void;
}

/** A {@link ManualClock} starting at `startMs` (default 1_700_000_000_000). */
export function createManualClock(startMs = 1_700_000_000_000): ManualClock {
  let now = startMs;
  return {
    now: () => now,
    advance: (ms) => {
      now += ms;
    },
    set: (ms) => {
      now = ms;
    },
  };
}
