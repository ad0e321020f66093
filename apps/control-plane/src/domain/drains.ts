/**
 * When a draining replica has nothing in flight. Routers report, for every replica they hold
 * as draining, the requests they still have on it (`RouterService.ReportInFlight`; the
 * in-process router calls in directly). A replica is drained once:
 *
 * - at least {@link DRAIN_SETTLE_MS} passed since it began draining: every router has had
 *   the time to hear of it and a request picked just before has reached the engine;
 * - every router connected now has reported since it began draining, holds it as draining,
 *   and has nothing in flight on it (a stream counts until its last byte);
 * - its engine, when it reported load, has nothing running or waiting (a router that lost its
 *   control plane cannot report, but its requests still show there; so for a router that
 *   never reported at all, {@link SILENT_ROUTER_MS} into the drain, the engine decides).
 *
 * Memory only: a control plane that starts asks routers again (they report every second while
 * they hold draining replicas).
 */
import type { InFlightReport } from "@llmgw/router";

/** Minimum time a replica drains, ms (see the module comment). */
export const DRAIN_SETTLE_MS = 1_000;

/**
 * A connected router that never reported at all this long into a drain is taken for one
 * that cannot (a release before reports): the drain goes by its engine's load for it rather
 * than waiting out the drain timeout. A router that did report once is waited for.
 */
export const SILENT_ROUTER_MS = 5_000;

interface RouterReport {
  readonly atMs: number;
  readonly inFlight: ReadonlyMap<string, number>;
}

/** Options of {@link DrainTracker}. */
export interface DrainTrackerOptions {
  readonly now: () => number;
  /** Ids of the routers connected now (the in-process one included when it runs). */
  readonly connectedRouters: () => readonly string[];
  /** Default {@link DRAIN_SETTLE_MS}. */
  readonly settleMs?: number;
}

export class DrainTracker {
  readonly #o: DrainTrackerOptions;
  readonly #reports = new Map<string, RouterReport>();

  constructor(options: DrainTrackerOptions) {
    this.#o = options;
  }

  /** Takes a router's report; its previous one is replaced. */
  report(routerId: string, report: InFlightReport): void {
    const inFlight = new Map<string, number>();
    // Bounded where it comes in: `REPORT_IN_FLIGHT_LIMITS` of the RPC, the routing state's
    // own limits in process.
    for (const r of report.draining) inFlight.set(r.replicaId, r.inFlight);
    this.#reports.set(routerId, { atMs: this.#o.now(), inFlight });
  }

  /**
   * Requests the connected routers last reported in flight on `replicaId`, summed; undefined
   * when none of them reported it.
   */
  inFlight(replicaId: string): number | undefined {
    let sum: number | undefined;
    for (const id of this.#o.connectedRouters()) {
      const n = this.#reports.get(id)?.inFlight.get(replicaId);
      if (n !== undefined) sum = (sum ?? 0) + n;
    }
    return sum;
  }

  /**
   * Whether `replicaId`, draining since `sinceMs`, has nothing in flight (see the module
   * comment). `engineBusy`: its engine's last load had running or waiting requests;
   * undefined when it reported none.
   */
  drained(replicaId: string, sinceMs: number, engineBusy: boolean | undefined): boolean {
    const now = this.#o.now();
    if (now - sinceMs < (this.#o.settleMs ?? DRAIN_SETTLE_MS)) return false;
    if (engineBusy === true) return false;
    for (const id of this.#o.connectedRouters()) {
      const report = this.#reports.get(id);
      if (report === undefined) {
        if (now - sinceMs < SILENT_ROUTER_MS) return false;
        continue;
      }
      if (report.atMs < sinceMs) return false;
      const n = report.inFlight.get(replicaId);
      if (n === undefined || n > 0) return false;
    }
    return true;
  }

  /** Drops the reports of routers no longer connected (called now and then). */
  prune(): void {
    if (this.#reports.size === 0) return;
    const connected = new Set(this.#o.connectedRouters());
    for (const id of this.#reports.keys()) if (!connected.has(id)) this.#reports.delete(id);
  }
}
