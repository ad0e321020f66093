import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import type { EngineSimOptions } from "@llmgw/engine-sim";
import {
  benchChildrenRunAs,
  findBinary,
  loadAverage,
  shipBenchChildren,
  startBenchChild,
} from "../lib/children.js";
import { median } from "../lib/load.js";
import type { RouterChildConfig } from "../lib/processes.js";
import { type RunningProxy, startHaproxy, startNginx } from "../lib/proxies.js";
import { printReport } from "../lib/report.js";
import { type SimFleet, startSimFleet } from "../lib/sim-fleet.js";
import { formatTable, quantile } from "../lib/table.js";
import { runOpenLoop } from "./client.js";
import {
  defaultRates,
  goodput,
  goodputIsCensored,
  judgeRung,
  keepClimbing,
  parseRates,
  type Rung,
  type SweepCriteria,
} from "./sweep.js";
import { buildWorkload, requestCount, type WorkloadName, type WorkloadSize } from "./workloads.js";

const { values: flags } = parseArgs({
  options: {
    quick: { type: "boolean", default: false },
    workloads: { type: "string" },
    /** The llmgw routers' `affinityLoadFactor` (default: the router's, 1.25). */
    "load-factor": { type: "string" },
    "home-load-factor": { type: "string" },
    /** Arrival rate of the fixed-rate table, simulated req/s (default 4 per replica). */
    rate: { type: "string" },
    /** Upper bound of the time scale (1 = real time; below 1 slows simulated time down). */
    "time-scale": { type: "string" },
    /**
     * Wall-clock arrival rate a measurement may reach: each runs at time scale
     * min(--time-scale, --max-wall-rate ÷ rate), so a high simulated rate is run slower
     * rather than letting the 2-core machine become the bottleneck.
     */
    "max-wall-rate": { type: "string" },
    replicas: { type: "string" },
    /** Simulated engines per child process (`sims` role). */
    "sims-per-process": { type: "string" },
    targets: { type: "string" },
    /**
     * Rounds of the fixed-rate table (default 3): every target in every round, the arrivals
     * reseeded each round and the targets' order rotated, each judged on its medians.
     */
    rounds: { type: "string" },
    /** The sweep's ladder, simulated req/s; "none" skips the sweep. */
    "sweep-rates": { type: "string" },
    "sweep-workloads": { type: "string" },
    "sweep-targets": { type: "string" },
    /**
     * Simulated seconds of arrivals per rung (default 3): a rung sends at least rate × this
     * many requests (more conversations per tenant), so a high rate runs long enough for a
     * queue to build, not a burst that ends before it does.
     */
    "rung-seconds": { type: "string" },
    /** The sweep's SLO: TTFT p90, simulated ms. */
    slo: { type: "string" },
    /** Send neither the x-session-id header nor prompt_cache_key. */
    "no-hints": { type: "boolean", default: false },
    /** Run the `llmgw precise` target (the router's KV-event mode; see PRECISE below). */
    precise: { type: "boolean", default: false },
    /** Two routers that do not tell each other what they sent (as before the peer exchange). */
    "no-peers": { type: "boolean", default: false },
    /**
     * A directory to write every measurement's requests to, one JSON file each
     * (`RequestSample`: session, turn, TTFT, prompt and cached tokens), for looking at where
     * a target's misses and slow requests are.
     */
    samples: { type: "string" },
    /**
     * Run the llmgw children (routers, engines) from source under tsx instead of bundled as
     * the CLI ships (`shipBenchChildren`): for profiling against source files.
     */
    source: { type: "boolean", default: false },
  },
});
const quick = flags.quick === true;
const samplesDir = flags.samples;
if (samplesDir !== undefined) mkdirSync(samplesDir, { recursive: true });
const hints = flags["no-hints"] !== true;
const num = (name: string, text: string | undefined, fallback: number, min = 0): number => {
  const v = text === undefined ? fallback : Number(text);
  if (!Number.isFinite(v) || v <= min)
    throw new Error(`--${name} ${text}: expected a number > ${min}`);
  return v;
};
const replicas = num("replicas", flags.replicas, quick ? 4 : 16);
if (!Number.isInteger(replicas))
  throw new Error(`--replicas ${flags.replicas}: expected a whole number`);
const simsPerProcess = num("sims-per-process", flags["sims-per-process"], 8);
const timeScaleCap = num("time-scale", flags["time-scale"], quick ? 4 : 1);
/**
 * Default 64 wall req/s: on this 2-core box, llmgw in front of 16 engines measured the same
 * simulated TTFT at 64 req/s with time scale 1 and 0.5, and at 160 req/s simulated only
 * with time scale 0.25 (at 1, p50 148 ms instead of 44: the machine queued, not the engines;
 * see bench/README.md).
 */
const maxWallRate = num("max-wall-rate", flags["max-wall-rate"], quick ? 1e9 : 64);
/** Arrivals per second, in simulated time, of the fixed-rate table. */
const simRate = num("rate", flags.rate, 4 * replicas);
const rounds = num("rounds", flags.rounds, quick ? 1 : 3);
if (!Number.isInteger(rounds))
  throw new Error(`--rounds ${flags.rounds}: expected a whole number ≥ 1`);
/**
 * The sweep's SLO, TTFT p90 in simulated ms. Default 250 ms: about twice an unloaded, uncached
 * prefill of this workload's longest prompts (~1.5k tokens at the sim's 10k tokens/s ≈ 150 ms,
 * plus a decode step), the range interactive-chat SLOs are set in (llm-d's and vLLM's
 * benchmarks use 200–500 ms TTFT for 8B chat). A replica only meets it while its queue stays
 * short, or while its prefix cache spares it most of the prefill.
 */
