/**
 * The router's link to the control planes: one `WatchRouting` stream at a time, its messages
 * applied to the {@link RoutingState}. Level-triggered: every stream starts with a snapshot, so
 * a router that lost a stream (or a delta) just opens another and is whole again. While no
 * control plane answers, the router keeps serving from the state it holds.
 *
 * Moves to the next URL (jittered backoff from `initialBackoffMs`, doubling to `maxBackoffMs`)
 * on a refused or failed connect, a broken stream, a malformed message, three keepalive
 * intervals without a message, or a message the state answers `resync`. A refused router
 * token is retried every `unauthenticatedRetryMs` and never crashes anything. A stream the
 * control plane ended because a newer stream of the same router id took over (Aborted,
 * `LLMGW_CONTROL_PLANE_ROUTER_REPLACED`) waits `maxBackoffMs` before the next try and is
 * logged as a warning: two routers sharing an id would otherwise take it from each other
 * every `initialBackoffMs`, a full snapshot each time.
 *
 * In-flight reports go to `ReportInFlight` on the control plane the stream is on, with the
 * router token, one call at a time (a newer report replaces one not sent yet), each bounded by
 * `reportTimeoutMs`; a failure is logged once a minute per code and control plane. While no
 * stream is open a report is dropped: the reporter sends the next within a second.
 */
import { rootCertificates } from "node:tls";
import { type Client, Code, ConnectError, createClient, type Transport } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { RouterService } from "@llmgw/proto";
import type {
  InFlightReport,
  RoutingMessage,
  RoutingState,
  UsageAnswer,
  UsageBatch,
} from "@llmgw/router";
import { routingMessageFromProto, usageAnswerFromProto, usageBatchToProto } from "@llmgw/wire";
import type { RouterServiceErrorCode } from "./errors.js";

/** Where the client stands; `streaming` once a stream delivered its snapshot. */
export type RoutingClientState = "connecting" | "streaming" | "backoff" | "closed";

/** Inputs of {@link startRoutingClient}. */
export interface RoutingClientOptions {
  /** Control-plane control URLs, tried in turn. */
  readonly controlPlanes: readonly string[];
  readonly routerToken: string;
  readonly routerId: string;
  readonly address: string;
  readonly version: string;
  /** The router's `--cache-isolation` ("" unknown), for `llmgw routers`. */
  readonly cacheIsolation?: string;
  /** It applies tenants' own cache isolation (not under `--no-auth`); default false. */
  readonly appliesTenantCacheIsolation?: boolean;
  /** Applies each message (the runtime's wrapper around its {@link RoutingState}). */
  readonly apply: (message: RoutingMessage) => ReturnType<RoutingState["apply"]>;
  /** What the router holds now, sent with each WatchRouting request. */
  readonly held: () => { epoch: string | undefined; version: number; ageMs: number | undefined };
  /** PEM CA bundle for `https://` control planes, added to Node's default trust. */
  readonly ca?: string | Buffer;
  /** Default: Connect over HTTP/1.1 to the URL. Tests may pass their own. */
  readonly transportFor?: (url: string) => Transport;
  /** Default 100 ms. */
  readonly initialBackoffMs?: number;
  /** Default 2 000 ms: a restarted control plane is found within about 2 s. */
  readonly maxBackoffMs?: number;
  /** Wait after the token was refused. Default 5 000 ms. */
  readonly unauthenticatedRetryMs?: number;
  /** Keepalive interval assumed before a keepalive says otherwise. Default 2 000 ms. */
  readonly keepaliveIntervalMs?: number;
  /** Longest wait for one `ReportInFlight` call. Default 2 000 ms. */
  readonly reportTimeoutMs?: number;
  /** Jitter source in [0, 1). Default `Math.random`. */
  readonly random?: () => number;
  /** Structured events (never the token). */
  readonly log?: (event: Readonly<Record<string, unknown>>) => void;
  /** Called on every state change. */
  readonly onState?: (state: RoutingClientState, controlPlane: string | undefined) => void;
}

