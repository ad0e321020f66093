/**
 * The routers a control plane streams routing to: who is connected now (their count is each
 * router's share divisor), and who was recently (`llmgw routers`). Memory only: a restarted
 * control plane learns its routers again as they reconnect.
 */
import type { RoutingMessage } from "@llmgw/router";
import { ControlPlaneError } from "../errors.js";

/** How long a disconnected router stays listed. */
export const DISCONNECTED_ROUTERS_KEPT_MS = 10 * 60_000;

/** Routers held at most (connected and recently disconnected). */
export const DEFAULT_MAX_ROUTERS = 1_024;

/**
 * Router ids no stream may take: `in-process` is the control plane's own router
 * (`IN_PROCESS_ROUTER_ID`). A remote router under it would take over that entry, and the
 * count would drop by one while the in-process router still serves.
 */
export const RESERVED_ROUTER_IDS: readonly string[] = ["in-process"];

/** What a router says about itself when its stream opens. */
export interface RouterRegistration {
  readonly id: string;
  /** Where clients reach it, e.g. `10.0.0.9:8080`; "" when it did not say. */
  readonly address: string;
  readonly version: string;
  /** The control plane's own router (`llmgw control-plane` without `--no-public-api`). */
  readonly inProcess?: boolean;
  /** Its `--cache-isolation` ("none" | "tenant" | "key"); "" or absent: not said. */
  readonly cacheIsolation?: string;
  /** It applies tenants' own cache isolation; absent or false: a router before that. */
  readonly appliesTenantCacheIsolation?: boolean;
  /** The peer the stream came from (`10.0.0.9:53122`), for log lines only; absent: unknown. */
  readonly peer?: string;
}

/** One router as `ListRouters` shows it. */
export interface RouterEntry {
  readonly id: string;
  readonly address: string;
  readonly version: string;
  readonly inProcess: boolean;
  /** See {@link RouterRegistration.cacheIsolation}; "" when not said. */
  readonly cacheIsolation: string;
  /** See {@link RouterRegistration.appliesTenantCacheIsolation}. */
  readonly appliesTenantCacheIsolation: boolean;
  /** True while its stream (or the in-process feed) is attached. */
  readonly connected: boolean;
  /** When its latest stream opened (epoch ms). */
  readonly connectedAtMs: number;
  /** When its stream last carried a message (connected) or closed (disconnected), epoch ms. */
  readonly lastSeenMs: number;
  /** Epoch and version of the last snapshot or delta this control plane handed it. */
  readonly epoch: string;
  readonly stateVersion: number;
}

/** One open stream of a router. */
export interface RouterSession {
  readonly id: string;
  /**
   * Aborted (with `LLMGW_CONTROL_PLANE_ROUTER_REPLACED`) when a newer stream of the same
   * router id took over: the older stream ends, the newer one wins.
   */
  readonly replaced: AbortSignal;
  /** Records that `message` went out on this stream (last seen, epoch, version). */
  sent(message: RoutingMessage): void;
  /**
   * Ends the session; the router stays listed, disconnected, and the count drops now.
   * `reason`, when given, is added to the log line. Idempotent.
   */
  close(reason?: string): void;
}

/** Options of {@link createRouterRegistry}. */
export interface RouterRegistryOptions {
  /** Wall clock, epoch ms. Default `Date.now`. */
  readonly now?: () => number;
  /** Default {@link DISCONNECTED_ROUTERS_KEPT_MS}. */
  readonly disconnectedKeptMs?: number;
  /** Default {@link DEFAULT_MAX_ROUTERS}. */
  readonly maxRouters?: number;
  /**
   * The publisher's keepalive interval, ms. A session that was sent a message within it is
   * live: a newer stream of its id taking over is logged as a warning (two routers under one
   * id?). Default 2 000 (the publisher's default).
   */
  readonly keepaliveMs?: number;
  readonly log?: (line: string) => void;
}

/** The registry of routers. */
export interface RouterRegistry {
  /**
   * Registers an open stream. A router id already connected is replaced (its older session's
   * `replaced` signal aborts). Throws `LLMGW_CONTROL_PLANE_ROUTER_LIMIT` when `maxRouters`
   * routers are connected already (disconnected ones are forgotten first, oldest first), and
   * `LLMGW_CONTROL_PLANE_INVALID_ARGUMENT` when a remote router and the in-process one would
   * share an id (neither replaces the other).
   */
  connect(registration: RouterRegistration): RouterSession;
  /** Connected routers first, then disconnected ones, each by id. */
  list(): RouterEntry[];
  /** Routers connected now. */
  readonly connected: number;
  /** Called (synchronously) whenever {@link connected} changes. Returns an unsubscribe function. */
  onConnectedChange(listener: (connected: number) => void): () => void;
}

/** `from 10.0.0.9:53122, address 10.0.0.9:8080`, the parts a registration has. */
function whereFrom(r: RouterRegistration): string {
  const from = r.peer === undefined ? "from an unknown peer" : `from ${r.peer}`;
  return r.address === "" ? `${from}, no address` : `${from}, address ${r.address}`;
}

