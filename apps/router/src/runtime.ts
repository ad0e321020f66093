/**
 * The router's routing runtime: a feed (the control plane's publisher in-process, or
 * `WatchRouting` streams from remote control planes) → a {@link RoutingState} → the state file.
 *
 * On start it loads the state file (ready at once, source "saved"), then attaches the feed. A
 * corrupt file is logged (`LLMGW_ROUTER_STATE_CORRUPT`), moved aside, and the router waits for
 * a fresh snapshot; a file that cannot be read (EACCES, EIO…) is logged
 * (`LLMGW_ROUTER_STATE_FAILED`) and left in place. Neither stops the router. The state is
 * saved after membership changes (at most once a second), every 30 s while messages arrive
 * (so the saved "last heard" stays close), and at close.
 *
 * In-flight reports (see in-flight-reporter.ts) go back the way the state came: to the feed's
 * `reportInFlight`, or to `RouterService.ReportInFlight` on the control plane the stream is on.
 */
import { createHash } from "node:crypto";
import path from "node:path";
import {
  createRoutingState,
  type InFlightReport,
  type RoutingFeed,
  type RoutingMessage,
  type RoutingState,
  type UsageAnswer,
  type UsageBatch,
} from "@llmgw/router";
import { isRouterServiceError, RouterServiceError, type RouterServiceErrorCode } from "./errors.js";
import {
  MAX_KEEPALIVE_MS,
  MIN_KEEPALIVE_MS,
  type RoutingClient,
  startRoutingClient,
} from "./routing-client.js";
import {
  moveAsideRoutingStateFile,
  prepareStateDir,
  ROUTING_STATE_FILE,
  readRoutingStateFile,
  writeRoutingStateFile,
} from "./state-file.js";

/** Inputs of {@link startRoutingRuntime}. */
export interface RoutingRuntimeOptions {
  /** In-process: the control plane's publisher (a RoutingFeed). Exclusive with controlPlanes. */
  readonly feed?: RoutingFeed;
  /** Remote: control-plane control URLs (e.g. http://10.0.0.1:7070), tried in turn. */
  readonly controlPlanes?: readonly string[];
  /** The router credential (remote only). */
  readonly routerToken?: string;
  /** PEM CA bundle for `https://` control planes, besides Node's default trust (remote only). */
  readonly controlPlaneCa?: string | Buffer;
  readonly routerId: string;
  /** Where clients reach this router, for `llmgw routers`. */
  readonly address?: string;
  readonly version?: string;
  /** Its `--cache-isolation`, told to the control plane for `llmgw routers` (remote only). */
  readonly cacheIsolation?: string;
  /**
   * It applies tenants' own cache isolation, told to the control plane (remote only): false
   * under `--no-auth`, where no request has a tenant. Default true.
   */
  readonly appliesTenantCacheIsolation?: boolean;
  /** Owner-only dir holding `routing-state.json`; undefined: nothing saved or loaded. */
  readonly stateDir?: string;
  readonly log?: (event: Readonly<Record<string, unknown>>) => void;
  /** Wall clock, epoch ms. Default Date.now. */
  readonly now?: () => number;
  /** Remote client tuning (tests): backoff and keepalive defaults. */
  readonly client?: {
    readonly initialBackoffMs?: number;
    readonly maxBackoffMs?: number;
    readonly unauthenticatedRetryMs?: number;
    readonly keepaliveIntervalMs?: number;
    readonly reportTimeoutMs?: number;
  };
  /** Saves while messages keep arriving at least this often, ms. Default 30 000. */
  readonly saveIntervalMs?: number;
  /**
   * The longest the router serves on a state no control plane has confirmed since, ms
   * (`--max-state-age`): past it the state is {@link RoutingRuntime.stale}. Undefined: no limit.
   */
  readonly maxStateAgeMs?: number;
}

/** Whether the router can route, and how fresh its state is. */
export interface RoutingReadiness {
  /** True once a snapshot was applied, live or from the state file, and while it is not stale. */
  readonly ready: boolean;
  /** True while the state is older than `maxStateAgeMs` ({@link RoutingRuntime.stale}). */
  readonly stale?: true;
  readonly source: "live" | "saved" | "none";
  /** ms since a control plane was last heard (live stream or state file); undefined: never. */
  readonly stateAgeMs?: number;
  readonly epoch?: string;
  readonly version: number;
  /** True while a routing stream (or the in-process feed) is attached. */
  readonly connected: boolean;
  /** The control-plane URL the stream is on (remote only). */
  readonly controlPlane?: string;
}

