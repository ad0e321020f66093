import type {
  InFlightReport,
  KeyGrant,
  RoutedModel,
  RoutedReplica,
  RoutingDelta,
  RoutingFeed,
  RoutingMessage,
  RoutingSnapshot,
} from "../routing-messages.js";
import type { BudgetStanding, UsageAnswer, UsageBatch } from "../usage-ledger.js";

/** A {@link RoutingFeed} driven by hand: what a test pushes is what subscribers hear. */
export interface ManualRoutingFeed extends RoutingFeed {
  /**
   * Delivers `message` to every subscriber, in subscription order, synchronously, and folds it
   * into what a later subscriber is replayed. Nothing is validated: a test may push a gap, an
   * old delta or a malformed message on purpose. A listener that throws does not stop delivery
   * to the others; the first error is rethrown once all have been called.
   */
  push(message: RoutingMessage): void;
  /**
   * What a new subscriber hears first: the latest snapshot with the deltas that follow it in
   * order (exactly version + 1, same epoch) and the load of the same epoch folded in; a delta
   * that does not follow is delivered but not folded. Undefined before any snapshot.
   */
  current(): RoutingSnapshot | undefined;
  /** Subscribers attached now. */
  readonly subscribers: number;
  /** Every {@link InFlightReport} a subscriber made, in order (what the control plane hears). */
  readonly reports: InFlightReport[];
  reportInFlight(report: InFlightReport): void;
  /** Resolves once at least `count` subscribers are attached (at once when they are). */
  waitForSubscribers(count: number): Promise<void>;
  /**
   * Every usage batch with records a subscriber sent, each id once: one sent again is answered
   * as a duplicate and not kept twice, as the control plane does.
   */
  readonly usageBatches: UsageBatch[];
  /** What {@link reportUsage} answers with (default none). */
  usageStandings: BudgetStanding[];
  /** While true, {@link reportUsage} fails as an unreachable control plane would. */
  refuseUsage: boolean;
  reportUsage(routerId: string, batch: UsageBatch): Promise<UsageAnswer>;
}

const byKey = <T>(items: readonly T[], key: (item: T) => string): Map<string, T> =>
  new Map(items.map((item) => [key(item), item]));

/** `delta` applied to `held`, keys and load kept by replica id the way a router keeps them. */
const fold = (held: RoutingSnapshot, delta: RoutingDelta): RoutingSnapshot => {
  const models = byKey<RoutedModel>(held.models, (m) => m.name);
  for (const name of delta.removedModels) models.delete(name);
  for (const m of delta.upsertedModels) models.set(m.name, m);
  const replicas = byKey<RoutedReplica>(held.replicas, (r) => r.id);
  for (const id of delta.removedReplicas) replicas.delete(id);
  for (const r of delta.upsertedReplicas) {
    const previous = replicas.get(r.id);
    const apiKey = r.apiKey ?? previous?.apiKey;
    const load =
      r.load === undefined && previous?.load !== undefined
        ? { load: previous.load, loadReportedAtMs: previous.loadReportedAtMs }
        : {};
    replicas.set(r.id, { ...r, ...(apiKey === undefined ? {} : { apiKey }), ...load });
  }
  const keys = byKey<KeyGrant>(held.keys, (k) => k.id);
  for (const id of delta.removedKeys) keys.delete(id);
  for (const k of delta.upsertedKeys) keys.set(k.id, k);
  return {
    kind: "snapshot",
    epoch: held.epoch,
    version: delta.version,
    models: [...models.values()],
    replicas: [...replicas.values()],
    keys: [...keys.values()],
    routers: delta.routers ?? held.routers,
    sentAtMs: delta.sentAtMs,
  };
};

/**
 * Creates a {@link ManualRoutingFeed}: the control plane's publisher as tests and benchmarks
 * need it, with no control plane. A new subscriber is replayed {@link ManualRoutingFeed.current}
 * synchronously inside `subscribe`, then hears every later push.
 */
export function createManualRoutingFeed(): ManualRoutingFeed {
  const listeners = new Set<(message: RoutingMessage) => void>();
  const waiters = new Set<{ count: number; resolve: () => void }>();
  let held: RoutingSnapshot | undefined;
  /** When `held.sentAtMs` was last set (local clock), to age it on replay. */
  let heldAtMs = 0;
  const reports: InFlightReport[] = [];
  const usageBatches: UsageBatch[] = [];
  const usageBatchIds = new Set<string>();

  const deliver = (
    targets: Iterable<(message: RoutingMessage) => void>,
    message: RoutingMessage,
  ) => {
    let failure: { error: unknown } | undefined;
    for (const listener of targets) {
      try {
        listener(message);
      } catch (error) {
        failure ??= { error };
      }
    }
    if (failure !== undefined) throw failure.error;
  };

  return {
    subscribe(listener) {
      listeners.add(listener);
      for (const waiter of [...waiters]) {
        if (listeners.size >= waiter.count) {
          waiters.delete(waiter);
          waiter.resolve();
        }
      }
      // Replayed later than it was sent: aged by the time held, as the control plane stamps
      // each snapshot when it sends it (a router learns its clock offset from `sentAtMs`).
      if (held !== undefined)
        deliver([listener], { ...held, sentAtMs: held.sentAtMs + (Date.now() - heldAtMs) });
      return () => {
        listeners.delete(listener);
      };
    },
    push(message) {
      if (message.kind === "snapshot") {
        held = message;
        heldAtMs = Date.now();
      } else if (held !== undefined && message.epoch === held.epoch) {
        if (message.kind === "delta" && message.version === held.version + 1) {
          held = fold(held, message);
          heldAtMs = Date.now();
        } else if (message.kind === "load") {
          const samples = new Map(message.samples.map((s) => [s.replicaId, s]));
          held = {
            ...held,
            replicas: held.replicas.map((r) => {
              const s = samples.get(r.id);
              return s === undefined ? r : { ...r, load: s.load, loadReportedAtMs: s.reportedAtMs };
            }),
          };
        }
      }
      deliver([...listeners], message);
    },
    current: () => held,
    reports,
    reportInFlight(report) {
      reports.push(report);
    },
    get subscribers() {
      return listeners.size;
    },
    usageBatches,
    usageStandings: [],
    refuseUsage: false,
    async reportUsage(_routerId, batch) {
      if (this.refuseUsage) throw new Error("control plane unreachable (refuseUsage)");
      const duplicate = usageBatchIds.has(batch.batchId);
      if (!duplicate && batch.records.length > 0) {
        usageBatchIds.add(batch.batchId);
        usageBatches.push(batch);
      }
      return { duplicate, standings: this.usageStandings, asOfMs: Date.now() };
    },
    waitForSubscribers(count) {
      if (listeners.size >= count) return Promise.resolve();
      return new Promise((resolve) => {
        waiters.add({ count, resolve });
      });
    },
  };
}