const sloTtftP90Ms = num("slo", flags.slo, 250);
const criteria: SweepCriteria = { sloTtftP90Ms };
const workloads = (flags.workloads ?? "shared-prefix,unique,hot-prefix").split(
  ",",
) as WorkloadName[];
const sweepRates =
  flags["sweep-rates"] === "none"
    ? []
    : flags["sweep-rates"] !== undefined
      ? parseRates(flags["sweep-rates"])
      : quick
        ? [4 * replicas, 12 * replicas]
        : defaultRates(replicas);
const rungSeconds = num("rung-seconds", flags["rung-seconds"], quick ? 0.1 : 3);
const sweepWorkloads = (flags["sweep-workloads"] ?? "shared-prefix").split(",") as WorkloadName[];
/**
 * Sizes scale with the fleet: 4 tenants per replica (64 at 16 replicas), 2 conversations each.
 * More conversations than the engines hold at once: a conversation waits for its previous
 * answer, so the most the client can offer is conversations ÷ end-to-end time (Little's law);
 * 128 conversations at ~0.45 s per answer let it offer ~280 req/s, above the sweep's top rung.
 */
const size: WorkloadSize = quick
  ? { tenants: 6, conversationsPerTenant: 1, turns: 2, systemPromptChars: 4096, userTurnChars: 200 }
  : {
      tenants: 4 * replicas,
      conversationsPerTenant: 2,
      turns: 3,
      systemPromptChars: 4096,
      userTurnChars: 200,
    };
const maxTokens = 48;
/**
 * Per-replica KV cache, tokens. One replica holds about a quarter of all tenants' prefixes at
 * any fleet size (4 tenants per replica × ~1.5k tokens of system prompt and history = ~6k
 * each replica needs under affinity, ~100k every replica needs when each tenant is spread
 * over all of them): the llm-d shape, where the working set exceeds one replica's cache and
 * only affinity keeps a tenant's prefix warm.
 */
const kvCacheTokens = quick ? 6144 : 24_576;
const capacity = 64;

type TargetName =
  | "nginx round-robin"
  | "nginx least_conn"
  | "haproxy leastconn"
  | "haproxy session-hash"
  | "llmgw round-robin"
  | "llmgw least-loaded"
  | "llmgw llmgw"
  | "llmgw precise"
  | "llmgw ×1 haproxy"
  | "llmgw ×2 haproxy-rr"
  | "llmgw precise ×2 haproxy-rr";
/**
 * Two routers behind HAProxy round robin (HTTP mode: each request to the next router, a
 * `/readyz` health check), each told by its snapshot that 2 routers share the cluster: each
 * admits half of every replica's capacity, sees only its own in-flight requests, and breaks
 * ties by the rendezvous hash of the prompt's prefix, so both send a shared prefix to the same
 * replica. Compared with one router (`llmgw llmgw`) in the same rounds.
 */
const TWO_ROUTERS: TargetName = "llmgw ×2 haproxy-rr";
const ONE_ROUTER: TargetName = "llmgw llmgw";
/**
 * One router behind the same HAProxy: what the balancer's hop costs alone, so that a gap
 * between one and two routers can be told apart from the extra hop.
 */
const ONE_BEHIND_HAPROXY: TargetName = "llmgw ×1 haproxy";
/**
 * The router's precise mode (routing on the engines' KV-cache events): with `--precise` the
 * engines publish KV events, each `sims` child serves its engines' blocks as an agent would
 * (`KvCacheService`), and this target's router watches them and tokenizes requests with the
 * sim's tokenizer. Without the flag the engines publish nothing and the target is skipped.
 */
const PRECISE: TargetName = "llmgw precise";
/**
 * Two routers in precise mode behind HAProxy round robin, compared with one (`llmgw precise`)
 * as `TWO_ROUTERS` is with `ONE_ROUTER`: both see the engines' own blocks, so a router that
 * meets a tenant after the other sent it finds where it went (hint-homes.ts).
 */
const PRECISE_TWO: TargetName = "llmgw precise ×2 haproxy-rr";
/** Two routers against one: the targets the two-router goals compare, and the hop alone. */
const routerPairs: readonly {
  readonly one: TargetName;
  readonly two: TargetName;
  readonly hop?: TargetName;
  readonly label: string;
}[] = [
  { one: ONE_ROUTER, two: TWO_ROUTERS, hop: ONE_BEHIND_HAPROXY, label: "two routers" },
  { one: PRECISE, two: PRECISE_TWO, label: "two precise routers" },
];
/** The baselines llmgw's TTFT goals compare with. */
const baselines: readonly TargetName[] = [
  "nginx round-robin",
  "nginx least_conn",
  "haproxy leastconn",
  "haproxy session-hash",
  "llmgw round-robin",
  "llmgw least-loaded",
];
const allTargets: TargetName[] = [
  ...baselines,
  ONE_ROUTER,
  PRECISE,
  ONE_BEHIND_HAPROXY,
  TWO_ROUTERS,
  PRECISE_TWO,
];

