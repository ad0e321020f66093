import { create, toBinary } from "@bufbuild/protobuf";
import { BinaryWriter, WireType } from "@bufbuild/protobuf/wire";
import {
  type ContextValues,
  createContextKey,
  createContextValues,
  type HandlerContext,
  type ServiceImpl,
} from "@connectrpc/connect";
import {
  LoadUpdateSchema,
  type ReportInFlightRequest,
  type ReportUsageRequest,
  type RouterService,
  RoutingDeltaSchema,
  RoutingKeepaliveSchema,
  RoutingSnapshotSchema,
  type WatchRoutingRequest,
  type WatchRoutingResponse,
  WatchRoutingResponseSchema,
} from "@llmgw/proto";
import type { InFlightReport, RoutingFeed, RoutingMessage } from "@llmgw/router";
import { routingMessageToProto } from "@llmgw/wire";
import type { UsageReport } from "../domain/usage.js";
import { ControlPlaneError } from "../errors.js";
import { streamRoutingFeed } from "../routing/publisher.js";
import { RESERVED_ROUTER_IDS, type RouterRegistry } from "../routing/router-registry.js";
import type { UsageBatch } from "../store/usage-store.js";
import { requireToken } from "./auth.js";
import { usageReportToProto, validateReportUsageRequest } from "./usage-requests.js";

const ROUTER_TOKEN = "the router token (llmgw control-plane token --router; LLMGW_ROUTER_TOKEN)";

/** What one `WatchRoutingRequest` may carry. */
export const WATCH_ROUTING_LIMITS = {
  /** As `llmgw router --router-id` accepts it. */
  routerId: /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/,
  /** Ids no remote router may use (the control plane's own router is `in-process`). */
  reservedRouterIds: RESERVED_ROUTER_IDS,
  /** `HOST:PORT` (or empty); shown by `llmgw routers`. */
  address: /^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):\d{1,5}$/,
  addressMaxChars: 255,
  /** Printable, no spaces: `0.1.0`, `0.2.0-dev+3f2a`. */
  version: /^[A-Za-z0-9._+-]*$/,
  versionMaxChars: 64,
  epochMaxChars: 64,
  /** A router's state age beyond ten years is a bug, not an age. */
  stateAgeMaxMs: 10n * 365n * 86_400_000n,
} as const;

/** What one `ReportInFlightRequest` may carry. */
export const REPORT_IN_FLIGHT_LIMITS = {
  /** Replicas one report lists (a router holds at most as many as the cluster has). */
  maxDraining: 10_000,
  /** As routers hold replica ids (`ROUTING_LIMITS.maxNameChars` in `@llmgw/router`). */
  replicaIdMaxChars: 256,
  epochMaxChars: WATCH_ROUTING_LIMITS.epochMaxChars,
} as const;

/**
 * `res` with its one oneof field already encoded, as an unknown field: protobuf-es writes
 * unknown fields verbatim (`writeUnknownFields`, on by default), so every binary stream that
 * sends it copies the bytes instead of encoding the message again. The bytes on the wire are
 * exactly those of `res` (field number, length, payload). A 1,000-replica LoadUpdate takes
 * ~5 ms to encode: once per message rather than once per router.
 */
export function preEncodeRoutingResponse(res: WatchRoutingResponse): WatchRoutingResponse {
  const m = res.message;
  let payload: Uint8Array;
  let field: number;
  switch (m.case) {
    case "snapshot":
      field = 1;
      payload = toBinary(RoutingSnapshotSchema, m.value);
      break;
    case "delta":
      field = 2;
      payload = toBinary(RoutingDeltaSchema, m.value);
      break;
    case "load":
      field = 3;
      payload = toBinary(LoadUpdateSchema, m.value);
      break;
    case "keepalive":
      field = 4;
      payload = toBinary(RoutingKeepaliveSchema, m.value);
      break;
    default:
      return res;
  }
  const encoded = create(WatchRoutingResponseSchema);
  encoded.$unknown = [
    {
      no: field,
      wireType: WireType.LengthDelimited,
      data: new BinaryWriter().bytes(payload).finish(),
    },
  ];
  return encoded;
}

