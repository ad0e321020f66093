/**
 * Issue 17's phase of the control-plane benchmark: routers subscribed to the control plane
 * (`remote-router` children: `startRouter` over a real `WatchRouting` stream each, in its own
 * process), OpenAI traffic through one of them to a real upstream, and the fleet's engine load
 * churning through `ReportLoad` — measured in windows with and without the churn, alternated
 * over rounds:
 *
 * - the control plane's CPU (cores, from /proc), heartbeat and ReportLoad latency;
 * - delta fan-out delay: an API key is created every second and the previous one revoked; from
 *   just before the admin call (epoch ms) to the moment each router's routing state holds (or
 *   drops) the grant, as the router process notes on its membership change;
 * - router CPU per request (the router carrying the traffic, process CPU ÷ wrk's requests).
 */
import { performance } from "node:perf_hooks";
import type { Client } from "@connectrpc/connect";
import type { ClusterService } from "@llmgw/proto";
import { type BenchChild, loadAverage, startBenchChild } from "../lib/children.js";
import { defaultGenerator, type LoadResult, median, runLoad } from "../lib/load.js";
import type { KeyArrivals, RemoteRouterChildConfig, RouterReport } from "../lib/processes.js";
import { quantile } from "../lib/table.js";
import type { Fleet, LoadVia } from "./fleet.js";
import { log } from "./processes.js";
import {
  type HotFunction,
  hotFunctions,
  inclusiveFunctions,
  saveProfile,
  startProfiler,
} from "./profile.js";
import { measureWindow, type WindowResult } from "./window.js";

/** Settings of the phase. */
export interface RoutingPhaseConfig {
  readonly routers: number;
  readonly rounds: number;
  readonly seconds: number;
  /** Load report interval of every agent while the load churns, ms. */
  readonly loadIntervalMs: number;
  /**
   * How the churning load travels, one churn window per entry and round; the first is the one
   * the goals judge ("stream", what agents do by default), the others are baselines.
   */
  readonly loadVia: readonly LoadVia[];
  /** wrk connections against the traffic router. */
  readonly trafficConnections: number;
  /** The served model the traffic asks for (its replicas answer at the trivial upstream). */
  readonly trafficModel: string;
  /** The traffic's API key (a real key: the router checks it on every request). */
  readonly trafficKey: string;
}

/**
 * Fan-out delays of one window, ms: from the control plane's own timestamp of the change to
 * the router holding it (`p50Ms`…), and from this process's call (`asked…`).
 */
export interface FanOut {
  /** Admin changes made (key creations and revocations). */
  readonly changes: number;
  /** change × router pairs measured. */
  readonly samples: number;
  /** Pairs whose change never showed at that router (within the window plus 2 s). */
  readonly missing: number;
  /** Changes whose answer carried no server timestamp (measured from the call instead). */
  readonly withoutServerTime: number;
  readonly p50Ms: number | undefined;
  readonly p99Ms: number | undefined;
  readonly maxMs: number | undefined;
  /** From just before the admin call (includes the admin RPC and this process's lateness). */
  readonly askedP99Ms: number | undefined;
  /** The admin call itself (request to answer), p50. */
  readonly adminP50Ms: number | undefined;
  /** Per router: p99. */
  readonly perRouterP99Ms: readonly (number | undefined)[];
}

/** One measured window. */
export interface RoutingWindow {
  readonly round: number;
  readonly churn: boolean;
  /** How the load travelled in a churn window (undefined: steady). */
  readonly loadVia: LoadVia | undefined;
  readonly cp: WindowResult;
  readonly reportLoad: {
    /** ReportLoad calls answered, or StreamLoad messages taken. */
    readonly rpcs: number;
    readonly perSecond: number;
    readonly replicaLoadsPerSecond: number;
    readonly errors: number;
    readonly p50Ms: number | undefined;
    readonly p99Ms: number | undefined;
  };
  readonly traffic: LoadResult;
  readonly router: {
    readonly cpuUsPerRequest: number | undefined;
    readonly loopP99Ms: number;
  };
  readonly fanOut: FanOut;
}

