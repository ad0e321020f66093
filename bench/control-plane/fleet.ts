/**
 * A fleet of lightweight simulated agents in one process: each registers its own simulated
 * inventory with the join token and then heartbeats on its own schedule with GPU readings
 * and a READY status for every replica rank the control plane assigned it. No engines run;
 * the point is the control plane's ingest cost and latency, with the wire traffic of a real
 * agent (`apps/agent/src/control-channel.ts`: Connect over HTTP/1.1, binary protobuf).
 */
import { Agent as HttpAgent } from "node:http";
import { performance } from "node:perf_hooks";
import { create } from "@bufbuild/protobuf";
import { type Client, Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import {
  type LoadStream,
  openHeartbeatStream,
  openLoadStream,
  type ReportStream,
  watchDesired,
} from "@llmgw/agent";
import { type NodeInventory as PlainInventory, simulateInventory } from "@llmgw/discovery";
import {
  AgentService,
  EngineLoadSchema,
  type HeartbeatRequest,
  HeartbeatRequestSchema,
  type HeartbeatResponse,
  type NodeInventory,
  type ReplicaAssignment,
  type ReplicaLoadReport,
  ReplicaLoadReportSchema,
  ReplicaState,
  type ReplicaStatus,
  ReplicaStatusSchema,
} from "@llmgw/proto";
import { gpuReadingToProto, inventoryToProto } from "@llmgw/wire";

/** Options of {@link Fleet}. */
export interface FleetOptions {
  /** The control listener, e.g. "http://127.0.0.1:7070". */
  readonly controlUrl: string;
  readonly joinToken: string;
  readonly agents: number;
  /** Simulated inventory of every node, e.g. "8xh100-80g@ib-a". */
  readonly simSpec: string;
  /** Shared Connect transports (each with its own keep-alive socket pool). Default 4. */
  readonly transports?: number;
  /** Sockets per transport. Default 64. */
  readonly socketsPerTransport?: number;
  /**
   * The address every agent advertises (engines are reached at it). Default each agent's own
   * 10.x.y.z, which nothing answers; `127.0.0.1` with {@link apiPort} sends routed traffic to a
   * real server on this machine.
   */
  readonly advertiseAddress?: string;
  /** The API port every rank reports (default 40 000 + its index on the node). */
  readonly apiPort?: number;
}

/** How load reports travel while the load churns (see {@link Fleet.churnLoad}). */
export type LoadVia = "stream" | "unary";

/**
 * How heartbeats travel ({@link Fleet.heartbeatsVia}): "stream" as an agent sends them when
 * the control plane offers it (messages of one StreamHeartbeat request, desired sets from
 * WatchDesired), "unary" one Heartbeat call each.
 */
export type HeartbeatsVia = "stream" | "unary";

/** Engine load as an agent reports it (ReportLoad and heartbeats). */
interface Load {
  running: number;
  waiting: number;
  kvCacheUsage: number;
  prefixCacheHitRate: number;
}
const IDLE: Load = { running: 0, waiting: 0, kvCacheUsage: 0, prefixCacheHitRate: 0 };

/** One simulated node. */
class SimAgent {
  readonly index: number;
  readonly hostname: string;
  readonly plain: PlainInventory;
  readonly inventory: NodeInventory;
  readonly client: Client<typeof AgentService>;
  nodeId = "";
  credential = "";
  generation = 0n;
  assignments: readonly ReplicaAssignment[] = [];
  /** Cleared to stop this agent's heartbeats (a node that went silent). */
  running = false;
  timer: NodeJS.Timeout | undefined;
  beats = 0;
  /** First time each rank was seen, so `startedAt` stays stable across heartbeats. */
  readonly #since = new Map<string, number>();
  /** Each replica's current engine load (rank 0), while the load churns. */
  readonly load = new Map<string, Load>();
  loadTimer: NodeJS.Timeout | undefined;
  /** The open StreamLoad request while the load churns over streams, and when it opened. */
  loadStream: { writer: LoadStream; openedAt: number } | undefined;
  /** `load_stream_ms` of the last heartbeat answer. */
  loadStreamMs = 0;
  /** `heartbeat_streams` of the last heartbeat answer. */
  heartbeatStreams = false;
  /** The open StreamHeartbeat request and when it opened. */
  beatStream: { writer: ReportStream<HeartbeatRequest, unknown>; openedAt: number } | undefined;
  /** The running WatchDesired loop; `open` once its stream answered. */
  watch: { abort: AbortController; open: boolean } | undefined;
  readonly #apiPort: number | undefined;

  constructor(
    index: number,
    simSpec: string,
    client: Client<typeof AgentService>,
    apiPort?: number,
  ) {
    this.#apiPort = apiPort;
    this.index = index;
    this.hostname = `n${String(index).padStart(4, "0")}`;
    this.plain = simulateInventory(simSpec, {
      hostname: this.hostname,
      addresses: [`10.${(index >> 16) & 255}.${(index >> 8) & 255}.${index & 255}`],
    });
    this.inventory = inventoryToProto(this.plain);
    this.client = client;
  }

  /** Replica statuses the way a converged agent reports them: every rank READY. */
  statuses(now: number): ReplicaStatus[] {
    return this.assignments.map((a, i) => {
      const key = `${a.replicaId}#${a.rank}`;
      let since = this.#since.get(key);
      if (since === undefined) {
        since = now;
        this.#since.set(key, since);
      }
      return create(ReplicaStatusSchema, {
        replicaId: a.replicaId,
        rank: a.rank,
        state: ReplicaState.READY,
        pid: 100_000 + this.index * 16 + i,
        apiPort: this.#apiPort ?? 40_000 + i,
        startedAtUnixMs: BigInt(since),
        stateSinceUnixMs: BigInt(since),
        revision: a.deployment?.revision ?? 0n,
        load: (a.rank === 0 ? this.load.get(a.replicaId) : undefined) ?? IDLE,
      });
    });
  }

  /** GPU readings with a little movement, as nvidia-smi would report between heartbeats. */
  readings() {
    this.beats++;
    const busy = this.assignments.length > 0;
    return this.plain.gpus.map((g) =>
      gpuReadingToProto({
        ...g,
        utilizationPercent: busy ? 40 + ((this.beats + g.index) % 20) : 0,
        memoryUsedBytes: busy ? 60 * 1024 ** 3 : 0,
        temperatureCelsius: 35 + ((this.beats + g.index) % 10),
        powerWatts: busy ? 400 : 70,
      }),
    );
  }
}

/** Counts of heartbeat outcomes. */
export interface FleetCounters {
  ok: number;
  errors: number;
  /** Connect code name and the start of the message (or a plain error's message) → count. */
  readonly errorKinds: Map<string, number>;
}

/**
 * Many simulated agents sharing a few keep-alive transports; each agent still sends its own
 * Register and its own heartbeats with its own credential.
 */
export class Fleet {
  readonly options: FleetOptions;
  readonly agents: SimAgent[] = [];
  readonly counters: FleetCounters = { ok: 0, errors: 0, errorKinds: new Map() };
  /**
   * Load reports while the load churns: ReportLoad calls answered, or StreamLoad messages
   * taken (their errors: failed calls or streams).
   */
  readonly loadCounters: FleetCounters = { ok: 0, errors: 0, errorKinds: new Map() };
  /** Replica loads reported (one report carries a node's replicas). */
  loadSamples = 0;
  #loadRecording: number[] | undefined;
  #loadIntervalMs: number | undefined;
  #loadVia: LoadVia = "stream";
  /** Streams get a socket each (a stream holds its socket for its whole life). */
  readonly #streamHttpAgent = new HttpAgent({ keepAlive: true });
  readonly #streamClient: Client<typeof AgentService>;
  /** Bumped by each {@link churnLoad}, so a loop of an earlier call stops at its next turn. */
  #loadGeneration = 0;
  readonly #httpAgents: HttpAgent[] = [];
  /** Latencies of heartbeat calls answered while recording, ms. */
  #recording: number[] | undefined;
  /** Heartbeats written to streams while recording. */
  #streamedInRecording = 0;
  #intervalMs = 2_000;
  #heartbeatsVia: HeartbeatsVia = "unary";

  constructor(options: FleetOptions) {
    this.options = options;
    const transports = Math.max(1, options.transports ?? 4);
    this.#streamClient = createClient(
      AgentService,
      createConnectTransport({
        baseUrl: options.controlUrl,
        httpVersion: "1.1",
        nodeOptions: { agent: this.#streamHttpAgent },
      }),
    );
    const clients: Client<typeof AgentService>[] = [];
    for (let t = 0; t < transports; t++) {
      const agent = new HttpAgent({
        keepAlive: true,
        maxSockets: options.socketsPerTransport ?? 64,
      });
      this.#httpAgents.push(agent);
      clients.push(
        createClient(
          AgentService,
          createConnectTransport({
            baseUrl: options.controlUrl,
            httpVersion: "1.1",
            nodeOptions: { agent },
          }),
        ),
      );
    }
    for (let i = 0; i < options.agents; i++) {
      this.agents.push(
        new SimAgent(
          i,
          options.simSpec,
          clients[i % transports] as Client<typeof AgentService>,
          options.apiPort,
        ),
      );
    }
  }

  /** Registers every agent, `concurrency` at a time; returns the interval the plane asked for. */
  async registerAll(concurrency = 16): Promise<number> {
    let next = 0;
    let interval = this.#intervalMs;
    const worker = async () => {
      for (;;) {
        const i = next++;
        const a = this.agents[i];
        if (!a) return;
        const res = await a.client.register(
          {
            inventory: a.inventory,
            advertiseAddress: this.options.advertiseAddress ?? a.plain.addresses[0] ?? "127.0.0.1",
          },
          { headers: { authorization: `Bearer ${this.options.joinToken}` } },
        );
        a.nodeId = res.nodeId;
        a.credential = res.nodeCredential;
        interval = res.heartbeatIntervalMs || interval;
      }
    };
    await Promise.all(Array.from({ length: concurrency }, worker));
    this.#intervalMs = interval;
    return interval;
  }

  /** Starts every agent's heartbeat loop, first beats spread uniformly over one interval. */
  start(): void {
    for (const a of this.agents) {
      a.running = true;
      const first = performance.now() + Math.random() * this.#intervalMs;
      a.timer = setTimeout(() => this.#loop(a, first), first - performance.now());
    }
  }

  /** Stops one agent's heartbeats (the node goes silent; nothing is sent to say so). */
  silence(index: number): void {
    const a = this.agents[index];
    if (!a) return;
    a.running = false;
    clearTimeout(a.timer);
  }

  /**
   * Churns engine load: every `intervalMs` each agent that hosts a replica's rank 0 draws a new
   * load for each of them and reports it (every replica changed every time, the worst case),
   * and its heartbeats carry the same load. `via` "stream": as a message of the agent's open
   * `StreamLoad` request (`openLoadStream` of `apps/agent`, the agent's own; ended and opened
   * again every `load_stream_ms` the heartbeats tell); "unary": one `ReportLoad` call each (one
   * in flight per agent, like `apps/agent/src/load-reporter.ts` with streams off).
   * `undefined` stops it; the loads then stay as they were, and open streams are ended.
   */
  churnLoad(intervalMs: number | undefined, via: LoadVia = "stream"): void {
    this.#loadIntervalMs = intervalMs;
    this.#loadVia = via;
    const generation = ++this.#loadGeneration;
    for (const a of this.agents) {
      clearTimeout(a.loadTimer);
      a.loadTimer = undefined;
      this.#endStream(a);
      if (intervalMs === undefined || !a.running) continue;
      const first = performance.now() + Math.random() * intervalMs;
      a.loadTimer = setTimeout(
        () => this.#loadLoop(a, first, generation),
        first - performance.now(),
      );
    }
  }

  /** Begins collecting ReportLoad latencies (ms, client side). */
  startLoadRecording(): void {
    this.#loadRecording = [];
  }

  /** Ends collecting; returns the ReportLoad latencies gathered since it started. */
  stopLoadRecording(): number[] {
    const out = this.#loadRecording ?? [];
    this.#loadRecording = undefined;
    return out;
  }

  async #loadLoop(a: SimAgent, dueAt: number, generation: number): Promise<void> {
    const intervalMs = this.#loadIntervalMs;
    if (!a.running || intervalMs === undefined || generation !== this.#loadGeneration) return;
    const now = Date.now();
    const replicas = a.assignments
      .filter((x) => x.rank === 0)
      .map((x) => {
        const load: Load = {
          running: Math.floor(Math.random() * 33),
          waiting: Math.floor(Math.random() * 9),
          kvCacheUsage: Math.round(Math.random() * 1000) / 1000,
          prefixCacheHitRate: Math.round(Math.random() * 1000) / 1000,
        };
        a.load.set(x.replicaId, load);
        return create(ReplicaLoadReportSchema, {
          replicaId: x.replicaId,
          load: create(EngineLoadSchema, load),
          scrapedAtUnixMs: BigInt(now),
        });
      });
    if (replicas.length > 0 && this.#loadVia === "stream") {
      this.#streamReport(a, replicas);
    } else if (replicas.length > 0) {
      const t0 = performance.now();
      try {
        await a.client.reportLoad(
          { nodeId: a.nodeId, replicas },
          { headers: { authorization: `Bearer ${a.credential}` } },
        );
        this.#loadRecording?.push(performance.now() - t0);
        this.loadCounters.ok++;
        this.loadSamples += replicas.length;
      } catch (error) {
        this.#loadFailed(error);
      }
    }
    if (!a.running || generation !== this.#loadGeneration) return;
    const next = Math.max(dueAt + intervalMs, performance.now());
    a.loadTimer = setTimeout(() => this.#loadLoop(a, next, generation), next - performance.now());
  }

  /** Writes one report to `a`'s open stream, opening one (or the next) first. */
  #streamReport(a: SimAgent, replicas: readonly ReplicaLoadReport[]): void {
    const now = performance.now();
    if (a.loadStream !== undefined && now - a.loadStream.openedAt >= a.loadStreamMs) {
      this.#endStream(a);
    }
    if (a.loadStream === undefined) {
      const writer = openLoadStream(
        this.#streamClient,
        { nodeId: a.nodeId, credential: a.credential },
        { timeoutMs: a.loadStreamMs + 10_000 },
      );
      writer.done.catch((error: unknown) => {
        if (a.loadStream?.writer === writer) a.loadStream = undefined;
        this.#loadFailed(error);
      });
      a.loadStream = { writer, openedAt: now };
    }
    if (a.loadStream.writer.write(replicas)) {
      this.loadCounters.ok++;
      this.loadSamples += replicas.length;
    }
  }

  #endStream(a: SimAgent): void {
    const stream = a.loadStream;
    a.loadStream = undefined;
    // Its failure, if any, is counted by the catch of streamReport.
    void stream?.writer.end().catch(() => {});
  }

  #loadFailed(error: unknown): void {
    this.loadCounters.errors++;
    const kind =
      error instanceof ConnectError
        ? `${Code[error.code]}: ${error.rawMessage.slice(0, 60)}`
        : (error as Error).message.slice(0, 80);
    this.loadCounters.errorKinds.set(kind, (this.loadCounters.errorKinds.get(kind) ?? 0) + 1);
  }

  /** Stops every heartbeat loop and closes the sockets. */
  stop(): void {
    for (const a of this.agents) {
      a.running = false;
      clearTimeout(a.timer);
      clearTimeout(a.loadTimer);
      a.watch?.abort.abort();
      void a.beatStream?.writer.end().catch(() => {});
    }
    for (const h of this.#httpAgents) h.destroy();
    this.#streamHttpAgent.destroy();
  }

  /** How heartbeats travel from each agent's next beat on (default "unary"). */
  get heartbeatsVia(): HeartbeatsVia {
    return this.#heartbeatsVia;
  }

  /**
   * Switches how heartbeats travel. "unary" ends every watch and heartbeat stream; "stream"
   * lets each agent open its watch after its next call (as the agent's channel does).
   */
  setHeartbeatsVia(via: HeartbeatsVia): void {
    this.#heartbeatsVia = via;
    if (via === "stream") return;
    for (const a of this.agents) {
      a.watch?.abort.abort();
      void a.beatStream?.writer.end().catch(() => {});
      a.beatStream = undefined;
    }
  }

  /** Begins collecting heartbeat latencies (ms, client side) and counting streamed ones. */
  startRecording(): void {
    this.#recording = [];
    this.#streamedInRecording = 0;
  }

  /**
   * Ends collecting; returns the latencies of the calls answered since {@link startRecording}
   * and how many heartbeats went on streams (no answer, so no latency).
   */
  stopRecording(): { latencies: number[]; streamed: number } {
    const out = { latencies: this.#recording ?? [], streamed: this.#streamedInRecording };
    this.#recording = undefined;
    return out;
  }

  /** Node ids of the agents, by index. */
  nodeIds(): string[] {
    return this.agents.map((a) => a.nodeId);
  }

  /** Index of the agent holding the most assigned replica ranks (ties: lowest index). */
  busiest(): { index: number; ranks: number } {
    let best = { index: 0, ranks: -1 };
    for (const a of this.agents) {
      if (a.assignments.length > best.ranks) best = { index: a.index, ranks: a.assignments.length };
    }
    return best;
  }

  /** Total assigned ranks across agents (as of each agent's last heartbeat). */
  assignedRanks(): number {
    return this.agents.reduce((n, a) => n + a.assignments.length, 0);
  }

  async #loop(a: SimAgent, dueAt: number): Promise<void> {
    if (!a.running) return;
    const now = Date.now();
    const request = create(HeartbeatRequestSchema, {
      nodeId: a.nodeId,
      generationSeen: a.generation,
      gpus: a.readings(),
      replicas: a.statuses(now),
      sentAtUnixMs: BigInt(now),
    });
    const streaming = this.#heartbeatsVia === "stream" && a.heartbeatStreams;
    if (streaming && a.watch?.open === true && this.#streamBeat(a, request)) {
      this.counters.ok++;
      if (this.#recording) this.#streamedInRecording++;
    } else {
      const t0 = performance.now();
      try {
        const res = await a.client.heartbeat(request, {
          headers: { authorization: `Bearer ${a.credential}` },
        });
        this.#recording?.push(performance.now() - t0);
        this.counters.ok++;
        this.#takeDesired(a, res);
        if (this.#heartbeatsVia === "stream" && a.heartbeatStreams && !a.watch) this.#watch(a);
      } catch (error) {
        this.#heartbeatFailed(error);
      }
    }
    if (!a.running) return;
    // Fixed rate like a ticker: the next beat is due one interval after this one was due;
    // when the loop fell behind, it sends at once rather than bunching several.
    const next = Math.max(dueAt + this.#intervalMs, performance.now());
    a.timer = setTimeout(() => this.#loop(a, next), next - performance.now());
  }

  #heartbeatFailed(error: unknown): void {
    this.counters.errors++;
    // Code name plus the start of the raw message, e.g. "internal: read ECONNRESET".
    const kind =
      error instanceof ConnectError
        ? `${Code[error.code]}: ${error.rawMessage.slice(0, 60)}`
        : (error as Error).message.slice(0, 80);
    this.counters.errorKinds.set(kind, (this.counters.errorKinds.get(kind) ?? 0) + 1);
  }

  /** What a heartbeat answer or a watch brings: the desired set and the settings. */
  #takeDesired(a: SimAgent, res: HeartbeatResponse): void {
    a.generation = res.generation;
    a.loadStreamMs = res.loadStreamMs;
    a.heartbeatStreams = res.heartbeatStreams && res.loadStreamMs > 0;
    // `unchanged`: the set of the generation it sent, kept from before (as the agent does).
    if (!res.unchanged) a.assignments = res.assignments;
  }

  /**
   * Writes one heartbeat to `a`'s heartbeat stream, opening one (or the next, as the agent's
   * channel does after `load_stream_ms`) first; false when the stream did not take it.
   */
  #streamBeat(a: SimAgent, request: HeartbeatRequest): boolean {
    const now = performance.now();
    if (a.beatStream !== undefined && now - a.beatStream.openedAt >= a.loadStreamMs) {
      void a.beatStream.writer.end().catch(() => {});
      a.beatStream = undefined;
    }
    if (a.beatStream === undefined) {
      const writer = openHeartbeatStream(
        this.#streamClient,
        { nodeId: a.nodeId, credential: a.credential },
        { timeoutMs: a.loadStreamMs + 10_000 },
      );
      writer.done.catch((error: unknown) => {
        if (a.beatStream?.writer === writer) a.beatStream = undefined;
        this.#heartbeatFailed(error);
        // As the agent: what it carried may be lost, and the next beat is a call.
        a.watch?.abort.abort();
      });
      a.beatStream = { writer, openedAt: now };
    }
    return a.beatStream.writer.write(request);
  }

  /** Runs `a`'s WatchDesired streams, one after another, until one fails or the agent stops. */
  #watch(a: SimAgent): void {
    const entry = { abort: new AbortController(), open: false };
    a.watch = entry;
    void (async () => {
      try {
        while (a.running && !entry.abort.signal.aborted) {
          let answers = 0;
          const stream = watchDesired(
            this.#streamClient,
            { nodeId: a.nodeId, credential: a.credential },
            a.generation,
            { timeoutMs: a.loadStreamMs + 10_000, signal: entry.abort.signal },
          );
          for await (const desired of stream) {
            answers++;
            entry.open = true;
            this.#takeDesired(a, desired);
          }
          entry.open = false;
          if (answers === 0) break;
        }
      } catch (error) {
        if (!entry.abort.signal.aborted) this.#heartbeatFailed(error);
      } finally {
        entry.open = false;
        if (a.watch === entry) a.watch = undefined;
      }
    })();
  }
}
