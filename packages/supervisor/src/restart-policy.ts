import { SupervisorError } from "./errors.js";

/** Partial restart policy as users write it; see {@link resolveRestartPolicy} for defaults. */
export interface RestartPolicyOptions {
  /** Delay before the first restart after a quick failure. Default 1000 ms. */
  initialDelayMs?: number;
  /** Multiplier per consecutive quick failure. Default 2. */
  factor?: number;
  /** Upper bound of the delay. Default 60 000 ms. */
  maxDelayMs?: number;
  /** A run at least this long counts as stable and resets the backoff. Default 60 000 ms. */
  stablePeriodMs?: number;
  /** Give up (→ `failed`) once this many consecutive quick failures happened. Default 5. */
  maxQuickFailures?: number;
}

/** Complete, validated restart policy. */
export interface ResolvedRestartPolicy {
  readonly initialDelayMs: number;
  readonly factor: number;
  readonly maxDelayMs: number;
  readonly stablePeriodMs: number;
  readonly maxQuickFailures: number;
}

/** One finished run of a replica's process: when it started and when it exited. */
export interface RunRecord {
  readonly startedAtMs: number;
  readonly exitedAtMs: number;
}

/** What to do after a run ended. */
export type RestartDecision =
  | {
      readonly action: "restart";
      /** Wait this long before relaunching. */
      readonly delayMs: number;
      /** Absolute time of the relaunch (`now + delayMs`). */
      readonly restartAtMs: number;
      /** Consecutive quick failures so far (0 after a stable run). */
      readonly quickFailures: number;
    }
  | { readonly action: "give-up"; readonly quickFailures: number; readonly reason: string };

/** Validates `options` once and fills defaults. Throws `LLMGW_SUPERVISOR_INVALID_OPTIONS`. */
export function resolveRestartPolicy(options: RestartPolicyOptions = {}): ResolvedRestartPolicy {
  const resolved: ResolvedRestartPolicy = {
    initialDelayMs: options.initialDelayMs ?? 1000,
    factor: options.factor ?? 2,
    maxDelayMs: options.maxDelayMs ?? 60_000,
    stablePeriodMs: options.stablePeriodMs ?? 60_000,
    maxQuickFailures: options.maxQuickFailures ?? 5,
  };
  for (const [name, value] of Object.entries(resolved)) {
    if (!Number.isFinite(value) || value < 0) {
      throw new SupervisorError(
        "LLMGW_SUPERVISOR_INVALID_OPTIONS",
        `restart policy option ${name} must be a finite number ≥ 0, got ${String(value)}`,
      );
    }
  }
  if (resolved.factor < 1) {
    throw new SupervisorError(
      "LLMGW_SUPERVISOR_INVALID_OPTIONS",
      `restart policy option factor must be ≥ 1, got ${resolved.factor}`,
    );
  }
  if (resolved.maxQuickFailures < 1 || !Number.isInteger(resolved.maxQuickFailures)) {
    throw new SupervisorError(
      "LLMGW_SUPERVISOR_INVALID_OPTIONS",
      `restart policy option maxQuickFailures must be an integer ≥ 1, got ${resolved.maxQuickFailures}`,
    );
  }
  return resolved;
}

/**
 * Pure restart decision after the last run in `history` ended.
 *
 * Counts the consecutive *quick* runs (shorter than `stablePeriodMs`) at the end of the
 * history; a stable run resets the count. With `n` quick failures the delay is
 * `initialDelayMs × factor^(n-1)` capped at `maxDelayMs` (a stable run restarts after
 * `initialDelayMs`); at `maxQuickFailures` quick failures it gives up.
 */
export function nextRestartDecision(
  history: readonly RunRecord[],
  nowMs: number,
  policy: ResolvedRestartPolicy,
): RestartDecision {
  let quickFailures = 0;
  for (let i = history.length - 1; i >= 0; i--) {
    const run = history[i]!;
    if (run.exitedAtMs - run.startedAtMs >= policy.stablePeriodMs) break;
    quickFailures++;
  }
  if (quickFailures >= policy.maxQuickFailures) {
    return {
      action: "give-up",
      quickFailures,
      reason: `${quickFailures} consecutive runs shorter than ${policy.stablePeriodMs} ms`,
    };
  }
  const exponent = Math.max(0, quickFailures - 1);
  const delayMs = Math.min(policy.maxDelayMs, policy.initialDelayMs * policy.factor ** exponent);
  return { action: "restart", delayMs, restartAtMs: nowMs + delayMs, quickFailures };
}
