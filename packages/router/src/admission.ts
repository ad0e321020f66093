/**
 * Admission per deployment: up to `capacity` requests (the sum of its routable replicas'
 * capacities) in flight; beyond that a bounded queue with a deadline. A full queue or an
 * expired wait is an explicit rejection (429 + Retry-After upstream of here), never a silent
 * drop.
 *
 * The queue serves by priority class, then by weighted fair share:
 * - every queued `critical` request goes before any `standard` one, and those before `batch`;
 * - within a class, tenants (a key without a tenant is a tenant of its own) share by weight,
 *   counted in tokens, not requests: self-clocked weighted fair queueing. Each request gets a
 *   virtual finish time `max(class virtual time, its tenant's last finish) + tokens / weight`,
 *   the request with the least is served next and the class's virtual time moves to it. A
 *   tenant of weight 3 is served three times the tokens of one of weight 1 while both wait,
 *   and a tenant of big requests waits longer per request than one of small requests. A tenant
 *   that stops waiting banks no credit: its next request starts from the class's virtual time;
 * - a full queue makes room for a `critical` or `standard` request by shedding the newest
 *   queued `batch` request (answered `shed`); a `batch` request is refused (`queue_full`);
 * - `critical` requests may go past the capacity by `criticalHeadroom` (as much again by
 *   default): the others fill the capacity, and a critical request arriving then starts at
 *   once instead of waiting for a slot to free. The capacity is the router's target per replica
 *   (`maxConcurrencyPerReplica`), below an engine's own batch limit (vLLM `--max-num-seqs`,
 *   256 by default), so the engine takes the extra requests into its running batch;
 * - while `critical` requests are arriving (one admitted in the last `criticalWindowMs`), a
 *   request of another class starts only while fewer than `replicas − criticalPrefillReserve`
 *   (by default a quarter of the replicas, at least 1)
 *   requests are prefilling (admitted, first byte not yet come: {@link AdmissionGrant.prefilled};
 *   critical ones count too, as they hold their replica's next step as much), so a critical
 *   request finds a replica with no prefill queued and the picker's pending-prefill term sends
 *   it there. An engine step that carries a prefill is several decode steps long (a 200-token
 *   prompt is ~20 ms on top of a ~14 ms step on an 8B model), and a request arriving mid-step
 *   waits for the step to end and then shares the next one with whatever else arrived: with
 *   headroom alone critical requests waited behind batch prefills (TTFT p99 2.5× the no-burst
 *   baseline in bench/tenants); not counting the critical ones still left them colliding with
 *   each other on the one replica kept free (1.4×). What the reserve cannot see, a batch
 *   request sent to the critical request's replica right after it, `CriticalPrefills` holds.
 *
 * The uncontended path (nothing queued, a slot free) looks at none of this.
 */

import { type Clock, systemClock } from "./clock.js";
import { checkRange } from "./errors.js";
import type { PriorityClass } from "./routing-messages.js";

/** Options of {@link createAdmissionController}. */
export interface AdmissionOptions {
  /** Most requests queued per deployment (default 256; 0 disables queueing). */
  readonly maxQueueLength?: number;
  /** Longest wait in the queue in ms (default 30 000). */
  readonly queueTimeoutMs?: number;
  /**
   * How far `critical` requests may go past a deployment's capacity, as a fraction of it
   * (rounded up; default 1: as much again; 0 turns it off).
   */
  readonly criticalHeadroom?: number;
  /**
   * Replicas kept free of other classes' prefills while critical requests arrive (default: a
   * quarter of the deployment's replicas, at least 1; 0 turns it off). Needs at least one more
   * replica than this to apply.
   *
   * Why a quarter (bench/tenants, 35% critical load, batch bursting 10× the capacity): one
   * replica of 4 kept free held the fleet's throughput (1.014×) and left critical's TTFT p99 at
   * 1.27× its no-burst baseline; two of 4 met the p99 (1.14×) and cost 3% of the throughput; on
   * 8 replicas, one left the p99 at 1.10× and two met it (1.06×) at no throughput cost (1.018×).
   * The prefills critical requests need room for grow with the fleet that carries them.
   */
  readonly criticalPrefillReserve?: number;
  /** How long after a critical request the reserve stays, ms (default 10 000). */
  readonly criticalWindowMs?: number;
  readonly clock?: Clock;
}

