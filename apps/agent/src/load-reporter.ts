import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  EngineLoadSchema,
  type ReplicaLoadReport,
  ReplicaLoadReportSchema,
  type ReportLoadResponse,
} from "@llmgw/proto";
import type { SupervisorLogger } from "@llmgw/supervisor";
import { engineLoadToProto } from "@llmgw/wire";
import type { ChannelState, LoadStream } from "./control-channel.js";
import type { EngineLoadSignals, ReplicaLoadSample } from "./replica-manager.js";

/** Default of `--load-interval`: engines are scraped, and changes reported, this often. */
export const DEFAULT_LOAD_INTERVAL_MS = 500;
/** Shortest `--load-interval`, and the floor of an interval the control plane asks for. */
export const MIN_LOAD_INTERVAL_MS = 100;
/** Longest `--load-interval`, and the ceiling of an interval the control plane asks for. */
export const MAX_LOAD_INTERVAL_MS = 60_000;

/** Where load reports go: the control channel ({@link ControlChannel} is one). */
export interface LoadReportSink {
  /** Reports are sent only while `connected` (the heartbeat path owns every other state). */
  readonly state: ChannelState;
  /** Changes with every Register: what was sent before is sent again, and ReportLoad retried. */
  readonly registrations: number;
  reportLoad(
    replicas: readonly ReplicaLoadReport[],
    signal?: AbortSignal,
  ): Promise<ReportLoadResponse>;
  /** How long one `StreamLoad` request may stay open; 0: the control plane offers none. */
  readonly loadStreamMs: number;
  /** Opens a `StreamLoad` request (only asked while `loadStreamMs` > 0). */
  openLoadStream(signal: AbortSignal): LoadStream;
}

export interface LoadReporterOptions {
  readonly sink: LoadReportSink;
  /** The engines' current load (`ReplicaManager.loadSamples`), read at every report. */
  readonly samples: () => readonly ReplicaLoadSample[];
  readonly logger: SupervisorLogger;
  /** The agent's own load interval (`--load-interval`), in force while the control plane asks none. */
  readonly intervalMs: number;
  /**
   * Called when the interval in force changes: the control plane asked for one
   * (`ReportLoadResponse.load_interval_ms`, clamped to 100..60 000 ms) or went back to 0
   * (the agent's own). Scraping restarts at it.
   */
  readonly onInterval?: (intervalMs: number) => void;
}

/**
 * `active`: reports go out. `unsupported`: the control plane answered `Unimplemented` (an
 * older version); nothing is sent until the channel registers again. `closed`: stopped.
 */
export type LoadReporterState = "active" | "unsupported" | "closed";

/** What {@link planLoadReport} decides for one round. */
export interface LoadReportPlan {
  /** Samples whose load differs from what the control plane last acknowledged. */
  readonly changed: ReplicaLoadSample[];
  /** Replicas acknowledged before that are no longer ready (forgotten, not reported). */
  readonly gone: string[];
}

/**
 * Compares the engines' load now with what the control plane last acknowledged, per replica:
 * a different value (any field, an absent field counts as its own value) is a change, and so
 * is load becoming unknown after a known value (reported as a replica without `load`). A
 * replica never acknowledged is a change once its load is known. Load with no field at all is
 * unknown load. Pure.
 */
export function planLoadReport(
  acknowledged: ReadonlyMap<string, EngineLoadSignals | undefined>,
  samples: readonly ReplicaLoadSample[],
): LoadReportPlan {
  const changed: ReplicaLoadSample[] = [];
  const seen = new Set<string>();
  for (const sample of samples) {
    seen.add(sample.replicaId);
    const load = knownLoad(sample.load);
    const before = acknowledged.get(sample.replicaId);
    const isChange = acknowledged.has(sample.replicaId)
      ? !sameLoad(before, load)
      : load !== undefined;
    if (isChange) changed.push(load === sample.load ? sample : { ...sample, load });
  }
  const gone = [...acknowledged.keys()].filter((id) => !seen.has(id));
  return { changed, gone };
}

/** `load` without absent fields, or undefined when it has none (unknown load). */
function knownLoad(load: EngineLoadSignals | undefined): EngineLoadSignals | undefined {
  if (load === undefined) return undefined;
  const known =
    load.running !== undefined ||
    load.waiting !== undefined ||
    load.kvCacheUsage !== undefined ||
    load.prefixCacheHitRate !== undefined ||
    load.kvCacheTokens !== undefined;
  return known ? load : undefined;
}

function sameLoad(a: EngineLoadSignals | undefined, b: EngineLoadSignals | undefined): boolean {
  if (a === undefined || b === undefined) return a === b;
  return (
    a.running === b.running &&
    a.waiting === b.waiting &&
    a.kvCacheUsage === b.kvCacheUsage &&
    a.prefixCacheHitRate === b.prefixCacheHitRate &&
    a.kvCacheTokens === b.kvCacheTokens
  );
}