/** Options of {@link createRouterService}. */
export interface RouterServiceDeps {
  /** Aborted when the control plane shuts down: every stream ends (Unavailable). */
  readonly shutdown: AbortSignal;
  /** Messages queued per stream before a slow reader is cut off (see `streamRoutingFeed`). */
  readonly maxQueued?: number;
  /**
   * The publisher's keepalive interval, ms (1–600 000). A stream whose write of one message
   * has not completed within {@link STALLED_WRITE_KEEPALIVES} of them is cut off. Default
   * 2 000 (the publisher's default).
   */
  readonly keepaliveMs?: number;
  /**
   * Takes a valid `ReportInFlight` from `routerId` (what it has in flight on each replica it
   * holds as draining). Absent: reports are accepted and ignored. A throw answers the call
   * with the error's mapping, as any handler's.
   */
  readonly onInFlight?: (routerId: string, report: InFlightReport) => void;
  /**
   * Stores a valid `ReportUsage` batch (`ClusterUsage.report`) and resolves once it is
   * durable. Absent: the call answers `LLMGW_CONTROL_PLANE_STORE_UNAVAILABLE` (routers keep
   * the batch and send it again).
   */
  readonly onUsage?: (batch: UsageBatch) => Promise<UsageReport>;
  /** The clock record times are judged against (epoch ms); default `Date.now`. */
  readonly now?: () => number;
}

/**
 * Keepalive intervals one message may take to be written before its stream is cut off. A
 * healthy router drains a message in milliseconds; a stalled write means a router that stopped
 * reading (SIGSTOP, a hung event loop, a host gone without a RST), which TCP alone would hold
 * for 15 minutes or forever, counted the whole time in every router's share divisor.
 */
export const STALLED_WRITE_KEEPALIVES = 3;

/**
 * The Node request a call came in on, as far as the stall watchdog needs it: an HTTP/1.1
 * `IncomingMessage` or an HTTP/2 `Http2ServerRequest`.
 */
export interface RouterStreamConnection {
  readonly socket: {
    readonly remoteAddress?: string | undefined;
    readonly remotePort?: number | undefined;
    destroy(): unknown;
  };
  /** HTTP/2 only: the call's own stream (there the socket is the whole session's). */
  readonly stream?: { destroy(): unknown };
}

/**
 * Fails a write stuck on the call's connection (ERR_STREAM_DESTROYED, which connect-node takes
 * for a client gone and does not log), so the handler unwinds. Destroying the request is not
 * enough: Node leaves an HTTP/1.1 socket open once the request body was read.
 */
function tearDown(connection: RouterStreamConnection): void {
  (connection.stream ?? connection.socket).destroy();
}

/** Where {@link routerServiceContextValues} puts the connection. */
export const ROUTER_STREAM_CONNECTION = createContextKey<RouterStreamConnection | undefined>(
  undefined,
  { description: "the HTTP request a WatchRouting stream came in on" },
);

/**
 * For `connectNodeAdapter({ contextValues })`: hands each call its Node request, so that a
 * stalled WatchRouting stream is torn down (not only uncounted) and log lines name the peer.
 * Without it a stalled stream still stops counting at once and releases its feed; its socket
 * goes when TCP gives up on it.
 */
export function routerServiceContextValues(req: RouterStreamConnection): ContextValues {
  return createContextValues().set(ROUTER_STREAM_CONNECTION, req);
}

function peerOf(connection: RouterStreamConnection | undefined): string | undefined {
  const address = connection?.socket.remoteAddress;
  if (address === undefined) return undefined;
  const port = connection?.socket.remotePort;
  const host = address.includes(":") ? `[${address}]` : address;
  return port === undefined ? host : `${host}:${port}`;
}

function invalid(message: string): ControlPlaneError {
  return new ControlPlaneError("LLMGW_CONTROL_PLANE_INVALID_ARGUMENT", message);
}

/** Echoes a bad value, bounded. */
const shown = (value: string) =>
  JSON.stringify(value.length > 80 ? `${value.slice(0, 80)}…` : value);

/** Refuses a router id `llmgw router --router-id` would not take, or a reserved one. */
function validateRouterId(message: string, routerId: string): void {
  const L = WATCH_ROUTING_LIMITS;
  if (!L.routerId.test(routerId)) {
    throw invalid(
      `${message}.router_id must be 1–63 letters, digits, '.', '_' or '-', starting alphanumeric (got ${shown(routerId)})`,
    );
  }
  if (L.reservedRouterIds.includes(routerId)) {
    throw invalid(
      `${message}.router_id ${shown(routerId)} is reserved for the control plane's own router; start this router with another --router-id`,
    );
  }
}