/** The default of {@link AdmissionOptions.criticalPrefillReserve} for `replicas` replicas. */
export const defaultCriticalPrefillReserve = (replicas: number): number =>
  Math.max(1, Math.floor(replicas / 4));

/**
 * Why a request was not admitted; `shed`: it was queued as `batch` and made room for a
 * request of a higher class.
 */
export type AdmissionRejection = "queue_full" | "queue_timeout" | "aborted" | "shed";

/** An admitted request's slot. */
export interface AdmissionGrant {
  readonly admitted: true;
  /** Time spent queued in ms (0 when admitted at once). */
  readonly waitedMs: number;
  /** The request's first byte came: its prefill no longer counts (idempotent; `release` implies it). */
  readonly prefilled: () => void;
  /** Frees the slot; idempotent. */
  readonly release: () => void;
}

/** Outcome of {@link AdmissionController.admit}. */
export type AdmissionOutcome =
  | AdmissionGrant
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

/**
 * Who a request queues as: an `ApiKeyInfo` fits. Its tenant (else the key itself) is the
 * unit of fair share; `priority` its class (absent: `standard`).
 */
export interface AdmissionKey {
  readonly id: string;
  readonly priority?: PriorityClass;
  /** Weight 1–1000 (below 1 reads as 1). */
  readonly tenant?: { readonly name: string; readonly weight: number };
}

/** Per-deployment admission state. */
export interface AdmissionController {
  /**
   * Admits a request of `key` reserving `tokens` (its estimate, for fair share) to
   * `deployment` whose current capacity is `capacity` over `replicas` routable replicas.
   * Returns synchronously when admitted or refused at once, a promise when queued. An
   * `abortSignal` that fires while queued resolves with `aborted`.
   */
  admit(
    deployment: string,
    key: AdmissionKey,
    tokens: number,
    capacity: number,
    abortSignal?: AbortSignalLike,
    replicas?: number,
  ): AdmissionOutcome | Promise<AdmissionOutcome>;
  /** Tells the controller a deployment's capacity changed (e.g. a replica became ready). */
  setCapacity(deployment: string, capacity: number): void;
  /** Requests in flight and queued for `deployment`. */
  stats(deployment: string): { readonly inFlight: number; readonly queued: number };
}

interface Waiter {
  readonly enqueuedAt: number;
  readonly resolve: (outcome: AdmissionOutcome) => void;
  readonly flow: Flow;
  readonly cls: ClassQueue;
  /** Virtual finish time: served in increasing order within the class. */
  readonly finish: number;
  /** Arrival order within the deployment: the newest batch request is shed first. */
  readonly seq: number;
  cancelTimer: () => void;
  detach: () => void;
}

/** One tenant's (or tenantless key's) queued requests in one class, oldest first. */
interface Flow {
  readonly id: string;
  readonly waiters: Waiter[];
  /** Virtual finish time of its newest request. */
  lastFinish: number;
}

interface ClassQueue {
  queued: number;
  /** Finish time of the last request served. */
  vtime: number;
  /** Flows with requests queued. */
  readonly flows: Map<string, Flow>;
}

interface DeploymentState {
  inFlight: number;
  capacity: number;
  replicas: number;
  /** Admitted requests before their first byte (critical ones included: they hold the replica too). */
  prefilling: number;
  /** When a critical request was last admitted or queued (-Infinity: never). */
  criticalAt: number;
  queued: number;
  seq: number;
  /** critical, standard, batch. */
  readonly classes: readonly [ClassQueue, ClassQueue, ClassQueue];
}

