/**
 * Routers that tell each other what they sent: active-active routers behind a balancer each
 * see only their share of the requests, so each would route on half the fleet's queued prefill
 * and place a new tenant the first time *it* meets it — two routers kept 71% of prompt tokens
 * cached where one kept 78%, and `unique`'s TTFT p90 doubled (bench/routing). With this
 * exchange every router books the others' dispatches as its own (`ReplicaPicker.
 * peerDispatched`): their queued prefill until the first byte, their requests in flight until
 * they end, their prompts in the prefix index, their picks in the bounded-load and hot-hint
 * windows, and the hint homes they chose. With it two routers kept 78% cached, as one, and
 * `unique`'s TTFT p90 read 137 ms against 208–224 apart (bench/README.md, "Peers").
 *
 * The wire: one long-lived `POST /llmgw/peer/v1/events` from each router to each peer, its
 * body a stream of newline-delimited JSON events, written as they happen (one write per event
 * loop turn), renewed every 15 s (a new stream first, then the old one ended) so that the
 * peer's request timeout never cuts one. Authenticated by a key every router of the cluster
 * shares (bearer, compared in constant time) and the sender's router id. Nothing here is
 * needed to route: a peer that is down, slow (its socket buffer full) or not yet reachable
 * loses events, counted and never queued, since an old dispatch misleads more than none; a
 * peer whose last stream ends has its booked prefills and in-flight requests dropped. A
 * malformed event ends its stream with 400 and the reason.
 *
 *   {"t":"sent","model":"m","replica":"r1","prefill":1200,"hint":123,"home":true,"chain":[…],
 *    "tail":123456789}                      the prompt's key past its chain, when it has one
 *   {"t":"first","replica":"r1","prefill":1200}
 *   {"t":"end","replica":"r1"}
 *   {"t":"inflight","replicas":{"r1":3}}     every second: the sender's requests in flight,
 *                                             which replace the receiver's count (an `end` lost
 *                                             while a peer was slow must not count for ever)
 *
 * An event of a type this router does not know is skipped (a newer peer's), not refused.
 */
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import { type ClientRequest, type IncomingMessage, request, type ServerResponse } from "node:http";
import { request as httpsRequest } from "node:https";
import { rootCertificates } from "node:tls";
import type { PeerDispatch } from "@llmgw/router";
import { RouterServiceError } from "./errors.js";

/** The path peers post their events to, on the router's public listener. */
export const PEER_EVENTS_PATH = "/llmgw/peer/v1/events";

/** The longest event line taken (a 512-block chain at 16 digits a block is ~8.7 KB). */
export const MAX_PEER_LINE_BYTES = 64 * 1024;

const ROUTER_ID = /^[A-Za-z0-9._:-]{1,128}$/;
const NAME_MAX = 256;
const MAX_CHAIN = 4096;
const MAX_PREFILL = 10_000_000;
const MAX_BLOCK_KEY = 2 ** 48;
/** A prefix-hash key as block-hash.ts makes them: a whole number below 2^48. */
const isBlockKey = (k: unknown): k is number =>
  Number.isInteger(k) && (k as number) >= 0 && (k as number) < MAX_BLOCK_KEY;
const MIN_KEY_CHARS = 16;
const MAX_IN_FLIGHT = 1_000_000;
/** Most replicas one `inflight` event may name. */
const MAX_REPLICAS = 4096;
/** How often a router tells its peers its requests in flight. */
const IN_FLIGHT_ANNOUNCE_MS = 1_000;

/** An event another router sent. */
export type PeerEvent =
  | ({ readonly t: "sent"; readonly model: string } & PeerDispatch)
  | { readonly t: "first"; readonly replicaId: string; readonly prefillTokens: number }
  | { readonly t: "end"; readonly replicaId: string }
  | { readonly t: "inflight"; readonly replicas: ReadonlyMap<string, number> };

