import { create } from "@bufbuild/protobuf";
import { type Client, Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
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
  type ReplicaStatus,
} from "@llmgw/proto";
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
  /** The node's full desired set, delivered after every successful heartbeat. */
  applyDesired(response: HeartbeatResponse): Promise<void>;
  /** Called on every state change, with the reason. */
  onState?(state: ChannelState, detail: string): void;
}

export interface ControlChannelOptions {
  readonly controlPlaneUrl: string;
  readonly joinToken: string;
  readonly stateDir: string;
  readonly advertiseAddress: string;
  /** First reconnect delay; doubles up to `maxBackoffMs`, with ±50% jitter. */
  readonly initialBackoffMs: number;
  readonly maxBackoffMs: number;
  /** Per-call deadline for Register and Heartbeat. */
  readonly callTimeoutMs: number;
  /** Default: Connect over HTTP/1.1 to `controlPlaneUrl`; tests pass an in-memory one. */
  readonly transport?: Transport;
  /** Jitter source in [0, 1); default `Math.random`. */
  readonly random?: () => number;
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
  private stateValue: ChannelState = "registering";
  private identity: NodeIdentity | undefined;
  private generationSeen = 0n;
  private intervalMs = 2000;
  private lastError: string | undefined;
  /** True while the credential in memory is not yet on disk (a failed write, e.g. disk full). */
  private identityUnsaved = false;
  /** Ends the current wait between heartbeats; set only while waiting. */
  private wake: (() => void) | undefined;
  /** A {@link beatSoon} arrived while a heartbeat was in flight: send another right after. */
  private beatPending = false;

  constructor(
    private readonly options: ControlChannelOptions,
    private readonly hooks: ChannelHooks,
  ) {
    const transport =
      options.transport ??
      createConnectTransport({ baseUrl: options.controlPlaneUrl, httpVersion: "1.1" });
    this.client = createClient(AgentService, transport);
  }

  get state(): ChannelState {
    return this.stateValue;
  }

  get nodeId(): string | undefined {
    return this.identity?.nodeId;
  }

  /**
   * Sends the next heartbeat now instead of at the end of the interval: a hardware fault is
   * worth an out-of-band report. Calls coalesce; one that arrives while a heartbeat is in
   * flight causes one more right after it (that heartbeat's snapshot may predate the news).
   * While reconnecting, the backoff is kept (the control plane is not answering anyway).
   */
  beatSoon(): void {
    if (this.wake) this.wake();
    else this.beatPending = true;
  }

  /** Waits the heartbeat interval, or less if {@link beatSoon} is called. */
  private async waitForNextBeat(signal: AbortSignal): Promise<void> {
    if (this.beatPending) {
      this.beatPending = false;
      return;
    }
    await sleep(this.intervalMs, signal, (wake) => {
      this.wake = wake;
    });
    this.wake = undefined;
    this.beatPending = false;
  }

  /** Runs until `signal` aborts. Never throws for control-plane trouble; it retries. */
  async run(signal: AbortSignal): Promise<void> {
    const saved = await loadIdentity(this.options.stateDir);
    if (saved && saved.controlPlaneUrl === this.options.controlPlaneUrl) this.identity = saved;
    let backoffMs = this.options.initialBackoffMs;
    while (!signal.aborted) {
      try {
        if (!this.identity) await this.register(this.identity);
        const response = await this.heartbeat();
        backoffMs = this.options.initialBackoffMs;
        this.setState("connected", `heartbeat ok (generation ${response.generation})`);
        if (this.identityUnsaved) await this.persistIdentity();
        await this.hooks.applyDesired(response);
        this.generationSeen = response.generation;
        if (response.heartbeatIntervalMs > 0) this.intervalMs = response.heartbeatIntervalMs;
        await this.waitForNextBeat(signal);
      } catch (error) {
        if (signal.aborted) break;
        const err = ConnectError.from(error);
        if (err.code === Code.Unauthenticated || err.code === Code.NotFound) {
          // The control plane no longer knows this credential (revoked node, lost data dir):
          // join again with the join token, keeping the old id so placements can survive.
          this.setState(
            "registering",
            `control plane refused the node credential: ${err.rawMessage}`,
          );
          const previous = this.identity;
          this.identity = undefined;
          try {
            await this.register(previous);
            continue;
          } catch (registerError) {
            this.noteFailure(registerError);
          }
        } else {
          this.noteFailure(err);
        }
        const jittered = backoffMs * (0.5 + (this.options.random ?? Math.random)());
        await sleep(jittered, signal);
        backoffMs = Math.min(backoffMs * 2, this.options.maxBackoffMs);
      }
    }
    this.setState("stopped", "agent stopping");
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
    if (response.heartbeatIntervalMs > 0) this.intervalMs = response.heartbeatIntervalMs;
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
    const snapshot = await this.hooks.snapshot();
    return this.client.heartbeat(
      create(HeartbeatRequestSchema, {
        nodeId: identity.nodeId,
        generationSeen: this.generationSeen,
        gpus: snapshot.gpus,
        replicas: snapshot.replicas,
        problems: snapshot.problems,
        engineCredentials: snapshot.engineCredentials ?? [],
        ports: snapshot.ports ?? [],
        sentAtUnixMs: BigInt(Date.now()),
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

/** Resolves after `ms`, on abort, or when the function handed to `onWake` is called. */
function sleep(
  ms: number,
  signal: AbortSignal,
  onWake?: (wake: () => void) => void,
): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const timer = setTimeout(done, ms);
    onWake?.(done);
    function done() {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    }
    signal.addEventListener("abort", done, { once: true });
  });
}
