import { parseArgs } from "node:util";
import { request } from "undici";
import { type BenchChild, findBinary, loadAverage, startBenchChild } from "../lib/children.js";
import { median } from "../lib/load.js";
import { type RunningProxy, startHaproxy, startNginx } from "../lib/proxies.js";
import { printReport } from "../lib/report.js";
import { formatTable, quantile } from "../lib/table.js";
import { runOpenLoop } from "./client.js";
import { buildWorkload, requestCount, type WorkloadName, type WorkloadSize } from "./workloads.js";

const { values: flags } = parseArgs({
  options: {
    quick: { type: "boolean", default: false },
    workloads: { type: "string" },
    rate: { type: "string" },
    "time-scale": { type: "string" },
    replicas: { type: "string" },
    targets: { type: "string" },
    /** Rounds of the one-router vs two-router pair (other targets run once). */
    rounds: { type: "string" },
  },
});
const quick = flags.quick === true;
const timeScale = Number(flags["time-scale"] ?? (quick ? 4 : 1));
/** Arrivals per second, in simulated time (scaled by the time scale for the wall clock). */
const simRate = Number(flags.rate ?? 16);
const replicas = Number(flags.replicas ?? 4);
const rounds = Number(flags.rounds ?? (quick ? 1 : 3));
if (!Number.isInteger(rounds) || rounds < 1)
  throw new Error(`--rounds ${flags.rounds}: expected a whole number ≥ 1`);
const workloads = (flags.workloads ?? "shared-prefix,unique,hot-prefix").split(
  ",",
) as WorkloadName[];
const size: WorkloadSize = quick
  ? { tenants: 6, conversationsPerTenant: 1, turns: 2, systemPromptChars: 4096, userTurnChars: 200 }
  : {
      tenants: 40,
      conversationsPerTenant: 2,
      turns: 4,
      systemPromptChars: 4096,
      userTurnChars: 200,
    };
const maxTokens = 48;
/**
 * Per-replica KV cache, tokens. Scaled down with the tenant count so that one replica holds
 * about half of all tenants' prefixes (40 × ~1.1k-token system prompts + conversation tails ≈
 * 60k tokens vs 24k): the llm-d shape, where the working set exceeds one replica's cache and
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
  | "llmgw ×1 haproxy"
  | "llmgw ×2 haproxy-rr";
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
/** The targets run `--rounds` times (those the two-router goals compare). */
const pairTargets: readonly TargetName[] = [ONE_ROUTER, ONE_BEHIND_HAPROXY, TWO_ROUTERS];
const allTargets: TargetName[] = [
  "nginx round-robin",
  "nginx least_conn",
  "haproxy leastconn",
  "haproxy session-hash",
  "llmgw round-robin",
  "llmgw least-loaded",
  "llmgw llmgw",
  "llmgw ×1 haproxy",
  "llmgw ×2 haproxy-rr",
];

interface Row {
  workload: WorkloadName;
  target: TargetName;
  /** 1-based; targets outside the one/two-router pair run only round 1. */
  round: number;
  requests: number;
  ok: number;
  failed: number;
  ttftP50Ms: number;
  ttftP90Ms: number;
  ttftP99Ms: number;
  e2eP50Ms: number;
  e2eP99Ms: number;
  reqPerSec: number;
  prefixHitRate: number;
  perReplica: number[];
  spreadMaxOverMean: number;
  loadavg: string;
  errors: string[];
}

async function scrape(url: string): Promise<{ hits: number; queries: number; requests: number }> {
  const metrics = await (await request(`${url}/metrics`)).body.text();
  const sum = (name: string): number =>
    metrics
      .split("\n")
      .filter((l) => l.startsWith(`${name}{`) || l.startsWith(`${name} `))
      .reduce((n, l) => n + Number(l.slice(l.lastIndexOf(" ") + 1)), 0);
  const stats = (await (await request(`${url}/sim/stats`)).body.json()) as { requests: number };
  return {
    hits: sum("vllm:prefix_cache_hits_total"),
    queries: sum("vllm:prefix_cache_queries_total"),
    requests: stats.requests,
  };
}

const skipped: string[] = [];
const haveNginx = findBinary("nginx") !== undefined;
const haveHaproxy = findBinary("haproxy") !== undefined;
if (!haveNginx) skipped.push("nginx baselines: nginx not installed (apt-get install -y nginx)");
if (!haveHaproxy)
  skipped.push("haproxy baselines: haproxy not installed (apt-get install -y haproxy)");