interface Entry {
  registration: RouterRegistration;
  session: object | undefined;
  connectedAtMs: number;
  lastSeenMs: number;
  epoch: string;
  stateVersion: number;
}

/** Creates an empty {@link RouterRegistry}. */
export function createRouterRegistry(options: RouterRegistryOptions = {}): RouterRegistry {
  const now = options.now ?? Date.now;
  const keptMs = options.disconnectedKeptMs ?? DISCONNECTED_ROUTERS_KEPT_MS;
  const maxRouters = options.maxRouters ?? DEFAULT_MAX_ROUTERS;
  const keepaliveMs = options.keepaliveMs ?? 2_000;
  const log = options.log ?? (() => {});
  const entries = new Map<string, Entry>();
  const replacers = new Map<string, AbortController>();
  const listeners = new Set<(connected: number) => void>();
  let connected = 0;

  const setConnected = (n: number) => {
    if (n === connected) return;
    connected = n;
    for (const l of listeners) l(n);
  };
  const forgetExpired = () => {
    const cutoff = now() - keptMs;
    for (const [id, e] of entries) {
      if (e.session === undefined && e.lastSeenMs < cutoff) entries.delete(id);
    }
  };
  const makeRoom = () => {
    forgetExpired();
    if (entries.size < maxRouters) return;
    let oldest: [string, Entry] | undefined;
    for (const kv of entries) {
      if (kv[1].session === undefined && (!oldest || kv[1].lastSeenMs < oldest[1].lastSeenMs))
        oldest = kv;
    }
    if (oldest === undefined) {
      throw new ControlPlaneError(
        "LLMGW_CONTROL_PLANE_ROUTER_LIMIT",
        `${maxRouters} routers are connected already; this control plane streams to no more`,
      );
    }
    entries.delete(oldest[0]);
  };

  return {
    connect(registration) {
      const previous = entries.get(registration.id);
      const takesOver = previous?.session !== undefined;
      if (
        takesOver &&
        (previous.registration.inProcess === true) !== (registration.inProcess === true)
      ) {
        throw new ControlPlaneError(
          "LLMGW_CONTROL_PLANE_INVALID_ARGUMENT",
          `router id ${registration.id} is the control plane's own router; a remote router needs another id`,
        );
      }
      if (previous === undefined) makeRoom();
      if (takesOver) {
        replacers
          .get(registration.id)
          ?.abort(
            new ControlPlaneError(
              "LLMGW_CONTROL_PLANE_ROUTER_REPLACED",
              `a newer stream of router ${registration.id} replaced this one`,
            ),
          );
        const quietMs = now() - previous.lastSeenMs;
        log(
          quietMs <= keepaliveMs
            ? `warning: router ${registration.id}: a newer stream (${whereFrom(registration)}) replaces one written to ${quietMs} ms ago (${whereFrom(previous.registration)}); do two routers use this id?`
            : `router ${registration.id}: a newer stream (${whereFrom(registration)}) replaces the open one (${whereFrom(previous.registration)})`,
        );
      }
      const token = {};
      const replaced = new AbortController();
      replacers.set(registration.id, replaced);
      const at = now();
      const entry: Entry = {
        registration,
        session: token,
        connectedAtMs: at,
        lastSeenMs: at,
        epoch: "",
        stateVersion: 0,
      };
      entries.set(registration.id, entry);
      if (!takesOver) {
        log(
          `router ${registration.id} connected${registration.inProcess ? " (in-process)" : ""}${registration.address ? ` from ${registration.address}` : ""}`,
        );
        setConnected(connected + 1);
      }
      let open = true;
      return {
        id: registration.id,
        replaced: replaced.signal,
        sent(message) {
          if (!open) return;
          entry.lastSeenMs = now();
          if (message.kind !== "load") {
            entry.epoch = message.epoch;
            entry.stateVersion = message.version;
          }
        },
        close(reason) {
          if (!open) return;
          open = false;
          entry.lastSeenMs = now();
          // A replaced session's entry is no longer the router's: leave the newer one be.
          if (entries.get(registration.id)?.session !== token) return;
          entry.session = undefined;
          replacers.delete(registration.id);
          log(`router ${registration.id} disconnected${reason === undefined ? "" : `: ${reason}`}`);
          setConnected(connected - 1);
        },
      };
    },
    list() {
      forgetExpired();
      return [...entries.values()]
        .map(
          (e): RouterEntry => ({
            id: e.registration.id,
            address: e.registration.address,
            version: e.registration.version,
            inProcess: e.registration.inProcess === true,
            cacheIsolation: e.registration.cacheIsolation ?? "",
            appliesTenantCacheIsolation: e.registration.appliesTenantCacheIsolation === true,
            connected: e.session !== undefined,
            connectedAtMs: e.connectedAtMs,
            lastSeenMs: e.lastSeenMs,
            epoch: e.epoch,
            stateVersion: e.stateVersion,
          }),
        )
        .sort((a, b) =>
          a.connected === b.connected ? a.id.localeCompare(b.id) : a.connected ? -1 : 1,
        );
    },
    get connected() {
      return connected;
    },
    onConnectedChange(listener) {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
  };
}
