import { create } from "@bufbuild/protobuf";
import { type Client, Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import { createWritableIterable } from "@connectrpc/connect/protocol";
import { createConnectTransport } from "@connectrpc/connect-node";
import {
  AgentService,
  type EngineCredential,
  type GpuReading,
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
  type StreamLoadRequest,
  StreamLoadRequestSchema,
  type StreamLoadResponse,
} from "@llmgw/proto";
import { type Clock, systemClock } from "@llmgw/supervisor";
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
 * One open `StreamLoad` request ({@link ControlChannel.openLoadStream}): reports written to it
 * go out as they are written, and the control plane applies each as it arrives.
 */
export interface LoadStream {
  /**
   * Queues one report; false when it was not taken: the stream has ended, or reports are
   * backing up (two still wait for the socket), so the caller keeps them for a later round.
   */
  write(replicas: readonly ReplicaLoadReport[]): boolean;
  /** Ends the request; the answer comes once the control plane has applied every report. */
  end(): Promise<StreamLoadResponse>;
  /** Settles when the call ends, however it ends: the answer, or the call's error. */
  readonly done: Promise<StreamLoadResponse>;
}

/** Reports queued on a {@link LoadStream} at most (not yet taken by the socket). */
const LOAD_STREAM_QUEUE = 2;

/**
 * Opens a `StreamLoad` request as `identity` on `client` (the agent's channel, and the
 * control-plane benchmark's simulated agents): each {@link LoadStream.write} becomes one
 * message, taken by the socket as soon as the one before it went.
 */
export function openLoadStream(
  client: Client<typeof AgentService>,
  identity: { readonly nodeId: string; readonly credential: string },
  options: { readonly timeoutMs: number; readonly signal?: AbortSignal },
): LoadStream {
  const requests = createWritableIterable<StreamLoadRequest>();
  let ended = false;
  /** Reports written but not yet taken by the call. */
  let waiting = 0;
  const done = client.streamLoad(requests, {
    headers: { authorization: `Bearer ${identity.credential}` },
    timeoutMs: options.timeoutMs,
    ...(options.signal === undefined ? {} : { signal: options.signal }),
  });
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
    write(replicas) {
      if (ended || waiting >= LOAD_STREAM_QUEUE) return false;
      waiting += 1;
      requests
        .write(
          create(StreamLoadRequestSchema, { nodeId: identity.nodeId, replicas: [...replicas] }),
        )
        .then(taken, taken);
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

/** The control plane's `llmgw-error-code` for a node id held with another credential. */
const NODE_ID_TAKEN = "LLMGW_CONTROL_PLANE_NODE_ID_TAKEN";

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

  constructor(
    private readonly options: ControlChannelOptions,
    private readonly hooks: ChannelHooks,
  ) {
    const transport =
      options.transport ??
      createConnectTransport({ baseUrl: options.controlPlaneUrl, httpVersion: "1.1" });
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
    return openLoadStream(this.client, identity, {
      timeoutMs: this.loadStreamMsValue + this.options.callTimeoutMs,
      ...(signal === undefined ? {} : { signal }),
    });
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
    if (saved && saved.controlPlaneUrl === this.options.controlPlaneUrl) this.identity = saved;
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
        const response = await this.heartbeat();
        backoffMs = this.options.initialBackoffMs;
        refusals = 0;
        this.setState("connected", `heartbeat ok (generation ${response.generation})`);
        if (this.identityUnsaved) await this.persistIdentity();
        if (response.heartbeatIntervalMs > 0) this.intervalMs = response.heartbeatIntervalMs;
        this.loadStreamMsValue = response.loadStreamMs;
        await this.applyOnce(response);
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
        backoffMs = Math.min(backoffMs * 2, this.options.maxBackoffMs);
      }
    }
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
    } catch (error) {
      this.hooks.onState?.(
        this.stateValue,
        `cannot apply desired generation ${response.generation}: ${(error as Error).message}; retrying after the next heartbeat`,
      );
    }
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

  private async heartbeat(): Promise<HeartbeatResponse> {
    const identity = this.identity;
    if (!identity) throw new ConnectError("not registered", Code.Unauthenticated);
    // This snapshot carries whatever news a beatSoon so far announced.
    this.beatPending = false;
    this.lastBeatStartedMs = this.clock.now();
    const snapshot = await this.hooks.snapshot();
    return this.client.heartbeat(
      create(HeartbeatRequestSchema, {
        nodeId: identity.nodeId,
        generationSeen: this.generationApplied ?? 0n,
        gpus: snapshot.gpus,
        replicas: snapshot.replicas,
        problems: snapshot.problems,
        engineCredentials: snapshot.engineCredentials ?? [],
        ports: snapshot.ports ?? [],
        sentAtUnixMs: BigInt(Math.round(this.clock.now())),
      }),
      {
        headers: { authorization: `Bearer ${identity.credential}` },
        timeoutMs: this.options.callTimeoutMs,
      },
    );
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