interface Row {
  workload: WorkloadName;
  target: TargetName;
  /** 1-based; 0 for the discarded warm-up. */
  round: number;
  /** Offered arrival rate, simulated req/s. */
  rate: number;
  /** The engines' time scale in this measurement (wall ms = simulated ms ÷ timeScale). */
  timeScale: number;
  requests: number;
  ok: number;
  failed: number;
  /** Latencies in simulated ms (wall ms × timeScale). */
  ttftP50Ms: number;
  ttftP90Ms: number;
  ttftP99Ms: number;
  e2eP50Ms: number;
  e2eP99Ms: number;
  /** Completed requests per simulated second. */
  reqPerSec: number;
  /** Scheduled ÷ actual span of the arrivals (below 1: the client held the load back). */
  offeredShare: number;
  /**
   * The engines' prefix-cache hit rate, tokens: Σ cached_tokens ÷ Σ prompt_tokens of the
   * answers' usage when every answer reported usage (cached_tokens left out = 0), else the
   * /metrics counters.
   */
  prefixHitRate: number;
  prefixHitSource: "usage" | "metrics";
  /** Σ `vllm:prefix_cache_hits_total` ÷ Σ `queries_total` (always measured). */
  metricsHitRate: number;
  /**
   * A single llmgw router's prefix model against the engines' `cached_tokens`: the share of its
   * decisions whose expected hit or miss the engine confirmed (`llmgw_router_prefix_predictions_total`,
   * hit + miss over all), with the decisions counted; absent for other targets.
   */
  agreement?: {
    readonly share: number;
    readonly decisions: number;
    readonly falseHits: number;
    /** Decisions matched on the engines' own blocks (precise mode), the rest approximately. */
    readonly precise: number;
  };
  perReplica: number[];
  spreadMaxOverMean: number;
  loadavg: string;
  errors: string[];
}

const skipped: string[] = [];
const haveNginx = findBinary("nginx") !== undefined;
const haveHaproxy = findBinary("haproxy") !== undefined;
if (!haveNginx) skipped.push("nginx baselines: nginx not installed (apt-get install -y nginx)");
if (!haveHaproxy)
  skipped.push("haproxy baselines: haproxy not installed (apt-get install -y haproxy)");
const only = flags.targets?.split(",");
const available = (t: TargetName): boolean =>
  (haveNginx || !t.startsWith("nginx")) &&
  (haveHaproxy || !t.startsWith("haproxy")) &&
  (haveHaproxy || (t !== TWO_ROUTERS && t !== ONE_BEHIND_HAPROXY && t !== PRECISE_TWO)) &&
  ((t !== PRECISE && t !== PRECISE_TWO) || flags.precise === true);
const targets = allTargets.filter(
  (t) => (only === undefined || only.some((o) => t.startsWith(o))) && available(t),
);
if (!haveHaproxy)
  skipped.push(`${TWO_ROUTERS}, ${ONE_BEHIND_HAPROXY}, ${PRECISE_TWO}: haproxy not installed`);
if (flags.precise !== true)
  skipped.push(`${PRECISE}, ${PRECISE_TWO}: the router's KV-event mode; run with --precise`);
/** The sweep's targets: every single target (not the ×1/×2 pair behind HAProxy). */
const sweepOnly =
  flags["sweep-targets"]?.split(",") ??
  // --quick: the targets the goodput goals compare, to keep the smoke test short.
  (quick ? ["llmgw llmgw", "llmgw least-loaded", "haproxy session-hash"] : undefined);
const sweepTargets = targets.filter(
  (t) =>
    t !== ONE_BEHIND_HAPROXY &&
    t !== TWO_ROUTERS &&
    t !== PRECISE_TWO &&
    (sweepOnly === undefined || sweepOnly.some((o) => t.startsWith(o))),
);

const simOptions: EngineSimOptions = {
  model: "m",
  // One seed for every engine: an answer's length and text follow from its prompt alone, so a
  // conversation's later turns are the same whichever replica answered its earlier ones, and
  // every target of a round gets the same prompts. With a seed per engine (until 2026-12-05)
  // two targets' shared-prefix runs differed by ~600 of ~455,000 prompt tokens, enough to turn
  // a tie in prefix hit rate into a 0.04-point miss.
  seed: 0,
  warmupSeconds: 0,
  timeScale: timeScaleCap,
  minOutputTokens: 16,
  maxOutputTokens: maxTokens,
  maxModelLen: Math.min(8192, kvCacheTokens),
  // The engine-reported hit rate reads cached_tokens from the answers: as llmgw launches vLLM.
  enablePromptTokensDetails: true,
  timing: { kvCacheTokens },
  ...(flags.precise === true
    ? { kvEvents: { enableKvCacheEvents: true, endpoint: "tcp://127.0.0.1:0" } }
    : {}),
};
/** The key routers present to the `sims` children's `KvCacheService` (engines take none). */
const KV_KEY = "bench-kv-key";
/** The key the two routers of the ×2 targets share (`llmgw router --peer-key-file`). */
const PEER_KEY = "bench-peer-key-0123456789";
/**
 * `hot-prefix` with 2 turns per conversation: it has twice the conversations of the others
 * (tenant 0's half), so it sends as many requests as they do with one turn less.
 */
const sizeFor = (workload: WorkloadName, s: WorkloadSize): WorkloadSize =>
  workload === "hot-prefix" && !quick ? { ...s, turns: 2 } : s;
/**
 * The workload of a sweep rung at `rate`: the table's, with as many more conversations per
 * tenant as it takes to send at least `rate × rungSeconds` requests (the same tenants, so the
 * same prefixes compete for the caches).
 */
const rungSize = (workload: WorkloadName, rate: number): WorkloadSize => {
  const base = requestCount(buildWorkload(workload, sizeFor(workload, size)));
  const factor = Math.max(1, Math.ceil((rate * rungSeconds) / base));
  return { ...size, conversationsPerTenant: size.conversationsPerTenant * factor };
};
/** The time scale a measurement at `rate` runs at (see --max-wall-rate). */
const timeScaleFor = (rate: number): number => Math.min(timeScaleCap, maxWallRate / rate);

