import { parseArgs } from "node:util";
import { request } from "undici";
import { type BenchChild, findBinary, loadAverage, startBenchChild } from "../lib/children.js";
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
  },
});
const quick = flags.quick === true;
const timeScale = Number(flags["time-scale"] ?? (quick ? 4 : 1));
/** Arrivals per second, in simulated time (scaled by the time scale for the wall clock). */
const simRate = Number(flags.rate ?? 16);
const replicas = Number(flags.replicas ?? 4);
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
  | "llmgw llmgw";
const allTargets: TargetName[] = [
  "nginx round-robin",
  "nginx least_conn",
  "haproxy leastconn",
  "haproxy session-hash",
  "llmgw round-robin",
  "llmgw least-loaded",
  "llmgw llmgw",
];

interface Row {
  workload: WorkloadName;
  target: TargetName;
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
    (haveHaproxy || !t.startsWith("haproxy")),
);

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
  const routerConfig = (policy: "round-robin" | "least-loaded" | "llmgw") => ({
    model: "m",
    policy,
    upstreams: sims.map((s) => s.url),
    capacity,
  });
  const router = await startBenchChild("router", routerConfig("llmgw"));
  children.push(router);

  for (const workload of workloads) {
    const conversations = buildWorkload(workload, size);
    for (const target of targets) {
      await Promise.all(sims.map((s) => s.request("restart"))); // fresh caches and counters
      const upstreams = sims.map((s) => s.url);
      let url: string;
      if (target.startsWith("llmgw")) {
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
        `${workload} ${target}: ${row.ok}/${row.requests} ok, TTFT p50 ${row.ttftP50Ms.toFixed(0)} ms, hit ${(row.prefixHitRate * 100).toFixed(0)}%, replicas ${perReplica.join("/")} (load ${row.loadavg})`,
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
    r.target,
    `${r.ok}/${r.requests}`,
    `${f(r.ttftP50Ms)} / ${f(r.ttftP90Ms)} / ${f(r.ttftP99Ms)}`,
    `${f(r.e2eP50Ms)} / ${f(r.e2eP99Ms)}`,
    f(r.reqPerSec, 1),
    `${(r.prefixHitRate * 100).toFixed(1)}%`,
    r.perReplica.join("/"),
    f(r.spreadMaxOverMean, 2),
  ]),
);

/** The goals, judged on this run (only where the needed rows exist). */
const goals: { goal: string; measured: string; met: boolean }[] = [];
const row = (w: WorkloadName, t: TargetName) =>
  rows.find((r) => r.workload === w && r.target === t);
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
  sessionHeader: "x-session-id = tenant (unique workload: one per request)",
  wallSeconds: (Date.now() - t0) / 1000,
  loadavgAtEnd: loadAverage(),
  skipped,
  rows,
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
