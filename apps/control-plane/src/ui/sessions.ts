import { randomBytes } from "node:crypto";
import { clientAddressKey } from "@llmgw/router-server";

/** One browser's login: an opaque id in its httpOnly cookie, a CSRF token the page holds. */
export interface ConsoleSession {
  readonly id: string;
  /** Sent back by the page in `x-llmgw-csrf` on every call; never in a cookie. */
  readonly csrf: string;
  readonly createdAtMs: number;
  readonly expiresAtMs: number;
}

/** Options of {@link createSessionStore}. */
export interface SessionStoreOptions {
  /** How long a login lasts. */
  readonly ttlMs: number;
  /** Sessions held at most; the oldest is dropped for a new one. */
  readonly maxSessions: number;
  readonly now?: () => number;
  /**
   * Called with a session's id as it goes (revoked, found expired, or dropped for a newer
   * one): what was let in on it must end with it.
   */
  readonly onDrop?: (id: string) => void;
}

/**
 * The console's logins, in memory only: a control plane restart or a failover to another
 * instance logs every browser out, which costs one more login and keeps session secrets out
 * of the store. Ids are 256 random bits, so guessing one is hopeless whatever a lookup's timing.
 */
export interface SessionStore {
  create(): ConsoleSession;
  /** The live session with this id, or undefined (unknown or expired; expired ones are dropped). */
  get(id: string): ConsoleSession | undefined;
  revoke(id: string): void;
  readonly size: number;
}

export function createSessionStore(opts: SessionStoreOptions): SessionStore {
  const now = opts.now ?? Date.now;
  // Insertion order is creation order: the first entry is the oldest.
  const sessions = new Map<string, ConsoleSession>();
  const token = () => randomBytes(32).toString("base64url");
  const drop = (id: string): void => {
    if (sessions.delete(id)) opts.onDrop?.(id);
  };
  return {
    create() {
      const at = now();
      for (const [id, s] of sessions) if (s.expiresAtMs <= at) drop(id);
      while (sessions.size >= opts.maxSessions) {
        const oldest = sessions.keys().next().value;
        if (oldest === undefined) break;
        drop(oldest);
      }
      const session = { id: token(), csrf: token(), createdAtMs: at, expiresAtMs: at + opts.ttlMs };
      sessions.set(session.id, session);
      return session;
    },
    get(id) {
      const session = sessions.get(id);
      if (session === undefined) return undefined;
      if (session.expiresAtMs <= now()) {
        drop(id);
        return undefined;
      }
      return session;
    },
    revoke(id) {
      drop(id);
    },
    get size() {
      return sessions.size;
    },
  };
}

/**
 * Failed logins per client within a window; past the limit, logins wait. A client is its
 * address as {@link clientAddressKey} keys it: an IPv6 address counts by its /64, since one
 * host can try from every address of it, an IPv4 address (IPv4-mapped included) on its own.
 */
export interface LoginThrottle {
  /** Milliseconds until `address`'s client may try again; 0 when it may now. */
  retryAfterMs(address: string): number;
  failed(address: string): void;
  succeeded(address: string): void;
}

export function createLoginThrottle(opts: {
  readonly maxFailures: number;
  readonly windowMs: number;
  /** Clients tracked at most (the oldest is forgotten first). */
  readonly maxAddresses: number;
  readonly now?: () => number;
}): LoginThrottle {
  const now = opts.now ?? Date.now;
  const failures = new Map<string, number[]>();
  const recent = (key: string): number[] => {
    const cutoff = now() - opts.windowMs;
    const list = (failures.get(key) ?? []).filter((t) => t > cutoff);
    if (list.length === 0) failures.delete(key);
    else failures.set(key, list);
    return list;
  };
  return {
    retryAfterMs(address) {
      const list = recent(clientAddressKey(address));
      if (list.length < opts.maxFailures) return 0;
      return Math.max(1, (list[list.length - opts.maxFailures] ?? 0) + opts.windowMs - now());
    },
    failed(address) {
      const key = clientAddressKey(address);
      const list = recent(key);
      list.push(now());
      failures.delete(key);
      failures.set(key, list);
      while (failures.size > opts.maxAddresses) {
        const oldest = failures.keys().next().value;
        if (oldest === undefined) break;
        failures.delete(oldest);
      }
    },
    succeeded(address) {
      failures.delete(clientAddressKey(address));
    },
  };
}