/** What a router tells its peers (router-core.ts calls it on the request path). */
export interface PeerSink {
  /** This router's id on the peers' books (its router id and a suffix for this run). */
  readonly instance?: string;
  /** A request went to `replicaId` ({@link PeerDispatch}). */
  sent(model: string, dispatch: PeerDispatch): void;
  /** The first byte of a prefill {@link sent} came (or the request ended without one). */
  firstByte(replicaId: string, prefillTokens: number): void;
  /** A request {@link sent} ended, however. */
  ended(replicaId: string): void;
}

/** Options of {@link startPeerExchange}. */
export interface PeerExchangeOptions {
  /**
   * This router's id, sent with its events plus a suffix per run (the peers' books are kept per
   * sender); at most 119 characters.
   */
  readonly routerId: string;
  /** The other routers' base URLs (http or https), e.g. `http://10.0.0.8:8080`. */
  readonly peers: readonly string[];
  /** The key every router of the cluster shares (at least 16 characters). */
  readonly key: string;
  /** PEM bundle trusted for `https://` peers besides Node's bundled roots. */
  readonly ca?: string | Buffer;
  /** Applies an event from peer `peer` (the router handler's `applyPeerEvent`). */
  readonly apply: (peer: string, event: PeerEvent) => void;
  /** A peer's stream ended (the handler's `peerGone`). */
  readonly gone: (peer: string) => void;
  /** Counts each event by direction and outcome. */
  readonly count?: (direction: "out" | "in", outcome: PeerEventOutcome) => void;
  readonly log?: (event: Readonly<Record<string, unknown>>) => void;
  /** Reconnect backoff, ms: the first wait, doubled up to `maxBackoffMs`. Defaults 100, 5 000. */
  readonly backoffMs?: number;
  readonly maxBackoffMs?: number;
  /**
   * How often each stream is renewed, ms (default 15 000): under the peers' `--request-timeout`
   * (at least 30 s unless lowered), which bounds how long one request may take to arrive.
   */
  readonly renewMs?: number;
}

/** `out`: sent, or dropped (no stream open to the peer, or its buffer full); `in`: applied or invalid. */
export type PeerEventOutcome = "sent" | "dropped" | "applied" | "invalid";

/** A running exchange. */
export interface PeerExchange extends PeerSink {
  /**
   * Answers a request to {@link PEER_EVENTS_PATH} (the router's listener calls it for that
   * path): 401 without the key, 400 for a bad router id or event, else reads events until the
   * peer ends the stream.
   */
  handle(req: IncomingMessage, res: ServerResponse): void;
  /** Peers with a stream open from this router now. */
  connected(): number;
  /** Ends every stream, both ways, and stops reconnecting. */
  close(): void;
}

/**
 * Checks the options and opens a stream to each peer (reconnecting with backoff).
 * @throws RouterServiceError `LLMGW_ROUTER_CONFIG_INVALID` for a bad router id, peer URL or key.
 */
