/**
 * Usage accounting at growing request rates: llmgw's design against per-request accounting
 * (the design whose row updates stall LiteLLM near 500 req/s, litellm#31866), on one
 * PostgreSQL, in the same run.
 *
 * - **llmgw**: each request's usage is added to the router's ledger on its way out
 *   (`UsageLedger.add`, the code the router runs), sealed every second and sent as one batch to
 *   a real control plane on PostgreSQL (`RouterService.ReportUsage`: minute/hour/day rollups and
 *   the batch id, one transaction). At the end, `GetUsage` must count every request exactly.
 * - **per-request**: each request's usage is written on its way out, as a spend tracker that
 *   writes per request does: its key's spend row and its team's updated, a spend-log row
 *   inserted, through a pool of 10 connections to the same PostgreSQL.
 *
 * Requests arrive open-loop at each rate (nothing waits for accounting to start the next). A
 * rate is **sustained** when at least 95% of its requests are stored within a second of the
 * end of its window (llmgw seals once a second by design) and, per request, the accounting
 * step on the request path has a p99 under 100 ms. Reported per rate: accounted/s, the
 * request-path cost of accounting (p50/p99), what is still unwritten when the window ends, and
 * PostgreSQL's CPU per request.
 *
 *   node --conditions=@llmgw/source --import tsx bench/tenants/accounting.ts [--quick]
 *     [--rates 500,1000,2000,4000,8000,16000] [--seconds 5]
 */
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { startTestPostgres } from "@llmgw/control-plane/testing";
import { RouterService, UsageDimension, UsageGranularity } from "@llmgw/proto";
import { UsageLedger } from "@llmgw/router";
import { usageBatchToProto } from "@llmgw/wire";
import pg from "pg";
import { clockTicksPerSecond, parseProcStatCpuSeconds } from "../control-plane/proc-stats.js";
import {
  adminClient,
  ensureCli,
  readDataDirToken,
  startControlPlaneProcess,
} from "../control-plane/processes.js";
import { printReport } from "../lib/report.js";
import { formatTable } from "../lib/table.js";

const { values: flags } = parseArgs({
  options: {
    quick: { type: "boolean", default: false },
    rates: { type: "string" },
    seconds: { type: "string" },
  },
});
const quick = flags.quick === true;
const rates = (flags.rates ?? (quick ? "300,1500" : "500,1000,2000,4000,8000,16000"))
  .split(",")
  .map(Number);
const seconds = Number(flags.seconds ?? (quick ? 1 : 5));
/** Keys and teams the synthetic traffic spreads over. */
const KEYS = 200;
const TEAMS = 20;
const MODELS = ["llama-70b", "qwen-32b"];

const ticks = clockTicksPerSecond();
/** CPU seconds of every `postgres` process (the bench's throwaway server is the only one). */
function postgresCpuSeconds(): number {
  let total = 0;
  const pids = execFileSync("pgrep", ["-x", "postgres"], { encoding: "utf8" })
    .split("\n")
    .filter(Boolean);
  for (const pid of pids) {
    try {
      total += parseProcStatCpuSeconds(readFileSync(`/proc/${pid}/stat`, "utf8"), ticks);
    } catch {
      // A backend that ended between pgrep and the read.
    }
  }
  // Backends that ended took their CPU with them; the postmaster's children's totals are in
  // its cutime/cstime, which parseProcStatCpuSeconds does not add: close enough within a
  // window in which the pool's connections all stay open.
  return total;
}

/** Waits for `all`, or `ms`, whichever comes first. */
const within = (all: Promise<unknown>[], ms: number): Promise<unknown> =>
  Promise.race([Promise.all(all), new Promise((r) => setTimeout(r, ms))]);

const percentile = (sorted: number[], p: number): number =>
  sorted.length === 0
    ? Number.NaN
    : (sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))] as number);

interface Synthetic {
  readonly key: number;
  readonly model: string;
  readonly prompt: number;
  readonly completion: number;
}
const request = (i: number): Synthetic => ({
  key: (i * 7919) % KEYS,
  model: MODELS[i % MODELS.length] as string,
  prompt: 200 + ((i * 31) % 800),
  completion: 20 + ((i * 17) % 300),
});

/**
 * Calls `each(i)` for request i at `rate` per second for `seconds`, open loop (1 ms ticks,
 * catching up when a tick comes late); resolves with how many were issued.
 */