const only = flags.targets?.split(",");
const targets = allTargets.filter(
  (t) =>
    (only === undefined || only.some((o) => t.startsWith(o))) &&
    (haveNginx || !t.startsWith("nginx")) &&
    (haveHaproxy || !t.startsWith("haproxy")) &&
    (haveHaproxy || (t !== TWO_ROUTERS && t !== ONE_BEHIND_HAPROXY)),
);
if (!haveHaproxy) skipped.push(`${TWO_ROUTERS}, ${ONE_BEHIND_HAPROXY}: haproxy not installed`);

const simOptions = (i: number) => ({
  model: "m",
  seed: i,
  warmupSeconds: 0,
  timeScale,
  minOutputTokens: 16,
  maxOutputTokens: maxTokens,
  maxModelLen: Math.min(8192, kvCacheTokens),
  timing: { kvCacheTokens },
});

const children: BenchChild[] = [];
const rows: Row[] = [];
const t0 = Date.now();
let proxy: RunningProxy | undefined;
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => {
    void Promise.all([proxy?.stop(), ...children.map((c) => c.stop())]).then(() =>
      process.exit(130),
    );
  });
}
try {
  const sims = await Promise.all(
    Array.from({ length: replicas }, (_, i) =>
      startBenchChild("sim", simOptions(i)).then((c) => {
        children.push(c);
        return c;
      }),
    ),
  );
  const routerConfig = (policy: "round-robin" | "least-loaded" | "llmgw", routers = 1) => ({
    model: "m",
    policy,
    upstreams: sims.map((s) => s.url),
    capacity,
    routers,
  });
  const [router, secondRouter] = await Promise.all(
    [1, 2].map(() =>
      startBenchChild("router", routerConfig("llmgw")).then((c) => {
        children.push(c);
        return c;
      }),
    ),
  );
  if (router === undefined || secondRouter === undefined) throw new Error("no router child");

  /** Each workload: every target once, the one/two-router pair in every round. */
  const plan = (round: number) => targets.filter((t) => round === 1 || pairTargets.includes(t));
  for (const workload of workloads) {
    const conversations = buildWorkload(workload, size);
    for (let round = 1; round <= rounds; round++)
      for (const target of plan(round)) {
        await Promise.all(sims.map((s) => s.request("restart"))); // fresh caches and counters
        const upstreams = sims.map((s) => s.url);
        let url: string;
        if (target === TWO_ROUTERS || target === ONE_BEHIND_HAPROXY) {
          const behind = target === TWO_ROUTERS ? [router, secondRouter] : [router];
          const config = { ...routerConfig("llmgw", behind.length), upstreams };
          await Promise.all(behind.map((r) => r.request("restart", config)));
          proxy = await startHaproxy({
            upstreams: behind.map((r) => r.url),
            balance: "roundrobin",
            healthCheck: { path: "/readyz" },
          });
          url = proxy.url;
        } else if (target.startsWith("llmgw")) {
          const policy = target.slice("llmgw ".length) as "round-robin" | "least-loaded" | "llmgw";
          await router.request("restart", { ...routerConfig(policy), upstreams });
          url = router.url;
        } else {
          proxy =
            target === "nginx round-robin"
              ? await startNginx({ upstreams })
              : target === "nginx least_conn"
                ? await startNginx({ upstreams, balance: "least_conn" })
                : target === "haproxy leastconn"
                  ? await startHaproxy({ upstreams, balance: "leastconn" })
                  : await startHaproxy({ upstreams, balance: "session-hash" });
          url = proxy.url;
        }
        const { samples, wallMs } = await runOpenLoop({
          url,
          model: "m",
          conversations,
          ratePerSecond: simRate * timeScale,
          maxTokens,
          requestTimeoutMs: 120_000,
          // The same arrivals for every target of a round; another draw in the next round.
          seed: 7 + round - 1,
        });
        await proxy?.stop();
        proxy = undefined;
        const engine = await Promise.all(sims.map((s) => scrape(s.url)));
        const ok = samples.filter((s) => s.ok);
        const ttft = ok.flatMap((s) => (s.ttftMs === undefined ? [] : [s.ttftMs]));
        const e2e = ok.map((s) => s.e2eMs);
        const perReplica = engine.map((e) => e.requests);
        const mean = perReplica.reduce((a, b) => a + b, 0) / perReplica.length;
        const hits = engine.reduce((n, e) => n + e.hits, 0);
        const queries = engine.reduce((n, e) => n + e.queries, 0);
        const row: Row = {
          workload,
          target,
          round,
          requests: samples.length,
          ok: ok.length,
          failed: samples.length - ok.length,
          ttftP50Ms: quantile(ttft, 0.5) ?? Number.NaN,
          ttftP90Ms: quantile(ttft, 0.9) ?? Number.NaN,
          ttftP99Ms: quantile(ttft, 0.99) ?? Number.NaN,
          e2eP50Ms: quantile(e2e, 0.5) ?? Number.NaN,
          e2eP99Ms: quantile(e2e, 0.99) ?? Number.NaN,
          reqPerSec: (ok.length / wallMs) * 1000,
          prefixHitRate: queries > 0 ? hits / queries : 0,
          perReplica,
          spreadMaxOverMean: mean > 0 ? Math.max(...perReplica) / mean : Number.NaN,
          loadavg: loadAverage(),
          errors: [...new Set(samples.flatMap((s) => (s.error ? [s.error] : [])))].slice(0, 5),
        };
        rows.push(row);
        console.error(
          `${workload} ${target}${rounds > 1 && pairTargets.includes(target) ? ` round ${round}` : ""}: ${row.ok}/${row.requests} ok, TTFT p50 ${row.ttftP50Ms.toFixed(0)} ms, hit ${(row.prefixHitRate * 100).toFixed(0)}%, replicas ${perReplica.join("/")} (load ${row.loadavg})`,
        );
      }
  }
} finally {
  await proxy?.stop();
  await Promise.all(children.map((c) => c.stop()));
}