/** Refuses a request outside {@link WATCH_ROUTING_LIMITS}, naming the field. */
export function validateWatchRoutingRequest(req: WatchRoutingRequest): void {
  const L = WATCH_ROUTING_LIMITS;
  validateRouterId("WatchRoutingRequest", req.routerId);
  if (
    req.address !== "" &&
    (req.address.length > L.addressMaxChars || !L.address.test(req.address))
  ) {
    throw invalid(
      `WatchRoutingRequest.address must be HOST:PORT of at most ${L.addressMaxChars} characters, or empty (got ${shown(req.address)})`,
    );
  }
  if (req.version.length > L.versionMaxChars || !L.version.test(req.version)) {
    throw invalid(
      `WatchRoutingRequest.version must be at most ${L.versionMaxChars} letters, digits, '.', '_', '+' or '-' (got ${shown(req.version)})`,
    );
  }
  if (req.epoch.length > L.epochMaxChars) {
    throw invalid(
      `WatchRoutingRequest.epoch must be at most ${L.epochMaxChars} characters (got ${req.epoch.length})`,
    );
  }
  if (req.stateAgeMs < 0n || req.stateAgeMs > L.stateAgeMaxMs) {
    throw invalid(
      `WatchRoutingRequest.state_age_ms must be 0–${L.stateAgeMaxMs} (got ${req.stateAgeMs})`,
    );
  }
  // Any short lower-case word: a later router's mode is shown, not refused (its stream is
  // what keeps it routing).
  if (!/^[a-z-]{0,16}$/.test(req.cacheIsolation)) {
    throw invalid(
      `WatchRoutingRequest.cache_isolation must be at most 16 lower-case letters or '-', e.g. "tenant" (got ${shown(req.cacheIsolation)})`,
    );
  }
}

/**
 * Checks a `ReportInFlightRequest` against {@link REPORT_IN_FLIGHT_LIMITS} (router id as for
 * WatchRouting, an epoch, a version a number holds, replica ids bounded and each listed once)
 * and returns it as plain data.
 * @throws ControlPlaneError `LLMGW_CONTROL_PLANE_INVALID_ARGUMENT` naming the field.
 */
export function validateReportInFlightRequest(req: ReportInFlightRequest): InFlightReport {
  const L = REPORT_IN_FLIGHT_LIMITS;
  validateRouterId("ReportInFlightRequest", req.routerId);
  if (req.epoch.length < 1 || req.epoch.length > L.epochMaxChars) {
    throw invalid(
      `ReportInFlightRequest.epoch must be 1–${L.epochMaxChars} characters (got ${req.epoch.length})`,
    );
  }
  if (req.stateVersion > BigInt(Number.MAX_SAFE_INTEGER)) {
    throw invalid(
      `ReportInFlightRequest.state_version must be at most ${Number.MAX_SAFE_INTEGER} (got ${req.stateVersion})`,
    );
  }
  if (req.draining.length > L.maxDraining) {
    throw invalid(
      `ReportInFlightRequest.draining lists ${req.draining.length} replicas, more than ${L.maxDraining}`,
    );
  }
  const seen = new Set<string>();
  const draining = req.draining.map(({ replicaId, inFlight }, i) => {
    if (replicaId.length < 1 || replicaId.length > L.replicaIdMaxChars) {
      throw invalid(
        `ReportInFlightRequest.draining[${i}].replica_id must be 1–${L.replicaIdMaxChars} characters (got ${shown(replicaId)})`,
      );
    }
    if (seen.has(replicaId)) {
      throw invalid(`ReportInFlightRequest.draining[${i}].replica_id repeats ${shown(replicaId)}`);
    }
    seen.add(replicaId);
    return { replicaId, inFlight };
  });
  return { epoch: req.epoch, stateVersion: Number(req.stateVersion), draining };
}

/**
 * `RouterService`: `WatchRouting` streams the routing feed to a router holding the router
 * token (nothing else opens it: the stream carries the engines' API keys). While the stream
 * is open the router is registered (its count is every router's share divisor); it ends when
 * the control plane shuts down (Unavailable), when the router goes away, when a newer stream
 * of the same router id opens (Aborted) or when the router stops reading (ResourceExhausted):
 * more than `maxQueued` messages waiting, or one message not written within
 * {@link STALLED_WRITE_KEEPALIVES} keepalive intervals. A stalled stream stops counting at once
 * (every other router's share grows), releases its feed subscription and has its connection
 * torn down (with {@link routerServiceContextValues}). Each message is converted to protobuf
 * once, whichever number of routers it goes to.
 *
 * `ReportInFlight` (router token too) hands a router's in-flight counts on the replicas it
 * holds as draining to `deps.onInFlight` once validated ({@link validateReportInFlightRequest}),
 * and answers an empty response. `ReportUsage` (router token too) hands a validated batch
 * (`validateReportUsageRequest`) to `deps.onUsage` and answers once it is stored, with every
 * budget's standing.
 */