async function arrivals(rate: number, each: (i: number) => void): Promise<number> {
  const total = Math.round(rate * seconds);
  const start = performance.now();
  let issued = 0;
  while (issued < total) {
    const due = Math.min(total, Math.floor(((performance.now() - start) / 1000) * rate));
    for (; issued < due; issued++) each(issued);
    await new Promise((r) => setTimeout(r, 1));
  }
  return issued;
}

interface Row {
  readonly design: "llmgw" | "per-request";
  readonly rate: number;
  readonly issued: number;
  readonly accounted: number;
  readonly accountedPerSec: number;
  readonly pathP50Ms: number;
  readonly pathP99Ms: number;
  readonly backlogAtEnd: number;
  readonly dbCpuUsPerReq: number;
  readonly sustained: boolean;
  readonly exact?: boolean;
}

const dir = mkdtempSync(join(tmpdir(), "llmgw-bench-accounting-"));
const postgres = await startTestPostgres();
const rows: Row[] = [];
let stopCp: (() => Promise<void>) | undefined;
try {
  ensureCli(false);
  // --- llmgw: a real control plane on PostgreSQL, batches through ReportUsage.
  const storeUrlFile = join(dir, "store-url");
  writeFileSync(storeUrlFile, `${await postgres.createDatabase()}\n`, { mode: 0o600 });
  const cp = await startControlPlaneProcess({
    dir,
    heartbeatIntervalS: 2,
    nodeLostAfterS: 30,
    publicApi: false,
    storeUrlFile,
  });
  stopCp = cp.stop;
  const routerToken = readDataDirToken(cp.dataDir, "router");
  const admin = adminClient(cp.url, readDataDirToken(cp.dataDir, "admin"));
  const routerService = createClient(
    RouterService,
    createConnectTransport({ baseUrl: cp.url, httpVersion: "1.1" }),
  );
  const headers = { authorization: `Bearer ${routerToken}` };
  let batchNo = 0;
  let totalIssued = 0;
  for (const rate of rates) {
    const ledger = new UsageLedger();
    const path: number[] = [];
    let accounted = 0;
    const send = async (): Promise<void> => {
      const records = ledger.seal();
      if (records.length === 0) return;
      const n = records.reduce((s, r) => s + r.requests, 0);
      await routerService.reportUsage(
        usageBatchToProto("bench-router", { batchId: `b${batchNo++}`, records }),
        { headers, timeoutMs: 30_000 },
      );
      accounted += n;
    };
    const sends: Promise<void>[] = [];
    const sealer = setInterval(() => sends.push(send()), 1000);
    const cpu0 = postgresCpuSeconds();
    const issued = await arrivals(rate, (i) => {
      const r = request(i);
      const t0 = performance.now();
      ledger.add(Date.now(), `key-${r.key}`, `team-${r.key % TEAMS}`, r.model, {
        promptTokens: r.prompt,
        cachedTokens: 0,
        completionTokens: r.completion,
        gpuMs: 0,
        estimated: false,
        refused: false,
      });
      path.push(performance.now() - t0);
    });
    clearInterval(sealer);
    // The window ends: what a router would have sealed next second goes now.
    sends.push(send());
    await within(sends, 1000);
    const inTime = accounted;
    await Promise.all(sends);
    const cpu1 = postgresCpuSeconds();
    totalIssued += issued;
    path.sort((a, b) => a - b);
    rows.push({
      design: "llmgw",
      rate,
      issued,
      accounted: inTime,
      accountedPerSec: inTime / seconds,
      pathP50Ms: percentile(path, 0.5),
      pathP99Ms: percentile(path, 0.99),
      backlogAtEnd: issued - inTime,
      dbCpuUsPerReq: ((cpu1 - cpu0) * 1e6) / Math.max(1, issued),
      sustained: inTime >= 0.95 * issued && percentile(path, 0.99) <= 100,
    });
    console.error(`llmgw ${rate}/s: ${accounted}/${issued} accounted`);
  }
  // Exactness: the control plane counted every request once.
  const usage = await admin.getUsage({
    sinceUnixMs: BigInt(Date.now() - 86_400_000),
    granularity: UsageGranularity.DAY,
    groupBy: [UsageDimension.TENANT],
  });
  const stored = usage.rows.reduce((s, r) => s + Number(r.requests), 0);
  const exact = stored === totalIssued;
  for (const r of rows) (r as { exact?: boolean }).exact = exact;
  await cp.stop();
  stopCp = undefined;

  // --- per-request: three statements per request, as a per-request spend tracker writes.
  const pool = new pg.Pool({ connectionString: await postgres.createDatabase(), max: 10 });
  await pool.query(`CREATE TABLE key_spend (key TEXT PRIMARY KEY, tokens BIGINT NOT NULL);
    CREATE TABLE team_spend (team TEXT PRIMARY KEY, tokens BIGINT NOT NULL);
    CREATE TABLE spend_logs (id BIGSERIAL PRIMARY KEY, key TEXT NOT NULL, team TEXT NOT NULL,
      model TEXT NOT NULL, prompt_tokens INT NOT NULL, completion_tokens INT NOT NULL,
      at TIMESTAMPTZ NOT NULL DEFAULT now())`);
  await pool.query(
    `INSERT INTO key_spend SELECT 'key-' || g, 0 FROM generate_series(0, ${KEYS - 1}) g`,
  );
  await pool.query(
    `INSERT INTO team_spend SELECT 'team-' || g, 0 FROM generate_series(0, ${TEAMS - 1}) g`,
  );
  // Every pool connection open and its statements planned before the first measured rate,
  // as the control plane's are (it ran before this).
  await Promise.all(
    Array.from({ length: 200 }, (_, i) =>
      pool.query("UPDATE key_spend SET tokens = tokens + 0 WHERE key = $1", [`key-${i % KEYS}`]),
    ),
  );
  for (const rate of rates) {
    const path: number[] = [];
    let accounted = 0;
    const writes: Promise<void>[] = [];
    const cpu0 = postgresCpuSeconds();
    const issued = await arrivals(rate, (i) => {
      const r = request(i);
      const key = `key-${r.key}`;
      const team = `team-${r.key % TEAMS}`;
      const tokens = r.prompt + r.completion;
      const t0 = performance.now();
      writes.push(
        (async () => {
          await pool.query("UPDATE key_spend SET tokens = tokens + $1 WHERE key = $2", [
            tokens,
            key,
          ]);
          await pool.query("UPDATE team_spend SET tokens = tokens + $1 WHERE team = $2", [
            tokens,
            team,
          ]);
          await pool.query(
            "INSERT INTO spend_logs (key, team, model, prompt_tokens, completion_tokens) VALUES ($1, $2, $3, $4, $5)",
            [key, team, r.model, r.prompt, r.completion],
          );
          path.push(performance.now() - t0);
          accounted += 1;
        })(),
      );
    });
    await within(writes, 1000);
    const atEnd = accounted;
    await Promise.all(writes);
    const cpu1 = postgresCpuSeconds();
    path.sort((a, b) => a - b);
    const p99 = percentile(path, 0.99);
    rows.push({
      design: "per-request",
      rate,
      issued,
      accounted: atEnd,
      accountedPerSec: atEnd / seconds,
      pathP50Ms: percentile(path, 0.5),
      pathP99Ms: p99,
      backlogAtEnd: issued - atEnd,
      dbCpuUsPerReq: ((cpu1 - cpu0) * 1e6) / Math.max(1, issued),
      sustained: atEnd >= 0.95 * issued && p99 <= 100,
    });
    console.error(`per-request ${rate}/s: ${atEnd}/${issued} accounted in time`);
  }
  await pool.end();
} finally {
  await stopCp?.();
  postgres.destroy();
  rmSync(dir, { recursive: true, force: true });
}

