/**
 * Tells the control plane what this router still has in flight on each replica it holds as
 * draining, so that a draining replica is stopped only once no router has a request on it.
 *
 * While the routing state holds any draining replica, a report lists every one of them with
 * this router's in-flight count (0 included): right after a message that changed that set (or
 * the epoch) was applied, within `checkIntervalMs` of any of those counts changing, and at
 * least every `refreshIntervalMs` whatever happened, so a lost report never stalls a drain.
 * When the set empties, one last report with an empty list, then nothing. The counts are read
 * from the request path's own books (a stream counts until its last byte) on a timer, never
 * from the request path: it does no extra work per request.
 */
import { type Clock, type InFlightReport, type RoutingState, systemClock } from "@llmgw/router";
import { RouterServiceError } from "./errors.js";

/** Inputs of {@link startInFlightReporter}. */
export interface InFlightReporterOptions {
  readonly state: Pick<
    RoutingState,
    "epoch" | "version" | "drainingReplicaIds" | "onMembershipChange"
  >;
  /** Requests this router has in flight on a replica now. */
  readonly inFlight: (replicaId: string) => number;
  /** Hands a report on (to the feed, or to the control plane's RouterService); must not block. */
  readonly send: (report: InFlightReport) => void;
  /** How often counts are compared with the last report while a replica drains, ms. Default 100. */
  readonly checkIntervalMs?: number;
  /** Longest time between two reports while a replica drains, ms. Default 1 000. */
  readonly refreshIntervalMs?: number;
  /** Default {@link systemClock}. */
  readonly clock?: Clock;
}

/** A running reporter. */
export interface InFlightReporter {
  /** Stops reporting (no final report: a router going away stops counting with its stream). */
  close(): void;
}

/** Defaults of {@link InFlightReporterOptions}. */
export const IN_FLIGHT_REPORT_DEFAULTS = {
  checkIntervalMs: 100,
  refreshIntervalMs: 1_000,
} as const;

const sameIds = (a: readonly string[], b: readonly string[]): boolean =>
  a === b || (a.length === b.length && a.every((id, i) => id === b[i]));

/**
 * Starts reporting for `state` (at once when it already holds draining replicas, e.g. from
 * the state file).
 * @throws RouterServiceError `LLMGW_ROUTER_CONFIG_INVALID` for an interval outside 1–60 000 ms
 *   or a refresh shorter than the check.
 */
export function startInFlightReporter(options: InFlightReporterOptions): InFlightReporter {
  const { state, inFlight, send } = options;
  const checkMs = options.checkIntervalMs ?? IN_FLIGHT_REPORT_DEFAULTS.checkIntervalMs;
  const refreshMs = options.refreshIntervalMs ?? IN_FLIGHT_REPORT_DEFAULTS.refreshIntervalMs;
  for (const [name, value] of [
    ["checkIntervalMs", checkMs],
    ["refreshIntervalMs", refreshMs],
  ] as const) {
    if (!Number.isInteger(value) || value < 1 || value > 60_000) {
      throw new RouterServiceError(
        "LLMGW_ROUTER_CONFIG_INVALID",
        `in-flight reporter: ${name} must be a whole number of ms in 1–60000, got ${String(value)}`,
      );
    }
  }
  if (refreshMs < checkMs) {
    throw new RouterServiceError(
      "LLMGW_ROUTER_CONFIG_INVALID",
      `in-flight reporter: refreshIntervalMs (${refreshMs}) must be at least checkIntervalMs (${checkMs})`,
    );
  }
  const clock = options.clock ?? systemClock;

  /** What the last report said: the draining ids, their counts (same order), its epoch. */
  let reportedIds: readonly string[] = [];
  let reportedCounts: number[] = [];
  let reportedEpoch: string | undefined;
  let reportedAt = Number.NEGATIVE_INFINITY;
  let cancelCheck: (() => void) | undefined;
  let changePending = false;
  let closed = false;

  const report = (): void => {
    const epoch = state.epoch;
    if (epoch === undefined) return;
    const ids = state.drainingReplicaIds;
    const draining = ids.map((replicaId) => ({
      replicaId,
      inFlight: Math.max(0, inFlight(replicaId)),
    }));
    reportedIds = ids;
    reportedCounts = draining.map((d) => d.inFlight);
    reportedEpoch = epoch;
    reportedAt = clock.now();
    send({ epoch, stateVersion: state.version, draining });
  };

  const check = (): void => {
    cancelCheck = undefined;
    if (closed) return;
    const ids = state.drainingReplicaIds;
    if (ids.length === 0) return;
    let due = clock.now() - reportedAt >= refreshMs || !sameIds(ids, reportedIds);
    for (let i = 0; !due && i < ids.length; i++) {
      if (Math.max(0, inFlight(ids[i] as string)) !== reportedCounts[i]) due = true;
    }
    if (due) report();
    cancelCheck = clock.setTimer(check, checkMs);
  };

  const settle = (): void => {
    changePending = false;
    if (closed) return;
    const ids = state.drainingReplicaIds;
    if (sameIds(ids, reportedIds) && state.epoch === reportedEpoch) return;
    // Nothing held as draining, before or now: no report (an empty one only ends a drain).
    if (ids.length === 0 && reportedIds.length === 0) return;
    report();
    if (ids.length > 0) {
      cancelCheck ??= clock.setTimer(check, checkMs);
    } else {
      cancelCheck?.();
      cancelCheck = undefined;
    }
  };

  // Settled once the message is fully applied (and out of the feed's delivery loop).
  const onChange = (): void => {
    if (changePending) return;
    changePending = true;
    queueMicrotask(settle);
  };
  const unsubscribe = state.onMembershipChange(onChange);
  onChange();

  return {
    close() {
      closed = true;
      unsubscribe();
      cancelCheck?.();
      cancelCheck = undefined;
    },
  };
}
