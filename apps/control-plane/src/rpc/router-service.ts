import { create, toBinary } from "@bufbuild/protobuf";
import { BinaryWriter, WireType } from "@bufbuild/protobuf/wire";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import {
  LoadUpdateSchema,
  type RouterService,
  RoutingDeltaSchema,
  RoutingKeepaliveSchema,
  RoutingSnapshotSchema,
  type WatchRoutingRequest,
  type WatchRoutingResponse,
  WatchRoutingResponseSchema,
} from "@llmgw/proto";
import type { RoutingFeed, RoutingMessage } from "@llmgw/router";
import { routingMessageToProto } from "@llmgw/wire";
import { ControlPlaneError } from "../errors.js";
import { streamRoutingFeed } from "../routing/publisher.js";
import type { RouterRegistry } from "../routing/router-registry.js";
import { requireToken } from "./auth.js";

const ROUTER_TOKEN = "the router token (llmgw control-plane token --router; LLMGW_ROUTER_TOKEN)";

/** What one `WatchRoutingRequest` may carry. */
export const WATCH_ROUTING_LIMITS = {
  /** As `llmgw router --router-id` accepts it. */
  routerId: /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/,
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
}

function invalid(message: string): ControlPlaneError {
  return new ControlPlaneError("LLMGW_CONTROL_PLANE_INVALID_ARGUMENT", message);
}

/** Echoes a bad value, bounded. */
const shown = (value: string) =>
  JSON.stringify(value.length > 80 ? `${value.slice(0, 80)}…` : value);

/** Refuses a request outside {@link WATCH_ROUTING_LIMITS}, naming the field. */
export function validateWatchRoutingRequest(req: WatchRoutingRequest): void {
  const L = WATCH_ROUTING_LIMITS;
  if (!L.routerId.test(req.routerId)) {
    throw invalid(
      `WatchRoutingRequest.router_id must be 1–63 letters, digits, '.', '_' or '-', starting alphanumeric (got ${shown(req.routerId)})`,
    );
  }
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
}

/**
 * `RouterService`: `WatchRouting` streams the routing feed to a router holding the router
 * token (nothing else opens it: the stream carries the engines' API keys). While the stream
 * is open the router is registered (its count is every router's share divisor); it ends when
 * the control plane shuts down (Unavailable), when the router goes away, when a newer stream
 * of the same router id opens (Aborted) or when the router stops reading (ResourceExhausted).
 * Each message is converted to protobuf once, whichever number of routers it goes to.
 */
export function createRouterService(
  feed: RoutingFeed,
  registry: RouterRegistry,
  routerToken: string,
  deps: RouterServiceDeps,
): ServiceImpl<typeof RouterService> {
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
    async *watchRouting(req: WatchRoutingRequest, ctx: HandlerContext) {
      requireToken(ctx.requestHeader, routerToken, ROUTER_TOKEN);
      validateWatchRoutingRequest(req);
      // JSON streams render fields, not unknown bytes: they get the message itself.
      const json = /json/i.test(ctx.requestHeader.get("content-type") ?? "");
      const out = json ? toProto : toEncoded;
      deps.shutdown.throwIfAborted();
      const session = registry.connect({
        id: req.routerId,
        address: req.address,
        version: req.version,
      });
      const signal = AbortSignal.any([deps.shutdown, session.replaced, ctx.signal]);
      try {
        for await (const message of streamRoutingFeed(feed, {
          signal,
          ...(deps.maxQueued === undefined ? {} : { maxQueued: deps.maxQueued }),
        })) {
          yield out(message);
          // Resumed: the message was written (connect-node waits for the socket to drain).
          session.sent(message);
        }
      } finally {
        session.close();
      }
    },
  };
}
