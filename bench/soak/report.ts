/**
 * Turns the soak's request records and fault log into per-fault error budgets, recovery times
 * and overall totals. Pure: times are numbers (ms since the run started), no clock is read.
 */
import { quantile } from "../lib/table.js";
import { BAD_CLASSES, OUTCOME_CLASSES, type OutcomeClass } from "./classify.js";

/** One request as the client saw it. */
export interface RequestRecord {
  readonly id: number;
  readonly stream: boolean;
  /** ms since the run started. */
  readonly startMs: number;
  readonly endMs: number;
  readonly class: OutcomeClass;
  readonly detail: string;
  /** The replica that answered (`x-llmgw-replica`), when the router said. */
  readonly replica?: string;
  /** The HTTP status, when one arrived. */
  readonly status?: number;
}

/**
 * The faults the soak injects: `control-plane-restart` is a SIGTERM and a start at once,
 * `control-plane-kill` a SIGKILL and a start at once, `control-plane-down` a SIGKILL and a start
 * after an outage, `router-kill` a SIGKILL of one `llmgw router` and a start after it left the
 * balancer's pool.
 */
export type FaultKind =
  | "engine-kill"
  | "agent-restart"
  | "control-plane-restart"
  | "control-plane-kill"
  | "control-plane-down"
  | "router-kill"
  | "slow-replica";

/** What the fault driver observed. */
export interface FaultRecord {
  readonly kind: FaultKind;
  /** ms since the run started. */
  readonly atMs: number;
  /** When the cluster was whole again (replica READY, engines reported), ms; undefined: never. */
  readonly readyAtMs: number | undefined;
  /** Engines kept their pids (agent/control-plane restart); null when not applicable. */
  readonly adopted: boolean | null;
  /** Free-form facts (pids, victim, restarts). */
  readonly notes: readonly string[];
  /** The router's outage, ms: from SIGTERM (drain) until it listened again (control-plane restart). */
  readonly outage?: Outage;
}

/** A span during which the router was draining or down, ms since the run started. */
export interface Outage {
  readonly fromMs: number;
  readonly toMs: number;
}

/** A reset no later than this after the request started counts as seen immediately. */
export const IMMEDIATE_MS = 1_000;

/** Per-fault figures. */
export interface FaultSummary {
  readonly kind: FaultKind;
  readonly atS: number;
  /**
   * Requests that ended in [atMs, next fault or end): a request in flight when the fault hit
   * belongs to it, even though it started before.
   */
  readonly requests: number;
  readonly byClass: Readonly<Record<OutcomeClass, number>>;
  /** Requests in the window that did not succeed (the error budget spent). */
  readonly notOk: number;
  /** Of those, the ones already in flight when the fault hit (started before it). */
  readonly notOkInFlight: number;
  /** Of those, the ones that started at or after the fault. */
  readonly notOkAfter: number;
  /** Requests in the window answered with a 5xx status or ending with an SSE error event. */
  readonly serverErrors: number;
  /** From the fault to the first success that ended after it, s. */
  readonly firstOkAfterS: number | undefined;
  /**
   * From the fault to the end of the last unsuccessful request of the window, s (0 when every
   * request succeeded): after this, success was steady.
   */
  readonly steadyAfterS: number;
  /** From the fault to the cluster being whole again, s. */
  readonly readyAfterS: number | undefined;
  readonly adopted: boolean | null;
  /** p50/p99 latency of successful requests in the window, ms. */
  readonly okP50Ms: number | undefined;
  readonly okP99Ms: number | undefined;
  readonly notes: readonly string[];
}

/** Whole-run figures. */
export interface SoakTotals {
  readonly sent: number;
  readonly classified: number;
  readonly byClass: Readonly<Record<OutcomeClass, number>>;
  /**
   * Resets the client saw immediately (≤ {@link IMMEDIATE_MS}) while the router was draining or
   * down: the connection error a client may get when the control plane restarts, so not counted
   * as unanswered (they are still in `byClass.reset`).
   */
  readonly immediateResetsInOutage: number;
  /** hang + malformed + (sent − classified) + resets other than `immediateResetsInOutage`. */
  readonly unanswered: number;
  readonly okP50Ms: number | undefined;
  readonly okP99Ms: number | undefined;
  readonly streamOkP50Ms: number | undefined;
  readonly jsonOkP50Ms: number | undefined;
  /** Distinct error details with counts, most frequent first (for diagnosis). */
  readonly details: readonly {
    readonly class: OutcomeClass;
    readonly detail: string;
    readonly count: number;
  }[];
}