const CLASS_INDEX: Readonly<Record<PriorityClass, 0 | 1 | 2>> = {
  critical: 0,
  standard: 1,
  batch: 2,
};
const BATCH = 2;

const classQueue = (): ClassQueue => ({ queued: 0, vtime: 0, flows: new Map() });

/** The flow of `cls` with the least head finish time (the first such in map order). */
function nextFlow(cls: ClassQueue): Flow | undefined {
  let best: Flow | undefined;
  let bestFinish = Number.POSITIVE_INFINITY;
  for (const flow of cls.flows.values()) {
    const head = flow.waiters[0] as Waiter;
    if (head.finish < bestFinish) {
      best = flow;
      bestFinish = head.finish;
    }
  }
  return best;
}

/** The newest waiter queued in `cls`. */
function newestWaiter(cls: ClassQueue): Waiter | undefined {
  let newest: Waiter | undefined;
  for (const flow of cls.flows.values()) {
    const tail = flow.waiters[flow.waiters.length - 1] as Waiter;
    if (newest === undefined || tail.seq > newest.seq) newest = tail;
  }
  return newest;
}

/** Creates an {@link AdmissionController}. */
export function createAdmissionController(options: AdmissionOptions = {}): AdmissionController {
  const maxQueue = checkRange("maxQueueLength", options.maxQueueLength ?? 256, 0, 1e6);
  const timeoutMs = checkRange("queueTimeoutMs", options.queueTimeoutMs ?? 30_000, 1, 3_600_000);
  const headroom = checkRange("criticalHeadroom", options.criticalHeadroom ?? 1, 0, 4);
  /** Most requests in flight before one of class `classIndex` waits. */
  const ceiling = (s: DeploymentState, classIndex: number): number =>
    classIndex === 0 ? s.capacity + Math.ceil(s.capacity * headroom) : s.capacity;
  const fixedReserve =
    options.criticalPrefillReserve === undefined
      ? undefined
      : checkRange("criticalPrefillReserve", options.criticalPrefillReserve, 0, 64);
  const windowMs = checkRange("criticalWindowMs", options.criticalWindowMs ?? 10_000, 0, 3_600_000);
  const clock = options.clock ?? systemClock;
  /** True when a request below critical must wait for a prefill to end (see the reserve above). */
  const reserved = (s: DeploymentState): boolean => {
    const reserve = fixedReserve ?? defaultCriticalPrefillReserve(s.replicas);
    return (
      reserve > 0 &&
      s.replicas > reserve &&
      s.prefilling >= s.replicas - reserve &&
      clock.now() - s.criticalAt < windowMs
    );
  };
  const states = new Map<string, DeploymentState>();
  const stateOf = (deployment: string): DeploymentState => {
    let s = states.get(deployment);
    if (s === undefined) {
      s = {
        inFlight: 0,
        capacity: 0,
        replicas: 1,
        prefilling: 0,
        criticalAt: Number.NEGATIVE_INFINITY,
        queued: 0,
        seq: 0,
        classes: [classQueue(), classQueue(), classQueue()],
      };
      states.set(deployment, s);
    }
    return s;
  };

  const grant = (s: DeploymentState, waitedMs: number): AdmissionGrant => {
    s.inFlight += 1;
    let released = false;
    let prefilling = true;
    s.prefilling += 1;
    const prefilled = (): void => {
      if (!prefilling) return;
      prefilling = false;
      s.prefilling -= 1;
      if (!released) pump(s);
    };
    return {
      admitted: true,
      waitedMs,
      prefilled,
      release: () => {
        if (released) return;
        released = true;
        prefilled();
        s.inFlight -= 1;
        pump(s);
      },
    };
  };

  /** Takes `waiter` out of its queue; false when it was no longer queued. */
  const remove = (s: DeploymentState, waiter: Waiter): boolean => {
    const { flow, cls } = waiter;
    const at = flow.waiters.indexOf(waiter);
    if (at < 0) return false;
    flow.waiters.splice(at, 1);
    if (flow.waiters.length === 0) cls.flows.delete(flow.id);
    cls.queued -= 1;
    s.queued -= 1;
    return true;
  };

  const pump = (s: DeploymentState): void => {
    while (s.queued > 0) {
      const classIndex = s.classes[0].queued > 0 ? 0 : s.classes[1].queued > 0 ? 1 : 2;
      if (s.inFlight >= ceiling(s, classIndex) || (classIndex > 0 && reserved(s))) return;
      const cls = s.classes[classIndex];
      const flow = nextFlow(cls) as Flow;
      const waiter = flow.waiters[0] as Waiter;
      remove(s, waiter);
      cls.vtime = waiter.finish;
      waiter.cancelTimer();
      waiter.detach();
      waiter.resolve(grant(s, clock.now() - waiter.enqueuedAt));
    }
  };

  /** Sheds the newest queued batch request; false when none is queued. */
  const shed = (s: DeploymentState): boolean => {
    const victim = newestWaiter(s.classes[BATCH]);
    if (victim === undefined || !remove(s, victim)) return false;
    victim.cancelTimer();
    victim.detach();
    victim.resolve({ admitted: false, reason: "shed", retryAfterSeconds: 1 });
    return true;
  };

  return {
    admit(deployment, key, tokens, capacity, abortSignal, replicas = 1) {
      const s = stateOf(deployment);
      s.capacity = capacity;
      s.replicas = replicas;
      const classIndex = key.priority === undefined ? 1 : CLASS_INDEX[key.priority];
      if (classIndex === 0) {
        s.criticalAt = clock.now();
        // Critical goes first whatever else waits: it only waits behind critical.
        if (s.classes[0].queued === 0 && s.inFlight < ceiling(s, 0)) return grant(s, 0);
      } else {
        // Requests held by the prefill reserve (or a capacity that grew) start first.
        if (s.queued > 0) pump(s);
        if (s.queued === 0 && s.inFlight < capacity && !reserved(s)) return grant(s, 0);
      }
      if (s.queued >= maxQueue && (classIndex === BATCH || !shed(s))) {
        return { admitted: false, reason: "queue_full", retryAfterSeconds: 1 };
      }
      const cls = s.classes[classIndex];
      const tenant = key.tenant;
      // Prefixed: a tenant and a key may share a name.
      const flowId = tenant === undefined ? `k:${key.id}` : `t:${tenant.name}`;
      let flow = cls.flows.get(flowId);
      if (flow === undefined) {
        flow = { id: flowId, waiters: [], lastFinish: 0 };
        cls.flows.set(flowId, flow);
      }
      const weight = tenant === undefined ? 1 : Math.max(1, tenant.weight);
      const finish = Math.max(cls.vtime, flow.lastFinish) + Math.max(1, tokens) / weight;
      flow.lastFinish = finish;
      return new Promise<AdmissionOutcome>((resolve) => {
        const waiter: Waiter = {
          enqueuedAt: clock.now(),
          resolve,
          flow: flow as Flow,
          cls,
          finish,
          seq: s.seq++,
          cancelTimer: () => {},
          detach: () => {},
        };
        waiter.cancelTimer = clock.setTimer(() => {
          if (remove(s, waiter)) {
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
            if (remove(s, waiter)) {
              waiter.cancelTimer();
              resolve({ admitted: false, reason: "aborted", retryAfterSeconds: 1 });
            }
          };
          abortSignal.addEventListener("abort", onAbort, { once: true });
          waiter.detach = () => abortSignal.removeEventListener("abort", onAbort);
        }
        (flow as Flow).waiters.push(waiter);
        cls.queued += 1;
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