/** A running routing client. */
export interface RoutingClient {
  readonly state: RoutingClientState;
  /** The URL of the current (or last tried) control plane. */
  readonly controlPlane: string | undefined;
  /**
   * Sends `report` to the control plane the stream is on (see the top of this file); returns at
   * once and never throws.
   */
  reportInFlight(report: InFlightReport): void;
  /**
   * Sends a usage batch to the control plane the stream is on and resolves with its answer;
   * rejects while no stream is open or when the call fails (the caller keeps the batch and
   * sends it again: the control plane counts a batch id once).
   */
  reportUsage(batch: UsageBatch): Promise<UsageAnswer>;
  /** Ends the stream, the loop and any report in flight. */
  close(): Promise<void>;
}

/** Keepalive intervals a stream may stay silent before it counts as dead. */
const MISSED_KEEPALIVES = 3;
/** Bounds on a keepalive interval announced by a control plane. */
export const MIN_KEEPALIVE_MS = 100;
export const MAX_KEEPALIVE_MS = 60_000;
/** A resync after a stream this long starts the backoff over. */
const RESYNC_RESET_MS = 30_000;
/** A repeated failure is logged again at most this often. */
const LOG_REPEAT_MS = 60_000;
/** The control plane's code for a stream that a newer one of the same router id replaced. */
const ROUTER_REPLACED = "LLMGW_CONTROL_PLANE_ROUTER_REPLACED";
/** The response header (or trailer) carrying the control plane's `LLMGW_…` code. */
const ERROR_CODE_HEADER = "llmgw-error-code";

/**
 * What a client with `ca` trusts: Node's bundled roots and `ca`. (`ca` alone in Node's TLS
 * options replaces the roots, so a control plane behind a public certificate would be refused.)
 */
export function controlPlaneTrust(ca: string | Buffer): (string | Buffer)[] {
  return [...rootCertificates, ca];
}

/** Why a stream ended, as the loop reacts to it. */
type StreamEnd =
  | { readonly kind: "closed" }
  | { readonly kind: "unauthenticated"; readonly message: string }
  /** A newer stream of this router id took over at the control plane. */
  | { readonly kind: "replaced"; readonly message: string }
  /** The state asked for a snapshot (a gap in versions, another epoch). */
  | { readonly kind: "resync"; readonly lastedMs: number }
  | {
      readonly kind: "failed";
      readonly code: RouterServiceErrorCode;
      readonly message: string;
      /** True when the stream had delivered its snapshot (the backoff starts over). */
      readonly streamed: boolean;
    };

