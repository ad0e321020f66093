/**
 * Where a heartbeat stands in its agent's order: the session the agent drew when it started
 * and the heartbeat's number within it (`HeartbeatRequest.session_id`, `sequence`).
 */
export interface ReportOrder {
  readonly sessionId: string;
  readonly sequence: bigint;
}

/**
 * What {@link ReportSessions.admit} says of a heartbeat: `taken`, or why nothing of it is:
 * `older` (its session already gave one numbered as high or higher) or `replaced` (a newer
 * session of the node has reported since).
 */
export type ReportVerdict = "taken" | "older" | "replaced";

/**
 * Replaced sessions remembered per node. An agent restart replaces one; a few more cover a
 * node whose agent restarts in a loop while a stalled connection still holds old heartbeats.
 */
export const REPLACED_SESSIONS_KEPT = 8;

/**
 * The order of one node's heartbeats, in memory. Heartbeats travel on several requests (calls,
 * a stream, the stream after it), so one held up on a slow connection can arrive after a newer
 * one; taking it would move the node back in time (a ready replica shown starting again, a
 * stopped one back, an older GPU reading). A heartbeat is taken when its sequence is above
 * every one taken from its session; the first heartbeat of a new session (an agent that
 * started again) replaces the session before it, and nothing of a replaced session is taken
 * again. A heartbeat without an order (older agents) is always taken, as it arrives, and
 * changes nothing here.
 *
 * Memory only: after a control-plane restart or a new leader, the first heartbeat of each
 * session is taken whatever its number. Heartbeats sent to the instance before cannot reach
 * this one (their connections ended with it), so none of those is older than what it takes.
 */
export class ReportSessions {
  #current: { readonly sessionId: string; sequence: bigint } | undefined;
  /** Session ids replaced on this node, oldest first, at most {@link REPLACED_SESSIONS_KEPT}. */
  readonly #replaced: string[] = [];

  /** Decides whether to take a heartbeat with `order`, and records it when taken. */
  admit(order: ReportOrder | undefined): ReportVerdict {
    if (order === undefined) return "taken";
    const current = this.#current;
    if (current?.sessionId === order.sessionId) {
      if (order.sequence <= current.sequence) return "older";
      current.sequence = order.sequence;
      return "taken";
    }
    if (this.#replaced.includes(order.sessionId)) return "replaced";
    if (current !== undefined) {
      this.#replaced.push(current.sessionId);
      if (this.#replaced.length > REPLACED_SESSIONS_KEPT) this.#replaced.shift();
    }
    this.#current = { sessionId: order.sessionId, sequence: order.sequence };
    return "taken";
  }

  /** The session taken from now and the highest sequence taken in it; undefined before any. */
  get current(): ReportOrder | undefined {
    return this.#current && { ...this.#current };
  }
}