/** A running routing runtime. */
export interface RoutingRuntime {
  /** routeTable + apiKeys for createRouterHandler. */
  readonly state: RoutingState;
  readiness(): RoutingReadiness;
  /**
   * True while the state was last confirmed by a control plane longer than `maxStateAgeMs`
   * ago: keys revoked since may still be granted in it, so the router refuses requests.
   */
  stale(): boolean;
  /**
   * Hands an in-flight report to whoever sent the state: the feed (in-process) or the control
   * plane the stream is on (remote; dropped while no stream is open, the next one follows
   * within a second). Never throws, never waits; a failure is logged once a minute per kind.
   */
  reportInFlight(report: InFlightReport): void;
  /**
   * Sends a usage batch to whoever sends the state (the in-process control plane, or the
   * control plane the stream is on) and resolves with its answer; rejects when none takes it
   * now (the caller keeps the batch for later).
   */
  reportUsage(batch: UsageBatch): Promise<UsageAnswer>;
  /** Saves the state one last time (when a stateDir is set) and detaches the feed/stream. */
  close(): Promise<void>;
}

/** Keepalive intervals within which a quiet stream is still fresh (see `stale`). */
const STALE_KEEPALIVES = 3;
/** How far ahead of the clock a heard time may be before it is distrusted, ms. */
const CLOCK_SLACK_MS = 60_000;
/** How often a router with `maxStateAgeMs` looks for a change of staleness to log, ms. */
const STALE_CHECK_MS = 1_000;

/** Shortest time between two saves, ms. */
const MIN_SAVE_SPACING_MS = 1_000;

/** Lower-case hex sha256, how key grants hold secrets. */
const sha256Hex = (secret: string): string => createHash("sha256").update(secret).digest("hex");

/**
 * Loads the saved state, then attaches the feed or the remote client.
 * @throws RouterServiceError `LLMGW_ROUTER_CONFIG_INVALID` for options that contradict each
 *   other (both or neither of feed and controlPlanes, remote without a token),
 *   `LLMGW_ROUTER_STATE_FAILED` for a state dir that cannot be made safe.
 */