export function startPeerExchange(options: PeerExchangeOptions): PeerExchange {
  const invalid = (message: string) =>
    new RouterServiceError("LLMGW_ROUTER_CONFIG_INVALID", `peer exchange: ${message}`);
  if (!ROUTER_ID.test(options.routerId) || options.routerId.length > 119)
    throw invalid(
      `the router id must be 1–119 of A-Z a-z 0-9 . _ : -, got ${JSON.stringify(options.routerId)}`,
    );
  if (options.key.length < MIN_KEY_CHARS)
    throw invalid(`the peer key must be at least ${MIN_KEY_CHARS} characters`);
  const urls = options.peers.map((raw) => {
    let url: URL;
    try {
      url = new URL(raw);
    } catch {
      throw invalid(`a peer must be an http(s) URL, got ${JSON.stringify(raw)}`);
    }
    if (url.protocol !== "http:" && url.protocol !== "https:")
      throw invalid(`a peer must be an http(s) URL, got ${JSON.stringify(raw)}`);
    return url;
  });
  const keyDigest = digest(options.key);
  // `ca` alone in Node's TLS options replaces the roots: keep both.
  const trust = options.ca === undefined ? undefined : [...rootCertificates, options.ca];
  // Each run of a router is its own peer: a restarted router's books at the others start
  // afresh, and the old run's go with its last stream (its requests never send their ends).
  const instance = `${options.routerId}:${randomBytes(4).toString("hex")}`;
  const count = options.count ?? (() => {});
  const log = options.log ?? (() => {});
  const links = urls.map(
    (url) =>
      new PeerLink(url, instance, options.key, trust, count, log, {
        backoffMs: options.backoffMs ?? 100,
        maxBackoffMs: options.maxBackoffMs ?? 5_000,
        renewMs: options.renewMs ?? 15_000,
      }),
  );
  /** The peers' streams into this router, ended by `close`. */
  const incoming = new Set<IncomingMessage>();
  /** Streams open from each peer (two while one is renewed). */
  const streams = new Map<string, number>();
  let closed = false;
  /**
   * This router's requests in flight per replica, sent every second, none included: a peer
   * whose stream backs up drops events (an end among them) and keeps the count it last heard
   * until an announcement reaches it, so "nothing in flight" is repeated like any other count.
   */
  const inFlight = new Map<string, number>();
  const announce = setInterval(() => {
    if (links.length === 0) return;
    broadcast(JSON.stringify({ t: "inflight", replicas: Object.fromEntries(inFlight) }));
  }, IN_FLIGHT_ANNOUNCE_MS);
  announce.unref();
  const broadcast = (line: string): void => {
    for (const link of links) link.send(line);
  };
  return {
    instance,
    sent(model, d) {
      if (links.length === 0) return;
      inFlight.set(d.replicaId, (inFlight.get(d.replicaId) ?? 0) + 1);
      broadcast(
        JSON.stringify({
          t: "sent",
          model,
          replica: d.replicaId,
          prefill: d.prefillTokens,
          ...(d.hint === undefined ? {} : { hint: d.hint, home: d.home === true }),
          ...(d.chain === undefined || d.chain.length === 0 ? {} : { chain: Array.from(d.chain) }),
          ...(d.tail === undefined ? {} : { tail: d.tail }),
        }),
      );
    },
    firstByte(replicaId, prefillTokens) {
      if (links.length === 0 || prefillTokens <= 0) return;
      broadcast(JSON.stringify({ t: "first", replica: replicaId, prefill: prefillTokens }));
    },
    ended(replicaId) {
      if (links.length === 0) return;
      const n = (inFlight.get(replicaId) ?? 1) - 1;
      if (n > 0) inFlight.set(replicaId, n);
      else inFlight.delete(replicaId);
      broadcast(JSON.stringify({ t: "end", replica: replicaId }));
    },
    handle(req, res) {
      if (closed) {
        res.writeHead(503, { "content-type": "text/plain" }).end("this router is stopping\n");
        req.resume();
        return;
      }
      const auth = req.headers.authorization ?? "";
      const given = auth.startsWith("Bearer ") ? auth.slice(7) : "";
      if (req.method !== "POST" || !timingSafeEqual(digest(given), keyDigest)) {
        res.writeHead(req.method !== "POST" ? 405 : 401, { "content-type": "text/plain" });
        res.end(req.method !== "POST" ? "POST only\n" : "peer key refused\n");
        req.resume();
        return;
      }
      const peer = req.headers["x-llmgw-router-id"];
      if (typeof peer !== "string" || !ROUTER_ID.test(peer)) {
        res.writeHead(400, { "content-type": "text/plain" }).end("bad x-llmgw-router-id\n");
        req.resume();
        return;
      }
      incoming.add(req);
      streams.set(peer, (streams.get(peer) ?? 0) + 1);
      req.once("close", () => {
        incoming.delete(req);
        // A renewed stream overlaps its predecessor: the peer is gone with its last one.
        const left = (streams.get(peer) ?? 1) - 1;
        if (left > 0) streams.set(peer, left);
        else {
          streams.delete(peer);
          options.gone(peer);
        }
      });
      readPeerStream(
        req,
        res,
        peer,
        (event) => {
          options.apply(peer, event);
          count("in", "applied");
        },
        () => count("in", "invalid"),
        log,
      );
    },
    connected: () => links.filter((l) => l.open).length,
    close() {
      closed = true;
      clearInterval(announce);
      for (const link of links) link.close();
      for (const req of incoming) req.destroy();
      incoming.clear();
    },
  };
}

