/** Time, injected so admission, limits and circuits are testable with a manual clock. */

/** Milliseconds clock plus one-shot timers. */
export interface Clock {
  /** Milliseconds since an arbitrary epoch; monotonic. */
  now(): number;
  /** Runs `fn` after `ms`; returns a cancel function. */
  setTimer(fn: () => void, ms: number): () => void;
}

/** The real clock (`performance.now()` and `setTimeout`, unref'd so it never holds a process). */
export const systemClock: Clock = {
  now: () => performance.now(),
  setTimer(fn, ms) {
    const handle = setTimeout(fn, ms);
    (handle as { unref?: () => void }).unref?.();
    return () => clearTimeout(handle);
  },
};

/** A clock moved by hand; timers fire inside {@link ManualClock.advance}. */
export interface ManualClock extends Clock {
  advance(ms: number): void;
}

/** Creates a {@link ManualClock} starting at `startMs`. */
export function createManualClock(startMs = 0): ManualClock {
  let now = startMs;
  let seq = 0;
  const timers = new Map<number, { at: number; fn: () => void }>();
  return {
    now: () => now,
    setTimer(fn, ms) {
      const id = seq++;
      timers.set(id, { at: now + ms, fn });
      return () => timers.delete(id);
    },
    advance(ms) {
      const target = now + ms;
      for (;;) {
        let next: [number, { at: number; fn: () => void }] | undefined;
        for (const entry of timers) if (!next || entry[1].at < next[1].at) next = entry;
        if (!next || next[1].at > target) break;
        timers.delete(next[0]);
        now = next[1].at;
        next[1].fn();
      }
      now = target;
    },
  };
}
