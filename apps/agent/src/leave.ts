import { Code, ConnectError } from "@connectrpc/connect";
import type { SetLeavingResponse } from "@llmgw/proto";
import type { Clock, SupervisorLogger } from "@llmgw/supervisor";
import { hasLeavingMarker, removeLeavingMarker, writeLeavingMarker } from "./leaving-marker.js";

/**
 * How many replicas the desired sets the agent applied hold, numbered in the order they were
 * applied, so a wait can ask for an empty set applied after a given moment.
 */
export class DesiredReplicas {
  #applied = 0;
  #count: number | undefined;
  readonly #listeners = new Set<() => void>();

  /** Records one applied desired set of `count` assignments. */
  noteApplied(count: number): void {
    this.#applied += 1;
    this.#count = count;
    for (const listener of [...this.#listeners]) listener();
  }

  /** Desired sets applied so far (a mark for {@link emptyAfter}). */
  get applied(): number {
    return this.#applied;
  }

  /** Assignments in the last applied set; undefined before the first. */
  get count(): number | undefined {
    return this.#count;
  }

  /**
   * Resolves true once a set applied after `mark` (a value of {@link applied}) holds no
   * assignment, false when `signal` aborts first.
   */
  emptyAfter(mark: number, signal: AbortSignal): Promise<boolean> {
    return new Promise((resolve) => {
      const check = () => {
        if (this.#applied > mark && this.#count === 0) finish(true);
      };
      const finish = (empty: boolean) => {
        this.#listeners.delete(check);
        signal.removeEventListener("abort", abort);
        resolve(empty);
      };
      const abort = () => finish(false);
      if (signal.aborted) return resolve(false);
      this.#listeners.add(check);
      signal.addEventListener("abort", abort, { once: true });
      check();
    });
  }
}

/** How a leave ended (see {@link LeaveReport}). */
export type LeaveOutcome =
  /** A desired set applied after the control plane took the leave held no replica. */
  | "drained"
  /** `timeoutMs` passed first; what was left is stopped without its drain. */
  | "timed-out"
  /** `interrupt` aborted (a second signal): engines stop at once. */
  | "interrupted"
  /** The control plane could not be asked: unreachable, not registered, or it refused. */
  | "not-asked"
  /** The control plane is older than `SetLeaving` (`Unimplemented`). */
  | "unsupported"
  /** `timeoutMs` is 0: no leave was asked for. */
  | "skipped";

/** The outcome of {@link leaveCluster}, as data. */
export interface LeaveReport {
  readonly outcome: LeaveOutcome;
  /** Replicas the control plane still placed on the node when it took the leave; absent when it did not. */
  readonly replicasPlaced?: number;
  /** From the start of the leave to its end, ms (0 when skipped). */
  readonly durationMs: number;
  /** Assignments in the last applied desired set at the end; absent before the first. */
  readonly replicasLeft?: number;
}

/** What {@link leaveCluster} works with. */
export interface LeaveClusterOptions {
  /** `ControlChannel.setLeaving(true, signal)`. */
  readonly setLeaving: (signal: AbortSignal) => Promise<SetLeavingResponse>;
  /** Hurries the next heartbeat, so the drained desired set comes sooner. */
  readonly beatSoon: () => void;
  readonly desired: DesiredReplicas;
  /** Where the leaving marker goes once the control plane took the leave. */
  readonly stateDir: string;
  /** The node id the marker records. */
  readonly nodeId: string | undefined;
  /** The whole leave, the call included, takes at most this long; 0 skips it. */
  readonly timeoutMs: number;
  /** Aborted to stop waiting at once (a second signal). */
  readonly interrupt?: AbortSignal;
  readonly clock: Clock;
  readonly logger: SupervisorLogger;
}

const seconds = (ms: number) => `${(ms / 1000).toFixed(1)} s`;

/**
 * Leaves the cluster before the agent stops its engines: asks the control plane to drain the
 * node (`SetLeaving` true), records that in the state dir, then waits until a desired set
 * applied after the answer holds no replica — the control plane started each replacement
 * elsewhere and let this node's replicas finish their requests. The channel keeps
 * heartbeating meanwhile; that is how the emptied set arrives. Never throws: a control plane
 * that cannot be asked ends the leave at once (the caller stops the engines as before).
 * One line is logged when the leave starts and one when it ends.
 */
export async function leaveCluster(options: LeaveClusterOptions): Promise<LeaveReport> {
  const { clock, logger, desired } = options;
  if (options.timeoutMs === 0) {
    logger.info("--leave-timeout 0: stopping engines without draining them first", {});
    return { outcome: "skipped", durationMs: 0 };
  }
  const startedMs = clock.now();
  const stop = new AbortController();
  const timer = clock.setTimer(() => stop.abort("timed-out"), options.timeoutMs);
  const interrupt = () => stop.abort("interrupted");
  if (options.interrupt?.aborted) interrupt();
  options.interrupt?.addEventListener("abort", interrupt, { once: true });
  const report = (outcome: LeaveOutcome, replicasPlaced?: number): LeaveReport => ({
    outcome,
    ...(replicasPlaced === undefined ? {} : { replicasPlaced }),
    durationMs: clock.now() - startedMs,
    ...(desired.count === undefined ? {} : { replicasLeft: desired.count }),
  });
  try {
    let answer: SetLeavingResponse;
    try {
      answer = await options.setLeaving(stop.signal);
    } catch (error) {
      if (stop.signal.aborted) {
        const outcome = stop.signal.reason as "timed-out" | "interrupted";
        logger.warn(
          `leave ${outcome} after ${seconds(clock.now() - startedMs)} while asking the control plane; stopping engines now`,
          {},
        );
        return report(outcome);
      }
      const err = ConnectError.from(error);
      const unsupported = err.code === Code.Unimplemented;
      logger.warn(
        unsupported
          ? "the control plane does not support leaving (SetLeaving is Unimplemented: an older version); stopping engines without draining them first"
          : `cannot tell the control plane this node is leaving (${Code[err.code]}: ${err.rawMessage}); stopping engines without draining them first`,
        {},
      );
      return report(unsupported ? "unsupported" : "not-asked");
    }
    const mark = desired.applied;
    try {
      await writeLeavingMarker(options.stateDir, {
        nodeId: options.nodeId ?? "",
        sinceUnixMs: clock.now(),
      });
    } catch (error) {
      logger.warn(
        `cannot record the leave in ${options.stateDir} (${(error as NodeJS.ErrnoException).code ?? (error as Error).message}); the node stays drained after the next start until an operator uncordons it`,
        {},
      );
    }
    logger.info(
      `leaving the cluster: the control plane drains ${answer.replicas} replica(s) off this node before its engines stop (at most ${seconds(options.timeoutMs)})`,
      { replicas: answer.replicas },
    );
    if (answer.replicas === 0) {
      logger.info(`left the cluster in ${seconds(clock.now() - startedMs)}: nothing to drain`, {});
      return report("drained", 0);
    }
    options.beatSoon();
    const drained = await desired.emptyAfter(mark, stop.signal);
    const elapsed = seconds(clock.now() - startedMs);
    if (drained) {
      logger.info(`left the cluster in ${elapsed}: every replica drained`, {});
      return report("drained", answer.replicas);
    }
    const outcome = stop.signal.reason as "timed-out" | "interrupted";
    logger.warn(
      outcome === "timed-out"
        ? `leave timed out after ${elapsed} with ${desired.count ?? "unknown"} replica(s) still on this node; stopping them now`
        : `leave interrupted after ${elapsed} (asked to stop at once) with ${desired.count ?? "unknown"} replica(s) still on this node; stopping them now`,
      {},
    );
    return report(outcome, answer.replicas);
  } finally {
    timer.cancel();
    options.interrupt?.removeEventListener("abort", interrupt);
  }
}

/** What {@link createLeaveUndo} works with. */
export interface LeaveUndoOptions {
  /** `ControlChannel.setLeaving(false)`. */
  readonly setLeaving: () => Promise<SetLeavingResponse>;
  readonly stateDir: string;
  readonly logger: SupervisorLogger;
}

/** Ends the leave a previous agent left behind; see {@link createLeaveUndo}. */
export interface LeaveUndo {
  /** Called after every heartbeat that got through: tries once more if a try is due. */
  afterHeartbeat(): void;
  /** No more tries; resolves once the one in flight (if any) has settled. */
  stop(): Promise<void>;
  /** True while the marker is there and the control plane has not taken the undo. */
  readonly pending: boolean;
}

/**
 * Ends a leave the previous agent began, once this one is registered and heartbeating: when
 * the state dir holds the leaving marker, each heartbeat that got through triggers one
 * `SetLeaving` false (never two at once) until one succeeds, then the marker goes. An
 * `Unimplemented` answer also removes it (an older control plane never drained the node).
 * A failure is logged once per distinct message; the next heartbeat tries again.
 */
export async function createLeaveUndo(options: LeaveUndoOptions): Promise<LeaveUndo> {
  let pending = await hasLeavingMarker(options.stateDir);
  let stopped = false;
  let inFlight: Promise<void> | undefined;
  let lastError: string | undefined;
  const attempt = async () => {
    let unsupported = false;
    try {
      await options.setLeaving();
    } catch (error) {
      const err = ConnectError.from(error);
      unsupported = err.code === Code.Unimplemented;
      if (!unsupported) {
        const message = `cannot end the leave the last agent began (${Code[err.code]}: ${err.rawMessage}); retrying after the next heartbeat`;
        if (message !== lastError) options.logger.warn(message, {});
        lastError = message;
        return;
      }
    }
    try {
      await removeLeavingMarker(options.stateDir);
      pending = false;
      options.logger.info(
        unsupported
          ? "the last agent left the cluster with its engines, and this control plane does not support leaving (an older version): nothing to end"
          : "the last agent left the cluster with its engines; the control plane takes this node back",
        {},
      );
    } catch (error) {
      const message = `cannot remove the leaving marker in ${options.stateDir} (${(error as NodeJS.ErrnoException).code ?? (error as Error).message}); retrying after the next heartbeat`;
      if (message !== lastError) options.logger.warn(message, {});
      lastError = message;
    }
  };
  return {
    afterHeartbeat() {
      if (!pending || stopped || inFlight !== undefined) return;
      inFlight = attempt().finally(() => {
        inFlight = undefined;
      });
    },
    async stop() {
      stopped = true;
      await inFlight;
    },
    get pending() {
      return pending;
    },
  };
}