function digest(text: string): Buffer {
  return createHash("sha256").update(text).digest();
}

/** Reads `req`'s event lines into `apply` until it ends; a bad line ends it with 400. */
function readPeerStream(
  req: IncomingMessage,
  res: ServerResponse,
  peer: string,
  apply: (event: PeerEvent) => void,
  onInvalid: () => void,
  log: (event: Readonly<Record<string, unknown>>) => void,
): void {
  let pending = "";
  let line = 0;
  let failed = false;
  // Headers now, so the sender knows its stream is open; the body ends only with the stream.
  res.writeHead(200, { "content-type": "text/plain" });
  res.flushHeaders();
  req.setEncoding("utf8");
  const fail = (message: string): void => {
    failed = true;
    onInvalid();
    log({ event: "peer_event_invalid", peer, line, message });
    // The status is sent; the reason ends the body and the stream.
    res.end(`line ${line}: ${message}\n`);
    req.destroy();
  };
  req.on("data", (text: string) => {
    if (failed) return;
    pending += text;
    let nl = pending.indexOf("\n");
    while (nl >= 0) {
      line++;
      const parsed = parsePeerEvent(pending.slice(0, nl));
      pending = pending.slice(nl + 1);
      if (typeof parsed === "string") return fail(parsed);
      if (parsed !== undefined) apply(parsed);
      nl = pending.indexOf("\n");
    }
    if (pending.length > MAX_PEER_LINE_BYTES) {
      line++; // the line being read, not the last one read
      fail(`an event longer than ${MAX_PEER_LINE_BYTES} bytes`);
    }
  });
  req.on("end", () => {
    if (!failed) res.end();
  });
}

/** One event line, why it is not one, or undefined for a type this router does not know. */
export function parsePeerEvent(text: string): PeerEvent | string | undefined {
  if (text.length > MAX_PEER_LINE_BYTES) return `an event longer than ${MAX_PEER_LINE_BYTES} bytes`;
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    return "not JSON";
  }
  if (typeof v !== "object" || v === null || Array.isArray(v)) return "not a JSON object";
  const o = v as Record<string, unknown>;
  if (o.t === "inflight") {
    const replicas = o.replicas;
    if (typeof replicas !== "object" || replicas === null || Array.isArray(replicas))
      return `"replicas" must be an object of replica ids to counts`;
    const entries = Object.entries(replicas);
    if (entries.length > MAX_REPLICAS)
      return `"replicas" must name at most ${MAX_REPLICAS} replicas`;
    const counts = new Map<string, number>();
    for (const [id, n] of entries) {
      if (id.length === 0 || id.length > NAME_MAX)
        return `"replicas" keys must be replica ids of 1–${NAME_MAX} characters`;
      if (!Number.isInteger(n) || (n as number) < 0 || (n as number) > MAX_IN_FLIGHT)
        return `"replicas"."${id.slice(0, 64)}" must be a whole number in 0–${MAX_IN_FLIGHT}`;
      counts.set(id, n as number);
    }
    return { t: "inflight", replicas: counts };
  }
  if (o.t !== "sent" && o.t !== "first" && o.t !== "end") {
    return typeof o.t === "string" && o.t.length > 0 && o.t.length <= 32
      ? undefined
      : `"t" must name the event, e.g. "sent"`;
  }
  const name = (field: string): string | undefined => {
    const s = o[field];
    return typeof s === "string" && s.length > 0 && s.length <= NAME_MAX ? s : undefined;
  };
  const replicaId = name("replica");
  if (replicaId === undefined) return `"replica" must be a string of 1–${NAME_MAX} characters`;
  if (o.t === "end") return { t: "end", replicaId };
  const prefillTokens = o.prefill;
  if (
    !Number.isInteger(prefillTokens) ||
    (prefillTokens as number) < 0 ||
    (prefillTokens as number) > MAX_PREFILL
  )
    return `"prefill" must be a whole number of tokens in 0–${MAX_PREFILL}`;
  if (o.t === "first") return { t: "first", replicaId, prefillTokens: prefillTokens as number };
  const model = name("model");
  if (model === undefined) return `"model" must be a string of 1–${NAME_MAX} characters`;
  const event: { -readonly [K in keyof PeerDispatch]: PeerDispatch[K] } & {
    t: "sent";
    model: string;
  } = {
    t: "sent",
    model,
    replicaId,
    prefillTokens: prefillTokens as number,
  };
  if (o.hint !== undefined) {
    if (!Number.isInteger(o.hint) || (o.hint as number) < 0 || (o.hint as number) > 0xffff_ffff)
      return `"hint" must be a 32-bit unsigned integer`;
    if (typeof o.home !== "boolean") return `"home" must be true or false with a "hint"`;
    event.hint = o.hint as number;
    event.home = o.home;
  }
  if (o.chain !== undefined) {
    const chain = o.chain;
    if (!Array.isArray(chain) || chain.length > MAX_CHAIN)
      return `"chain" must be an array of at most ${MAX_CHAIN} block keys`;
    const keys = new Float64Array(chain.length);
    for (let i = 0; i < chain.length; i++) {
      const k = chain[i];
      if (!isBlockKey(k)) return `"chain"[${i}] must be a 48-bit block key`;
      keys[i] = k as number;
    }
    event.chain = keys;
  }
  if (o.tail !== undefined) {
    if (!isBlockKey(o.tail)) return `"tail" must be a 48-bit block key`;
    event.tail = o.tail;
  }
  return event;
}