/** What the phase measured. */
export interface RoutingPhaseResult {
  readonly routers: number;
  readonly routerKind: string;
  readonly loadIntervalMs: number;
  readonly replicasWithLoad: number;
  readonly windows: readonly RoutingWindow[];
  /** With `--cpu-prof`: the control plane's hottest functions in round 1's judged churn window. */
  readonly hot?: readonly HotFunction[];
  readonly summary: {
    readonly cpCoresChurn: number;
    readonly cpCoresNoChurn: number;
    readonly fanOutP99MsChurn: number | undefined;
    readonly fanOutP99MsNoChurn: number | undefined;
    readonly fanOutMissing: number;
    readonly routerCpuChurn: number;
    readonly routerCpuNoChurn: number;
    /** Median over rounds of (churn ÷ no churn) router CPU per request. */
    readonly routerCpuRatio: number;
    readonly routerCpuRatioRange: readonly [number, number];
    /** Per way of reporting (the first is the one above): CP cores and router CPU ratio. */
    readonly byLoadVia: readonly {
      readonly via: LoadVia;
      readonly cpCores: number;
      readonly routerCpu: number;
      readonly routerCpuRatio: number;
    }[];
  };
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
const round = (n: number | undefined, digits = 1) =>
  n === undefined || Number.isNaN(n) ? undefined : Number(n.toFixed(digits));

/**
 * One admin change: when the control plane made it (the key's `created_at` / `revoked_at`,
 * epoch ms on this same host's clock) and when this process asked for it (just before the
 * call; later than the truth by this process's own event-loop lateness, which the 1,000-agent
 * fleet makes large).
 */
interface Change {
  readonly keyId: string;
  readonly kind: "create" | "revoke";
  readonly serverAtMs: number | undefined;
  readonly askedAtMs: number;
  readonly adminMs: number;
}

/** Creates a key every second and revokes the previous one, until `untilMs` (performance). */
async function driveKeyChanges(
  admin: Client<typeof ClusterService>,
  untilMs: number,
  tag: string,
): Promise<Change[]> {
  const changes: Change[] = [];
  let previous: string | undefined;
  for (let i = 0; performance.now() < untilMs - 1_000; i++) {
    const tick = performance.now();
    const create = async (): Promise<string | undefined> => {
      const askedAtMs = Date.now();
      const t0 = performance.now();
      const created = await admin.createApiKey({ name: `fanout-${tag}-${i}` });
      const key = created.key;
      if (key?.id) {
        changes.push({
          keyId: key.id,
          kind: "create",
          serverAtMs: Number(key.createdAtUnixMs) || undefined,
          askedAtMs,
          adminMs: performance.now() - t0,
        });
      }
      return key?.id;
    };
    const id = await create();
    await sleep(Math.max(0, tick + 500 - performance.now()));
    if (previous) await revoke(previous);
    previous = id;
    await sleep(Math.max(0, tick + 1_000 - performance.now()));
  }
  if (previous) await revoke(previous);
  return changes;

  async function revoke(keyId: string): Promise<void> {
    const askedAtMs = Date.now();
    const t0 = performance.now();
    const res = await admin.revokeApiKey({ key: keyId });
    const at = res.key?.revokedAtUnixMs;
    changes.push({
      keyId,
      kind: "revoke",
      serverAtMs: at === undefined ? undefined : Number(at),
      askedAtMs,
      adminMs: performance.now() - t0,
    });
  }
}

function fanOut(changes: readonly Change[], arrivals: readonly KeyArrivals[]): FanOut {
  const all: number[] = [];
  const asked: number[] = [];
  let missing = 0;
  const perRouter = arrivals.map((a) => {
    const mine: number[] = [];
    for (const c of changes) {
      const seen = c.kind === "create" ? a.appeared[c.keyId] : a.gone[c.keyId];
      if (seen === undefined) {
        missing++;
        continue;
      }
      mine.push(seen - (c.serverAtMs ?? c.askedAtMs));
      asked.push(seen - c.askedAtMs);
    }
    all.push(...mine);
    return round(quantile(mine, 0.99));
  });
  return {
    changes: changes.length,
    samples: changes.length * arrivals.length,
    missing,
    withoutServerTime: changes.filter((c) => c.serverAtMs === undefined).length,
    p50Ms: round(quantile(all, 0.5)),
    p99Ms: round(quantile(all, 0.99)),
    maxMs: round(all.length > 0 ? Math.max(...all) : undefined),
    askedP99Ms: round(quantile(asked, 0.99)),
    adminP50Ms: round(
      quantile(
        changes.map((c) => c.adminMs),
        0.5,
      ),
    ),
    perRouterP99Ms: perRouter,
  };
}

/** Starts the routers, runs the windows, stops the routers. */
export async function runRoutingPhase(options: {
  readonly config: RoutingPhaseConfig;
  readonly controlUrl: string;
  readonly cpPid: number;
  readonly routerToken: string;
  readonly admin: Client<typeof ClusterService>;
  readonly fleet: Fleet;
  readonly ticks: number;
  /** The control plane's inspector port (`--cpu-prof`): round 1's judged churn window is profiled. */
  readonly inspectPort?: number;
}): Promise<RoutingPhaseResult> {
  const { config, fleet, admin } = options;
  const routers: BenchChild[] = [];
  try {
    const started = await Promise.all(
      Array.from({ length: config.routers }, (_, i) =>
        startBenchChild(
          "remote-router",
          {
            controlPlane: options.controlUrl,
            routerId: `bench-router-${i}`,
          } satisfies RemoteRouterChildConfig,
          120_000,
          { env: { LLMGW_ROUTER_TOKEN: options.routerToken } },
        ),
      ),
    );
    routers.push(...started);
    const deadline = performance.now() + 60_000;
    for (const r of routers) {
      for (;;) {
        const res = await fetch(`${r.url}/readyz`).catch(() => undefined);
        if (res?.status === 200) break;
        if (performance.now() > deadline) throw new Error(`router ${r.url} not ready in 60 s`);
        await sleep(200);
      }
    }
    const traffic = routers[0] as BenchChild;
    // The traffic key reached the traffic router (it may arrive just after the snapshot).
    for (;;) {
      const res = await fetch(`${traffic.url}/v1/models`, {
        headers: { authorization: `Bearer ${config.trafficKey}` },
      });
      if (res.status === 200) break;
      if (performance.now() > deadline) throw new Error(`traffic key refused: ${res.status}`);
      await sleep(200);
    }
    log(`${config.routers} routers streaming; traffic through ${traffic.url}`);
    const body = JSON.stringify({
      model: config.trafficModel,
      max_tokens: 16,
      messages: [{ role: "user", content: "Say something short about routers, please." }],
    });
    const load = (seconds: number) =>
      runLoad(defaultGenerator(), {
        url: `${traffic.url}/v1/chat/completions`,
        body,
        connections: config.trafficConnections,
        seconds,
        headers: { authorization: `Bearer ${config.trafficKey}` },
      });
    // Warm the router's pools and JIT: with 2 s, round 1's first window still ran ~40% dearer
    // per request than the later ones, which biased that round's churn ÷ steady ratio.
    await load(Math.max(2, config.seconds / 2));
    const windows: RoutingWindow[] = [];
    let hot: HotFunction[] | undefined;
    for (let r = 1; r <= config.rounds; r++) {
      // Alternate the order, so a drift of the box's load favours no mode.
      const order: (LoadVia | undefined)[] = [undefined, ...config.loadVia];
      const modes = r % 2 === 1 ? order : order.reverse();
      for (const via of modes) {
        const churn = via !== undefined;
        // "unary" windows send everything as calls (streams off); the others as agents do.
        const beats = via === "unary" ? "unary" : "stream";
        const switched = fleet.heartbeatsVia !== beats;
        fleet.setHeartbeatsVia(beats);
        fleet.churnLoad(churn ? config.loadIntervalMs : undefined, via);
        // In flight from the mode before has drained; the churn has begun; after a switch to
        // streams, every agent has had the call that opens its watch and a beat after it.
        await sleep(switched ? 5_000 : 2_000);
        const rpcs0 = fleet.loadCounters.ok;
        const errors0 = fleet.loadCounters.errors;
        const samples0 = fleet.loadSamples;
        fleet.startLoadRecording();
        await traffic.request("reset");
        const profiler =
          options.inspectPort !== undefined && r === 1 && via === config.loadVia[0]
            ? await startProfiler(options.inspectPort)
            : undefined;
        const t0 = performance.now();
        const [cp, result, changes] = await Promise.all([
          measureWindow(fleet, options.cpPid, options.ticks, config.seconds),
          load(config.seconds),
          driveKeyChanges(admin, t0 + config.seconds * 1000, `${r}-${via ?? "n"}`),
        ]);
        if (profiler) {
          const profile = await profiler.stop();
          const file = saveProfile("churn", profile);
          log(`churn window profile written to ${file} (open it in Chrome DevTools)`);
          // Self time, then inclusive time of llmgw's own code (the CLI's bundle).
          hot = [
            ...hotFunctions(profile, 20),
            ...inclusiveFunctions(profile, /^apps\/cli\/dist\//, 25),
          ];
        }
        const report = await traffic.request<RouterReport & Record<string, unknown>>("report");
        const wallS = (performance.now() - t0) / 1000;
        const loadLatencies = fleet.stopLoadRecording();
        const rpcs = fleet.loadCounters.ok - rpcs0;
        await sleep(2_000); // late arrivals land before they are read
        const arrivals = await Promise.all(
          routers.map((x) => x.request<KeyArrivals & Record<string, unknown>>("arrivals")),
        );
        const w: RoutingWindow = {
          round: r,
          churn,
          loadVia: via,
          cp,
          reportLoad: {
            rpcs,
            perSecond: round(rpcs / wallS) ?? 0,
            replicaLoadsPerSecond: round((fleet.loadSamples - samples0) / wallS) ?? 0,
            errors: fleet.loadCounters.errors - errors0,
            p50Ms: round(quantile(loadLatencies, 0.5)),
            p99Ms: round(quantile(loadLatencies, 0.99)),
          },
          traffic: result,
          router: {
            cpuUsPerRequest:
              result.requests > 0 ? round(report.cpuUs / result.requests, 0) : undefined,
            loopP99Ms: report.loopP99Ms,
          },
          fanOut: fanOut(changes, arrivals),
        };
        windows.push(w);
        log(
          `routing round ${r} ${via === undefined ? "no churn" : `churn by ${via}`}: CP ${cp.target.cpuCores} cores, ` +
            `load reports ${w.reportLoad.perSecond}/s, traffic ${result.reqPerSec.toFixed(0)} req/s, ` +
            `router ${w.router.cpuUsPerRequest ?? "-"} µs/req, fan-out p99 ${w.fanOut.p99Ms ?? "-"} ms ` +
            `(${w.fanOut.missing} missing) (load ${loadAverage()})`,
        );
      }
    }
    fleet.churnLoad(undefined);
    fleet.setHeartbeatsVia("unary");
    // "churn" below: the windows of the way the goals judge (the first of config.loadVia).
    const judged = config.loadVia[0];
    const of = (via: LoadVia | undefined) => windows.filter((w) => w.loadVia === via);
    const pooledP99 = (churn: boolean) => {
      const p = of(churn ? judged : undefined).flatMap((w) =>
        w.fanOut.p99Ms === undefined ? [] : [w.fanOut.p99Ms],
      );
      return p.length > 0 ? Math.max(...p) : undefined;
    };
    const ratiosOf = (via: LoadVia | undefined) =>
      Array.from({ length: config.rounds }, (_, i) => {
        const a = windows.find((w) => w.round === i + 1 && w.loadVia === via)?.router
          .cpuUsPerRequest;
        const b = windows.find((w) => w.round === i + 1 && !w.churn)?.router.cpuUsPerRequest;
        return a !== undefined && b !== undefined && b > 0 ? [a / b] : [];
      }).flat();
    const ratios = ratiosOf(judged);
    const cpu = (via: LoadVia | undefined) =>
      median(
        of(via).flatMap((w) =>
          w.router.cpuUsPerRequest === undefined ? [] : [w.router.cpuUsPerRequest],
        ),
      );
    const cores = (via: LoadVia | undefined) => median(of(via).map((w) => w.cp.target.cpuCores));
    return {
      routers: config.routers,
      routerKind:
        "separate processes: startRouter (the llmgw router server) over a real WatchRouting stream each, API keys on",
      loadIntervalMs: config.loadIntervalMs,
      replicasWithLoad: fleet.agents.reduce(
        (n, a) => n + a.assignments.filter((x) => x.rank === 0).length,
        0,
      ),
      windows,
      ...(hot === undefined ? {} : { hot }),
      summary: {
        cpCoresChurn: cores(judged),
        cpCoresNoChurn: cores(undefined),
        // The worst window's p99 (each window's p99 over its change × router pairs).
        fanOutP99MsChurn: pooledP99(true),
        fanOutP99MsNoChurn: pooledP99(false),
        fanOutMissing: windows.reduce((n, w) => n + w.fanOut.missing, 0),
        routerCpuChurn: cpu(judged),
        routerCpuNoChurn: cpu(undefined),
        routerCpuRatio: median(ratios),
        routerCpuRatioRange: [Math.min(...ratios), Math.max(...ratios)],
        byLoadVia: config.loadVia.map((via) => ({
          via,
          cpCores: cores(via),
          routerCpu: cpu(via),
          routerCpuRatio: median(ratiosOf(via)),
        })),
      },
    };
  } finally {
    fleet.churnLoad(undefined);
    await Promise.all(routers.map((r) => r.stop()));
  }
}