const rows: Row[] = [];
const sweepRows: Row[] = [];
const t0 = Date.now();
const loadavgAtStart = loadAverage();
let maxLoad1 = 0;
let proxy: RunningProxy | undefined;
let fleet: SimFleet | undefined;
const routerChildren: Awaited<ReturnType<typeof startBenchChild>>[] = [];
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => {
    void Promise.all([proxy?.stop(), fleet?.stop(), ...routerChildren.map((c) => c.stop())]).then(
      () => process.exit(130),
    );
  });
}
try {
  if (flags.source !== true) await shipBenchChildren();
  fleet = await startSimFleet({
    replicas,
    perProcess: simsPerProcess,
    options: () => simOptions,
    loads: true,
    ...(flags.precise === true ? { kvKey: KV_KEY } : {}),
  });
  const sims = fleet;
  const routerConfig = (
    policy: RouterChildConfig["policy"],
    routers = 1,
    precise = false,
  ): RouterChildConfig => ({
    model: "m",
    policy,
    upstreams: sims.urls,
    // The engines' loads as the control plane relays them: parsed elsewhere (the sims children
    // do the agent's part), not scraped by the router being measured.
    loadsFrom: sims.loadsUrls,
    capacity,
    routers,
    ...(precise ? { precise: { kvEventsUrls: sims.kvUrls, key: KV_KEY } } : {}),
    ...(hints ? { sessionHeader: "x-session-id" } : {}),
    scoring: {
      ...(flags["load-factor"] === undefined
        ? {}
        : { affinityLoadFactor: Number(flags["load-factor"]) }),
      ...(flags["home-load-factor"] === undefined
        ? {}
        : { homeLoadFactor: Number(flags["home-load-factor"]) }),
    },
  });
  const [router, secondRouter] = await Promise.all(
    [1, 2].map(() =>
      startBenchChild("router", routerConfig("llmgw")).then((c) => {
        routerChildren.push(c);
        return c;
      }),
    ),
  );
  if (router === undefined || secondRouter === undefined) throw new Error("no router child");

  /** Fresh engines at `timeScale`, then `target` in front of them: its URL. */
  const open = async (target: TargetName, timeScale: number): Promise<string> => {
    await sims.restart({ timeScale }); // fresh caches and counters
    const upstreams = sims.urls;
    if (target === TWO_ROUTERS || target === ONE_BEHIND_HAPROXY || target === PRECISE_TWO) {
      const behind = target === ONE_BEHIND_HAPROXY ? [router] : [router, secondRouter];
      const config = routerConfig("llmgw", behind.length, target === PRECISE_TWO);
      // Two routers are each other's peers, as `llmgw router --peer` sets them up (unless
      // --no-peers: each routes on what it sent itself).
      await Promise.all(
        behind.map((r, i) =>
          r.request(
            "restart",
            behind.length === 1 || flags["no-peers"] === true
              ? config
              : {
                  ...config,
                  routerId: `bench-router-${i}`,
                  peers: { urls: behind.filter((o) => o !== r).map((o) => o.url), key: PEER_KEY },
                },
          ),
        ),
      );
      proxy = await startHaproxy({
        upstreams: behind.map((r) => r.url),
        balance: "roundrobin",
        healthCheck: { path: "/readyz" },
      });
      return proxy.url;
    }
    if (target === PRECISE) {
      const answer = await router.request<{ error?: string }>(
        "restart",
        routerConfig("llmgw", 1, true),
      );
      if (answer.error !== undefined) throw new Error(`${PRECISE}: ${answer.error}`);
      return router.url;
    }
    if (target.startsWith("llmgw")) {
      const policy = target.slice("llmgw ".length) as "round-robin" | "least-loaded" | "llmgw";
      await router.request("restart", routerConfig(policy));
      return router.url;
    }
    proxy =
      target === "nginx round-robin"
        ? await startNginx({ upstreams })
        : target === "nginx least_conn"
          ? await startNginx({ upstreams, balance: "least_conn" })
          : target === "haproxy leastconn"
            ? await startHaproxy({ upstreams, balance: "leastconn" })
            : await startHaproxy({ upstreams, balance: "session-hash" });
    return proxy.url;
  };

  /** One measurement: `target` on `workload` at `rate` simulated req/s. */
  const measure = async (
    workload: WorkloadName,
    target: TargetName,
    rate: number,
    round: number,
    workloadSize: WorkloadSize = size,
    /** Send as many requests as `workloadSize` has, from a pool of twice its conversations. */
    pooled = false,
  ): Promise<Row> => {
    const sized = sizeFor(workload, workloadSize);
    const requests = pooled ? requestCount(buildWorkload(workload, sized)) : undefined;
    const conversations = buildWorkload(
      workload,
      pooled ? { ...sized, conversationsPerTenant: 2 * sized.conversationsPerTenant } : sized,
    );
    const timeScale = timeScaleFor(rate);
    const url = await open(target, timeScale);
    const run = await runOpenLoop({
      url,
      model: "m",
      conversations,
      ratePerSecond: rate * timeScale,
      maxTokens,
      requestTimeoutMs: 120_000,
      // The same arrivals for every target of a round; another draw in the next round.
      seed: 7 + round - 1,
      hints,
      ...(requests === undefined ? {} : { requests }),
    });
    await proxy?.stop();
    proxy = undefined;
    const engine = await sims.scrape();
    let agreement: Row["agreement"];
    if (
      target.startsWith("llmgw") &&
      target !== TWO_ROUTERS &&
      target !== ONE_BEHIND_HAPROXY &&
      target !== PRECISE_TWO
    ) {
      const { predictions = {} } = await router.request<{ predictions?: Record<string, number> }>(
        "report",
      );
      let agree = 0;
      let all = 0;
      let falseHits = 0;
      let precise = 0;
      for (const [key, n] of Object.entries(predictions)) {
        all += n;
        if (key.startsWith("precise ")) precise += n;
        if (key.endsWith(" hit") || key.endsWith(" miss")) agree += n;
        if (key.endsWith(" false_hit")) falseHits += n;
      }
      if (all > 0) agreement = { share: agree / all, decisions: all, falseHits, precise };
    }
    const { samples } = run;
    if (samplesDir !== undefined) {
      // A sweep rung may run at the table's rate: its file is named apart.
      const kind = pooled ? "sweep" : round === 0 ? "warmup" : "table";
      const name = `${kind}-${workload}-${target.replace(/\W+/g, "_")}-${rate}-${round}.json`;
      writeFileSync(join(samplesDir, name), JSON.stringify(samples));
    }
    const ok = samples.filter((s) => s.ok);
    const sim = (wallMs: number): number => wallMs * timeScale;
    const ttft = ok.flatMap((s) => (s.ttftMs === undefined ? [] : [sim(s.ttftMs)]));
    const e2e = ok.map((s) => sim(s.e2eMs));
    const perReplica = engine.map((e) => e.requests);
    const mean = perReplica.reduce((a, b) => a + b, 0) / perReplica.length;
    const hits = engine.reduce((n, e) => n + e.hits, 0);
    const queries = engine.reduce((n, e) => n + e.queries, 0);
    const metricsHitRate = queries > 0 ? hits / queries : 0;
    // With --enable-prompt-tokens-details an engine (vLLM, and the sim like it) leaves the
    // details out when nothing was cached: an answer with usage but no cached_tokens had none.
    const reported =
      ok.length > 0 &&
      ok.every(
        (s) =>
          s.cachedTokens !== undefined ||
          (simOptions.enablePromptTokensDetails === true && s.promptTokens !== undefined),
      );
    const prompt = ok.reduce((n, s) => n + (s.promptTokens ?? 0), 0);
    const cached = ok.reduce((n, s) => n + (s.cachedTokens ?? 0), 0);
    const load = loadAverage();
    maxLoad1 = Math.max(maxLoad1, Number(load.split(" ")[0]) || 0);
    return {
      workload,
      target,
      round,
      rate,
      timeScale,
      requests: samples.length,
      ok: ok.length,
      failed: samples.length - ok.length,
      ttftP50Ms: quantile(ttft, 0.5) ?? Number.NaN,
      ttftP90Ms: quantile(ttft, 0.9) ?? Number.NaN,
      ttftP99Ms: quantile(ttft, 0.99) ?? Number.NaN,
      e2eP50Ms: quantile(e2e, 0.5) ?? Number.NaN,
      e2eP99Ms: quantile(e2e, 0.99) ?? Number.NaN,
      reqPerSec: (ok.length / sim(run.wallMs)) * 1000,
      offeredShare: run.sentSpanMs > 0 ? Math.min(1, run.scheduledSpanMs / run.sentSpanMs) : 1,
      prefixHitRate: reported && prompt > 0 ? cached / prompt : metricsHitRate,
      prefixHitSource: reported && prompt > 0 ? "usage" : "metrics",
      metricsHitRate,
      perReplica,
      spreadMaxOverMean: mean > 0 ? Math.max(...perReplica) / mean : Number.NaN,
      loadavg: load,
      errors: [...new Set(samples.flatMap((s) => (s.error ? [s.error] : [])))].slice(0, 5),
      ...(agreement === undefined ? {} : { agreement }),
    };
  };
  const log = (row: Row, label: string): void =>
    console.error(
      `${row.workload} ${row.target}${label}: ${row.ok}/${row.requests} ok, TTFT p50/p90 ${row.ttftP50Ms.toFixed(0)}/${row.ttftP90Ms.toFixed(0)} ms, hit ${(row.prefixHitRate * 100).toFixed(0)}%${row.agreement?.precise ? `, precise ${row.agreement.precise}/${row.agreement.decisions}` : ""}, replicas ${row.perReplica.join("/")} (×${row.timeScale.toFixed(2)}, load ${row.loadavg})`,
    );

  // A warm-up, discarded: the engines' and routers' code is compiled on its first requests,
  // and the first target measured used to pay for it (nginx round robin's TTFT p99 read 206–221
  // ms as the first target, 140 after it; llmgw's p90 420 ms as the first, 130 after).
  if (!quick && workloads[0] !== undefined) {
    const warm = await measure(workloads[0], ONE_ROUTER, simRate, 0);
    log(warm, " (warm-up, not counted)");
  }

  /**
   * The fixed-rate table: every target in every round, starting one target later each round, so
   * that no target is always the one measured first (or right after another) and every
   * baseline is judged on medians as llmgw is. Until 2026-12-05 only the one/two-router pair
   * ran in rounds and the baselines once: llmgw's median of three then met the best of six
   * single draws, and the lowest of six noisy figures is lower than a typical one.
   */
  const plan = (round: number) => {
    const start = (round - 1) % targets.length;
    return [...targets.slice(start), ...targets.slice(0, start)];
  };
  for (const workload of workloads)
    for (let round = 1; round <= rounds; round++)
      for (const target of plan(round)) {
        const row = await measure(workload, target, simRate, round);
        rows.push(row);
        log(row, rounds > 1 ? ` round ${round}` : "");
      }

  /** The sweep: each target climbs the ladder until it failed MAX_FAILED_RUNGS rungs. */
  for (const workload of sweepWorkloads)
    for (const target of sweepTargets) {
      const rungs: Rung[] = [];
      for (const rate of sweepRates) {
        if (!keepClimbing(rungs, criteria)) break;
        const row = await measure(workload, target, rate, 1, rungSize(workload, rate), true);
        sweepRows.push(row);
        rungs.push(row);
        log(row, ` @ ${rate} req/s: ${judgeRung(row, criteria)}`);
      }
    }
} finally {
  await proxy?.stop();
  await Promise.all([fleet?.stop(), ...routerChildren.map((c) => c.stop())]);
}

