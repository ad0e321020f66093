import { isControlPlaneError } from "../errors.js";
import type { ClusterStore, EventRecord, EventSeverity } from "../store/types.js";
import { escapeOutsideText } from "./outside-text.js";

/** Default {@link EventLogOptions.unwrittenKept}. */
export const UNWRITTEN_EVENTS_KEPT = 10_000;

/** True for the store's own failure (a full disk, a lost database), not a bug. */
export const isStoreFailure = (error: unknown): boolean =>
  isControlPlaneError(error) && error.code === "LLMGW_CONTROL_PLANE_STORE_FAILED";

export interface EventLogOptions {
  readonly store: ClusterStore;
  readonly clock: { now(): number };
  /** Each event as one line, and the log's own troubles. */
  readonly log?: (line: string) => void;
  /** Events kept in memory while the store fails. Default {@link UNWRITTEN_EVENTS_KEPT}. */
  readonly unwrittenKept?: number;
}

/**
 * The cluster's event log: what happened, in the store's bounded log, and to subscribers
 * once each event has its id. A store that fails (a full disk) must not fail what caused an
 * event (a heartbeat reporting a crash): events then wait in memory, at most
 * {@link EventLogOptions.unwrittenKept} (the oldest dropped beyond), until {@link retry} finds
 * the store writable again.
 */
export class EventLog {
  readonly #o: EventLogOptions;
  readonly #listeners = new Set<(event: EventRecord) => void>();
  readonly #unwritten: Omit<EventRecord, "id">[] = [];
  #failing = false;
  #dropped = 0;

  constructor(options: EventLogOptions) {
    this.#o = options;
  }

  /**
   * Records an event and logs it as one line. Messages embed text that agents sent
   * (hostnames, problem messages, engine log tails): their control characters are escaped
   * here, once for every event, so that none can forge a log line or a second event.
   */
  record(kind: string, subject: string, message: string, severity: EventSeverity): void {
    const safeSubject = escapeOutsideText(subject);
    const safeMessage = escapeOutsideText(message);
    this.#o.log?.(`${kind} ${safeSubject}: ${safeMessage}`);
    this.#unwritten.push({
      atMs: this.#o.clock.now(),
      kind,
      subject: safeSubject,
      message: safeMessage,
      severity,
    });
    this.#write();
  }

  /** Writes what waits in memory, if anything (called at every tick). */
  retry(): void {
    if (this.#unwritten.length > 0) this.#write();
  }

  /**
   * Events, oldest first, at most `limit` (default 100): the newest ones, or with `afterId`
   * the first ones after it (the next page).
   */
  list(query: { afterId?: number; limit?: number } = {}): EventRecord[] {
    return this.#o.store.listEvents({ afterId: query.afterId, limit: query.limit || 100 });
  }

  /** Calls `listener` with every new event, once stored, until the returned function is called. */
  subscribe(listener: (event: EventRecord) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  #write(): void {
    while (this.#unwritten.length > 0) {
      let event: EventRecord;
      try {
        event = this.#o.store.appendEvent(this.#unwritten[0] as Omit<EventRecord, "id">);
      } catch (error) {
        if (!isStoreFailure(error)) throw error;
        const kept = this.#o.unwrittenKept ?? UNWRITTEN_EVENTS_KEPT;
        const over = this.#unwritten.length - kept;
        if (over > 0) {
          this.#unwritten.splice(0, over);
          this.#dropped += over;
        }
        if (!this.#failing) {
          this.#failing = true;
          this.#o.log?.(
            `events kept in memory only (up to ${kept}), retried every tick until the store takes writes: ${(error as Error).message}`,
          );
        }
        return;
      }
      this.#unwritten.shift();
      for (const listener of this.#listeners) listener(event);
    }
    if (this.#failing) {
      this.#failing = false;
      this.#o.log?.(
        `events written to the state store again${this.#dropped > 0 ? `; ${this.#dropped} older ones were dropped while it failed` : ""}`,
      );
      this.#dropped = 0;
    }
  }
}