const f = (n: number, d = 0): string => (Number.isNaN(n) ? "-" : n.toFixed(d));
const table = formatTable(
  [
    "workload",
    "target",
    "ok/sent",
    "TTFT p50 / p90 / p99 ms",
    "e2e p50 / p99 ms",
    "req/s",
    "prefix hit",
    "per replica",
    "max/mean",
  ],
  rows.map((r) => [
    r.workload,
    rounds > 1 && pairTargets.includes(r.target) ? `${r.target} #${r.round}` : r.target,
    `${r.ok}/${r.requests}`,
    `${f(r.ttftP50Ms)} / ${f(r.ttftP90Ms)} / ${f(r.ttftP99Ms)}`,
    `${f(r.e2eP50Ms)} / ${f(r.e2eP99Ms)}`,
    f(r.reqPerSec, 1),
    `${(r.prefixHitRate * 100).toFixed(1)}%`,
    r.perReplica.join("/"),
    f(r.spreadMaxOverMean, 2),
  ]),
);

/** The issue's goals, judged on this run (only where the needed rows exist). */
const goals: { goal: string; measured: string; met: boolean }[] = [];
/**
 * A target's figures on a workload: its one row, or, for the pair run in several rounds, the
 * median of each figure over the rounds (requests per replica from the round with the median
 * max/mean).
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
const llmA = row("shared-prefix", "llmgw llmgw");
if (llmA) {
  for (const rr of ["nginx round-robin", "llmgw round-robin"] as const) {
    const base = row("shared-prefix", rr);
    if (base) {
      const x = base.ttftP50Ms / llmA.ttftP50Ms;
      goals.push({
        goal: `(a) TTFT p50 ≥ 2× better than ${rr}`,
        measured: `${x.toFixed(2)}×`,
        met: x >= 2,
      });
    }
  }
  const lc = (["nginx least_conn", "haproxy leastconn", "llmgw least-loaded"] as const)
    .flatMap((t) => {
      const r = row("shared-prefix", t);
      return r ? [r] : [];
    })
    .sort((a, b) => a.ttftP50Ms - b.ttftP50Ms)[0];
  if (lc) {
    const x = lc.ttftP50Ms / llmA.ttftP50Ms;
    goals.push({
      goal: `(a) TTFT p50 ≥ 1.3× better than the best least-connections (${lc.target})`,
      measured: `${x.toFixed(2)}×`,
      met: x >= 1.3,
    });
  }
}
const llmB = row("unique", "llmgw llmgw");
const llB = row("unique", "llmgw least-loaded");
if (llmB && llB) {
  const x = llmB.ttftP50Ms / llB.ttftP50Ms;
  goals.push({
    goal: "(b) TTFT p50 within 5% of least-loaded",
    measured: `${((x - 1) * 100).toFixed(1)}%`,
    met: x <= 1.05,
  });
}
const llmC = row("hot-prefix", "llmgw llmgw");
if (llmC) {
  goals.push({
    goal: "(c) no replica above 1.5× the mean load",
    measured: `${llmC.spreadMaxOverMean.toFixed(2)}× (${llmC.perReplica.join("/")})`,
    met: llmC.spreadMaxOverMean <= 1.5,
  });
}

/**
 * Two routers behind HAProxy round robin against one router, per workload: the ratio (or
 * difference) in each round, then the median over rounds.
 */
