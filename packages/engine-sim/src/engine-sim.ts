import { randomBytes, timingSafeEqual } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { Socket } from "node:net";
import type { KvEvent, KvEventPublisher } from "@llmgw/kv-events";
import { parseSimChatMessages, simChatPrompt } from "./chat-prompt.js";
import { EngineSimError } from "./errors.js";
import {
  Histogram,
  ITL_BUCKETS_S,
  renderSglangMetrics,
  renderVllmMetrics,
  TTFT_BUCKETS_S,
} from "./metrics.js";
import {
  type EngineSimOptions,
  type ResolvedEngineSimOptions,
  resolveEngineSimOptions,
} from "./options.js";
import {
  joinRendezvous,
  listenRendezvous,
  type RendezvousMember,
  type RendezvousServer,
} from "./rendezvous.js";
import {
  type PrefixCacheEvent,
  TimingModel,
  type TimingSnapshot,
  type TokenEvent,
} from "./timing-model.js";
import {
  CHARS_PER_TOKEN,
  countTokens,
  createPrng,
  hashString,
  nextTokenText,
  sequenceBlockHashes,
  simTokenIds,
  simTokenTexts,
} from "./tokenizer.js";

/**
 * Lifecycle of a simulated engine: `loading` (port closed) → `warming` (SGLang only: port
 * open, `/health` 503) → `ready`; `failed` after a fault, a lost rank or a load failure;
 * `closed` after {@link RunningEngineSim.close}. Ranks ≥ 1 of a multi-node group go
 * `loading` → `ready` once joined (they only serve `/health`).
 */
export type EngineSimState = "loading" | "warming" | "ready" | "failed" | "closed";

/** How a simulated engine ended: what a real engine's exit status would be. */
export interface EngineSimExitReport {
  /** 0 after `close()`, 1 after a failure. */
  readonly exitCode: number;
  readonly reason: string;
}

/** Time as the engine loop sees it; injected so tests can drive it. */
export interface EngineSimClock {
  /** Milliseconds, monotonic. */
  now(): number;
  sleep(ms: number): Promise<void>;
}

/** `performance.now()` and `setTimeout`. */
export const systemEngineSimClock: EngineSimClock = {
  now: () => performance.now(),
  sleep: (ms) => new Promise((resolve) => setTimeout(resolve, Math.max(0, ms))),
};

/** Counters exposed on `GET /sim/stats` (for benchmarks and tests). */
export interface EngineSimStats {
  readonly state: EngineSimState;
  readonly requests: number;
  readonly activeRequests: number;
  readonly timing: TimingSnapshot;
  /** `process.cpuUsage()` of the process hosting the engine, µs. */
  readonly cpuUserMicros: number;
  readonly cpuSystemMicros: number;
  readonly rssBytes: number;
}

/** A started simulated engine. */
export interface RunningEngineSim {
  /** `http://host:port` of the API (rank 0) or the dummy health server (ranks ≥ 1). */
  readonly url: string;
  readonly port: number;
  readonly options: ResolvedEngineSimOptions;
  /** Where this engine publishes KV events (bound endpoints); undefined when they are off. */
  readonly kvEvents:
    | { readonly endpoint: string; readonly replayEndpoint: string | undefined }
    | undefined;
  state(): EngineSimState;
  stats(): EngineSimStats;
  /** Resolves once the engine has ended (closed or failed); never rejects. */
  readonly exited: Promise<EngineSimExitReport>;
  /** Stops listening, drops every connection and the rendezvous; idempotent. */
  close(): Promise<void>;
}

/** Dependencies of {@link startEngineSim}. */
export interface EngineSimDeps {
  readonly clock?: EngineSimClock;
}

type FinishReason = "stop" | "length";

interface ActiveRequest {
  onToken(event: TokenEvent): void;
}

interface ApiError {
  readonly status: number;
  readonly message: string;
  readonly type: string;
  readonly param: string | null;
}

const badRequest = (message: string, param: string | null = null): ApiError => ({
  status: 400,
  message,
  type: "BadRequestError",
  param,
});

