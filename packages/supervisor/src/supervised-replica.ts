import type { Clock, SupervisorLogger, TimerHandle } from "./clock.js";
import { SupervisorError } from "./errors.js";
import { validateReplicaId } from "./pid-file.js";
import type { ProcessSpec } from "./process-spec.js";
import { hashProcessSpec, validateProcessSpec } from "./process-spec.js";
import {
  nextRestartDecision,
  type ResolvedRestartPolicy,
  type RestartPolicyOptions,
  type RunRecord,
  resolveRestartPolicy,
} from "./restart-policy.js";
import type {
  ExitReport,
  ProcessExit,
  ProcessHandle,
  StopOptions,
  Supervisor,
} from "./supervisor.js";

/** Lifecycle of a supervised replica (DESIGN §5). */
export type ReplicaState =
  | "starting"
  | "loading"
  | "ready"
  | "unhealthy"
  | "stopping"
  | "exited"
  | "failed";

/**
 * What one readiness probe saw: `starting` (API not answering), `loading` (answers, model
 * not listed), `ready`, or `failed-probe` (error or timeout). Kept as plain strings so the
 * supervisor does not depend on `@llmgw/readiness`.
 */
export type ProbeOutcome = "starting" | "loading" | "ready" | "failed-probe";

/** A readiness probe; rejections count as `failed-probe`. */
export type ReplicaProbe = () => Promise<ProbeOutcome>;

/** Allowed transitions; anything else throws `LLMGW_SUPERVISOR_INVALID_TRANSITION`. */
export const REPLICA_TRANSITIONS: Readonly<Record<ReplicaState, readonly ReplicaState[]>> = {
  starting: ["loading", "ready", "stopping", "exited", "failed"],
  loading: ["starting", "ready", "stopping", "exited", "failed"],
  ready: ["unhealthy", "stopping", "exited"],
  unhealthy: ["ready", "stopping", "exited"],
  stopping: ["exited", "failed"],
  exited: ["starting", "failed"],
  failed: ["starting", "exited"],
};

/** One observed state change. */
export interface ReplicaTransition {
  readonly replicaId: string;
  readonly from: ReplicaState;
  readonly to: ReplicaState;
  readonly atMs: number;
  readonly reason: string;
  /** The log tail, attached to transitions into `failed`. */
  readonly tail?: readonly string[];
}

/** Why a replica is `failed`, with the engine output that explains it. */
export interface ReplicaFailure {
  readonly reason: string;
  readonly tail: readonly string[];
  readonly atMs: number;
}

/** Partial options of {@link SupervisedReplica}. */
export interface SupervisedReplicaOptions {
  supervisor: Supervisor;
  replicaId: string;
  spec: ProcessSpec;
  /**
   * Variables drawn afresh for every launch (first start and each restart) and set on top of
   * `spec.env`, outside the spec hash: per-process secrets such as an engine's API key, which
   * then rotate whenever the process does. A rejection fails that launch. Default: none.
   */
  launchEnv?: () => Readonly<Record<string, string>> | Promise<Readonly<Record<string, string>>>;
  probe: ReplicaProbe;
  restartPolicy?: RestartPolicyOptions;
  /** From launch until `ready` (starting + loading); past it → `failed`. Default 600 000 ms. */
  loadingDeadlineMs?: number;
  /** Interval between probes. Default 1000 ms. */
  probeIntervalMs?: number;
  /** Consecutive failed probes after `ready` that make it `unhealthy`. Default 3. */
  unhealthyAfterFailures?: number;
  /**
   * Set when `spec` must never be launched, only a process a previous supervisor launched
   * from it adopted (a spec the caller now refuses, whose engine still serves): why, as the
   * reason the replica goes `failed` with. `start({ adopt: true })` then adopts or fails (a
   * process of another spec is stopped as ever, and nothing replaces it), and an adopted
   * process that exits or misses its loading deadline leaves the replica `failed` instead of
   * restarting. Default: launches as usual.
   */
  adoptOnly?: string;
  /** Defaults to the supervisor's clock and logger. */
  clock?: Clock;
  logger?: SupervisorLogger;
}

/** Complete, validated options of {@link SupervisedReplica}. */
export interface ResolvedSupervisedReplicaOptions {
  readonly replicaId: string;
  readonly spec: ProcessSpec;
  readonly specHash: string;
  readonly restartPolicy: ResolvedRestartPolicy;
  readonly loadingDeadlineMs: number;
  readonly probeIntervalMs: number;
  readonly unhealthyAfterFailures: number;
  readonly adoptOnly: string | undefined;
  readonly clock: Clock;
  readonly logger: SupervisorLogger;
}

