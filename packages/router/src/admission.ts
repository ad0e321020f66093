/**
 * Admission per deployment: up to `capacity` requests (the sum of its routable replicas'
 * capacities) in flight; beyond that a bounded queue with a deadline, served round-robin across
 * API keys so one busy key cannot starve the others. A full queue or an expired wait is an
 * explicit rejection (429 + Retry-After upstream of here), never a silent drop.
 */
import { type Clock, systemClock } from "./clock.js";
import { checkRange } from "./errors.js";

/** Options of {@link createAdmissionController}. */
export interface AdmissionOptions {
  /** Most requests queued per deployment (default 256; 0 disables queueing). */
  readonly maxQueueLength?: number;
  /** Longest wait in the queue in ms (default 30 000). */
  readonly queueTimeoutMs?: number;
  readonly clock?: Clock;
}

/** Why a request was not admitted. */
export type AdmissionRejection = "queue_full" | "queue_timeout" | "aborted";

/** Outcome of {@link AdmissionController.admit}. */
export type AdmissionOutcome =
  | {
      readonly admitted: true;
      /** Time spent queued in ms (0 when admitted at once). */
      readonly waitedMs: number;
      /** Frees the slot; idempotent. */
      readonly release: () => void;
    }
  | {
      readonly admitted: false;
      readonly reason: AdmissionRejection;
      /** Seconds a client should wait before retrying (≥ 1). */
      readonly retryAfterSeconds: number;
    };

/**
 * The part of an `AbortSignal` that {@link AdmissionController.admit} uses. A real
 * `AbortSignal` fits; so does a lighter per-request object (an `AbortController` + `EventTarget`
 * per request costs several µs of CPU on the router's hot path).
 */
export interface AbortSignalLike {
  readonly aborted: boolean;
  addEventListener(type: "abort", listener: () => void, options?: { once?: boolean }): void;
  removeEventListener(type: "abort", listener: () => void): void;
}

/** Per-deployment admission state. */
export interface AdmissionController {
  /**
   * Admits a request of `keyId` to `deployment` whose current capacity is `capacity`. Returns
   * synchronously when admitted or refused at once, a promise when queued. An `abortSignal`
   * that fires while queued resolves with `aborted`.
   */
  admit(
    deployment: string,
    keyId: string,
    capacity: number,
    abortSignal?: AbortSignalLike,
  ): AdmissionOutcome | Promise<AdmissionOutcome>;
  /** Tells the controller a deployment's capacity changed (e.g. a replica became ready). */
  setCapacity(deployment: string, capacity: number): void;
  /** Requests in flight and queued for `deployment`. */
  stats(deployment: string): { readonly inFlight: number; readonly queued: number };
}

interface Waiter {
  readonly enqueuedAt: number;
  readonly resolve: (outcome: AdmissionOutcome) => void;
  cancelTimer: () => void;
  detach: () => void;
}

interface DeploymentState {
  inFlight: number;
  capacity: number;
  queued: number;
  /** keyId → FIFO; Map order is the round-robin order (a served key moves to the back). */
  readonly queues: Map<string, Waiter[]>;
}

/** Creates an {@link AdmissionController}. */
export function createAdmissionController(options: AdmissionOptions = {}): AdmissionController {
  const maxQueue = checkRange("maxQueueLength", options.maxQueueLength ?? 256, 0, 1e6);
  const timeoutMs = checkRange("queueTimeoutMs", options.queueTimeoutMs ?? 30_000, 1, 3_600_000);
  const clock = options.clock ?? systemClock;
  const states = new Map<string, DeploymentState>();
  const stateOf = (deployment: string): DeploymentState => {
    let s = states.get(deployment);
    if (s === undefined) {
      s = { inFlight: 0, capacity: 0, queued: 0, queues: new Map() };
      states.set(deployment, s);
    }
    return s;
  };

  const grant = (s: DeploymentState, waitedMs: number): AdmissionOutcome => {
    s.inFlight += 1;
    let released = false;
    return {
      admitted: true,
      waitedMs,
      release: () => {
        if (released) return;
        released = true;
        s.inFlight -= 1;
        pump(s);
      },
    };
  };

  const pump = (s: DeploymentState): void => {
    while (s.queued > 0 && s.inFlight < s.capacity) {
      const [keyId, queue] = s.queues.entries().next().value as [string, Waiter[]];
      const waiter = queue.shift() as Waiter;
      s.queues.delete(keyId);
      if (queue.length > 0) s.queues.set(keyId, queue);
      s.queued -= 1;
      waiter.cancelTimer();
      waiter.detach();
      waiter.resolve(grant(s, clock.now() - waiter.enqueuedAt));
    }
  };

  const remove = (s: DeploymentState, keyId: string, waiter: Waiter): boolean => {
    const queue = s.queues.get(keyId);
    const at = queue?.indexOf(waiter) ?? -1;
    if (queue === undefined || at < 0) return false;
    queue.splice(at, 1);
    if (queue.length === 0) s.queues.delete(keyId);
    s.queued -= 1;
    return true;
  };

  return {
    admit(deployment, keyId, capacity, abortSignal) {
      const s = stateOf(deployment);
      s.capacity = capacity;
      if (s.queued === 0 && s.inFlight < capacity) return grant(s, 0);
      if (s.queued >= maxQueue) {
        return { admitted: false, reason: "queue_full", retryAfterSeconds: 1 };
      }
      return new Promise<AdmissionOutcome>((resolve) => {
        const waiter: Waiter = {
          enqueuedAt: clock.now(),
          resolve,
          cancelTimer: () => {},
          detach: () => {},
        };
        waiter.cancelTimer = clock.setTimer(() => {
          if (remove(s, keyId, waiter)) {
            waiter.detach();
            resolve({
              admitted: false,
              reason: "queue_timeout",
              retryAfterSeconds: Math.max(1, Math.ceil(timeoutMs / 1000)),
            });
          }
        }, timeoutMs);
        if (abortSignal !== undefined) {
          const onAbort = (): void => {
            if (remove(s, keyId, waiter)) {
              waiter.cancelTimer();
              resolve({ admitted: false, reason: "aborted", retryAfterSeconds: 1 });
            }
          };
          abortSignal.addEventListener("abort", onAbort, { once: true });
          waiter.detach = () => abortSignal.removeEventListener("abort", onAbort);
        }
        let queue = s.queues.get(keyId);
        if (queue === undefined) {
          queue = [];
          s.queues.set(keyId, queue);
        }
        queue.push(waiter);
        s.queued += 1;
      });
    },
    setCapacity(deployment, capacity) {
      const s = stateOf(deployment);
      s.capacity = capacity;
      pump(s);
    },
    stats(deployment) {
      const s = states.get(deployment);
      return { inFlight: s?.inFlight ?? 0, queued: s?.queued ?? 0 };
    },
  };
}