/** One request carrying events to a peer. */
interface PeerStream {
  readonly req: ClientRequest;
  /** The peer answered 200: events may be written. */
  open: boolean;
  ended: boolean;
  openedAtMs: number;
}

/** A peer that answers nothing this long is taken as down. */
const ANSWER_TIMEOUT_MS = 5_000;
/** A stream that lived this long resets the reconnect backoff when it ends. */
const STABLE_MS = 5_000;

/**
 * The stream to one peer: open, or waiting to reconnect. A stream is one request whose body
 * never ends, and the peer's listener bounds how long a request may take to arrive
 * (`--request-timeout`, default 60 s): every `renewMs` a new stream is opened and, once the
 * peer has answered it, the old one is ended, so none is cut off and no event falls between.
 */
class PeerLink {
  /** The stream events are written to (answered 200, not ended). */
  #current: PeerStream | undefined;
  /** Every stream not ended yet: the current one and one being opened. */
  readonly #streams = new Set<PeerStream>();
  #blocked = false;
  #batch: string[] = [];
  #flushQueued = false;
  #wait: number;
  #timer: NodeJS.Timeout | undefined;
  #closed = false;
  /** Why the last attempt failed, while it is down (logged when the reason changes, not per retry). */
  #down: string | undefined;

  constructor(
    private readonly url: URL,
    private readonly routerId: string,
    private readonly key: string,
    private readonly ca: (string | Buffer)[] | undefined,
    private readonly count: (direction: "out", outcome: PeerEventOutcome) => void,
    private readonly log: (event: Readonly<Record<string, unknown>>) => void,
    private readonly timing: { backoffMs: number; maxBackoffMs: number; renewMs: number },
  ) {
    this.#wait = timing.backoffMs;
    this.#connect();
  }

  get open(): boolean {
    return this.#current?.open === true;
  }

