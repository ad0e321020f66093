import { DiscoveryError } from "./errors.js";
import { ProblemCodes, problem } from "./problem-codes.js";
import {
  PORT_ERROR_COUNTERS,
  type PortErrorCounterName,
  type PortStateSample,
  portCounterMax,
  readPortStates,
  type SysfsFileReader,
} from "./sysfs.js";
import type { Port, PortCounter, Problem } from "./types.js";

/**
 * When one error counter makes a port unhealthy: it rose by more than `maxIncrease` within
 * `windowS` seconds. Between reads further apart than the window the increase is scaled to the
 * window (a rate); before a full window of history exists the raw increase counts.
 */
export interface PortCounterThreshold {
  /** Errors allowed within the window; 0 = any increase is a problem. */
  readonly maxIncrease: number;
  readonly windowS: number;
  /** Judge the counter only while the port is ACTIVE (a drop on its way down is the drop itself). */
  readonly activeOnly: boolean;
}

/** When a port is unhealthy (see {@link DEFAULT_PORT_THRESHOLDS} for the defaults and sources). */
export interface PortThresholds {
  /** Flapping: at least this many departures from ACTIVE within `flapWindowS`. */
  readonly flapCount: number;
  readonly flapWindowS: number;
  /** An error-counter or rate problem stays this long after the last read that crossed it. */
  readonly holdS: number;
  /** A counter at its maximum (new errors hidden) makes the port unhealthy. */
  readonly saturatedUnhealthy: boolean;
  /** An ACTIVE port below this rate is degraded; undefined = not judged (the default). */
  readonly minActiveRateGbps?: number;
  /** Per error counter; `null` = reported as a rate, never a problem. */
  readonly counters: Readonly<Record<PortErrorCounterName, PortCounterThreshold | null>>;
}

/**
 * The defaults, from what operators run (health-formats.md §3.3):
 * - `flapCount` 3 in `flapWindowS` 600: GPUD calls a port flapping after 3 down-and-back cycles
 *   (over 12 h, counting only drops ≥ 25 s); NVSentinel alerts on more than 2 carrier changes.
 *   Here every departure from ACTIVE counts (a multi-node replica's NCCL communicator dies on
 *   any drop, however short), and the window is 10 min so that a link that has settled is
 *   trusted again after 10 quiet minutes rather than 12 h.
 * - `holdS` 600: GPUD keeps a dropped port unhealthy for 10 min after it recovers.
 * - `symbol_error` > 10 per 1 s and `link_error_recovery` > 5 per 60 s: NVSentinel's non-fatal
 *   thresholds. (Its fatal `symbol_error` > 120 per hour, the IBTA BER 10^-12 bound, is
 *   stricter; set `{"counters":{"symbol_error":{"maxIncrease":120,"windowS":3600}}}` for it.)
 * - `link_downed` (while ACTIVE: the port went down and came back between two reads),
 *   `local_link_integrity_errors`, `excessive_buffer_overrun_errors`: any increase, NVSentinel's
 *   fatal set.
 * - `port_rcv_errors`, `port_xmit_discards`: no threshold. No source names a number (the real
 *   H100 tree in §3.1 shows `port_rcv_errors: 14` on a serving host; discards happen under
 *   congestion), so they are reported as rates only.
 * - `saturatedUnhealthy` true: a saturated counter hides new errors (it stops, it does not
 *   wrap), so the port's error health is unknown; reset the counters (`perfquery -x -R`).
 * - `minActiveRateGbps` unset: GPUD expects ≥ 400 Gb/s on H100-class hosts, but the right
 *   number depends on the fabric; operators set it.
 */
export const DEFAULT_PORT_THRESHOLDS: PortThresholds = Object.freeze({
  flapCount: 3,
  flapWindowS: 600,
  holdS: 600,
  saturatedUnhealthy: true,
  counters: Object.freeze({
    symbol_error: Object.freeze({ maxIncrease: 10, windowS: 1, activeOnly: false }),
    link_downed: Object.freeze({ maxIncrease: 0, windowS: 1, activeOnly: true }),
    link_error_recovery: Object.freeze({ maxIncrease: 5, windowS: 60, activeOnly: false }),
    port_rcv_errors: null,
    local_link_integrity_errors: Object.freeze({ maxIncrease: 0, windowS: 1, activeOnly: false }),
    excessive_buffer_overrun_errors: Object.freeze({
      maxIncrease: 0,
      windowS: 1,
      activeOnly: false,
    }),
    port_xmit_discards: null,
  }),
});