const versus = workloads.flatMap((w) => {
  const pairs = Array.from({ length: rounds }, (_, i) => {
    const one = rows.find((r) => r.workload === w && r.target === ONE_ROUTER && r.round === i + 1);
    const two = rows.find((r) => r.workload === w && r.target === TWO_ROUTERS && r.round === i + 1);
    return one && two ? [{ one, two }] : [];
  }).flat();
  if (pairs.length === 0) return [];
  const ttftRatios = pairs.map((p) => p.two.ttftP50Ms / p.one.ttftP50Ms);
  const hop = Array.from({ length: rounds }, (_, i) => {
    const one = pairs.find((p) => p.one.round === i + 1)?.one;
    const behind = rows.find(
      (r) => r.workload === w && r.target === ONE_BEHIND_HAPROXY && r.round === i + 1,
    );
    return one && behind ? [behind.ttftP50Ms / one.ttftP50Ms] : [];
  }).flat();
  const hitDrops = pairs.map((p) => (p.one.prefixHitRate - p.two.prefixHitRate) * 100);
  const spreads = pairs.map((p) => p.two.spreadMaxOverMean);
  return [
    {
      workload: w,
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
});
const range = (r: number[], d = 2) =>
  rounds > 1 ? ` (rounds ${f(r[0] ?? Number.NaN, d)}…${f(r[1] ?? Number.NaN, d)})` : "";
for (const v of versus) {
  goals.push({
    goal: `(${v.workload}) two routers: TTFT p50 within 10% of one router (ratio ≤ 1.10)`,
    measured: `${f(v.twoTtftP50Ms)} vs ${f(v.oneTtftP50Ms)} ms: ${f(v.ttftRatio, 3)}×${range(v.ttftRatioRange, 3)}${v.haproxyHopTtftRatio === undefined ? "" : `; one router behind HAProxy ${f(v.haproxyHopTtftRatio, 3)}×`}`,
    met: v.ttftRatio <= 1.1,
  });
  goals.push({
    goal: `(${v.workload}) two routers: prefix hit rate within 5 points of one router`,
    measured: `${(v.twoHitRate * 100).toFixed(1)}% vs ${(v.oneHitRate * 100).toFixed(1)}%: ${v.hitDropPoints <= 0 ? "+" : "−"}${Math.abs(v.hitDropPoints).toFixed(1)} points`,
    met: v.hitDropPoints <= 5,
  });
  goals.push({
    goal: `(${v.workload}) two routers: max/mean requests per replica ≤ 1.25`,
    measured: `${f(v.twoMaxOverMean, 2)}${range(v.twoMaxOverMeanRange)} (one router ${f(v.oneMaxOverMean, 2)})`,
    met: v.twoMaxOverMean <= 1.25,
  });
}

const result = {
  bench: "routing-quality",
  mode: quick ? "quick" : "full",
  loadGenerator: "open-loop Poisson client (undici, streaming; TTFT = first content delta)",
  node: process.version,
  replicas,
  timeScale,
  simulatedArrivalRate: simRate,
  wallArrivalRate: simRate * timeScale,
  workloadSize: size,
  maxTokens,
  kvCacheTokensPerReplica: kvCacheTokens,
  routerCapacityPerReplica: capacity,
  rounds,
  twoRouters:
    "2 router processes behind HAProxy (HTTP mode, balance roundrobin, GET /readyz check), each with routers = 2 in its snapshot",
  sessionHeader: "x-session-id = tenant (unique workload: one per request)",
  wallSeconds: (Date.now() - t0) / 1000,
  loadavgAtEnd: loadAverage(),
  skipped,
  rows,
  versus,
  goals,
};
const total = rows.reduce((n, r) => n + r.requests, 0);
const failed = rows.reduce((n, r) => n + r.failed, 0);
console.log(
  `\nRouting quality — ${replicas} sim engines (time scale ${timeScale}: wall ms = simulated ms ÷ ${timeScale}), ${simRate * timeScale} req/s Poisson arrivals; ${total} requests, ${failed} failed; load average at end ${result.loadavgAtEnd}`,
);
for (const s of skipped) console.log(`skipped ${s}`);
for (const w of workloads)
  console.log(`${w}: ${requestCount(buildWorkload(w, size))} requests per target`);
printReport("routing", table, goals, result);
process.exit(0);