  send(line: string): void {
    if (!this.open || this.#blocked) {
      this.count("out", "dropped");
      return;
    }
    this.#batch.push(line);
    if (this.#flushQueued) return;
    this.#flushQueued = true;
    setImmediate(() => this.#flush());
  }

  close(): void {
    this.#closed = true;
    clearTimeout(this.#timer);
    for (const s of this.#streams) {
      s.ended = true;
      // The current stream ends as a stream should; one still being opened goes at once.
      if (s === this.#current) s.req.end();
      else s.req.destroy();
    }
    this.#streams.clear();
    this.#current = undefined;
  }

  #schedule(ms: number): void {
    clearTimeout(this.#timer);
    this.#timer = setTimeout(() => this.#connect(), ms);
    this.#timer.unref();
  }

  #flush(): void {
    this.#flushQueued = false;
    const s = this.#current;
    const lines = this.#batch;
    this.#batch = [];
    if (s === undefined || !s.open || lines.length === 0) {
      for (const _ of lines) this.count("out", "dropped");
      return;
    }
    for (const _ of lines) this.count("out", "sent");
    if (!s.req.write(`${lines.join("\n")}\n`)) {
      // The peer reads slower than this router routes: drop events until it catches up.
      this.#blocked = true;
      s.req.once("drain", () => {
        if (this.#current === s) this.#blocked = false;
      });
    }
  }

  /** Opens a stream; it replaces the current one once the peer has answered it. */
  #connect(): void {
    if (this.#closed) return;
    const base = this.url.pathname.replace(/\/+$/, "");
    const req = (this.url.protocol === "https:" ? httpsRequest : request)(this.url, {
      method: "POST",
      path: `${base}${PEER_EVENTS_PATH}`,
      headers: {
        authorization: `Bearer ${this.key}`,
        "x-llmgw-router-id": this.routerId,
        "content-type": "application/x-ndjson",
        "transfer-encoding": "chunked",
      },
      ...(this.ca === undefined || this.url.protocol !== "https:" ? {} : { ca: this.ca }),
    });
    const stream: PeerStream = { req, open: false, ended: false, openedAtMs: 0 };
    this.#streams.add(stream);
    req.setNoDelay(true);
    const answerTimer = setTimeout(
      () => down(`no answer in ${ANSWER_TIMEOUT_MS / 1000} s`),
      ANSWER_TIMEOUT_MS,
    );
    answerTimer.unref();
    const down = (reason: string): void => {
      clearTimeout(answerTimer);
      if (stream.ended) return;
      stream.ended = true;
      stream.open = false;
      this.#streams.delete(stream);
      req.destroy();
      if (this.#closed) return;
      if (this.#current !== undefined && this.#current !== stream) {
        // A renewal that failed: the current stream carries on; renew again in a while.
        this.#schedule(this.timing.maxBackoffMs);
        return;
      }
      this.#current = undefined;
      this.#blocked = false;
      // Another stream is being opened (a renewal): it takes over if it is answered.
      if (this.#streams.size > 0) return;
      if (this.#down !== reason) this.log({ event: "peer_down", peer: this.url.origin, reason });
      this.#down = reason;
      // Only a stream that lived resets the backoff: one the peer ends at once (it refused
      // an event) must not be retried as fast as a first connect.
      if (stream.openedAtMs > 0 && performance.now() - stream.openedAtMs >= STABLE_MS)
        this.#wait = this.timing.backoffMs;
      this.#schedule(this.#wait);
      this.#wait = Math.min(this.timing.maxBackoffMs, this.#wait * 2);
    };
    req.on("response", (res: IncomingMessage) => {
      clearTimeout(answerTimer);
      if (stream.ended) {
        res.resume();
        req.destroy();
        return;
      }
      // The body is empty unless the peer refused an event (or the key): then it says why.
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (t: string) => {
        if (body.length < 1_000) body += t;
      });
      res.on("error", (e) => down(e.message));
      if (res.statusCode !== 200) {
        res.on("end", () => down(`HTTP ${res.statusCode}: ${body.trim()}`));
        return;
      }
      res.on("end", () => down(body.trim() || "the peer ended the stream"));
      const previous = this.#current;
      stream.open = true;
      stream.openedAtMs = performance.now();
      this.#current = stream;
      this.#blocked = false;
      if (previous !== undefined && previous !== stream && !previous.ended) {
        previous.ended = true;
        previous.open = false;
        this.#streams.delete(previous);
        previous.req.end();
      }
      if (this.#down !== undefined) this.log({ event: "peer_up", peer: this.url.origin });
      this.#down = undefined;
      this.#schedule(this.timing.renewMs);
    });
    req.on("error", (e) => down(e.message));
    req.on("close", () => down("closed"));
    req.flushHeaders();
  }
}