/** Validates once and fills defaults. Throws `LLMGW_SUPERVISOR_INVALID_OPTIONS`. */
export function resolveSupervisedReplicaOptions(
  o: SupervisedReplicaOptions,
): ResolvedSupervisedReplicaOptions {
  validateProcessSpec(o.spec);
  const resolved = {
    replicaId: validateReplicaId(o.replicaId),
    spec: o.spec,
    specHash: o.spec.specHash ?? hashProcessSpec(o.spec),
    restartPolicy: resolveRestartPolicy(o.restartPolicy),
    loadingDeadlineMs: o.loadingDeadlineMs ?? 600_000,
    probeIntervalMs: o.probeIntervalMs ?? 1000,
    unhealthyAfterFailures: o.unhealthyAfterFailures ?? 3,
    adoptOnly: o.adoptOnly,
    clock: o.clock ?? o.supervisor.options.clock,
    logger: o.logger ?? o.supervisor.options.logger,
  };
  for (const key of ["loadingDeadlineMs", "probeIntervalMs", "unhealthyAfterFailures"] as const) {
    if (!Number.isFinite(resolved[key]) || resolved[key] <= 0) {
      throw new SupervisorError(
        "LLMGW_SUPERVISOR_INVALID_OPTIONS",
        `${key} must be a finite number > 0, got ${String(resolved[key])}`,
      );
    }
  }
  return resolved;
}

/**
 * Glue between a {@link Supervisor}'s process lifecycle and an injected readiness probe:
 * `starting → loading → ready`, `ready → unhealthy → ready` on probe failures and recovery,
 * restarts with backoff after crashes (pure {@link nextRestartDecision}), `failed` with the
 * log tail when the loading deadline passes or the restart policy gives up. Every transition
 * is logged and delivered to subscribers.
 */
export class SupervisedReplica {
  readonly options: ResolvedSupervisedReplicaOptions;
  readonly #supervisor: Supervisor;
  readonly #probe: ReplicaProbe;
  readonly #launchEnv: SupervisedReplicaOptions["launchEnv"];
  readonly #listeners = new Set<(t: ReplicaTransition) => void>();
  readonly #history: RunRecord[] = [];
  readonly #recorded = new WeakSet<ProcessHandle>();
  #state: ReplicaState = "exited";
  #handle: ProcessHandle | undefined;
  #failure: ReplicaFailure | undefined;
  #timers: TimerHandle[] = [];
  #failedProbes = 0;
  #generation = 0;
  #userStopped = false;
  /**
   * The start or restart in flight until its process is attached. It resolves to the process
   * it produced but did not attach because `stop()` ran meanwhile, which that `stop()` stops.
   */
  #launching: Promise<ProcessHandle | undefined> | undefined;

  constructor(options: SupervisedReplicaOptions) {
    this.options = resolveSupervisedReplicaOptions(options);
    this.#supervisor = options.supervisor;
    this.#probe = options.probe;
    this.#launchEnv = options.launchEnv;
  }

  /** Current state; `exited` before the first start. */
  get state(): ReplicaState {
    return this.#state;
  }

  /** The live process, if any. */
  get handle(): ProcessHandle | undefined {
    return this.#handle;
  }

  /** Why the replica is `failed` (undefined otherwise). */
  get failure(): ReplicaFailure | undefined {
    return this.#failure;
  }