/** `sample` as it goes on the wire; absent fields stay unset, unknown load leaves `load` unset. */
export function loadReportToProto(sample: ReplicaLoadSample): ReplicaLoadReport {
  const load = sample.load;
  return create(ReplicaLoadReportSchema, {
    replicaId: sample.replicaId,
    scrapedAtUnixMs: BigInt(Math.round(sample.scrapedAtMs)),
    ...(load === undefined
      ? {}
      : {
          load: create(EngineLoadSchema, engineLoadToProto(load)),
        }),
  });
}

/**
 * Sends engine load to the control plane between heartbeats, so that routers see it within a
 * second rather than with the next heartbeat. Call {@link reportChanges} after every scrape
 * round: it sends the replicas whose load changed since the control plane last acknowledged
 * it, or nothing when none did.
 *
 * While the control plane offers streams (`HeartbeatResponse.load_stream_ms` > 0) reports go
 * as messages of one long-lived `StreamLoad` request, ended and opened again every
 * `load_stream_ms`: a control plane of 1,000 agents reporting twice a second spends a quarter
 * of the CPU a unary call each costs (bench/control-plane). A report written to the open
 * stream counts as acknowledged; when the stream fails, everything is sent again on the next
 * one. A control plane that answers the stream `Unimplemented` gets unary `ReportLoad` calls
 * until the channel registers again. Otherwise, and with `load_stream_ms` 0, each report is
 * one `ReportLoad` call:
 *
 * At most one report is in flight. A round that ends while one is in flight is folded into
 * one more report sent when it returns (with the load of that moment), so a slow control
 * plane gets reports back to back, never side by side. A failed report is not retried on its
 * own: the next round sends its changes again, since they were never acknowledged. Failures
 * are logged once per streak. `Unimplemented` stops reports until the channel registers
 * again; a refused credential is left to the heartbeat path, which re-registers. Heartbeats
 * carry load as before, so a control plane without ReportLoad still gets it every heartbeat.
 */
export class LoadReporter {
  #state: LoadReporterState = "active";
  /** Load the control plane acknowledged, by replica; undefined = reported as unknown. */
  readonly #acknowledged = new Map<string, EngineLoadSignals | undefined>();
  /** The sink's registration count that {@link #acknowledged} belongs to. */
  #registration: number;
  #inFlight: Promise<void> | undefined;
  /** A round ended while a report was in flight. */
  #again = false;
  /** Failed reports since the last one that went through. */
  #failures = 0;
  #intervalMs: number;
  readonly #abort = new AbortController();
  /** The open `StreamLoad` request and its end timer. */
  #stream: { writer: LoadStream; timer: NodeJS.Timeout } | undefined;
  /** The control plane answered `StreamLoad` `Unimplemented` in this registration. */
  #streamsRefused = false;

  constructor(private readonly options: LoadReporterOptions) {
    this.#registration = options.sink.registrations;
    this.#intervalMs = options.intervalMs;
  }

  get state(): LoadReporterState {
    return this.#state;
  }

  /** The load interval in force: the agent's own, or the one the control plane asked for. */
  get intervalMs(): number {
    return this.#intervalMs;
  }