/** Starts the loop; it runs until {@link RoutingClient.close}. */
export function startRoutingClient(options: RoutingClientOptions): RoutingClient {
  if (options.controlPlanes.length === 0)
    throw new TypeError("startRoutingClient: controlPlanes is empty");
  const initialBackoffMs = options.initialBackoffMs ?? 100;
  const maxBackoffMs = options.maxBackoffMs ?? 2_000;
  const unauthenticatedRetryMs = options.unauthenticatedRetryMs ?? 5_000;
  const random = options.random ?? Math.random;
  const log = options.log ?? (() => {});
  const clients = new Map<string, Client<typeof RouterService>>();
  const clientFor = (url: string): Client<typeof RouterService> => {
    let client = clients.get(url);
    if (client === undefined) {
      const transport =
        options.transportFor?.(url) ??
        createConnectTransport({
          baseUrl: url,
          httpVersion: "1.1",
          ...(options.ca === undefined
            ? {}
            : { nodeOptions: { ca: controlPlaneTrust(options.ca) } }),
        });
      client = createClient(RouterService, transport);
      clients.set(url, client);
    }
    return client;
  };

  const stop = new AbortController();
  let state: RoutingClientState = "connecting";
  let current: string | undefined;
  const setState = (next: RoutingClientState, url: string | undefined) => {
    current = url;
    if (next === state) return;
    state = next;
    options.onState?.(next, url);
  };

  /** Takeovers since the last `routing_stream_replaced` line, and when that line was. */
  let replacedSinceLog = 0;
  let replacedLoggedAt = Number.NEGATIVE_INFINITY;

  /** Failures logged recently, by `code url`: a dead control plane is one line a minute. */
  const lastLogged = new Map<string, number>();
  const logFailure = (event: Record<string, unknown>, key: string) => {
    const now = performance.now();
    const last = lastLogged.get(key);
    if (last !== undefined && now - last < LOG_REPEAT_MS) return;
    lastLogged.set(key, now);
    log(event);
  };

  const watch = async (url: string): Promise<StreamEnd> => {
    const ac = new AbortController();
    const onStop = () => ac.abort(stop.signal.reason);
    stop.signal.addEventListener("abort", onStop, { once: true });
    let keepaliveMs = options.keepaliveIntervalMs ?? 2_000;
    let silence: string | undefined;
    const expire = () => {
      silence = `no message for ${MISSED_KEEPALIVES * keepaliveMs}ms (${MISSED_KEEPALIVES} keepalive intervals)`;
      ac.abort(new Error(silence));
    };
    // One timer per interval, pushed back by every message (`refresh` allocates nothing).
    let watchdog = setTimeout(expire, MISSED_KEEPALIVES * keepaliveMs);
    watchdog.unref?.();
    let streamed = false;
    const openedAt = performance.now();
    try {
      const held = options.held();
      const stream = clientFor(url).watchRouting(
        {
          routerId: options.routerId,
          address: options.address,
          version: options.version,
          cacheIsolation: options.cacheIsolation ?? "",
          appliesTenantCacheIsolation: options.appliesTenantCacheIsolation === true,
          epoch: held.epoch ?? "",
          stateVersion: BigInt(held.version),
          stateAgeMs: BigInt(Math.max(0, Math.round(held.ageMs ?? 0))),
        },
        { signal: ac.signal, headers: { authorization: `Bearer ${options.routerToken}` } },
      );
      for await (const response of stream) {
        let message: RoutingMessage;
        try {
          message = routingMessageFromProto(response);
        } catch (error) {
          ac.abort();
          return {
            kind: "failed",
            code: "LLMGW_ROUTER_STREAM_INVALID",
            message: `a malformed routing message: ${(error as Error).message}`,
            streamed,
          };
        }
        if (message.kind === "keepalive") {
          const interval = Math.min(
            MAX_KEEPALIVE_MS,
            Math.max(MIN_KEEPALIVE_MS, message.intervalMs),
          );
          if (interval !== keepaliveMs) {
            keepaliveMs = interval;
            clearTimeout(watchdog);
            watchdog = setTimeout(expire, MISSED_KEEPALIVES * keepaliveMs);
            watchdog.unref?.();
          }
        }
        watchdog.refresh();
        let result: ReturnType<RoutingState["apply"]>;
        try {
          result = options.apply(message);
        } catch (error) {
          ac.abort();
          return {
            kind: "failed",
            code: "LLMGW_ROUTER_STREAM_INVALID",
            message: `a routing message the router refused: ${(error as Error).message}`,
            streamed,
          };
        }
        if (result === "resync") {
          ac.abort();
          log({
            event: "routing_resync",
            controlPlane: url,
            message: `a ${message.kind} the held state cannot follow (epoch ${message.epoch}); reconnecting for a snapshot`,
          });
          return { kind: "resync", lastedMs: performance.now() - openedAt };
        }
        if (!streamed && message.kind === "snapshot") {
          streamed = true;
          lastLogged.clear();
          setState("streaming", url);
          log({
            event: "routing_stream_open",
            controlPlane: url,
            epoch: message.epoch,
            version: message.version,
            routers: message.routers,
          });
        }
      }
      return stop.signal.aborted
        ? { kind: "closed" }
        : {
            kind: "failed",
            code: "LLMGW_ROUTER_CONTROL_PLANE_UNREACHABLE",
            message: "the control plane ended the stream",
            streamed,
          };
    } catch (error) {
      if (stop.signal.aborted) return { kind: "closed" };
      const err = ConnectError.from(error);
      if (err.code === Code.Unauthenticated)
        return { kind: "unauthenticated", message: err.rawMessage };
      // Only the control plane's own word: a connection cut mid-stream is Aborted too, with
      // no code, and must start the backoff over like any broken stream.
      if (err.code === Code.Aborted && err.metadata.get(ERROR_CODE_HEADER) === ROUTER_REPLACED)
        return { kind: "replaced", message: err.rawMessage };
      return {
        kind: "failed",
        code: "LLMGW_ROUTER_CONTROL_PLANE_UNREACHABLE",
        message: silence ?? describe(err),
        streamed,
      };
    } finally {
      clearTimeout(watchdog);
      stop.signal.removeEventListener("abort", onStop);
    }
  };

  const meanwhile = () =>
    options.held().epoch === undefined
      ? "not ready until a control plane answers"
      : "serving from the state held meanwhile";

  const loop = async () => {
    let index = 0;
    let backoffMs = initialBackoffMs;
    while (!stop.signal.aborted) {
      const url = options.controlPlanes[index % options.controlPlanes.length] as string;
      index += 1;
      setState("connecting", url);
      const end = await watch(url);
      if (end.kind === "closed") break;
      let waitMs: number;
      if (end.kind === "unauthenticated") {
        logFailure(
          {
            event: "routing_stream_refused",
            code: "LLMGW_ROUTER_UNAUTHENTICATED",
            controlPlane: url,
            message: `the control plane refused the router token (${end.message}): set LLMGW_ROUTER_TOKEN or --router-token-file to the output of 'llmgw control-plane token --router' on the control plane; retrying every ${unauthenticatedRetryMs}ms, ${meanwhile()}`,
          },
          `unauthenticated ${url}`,
        );
        waitMs = unauthenticatedRetryMs;
      } else if (end.kind === "replaced") {
        // Not logged through logFailure: each flap delivers a snapshot first, which clears it.
        replacedSinceLog += 1;
        if (performance.now() - replacedLoggedAt >= LOG_REPEAT_MS) {
          log({
            event: "routing_stream_replaced",
            code: ROUTER_REPLACED,
            controlPlane: url,
            routerId: options.routerId,
            times: replacedSinceLog,
            message: `the control plane ended this router's stream because another stream of router id ${options.routerId} took over (${end.message}): another router uses this id? Give each router its own --router-id (or state dir); retrying within ${maxBackoffMs}ms, ${meanwhile()}`,
          });
          replacedSinceLog = 0;
          replacedLoggedAt = performance.now();
        }
        backoffMs = maxBackoffMs;
        waitMs = Math.min(maxBackoffMs, backoffMs * (0.5 + random()));
      } else {
        // A stream that broke after its snapshot starts the backoff over; resyncs in a row (a
        // control plane that keeps skipping versions) back off like failures.
        if (end.kind === "failed" ? end.streamed : end.lastedMs > RESYNC_RESET_MS)
          backoffMs = initialBackoffMs;
        if (end.kind === "failed") {
          logFailure(
            {
              event: end.streamed ? "routing_stream_lost" : "routing_stream_failed",
              code: end.code,
              controlPlane: url,
              message: `${end.message}; ${options.controlPlanes.length > 1 ? "trying the next control plane" : "retrying"}, ${meanwhile()}`,
            },
            `${end.code} ${url}`,
          );
        }
        waitMs = Math.min(maxBackoffMs, backoffMs * (0.5 + random()));
        backoffMs = Math.min(maxBackoffMs, backoffMs * 2);
      }
      setState("backoff", url);
      await sleep(waitMs, stop.signal);
    }
    setState("closed", current);
  };

  const reportTimeoutMs = options.reportTimeoutMs ?? 2_000;
  /** A usage batch is up to 10,000 records, stored in one transaction: more time than a report. */
  const usageTimeoutMs = Math.max(reportTimeoutMs, 10_000);
  /** The newest report not sent yet, and the sender's run while one is going. */
  let pendingReport: InFlightReport | undefined;
  let reporting: Promise<void> | undefined;
  const reportFailures = new Map<string, number>();
  const sendReports = async (): Promise<void> => {
    while (pendingReport !== undefined && !stop.signal.aborted) {
      const report = pendingReport;
      pendingReport = undefined;
      const url = current;
      if (state !== "streaming" || url === undefined) return;
      try {
        await clientFor(url).reportInFlight(
          {
            routerId: options.routerId,
            epoch: report.epoch,
            stateVersion: BigInt(report.stateVersion),
            draining: report.draining.map((d) => ({
              replicaId: d.replicaId,
              inFlight: d.inFlight,
            })),
          },
          {
            signal: stop.signal,
            timeoutMs: reportTimeoutMs,
            headers: { authorization: `Bearer ${options.routerToken}` },
          },
        );
      } catch (error) {
        if (stop.signal.aborted) return;
        const err = ConnectError.from(error);
        const key = `${Code[err.code]} ${url}`;
        const now = performance.now();
        const last = reportFailures.get(key);
        if (last !== undefined && now - last < LOG_REPEAT_MS) continue;
        if (reportFailures.size > 100) reportFailures.clear();
        reportFailures.set(key, now);
        log({
          event: "in_flight_report_failed",
          code: "LLMGW_ROUTER_CONTROL_PLANE_UNREACHABLE",
          controlPlane: url,
          message: `ReportInFlight failed (${describe(err)})${err.code === Code.Unimplemented ? ": a control plane older than this router?" : ""}; reporting goes on every second, a drain there waits for a report or its timeout`,
        });
      }
    }
  };

  const startReports = (): void => {
    reporting = sendReports().finally(() => {
      reporting = undefined;
      // One that came after the last check of the loop above.
      if (pendingReport !== undefined && state === "streaming" && !stop.signal.aborted)
        startReports();
      else pendingReport = undefined;
    });
  };

  const running = loop().catch((error: unknown) => {
    // The loop handles every control-plane failure; anything else is a bug worth a line.
    log({ event: "routing_client_crashed", message: String((error as Error)?.stack ?? error) });
  });

  return {
    get state() {
      return state;
    },
    get controlPlane() {
      return current;
    },
    reportInFlight(report) {
      if (state !== "streaming" || stop.signal.aborted) return;
      pendingReport = report;
      if (reporting === undefined) startReports();
    },
    async reportUsage(batch) {
      const url = current;
      if (state !== "streaming" || url === undefined || stop.signal.aborted) {
        throw new Error("no control plane connected");
      }
      const answer = await clientFor(url).reportUsage(usageBatchToProto(options.routerId, batch), {
        signal: stop.signal,
        timeoutMs: usageTimeoutMs,
        headers: { authorization: `Bearer ${options.routerToken}` },
      });
      return usageAnswerFromProto(answer);
    },
    async close() {
      stop.abort(new Error("routing client closed"));
      await running;
      await reporting;
    },
  };
}

/** A Connect error as one line: the code and the network cause (never headers). */
function describe(err: ConnectError): string {
  let cause: unknown = err.cause;
  for (let depth = 0; depth < 4 && cause; depth++) {
    const code = (cause as { code?: unknown }).code;
    if (typeof code === "string") return `${Code[err.code]}: ${code}`;
    cause = (cause as { cause?: unknown }).cause;
  }
  return `${Code[err.code]}: ${err.rawMessage}`;
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    }
    signal.addEventListener("abort", done, { once: true });
  });
}
