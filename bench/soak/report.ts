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
 * balancer's pool; and the planned changes of the `lifecycle` phase ({@link PlannedKind}).
 */
export type FaultKind =
  | "engine-kill"
  | "agent-restart"
  | "control-plane-restart"
  | "control-plane-kill"
  | "control-plane-down"
  | "router-kill"
  | "slow-replica"
  | PlannedKind;

/**
 * Planned changes, which no client may notice: `scale-down` and `scale-up` of the main
 * deployment, `rolling-update` (a new revision that changes an engine arg), `node-drain` (the
 * admin drain of a node, then its uncordon), `agent-leave` (an agent stopped with
 * `--stop-engines`, then started again) and `undeploy` (of a second deployment serving the same
 * model).
 */
export type PlannedKind =
  | "scale-down"
  | "scale-up"
  | "rolling-update"
  | "node-drain"
  | "agent-leave"
  | "undeploy";

/** What a planned change's driver observed besides the fault fields. */
export interface PlannedRecord {
  /**
   * When the change was asked for, ms (the admin call; agent-leave: the SIGTERM of the agent
   * running with `--stop-engines`, after its restart with that flag).
   */
  readonly commandAtMs: number;
  /** When the change was done (see each driver), ms; undefined: not within its wait. */
  readonly doneAtMs: number | undefined;
  /**
   * The fewest replicas of the main deployment that took new requests (READY and not leaving,
   * or leaving but still WAITING), in polls every 100 ms from the command to done; undefined:
   * no poll answered.
   */
  readonly minCapacity: number | undefined;
  /**
   * rolling-update only: the capacity the rollout promises, `replicas − maxUnavailable` of the
   * spec the control plane rolls out (`rolloutLimits` defaults applied).
   */
  readonly capacityFloor?: number;
  /**
   * Replicas (any deployment) seen leaving (`retirement` set) in the change's polls, each with
   * when a poll last saw it so, ms.
   */
  readonly left: readonly { readonly replicaId: string; readonly lastSeenMs: number }[];
}

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
  /** Present for a planned change only. */
  readonly planned?: PlannedRecord;
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
  /** Streams in the window that began (status 200) and did not end with `[DONE]` ({@link isTruncatedStream}). */
  readonly truncatedStreams: number;
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
  /** Present for a planned change only. */
  readonly planned?: PlannedSummary;
}

/** A planned change's figures. */
export interface PlannedSummary {
  /** From the command to done, s; undefined: not done within its wait. */
  readonly tookS: number | undefined;
  /** See {@link PlannedRecord.minCapacity}. */
  readonly minCapacity: number | undefined;
  /** See {@link PlannedRecord.capacityFloor}. */
  readonly capacityFloor?: number;
  /** The ids of {@link PlannedRecord.left}. */
  readonly left: readonly string[];
  /**
   * Requests of the window answered by a replica in `left` (`x-llmgw-replica`) that started
   * by the time it was last seen leaving (ids are reused once a replica is gone): the traffic
   * the leaving replicas carried while they waited and drained.
   */
  readonly servedByLeaving: number;
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
/**
 * A stream the client saw begin (status 200) that did not end with `[DONE]`: cut (reset or
 * closed mid-body, no `[DONE]`) or ended by an SSE error event.
 */
export const isTruncatedStream = (r: RequestRecord): boolean =>
  r.stream && r.class !== "ok" && r.status === 200;
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
      truncatedStreams: inWindow.filter(isTruncatedStream).length,
      firstOkAfterS: seconds(firstOk === undefined ? undefined : firstOk - fault.atMs),
      steadyAfterS: seconds(lastFailureEnd - fault.atMs) ?? 0,
      readyAfterS: seconds(
        fault.readyAtMs === undefined ? undefined : fault.readyAtMs - fault.atMs,
      ),
      adopted: fault.adopted,
      okP50Ms: round(quantile(ok.map(latency), 0.5)),
      okP99Ms: round(quantile(ok.map(latency), 0.99)),
      notes: fault.notes,
      ...(fault.planned ? { planned: summarizePlanned(fault.planned, inWindow) } : {}),
    };
  });
}

function summarizePlanned(p: PlannedRecord, inWindow: readonly RequestRecord[]): PlannedSummary {
  const lastSeen = new Map(p.left.map((l) => [l.replicaId, l.lastSeenMs]));
  const byLeaving = (r: RequestRecord) => {
    const until = r.replica === undefined ? undefined : lastSeen.get(r.replica);
    return until !== undefined && r.startMs <= until;
  };
  return {
    tookS: seconds(p.doneAtMs === undefined ? undefined : p.doneAtMs - p.commandAtMs),
    minCapacity: p.minCapacity,
    ...(p.capacityFloor === undefined ? {} : { capacityFloor: p.capacityFloor }),
    left: p.left.map((l) => l.replicaId),
    servedByLeaving: inWindow.filter(byLeaving).length,
  };
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

/** One goal of a phase and how the phase did. */
export interface Goal {
  readonly goal: string;
  readonly value: string;
  readonly met: boolean;
}

/** ": error 2, reset 1" for a window's failures; "" when there were none. */
export const notOkClasses = (f: Pick<FaultSummary, "byClass">): string => {
  const parts = OUTCOME_CLASSES.filter((c) => c !== "ok" && f.byClass[c] > 0).map(
    (c) => `${c} ${f.byClass[c]}`,
  );
  return parts.length === 0 ? "" : `: ${parts.join(", ")}`;
};

/**
 * The lifecycle phase's goals (issue 21), from its planned changes: in each one's window no
 * request failed and no stream was cut, and it was done within `boundS`; the rolling update
 * never had fewer replicas taking new requests than its `capacityFloor`; nothing in the whole
 * phase failed (the windows start at the first change; this covers the rest).
 */
export function lifecycleGoals(
  perFault: readonly FaultSummary[],
  totals: SoakTotals,
  boundS: number,
): Goal[] {
  const goals: Goal[] = [];
  for (const f of perFault) {
    if (!f.planned) continue;
    const took = f.planned.tookS;
    goals.push({
      goal: `${f.kind}: 0 client-visible errors, 0 truncated streams, done within ${boundS} s`,
      value: `${f.notOk} failed of ${f.requests} ended in its window${notOkClasses(f)}; ${f.truncatedStreams} truncated; done in ${took ?? "never"} s`,
      met: f.notOk === 0 && f.truncatedStreams === 0 && took !== undefined && took <= boundS,
    });
    if (f.kind === "rolling-update") {
      const floor = f.planned.capacityFloor;
      const min = f.planned.minCapacity;
      goals.push({
        goal: `rolling-update: capacity never below replicas − maxUnavailable (${floor ?? "unknown"})`,
        value: `at least ${min ?? "unmeasured"} ready replicas taking new requests (GetDeployment every 100 ms)`,
        met: floor !== undefined && min !== undefined && min >= floor,
      });
    }
  }
  const notOk = totals.classified - totals.byClass.ok;
  goals.push({
    goal: "every request of the phase answered ok",
    value: `${notOk + (totals.sent - totals.classified)} not ok of ${totals.sent}${notOkClasses(totals)}${totals.sent === totals.classified ? "" : `, lost ${totals.sent - totals.classified}`}`,
    met: notOk === 0 && totals.sent === totals.classified,
  });
  return goals;
}