/**
 * Operator input for {@link resolvePortThresholds}: any subset of {@link PortThresholds}; a
 * counter entry may be partial (merged over the default) or `null` (no threshold), and
 * `minActiveRateGbps: null` turns the rate check off.
 */
export interface PortThresholdsOptions {
  readonly flapCount?: number;
  readonly flapWindowS?: number;
  readonly holdS?: number;
  readonly saturatedUnhealthy?: boolean;
  readonly minActiveRateGbps?: number | null;
  readonly counters?: Readonly<
    Partial<Record<PortErrorCounterName, Partial<PortCounterThreshold> | null>>
  >;
}

const MAX_WINDOW_S = 86_400;
const TOP_KEYS = [
  "flapCount",
  "flapWindowS",
  "holdS",
  "saturatedUnhealthy",
  "minActiveRateGbps",
  "counters",
] as const;
const COUNTER_KEYS = ["maxIncrease", "windowS", "activeOnly"] as const;
const COUNTER_NAMES: readonly string[] = PORT_ERROR_COUNTERS.map((c) => c.name);

function invalid(message: string, cause?: unknown): DiscoveryError {
  return new DiscoveryError(
    "LLMGW_DISCOVERY_INVALID_OPTION",
    `port thresholds: ${message}`,
    cause === undefined ? {} : { cause },
  );
}