const f = (n: number, d = 0): string => (Number.isNaN(n) ? "-" : n.toFixed(d));
const pct = (x: number): string => `${(x * 100).toFixed(1)}%`;
const label = (r: Row): string => (rounds > 1 ? `${r.target} #${r.round}` : r.target);
const table = formatTable(
  [
    "workload",
    "target",
    "ok/sent",
    "TTFT p50 / p90 / p99 ms",
    "e2e p50 / p99 ms",
    "req/s",
    "prefix hit (engine)",
    "model agrees",
    "per replica",
    "max/mean",
  ],
  // By workload, then target, then round (they were measured round by round).
  [...rows]
    .sort(
      (a, b) =>
        workloads.indexOf(a.workload) - workloads.indexOf(b.workload) ||
        targets.indexOf(a.target) - targets.indexOf(b.target) ||
        a.round - b.round,
    )
    .map((r) => [
      r.workload,
      label(r),
      `${r.ok}/${r.requests}`,
      `${f(r.ttftP50Ms)} / ${f(r.ttftP90Ms)} / ${f(r.ttftP99Ms)}`,
      `${f(r.e2eP50Ms)} / ${f(r.e2eP99Ms)}`,
      f(r.reqPerSec, 1),
      `${pct(r.prefixHitRate)}${r.prefixHitSource === "usage" ? "" : " (m)"}`,
      r.agreement === undefined
        ? "-"
        : `${pct(r.agreement.share)} (${r.agreement.falseHits} false)`,
      r.perReplica.join("/"),
      f(r.spreadMaxOverMean, 2),
    ]),
);