  /** Finished runs so far (input of the restart policy). */
  get history(): readonly RunRecord[] {
    return [...this.#history];
  }

  /** Calls `listener` on every transition; returns the unsubscribe function. */
  subscribe(listener: (transition: ReplicaTransition) => void): () => void {
    this.#listeners.add(listener);
    return () => {
      this.#listeners.delete(listener);
    };
  }

  /**
   * Starts the replica. With `adopt: true` a process left by a previous supervisor is
   * adopted when its spec hash matches, and replaced (stopped, relaunched) when it does not.
   * With `adoptOnly` nothing is launched: no process to adopt leaves the replica `failed`.
   * Throws `LLMGW_SUPERVISOR_ALREADY_RUNNING` unless the replica is `exited` or `failed` with
   * no start or restart in flight. A `stop()` that runs before the process is attached wins:
   * the start then resolves with nothing running, and a launch that failed meanwhile is not
   * reported as `failed`.
   */
  async start(options: { adopt?: boolean } = {}): Promise<void> {
    if (this.#launching !== undefined || (this.#state !== "exited" && this.#state !== "failed")) {
      const state = this.#launching === undefined ? this.#state : "launching";
      throw new SupervisorError(
        "LLMGW_SUPERVISOR_ALREADY_RUNNING",
        `replica ${this.options.replicaId} is ${state}; stop it before starting`,
      );
    }
    this.#userStopped = false;
    this.#failure = undefined;
    this.#history.length = 0;
    this.#cancelTimers(); // a restart still waiting for its backoff: this start replaces it
    let adopted: ProcessHandle | undefined;
    await this.#inFlight(async (generation) => {
      if (options.adopt === true) {
        const report = await this.#supervisor.adopt(this.options.replicaId, this.options.specHash);
        if (report.kind === "adopted") {
          adopted = report.handle;
          return this.#attachUnlessStopped(generation, report.handle, "adopted a running process");
        }
        if (report.kind === "spec-changed") {
          this.options.logger.info("launch spec changed; replacing the adopted process", {
            replicaId: this.options.replicaId,
            recorded: report.recordedSpecHash,
            expected: report.expectedSpecHash,
          });
          // With the settings its launcher recorded: they belong to the process being replaced.
          await report.handle.stop();
          if (generation !== this.#generation) return undefined;
        }
      }
      if (this.options.adoptOnly !== undefined) {
        this.#fail("no running process to adopt", []);
        return undefined;
      }
      return this.#launch(generation, "start requested");
    });
    if (adopted !== undefined && adopted === this.#handle) {
      // Probed before this returns: an engine that serves is reported ready from the new
      // agent's first heartbeat on, never `starting` (which would take it off the routers
      // for a probe interval, and make a planned move treat it as serving nothing).
      await this.#runProbe(this.#generation);
    }
  }