function echo(value: unknown): string {
  let text: string;
  try {
    text = JSON.stringify(value) ?? String(value);
  } catch {
    text = String(value);
  }
  return text.length > 80 ? `${text.slice(0, 77)}...` : text;
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function checkKeys(path: string, value: Record<string, unknown>, known: readonly string[]): void {
  for (const key of Object.keys(value)) {
    if (!known.includes(key)) {
      throw invalid(`unknown key ${echo(key)}${path} (known: ${known.join(", ")})`);
    }
  }
}

function integer(path: string, value: unknown, min: number, max: number): number {
  if (typeof value !== "number" || !Number.isInteger(value) || value < min || value > max) {
    throw invalid(`${path} must be an integer from ${min} to ${max}, got ${echo(value)}`);
  }
  return value;
}

function boolean(path: string, value: unknown): boolean {
  if (typeof value !== "boolean")
    throw invalid(`${path} must be true or false, got ${echo(value)}`);
  return value;
}

function resolveCounter(
  name: string,
  value: unknown,
  base: PortCounterThreshold | null,
): PortCounterThreshold | null {
  if (value === null) return null;
  const path = `counters.${name}`;
  if (!isPlainObject(value)) {
    throw invalid(`${path} must be an object or null, got ${echo(value)}`);
  }
  checkKeys(` in ${path}`, value, COUNTER_KEYS);
  const maxIncrease = value.maxIncrease ?? base?.maxIncrease;
  const windowS = value.windowS ?? base?.windowS;
  if (maxIncrease === undefined || windowS === undefined) {
    throw invalid(`${path} has no default: give both maxIncrease and windowS`);
  }
  return {
    maxIncrease: integer(`${path}.maxIncrease`, maxIncrease, 0, 1_000_000_000),
    windowS: integer(`${path}.windowS`, windowS, 1, MAX_WINDOW_S),
    activeOnly: boolean(`${path}.activeOnly`, value.activeOnly ?? base?.activeOnly ?? false),
  };
}

/**
 * Validates operator thresholds (an object, e.g. parsed from `--port-thresholds`) and merges
 * them over `base` (default {@link DEFAULT_PORT_THRESHOLDS}). Unknown keys, unknown counter
 * names and out-of-range values throw a {@link DiscoveryError} `LLMGW_DISCOVERY_INVALID_OPTION`
 * naming the key and echoing the value. Windows and holds are whole seconds from 1 to 86400:
 * a port never turns healthy on the read right after its problem stops.
 */
export function resolvePortThresholds(
  options: unknown = {},
  base: PortThresholds = DEFAULT_PORT_THRESHOLDS,
): PortThresholds {
  if (!isPlainObject(options)) throw invalid(`must be a JSON object, got ${echo(options)}`);
  checkKeys("", options, TOP_KEYS);
  const counters = { ...base.counters };
  if (options.counters !== undefined) {
    if (!isPlainObject(options.counters)) {
      throw invalid(`counters must be an object, got ${echo(options.counters)}`);
    }
    for (const [name, value] of Object.entries(options.counters)) {
      if (!COUNTER_NAMES.includes(name)) {
        throw invalid(`unknown counter ${echo(name)} (known: ${COUNTER_NAMES.join(", ")})`);
      }
      const key = name as PortErrorCounterName;
      counters[key] = resolveCounter(name, value, base.counters[key]);
    }
  }
  const rate =
    options.minActiveRateGbps === undefined ? base.minActiveRateGbps : options.minActiveRateGbps;
  if (
    rate !== undefined &&
    rate !== null &&
    (typeof rate !== "number" || !Number.isFinite(rate) || rate <= 0 || rate > 100_000)
  ) {
    throw invalid(`minActiveRateGbps must be a number above 0 (Gb/s) or null, got ${echo(rate)}`);
  }
  return {
    flapCount: integer("flapCount", options.flapCount ?? base.flapCount, 1, 1000),
    flapWindowS: integer("flapWindowS", options.flapWindowS ?? base.flapWindowS, 1, MAX_WINDOW_S),
    holdS: integer("holdS", options.holdS ?? base.holdS, 1, MAX_WINDOW_S),
    saturatedUnhealthy: boolean(
      "saturatedUnhealthy",
      options.saturatedUnhealthy ?? base.saturatedUnhealthy,
    ),
    ...(rate === undefined || rate === null ? {} : { minActiveRateGbps: rate }),
    counters,
  };
}

/** Longest `--port-thresholds` text accepted. */
const MAX_THRESHOLDS_TEXT = 16_384;

/**
 * Parses a JSON object of {@link PortThresholdsOptions} (the agent's `--port-thresholds`) and
 * resolves it over the defaults, e.g.
 * `{"flapCount":5,"counters":{"symbol_error":{"maxIncrease":120,"windowS":3600},"link_downed":null}}`.
 * Throws {@link DiscoveryError} `LLMGW_DISCOVERY_INVALID_OPTION` on bad JSON or bad values.
 */
export function parsePortThresholds(text: string): PortThresholds {
  if (text.length > MAX_THRESHOLDS_TEXT) {
    throw invalid(`longer than ${MAX_THRESHOLDS_TEXT} characters`);
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw invalid(`not JSON (${(error as Error).message}): ${echo(text)}`, error);
  }
  return resolvePortThresholds(value);
}

/** Every port with `health` filled, plus what could not be read (not health verdicts). */
export interface PortHealthReport {
  readonly ports: readonly Port[];
  /**
   * Read problems: `LLMGW_DISCOVERY_SYSFS_UNREADABLE` (a device's `ports/` unlistable),
   * `LLMGW_DISCOVERY_PORT_COUNTERS_UNREADABLE` (counters of a port unknown). Threshold
   * verdicts are in each `port.health.problems`, not repeated here.
   */
  readonly problems: readonly Problem[];
}

/** The pure core of {@link createPortHealthMonitor}: folds samples over time into health. */
export interface PortHealthTracker {
  /** Folds one read taken at `atMs` (milliseconds, monotonic). Ports absent from it are forgotten. */
  observe(samples: readonly PortStateSample[], atMs: number): PortHealthReport;
}

interface CounterHistory {
  /** Last readable value and when it was read. */
  last?: { value: number; atMs: number };
  /** Sum of known increases since tracking began (resets count as the value read). */
  total: number;
  /** (time, total) points covering the threshold window, plus one older point as its base. */
  points: { atMs: number; total: number }[];
  crossing?: { atMs: number; message: string };
}

interface PortHistory {
  wasActive?: boolean;
  /** When each departure from ACTIVE was seen, oldest first. */
  flapsAtMs: number[];
  counters: Map<PortErrorCounterName, CounterHistory>;
  rateCrossing?: { atMs: number; message: string };
}

/** Points kept per counter whatever the window (a 1 h window read every 100 ms). */
const MAX_POINTS = 4096;
/** Departures kept per port. */
const MAX_FLAPS = 1024;

const ACTIVE_STATE = 4;

function fmt(value: number): string {
  return String(Number(value.toFixed(2)));
}

/**
 * Creates a {@link PortHealthTracker}. Per read and port:
 * - counters: new errors = value − previous value; a value below the previous one is a reset
 *   and counts as the value read (NVSentinel's rule); `ratePerSecond` = new errors / seconds
 *   since the previous readable value; a counter at its width's maximum is `saturated` with no
 *   rate (it may have hidden any number of errors), and a value above the maximum means this
 *   driver does not use the PMA width (diffed normally);
 * - flaps: departures from ACTIVE seen between two reads, or the `link_downed` increase if
 *   larger (a drop and recovery between two reads leaves only that trace), counted over
 *   `flapWindowS`; flaps age out of the window, so a flapping port is healthy again once fewer
 *   than `flapCount` remain in it;
 * - an error or rate problem stays until `holdS` has passed since the last read that crossed
 *   its threshold; a saturation problem stays while the counter is saturated (a reset, an
 *   operator's act, clears it on the next read);
 * - a counter that cannot be read keeps what the reads before established: a crossing inside
 *   `holdS` and a last-read saturated value keep their problems (the read failure itself is a
 *   read problem of the report), so a failing read never flips an unhealthy port to healthy.
 * `healthy` is about thresholds only: a DOWN port that is not flapping is `healthy: true` (its
 * state says it is down), and its `rate` (a DOWN NDR port reports 10 Gb/s) is never judged.
 */
export function createPortHealthTracker(
  thresholds: PortThresholds = DEFAULT_PORT_THRESHOLDS,
): PortHealthTracker {
  const histories = new Map<string, PortHistory>();
  const holdMs = thresholds.holdS * 1000;
  const flapWindowMs = thresholds.flapWindowS * 1000;

  /** The crossing still inside `holdS`, and saturation: from this read, or the last one when this failed. */
  function addHeldProblems(
    id: string,
    name: PortErrorCounterName,
    history: CounterHistory,
    atMs: number,
    saturated: boolean,
    problems: Problem[],
  ): void {
    if (history.crossing !== undefined) {
      if (atMs - history.crossing.atMs < holdMs) {
        problems.push(problem(ProblemCodes.portErrors, "sysfs", history.crossing.message));
      } else {
        history.crossing = undefined;
      }
    }
    if (saturated && thresholds.saturatedUnhealthy) {
      const max = portCounterMax(name);
      const bits = Math.log2(max + 1);
      problems.push(
        problem(
          ProblemCodes.portCounterSaturated,
          "sysfs",
          `${id}: ${name} is at ${max}, the most its ${bits}-bit counter holds; new errors are hidden until the counters are reset (perfquery -x -R, or a reboot)`,
        ),
      );
    }
  }

  function observeCounter(
    id: string,
    active: boolean,
    sample: PortStateSample["counters"][number],
    history: CounterHistory,
    atMs: number,
    problems: Problem[],
  ): { counter: PortCounter; increase?: number } {
    const name = sample.name;
    const threshold = thresholds.counters[name];
    const max = portCounterMax(name);
    if ("failure" in sample) {
      // An unreadable counter says nothing new: what the last reads established still holds
      // (a crossing inside its hold, a saturated value that only a reset clears).
      addHeldProblems(id, name, history, atMs, history.last?.value === max, problems);
      return { counter: { name, saturated: false } };
    }
    const { value } = sample;
    const saturated = value === max;
    const previous = history.last;
    let increase: number | undefined;
    let ratePerSecond: number | undefined;
    if (previous !== undefined) {
      increase = value >= previous.value ? value - previous.value : value;
      const elapsedMs = atMs - previous.atMs;
      if (!saturated && elapsedMs > 0) ratePerSecond = (increase * 1000) / elapsedMs;
      history.total += increase;
    }
    history.last = { value, atMs };
    history.points.push({ atMs, total: history.total });

    if (threshold !== null && previous !== undefined && (active || !threshold.activeOnly)) {
      const windowMs = threshold.windowS * 1000;
      let base = history.points[0]!;
      for (const point of history.points) {
        if (point.atMs > atMs - windowMs) break;
        base = point;
      }
      const rose = history.total - base.total;
      const spanMs = atMs - base.atMs;
      const measured = spanMs >= windowMs ? (rose * windowMs) / spanMs : rose;
      if (spanMs > 0 && measured > threshold.maxIncrease) {
        const limit =
          threshold.maxIncrease === 0
            ? "any increase"
            : `${threshold.maxIncrease} per ${threshold.windowS} s`;
        history.crossing = {
          atMs,
          message: `${id}: ${name} rose by ${rose} in ${fmt(spanMs / 1000)} s (${fmt((rose * 1000) / spanMs)}/s)${threshold.activeOnly ? " while ACTIVE" : ""}, above the threshold (${limit}); unhealthy until ${thresholds.holdS} s pass without another`,
        };
      }
    }
    // Keep the points inside the widest window this counter is judged over, plus one as base.
    const keepMs = (threshold?.windowS ?? 0) * 1000;
    while (
      history.points.length > MAX_POINTS ||
      (history.points.length > 1 && history.points[1]!.atMs <= atMs - keepMs)
    ) {
      history.points.shift();
    }
    addHeldProblems(id, name, history, atMs, saturated, problems);
    return {
      counter: {
        name,
        value,
        saturated,
        ...(ratePerSecond === undefined ? {} : { ratePerSecond }),
      },
      ...(increase === undefined ? {} : { increase }),
    };
  }

  function observePort(sample: PortStateSample, atMs: number, readProblems: Problem[]): Port {
    const id = `${sample.device} port ${sample.port}`;
    const key = `${sample.device}/${sample.port}`;
    const history: PortHistory = histories.get(key) ?? { flapsAtMs: [], counters: new Map() };
    histories.set(key, history);
    const active = sample.stateCode === ACTIVE_STATE;
    const problems: Problem[] = [];
    const counters: PortCounter[] = [];
    let linkDownedIncrease = 0;
    for (const read of sample.counters) {
      const counterHistory = history.counters.get(read.name) ?? { total: 0, points: [] };
      history.counters.set(read.name, counterHistory);
      const { counter, increase } = observeCounter(
        id,
        active,
        read,
        counterHistory,
        atMs,
        problems,
      );
      if (read.name === "link_downed" && increase !== undefined) linkDownedIncrease = increase;
      counters.push(counter);
    }
    const unreadable = sample.counters.flatMap((c) =>
      "failure" in c ? [`${c.name} (${c.failure})`] : [],
    );
    if (unreadable.length > 0) {
      readProblems.push(
        problem(
          ProblemCodes.portCountersUnreadable,
          "sysfs",
          `${id}: counters ${unreadable.join(", ")} unreadable; errors there are unknown`,
        ),
      );
    }

    // Bounded: a reset link_downed counts its whole value, which sysfs does not bound for us.
    const departures = Math.min(
      MAX_FLAPS,
      Math.max(history.wasActive === true && !active ? 1 : 0, linkDownedIncrease),
    );
    for (let i = 0; i < departures; i++) history.flapsAtMs.push(atMs);
    history.wasActive = active;
    while (
      history.flapsAtMs.length > MAX_FLAPS ||
      (history.flapsAtMs.length > 0 && history.flapsAtMs[0]! <= atMs - flapWindowMs)
    ) {
      history.flapsAtMs.shift();
    }
    const flaps = history.flapsAtMs.length;
    if (flaps >= thresholds.flapCount) {
      problems.unshift(
        problem(
          ProblemCodes.portFlapping,
          "sysfs",
          `${id} left ACTIVE ${flaps} times in the last ${thresholds.flapWindowS} s (threshold: ${thresholds.flapCount}); unhealthy until fewer remain in the window`,
        ),
      );
    }

    const minRate = thresholds.minActiveRateGbps;
    if (
      minRate !== undefined &&
      active &&
      sample.rateGbps !== undefined &&
      sample.rateGbps < minRate
    ) {
      history.rateCrossing = {
        atMs,
        message: `${id} is ACTIVE at ${sample.rateGbps} Gb/s, below the minimum of ${minRate} Gb/s; unhealthy until ${thresholds.holdS} s pass at full rate`,
      };
    }
    if (history.rateCrossing !== undefined) {
      if (atMs - history.rateCrossing.atMs < holdMs) {
        problems.push(
          problem(ProblemCodes.portRateDegraded, "sysfs", history.rateCrossing.message),
        );
      } else {
        history.rateCrossing = undefined;
      }
    }

    return {
      device: sample.device,
      port: sample.port,
      linkLayer: sample.linkLayer,
      state: sample.state,
      physState: sample.physState,
      ...(sample.rateGbps === undefined ? {} : { rateGbps: sample.rateGbps }),
      health: {
        healthy: problems.length === 0,
        problems,
        flaps,
        flapWindowS: thresholds.flapWindowS,
        counters,
      },
    };
  }

  return {
    observe(samples, atMs) {
      const problems: Problem[] = [];
      const seen = new Set<string>();
      const ports = samples.map((sample) => {
        seen.add(`${sample.device}/${sample.port}`);
        return observePort(sample, atMs, problems);
      });
      for (const key of histories.keys()) if (!seen.has(key)) histories.delete(key);
      return { ports, problems };
    },
  };
}

/** Inputs of {@link createPortHealthMonitor}. */
export interface PortHealthMonitorOptions {
  /** e.g. `/sys/class/infiniband`; missing = no ports, no problem. */
  readonly sysfsRoot: string;
  /** Monotonic milliseconds. Default `performance.timeOrigin + performance.now()`. */
  readonly clock?: () => number;
  /** Validated by {@link resolvePortThresholds}; default {@link DEFAULT_PORT_THRESHOLDS}. */
  readonly thresholds?: PortThresholdsOptions | PortThresholds;
  /** Default: real files, at most 4 KiB each. */
  readonly readFile?: SysfsFileReader;
}

/** Reads the ports and judges them over time; see {@link createPortHealthMonitor}. */
export interface PortHealthMonitor {
  /** Reads every port now (a call while one is in flight gets that one's answer). Never rejects. */
  read(): Promise<PortHealthReport>;
  readonly thresholds: PortThresholds;
}

/**
 * Port health over time: each {@link PortHealthMonitor.read} reads the ports with
 * {@link readPortStates} (counter files that failed with EINVAL are remembered and not read
 * again) and folds them into a {@link createPortHealthTracker}. Call it once per readings
 * interval (every 2–5 s); the thresholds' windows are in seconds, not reads. Throws only for
 * bad thresholds.
 */
export function createPortHealthMonitor(options: PortHealthMonitorOptions): PortHealthMonitor {
  const thresholds = resolvePortThresholds(options.thresholds ?? {});
  const clock = options.clock ?? (() => performance.timeOrigin + performance.now());
  const tracker = createPortHealthTracker(thresholds);
  const einvalPaths = new Set<string>();
  let inFlight: Promise<PortHealthReport> | undefined;
  const readOnce = async (): Promise<PortHealthReport> => {
    const read = await readPortStates({
      sysfsRoot: options.sysfsRoot,
      einvalPaths,
      ...(options.readFile === undefined ? {} : { readFile: options.readFile }),
    });
    const report = tracker.observe(read.ports, clock());
    return { ports: report.ports, problems: [...read.problems, ...report.problems] };
  };
  return {
    thresholds,
    read() {
      inFlight ??= readOnce().finally(() => {
        inFlight = undefined;
      });
      return inFlight;
    },
  };
}