const f = (n: number, d = 2): string => (Number.isFinite(n) ? n.toFixed(d) : "-");
const table = formatTable(
  [
    "design",
    "offered req/s",
    "accounted/s",
    "request-path p50 / p99 ms",
    "unwritten 1 s after",
    "PostgreSQL CPU µs/req",
    "sustained",
  ],
  rows.map((r) => [
    r.design,
    r.rate,
    f(r.accountedPerSec, 0),
    `${f(r.pathP50Ms, 4)} / ${f(r.pathP99Ms, 4)}`,
    r.backlogAtEnd,
    f(r.dbCpuUsPerReq, 1),
    r.sustained ? "yes" : "no",
  ]),
);
const maxSustained = (design: Row["design"]): number =>
  Math.max(0, ...rows.filter((r) => r.design === design && r.sustained).map((r) => r.rate));
const mine = maxSustained("llmgw");
const theirs = maxSustained("per-request");
const goals = [
  {
    goal: "llmgw sustains a higher request rate than per-request accounting",
    measured: `llmgw ${mine}/s, per-request ${theirs}/s (highest sustained of ${rates.join(", ")})`,
    met: mine > theirs || (mine === Math.max(...rates) && theirs <= mine),
  },
  {
    goal: "llmgw's stored usage counts every request exactly once",
    measured: rows[0]?.exact ? "exact" : "MISMATCH",
    met: rows[0]?.exact === true,
  },
];
printReport("tenants-accounting", table, goals, { seconds, rates, rows });