/** vLLM's rule (`protocol.py`): a `cache_salt`, when given, is a non-empty string. */
function checkCacheSalt(salt: unknown): ApiError | undefined {
  if (salt === undefined || salt === null || (typeof salt === "string" && salt !== "")) {
    return undefined;
  }
  return badRequest("Parameter 'cache_salt' must be a non-empty string if provided.", "cache_salt");
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function timestamp(): string {
  const d = new Date();
  const p = (n: number): string => String(n).padStart(2, "0");
  return `${p(d.getUTCMonth() + 1)}-${p(d.getUTCDate())} ${p(d.getUTCHours())}:${p(d.getUTCMinutes())}:${p(d.getUTCSeconds())}`;
}

function sglangTimestamp(): string {
  return new Date().toISOString().replace("T", " ").slice(0, 19);
}

const U64 = (1n << 64n) - 1n;

/** splitmix64's finaliser: spreads a 64-bit value over all 64 bits. */
function mix64(value: bigint): bigint {
  let x = value & U64;
  x = ((x ^ (x >> 30n)) * 0xbf58476d1ce4e5b9n) & U64;
  x = ((x ^ (x >> 27n)) * 0x94d049bb133111ebn) & U64;
  return x ^ (x >> 31n);
}

/** The sim token id of one output piece (always one 4-character token). */
function pieceId(piece: string): number {
  return simTokenIds(piece)[0] ?? 0;
}

/** A request's answer, drawn before it runs. */
interface PlannedAnswer {
  /** Every generated token's text (the token completing a stop string is the last). */
  readonly pieces: readonly string[];
  /** The returned text: the pieces joined, cut before (or after) the stop string. */
  readonly text: string;
  /** `text.slice(offsets[i], offsets[i + 1])` is what token i adds to `text`. */
  readonly offsets: readonly number[];
  /** The stop string that ended the answer, else null. */
  readonly stopReason: string | null;
}

/**
 * Draws up to `maxTokens` output tokens and applies stop strings as vLLM's detokenizer does:
 * generation ends with the token that completes the first stop string found (checked in the
 * order given, each from where it could first end), and the returned text ends before it
 * (`include_stop_str_in_output`: after it). Usage counts every generated token.
 */
function planAnswer(
  next: () => number,
  maxTokens: number,
  stops: readonly string[],
  options: { readonly includeStop: boolean },
): PlannedAnswer {
  const live = stops.filter((x) => x !== "");
  const pieces: string[] = [];
  let full = "";
  for (let i = 0; i < maxTokens; i += 1) {
    const piece = nextTokenText(next);
    pieces.push(piece);
    const before = full.length;
    full += piece;
    for (const stop of live) {
      const at = full.indexOf(stop, Math.max(0, before - stop.length + 1));
      if (at < 0) continue;
      const text = full.slice(0, options.includeStop ? at + stop.length : at);
      return { pieces, text, offsets: offsetsOf(pieces, text.length), stopReason: stop };
    }
  }
  return { pieces, text: full, offsets: offsetsOf(pieces, full.length), stopReason: null };
}

function offsetsOf(pieces: readonly string[], cap: number): number[] {
  const offsets = [0];
  let at = 0;
  for (const piece of pieces) {
    at += piece.length;
    offsets.push(Math.min(at, cap));
  }
  return offsets;
}

/**
 * Starts a simulated engine and resolves once it is ready (API listening and, for rank 0 of
 * a multi-node group, every rank joined). Rejects with `LLMGW_ENGINE_SIM_LOAD_FAILED`
 * (`faults.failLoad`), `LLMGW_ENGINE_SIM_LISTEN_FAILED` or `LLMGW_ENGINE_SIM_RANK_LOST`.
 *
 * @example
 * const sim = await startEngineSim({ model: "meta-llama/Llama-3.1-8B-Instruct", port: 0 });
 * // point an OpenAI client at `${sim.url}/v1`
 * await sim.close();
 */
export async function startEngineSim(
  options: EngineSimOptions,
  deps: EngineSimDeps = {},
): Promise<RunningEngineSim> {
  const engine = new EngineSim(
    resolveEngineSimOptions(options),
    deps.clock ?? systemEngineSimClock,
  );
  await engine.start();
  return engine.handle();
}

class EngineSim {
  readonly o: ResolvedEngineSimOptions;
  readonly clock: EngineSimClock;
  readonly model: TimingModel;
  readonly t0: number;
  #state: EngineSimState = "loading";
  #server: Server | undefined;
  #port = 0;
  readonly #sockets = new Set<Socket>();
  #rendezvous: RendezvousServer | undefined;
  #member: RendezvousMember | undefined;
  readonly #active = new Map<string, ActiveRequest>();
  #loopRunning = false;
  #lastStepEndMs = 0;
  #requests = 0;
  #answered = 0;
  #nextId = 0;
  readonly #errorPrng: () => number;
  readonly #apiKeyBytes: Buffer | undefined;
  readonly ttft = new Histogram(TTFT_BUCKETS_S);
  readonly itl = new Histogram(ITL_BUCKETS_S);
  readonly success = { stop: 0, length: 0, abort: 0 };
  #recentTokens: { atMs: number; tokens: number }[] = [];
  #exit!: (report: EngineSimExitReport) => void;
  readonly exited: Promise<EngineSimExitReport>;
  #created = Math.floor(Date.now() / 1000);
  /**
   * Mixed into every engine block hash: like vLLM without PYTHONHASHSEED (NONE_HASH =
   * os.urandom), each engine start hashes the same prefix differently, so only the token ids
   * in its KV events let a consumer match blocks across replicas.
   */
  readonly #hashSeed = randomBytes(8).readBigUInt64BE(0);
  #kvPublisher: KvEventPublisher | undefined;
  #kvClosed: Promise<void> = Promise.resolve();
  /** Prefix-cache changes of the current step, published as one batch after it. */
  readonly #pendingKv: PrefixCacheEvent[] = [];

  constructor(options: ResolvedEngineSimOptions, clock: EngineSimClock) {
    this.o = options;
    this.clock = clock;
    this.model = new TimingModel(
      options.timing,
      options.kvEvents ? { onCacheEvent: (event) => this.#pendingKv.push(event) } : {},
    );
    this.t0 = clock.now();
    this.#errorPrng = createPrng(options.seed ^ 0x5eed);
    this.#apiKeyBytes = options.apiKey === undefined ? undefined : Buffer.from(options.apiKey);
    this.exited = new Promise((resolve) => {
      this.#exit = resolve;
    });
  }

  log(level: "INFO" | "WARNING" | "ERROR", where: string, message: string): void {
    if (this.o.mimic === "sglang") {
      this.o.log(`[${sglangTimestamp()}] ${level === "INFO" ? "" : `${level} `}${message}`);
    } else {
      this.o.log(`${level} ${timestamp()} [${where}] ${message}`);
    }
  }

  #setState(next: EngineSimState): void {
    if (this.#state === next) return;
    const allowed: Record<EngineSimState, readonly EngineSimState[]> = {
      loading: ["warming", "ready", "failed", "closed"],
      warming: ["ready", "failed", "closed"],
      ready: ["failed", "closed"],
      failed: [],
      closed: [],
    };
    if (!allowed[this.#state].includes(next)) {
      throw new EngineSimError(
        "LLMGW_ENGINE_SIM_INVALID_TRANSITION",
        `engine-sim cannot go from ${this.#state} to ${next}`,
      );
    }
    this.#state = next;
    this.log("INFO", "engine_sim.py:1", `engine-sim state: ${next}`);
  }

  state(): EngineSimState {
    return this.#state;
  }

  modelNow(): number {
    return (this.clock.now() - this.t0) * this.o.timeScale;
  }

  async start(): Promise<void> {
    const o = this.o;
    this.log(
      "INFO",
      "api_server.py:1",
      `engine-sim (mimic ${o.mimic}) model=${JSON.stringify(o.model)} served_model_name=${JSON.stringify(o.servedModelName)} max_model_len=${o.maxModelLen} rank=${o.nodeRank}/${o.nnodes} time_scale=${o.timeScale}`,
    );
    try {
      let joined: Promise<void> = Promise.resolve();
      if (o.nnodes > 1 && o.distInitAddr) {
        const addr = o.distInitAddr;
        if (o.nodeRank === 0) {
          // Like torch's TCP store, rank 0 listens on every interface: the address ranks dial
          // may be a name or an IP that maps to another local interface. Loopback stays local.
          const loopback = /^(127\.|localhost$|::1$)/.test(addr.host);
          this.#rendezvous = await listenRendezvous({
            host: loopback ? addr.host : "0.0.0.0",
            port: addr.port,
            nnodes: o.nnodes,
            timeoutMs: o.distTimeoutMs,
            log: (line) => this.o.log(line),
            onRankLost: (rank) =>
              this.fail(
                `rank ${rank} of ${o.nnodes} disconnected from ${addr.host}:${addr.port}; the group cannot continue`,
              ),
          });
          joined = this.#rendezvous.allJoined;
        } else {
          joined = joinRendezvous({
            host: addr.host,
            port: addr.port,
            rank: o.nodeRank,
            timeoutMs: o.distTimeoutMs,
            log: (line) => this.o.log(line),
            onLost: () => this.fail(`lost connection to rank 0 at ${addr.host}:${addr.port}`),
          }).then((member) => {
            this.#member = member;
            if (this.#state === "failed" || this.#state === "closed") member.close();
          });
        }
      }
      this.log(
        "INFO",
        "model_runner.py:1",
        `Loading weights for ${o.model} (simulated, ${o.loadMs / 1000} s)`,
      );
      if (o.faults.failLoad) {
        await this.clock.sleep(o.loadMs / 2);
        throw new EngineSimError(
          "LLMGW_ENGINE_SIM_LOAD_FAILED",
          `torch.OutOfMemoryError: CUDA out of memory while loading ${o.model} (simulated fault --fail-load)`,
        );
      }
      await Promise.all([this.clock.sleep(o.loadMs), joined]);
      if (this.#state !== "loading") {
        throw new EngineSimError(
          "LLMGW_ENGINE_SIM_RANK_LOST",
          `engine-sim ${this.#state} while loading`,
        );
      }
      this.log(
        "INFO",
        "model_runner.py:2",
        `Loading weights took ${(o.loadMs / 1000).toFixed(2)} seconds`,
      );
      if (o.kvEvents && o.nodeRank === 0) await this.#startKvEvents();
      await this.#listen();
      if (o.nodeRank > 0) {
        this.log(
          "INFO",
          "engine.py:1",
          `rank ${o.nodeRank}: scheduler running; dummy health check server on ${this.url()}`,
        );
        this.#setState("ready");
        return;
      }
      if (o.mimic === "sglang") {
        this.o.log(`INFO:     Uvicorn running on ${this.url()} (Press CTRL+C to quit)`);
        this.#setState("warming");
        await this.clock.sleep(o.warmupMs);
        if (this.state() !== "warming")
          throw new EngineSimError("LLMGW_ENGINE_SIM_RANK_LOST", "failed while warming up");
        this.#setState("ready");
        this.log("INFO", "", "The server is fired up and ready to roll!");
      } else {
        this.#setState("ready");
        this.log("INFO", "api_server.py:1971", `Starting vLLM API server 0 on ${this.url()}`);
        this.o.log("INFO:     Application startup complete.");
      }
    } catch (error) {
      const message = error instanceof Error ? error.message : String(error);
      this.fail(message);
      throw error;
    }
  }

  url(): string {
    const host = this.o.host.includes(":") ? `[${this.o.host}]` : this.o.host;
    return `http://${host}:${this.#port}`;
  }

  handle(): RunningEngineSim {
    return {
      url: this.url(),
      port: this.#port,
      options: this.o,
      kvEvents: this.#kvPublisher && {
        endpoint: this.#kvPublisher.endpoint,
        replayEndpoint: this.#kvPublisher.replayEndpoint,
      },
      state: () => this.state(),
      stats: () => this.stats(),
      exited: this.exited,
      close: () => this.close(),
    };
  }

  stats(): EngineSimStats {
    const cpu = process.cpuUsage();
    return {
      state: this.#state,
      requests: this.#requests,
      activeRequests: this.#active.size,
      timing: this.model.snapshot(),
      cpuUserMicros: cpu.user,
      cpuSystemMicros: cpu.system,
      rssBytes: process.memoryUsage.rss(),
    };
  }

  /** Ends the engine with a failure: a log line, every socket dropped, exit code 1. */
  fail(reason: string): void {
    if (this.#state === "failed" || this.#state === "closed") return;
    this.log("ERROR", "engine_sim.py:2", `engine-sim failed: ${reason}`);
    this.#state = "failed";
    this.#teardown();
    this.#exit({ exitCode: 1, reason });
  }

  async close(): Promise<void> {
    if (this.#state === "failed" || this.#state === "closed") {
      await this.exited;
      return;
    }
    this.#setState("closed");
    const server = this.#server;
    this.#teardown();
    if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
    await this.#kvClosed;
    this.#exit({ exitCode: 0, reason: "closed" });
  }

  #teardown(): void {
    this.#server?.close();
    for (const socket of this.#sockets) socket.destroy();
    this.#rendezvous?.close();
    this.#member?.close();
    this.#active.clear();
    if (this.#kvPublisher) this.#kvClosed = this.#kvPublisher.close().catch(() => {});
    this.#kvPublisher = undefined;
  }

  /**
   * Binds the KV-event publisher. A restart in the same process (bench's `restart`) rebinds
   * the endpoint the closed engine just released, which the OS may still hold for a moment:
   * "address in use" is retried for up to 2 s.
   */
  async #startKvEvents(): Promise<void> {
    const kv = this.o.kvEvents!;
    // Loaded only when events are on: zeromq is a native addon the sim otherwise never needs.
    const { createKvEventPublisher } = await import("@llmgw/kv-events");
    const deadline = this.clock.now() + 2000;
    for (;;) {
      try {
        this.#kvPublisher = await createKvEventPublisher({
          endpoint: kv.endpoint,
          ...(kv.replayEndpoint === undefined ? {} : { replayEndpoint: kv.replayEndpoint }),
          topic: kv.topic,
          encoding: kv.encoding,
          bufferSteps: kv.bufferSteps,
          dataParallelRank: 0,
        });
        break;
      } catch (error) {
        const message = error instanceof Error ? error.message : String(error);
        if (!/in use/i.test(message) || this.clock.now() > deadline) {
          throw new EngineSimError(
            "LLMGW_ENGINE_SIM_LISTEN_FAILED",
            `cannot publish KV events: ${message}`,
            { cause: error },
          );
        }
        await this.clock.sleep(20);
      }
    }
    const p = this.#kvPublisher;
    this.log(
      "INFO",
      "kv_events.py:1",
      `KV events: ZMQ publisher on ${p.endpoint}${p.replayEndpoint ? `, replay on ${p.replayEndpoint}` : ""} (topic ${JSON.stringify(kv.topic)}, ${kv.encoding})`,
    );
  }

  #engineHash(simHash: string): bigint {
    return mix64(BigInt(`0x${simHash}`) ^ this.#hashSeed);
  }

  /** The step's prefix-cache changes as vLLM's events. */
  #kvEvents(changes: readonly PrefixCacheEvent[]): KvEvent[] {
    const bs = this.o.timing.blockSizeTokens;
    return changes.map((c): KvEvent => {
      switch (c.type) {
        case "stored": {
          const hashes = c.seq.blockHashes;
          const tokens = c.seq.tokenIds ?? [];
          const parent = c.from > 0 ? hashes[c.from - 1] : undefined;
          return {
            type: "BlockStored",
            blockHashes: hashes.slice(c.from, c.to).map((h) => this.#engineHash(h)),
            ...(parent === undefined ? {} : { parentBlockHash: this.#engineHash(parent) }),
            // vLLM: the salt is the first block's extra key (`(cache_salt,)`); later blocks
            // carry none, their hashes chain from it.
            ...(c.seq.cacheSalt !== undefined && c.from === 0
              ? {
                  extraKeys: Array.from({ length: c.to - c.from }, (_, i) =>
                    i === 0 ? [c.seq.cacheSalt] : null,
                  ),
                }
              : {}),
            tokenIds: Array.from({ length: (c.to - c.from) * bs }, (_, i) =>
              Number(tokens[c.from * bs + i] ?? 0),
            ),
            blockSize: bs,
            medium: "GPU",
            groupIdx: 0,
            kvCacheSpecKind: "full_attention",
          };
        }
        case "removed":
          return {
            type: "BlockRemoved",
            blockHashes: c.hashes.map((h) => this.#engineHash(h)),
            medium: "GPU",
            groupIdx: 0,
          };
        default: // "cleared"
          return { type: "AllBlocksCleared" };
      }
    });
  }

  /** Publishes what the last step (or a cache reset) changed, as one batch, like vLLM. */
  #flushKv(): void {
    if (this.#pendingKv.length === 0) return;
    const changes = this.#pendingKv.splice(0);
    const publisher = this.#kvPublisher;
    if (!publisher) return;
    publisher.publish(this.#kvEvents(changes)).catch((error: unknown) => {
      this.log("WARNING", "kv_events.py:2", `KV event batch not sent: ${String(error)}`);
    });
  }

  async #listen(): Promise<void> {
    const server = createServer({ keepAliveTimeout: 30_000 }, (req, res) => this.#route(req, res));
    server.on("connection", (socket) => {
      this.#sockets.add(socket);
      socket.setNoDelay(true);
      socket.on("close", () => this.#sockets.delete(socket));
    });
    this.#server = server;
    await new Promise<void>((resolve, reject) => {
      server.once("error", (error) =>
        reject(
          new EngineSimError(
            "LLMGW_ENGINE_SIM_LISTEN_FAILED",
            `cannot listen on ${this.o.host}:${this.o.port}: ${error.message}`,
            { cause: error },
          ),
        ),
      );
      server.listen(this.o.port, this.o.host, () => resolve());
    });
    const address = server.address();
    this.#port = typeof address === "object" && address ? address.port : this.o.port;
  }

  #json(res: ServerResponse, status: number, body: unknown): void {
    const text = JSON.stringify(body);
    res.writeHead(status, {
      "content-type": "application/json",
      "content-length": Buffer.byteLength(text),
    });
    res.end(text);
  }

  #error(res: ServerResponse, e: ApiError): void {
    this.#json(res, e.status, {
      error: { message: e.message, type: e.type, param: e.param, code: e.status },
    });
  }

  #route(req: IncomingMessage, res: ServerResponse): void {
    const path = (req.url ?? "/").split("?")[0] ?? "/";
    const method = req.method ?? "GET";
    const get = method === "GET" || method === "HEAD";
    if (this.o.nodeRank > 0) {
      if (path === "/health" && get) this.#healthOk(res);
      else this.#json(res, 404, { detail: "Not Found" });
      return;
    }
    if (path.startsWith("/v1/") && !this.#authorized(req)) {
      this.#error(res, {
        status: 401,
        type: "authentication_error",
        message: "Invalid API key: send Authorization: Bearer <key>",
        param: null,
      });
      return;
    }
    switch (path) {
      case "/health":
      case "/health_generate":
      case "/ping":
        if (!get) break;
        if (this.#state === "ready") this.#healthOk(res);
        else {
          res.writeHead(503, { "content-length": 0 });
          res.end();
        }
        return;
      case "/v1/models":
        if (!get) break;
        this.#json(res, 200, this.#models());
        return;
      case "/version":
        if (!get) break;
        this.#json(res, 200, { version: "0.0.0-engine-sim" });
        return;
      case "/metrics":
        if (!get) break;
        this.#metrics(res);
        return;
      case "/sim/stats":
        if (!get) break;
        this.#json(res, 200, this.stats());
        return;
      case "/get_model_info":
        if (!get) break;
        this.#json(res, 200, {
          model_path: this.o.model,
          tokenizer_path: this.o.model,
          is_generation: true,
        });
        return;
      case "/reset_prefix_cache":
        if (method !== "POST") break;
        if (this.model.resetPrefixCache()) {
          this.#flushKv();
          this.#json(res, 200, {});
        } else {
          this.#error(res, {
            status: 409,
            message: "The prefix cache is in use by running requests; not reset",
            type: "ConflictError",
            param: null,
          });
        }
        return;
      case "/tokenize":
      case "/v1/chat/completions":
      case "/v1/completions":
      case "/v1/embeddings":
        if (method !== "POST") break;
        this.#inference(req, res, path);
        return;
      default:
        this.#json(res, 404, { detail: "Not Found" });
        return;
    }
    this.#json(res, 405, { detail: "Method Not Allowed" });
  }

  /** True without an `apiKey`, or when the request's bearer token equals it. */
  #authorized(req: IncomingMessage): boolean {
    const expected = this.#apiKeyBytes;
    if (expected === undefined) return true;
    const header = req.headers.authorization ?? "";
    const given = Buffer.from(header.startsWith("Bearer ") ? header.slice(7) : "");
    return given.length === expected.length && timingSafeEqual(given, expected);
  }

  #healthOk(res: ServerResponse): void {
    res.writeHead(200, { "content-length": 0 });
    res.end();
  }

  #models(): unknown {
    const id = this.o.servedModelName;
    if (this.o.mimic === "sglang") {
      return {
        object: "list",
        data: [
          {
            id,
            object: "model",
            created: this.#created,
            owned_by: "sglang",
            root: this.o.model,
            max_model_len: this.o.maxModelLen,
          },
        ],
      };
    }
    return {
      object: "list",
      data: [
        {
          id,
          object: "model",
          created: this.#created,
          owned_by: "vllm",
          root: this.o.model,
          parent: null,
          max_model_len: this.o.maxModelLen,
          permission: [
            {
              id: `modelperm-sim${hashString(id).toString(16)}`,
              object: "model_permission",
              created: this.#created,
              allow_create_engine: false,
              allow_sampling: true,
              allow_logprobs: true,
              allow_search_indices: false,
              allow_view: true,
              allow_fine_tuning: false,
              organization: "*",
              group: null,
              is_blocking: false,
            },
          ],
        },
      ],
    };
  }

  #metrics(res: ServerResponse): void {
    const now = this.modelNow();
    this.#recentTokens = this.#recentTokens.filter((r) => r.atMs >= now - 5000);
    const tokens = this.#recentTokens.reduce((sum, r) => sum + r.tokens, 0);
    const state = {
      servedModelName: this.o.servedModelName,
      snapshot: this.model.snapshot(),
      ttft: this.ttft,
      itl: this.itl,
      success: this.success,
      genThroughput: tokens / 5,
      blockSizeTokens: this.o.timing.blockSizeTokens,
    };
    const text = this.o.mimic === "sglang" ? renderSglangMetrics(state) : renderVllmMetrics(state);
    res.writeHead(200, { "content-type": "text/plain; version=0.0.4; charset=utf-8" });
    res.end(text);
  }

  #inference(req: IncomingMessage, res: ServerResponse, path: string): void {
    const chunks: Buffer[] = [];
    let size = 0;
    let tooLarge = false;
    req.on("data", (chunk: Buffer) => {
      if (tooLarge) return;
      size += chunk.length;
      if (size > this.o.maxBodyBytes) {
        tooLarge = true;
        res.setHeader("connection", "close");
        this.#error(res, {
          status: 413,
          message: `Request body too large: more than ${this.o.maxBodyBytes} bytes`,
          type: "RequestEntityTooLarge",
          param: null,
        });
        return;
      }
      chunks.push(chunk);
    });
    req.on("end", () => {
      if (tooLarge) return;
      if (this.#state !== "ready") {
        this.#error(res, {
          status: 503,
          message: `The server is not ready (${this.#state})`,
          type: "ServiceUnavailableError",
          param: null,
        });
        return;
      }
      if (path === "/tokenize") {
        const error = this.#tokenize(Buffer.concat(chunks), res);
        if (error) this.#error(res, error);
        return;
      }
      this.#requests += 1;
      const f = this.o.faults;
      if (f.hangAfterRequests !== null && this.#requests > f.hangAfterRequests) return;
      if (f.errorRate > 0 && this.#errorPrng() < f.errorRate) {
        this.#error(res, {
          status: 500,
          message: "EngineCore encountered an issue (simulated fault --error-rate)",
          type: "InternalServerError",
          param: null,
        });
        return;
      }
      let body: unknown;
      try {
        body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
      } catch (error) {
        this.#error(
          res,
          badRequest(
            `Invalid JSON body: ${error instanceof Error ? error.message : String(error)}`,
          ),
        );
        return;
      }
      const result =
        path === "/v1/embeddings"
          ? this.#embeddings(body, res)
          : this.#generate(body, res, path === "/v1/chat/completions" ? "chat" : "completion");
      if (result) this.#error(res, result);
    });
  }

  #answered1(): void {
    this.#answered += 1;
    const limit = this.o.faults.crashAfterRequests;
    if (limit !== null && this.#answered >= limit) {
      setImmediate(() =>
        this.fail(`simulated crash after ${limit} requests (--crash-after-requests)`),
      );
    }
  }

  #checkModel(body: Record<string, unknown>): ApiError | undefined {
    if (body.model === undefined || body.model === null) return undefined;
    if (typeof body.model !== "string") return badRequest("model must be a string", "model");
    if (body.model !== this.o.servedModelName) {
      return {
        status: 404,
        message: `The model \`${body.model}\` does not exist.`,
        type: "NotFoundError",
        param: "model",
      };
    }
    return undefined;
  }

  /**
   * `POST /tokenize` as vLLM serves it (checked against vLLM's
   * `vllm/entrypoints/openai/protocol.py`, `TokenizeCompletionRequest`/`TokenizeChatRequest`
   * → `TokenizeResponse`): `{model?, prompt, add_special_tokens?, return_token_strs?}` or
   * `{model?, messages, add_generation_prompt? = true, continue_final_message? = false, …}`
   * → `{count, max_model_len, tokens, token_strs}` (`token_strs` null unless asked for). The
   * sim has no special tokens, so `add_special_tokens` changes nothing.
   */
  #tokenize(raw: Buffer, res: ServerResponse): ApiError | undefined {
    let body: unknown;
    try {
      body = JSON.parse(raw.toString("utf8"));
    } catch (error) {
      return badRequest(
        `Invalid JSON body: ${error instanceof Error ? error.message : String(error)}`,
      );
    }
    if (!isObject(body)) return badRequest("request body must be a JSON object");
    const modelError = this.#checkModel(body);
    if (modelError) return modelError;
    for (const flag of [
      "add_generation_prompt",
      "continue_final_message",
      "add_special_tokens",
      "return_token_strs",
    ]) {
      const v = body[flag];
      if (v !== undefined && v !== null && typeof v !== "boolean") {
        return badRequest(`${flag} must be a boolean`, flag);
      }
    }
    let prompt: string;
    if (body.messages !== undefined) {
      const messages = parseSimChatMessages(body.messages);
      if (typeof messages === "string") return badRequest(messages, "messages");
      // vLLM's check_generation_prompt looks at the fields as sent, not at their defaults.
      if (body.continue_final_message === true && body.add_generation_prompt === true) {
        return badRequest(
          "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
        );
      }
      prompt = simChatPrompt(messages, {
        addGenerationPrompt: body.add_generation_prompt !== false,
        continueFinalMessage: body.continue_final_message === true,
      });
    } else if (typeof body.prompt === "string") {
      prompt = body.prompt;
    } else {
      return badRequest("prompt must be a string (or send messages)", "prompt");
    }
    const tokens = simTokenIds(prompt);
    const strs =
      body.return_token_strs === true
        ? Array.from({ length: tokens.length }, (_, i) =>
            prompt.slice(i * CHARS_PER_TOKEN, (i + 1) * CHARS_PER_TOKEN),
          )
        : null;
    this.#json(res, 200, {
      count: tokens.length,
      max_model_len: this.o.maxModelLen,
      tokens: Array.from(tokens),
      token_strs: strs,
    });
    return undefined;
  }

  #embeddings(body: unknown, res: ServerResponse): ApiError | undefined {
    if (!isObject(body)) return badRequest("request body must be a JSON object");
    const modelError = this.#checkModel(body);
    if (modelError) return modelError;
    // vLLM's pooling requests take a salt too, by the same rule (`PoolingBasicRequestMixin`).
    const saltError = checkCacheSalt(body.cache_salt);
    if (saltError) return saltError;
    const input = body.input;
    const inputs = typeof input === "string" ? [input] : input;
    if (
      !Array.isArray(inputs) ||
      inputs.length === 0 ||
      !inputs.every((i) => typeof i === "string")
    ) {
      return badRequest("input must be a string or a non-empty array of strings", "input");
    }
    const base64 = body.encoding_format === "base64";
    let promptTokens = 0;
    const data = (inputs as string[]).map((text, index) => {
      const tokens = countTokens(text);
      if (tokens > this.o.maxModelLen) return undefined;
      promptTokens += tokens;
      const next = createPrng(hashString(text, this.o.seed));
      const vector = new Float32Array(this.o.embeddingDim);
      let norm = 0;
      for (let i = 0; i < vector.length; i += 1) {
        vector[i] = next() * 2 - 1;
        norm += (vector[i] ?? 0) ** 2;
      }
      norm = Math.sqrt(norm) || 1;
      for (let i = 0; i < vector.length; i += 1) vector[i] = (vector[i] ?? 0) / norm;
      const embedding = base64 ? Buffer.from(vector.buffer).toString("base64") : Array.from(vector);
      return { object: "embedding", index, embedding };
    });
    if (data.some((d) => d === undefined)) {
      return badRequest(
        `This model's maximum context length is ${this.o.maxModelLen} tokens. However, your request has more input tokens. Please reduce the length of the input.`,
        "input",
      );
    }
    this.#json(res, 200, {
      id: `embd-sim${(this.#nextId++).toString(16)}`,
      object: "list",
      created: Math.floor(Date.now() / 1000),
      model: this.o.servedModelName,
      data,
      usage: { prompt_tokens: promptTokens, total_tokens: promptTokens, completion_tokens: 0 },
    });
    this.#answered1();
    return undefined;
  }

  #generate(body: unknown, res: ServerResponse, kind: "chat" | "completion"): ApiError | undefined {
    if (!isObject(body)) return badRequest("request body must be a JSON object");
    const modelError = this.#checkModel(body);
    if (modelError) return modelError;
    let prompt: string;
    if (kind === "chat") {
      const messages = parseSimChatMessages(body.messages);
      if (typeof messages === "string") return badRequest(messages, "messages");
      prompt = simChatPrompt(messages);
    } else {
      const p =
        Array.isArray(body.prompt) && body.prompt.length === 1 ? body.prompt[0] : body.prompt;
      if (typeof p !== "string") return badRequest("prompt must be a string", "prompt");
      prompt = p;
    }
    const promptTokens = Math.max(1, countTokens(prompt));
    const salt = body.cache_salt;
    const saltError = checkCacheSalt(salt);
    if (saltError) return saltError;
    const cacheSalt = typeof salt === "string" ? salt : undefined;
    if (body.n !== undefined && body.n !== null && body.n !== 1) {
      return badRequest("engine-sim only supports n=1", "n");
    }
    const maxTokensRaw = body.max_completion_tokens ?? body.max_tokens;
    if (
      maxTokensRaw !== undefined &&
      maxTokensRaw !== null &&
      (!Number.isInteger(maxTokensRaw) || (maxTokensRaw as number) < 1)
    ) {
      return badRequest(
        `max_tokens must be at least 1, got ${JSON.stringify(maxTokensRaw)}.`,
        "max_tokens",
      );
    }
    if (body.stream !== undefined && body.stream !== null && typeof body.stream !== "boolean") {
      return badRequest("stream must be a boolean", "stream");
    }
    const stopRaw = body.stop ?? [];
    const stops = typeof stopRaw === "string" ? [stopRaw] : stopRaw;
    if (!Array.isArray(stops) || !stops.every((x) => typeof x === "string")) {
      return badRequest("stop must be a string or an array of strings", "stop");
    }
    const L = this.o.maxModelLen;
    const what = kind === "chat" ? "messages" : "prompt";
    if (promptTokens >= L) {
      return badRequest(
        `This model's maximum context length is ${L} tokens. However, your request has ${promptTokens} input tokens. Please reduce the length of the input ${what}.`,
        what,
      );
    }
    const maxTokens = (maxTokensRaw as number | undefined | null) ?? L - promptTokens;
    if (promptTokens + maxTokens > L) {
      return badRequest(
        `This model's maximum context length is ${L} tokens. However, you requested ${promptTokens + maxTokens} tokens (${promptTokens} in the ${what}, ${maxTokens} in the completion). Please reduce the length of the ${what} or completion.`,
        "max_tokens",
      );
    }
    const requestSeed = Number.isInteger(body.seed) ? (body.seed as number) : 0;
    const next = createPrng(
      hashString(prompt, (this.o.seed ^ Math.imul(requestSeed, 0x9e3779b1)) >>> 0),
    );
    const natural =
      this.o.minOutputTokens +
      Math.floor(next() * (this.o.maxOutputTokens - this.o.minOutputTokens + 1));
    const plannedTokens = body.ignore_eos === true ? maxTokens : Math.min(natural, maxTokens);
    // The whole answer is drawn up front: its blocks' hashes (KV events, prefix cache) and a
    // stop string's position must be known before the first step.
    const answer = planAnswer(next, plannedTokens, stops as string[], {
      includeStop: body.include_stop_str_in_output === true,
    });
    const outputTokens = answer.pieces.length;
    const stopReason = answer.stopReason;
    const finishReason: FinishReason =
      stopReason === null &&
      outputTokens === maxTokens &&
      (body.ignore_eos === true || natural > maxTokens)
        ? "length"
        : "stop";
    const id = `${kind === "chat" ? "chatcmpl" : "cmpl"}-sim${(this.#nextId++).toString(16)}`;
    // Output tokens continue the prompt's token sequence: the blocks they fill are cached and
    // published like prompt blocks, with ids that re-tokenizing the answer gives back.
    const promptTexts = prompt === "" ? [""] : simTokenTexts(prompt);
    try {
      this.model.submit(
        {
          id,
          promptTokens,
          blockHashes: sequenceBlockHashes(
            [...promptTexts, ...answer.pieces],
            this.o.timing.blockSizeTokens,
            cacheSalt,
          ),
          outputTokens,
          ...(cacheSalt === undefined ? {} : { cacheSalt }),
          ...(this.o.kvEvents
            ? { tokenIds: [...simTokenIds(prompt.padEnd(1)), ...answer.pieces.map(pieceId)] }
            : {}),
        },
        this.modelNow(),
      );
    } catch (error) {
      return badRequest(error instanceof Error ? error.message : String(error));
    }
    const stream = body.stream === true;
    const includeUsage =
      stream && isObject(body.stream_options) && body.stream_options.include_usage === true;
    const created = Math.floor(Date.now() / 1000);
    const modelJson = JSON.stringify(this.o.servedModelName);
    const object =
      kind === "chat" ? (stream ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    const head = `{"id":"${id}","object":"${object}","created":${created},"model":${modelJson},"choices":[`;
    // `prompt_tokens_details.cached_tokens` is vLLM's field (PromptTokenUsageInfo; OpenAI's
    // name too), sent only with --enable-prompt-tokens-details and only when some prompt
    // tokens were cached. vLLM's JSON answer dumps the unset field as null; its stream chunks
    // leave unset fields out.
    let cachedTokens = 0;
    const usage = (completion: number, json: boolean): string => {
      const details =
        this.o.enablePromptTokensDetails && cachedTokens > 0
          ? `,"prompt_tokens_details":{"cached_tokens":${cachedTokens}}`
          : json
            ? ',"prompt_tokens_details":null'
            : "";
      return `{"prompt_tokens":${promptTokens},"total_tokens":${promptTokens + completion},"completion_tokens":${completion}${details}}`;
    };
    const stopJson = JSON.stringify(stopReason);
    let done = false;
    const dieAfter = this.o.faults.dieMidStreamAfterTokens;
    if (stream) {
      res.writeHead(200, {
        "content-type": "text/event-stream; charset=utf-8",
        "cache-control": "no-cache",
      });
    }
    const finish = (reason: "stop" | "length" | "abort"): void => {
      done = true;
      this.#active.delete(id);
      this.success[reason] += 1;
    };
    res.on("close", () => {
      if (done) return;
      this.model.cancel(id);
      finish("abort");
    });
    this.#active.set(id, {
      onToken: (event) => {
        if (event.cachedTokens !== undefined) cachedTokens = event.cachedTokens;
        // What this token adds to the returned text (less, or nothing, past a stop string).
        const piece = answer.text.slice(
          answer.offsets[event.tokenIndex],
          answer.offsets[event.tokenIndex + 1],
        );
        const fr = event.finished ? finishReason : null;
        const frJson = fr ? `"${fr}"` : "null";
        if (!stream) {
          if (!event.finished) return;
          const text = JSON.stringify(answer.text);
          const choice =
            kind === "chat"
              ? `{"index":0,"message":{"role":"assistant","content":${text},"tool_calls":[]},"logprobs":null,"finish_reason":${frJson},"stop_reason":${stopJson}}`
              : `{"index":0,"text":${text},"logprobs":null,"finish_reason":${frJson},"stop_reason":${stopJson}}`;
          const payload = `${head}${choice}],"usage":${usage(event.tokenIndex + 1, true)}}`;
          res.writeHead(200, {
            "content-type": "application/json",
            "content-length": Buffer.byteLength(payload),
          });
          res.end(payload);
          finish(finishReason);
          this.#answered1();
          return;
        }
        let out = "";
        if (kind === "chat") {
          if (event.tokenIndex === 0) {
            out += `data: ${head}{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n`;
          }
          // vLLM sets stop_reason only on the last chunk (the others leave it out).
          const sr = event.finished ? `,"stop_reason":${stopJson}` : "";
          out += `data: ${head}{"index":0,"delta":{"content":${JSON.stringify(piece)}},"logprobs":null,"finish_reason":${frJson}${sr}}]}\n\n`;
        } else {
          const sr = event.finished ? stopJson : "null";
          out += `data: ${head}{"index":0,"text":${JSON.stringify(piece)},"logprobs":null,"finish_reason":${frJson},"stop_reason":${sr}}]}\n\n`;
        }
        if (event.finished) {
          if (includeUsage) {
            out += `data: ${head}],"usage":${usage(event.tokenIndex + 1, false)}}\n\n`;
          }
          out += "data: [DONE]\n\n";
          res.end(out);
          finish(finishReason);
          this.#answered1();
          return;
        }
        res.write(out);
        if (dieAfter !== null && event.tokenIndex + 1 >= dieAfter) {
          this.fail(
            `simulated death mid-stream after ${dieAfter} tokens (--die-mid-stream-after-tokens)`,
          );
        }
      },
    });
    this.#kick();
    return undefined;
  }

  #kick(): void {
    if (this.#loopRunning) return;
    this.#loopRunning = true;
    void this.#loop();
  }

  async #loop(): Promise<void> {
    try {
      while (this.#state === "ready") {
        // Back-to-back steps are scheduled on model time, not "now": the time spent writing a
        // step's chunks overlaps the next step (as a GPU runs while the CPU schedules), so the
        // loop does not drift behind the model. A loop that fell further behind restarts at now.
        const now = this.modelNow();
        const last = this.#lastStepEndMs;
        const plan = this.model.step(now - last < this.o.timing.decodeStepMs ? last : now);
        this.#flushKv();
        if (!plan) break;
        await this.clock.sleep((plan.endMs - this.modelNow()) / this.o.timeScale);
        if (this.#state !== "ready") break;
        let tokens = 0;
        for (const event of plan.events) {
          const active = this.#active.get(event.id);
          if (!active) continue;
          tokens += 1;
          if (event.ttftMs !== undefined) this.ttft.observe(event.ttftMs / 1000);
          if (event.itlMs !== undefined) this.itl.observe(event.itlMs / 1000);
          active.onToken(event);
        }
        this.#lastStepEndMs = plan.endMs;
        this.#recentTokens.push({ atMs: plan.endMs, tokens });
        if (this.#recentTokens.length > 4096) this.#recentTokens.splice(0, 2048);
      }
    } catch (error) {
      this.fail(`scheduler loop crashed: ${error instanceof Error ? error.stack : String(error)}`);
    } finally {
      this.#loopRunning = false;
    }
  }
}
