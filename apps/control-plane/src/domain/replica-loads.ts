import type { EngineLoad } from "@llmgw/proto";
import type { ReplicaLoad, ReplicaLoadSample } from "@llmgw/router";
import { engineLoadFromProto } from "@llmgw/wire";
import { loadWithinRange } from "./agent-limits.js";

/**
 * Load unchanged for this long is announced again ({@link ReplicaLoads.onLoad}) with the next
 * report that carries it: agents report only changed load, and routers treat load older than
 * their `loadStaleMs` (default 10 s) as unreported, so a steady replica must not go stale.
 */
export const LOAD_REFRESH_MS = 5_000;

/** Plain load from the wire; absent fields stay absent, an absent message is unknown load. */
export function replicaLoadFromProto(load: EngineLoad | undefined): ReplicaLoad {
  return load ? engineLoadFromProto(load) : {};
}

type MutableLoad = { -readonly [K in keyof ReplicaLoad]: ReplicaLoad[K] };

/**
 * A replica's last load: one object per replica for as long as it is placed, written in place,
 * so the routes handed out with it (`Cluster.readyReplicas`) see new load without being rebuilt.
 */
export interface HeldLoad {
  readonly load: ReplicaLoad;
  /** When it was last written (undefined: never reported). */
  readonly reportedAtMs?: number;
}

/**
 * How much older than the newest taken a node's load report may be scraped and still be
 * ignored as late: a report held up longer than this is rarer than a clock stepped back.
 */
export const LATE_SCRAPE_MAX_MS = 10_000;

interface Held {
  readonly load: MutableLoad;
  reportedAtMs?: number;
  /** The newest scrape time taken from a load report (agent's clock), and the node that sent it. */
  scrapedAtMs?: number;
  scrapedBy?: string;
}

const LOAD_FIELDS = [
  "running",
  "waiting",
  "kvCacheUsage",
  "prefixCacheHitRate",
  "kvCacheTokens",
] as const;

const sameLoad = (a: ReplicaLoad, b: ReplicaLoad) => LOAD_FIELDS.every((f) => a[f] === b[f]);

/** Whether `load` has any field at all (no field: unknown load). */
export const knownLoad = (load: ReplicaLoad) => LOAD_FIELDS.some((f) => load[f] !== undefined);

/** `load` without its absent fields (a copy: held load changes in place). */
export function copyLoad(load: ReplicaLoad): ReplicaLoad {
  const out: MutableLoad = {};
  for (const f of LOAD_FIELDS) if (load[f] !== undefined) out[f] = load[f];
  return out;
}

/**
 * The engine load of every placed replica's rank 0, as its agent last reported it (heartbeat
 * or load report), in memory only: agents report it again after a restart. One of `Cluster`'s
 * parts, over plain values; the cluster decides whose reports count (the node serving the
 * replica's rank 0) and forgets a replica when its placement goes.
 */
export class ReplicaLoads {
  readonly #loads = new Map<string, Held>();
  /**
   * Replica id → the load fields last left out of its reports as out of range, so that an
   * agent sending the same bad reading every heartbeat is logged once, not every time.
   */
  readonly #dropped = new Map<string, string>();
  readonly #listeners = new Set<(sample: ReplicaLoadSample) => void>();
  readonly #log: ((line: string) => void) | undefined;

  constructor(log?: (line: string) => void) {
    this.#log = log;
  }

  /**
   * Writes a replica's load in place and announces it ({@link onLoad}) when it changed, or
   * when the same known load was last announced {@link LOAD_REFRESH_MS} or longer before
   * `atMs`. Unknown load that stays unknown is not news. A field out of the range routers
   * accept (see {@link loadWithinRange}) is left out, unreported: a heartbeat is never refused
   * for it, and one bad reading must not reach every router's stream. Logged once per replica
   * while the same fields stay bad. `nodeId` names the reporter in that log line.
   *
   * `scrapedAtMs` (a load report's scrape time, the agent's clock) orders one node's reports:
   * one scraped before the newest taken from the same node is ignored, as a report held up on
   * a slower connection (an equal time is a re-send of that scrape, and taken). Times from
   * different nodes are never compared. One older by more than {@link LATE_SCRAPE_MAX_MS} is
   * no late report but the agent's clock stepped back, and is taken: else the node's load
   * would stop until its clock caught up. A heartbeat's load carries the scrape it came from
   * too, so a heartbeat held up behind a newer load report does not overwrite it; from an
   * older agent it has none, and is taken as it arrives.
   */
  apply(
    nodeId: string,
    replicaId: string,
    reported: ReplicaLoad,
    atMs: number,
    scrapedAtMs?: number,
  ): void {
    const held = this.#held(replicaId);
    if (scrapedAtMs !== undefined) {
      if (
        held.scrapedBy === nodeId &&
        held.scrapedAtMs !== undefined &&
        scrapedAtMs < held.scrapedAtMs &&
        held.scrapedAtMs - scrapedAtMs <= LATE_SCRAPE_MAX_MS
      )
        return;
      held.scrapedAtMs = scrapedAtMs;
      held.scrapedBy = nodeId;
    }
    const { load, dropped } = loadWithinRange(reported);
    const droppedFields =
      dropped.length === 0 ? "" : dropped.map((d) => d.slice(0, d.indexOf("="))).join(",");
    if (droppedFields !== (this.#dropped.get(replicaId) ?? "")) {
      if (droppedFields === "") {
        this.#dropped.delete(replicaId);
      } else {
        this.#dropped.set(replicaId, droppedFields);
        this.#log?.(
          `replica ${replicaId}: node ${nodeId} reported load out of range, left out as unreported: ${dropped.join(", ")}`,
        );
      }
    }
    if (
      sameLoad(held.load, load) &&
      (!knownLoad(load) ||
        (held.reportedAtMs !== undefined && atMs - held.reportedAtMs < LOAD_REFRESH_MS))
    )
      return;
    for (const f of LOAD_FIELDS) held.load[f] = load[f];
    held.reportedAtMs = atMs;
    if (this.#listeners.size === 0) return;
    const sample: ReplicaLoadSample = { replicaId, load: copyLoad(load), reportedAtMs: atMs };
    for (const l of this.#listeners) l(sample);
  }

  /** The replica's held load (made, unknown, when none is held yet): see {@link HeldLoad}. */
  held(replicaId: string): HeldLoad {
    return this.#held(replicaId);
  }

  /** The replica's held load when one was ever reported since it was placed. */
  reported(replicaId: string): (HeldLoad & { readonly reportedAtMs: number }) | undefined {
    const held = this.#loads.get(replicaId);
    return held?.reportedAtMs === undefined
      ? undefined
      : (held as HeldLoad & { readonly reportedAtMs: number });
  }

  /** Forgets a replica whose placement went. */
  forget(replicaId: string): void {
    this.#loads.delete(replicaId);
    this.#dropped.delete(replicaId);
  }

  /**
   * Called with each load report of a replica's rank 0 whose load changed, and with one that
   * repeats a known load last announced {@link LOAD_REFRESH_MS} or longer before. A sample
   * with no field says the load became unknown. Returns an unsubscribe function.
   */
  onLoad(listener: (sample: ReplicaLoadSample) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  #held(replicaId: string): Held {
    let held = this.#loads.get(replicaId);
    if (!held) {
      held = { load: {} };
      this.#loads.set(replicaId, held);
    }
    return held;
  }
}
