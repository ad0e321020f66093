/** A cancellable timer returned by {@link Clock.setTimer}. */
export interface TimerHandle {
  cancel(): void;
}

/**
 * Time as the supervisor sees it: wall-clock milliseconds plus one-shot timers. Injected so
 * that backoff, deadlines and polling can be driven by a manual clock in tests.
 */
export interface Clock {
  /** Milliseconds since the epoch. */
  now(): number;
  /** Calls `callback` once after `delayMs` (clamped to ≥ 0). */
  setTimer(callback: () => void, delayMs: number): TimerHandle;
}

/** The real clock: `Date.now()` and `setTimeout`. */
export const systemClock: Clock = {
  now: () => Date.now(),
  setTimer(callback, delayMs) {
    const timer = setTimeout(callback, Math.max(0, delayMs));
    return { cancel: () => clearTimeout(timer) };
  },
};

/** Resolves after `delayMs` on `clock`. */
export function sleep(clock: Clock, delayMs: number): Promise<void> {
  return new Promise((resolve) => {
    clock.setTimer(resolve, delayMs);
  });
}

/** Structured log sink; one line per state transition and per notable process event. */
export interface SupervisorLogger {
  info(message: string, fields?: Readonly<Record<string, unknown>>): void;
  warn(message: string, fields?: Readonly<Record<string, unknown>>): void;
}

/** A logger that drops everything (the default). */
export const silentLogger: SupervisorLogger = { info: () => {}, warn: () => {} };