/** Each sweep target's goodput per workload, with its rungs. */
const goodputs = sweepWorkloads.flatMap((workload) =>
  sweepTargets.flatMap((target) => {
    const rungs = sweepRows.filter((r) => r.workload === workload && r.target === target);
    if (rungs.length === 0) return [];
    return [
      {
        workload,
        target,
        goodput: goodput(rungs, criteria),
        /** The top rung passed: the goodput is at least this, perhaps more. */
        censored: goodputIsCensored(rungs, sweepRates, criteria),
        rungs: rungs.map((r) => ({
          rate: r.rate,
          timeScale: r.timeScale,
          ttftP90Ms: r.ttftP90Ms,
          ok: r.ok,
          requests: r.requests,
          offeredShare: r.offeredShare,
          prefixHitRate: r.prefixHitRate,
          verdict: judgeRung(r, criteria),
        })),
      },
    ];
  }),
);
const goodputOf = (w: WorkloadName, t: TargetName): number | undefined =>
  goodputs.find((g) => g.workload === w && g.target === t)?.goodput;
const verdictMark = { pass: "", slo: " ✗", "failed-requests": " ✗fail", "held-back": " ✗held" };
const goodputTable = formatTable(
  ["workload", "target", "goodput req/s", "÷ least-loaded", "rungs: rate → TTFT p90 ms (hit)"],
  goodputs.map((g) => {
    const ll = goodputOf(g.workload, "llmgw least-loaded");
    return [
      g.workload,
      g.target,
      `${g.censored ? "≥ " : ""}${f(g.goodput, 1)}`,
      ll ? `${f(g.goodput / ll, 2)}×` : "-",
      g.rungs
        .map(
          (r) =>
            `${f(r.rate, 0)} → ${f(r.ttftP90Ms)} (${(r.prefixHitRate * 100).toFixed(0)}%)${verdictMark[r.verdict]}`,
        )
        .join(", "),
    ];
  }),
);

/** The issue's goals, judged on this run (only where the needed rows exist). */
const goals: { goal: string; measured: string; met: boolean }[] = [];
/**
 * A target's figures on a workload: its one row, or, run in several rounds, the median of each
 * figure over the rounds (requests per replica from the round with the median max/mean).
 */
const row = (w: WorkloadName, t: TargetName): Row | undefined => {
  const mine = rows.filter((r) => r.workload === w && r.target === t);
  if (mine.length <= 1) return mine[0];
  const med = (pick: (r: Row) => number) => median(mine.map(pick));
  const spread = med((r) => r.spreadMaxOverMean);
  const typical = mine.find((r) => r.spreadMaxOverMean === spread) ?? (mine[0] as Row);
  return {
    ...typical,
    ttftP50Ms: med((r) => r.ttftP50Ms),
    ttftP90Ms: med((r) => r.ttftP90Ms),
    ttftP99Ms: med((r) => r.ttftP99Ms),
    prefixHitRate: med((r) => r.prefixHitRate),
    spreadMaxOverMean: spread,
  };
};
const present = (w: WorkloadName, ts: readonly TargetName[]): Row[] =>
  ts.flatMap((t) => {
    const r = row(w, t);
    return r ? [r] : [];
  });