export function createRouterService(
  feed: RoutingFeed,
  registry: RouterRegistry,
  routerToken: string,
  deps: RouterServiceDeps,
): ServiceImpl<typeof RouterService> {
  const keepaliveMs = deps.keepaliveMs ?? 2_000;
  if (!Number.isInteger(keepaliveMs) || keepaliveMs < 1 || keepaliveMs > 600_000) {
    throw new ControlPlaneError(
      "LLMGW_CONTROL_PLANE_CONFIG_INVALID",
      `router service: keepaliveMs must be a whole number of ms in 1–600000 (got ${keepaliveMs})`,
    );
  }
  const stallMs = STALLED_WRITE_KEEPALIVES * keepaliveMs;
  const converted = new WeakMap<RoutingMessage, WatchRoutingResponse>();
  const encoded = new WeakMap<RoutingMessage, WatchRoutingResponse>();
  const toProto = (message: RoutingMessage): WatchRoutingResponse => {
    let proto = converted.get(message);
    if (proto === undefined) {
      proto = routingMessageToProto(message);
      converted.set(message, proto);
    }
    return proto;
  };
  const toEncoded = (message: RoutingMessage): WatchRoutingResponse => {
    let proto = encoded.get(message);
    if (proto === undefined) {
      proto = preEncodeRoutingResponse(toProto(message));
      encoded.set(message, proto);
    }
    return proto;
  };
  return {
    reportInFlight(req: ReportInFlightRequest, ctx: HandlerContext) {
      requireToken(ctx.requestHeader, routerToken, ROUTER_TOKEN);
      const report = validateReportInFlightRequest(req);
      deps.onInFlight?.(req.routerId, report);
      return {};
    },
    async reportUsage(req: ReportUsageRequest, ctx: HandlerContext) {
      requireToken(ctx.requestHeader, routerToken, ROUTER_TOKEN);
      validateRouterId("ReportUsageRequest", req.routerId);
      const batch = validateReportUsageRequest(req, (deps.now ?? Date.now)());
      if (deps.onUsage === undefined)
        throw new ControlPlaneError(
          "LLMGW_CONTROL_PLANE_STORE_UNAVAILABLE",
          "this control plane keeps no usage now; send the batch again later",
        );
      return usageReportToProto(await deps.onUsage(batch));
    },
    async *watchRouting(req: WatchRoutingRequest, ctx: HandlerContext) {
      requireToken(ctx.requestHeader, routerToken, ROUTER_TOKEN);
      validateWatchRoutingRequest(req);
      // JSON streams render fields, not unknown bytes: they get the message itself.
      const json = /json/i.test(ctx.requestHeader.get("content-type") ?? "");
      const out = json ? toProto : toEncoded;
      deps.shutdown.throwIfAborted();
      const connection = ctx.values.get(ROUTER_STREAM_CONNECTION);
      const peer = peerOf(connection);
      const session = registry.connect({
        id: req.routerId,
        address: req.address,
        version: req.version,
        cacheIsolation: req.cacheIsolation,
        appliesTenantCacheIsolation: req.appliesTenantCacheIsolation,
        ...(peer === undefined ? {} : { peer }),
      });
      const stalled = new AbortController();
      const signal = AbortSignal.any([deps.shutdown, session.replaced, ctx.signal, stalled.signal]);
      const messages = streamRoutingFeed(feed, {
        signal,
        ...(deps.maxQueued === undefined ? {} : { maxQueued: deps.maxQueued }),
      });
      // connect-node pulls the next message only once the last one is written (it waits for
      // 'drain'), so a router that stops reading leaves this generator suspended at `yield`,
      // where no signal reaches it: the watchdog acts from outside.
      let writing = false;
      const watchdog = setTimeout(() => {
        if (!writing) return;
        const reason = `a routing message waited ${stallMs} ms (${STALLED_WRITE_KEEPALIVES} keepalive intervals) for the router to read it; cut off (LLMGW_CONTROL_PLANE_ROUTER_TOO_SLOW)`;
        stalled.abort(
          new ControlPlaneError(
            "LLMGW_CONTROL_PLANE_ROUTER_TOO_SLOW",
            `the router read nothing for ${stallMs} ms while a routing message waited; reconnect for a fresh snapshot`,
          ),
        );
        session.close(reason);
        // Unsubscribes from the feed now (the feed generator is suspended at its own yield).
        messages.return(undefined).catch(() => {});
        if (connection !== undefined) tearDown(connection);
      }, stallMs);
      watchdog.unref();
      try {
        for await (const message of messages) {
          writing = true;
          watchdog.refresh();
          yield out(message);
          writing = false;
          // Written after all, but too late: end with the reason rather than resume.
          stalled.signal.throwIfAborted();
          session.sent(message);
        }
      } finally {
        clearTimeout(watchdog);
        session.close();
      }
    },
  };
}
