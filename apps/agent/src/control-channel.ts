import { randomUUID } from "node:crypto";
import { create } from "@bufbuild/protobuf";
import { type Client, Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import { createWritableIterable } from "@connectrpc/connect/protocol";
import { createConnectTransport } from "@connectrpc/connect-node";
import {
  AgentService,
  type EngineCredential,
  type GpuReading,
  type HeartbeatRequest,
  HeartbeatRequestSchema,
  type HeartbeatResponse,
  type NodeInventory,
  type Port,
  type Problem,
  RegisterRequestSchema,
  type ReplicaLoadReport,
  type ReplicaStatus,
  ReportLoadRequestSchema,
  type ReportLoadResponse,
  SetLeavingRequestSchema,
  type SetLeavingResponse,
  type StreamHeartbeatRequest,
  StreamHeartbeatRequestSchema,
  type StreamHeartbeatResponse,
  type StreamLoadRequest,
  StreamLoadRequestSchema,
  type StreamLoadResponse,
} from "@llmgw/proto";
import { type Clock, systemClock } from "@llmgw/supervisor";
import { createFailoverTransport, splitControlPlaneUrls } from "@llmgw/wire";
import { loadIdentity, type NodeIdentity, saveIdentity } from "./identity.js";

/** The agent's view of its connection to the control plane. */
export type ChannelState = "registering" | "connected" | "reconnecting" | "stopped";

/** What the channel asks of the rest of the agent on every beat. */
export interface ChannelHooks {
  /** Inventory sent at registration (hardware). */
  inventory(): Promise<NodeInventory>;
  /** Live state sent with every heartbeat (and the replicas and engine keys at registration). */
  snapshot(): Promise<{
    gpus: GpuReading[];
    replicas: ReplicaStatus[];
    problems: Problem[];
    /** API keys of the serving engines running now; absent = none. */
    engineCredentials?: EngineCredential[];
    /** Live state and health of the node's RDMA ports; absent = not read. */
    ports?: Port[];
  }>;
  /**
   * The node's full desired set, delivered once per generation: after the first heartbeat
   * following each Register, and after every heartbeat whose generation differs from the one
   * last applied. A rejection is retried on the next heartbeat (the generation is not
   * recorded as applied).
   */
  applyDesired(response: HeartbeatResponse): Promise<void>;
  /** Called on every state change, with the reason. */
  onState?(state: ChannelState, detail: string): void;
  /**
   * Called after every heartbeat that got through (answered, or taken by the heartbeat
   * stream), once its desired set is applied; must not block (the next beat waits for it).
   */
  onHeartbeat?(): void;
}

export interface ControlChannelOptions {
  readonly controlPlaneUrl: string;
  readonly joinToken: string;
  readonly stateDir: string;
  readonly advertiseAddress: string;
  /**
   * First reconnect delay; doubles up to `maxBackoffMs`. Each wait is the delay times a
   * jitter factor in [0.5, 1.5), and never longer than `maxBackoffMs`.
   */
  readonly initialBackoffMs: number;
  /** Longest wait between reconnect attempts (jitter included). */
  readonly maxBackoffMs: number;
  /** Per-call deadline for Register and Heartbeat. */
  readonly callTimeoutMs: number;
  /** Default: Connect over HTTP/1.1 to `controlPlaneUrl`; tests pass an in-memory one. */
  readonly transport?: Transport;
  /** Jitter source in [0, 1); default `Math.random`. */
  readonly random?: () => number;
  /**
   * `sentAtUnixMs` of heartbeats and the timers of the heartbeat interval and the backoff;
   * default the system clock. Tests pass a manual clock and see every wait as a timer.
   * (Per-call deadlines, `callTimeoutMs`, stay on Connect's own timers.)
   */
  readonly clock?: Clock;
  /**
   * Shortest time between the start of one heartbeat and a heartbeat hurried by
   * {@link ControlChannel.beatSoon}; default {@link MIN_HURRIED_BEAT_SPACING_MS}.
   */
  readonly minHurriedBeatSpacingMs?: number;
}

/**
 * Default of {@link ControlChannelOptions.minHurriedBeatSpacingMs}: a stream of kernel-log
 * faults or port changes sends at most four heartbeats a second, not one per event, and each
 * heartbeat whose health changed makes the control plane reconcile.
 */
export const MIN_HURRIED_BEAT_SPACING_MS = 250;

/**
 * One open client-streaming request ({@link ControlChannel.openLoadStream}, the channel's own
 * heartbeat stream): each item written goes out as one message as soon as the one before it
 * went, and the control plane takes each as it arrives.
 */
export interface ReportStream<T, R> {
  /**
   * Queues one item; false when it was not taken: the stream has ended, or items are backing
   * up (two still wait for the socket), so the caller keeps or resends it another way.
   */
  write(item: T): boolean;
  /** Ends the request; the answer comes once the control plane has taken every item. */
  end(): Promise<R>;
  /** Settles when the call ends, however it ends: the answer, or the call's error. */
  readonly done: Promise<R>;
}

/** An open `StreamLoad` request: one load report per write. */
export type LoadStream = ReportStream<readonly ReplicaLoadReport[], StreamLoadResponse>;

/** Items queued on a {@link ReportStream} at most (not yet taken by the socket). */
const REPORT_STREAM_QUEUE = 2;

/** Opens one client-streaming call through `call`, each item made a message by `toMessage`. */
function openReportStream<T, M, R>(
  call: (requests: AsyncIterable<M>) => Promise<R>,
  toMessage: (item: T) => M,
): ReportStream<T, R> {
  const requests = createWritableIterable<M>();
  let ended = false;
  /** Items written but not yet taken by the call. */
  let waiting = 0;
  const done = call(requests);
  // Marks the stream ended however the call ends; the caller reads `done` itself.
  done
    .finally(() => {
      ended = true;
      requests.close();
    })
    .catch(() => {});
  const taken = () => {
    waiting -= 1;
  };
  return {
    write(item) {
      if (ended || waiting >= REPORT_STREAM_QUEUE) return false;
      waiting += 1;
      requests.write(toMessage(item)).then(taken, taken);
      return true;
    },
    end() {
      ended = true;
      // What was written before still goes: the call reads the queue before it sees the end.
      requests.close();
      return done;
    },
    done,
  };
}

/** Who a stream speaks for, and how long it may take. */
type StreamIdentity = { readonly nodeId: string; readonly credential: string };
type StreamOptions = { readonly timeoutMs: number; readonly signal?: AbortSignal };

const callOptions = (identity: StreamIdentity, options: StreamOptions) => ({
  headers: { authorization: `Bearer ${identity.credential}` },
  timeoutMs: options.timeoutMs,
  ...(options.signal === undefined ? {} : { signal: options.signal }),
});

/**
 * Opens a `StreamLoad` request as `identity` on `client` (the agent's channel, and the
 * control-plane benchmark's simulated agents): each {@link LoadStream.write} becomes one
 * message, taken by the socket as soon as the one before it went.
 */
export function openLoadStream(
  client: Client<typeof AgentService>,
  identity: StreamIdentity,
  options: StreamOptions,
): LoadStream {
  return openReportStream(
    (requests: AsyncIterable<StreamLoadRequest>) =>
      client.streamLoad(requests, callOptions(identity, options)),
    (replicas: readonly ReplicaLoadReport[]) =>
      create(StreamLoadRequestSchema, { nodeId: identity.nodeId, replicas: [...replicas] }),
  );
}

/**
 * Opens a `StreamHeartbeat` request as `identity` on `client`: each write is one heartbeat,
 * never answered (the desired set comes over {@link watchDesired}).
 */
export function openHeartbeatStream(
  client: Client<typeof AgentService>,
  identity: StreamIdentity,
  options: StreamOptions,
): ReportStream<HeartbeatRequest, StreamHeartbeatResponse> {
  return openReportStream(
    (requests: AsyncIterable<StreamHeartbeatRequest>) =>
      client.streamHeartbeat(requests, callOptions(identity, options)),
    (heartbeat: HeartbeatRequest) => create(StreamHeartbeatRequestSchema, { heartbeat }),
  );
}

/**
 * Opens a `WatchDesired` stream as `identity` on `client`: the node's desired set at once,
 * then each time it changes, until the control plane ends it (after `load_stream_ms`).
 */
export async function* watchDesired(
  client: Client<typeof AgentService>,
  identity: StreamIdentity,
  generationSeen: bigint,
  options: StreamOptions,
): AsyncGenerator<HeartbeatResponse> {
  const answers = client.watchDesired(
    { nodeId: identity.nodeId, generationSeen },
    callOptions(identity, options),
  );
  for await (const { desired } of answers) {
    if (desired === undefined) {
      throw new ConnectError("WatchDesiredResponse.desired is missing", Code.Internal);
    }
    yield desired;
  }
}

/** The control plane's `llmgw-error-code` for a node id held with another credential. */
const NODE_ID_TAKEN = "LLMGW_CONTROL_PLANE_NODE_ID_TAKEN";
/** A follower's refusal: another instance leads, or will within a lease. */
const NOT_LEADER = "LLMGW_CONTROL_PLANE_NOT_LEADER";

/**
 * The agent's only link to the control plane. Agents dial out; a lost control channel never
 * stops engines — the channel just keeps retrying with jittered backoff, and the next
 * successful heartbeat converges the node on the desired set (level-triggered).
 */
export class ControlChannel {
  private readonly client: Client<typeof AgentService>;
  private readonly clock: Clock;
  private stateValue: ChannelState = "registering";
  private identity: NodeIdentity | undefined;
  /** Generation of the desired set last applied; undefined = apply the next one whatever it is. */
  private generationApplied: bigint | undefined;
  private intervalMs = 2000;
  /** `load_stream_ms` of the last heartbeat answer; 0: unary ReportLoad only. */
  private loadStreamMsValue = 0;
  private lastError: string | undefined;
  /** True while the credential in memory is not yet on disk (a failed write, e.g. disk full). */
  private identityUnsaved = false;
  /** Ends the current wait between heartbeats; set only while waiting. */
  private wake: (() => void) | undefined;
  /** A {@link beatSoon} arrived after the last heartbeat took its snapshot. */
  private beatPending = false;
  /** When the last heartbeat started (clock ms); undefined before the first. */
  private lastBeatStartedMs: number | undefined;
  /** Successful Registers in this process. */
  private registered = 0;
  /**
   * `heartbeat_streams` of the last answer: heartbeats may go on a `StreamHeartbeat` request
   * while a `WatchDesired` stream brings the desired sets.
   */
  private heartbeatStreamsOffered = false;
  /** The open `StreamHeartbeat` request, the identity it speaks for and when it opened. */
  private beatStream:
    | {
        readonly stream: ReportStream<HeartbeatRequest, StreamHeartbeatResponse>;
        readonly identity: NodeIdentity;
        readonly openedAt: number;
      }
    | undefined;
  /** The running `WatchDesired` loop; `open` once its current stream has answered. */
  private watch:
    | { readonly identity: NodeIdentity; readonly abort: AbortController; open: boolean }
    | undefined;
  /** Desired sets delivered by watches: a unary answer they overtook is not applied. */
  private watchDeliveries = 0;
  /** The last desired set failed to apply: the next heartbeat is a call, to get it again. */
  private applyFailed = false;
  /** Applies desired sets one at a time (the heartbeat answers and the watch both deliver). */
  private applying: Promise<unknown> = Promise.resolve();
  /**
   * This channel's heartbeat session (`HeartbeatRequest.session_id`): a new one each time the
   * agent starts, so that the control plane can tell its heartbeats from a previous run's.
   */
  private readonly sessionId = randomUUID();
  /** Number of the last heartbeat built in this session (`HeartbeatRequest.sequence`). */
  private sequence = 0n;

  constructor(
    private readonly options: ControlChannelOptions,
    private readonly hooks: ChannelHooks,
  ) {
    const transport =
      options.transport ??
      createFailoverTransport({
        urls: splitControlPlaneUrls(options.controlPlaneUrl),
        transportFor: (baseUrl) => createConnectTransport({ baseUrl, httpVersion: "1.1" }),
      });
    this.client = createClient(AgentService, transport);
    this.clock = options.clock ?? systemClock;
  }

  get state(): ChannelState {
    return this.stateValue;
  }

  get nodeId(): string | undefined {
    return this.identity?.nodeId;
  }

  /**
   * How many times this channel has registered (0 while it runs on the identity a previous
   * agent saved): a change means a new credential, and possibly a control plane that knows
   * nothing of what was sent before.
   */
  get registrations(): number {
    return this.registered;
  }

  /**
   * Sends fresh engine load (`ReportLoad`) with the node credential, beside the heartbeats
   * and never instead of them: the call is independent of the heartbeat loop, and its
   * failures are the caller's to handle (the heartbeat path alone re-registers). Rejects with
   * `Unauthenticated` when the channel holds no credential. Deadline: `callTimeoutMs`.
   */
  reportLoad(
    replicas: readonly ReplicaLoadReport[],
    signal?: AbortSignal,
  ): Promise<ReportLoadResponse> {
    const identity = this.identity;
    if (!identity) {
      return Promise.reject(new ConnectError("not registered", Code.Unauthenticated));
    }
    return this.client.reportLoad(
      create(ReportLoadRequestSchema, { nodeId: identity.nodeId, replicas: [...replicas] }),
      {
        headers: { authorization: `Bearer ${identity.credential}` },
        timeoutMs: this.options.callTimeoutMs,
        ...(signal === undefined ? {} : { signal }),
      },
    );
  }

  /**
   * Tells the control plane this node is leaving with its engines (`leaving` true: it moves
   * the node's replicas elsewhere and drains them here) or is back (`leaving` false: ends a
   * leave this agent began). One call with the node credential, deadline `callTimeoutMs`,
   * beside the heartbeats; the transport tries each control-plane URL once. Rejects with
   * `Unauthenticated` when the channel holds no credential, `Unimplemented` from a control
   * plane older than the call.
   */
  setLeaving(leaving: boolean, signal?: AbortSignal): Promise<SetLeavingResponse> {
    const identity = this.identity;
    if (!identity) {
      return Promise.reject(new ConnectError("not registered", Code.Unauthenticated));
    }
    return this.client.setLeaving(
      create(SetLeavingRequestSchema, { leaving, nodeId: identity.nodeId }),
      callOptions(identity, {
        timeoutMs: this.options.callTimeoutMs,
        ...(signal === undefined ? {} : { signal }),
      }),
    );
  }

  /**
   * How long one `StreamLoad` request may stay open, as the last heartbeat answer said; 0
   * (also before the first heartbeat, or from an older control plane): reports go as unary
   * {@link reportLoad} calls.
   */
  get loadStreamMs(): number {
    return this.loadStreamMsValue;
  }

  /**
   * Opens a `StreamLoad` request with the node credential. Its deadline is `loadStreamMs`
   * plus `callTimeoutMs`: the caller ends it after `loadStreamMs` and opens the next. Throws
   * `Unauthenticated` when the channel holds no credential.
   */
  openLoadStream(signal?: AbortSignal): LoadStream {
    const identity = this.identity;
    if (!identity) throw new ConnectError("not registered", Code.Unauthenticated);
    return openLoadStream(this.client, identity, this.streamOptions(signal));
  }

  /** A stream's deadline: `loadStreamMs` plus `callTimeoutMs` (it is ended after the first). */
  private streamOptions(signal?: AbortSignal) {
    return {
      timeoutMs: this.loadStreamMsValue + this.options.callTimeoutMs,
      ...(signal === undefined ? {} : { signal }),
    };
  }

  /** True while heartbeats go on the heartbeat stream rather than as calls. */
  get heartbeatsStreamed(): boolean {
    return this.watch?.open === true && this.watch.identity === this.identity;
  }

  /**
   * Sends the next heartbeat now instead of at the end of the interval: a hardware fault is
   * worth an out-of-band report. Calls coalesce; one that arrives after a heartbeat took its
   * snapshot causes one more after that heartbeat (its snapshot may predate the news). A
   * hurried heartbeat starts at the earliest `minHurriedBeatSpacingMs` after the previous one
   * started, so a burst of calls costs the control plane one or two heartbeats.
   * While reconnecting, the backoff is kept (the control plane is not answering anyway), and
   * the first heartbeat that gets through carries the news.
   */
  beatSoon(): void {
    this.beatPending = true;
    this.wake?.();
  }

  /**
   * Waits the heartbeat interval, or less if {@link beatSoon} is called — but a hurried beat
   * never less than the minimum spacing after the previous heartbeat started.
   */
  private async waitForNextBeat(signal: AbortSignal): Promise<void> {
    if (!this.beatPending) {
      await sleep(this.clock, this.intervalMs, signal, (wake) => {
        this.wake = wake;
      });
      this.wake = undefined;
    }
    if (!this.beatPending || this.lastBeatStartedMs === undefined) return;
    const spacingMs = this.options.minHurriedBeatSpacingMs ?? MIN_HURRIED_BEAT_SPACING_MS;
    const waitMs = this.lastBeatStartedMs + spacingMs - this.clock.now();
    // Calls during this wait only set beatPending: they ride on the same heartbeat.
    if (waitMs > 0) await sleep(this.clock, waitMs, signal);
  }

  /** Runs until `signal` aborts. Never throws for control-plane trouble; it retries. */
  async run(signal: AbortSignal): Promise<void> {
    const saved = await loadIdentity(this.options.stateDir);
    if (saved && sameControlPlanes(saved.controlPlaneUrl, this.options.controlPlaneUrl))
      this.identity = saved;
    let backoffMs = this.options.initialBackoffMs;
    // The identity whose credential was refused: it still proves the node id at the next
    // Register, even when it never reached the state dir.
    let proof: NodeIdentity | undefined;
    // Credential refusals since the last good heartbeat.
    let refusals = 0;
    while (!signal.aborted) {
      let registering = false;
      try {
        if (!this.identity) {
          registering = true;
          await this.register(proof);
          registering = false;
          proof = undefined;
        }
        const beat = await this.heartbeat(signal);
        backoffMs = this.options.initialBackoffMs;
        refusals = 0;
        if (beat === "streamed") {
          this.setState("connected", "heartbeat sent on the heartbeat stream");
        } else {
          this.setState("connected", `heartbeat ok (generation ${beat.response.generation})`);
        }
        if (this.identityUnsaved) await this.persistIdentity();
        if (beat !== "streamed") {
          this.takeSettings(beat.response);
          // A watch answer that came while the call was out is at least as new.
          if (!beat.overtaken) await this.applySerially(beat.response);
          this.startWatch(signal);
        }
        this.hooks.onHeartbeat?.();
        await this.waitForNextBeat(signal);
      } catch (error) {
        if (signal.aborted) break;
        const err = ConnectError.from(error);
        if (!registering && (err.code === Code.Unauthenticated || err.code === Code.NotFound)) {
          // The control plane no longer knows this credential (revoked node, lost data dir):
          // join again with the join token, asking for the old id so placements can survive.
          this.setState(
            "registering",
            `control plane refused the node credential: ${err.rawMessage}`,
          );
          proof = this.identity ?? proof;
          this.identity = undefined;
          // At once the first time; a credential refused again right after its Register waits
          // out the backoff, so a control plane that keeps refusing is not asked in a loop.
          if (++refusals === 1) {
            try {
              await this.register(proof);
              proof = undefined;
              continue;
            } catch (registerError) {
              this.noteFailure(registerError);
            }
          } else {
            this.noteFailure(err);
          }
        } else {
          this.noteFailure(err);
        }
        const jittered = backoffMs * (0.5 + (this.options.random ?? Math.random)());
        await sleep(this.clock, Math.min(jittered, this.options.maxBackoffMs), signal);
        // Instances handing the lead over answer again within a lease: no growing backoff
        // for a follower's refusal, so the node is back at the new leader within a second.
        if (err.metadata.get("llmgw-error-code") !== NOT_LEADER)
          backoffMs = Math.min(backoffMs * 2, this.options.maxBackoffMs);
      }
    }
    this.watch?.abort.abort();
    void this.beatStream?.stream.end().catch(() => {});
    this.setState("stopped", "agent stopping");
  }

  /**
   * Hands a desired set to the agent unless its generation is the one already applied. The
   * control plane bumps a node's generation whenever its assignments change (seeded from its
   * clock, so a restarted control plane never repeats an old one), and the replica manager
   * keeps converging on the last set by itself (restarts, probes), so re-applying an
   * unchanged set would only redo the same comparisons every few seconds. A failed apply is
   * not a control-plane failure: the heartbeat got through, so the channel stays connected
   * and the same generation is applied again after the next heartbeat.
   */
  private async applyOnce(response: HeartbeatResponse): Promise<void> {
    if (response.generation === this.generationApplied) return;
    try {
      await this.hooks.applyDesired(response);
      this.generationApplied = response.generation;
      this.applyFailed = false;
    } catch (error) {
      this.applyFailed = true;
      this.hooks.onState?.(
        this.stateValue,
        `cannot apply desired generation ${response.generation}: ${(error as Error).message}; retrying after the next heartbeat`,
      );
    }
  }

  /** {@link applyOnce}, after every apply before it has finished. */
  private applySerially(response: HeartbeatResponse): Promise<void> {
    const applied = this.applying.then(() => this.applyOnce(response));
    this.applying = applied;
    return applied;
  }

  /** What every desired-set answer also says: the intervals and which streams to use. */
  private takeSettings(response: HeartbeatResponse): void {
    if (response.heartbeatIntervalMs > 0) this.intervalMs = response.heartbeatIntervalMs;
    this.loadStreamMsValue = response.loadStreamMs;
    this.heartbeatStreamsOffered = response.heartbeatStreams && response.loadStreamMs > 0;
  }

  /**
   * Starts watching the desired set when the control plane offers it and no watch runs for
   * the current identity. The watch opens the next stream each time one ends on time; any
   * failure ends it, heartbeats go as calls again, and the next answer starts a new one.
   */
  private startWatch(signal: AbortSignal): void {
    const identity = this.identity;
    if (!this.heartbeatStreamsOffered || !identity) return;
    if (this.watch?.identity === identity) return;
    this.watch?.abort.abort();
    const entry = { identity, abort: new AbortController(), open: false };
    this.watch = entry;
    const watchSignal = AbortSignal.any([signal, entry.abort.signal]);
    void this.runWatch(entry, watchSignal).finally(() => {
      entry.open = false;
      if (this.watch === entry) this.watch = undefined;
    });
  }

  private async runWatch(
    entry: NonNullable<ControlChannel["watch"]>,
    signal: AbortSignal,
  ): Promise<void> {
    while (!signal.aborted && this.identity === entry.identity && this.heartbeatStreamsOffered) {
      let answers = 0;
      const openedAt = this.clock.now();
      try {
        const stream = watchDesired(
          this.client,
          entry.identity,
          this.generationApplied ?? 0n,
          this.streamOptions(signal),
        );
        for await (const desired of stream) {
          answers += 1;
          entry.open = true;
          this.watchDeliveries += 1;
          this.takeSettings(desired);
          await this.applySerially(desired);
        }
      } catch (error) {
        if (!signal.aborted) {
          this.hooks.onState?.(
            this.stateValue,
            `desired-set watch ended: ${ConnectError.from(error).rawMessage}; heartbeats go as calls until the next one opens`,
          );
        }
        return;
      } finally {
        entry.open = false;
      }
      // A stream that ended without an answer, or long before its time, is not one ended on
      // time: no loop of watches; the next heartbeat call's answer starts one again.
      if (answers === 0 || this.clock.now() - openedAt < this.loadStreamMsValue / 2) return;
    }
  }

  /**
   * The heartbeat stream of the current identity, opened (again) when there is none or the
   * open one has been open `loadStreamMs`.
   */
  private heartbeatStream(identity: NodeIdentity, signal: AbortSignal) {
    const now = this.clock.now();
    const open = this.beatStream;
    if (open && (open.identity !== identity || now - open.openedAt >= this.loadStreamMsValue)) {
      this.beatStream = undefined;
      void open.stream.end().catch(() => {});
    }
    if (!this.beatStream) {
      const entry = {
        stream: openHeartbeatStream(this.client, identity, this.streamOptions(signal)),
        identity,
        openedAt: now,
      };
      this.beatStream = entry;
      entry.stream.done.then(
        () => {
          if (this.beatStream === entry) this.beatStream = undefined;
        },
        (error: unknown) => {
          if (this.beatStream === entry) this.beatStream = undefined;
          if (signal.aborted) return;
          // What it carried may be lost: the next heartbeat goes as a call, now.
          this.hooks.onState?.(
            this.stateValue,
            `heartbeat stream failed: ${ConnectError.from(error).rawMessage}; sending the next heartbeat as a call`,
          );
          this.watch?.abort.abort();
          this.beatSoon();
        },
      );
    }
    return this.beatStream.stream;
  }

  private noteFailure(error: unknown): void {
    const err = ConnectError.from(error);
    const detail =
      err.metadata.get("llmgw-error-code") === NODE_ID_TAKEN
        ? // Only an operator can fix this; engines keep running and the agent keeps asking.
          `the control plane refused to re-join this node (${NODE_ID_TAKEN}): ${err.rawMessage}. Engines keep running; retrying with backoff (at most every ${formatMs(this.options.maxBackoffMs)})`
        : err.code === Code.Unavailable || err.code === Code.Unknown || err.code === Code.Internal
          ? `cannot reach the control plane at ${this.options.controlPlaneUrl}: ${err.rawMessage}`
          : `control plane error (${Code[err.code]}): ${err.rawMessage}`;
    if (detail !== this.lastError || this.stateValue !== "reconnecting") {
      this.lastError = detail;
      this.setState(this.identity ? "reconnecting" : "registering", detail);
    }
  }

  private async register(previous: NodeIdentity | undefined): Promise<void> {
    this.setState("registering", `registering with ${this.options.controlPlaneUrl}`);
    const [inventory, snapshot] = await Promise.all([
      this.hooks.inventory(),
      this.hooks.snapshot(),
    ]);
    // The id and the credential that proves it travel together: the control plane refuses
    // to hand a held id to a caller that has only the join token.
    const proof = previous ?? (await loadIdentity(this.options.stateDir));
    const response = await this.client.register(
      create(RegisterRequestSchema, {
        inventory,
        previousNodeId: proof?.nodeId,
        previousNodeCredential: proof?.credential,
        advertiseAddress: this.options.advertiseAddress,
        replicas: snapshot.replicas,
        engineCredentials: snapshot.engineCredentials ?? [],
      }),
      {
        headers: { authorization: `Bearer ${this.options.joinToken}` },
        timeoutMs: this.options.callTimeoutMs,
      },
    );
    this.identity = {
      nodeId: response.nodeId,
      credential: response.nodeCredential,
      controlPlaneUrl: this.options.controlPlaneUrl,
    };
    this.registered += 1;
    if (response.heartbeatIntervalMs > 0) this.intervalMs = response.heartbeatIntervalMs;
    // A (possibly new) node: its first desired set is applied whatever its generation.
    this.generationApplied = undefined;
    this.identityUnsaved = true;
    await this.persistIdentity();
  }

  /**
   * Writes the issued identity to the state dir. The control plane has already rotated the
   * credential, so a failed write must not throw the new one away: the agent keeps using it
   * and writes again after every heartbeat until the write succeeds — otherwise the next agent
   * start would present a credential the control plane no longer accepts.
   */
  private async persistIdentity(): Promise<void> {
    if (!this.identity) return;
    try {
      await saveIdentity(this.options.stateDir, this.identity);
      this.identityUnsaved = false;
    } catch (error) {
      this.hooks.onState?.(
        this.stateValue,
        `cannot save the node credential in ${this.options.stateDir} (${(error as NodeJS.ErrnoException).code ?? (error as Error).message}); keeping it in memory and retrying after each heartbeat`,
      );
    }
  }

  /**
   * Sends one heartbeat: on the heartbeat stream while a watch is open (then nothing answers
   * it), else as a `Heartbeat` call. `overtaken`: a watch delivered a desired set while the
   * call was out.
   */
  private async heartbeat(
    signal: AbortSignal,
  ): Promise<"streamed" | { response: HeartbeatResponse; overtaken: boolean }> {
    const identity = this.identity;
    if (!identity) throw new ConnectError("not registered", Code.Unauthenticated);
    // This snapshot carries whatever news a beatSoon so far announced.
    this.beatPending = false;
    this.lastBeatStartedMs = this.clock.now();
    const snapshot = await this.hooks.snapshot();
    const request = create(HeartbeatRequestSchema, {
      nodeId: identity.nodeId,
      generationSeen: this.generationApplied ?? 0n,
      gpus: snapshot.gpus,
      replicas: snapshot.replicas,
      problems: snapshot.problems,
      engineCredentials: snapshot.engineCredentials ?? [],
      ports: snapshot.ports ?? [],
      sentAtUnixMs: BigInt(Math.round(this.clock.now())),
      // Heartbeats go on calls and on streams, one at a time from here but not necessarily
      // arriving so: the number lets the control plane leave an older one untaken.
      sessionId: this.sessionId,
      sequence: ++this.sequence,
    });
    if (
      this.heartbeatsStreamed &&
      !this.applyFailed &&
      this.heartbeatStream(identity, signal).write(request)
    ) {
      return "streamed";
    }
    const deliveries = this.watchDeliveries;
    const response = await this.client.heartbeat(request, {
      headers: { authorization: `Bearer ${identity.credential}` },
      timeoutMs: this.options.callTimeoutMs,
    });
    return { response, overtaken: this.watchDeliveries !== deliveries };
  }

  private setState(state: ChannelState, detail: string): void {
    const changed = state !== this.stateValue;
    this.stateValue = state;
    if (changed || state !== "connected") this.hooks.onState?.(state, detail);
  }
}

const formatMs = (ms: number) => (ms >= 1_000 ? `${ms / 1_000} s` : `${ms} ms`);

/**
 * Resolves after `ms` on `clock`, on abort, or when the function handed to `onWake` is called.
 */
function sleep(
  clock: Clock,
  ms: number,
  signal: AbortSignal,
  onWake?: (wake: () => void) => void,
): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const timer = clock.setTimer(done, ms);
    onWake?.(done);
    function done() {
      timer.cancel();
      signal.removeEventListener("abort", done);
      resolve();
    }
    signal.addEventListener("abort", done, { once: true });
  });
}

/**
 * Whether an identity saved for `saved` (a URL or a list) belongs to the cluster `current`
 * names: they share an instance, so adding a control-plane instance to the list keeps the
 * node's identity.
 */
function sameControlPlanes(saved: string, current: string): boolean {
  const now = new Set(splitControlPlaneUrls(current));
  return splitControlPlaneUrls(saved).some((u) => now.has(u));
}