  /**
   * Stops the process group (→ `stopping` → `exited`) and cancels restarts and probes.
   * A start or restart in flight is waited for and what it launched is stopped without
   * entering `stopping`: the replica ends `exited`, a start from `failed` too (`failed →
   * exited`); it stays `failed` only when that launch failed before the stop. Resolves to
   * undefined when nothing was running. Rejects when stopping the process fails.
   */
  async stop(): Promise<ExitReport | undefined> {
    this.#userStopped = true;
    this.#generation++;
    this.#cancelTimers();
    // Its rejection (a failed launch) is the start's to report.
    const unattached = await this.#launching?.catch(() => undefined);
    if (this.#state === "failed" && this.#failure === undefined) {
      // A start from `failed` cleared the failure it was retrying: `failed` with no reason.
      this.#transition("exited", "stopped while starting");
    }
    if (unattached !== undefined) {
      const report = await unattached.stop(this.#stopOptions());
      this.#recordRun(unattached);
      return report;
    }
    const handle = this.#handle;
    if (handle === undefined) {
      return undefined;
    }
    if (this.#state !== "stopping") this.#transition("stopping", "stop requested");
    const report = await handle.stop(this.#stopOptions());
    this.#recordRun(handle);
    this.#handle = undefined;
    this.#transition(
      "exited",
      `stopped (code=${report.code} signal=${report.signal} forced=${report.forced})`,
    );
    return report;
  }

  /**
   * Stops supervising and leaves the process running, for the next agent to adopt (an agent
   * shutting down without stopping its engines): no probe, restart or exit handling after it.
   * Without it, a process that exits later (stopped by the agent that adopted it) was still
   * this replica's to restart, from a supervisor whose agent had closed. The replica is spent:
   * do not start it again.
   */
  release(): void {
    this.#userStopped = true;
    this.#generation++;
    this.#cancelTimers();
  }

  /**
   * This replica's spec's stop settings. A launched handle has them already. An adopted one
   * defaults to those recorded by its launcher, which can differ (they are not part of the spec
   * hash); the replica's own stops apply the spec it runs under now.
   */
  #stopOptions(): StopOptions {
    const { stopSignal, stopGraceMs } = this.options.spec;
    return {
      ...(stopSignal === undefined ? {} : { signal: stopSignal }),
      ...(stopGraceMs === undefined ? {} : { graceMs: stopGraceMs }),
    };
  }

  /**
   * Runs `run` as the start or restart in flight (see {@link stop}), with the generation it
   * belongs to: once that changed, `stop()` ran and `run` must not attach anything.
   */
  async #inFlight(run: (generation: number) => Promise<ProcessHandle | undefined>): Promise<void> {
    const launching = run(this.#generation);
    this.#launching = launching;
    try {
      await launching;
    } finally {
      if (this.#launching === launching) this.#launching = undefined;
    }
  }

  /** Launches a process; resolves to it when `stop()` ran meanwhile (else it is attached). */
  async #launch(generation: number, reason: string): Promise<ProcessHandle | undefined> {
    if (this.options.adoptOnly !== undefined) {
      // Unreached (start and #onExit fail first); the one place a process is launched refuses.
      this.#fail(`not launched (${reason})`, []);
      return undefined;
    }
    let handle: ProcessHandle;
    try {
      const { spec, specHash } = this.options;
      const extra = this.#launchEnv === undefined ? undefined : await this.#launchEnv();
      if (generation !== this.#generation) return undefined;
      handle = await this.#supervisor.launch(
        this.options.replicaId,
        extra === undefined ? spec : { ...spec, env: { ...spec.env, ...extra }, specHash },
      );
    } catch (cause) {
      if (generation !== this.#generation) return undefined; // stopped: nothing failed to run
      this.#fail(`launch failed: ${(cause as Error).message}`, []);
      throw cause;
    }
    return this.#attachUnlessStopped(generation, handle, reason);
  }

  /**
   * Attaches `handle` unless `stop()` ran since `generation`; then it is left to that stop and
   * returned (an adopted one without the immediate probe: `start()` runs it).
   */
  #attachUnlessStopped(
    generation: number,
    handle: ProcessHandle,
    reason: string,
  ): ProcessHandle | undefined {
    if (generation !== this.#generation) {
      this.options.logger.info("stopped while launching; stopping the new process", {
        replicaId: this.options.replicaId,
        pid: handle.pid,
      });
      return handle;
    }
    this.#attach(handle, reason, !handle.adopted);
    return undefined;
  }

  #attach(handle: ProcessHandle, reason: string, probeSoon = true): void {
    const generation = ++this.#generation;
    this.#handle = handle;
    this.#failedProbes = 0;
    this.#transition("starting", reason);
    const { clock, loadingDeadlineMs } = this.options;
    this.#timers.push(
      clock.setTimer(() => {
        if (generation !== this.#generation) return;
        if (this.#state === "starting" || this.#state === "loading") {
          void this.#failAfterStop(
            handle,
            `not ready within the loading deadline of ${loadingDeadlineMs} ms`,
          );
        }
      }, loadingDeadlineMs),
    );
    if (probeSoon) this.#scheduleProbe(generation, 0);
    void handle.exited.then((exit) => this.#onExit(generation, handle, exit));
  }

