/**
 * Critical requests whose prefill is still queued at each replica, and the other requests that
 * wait to be sent there until it ends.
 *
 * Admission keeps a replica free of prefills for a critical request (`admission.ts`,
 * `criticalPrefillReserve`) and the picker sends it there; but a slot freed on that same
 * replica a moment later would send the next batch request to it too, and an engine plans its
 * next step with everything that arrived during the current one: the critical request's first
 * step then carries the batch prefill as well (bench/tenants: 1 critical request in 20 under a
 * burst, ~20 ms each). So a request of another class picked for a replica with a critical
 * prefill queued waits for that prefill's first byte before it is sent, or `maxWaitMs` at most
 * (a critical prompt may be long; a hung one must not hold the replica).
 */
import type { Clock } from "./clock.js";

/** Per-replica count of queued critical prefills, with waiters for their end. */
export class CriticalPrefills {
  readonly #clock: Clock;
  readonly #maxWaitMs: number;
  readonly #pending = new Map<string, number>();
  readonly #waiters = new Map<string, (() => void)[]>();

  constructor(clock: Clock, maxWaitMs: number) {
    this.#clock = clock;
    this.#maxWaitMs = maxWaitMs;
  }

  /** A critical request was sent to `replicaId` and its first byte has not come yet. */
  begin(replicaId: string): void {
    this.#pending.set(replicaId, (this.#pending.get(replicaId) ?? 0) + 1);
  }

  /** Its first byte came (or it ended without one). */
  end(replicaId: string): void {
    const left = (this.#pending.get(replicaId) ?? 0) - 1;
    if (left > 0) {
      this.#pending.set(replicaId, left);
      return;
    }
    this.#pending.delete(replicaId);
    const waiters = this.#waiters.get(replicaId);
    if (waiters === undefined) return;
    this.#waiters.delete(replicaId);
    for (const wake of waiters) wake();
  }

  /** Critical prefills queued at `replicaId`. */
  pending(replicaId: string): number {
    return this.#pending.get(replicaId) ?? 0;
  }

  /**
   * Runs `then` at once when no critical prefill is queued at `replicaId`, else when the last
   * one ends or after `maxWaitMs`, whichever is first; exactly once.
   */
  after(replicaId: string, then: () => void): void {
    if (this.pending(replicaId) === 0) {
      then();
      return;
    }
    let done = false;
    const once = (): void => {
      if (done) return;
      done = true;
      cancel();
      then();
    };
    const cancel = this.#clock.setTimer(() => {
      const list = this.#waiters.get(replicaId);
      const at = list?.indexOf(once) ?? -1;
      if (list !== undefined && at >= 0) {
        list.splice(at, 1);
        if (list.length === 0) this.#waiters.delete(replicaId);
      }
      once();
    }, this.#maxWaitMs);
    let list = this.#waiters.get(replicaId);
    if (list === undefined) {
      list = [];
      this.#waiters.set(replicaId, list);
    }
    list.push(once);
  }
}