export async function startRoutingRuntime(options: RoutingRuntimeOptions): Promise<RoutingRuntime> {
  const remote = options.controlPlanes !== undefined && options.controlPlanes.length > 0;
  if (remote === (options.feed !== undefined)) {
    throw new RouterServiceError(
      "LLMGW_ROUTER_CONFIG_INVALID",
      "routing runtime: give exactly one of feed (in-process) and controlPlanes (remote)",
    );
  }
  if (remote && !options.routerToken) {
    throw new RouterServiceError(
      "LLMGW_ROUTER_CONFIG_INVALID",
      "routing runtime: a remote router needs routerToken ('llmgw control-plane token --router')",
    );
  }
  const now = options.now ?? Date.now;
  const log = options.log ?? (() => {});
  const state = createRoutingState({ hashSecret: sha256Hex, now });
  const stateDir = options.stateDir;
  let source: RoutingReadiness["source"] = "none";

  if (stateDir !== undefined) {
    await prepareStateDir(stateDir, process.getuid?.());
    await loadSaved(stateDir);
  }

  async function loadSaved(dir: string): Promise<void> {
    const file = path.join(dir, ROUTING_STATE_FILE);
    try {
      const saved = await readRoutingStateFile(dir);
      if (saved === undefined) return;
      state.apply(saved.snapshot, saved.lastHeardAtMs);
      source = "saved";
      log({
        event: "routing_state_loaded",
        file,
        epoch: saved.snapshot.epoch,
        version: saved.snapshot.version,
        replicas: saved.snapshot.replicas.length,
        stateAgeMs: Math.max(0, now() - saved.lastHeardAtMs),
      });
    } catch (error) {
      if (isRouterServiceError(error) && error.code === "LLMGW_ROUTER_STATE_CORRUPT") {
        const to = await moveAsideRoutingStateFile(dir).catch(() => "(left in place)");
        log({
          event: "routing_state_corrupt",
          code: "LLMGW_ROUTER_STATE_CORRUPT",
          file,
          message: `${error.message}; moved aside to ${to}, not ready until a control plane sends a snapshot`,
        });
        return;
      }
      // Could not read it (EACCES, EMFILE, EIO…): the file may be good, so it stays; the
      // next save after a live snapshot replaces it.
      log({
        event: "routing_state_unreadable",
        code: "LLMGW_ROUTER_STATE_FAILED",
        file,
        message: `${isRouterServiceError(error) ? error.message : `cannot read ${file}: ${(error as NodeJS.ErrnoException)?.code ?? "an unknown error"}`}; left in place, not ready until a control plane sends a snapshot`,
      });
    }
  }

  // Saving: after membership changes (at most once per MIN_SAVE_SPACING_MS), and while
  // messages arrive every saveIntervalMs, so the saved "last heard" stays close to the truth.
  const saveIntervalMs = options.saveIntervalMs ?? 30_000;
  let dirty = false;
  let saveTimer: NodeJS.Timeout | undefined;
  let saving: Promise<void> | undefined;
  let lastSaveAt = Number.NEGATIVE_INFINITY;
  let savedHeardAtMs = state.lastHeardAtMs;
  let closed = false;

  const save = async (): Promise<void> => {
    const snapshot = state.snapshot();
    const heard = state.lastHeardAtMs;
    if (stateDir === undefined || snapshot === undefined || heard === undefined) return;
    try {
      await writeRoutingStateFile(stateDir, {
        savedAtMs: now(),
        lastHeardAtMs: heard,
        snapshot,
      });
      savedHeardAtMs = heard;
    } catch (error) {
      log({
        event: "routing_state_save_failed",
        code: isRouterServiceError(error) ? error.code : "LLMGW_ROUTER_STATE_FAILED",
        message: `${(error as Error).message}; still routing from memory, retrying at the next change`,
      });
    }
  };
  const flush = (): void => {
    saveTimer = undefined;
    if (!dirty || saving !== undefined) return;
    dirty = false;
    saving = save().finally(() => {
      saving = undefined;
      lastSaveAt = performance.now();
      if (dirty && !closed) requestSave();
    });
  };
  const requestSave = (): void => {
    if (stateDir === undefined || closed) return;
    dirty = true;
    if (saveTimer !== undefined || saving !== undefined) return;
    const waitMs = Math.max(0, lastSaveAt + MIN_SAVE_SPACING_MS - performance.now());
    saveTimer = setTimeout(flush, waitMs);
    saveTimer.unref();
  };
  const unsubscribeMembership = state.onMembershipChange(requestSave);
  const heartbeatSave =
    stateDir === undefined
      ? undefined
      : setInterval(() => {
          if (state.lastHeardAtMs !== savedHeardAtMs) requestSave();
        }, saveIntervalMs);
  heartbeatSave?.unref();

  /**
   * The keepalive interval the control plane last announced, ms (2 s until one does), within
   * the bounds the routing client's watchdog takes it in.
   */
  let keepaliveMs = 2_000;
  /** Applies one message; a snapshot applied makes the state "live". */
  const apply = (message: RoutingMessage): ReturnType<RoutingState["apply"]> => {
    if (message.kind === "keepalive")
      keepaliveMs = Math.min(MAX_KEEPALIVE_MS, Math.max(MIN_KEEPALIVE_MS, message.intervalMs));
    const result = state.apply(message);
    if (result === "applied" && message.kind === "snapshot") source = "live";
    return result;
  };

  let connected = false;
  let detach: () => Promise<void>;
  let controlPlane = (): string | undefined => undefined;
  let reportInFlight: (report: InFlightReport) => void;
  let reportUsage: (batch: UsageBatch) => Promise<UsageAnswer>;

  if (options.feed !== undefined) {
    const feed = options.feed;
    let unsubscribe: (() => void) | undefined;
    let resyncTimer: NodeJS.Timeout | undefined;
    let recentResyncs = 0;
    const onMessage = (message: RoutingMessage): void => {
      let result: ReturnType<RoutingState["apply"]>;
      try {
        result = apply(message);
      } catch (error) {
        log({
          event: "routing_message_refused",
          code: "LLMGW_ROUTER_STREAM_INVALID",
          message: (error as Error).message,
        });
        result = "resync";
      }
      if (result !== "resync" || resyncTimer !== undefined || closed) return;
      // Resubscribe for a snapshot, outside the feed's delivery loop; a feed that keeps
      // asking for it is retried once a second, not in a tight loop.
      recentResyncs += 1;
      resyncTimer = setTimeout(
        () => {
          resyncTimer = undefined;
          unsubscribe?.();
          if (!closed) unsubscribe = feed.subscribe(onMessage);
        },
        recentResyncs > 3 ? 1_000 : 0,
      );
    };
    const calm = setInterval(() => {
      recentResyncs = 0;
    }, 10_000);
    calm.unref();
    unsubscribe = feed.subscribe(onMessage);
    connected = true;
    let reportFailedAt = new Map<string, number>();
    reportUsage = async (batch) => {
      if (feed.reportUsage === undefined) throw new Error("the in-process feed takes no usage");
      return feed.reportUsage(options.routerId, batch);
    };
    reportInFlight = (report) => {
      try {
        feed.reportInFlight?.(report);
      } catch (error) {
        // The in-process cluster threw: logged once a minute per kind, the next report retries.
        const kind = String((error as { code?: unknown })?.code ?? (error as Error)?.name);
        const at = performance.now();
        if (at - (reportFailedAt.get(kind) ?? Number.NEGATIVE_INFINITY) < 60_000) return;
        if (reportFailedAt.size > 100) reportFailedAt = new Map();
        reportFailedAt.set(kind, at);
        log({
          event: "in_flight_report_failed",
          kind,
          message: `the in-process control plane refused an in-flight report: ${(error as Error)?.message ?? String(error)}; reporting goes on`,
        });
      }
    };
    detach = async () => {
      clearInterval(calm);
      clearTimeout(resyncTimer);
      unsubscribe?.();
      connected = false;
    };
  } else {
    const client: RoutingClient = startRoutingClient({
      controlPlanes: options.controlPlanes as readonly string[],
      routerToken: options.routerToken as string,
      routerId: options.routerId,
      address: options.address ?? "",
      version: options.version ?? "",
      cacheIsolation: options.cacheIsolation ?? "",
      appliesTenantCacheIsolation: options.appliesTenantCacheIsolation ?? true,
      apply,
      held: () => ({
        epoch: state.epoch,
        version: state.version,
        ageMs: state.lastHeardAtMs === undefined ? undefined : now() - state.lastHeardAtMs,
      }),
      ...(options.controlPlaneCa === undefined ? {} : { ca: options.controlPlaneCa }),
      ...options.client,
      log,
      onState: (s) => {
        connected = s === "streaming";
      },
    });
    controlPlane = () => client.controlPlane;
    reportInFlight = (report) => client.reportInFlight(report);
    reportUsage = (batch) => client.reportUsage(batch);
    detach = async () => {
      await client.close();
      connected = false;
    };
  }

  const maxStateAgeMs = options.maxStateAgeMs;
  const stale = (): boolean => {
    if (maxStateAgeMs === undefined) return false;
    const heard = state.lastHeardAtMs;
    if (heard === undefined) return false;
    const age = now() - heard;
    // A quiet stream carries a keepalive every interval, and the control plane may leave up to
    // two between messages: a limit below three never judges a live stream stale. A time
    // heard well in the future (a saved state read by a host whose clock is behind) cannot be
    // trusted to be recent.
    return age > Math.max(maxStateAgeMs, STALE_KEEPALIVES * keepaliveMs) || age < -CLOCK_SLACK_MS;
  };
  let wasStale = false;
  const watchStaleness = () => {
    const isStale = stale();
    if (isStale === wasStale) return;
    wasStale = isStale;
    const ageMs = state.lastHeardAtMs === undefined ? undefined : now() - state.lastHeardAtMs;
    log(
      isStale
        ? {
            event: "routing_state_stale",
            code: "LLMGW_ROUTER_STATE_STALE" satisfies RouterServiceErrorCode,
            stateAgeMs: ageMs,
            maxStateAgeMs,
            message:
              "no control plane has confirmed the routing state for longer than --max-state-age: refusing requests (503 router_state_stale) until one answers",
          }
        : { event: "routing_state_fresh", stateAgeMs: ageMs },
    );
  };
  const staleTimer =
    maxStateAgeMs === undefined ? undefined : setInterval(watchStaleness, STALE_CHECK_MS);
  staleTimer?.unref?.();
  return {
    state,
    stale,
    readiness() {
      const heard = state.lastHeardAtMs;
      const epoch = state.epoch;
      const cp = connected ? controlPlane() : undefined;
      const old = stale();
      return {
        ready: epoch !== undefined && !old,
        ...(old ? { stale: true as const } : {}),
        source,
        ...(heard === undefined ? {} : { stateAgeMs: Math.max(0, now() - heard) }),
        ...(epoch === undefined ? {} : { epoch }),
        version: state.version,
        connected,
        ...(cp === undefined ? {} : { controlPlane: cp }),
      };
    },
    reportUsage(batch) {
      return closed ? Promise.reject(new Error("routing runtime closed")) : reportUsage(batch);
    },
    reportInFlight(report) {
      if (!closed) reportInFlight(report);
    },
    async close() {
      if (closed) return;
      closed = true;
      await detach();
      unsubscribeMembership();
      clearInterval(heartbeatSave);
      clearInterval(staleTimer);
      clearTimeout(saveTimer);
      await saving;
      if (stateDir !== undefined && (dirty || state.lastHeardAtMs !== savedHeardAtMs)) await save();
    },
  };
}