  #scheduleProbe(generation: number, delayMs: number): void {
    this.#timers.push(
      this.options.clock.setTimer(() => {
        void this.#runProbe(generation);
      }, delayMs),
    );
  }

  async #runProbe(generation: number): Promise<void> {
    let outcome: ProbeOutcome;
    try {
      outcome = await this.#probe();
    } catch {
      outcome = "failed-probe";
    }
    if (generation !== this.#generation || this.#handle?.exit() !== undefined) return;
    this.#applyProbe(outcome);
    if (generation === this.#generation && !isIdle(this.#state)) {
      this.#scheduleProbe(generation, this.options.probeIntervalMs);
    }
  }

  #applyProbe(outcome: ProbeOutcome): void {
    const state = this.#state;
    if (state === "starting" || state === "loading") {
      if (outcome === "ready") this.#transition("ready", "probe: ready");
      else if (outcome === "loading" && state === "starting")
        this.#transition("loading", "probe: loading");
      else if (outcome === "starting" && state === "loading")
        this.#transition("starting", "probe: starting");
      return;
    }
    if (state === "ready" || state === "unhealthy") {
      if (outcome === "ready") {
        this.#failedProbes = 0;
        if (state === "unhealthy") this.#transition("ready", "probe: recovered");
        return;
      }
      this.#failedProbes++;
      if (state === "ready" && this.#failedProbes >= this.options.unhealthyAfterFailures) {
        this.#transition(
          "unhealthy",
          `${this.#failedProbes} consecutive failed probes (last: ${outcome})`,
        );
      }
    }
  }

  async #onExit(generation: number, handle: ProcessHandle, exit: ProcessExit): Promise<void> {
    if (generation !== this.#generation || this.#userStopped) return;
    this.#generation++;
    this.#cancelTimers();
    // The leader died; grandchildren may still hold GPU memory: clean the group up.
    try {
      await handle.stop({ graceMs: Math.min(5000, this.options.spec.stopGraceMs ?? 5000) });
    } catch (cause) {
      this.options.logger.warn("could not clean up the group after a crash", {
        replicaId: this.options.replicaId,
        error: (cause as Error).message,
      });
    }
    if (this.#userStopped) return;
    const tail = handle.tail();
    this.#recordRun(handle, exit);
    this.#handle = undefined;
    const how = `exited unexpectedly (code=${exit.code} signal=${exit.signal})`;
    if (this.options.adoptOnly !== undefined) {
      this.#transition("exited", how);
      this.#fail(how, tail);
      return;
    }
    const decision = nextRestartDecision(
      this.#history,
      this.options.clock.now(),
      this.options.restartPolicy,
    );
    if (decision.action === "give-up") {
      this.#transition("exited", how);
      this.#fail(`restart policy gave up: ${decision.reason}`, tail);
      return;
    }
    this.#transition("exited", `${how}; restarting in ${decision.delayMs} ms`);
    const restartGeneration = this.#generation;
    this.#timers.push(
      this.options.clock.setTimer(() => {
        if (restartGeneration !== this.#generation || this.#userStopped) return;
        const reason = `restart after ${decision.quickFailures} quick failure(s)`;
        this.#inFlight((generation) => this.#launch(generation, reason)).catch(() => {});
      }, decision.delayMs),
    );
  }

  async #failAfterStop(handle: ProcessHandle, reason: string): Promise<void> {
    this.#generation++;
    this.#cancelTimers();
    this.#transition("stopping", reason);
    try {
      await handle.stop(this.#stopOptions());
    } catch (cause) {
      this.options.logger.warn("stop failed", {
        replicaId: this.options.replicaId,
        error: (cause as Error).message,
      });
    }
    if (this.#userStopped) return; // stop() raced us and reports `exited` itself
    this.#recordRun(handle);
    this.#handle = undefined;
    this.#fail(reason, handle.tail());
  }

  /** To `failed`; with `adoptOnly`, the reason says why the replica is not launched again. */
  #fail(failure: string, tail: readonly string[]): void {
    const { adoptOnly } = this.options;
    const reason = adoptOnly === undefined ? failure : `${failure}; ${adoptOnly}`;
    this.#failure = { reason, tail, atMs: this.options.clock.now() };
    this.#transition("failed", reason, tail);
  }

  #recordRun(handle: ProcessHandle, exit?: ProcessExit): void {
    const exitedAtMs = exit?.atMs ?? handle.exit()?.atMs ?? this.options.clock.now();
    if (this.#recorded.has(handle)) return;
    this.#recorded.add(handle);
    this.#history.push({ startedAtMs: handle.startedAtMs, exitedAtMs });
    if (this.#history.length > 64) this.#history.shift();
  }

  #cancelTimers(): void {
    for (const timer of this.#timers) timer.cancel();
    this.#timers = [];
  }

  #transition(to: ReplicaState, reason: string, tail?: readonly string[]): void {
    const from = this.#state;
    if (from === to) return;
    if (!REPLICA_TRANSITIONS[from].includes(to)) {
      throw new SupervisorError(
        "LLMGW_SUPERVISOR_INVALID_TRANSITION",
        `replica ${this.options.replicaId}: ${from} → ${to} is not allowed (${reason})`,
      );
    }
    this.#state = to;
    const transition: ReplicaTransition = {
      replicaId: this.options.replicaId,
      from,
      to,
      atMs: this.options.clock.now(),
      reason,
      ...(tail === undefined ? {} : { tail }),
    };
    const log =
      to === "failed" || to === "unhealthy" ? this.options.logger.warn : this.options.logger.info;
    log.call(this.options.logger, `replica ${from} → ${to}`, {
      replicaId: this.options.replicaId,
      reason,
    });
    for (const listener of this.#listeners) {
      try {
        listener(transition);
      } catch {
        // a listener must not break the lifecycle
      }
    }
  }
}

function isIdle(state: ReplicaState): boolean {
  return state === "exited" || state === "failed" || state === "stopping";
}

/** Creates a {@link SupervisedReplica}. */
export function createSupervisedReplica(options: SupervisedReplicaOptions): SupervisedReplica {
  return new SupervisedReplica(options);
}