// llmgw's TTFT p50, p90 and p99 at or below every baseline, per workload.
for (const w of ["shared-prefix", "hot-prefix", "unique"] as const) {
  const mine = row(w, ONE_ROUTER);
  const others = present(w, baselines);
  if (!mine || others.length === 0) continue;
  for (const [q, pick] of [
    ["p50", (r: Row) => r.ttftP50Ms],
    ["p90", (r: Row) => r.ttftP90Ms],
    ["p99", (r: Row) => r.ttftP99Ms],
  ] as const) {
    const best = [...others].sort((a, b) => pick(a) - pick(b))[0] as Row;
    goals.push({
      goal: `(${w}) llmgw TTFT ${q} ≤ every baseline`,
      measured: `${f(pick(mine), 1)} ms vs best ${best.target} ${f(pick(best), 1)} ms`,
      met: pick(mine) <= pick(best),
    });
  }
}
const llmA = row("shared-prefix", ONE_ROUTER);
if (llmA) {
  for (const rr of ["nginx round-robin", "llmgw round-robin"] as const) {
    const base = row("shared-prefix", rr);
    if (base) {
      const x = base.ttftP50Ms / llmA.ttftP50Ms;
      goals.push({
        goal: `(shared-prefix) TTFT p50 ≥ 2× better than ${rr}`,
        measured: `${x.toFixed(2)}×`,
        met: x >= 2,
      });
    }
  }
  const lc = present("shared-prefix", [
    "nginx least_conn",
    "haproxy leastconn",
    "llmgw least-loaded",
  ]).sort((a, b) => a.ttftP50Ms - b.ttftP50Ms)[0];
  if (lc) {
    const x = lc.ttftP50Ms / llmA.ttftP50Ms;
    goals.push({
      goal: `(shared-prefix) TTFT p50 ≥ 1.3× better than the best least-connections (${lc.target})`,
      measured: `${x.toFixed(2)}×`,
      met: x >= 1.3,
    });
  }
}
const gpMine = goodputOf("shared-prefix", ONE_ROUTER);
for (const [base, factor] of [
  ["llmgw least-loaded", 1.5],
  ["haproxy session-hash", 1.2],
] as const) {
  const other = goodputOf("shared-prefix", base);
  if (gpMine === undefined || other === undefined) continue;
  const x = other > 0 ? gpMine / other : gpMine > 0 ? Number.POSITIVE_INFINITY : Number.NaN;
  const censored = (t: TargetName): string =>
    goodputs.find((g) => g.workload === "shared-prefix" && g.target === t)?.censored ? "≥ " : "";
  // A baseline that passed the top rung has an unknown goodput: the ratio is an upper bound.
  const unknown = censored(base) !== "";
  goals.push({
    goal: `(shared-prefix) goodput ≥ ${factor}× ${base} (TTFT p90 ≤ ${sloTtftP90Ms} ms)`,
    measured: `${censored(ONE_ROUTER)}${f(gpMine, 1)} vs ${censored(base)}${f(other, 1)} req/s: ${unknown ? "≤ " : ""}${f(x, 2)}×${unknown ? " (the baseline passed the top rung: extend --sweep-rates)" : ""}`,
    met: !unknown && x >= factor,
  });
}
const llmB = row("unique", ONE_ROUTER);
const llB = row("unique", "llmgw least-loaded");
if (llmB && llB) {
  const x = llmB.ttftP50Ms / llB.ttftP50Ms;
  goals.push({
    goal: "(unique) TTFT p50 within 5% of least-loaded",
    measured: `${((x - 1) * 100).toFixed(1)}%`,
    met: x <= 1.05,
  });
}
const llmC = row("hot-prefix", ONE_ROUTER);
if (llmC) {
  goals.push({
    goal: "(hot-prefix) max/mean requests per replica ≤ 1.25",
    measured: `${llmC.spreadMaxOverMean.toFixed(2)}× (${llmC.perReplica.join("/")})`,
    met: llmC.spreadMaxOverMean <= 1.25,
  });
}
// Precise mode's engine-reported prefix hit rate ≥ the best baseline's, per workload.
for (const w of workloads) {
  const precise = row(w, PRECISE);
  const best = present(w, baselines).sort((a, b) => b.prefixHitRate - a.prefixHitRate)[0];
  if (!precise || !best) continue;
  goals.push({
    goal: `(${w}) precise prefix hit rate ≥ the best baseline's`,
    measured: `${pct(precise.prefixHitRate)} vs ${best.target} ${pct(best.prefixHitRate)}`,
    met: precise.prefixHitRate >= best.prefixHitRate,
  });
}

/**
 * Two routers behind HAProxy round robin against one router, per workload and pair (approximate
 * and precise): the ratio (or difference) in each round, then the median over rounds.
 */
const versus = routerPairs.flatMap((pair) =>
  workloads.flatMap((w) => {
    const inRound = (t: TargetName, round: number) =>
      rows.find((r) => r.workload === w && r.target === t && r.round === round);
    const pairs = Array.from({ length: rounds }, (_, i) => {
      const one = inRound(pair.one, i + 1);
      const two = inRound(pair.two, i + 1);
      return one && two ? [{ one, two }] : [];
    }).flat();
    if (pairs.length === 0) return [];
    const ttftRatios = pairs.map((p) => p.two.ttftP50Ms / p.one.ttftP50Ms);
    const hop = pairs.flatMap((p) => {
      const behind = pair.hop === undefined ? undefined : inRound(pair.hop, p.one.round);
      return behind ? [behind.ttftP50Ms / p.one.ttftP50Ms] : [];
    });
    const hitDrops = pairs.map((p) => (p.one.prefixHitRate - p.two.prefixHitRate) * 100);
    const spreads = pairs.map((p) => p.two.spreadMaxOverMean);
    return [
      {
        workload: w,
        pair: pair.label,
        one: pair.one,
        two: pair.two,
        rounds: pairs.length,
        oneTtftP50Ms: median(pairs.map((p) => p.one.ttftP50Ms)),
        twoTtftP50Ms: median(pairs.map((p) => p.two.ttftP50Ms)),
        ttftRatio: median(ttftRatios),
        ttftRatioRange: [Math.min(...ttftRatios), Math.max(...ttftRatios)],
        /** One router behind HAProxy ÷ one router: the balancer's hop alone. */
        haproxyHopTtftRatio: hop.length > 0 ? median(hop) : undefined,
        oneHitRate: median(pairs.map((p) => p.one.prefixHitRate)),
        twoHitRate: median(pairs.map((p) => p.two.prefixHitRate)),
        hitDropPoints: median(hitDrops),
        oneMaxOverMean: median(pairs.map((p) => p.one.spreadMaxOverMean)),
        twoMaxOverMean: median(spreads),
        twoMaxOverMeanRange: [Math.min(...spreads), Math.max(...spreads)],
      },
    ];
  }),
);
const range = (r: number[], d = 2) =>
  rounds > 1 ? ` (rounds ${f(r[0] ?? Number.NaN, d)}…${f(r[1] ?? Number.NaN, d)})` : "";
