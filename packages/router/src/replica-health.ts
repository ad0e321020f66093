/**
 * Per-replica health as the router observes it: a circuit breaker (consecutive failures → open;
 * after a cooldown one half-open probe; its success closes the circuit, its failure re-opens
 * it) plus EWMAs of the error rate and of the latency to the first response byte, which feed
 * scoring.
 */
import { type Clock, systemClock } from "./clock.js";
import { checkRange } from "./errors.js";

/** Circuit state of one replica. */
export type CircuitState = "closed" | "open" | "half-open";

/** Options of {@link createReplicaHealth}. */
export interface ReplicaHealthOptions {
  /** Consecutive failures that open the circuit (default 3). */
  readonly failureThreshold?: number;
  /** Time an open circuit waits before a probe, in ms (default 5 000). */
  readonly cooldownMs?: number;
  /** EWMA weight of each new observation (default 0.2). */
  readonly ewmaAlpha?: number;
  readonly clock?: Clock;
  /** Called on every circuit transition (log it, export it). */
  readonly onCircuitChange?: (replicaId: string, from: CircuitState, to: CircuitState) => void;
}

/** Health bookkeeping for all replicas. */
export interface ReplicaHealth {
  /** True when the replica may get a request now (closed, or open past cooldown with no probe out). */
  isRoutable(replicaId: string): boolean;
  /** Call when a request is sent; an open circuit past cooldown turns half-open (this is the probe). */
  onDispatch(replicaId: string): void;
  onSuccess(replicaId: string, firstByteMs: number): void;
  onFailure(replicaId: string): void;
  /** A probe that ended without a verdict (e.g. the client left) frees the probe slot. */
  onAbandon(replicaId: string): void;
  state(replicaId: string): CircuitState;
  errorRate(replicaId: string): number;
  latencyMs(replicaId: string): number | undefined;
  /** Drops a replica's state (removed from the table). */
  forget(replicaId: string): void;
}

interface Entry {
  state: CircuitState;
  failures: number;
  openedAt: number;
  probing: boolean;
  errorRate: number;
  latencyMs: number | undefined;
}

/** Creates a {@link ReplicaHealth}. */
export function createReplicaHealth(options: ReplicaHealthOptions = {}): ReplicaHealth {
  const threshold = checkRange("failureThreshold", options.failureThreshold ?? 3, 1, 1000);
  const cooldownMs = checkRange("cooldownMs", options.cooldownMs ?? 5000, 0, 3_600_000);
  const alpha = checkRange("ewmaAlpha", options.ewmaAlpha ?? 0.2, 0.001, 1);
  const clock = options.clock ?? systemClock;
  const entries = new Map<string, Entry>();
  const entry = (id: string): Entry => {
    let e = entries.get(id);
    if (e === undefined) {
      e = {
        state: "closed",
        failures: 0,
        openedAt: 0,
        probing: false,
        errorRate: 0,
        latencyMs: undefined,
      };
      entries.set(id, e);
    }
    return e;
  };
  const move = (id: string, e: Entry, to: CircuitState): void => {
    if (e.state === to) return;
    const from = e.state;
    e.state = to;
    options.onCircuitChange?.(id, from, to);
  };
  return {
    isRoutable(id) {
      const e = entries.get(id);
      if (e === undefined || e.state === "closed") return true;
      if (e.probing) return false;
      return clock.now() - e.openedAt >= cooldownMs;
    },
    onDispatch(id) {
      const e = entries.get(id);
      if (e === undefined || e.state === "closed") return;
      e.probing = true;
      move(id, e, "half-open");
    },
    onSuccess(id, firstByteMs) {
      const e = entry(id);
      e.failures = 0;
      e.probing = false;
      e.errorRate *= 1 - alpha;
      e.latencyMs =
        e.latencyMs === undefined ? firstByteMs : e.latencyMs + alpha * (firstByteMs - e.latencyMs);
      move(id, e, "closed");
    },
    onFailure(id) {
      const e = entry(id);
      e.failures += 1;
      e.errorRate = e.errorRate * (1 - alpha) + alpha;
      if (e.state === "half-open" || e.failures >= threshold) {
        e.probing = false;
        e.openedAt = clock.now();
        move(id, e, "open");
      }
    },
    onAbandon(id) {
      const e = entries.get(id);
      if (e !== undefined) e.probing = false;
    },
    state: (id) => entries.get(id)?.state ?? "closed",
    errorRate: (id) => entries.get(id)?.errorRate ?? 0,
    latencyMs: (id) => entries.get(id)?.latencyMs,
    forget(id) {
      entries.delete(id);
    },
  };
}