function countByClass(records: readonly RequestRecord[]): Record<OutcomeClass, number> {
  const out = Object.fromEntries(OUTCOME_CLASSES.map((c) => [c, 0])) as Record<
    OutcomeClass,
    number
  >;
  for (const r of records) out[r.class] += 1;
  return out;
}

const latency = (r: RequestRecord) => r.endMs - r.startMs;

/** A 5xx answer, or a stream that ended with an error event (a 5xx after the status line). */
export const isServerError = (r: RequestRecord): boolean =>
  r.class !== "ok" &&
  ((r.status !== undefined && r.status >= 500) ||
    (r.class === "error" && r.detail.startsWith("sse ")));
const round = (ms: number | undefined) => (ms === undefined ? undefined : Math.round(ms));
const seconds = (ms: number | undefined) =>
  ms === undefined ? undefined : Math.round(ms / 100) / 10;

/**
 * Per-fault budgets: each fault's window runs to the next fault's start or `endMs`, and holds
 * the requests that ended in it.
 */
export function summarizeFaults(
  records: readonly RequestRecord[],
  faults: readonly FaultRecord[],
  endMs: number,
): FaultSummary[] {
  const ordered = [...faults].sort((a, b) => a.atMs - b.atMs);
  return ordered.map((fault, i) => {
    const until = ordered[i + 1]?.atMs ?? endMs;
    const inWindow = records.filter((r) => r.endMs >= fault.atMs && r.endMs < until);
    const failed = inWindow.filter((r) => r.class !== "ok");
    const ok = inWindow.filter((r) => r.class === "ok");
    const firstOk = records
      .filter((r) => r.class === "ok" && r.endMs >= fault.atMs)
      .reduce<number | undefined>(
        (m, r) => (m === undefined || r.endMs < m ? r.endMs : m),
        undefined,
      );
    const lastFailureEnd = failed.reduce((m, r) => Math.max(m, r.endMs), fault.atMs);
    const inFlight = failed.filter((r) => r.startMs < fault.atMs).length;
    return {
      kind: fault.kind,
      atS: seconds(fault.atMs) ?? 0,
      requests: inWindow.length,
      byClass: countByClass(inWindow),
      notOk: failed.length,
      notOkInFlight: inFlight,
      notOkAfter: failed.length - inFlight,
      serverErrors: inWindow.filter(isServerError).length,
      firstOkAfterS: seconds(firstOk === undefined ? undefined : firstOk - fault.atMs),
      steadyAfterS: seconds(lastFailureEnd - fault.atMs) ?? 0,
      readyAfterS: seconds(
        fault.readyAtMs === undefined ? undefined : fault.readyAtMs - fault.atMs,
      ),
      adopted: fault.adopted,
      okP50Ms: round(quantile(ok.map(latency), 0.5)),
      okP99Ms: round(quantile(ok.map(latency), 0.99)),
      notes: fault.notes,
    };
  });
}

/** Whole-run totals; `sent` is the client's own count of requests it started. */
export function summarizeTotals(
  records: readonly RequestRecord[],
  sent: number,
  outages: readonly Outage[] = [],
): SoakTotals {
  const byClass = countByClass(records);
  const immediateResetsInOutage = records.filter(
    (r) =>
      r.class === "reset" &&
      r.endMs - r.startMs <= IMMEDIATE_MS &&
      outages.some((o) => r.endMs >= o.fromMs && r.startMs <= o.toMs),
  ).length;
  const ok = records.filter((r) => r.class === "ok");
  const details = new Map<string, { class: OutcomeClass; detail: string; count: number }>();
  for (const r of records) {
    if (r.class === "ok") continue;
    const key = `${r.class}\u0000${r.detail}`;
    const entry = details.get(key) ?? { class: r.class, detail: r.detail, count: 0 };
    entry.count += 1;
    details.set(key, entry);
  }
  return {
    sent,
    classified: records.length,
    byClass,
    immediateResetsInOutage,
    unanswered:
      BAD_CLASSES.reduce((n, c) => n + byClass[c], 0) -
      immediateResetsInOutage +
      (sent - records.length),
    okP50Ms: round(quantile(ok.map(latency), 0.5)),
    okP99Ms: round(quantile(ok.map(latency), 0.99)),
    streamOkP50Ms: round(quantile(ok.filter((r) => r.stream).map(latency), 0.5)),
    jsonOkP50Ms: round(quantile(ok.filter((r) => !r.stream).map(latency), 0.5)),
    details: [...details.values()].sort((a, b) => b.count - a.count),
  };
}