  /** Sends what changed since the last acknowledged report (nothing when nothing did). */
  reportChanges(): void {
    if (this.#state === "closed") return;
    if (this.#inFlight !== undefined) {
      this.#again = true;
      return;
    }
    const { sink } = this.options;
    if (sink.registrations !== this.#registration) {
      // A new credential, maybe a new control plane: it has been told nothing yet.
      this.#registration = sink.registrations;
      this.#acknowledged.clear();
      this.#streamsRefused = false;
      this.#endStream();
      if (this.#state === "unsupported") {
        this.#setState("active", "the agent registered again; trying ReportLoad again");
      }
    }
    if (this.#state !== "active" || sink.state !== "connected") return;
    const plan = planLoadReport(this.#acknowledged, this.options.samples());
    for (const id of plan.gone) this.#acknowledged.delete(id);
    if (plan.changed.length === 0) return;
    if (sink.loadStreamMs > 0 && !this.#streamsRefused) {
      this.#write(plan.changed, sink.loadStreamMs);
      return;
    }
    this.#endStream();
    this.#inFlight = this.#send(plan.changed).then((sent) => {
      this.#inFlight = undefined;
      const again = this.#again;
      this.#again = false;
      if (sent && again) this.reportChanges();
    });
  }

  /** Resolves when no report is in flight. */
  async idle(): Promise<void> {
    while (this.#inFlight !== undefined) await this.#inFlight;
  }

  /** Stops reporting; a report in flight, or the open stream, is cancelled. */
  async close(): Promise<void> {
    if (this.#state !== "closed") this.#setState("closed", "agent stopping");
    if (this.#stream !== undefined) clearTimeout(this.#stream.timer);
    this.#stream = undefined;
    this.#abort.abort();
    await this.idle();
  }

  /** Writes `changed` to the open stream, opening one first when none is. */
  #write(changed: readonly ReplicaLoadSample[], streamMs: number): void {
    let stream = this.#stream;
    if (stream === undefined) {
      let writer: LoadStream;
      try {
        writer = this.options.sink.openLoadStream(this.#abort.signal);
      } catch (error) {
        this.#failed(ConnectError.from(error), this.#registration);
        return;
      }
      // Ended after streamMs even when no report comes (an idle stream would otherwise run
      // into the control listener's request timeout).
      const timer = setTimeout(() => {
        if (this.#stream?.writer === writer) this.#endStream();
      }, streamMs);
      timer.unref?.();
      stream = { writer, timer };
      this.#stream = stream;
      this.#watch(writer, this.#registration);
    }
    if (!stream.writer.write(changed.map(loadReportToProto))) return;
    for (const sample of changed) this.#acknowledged.set(sample.replicaId, sample.load);
  }

  /** Ends the open stream (its answer is handled by {@link #watch}); the next round opens one. */
  #endStream(): void {
    const stream = this.#stream;
    if (stream === undefined) return;
    this.#stream = undefined;
    clearTimeout(stream.timer);
    void stream.writer.end().catch(() => {});
  }

  /** Follows how `writer`'s call ends: its answer, or a failure that voids what it carried. */
  #watch(writer: LoadStream, registration: number): void {
    writer.done.then(
      (response) => {
        if (this.#state === "closed") return;
        if (this.#failures > 0) {
          this.options.logger.info(`load reports go through again after ${this.#failures} failed`);
          this.#failures = 0;
        }
        this.#follow(response.loadIntervalMs);
      },
      (error: unknown) => {
        if (this.#stream?.writer === writer) {
          clearTimeout(this.#stream.timer);
          this.#stream = undefined;
        }
        if (this.#state === "closed") return;
        // Some of what it carried may never have arrived: the next round sends everything.
        if (registration === this.#registration) this.#acknowledged.clear();
        const err = ConnectError.from(error);
        if (err.code === Code.Unimplemented) {
          if (registration === this.options.sink.registrations && !this.#streamsRefused) {
            this.#streamsRefused = true;
            this.options.logger.warn(
              "the control plane does not serve StreamLoad: load reports go as one ReportLoad call each until the agent registers again",
            );
          }
          return;
        }
        this.#failed(err, registration);
      },
    );
  }

  /** One report; true when the control plane acknowledged it. */
  async #send(changed: readonly ReplicaLoadSample[]): Promise<boolean> {
    const registration = this.#registration;
    let response: ReportLoadResponse;
    try {
      response = await this.options.sink.reportLoad(
        changed.map(loadReportToProto),
        this.#abort.signal,
      );
    } catch (error) {
      this.#failed(ConnectError.from(error), registration);
      return false;
    }
    if (this.#state === "closed") return false;
    // Acknowledged by the control plane the credential belongs to; after a new Register the
    // next round starts over anyway.
    if (registration === this.#registration) {
      for (const sample of changed) this.#acknowledged.set(sample.replicaId, sample.load);
    }
    if (this.#failures > 0) {
      this.options.logger.info(`load reports go through again after ${this.#failures} failed`);
      this.#failures = 0;
    }
    this.#follow(response.loadIntervalMs);
    return true;
  }

  #failed(error: ConnectError, registration: number): void {
    if (this.#state === "closed") return;
    if (error.code === Code.Unimplemented) {
      // Unless the channel registered meanwhile: that control plane may well serve it.
      if (registration === this.options.sink.registrations) {
        this.#setState(
          "unsupported",
          "the control plane does not serve ReportLoad (an older version): engine load goes with heartbeats only until the agent registers again",
        );
      }
      return;
    }
    this.#failures += 1;
    if (this.#failures > 1) return;
    const refused = error.code === Code.Unauthenticated || error.code === Code.NotFound;
    this.options.logger.warn(
      refused
        ? "the control plane refused a load report's credential; the heartbeat registers again, engine load goes with heartbeats meanwhile"
        : "load report failed; engine load goes with heartbeats until reports go through again",
      { code: Code[error.code], error: error.rawMessage },
    );
  }

  /** Follows the interval the control plane asks for (0: the agent's own). */
  #follow(askedMs: number): void {
    const next =
      askedMs === 0
        ? this.options.intervalMs
        : Math.min(MAX_LOAD_INTERVAL_MS, Math.max(MIN_LOAD_INTERVAL_MS, askedMs));
    if (next === this.#intervalMs) return;
    this.#intervalMs = next;
    this.options.logger.info(
      `load interval now ${next} ms (${askedMs === 0 ? "the agent's own" : "asked by the control plane"})`,
    );
    this.options.onInterval?.(next);
  }

  #setState(next: LoadReporterState, reason: string): void {
    const from = this.#state;
    this.#state = next;
    const log = next === "unsupported" ? this.options.logger.warn : this.options.logger.info;
    log.call(this.options.logger, `load reporter ${from} → ${next}: ${reason}`);
  }
}