for (const v of versus) {
  goals.push({
    goal: `(${v.workload}) ${v.pair}: TTFT p50 within 5% of one (ratio ≤ 1.05)`,
    measured: `${f(v.twoTtftP50Ms)} vs ${f(v.oneTtftP50Ms)} ms: ${f(v.ttftRatio, 3)}×${range(v.ttftRatioRange, 3)}${v.haproxyHopTtftRatio === undefined ? "" : `; one router behind HAProxy ${f(v.haproxyHopTtftRatio, 3)}×`}`,
    met: v.ttftRatio <= 1.05,
  });
  goals.push({
    goal: `(${v.workload}) ${v.pair}: prefix hit rate within 5 points of one`,
    measured: `${(v.twoHitRate * 100).toFixed(1)}% vs ${(v.oneHitRate * 100).toFixed(1)}%: ${v.hitDropPoints <= 0 ? "+" : "−"}${Math.abs(v.hitDropPoints).toFixed(1)} points`,
    met: v.hitDropPoints <= 5,
  });
  goals.push({
    goal: `(${v.workload}) ${v.pair}: max/mean requests per replica ≤ 1.25`,
    measured: `${f(v.twoMaxOverMean, 2)}${range(v.twoMaxOverMeanRange)} (one ${f(v.oneMaxOverMean, 2)})`,
    met: v.twoMaxOverMean <= 1.25,
  });
}

const result = {
  bench: "routing-quality",
  mode: quick ? "quick" : "full",
  loadGenerator: "open-loop Poisson client (undici, streaming; TTFT = first content delta)",
  node: process.version,
  children: benchChildrenRunAs(),
  replicas,
  simsPerProcess,
  timeScaleCap,
  maxWallRate,
  simulatedArrivalRate: simRate,
  tableTimeScale: timeScaleFor(simRate),
  hints,
  workloadSize: size,
  maxTokens,
  kvCacheTokensPerReplica: kvCacheTokens,
  routerCapacityPerReplica: capacity,
  rounds,
  sweep: {
    rates: sweepRates,
    workloads: sweepWorkloads,
    targets: sweepTargets,
    sloTtftP90Ms,
    rungSeconds,
  },
  twoRouters:
    "2 router processes behind HAProxy (HTTP mode, balance roundrobin, GET /readyz check), each with routers = 2 in its snapshot",
  sessionHeader: hints
    ? "x-session-id header and prompt_cache_key = tenant (unique workload: one per request)"
    : "none (--no-hints)",
  wallSeconds: (Date.now() - t0) / 1000,
  loadavgAtStart,
  loadavgAtEnd: loadAverage(),
  maxLoadavg1: maxLoad1,
  skipped,
  rows,
  goodputs,
  sweepRows,
  versus,
  goals,
};
const all = [...rows, ...sweepRows];
const total = all.reduce((n, r) => n + r.requests, 0);
const failed = all.reduce((n, r) => n + r.failed, 0);
console.log(
  `\nRouting quality — ${replicas} sim engines (${Math.ceil(replicas / simsPerProcess)} processes), llmgw ${result.children}; latencies in simulated ms; table at ${simRate} req/s simulated (time scale ${f(timeScaleFor(simRate), 2)}: ${f(simRate * timeScaleFor(simRate), 1)} wall req/s); ${hints ? "session hints on" : "no hints"}; ${total} requests, ${failed} failed; ${f(result.wallSeconds)} s; load average ${loadavgAtStart} at start, ${result.loadavgAtEnd} at end, 1-min max ${maxLoad1.toFixed(2)}`,
);
for (const s of skipped) console.log(`skipped ${s}`);
for (const w of new Set([...workloads, ...sweepWorkloads]))
  console.log(
    `${w}: ${requestCount(buildWorkload(w, sizeFor(w, size)))} requests per table measurement`,
  );
console.log(
  "prefix hit (engine): Σ usage.prompt_tokens_details.cached_tokens ÷ Σ prompt_tokens of the answers; (m) = the engines' /metrics counters (the answers carried no cached_tokens)",
);
const goodputText =
  goodputs.length === 0
    ? ""
    : `\n\nGoodput: the highest rate (simulated req/s) whose TTFT p90 ≤ ${sloTtftP90Ms} ms with every request answered and ≥ 90% of the rate offered (✗: over the SLO, ✗fail: failed requests, ✗held: the client could not offer the rate); a target stops after 2 failed rungs; each rung at time scale min(${timeScaleCap}, ${maxWallRate} ÷ rate)\n${goodputTable}`;
/** With several rounds, the figures the goals judge: each target's medians over its rounds. */
const medianTable =
  rounds <= 1
    ? ""
    : `\n\nMedians over the ${rounds} rounds (what the goals judge; requests per replica from the round with the median max/mean)\n${formatTable(
        ["workload", "target", "TTFT p50 / p90 / p99 ms", "prefix hit (engine)", "max/mean"],
        workloads.flatMap((w) =>
          present(w, targets).map((r) => [
            w,
            r.target,
            `${f(r.ttftP50Ms, 1)} / ${f(r.ttftP90Ms, 1)} / ${f(r.ttftP99Ms, 1)}`,
            pct(r.prefixHitRate),
            f(r.spreadMaxOverMean, 2),
          ]),
        ),
      )}`;
printReport("routing", `${table}${medianTable}${goodputText}`, goals, result);
process.exit(0);
