/**
 * Web console benchmark (issue 24): the fleet page for N simulated 8-GPU nodes (default
 * 1,000) heartbeating every 2 s against a real control plane (the built CLI, its own
 * process), in a real headless Chromium (Debian's `chromium`, driven by playwright-core).
 *
 *   node --conditions=@llmgw/source --import tsx bench/console/run.ts            # 1,000 nodes
 *   node --conditions=@llmgw/source --import tsx bench/console/run.ts --quick    # 40 nodes
 *     [--agents N] [--deployments D] [--rounds R] [--seconds S] [--rebuild]
 *
 * Two measurements, each beside a baseline in the same run, medians of the rounds:
 * - **Render**: a reload of `/ui/#/fleet` until every node's card is on the page, every card
 *   in view shows all its GPU cells, and a frame with them has been drawn (the animation
 *   frame after the one that found them), timed by the page itself (`performance.now()` from
 *   navigation start): the page's HTML and bundle, the session check, `ListNodes` and
 *   `GetClusterStatus`, decoding, rendering, style, layout and the first paint. Baseline: the
 *   DOM the console drew, saved as a static HTML page (no script; served from loopback with
 *   the same stylesheet): what the browser alone needs to parse, lay out and paint it.
 * - **Live**: the fleet page left open while every node heartbeats, sampled each second:
 *   the tab's CPU (every renderer process of this browser, utime+stime from /proc, so an
 *   upper bound), its main thread's busy time (CDP `Performance.getMetrics` TaskDuration),
 *   long tasks (the page's own `PerformanceObserver`) and DOM mutations (proof that it is
 *   updating). Baseline: the same tab on the events page, which keeps the same session and
 *   event stream but reads no fleet: the floor of an open console. The control plane's own
 *   CPU in each window is printed beside it (the fleet page asks it for 1,000 nodes every
 *   2 s, on top of 500 heartbeats a second).
 *
 * The machine is shared (2 cores): the simulated agents, the control plane and Chromium all
 * run on it, and the result carries /proc/loadavg.
 */
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";
import { Engine } from "@llmgw/proto";
import { type BrowserContext, type CDPSession, chromium, type Page } from "playwright-core";
import { Fleet } from "../control-plane/fleet.js";
import { until } from "../control-plane/lost-node.js";
import {
  adminClient,
  ensureCli,
  readDataDirToken,
  startControlPlaneProcess,
} from "../control-plane/processes.js";
import { loadAverage, processTree, processTreeCpuUs } from "../lib/children.js";
import { type GoalResult, printReport } from "../lib/report.js";
import { formatTable, quantile } from "../lib/table.js";

/** The goals: render in ≤ 1 s; > 1 core for ≤ 10% of the live window's seconds. */
const GOALS = { renderMs: 1_000, overOneCoreShare: 0.1 } as const;
const CHROMIUM = process.env.LLMGW_CHROMIUM ?? "/usr/bin/chromium";

const log = (line: string): void => {
  process.stderr.write(`[bench/console] ${line}\n`);
};

const { values: args } = parseArgs({
  options: {
    quick: { type: "boolean", default: false },
    agents: { type: "string" },
    deployments: { type: "string" },
    rounds: { type: "string" },
    seconds: { type: "string" },
    rebuild: { type: "boolean", default: false },
  },
});
const quick = args.quick ?? false;
const config = {
  quick,
  agents: Number(args.agents ?? (quick ? 40 : 1_000)),
  deployments: Number(args.deployments ?? (quick ? 4 : 100)),
  rounds: Number(args.rounds ?? (quick ? 1 : 5)),
  /** Each live window (fleet, then events), seconds. */
  seconds: Number(args.seconds ?? (quick ? 5 : 20)),
  heartbeatIntervalS: 2,
  gpusPerNode: 8,
};

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
const median = (v: readonly number[]) => quantile(v, 0.5) ?? Number.NaN;

/**
 * Runs in the page before its own script (CDP, so the page's CSP does not apply): records when
 * the fleet was first on the page and drawn, long tasks, and DOM mutations. A
 * string, not a function: tsx would wrap a function's inner functions in helpers the page
 * does not have.
 */
const instrument = (nodes: number, gpusPerNode: number): string => `(() => {
  const bench = { renderedAtMs: -1, longTasks: [], mutations: 0 };
  window.__bench = bench;
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) bench.longTasks.push(e.duration);
  }).observe({ type: "longtask", buffered: true });
  // Drawn: every node's card on the page, and every card in view with all its GPU cells.
  const drawn = () => {
    const cards = document.querySelectorAll("[data-node]");
    if (cards.length < ${nodes}) return false;
    for (const card of cards) {
      if (card.getBoundingClientRect().top >= window.innerHeight) break;
      if (card.querySelectorAll("[data-gpu]").length < ${gpusPerNode}) return false;
    }
    return true;
  };
  const watch = () => {
    if (drawn())
      // This frame lays the cells out and paints them; the next callback comes after it.
      requestAnimationFrame(() => { bench.renderedAtMs = performance.now(); });
    else requestAnimationFrame(watch);
  };
  requestAnimationFrame(watch);
  new MutationObserver((records) => { bench.mutations += records.length; })
    .observe(document, { subtree: true, childList: true, characterData: true, attributes: true });
})();`;

interface BenchState {
  renderedAtMs: number;
  longTasks: number[];
  mutations: number;
}
const benchState = (page: Page) =>
  page.evaluate("window.__bench") as Promise<BenchState | undefined>;

/** Waits for the page's own record of the first frame with every cell. */
async function renderedAt(page: Page, what: string): Promise<number> {
  const ms = await until(
    `${what}: the fleet drawn`,
    async () => {
      const s = await benchState(page);
      return s !== undefined && s.renderedAtMs >= 0 ? s.renderedAtMs : undefined;
    },
    60_000,
    50,
  );
  return ms;
}

/** CPU seconds (utime+stime) of this browser's renderer processes, from /proc. */
function rendererCpuS(browserPid: number): number {
  let ticks = 0;
  for (const pid of processTree(browserPid)) {
    let cmdline: string;
    let stat: string;
    try {
      cmdline = readFileSync(`/proc/${pid}/cmdline`, "utf8");
      stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    } catch {
      continue;
    }
    if (!cmdline.includes("--type=renderer")) continue;
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    ticks += Number(fields[11]) + Number(fields[12]);
  }
  return ticks / 100;
}

/** This benchmark's browser process: the one started with its own profile directory. */
function browserPidOf(profileDir: string): number {
  for (const entry of readdirProc()) {
    try {
      const cmdline = readFileSync(`/proc/${entry}/cmdline`, "utf8");
      if (cmdline.includes(`--user-data-dir=${profileDir}`) && !cmdline.includes("--type="))
        return entry;
    } catch {}
  }
  throw new Error(`no chromium process with --user-data-dir=${profileDir}`);
}
function readdirProc(): number[] {
  return readdirSync("/proc")
    .filter((d) => /^\d+$/.test(d))
    .map(Number);
}

/** When the page's first calls and files went out and came back (Resource Timing). */
interface CallTiming {
  readonly name: string;
  readonly startMs: number;
  readonly endMs: number;
  readonly kib: number;
}
async function callTimings(page: Page): Promise<CallTiming[]> {
  const entries = (await page.evaluate(
    `performance.getEntriesByType("resource").map((e) => ({ name: e.name, startTime: e.startTime, responseEnd: e.responseEnd, size: e.encodedBodySize }))`,
  )) as { name: string; startTime: number; responseEnd: number; size: number }[];
  const seen = new Set<string>();
  const out: CallTiming[] = [];
  for (const e of entries) {
    const name = e.name.slice(e.name.lastIndexOf("/") + 1);
    if (seen.has(name)) continue;
    seen.add(name);
    out.push({
      name,
      startMs: Math.round(e.startTime),
      endMs: Math.round(e.responseEnd),
      kib: Math.round(e.size / 1024),
    });
  }
  return out;
}

interface LiveWindow {
  readonly page: "fleet" | "events";
  /** Tab CPU per one-second sample, cores. */
  readonly coresPerSecond: number[];
  /** Main thread busy per sample, share of the second. */
  readonly mainThreadPerSecond: number[];
  readonly longTasks: number;
  readonly longTaskMaxMs: number;
  readonly mutations: number;
  /** Seconds in which the page changed its DOM at all. */
  readonly secondsWithUpdates: number;
  /** The control plane's CPU over the window, cores. */
  readonly controlPlaneCores: number;
}

async function taskDurationS(cdp: CDPSession): Promise<number> {
  const { metrics } = (await cdp.send("Performance.getMetrics")) as {
    metrics: { name: string; value: number }[];
  };
  return metrics.find((m) => m.name === "TaskDuration")?.value ?? 0;
}

/** Samples the tab once a second for `seconds` while it shows `which`. */
async function liveWindow(
  page: Page,
  cdp: CDPSession,
  browserPid: number,
  controlPlanePid: number,
  which: "fleet" | "events",
  seconds: number,
): Promise<LiveWindow> {
  const cpStart = { cpuUs: processTreeCpuUs(controlPlanePid) ?? 0, at: performance.now() };
  const cores: number[] = [];
  const main: number[] = [];
  let secondsWithUpdates = 0;
  const before = (await benchState(page)) ?? { longTasks: [], mutations: 0, renderedAtMs: -1 };
  const firstLongTask = before.longTasks.length;
  let lastMutations = before.mutations;
  let lastCpu = rendererCpuS(browserPid);
  let lastTask = await taskDurationS(cdp);
  let lastAt = performance.now();
  for (let i = 0; i < seconds; i++) {
    await sleep(1_000 - ((performance.now() - lastAt) % 1_000));
    const at = performance.now();
    const cpu = rendererCpuS(browserPid);
    const task = await taskDurationS(cdp);
    const state = await benchState(page);
    const wall = (at - lastAt) / 1000;
    cores.push((cpu - lastCpu) / wall);
    main.push((task - lastTask) / wall);
    if ((state?.mutations ?? 0) > lastMutations) secondsWithUpdates++;
    lastMutations = state?.mutations ?? lastMutations;
    lastCpu = cpu;
    lastTask = task;
    lastAt = at;
  }
  const after = (await benchState(page)) ?? before;
  const longTasks = after.longTasks.slice(firstLongTask);
  const cpCpuUs = (processTreeCpuUs(controlPlanePid) ?? 0) - cpStart.cpuUs;
  return {
    controlPlaneCores: cpCpuUs / 1000 / (performance.now() - cpStart.at),
    page: which,
    coresPerSecond: cores,
    mainThreadPerSecond: main,
    longTasks: longTasks.length,
    longTaskMaxMs: Math.max(0, ...longTasks),
    mutations: after.mutations - before.mutations,
    secondsWithUpdates,
  };
}

/** Serves one static HTML page and the console's stylesheet on loopback (the baseline). */
async function serveStatic(
  html: string,
  cssPath: string,
  css: Buffer,
): Promise<Server & { url: string }> {
  const server = createServer((req, res) => {
    if (req.url === `/${cssPath}`) {
      res.writeHead(200, { "content-type": "text/css", "cache-control": "max-age=3600" });
      res.end(css);
    } else {
      res.writeHead(200, {
        "content-type": "text/html; charset=utf-8",
        "cache-control": "no-cache",
      });
      res.end(html);
    }
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const address = server.address();
  const port = typeof address === "object" && address !== null ? address.port : 0;
  return Object.assign(server, { url: `http://127.0.0.1:${port}/` });
}

async function main(): Promise<void> {
  readFileSync(CHROMIUM); // fails here, clearly, without Debian's chromium
  const cli = ensureCli(args.rebuild ?? false);
  const dir = mkdtempSync(join(tmpdir(), "llmgw-bench-console-"));
  const profileDir = join(dir, "chromium-profile");
  log(
    `console bench: ${config.agents} nodes × ${config.gpusPerNode} GPUs, ${config.deployments} deployments, ` +
      `${config.rounds} rounds, ${config.seconds} s live windows (CLI built ${cli.mtime})`,
  );
  const cp = await startControlPlaneProcess({
    dir,
    heartbeatIntervalS: config.heartbeatIntervalS,
    nodeLostAfterS: 10,
    publicApi: false,
  });
  let fleet: Fleet | undefined;
  let context: BrowserContext | undefined;
  try {
    const adminToken = readDataDirToken(cp.dataDir, "admin");
    const admin = adminClient(cp.url, adminToken);
    fleet = new Fleet({
      controlUrl: cp.url,
      joinToken: readDataDirToken(cp.dataDir, "join"),
      agents: config.agents,
      simSpec: `${config.gpusPerNode}xh100-80g@ib-a`,
    });
    const interval = await fleet.registerAll();
    fleet.start();
    log(`registered ${config.agents} agents (heartbeat ${interval} ms)`);
    let replicas = 0;
    for (let i = 0; i < config.deployments; i++) {
      const tp = [1, 2, 4, 8][i % 4] as number;
      const count = 2 + ((i * 3) % 7);
      replicas += count;
      await admin.applyDeployment({
        deployment: {
          name: `m${String(i).padStart(3, "0")}-tp${tp}`,
          model: `sim/m${i}`,
          engine: Engine.SIM,
          gpuClass: "h100-80g",
          tensorParallel: tp,
          replicas: count,
        },
      });
    }
    const status = await until(
      "every node ready and every replica READY",
      async () => {
        const s = await admin.getClusterStatus({});
        return s.nodesReady === config.agents && s.replicasReady === replicas ? s : undefined;
      },
      300_000,
      500,
    );
    log(`${replicas} replicas READY on ${status.gpusAllocated} of ${status.gpusTotal} GPUs`);

    context = await chromium.launchPersistentContext(profileDir, {
      executablePath: CHROMIUM,
      headless: true,
      viewport: { width: 1400, height: 1000 },
      args: process.getuid?.() === 0 ? ["--no-sandbox"] : [],
    });
    const browserPid = browserPidOf(profileDir);
    const page = context.pages()[0] ?? (await context.newPage());
    await page.addInitScript(instrument(config.agents, config.gpusPerNode));
    const cdp = await context.newCDPSession(page);
    await cdp.send("Performance.enable");

    // Log in once through the page; reloads keep the session cookie.
    await page.goto(`${cp.url}/ui/`);
    await page.fill("#token", adminToken);
    await page.click("button[type=submit]");
    await renderedAt(page, "first load");
    // What the operator sees, kept beside the JSON (bench/results/ is git-ignored).
    const shot = join(import.meta.dirname, "..", "results", `console-fleet-${Date.now()}.png`);
    await page.screenshot({ path: shot });
    log(`fleet page: ${shot}`);

    // The baseline page: this render's DOM, scripts removed, with the same stylesheet.
    const cssPath =
      (await page.getAttribute("link[rel=stylesheet]", "href"))?.replace("./", "") ?? "";
    const css = Buffer.from(await (await fetch(`${cp.url}/ui/${cssPath}`)).arrayBuffer());
    const snapshot = (
      (await page.evaluate("document.documentElement.outerHTML")) as string
    ).replace(/<script[^>]*>[^<]*<\/script>/g, "");
    const staticPage = await serveStatic(`<!doctype html>${snapshot}`, cssPath, css);
    log(`baseline page: ${(snapshot.length / 1024 / 1024).toFixed(1)} MiB of HTML`);

    const renders: { console: number; static: number; calls: CallTiming[] }[] = [];
    for (let r = 0; r < config.rounds; r++) {
      await page.goto(staticPage.url);
      const staticMs = await renderedAt(page, `round ${r + 1} static`);
      await page.goto(`${cp.url}/ui/#/fleet`);
      const consoleMs = await renderedAt(page, `round ${r + 1} console`);
      const calls = await callTimings(page);
      renders.push({ console: consoleMs, static: staticMs, calls });
      log(
        `render round ${r + 1}: console ${consoleMs.toFixed(0)} ms, static ${staticMs.toFixed(0)} ms; ` +
          calls.map((c) => `${c.name} ${c.startMs}→${c.endMs} ms (${c.kib} KiB)`).join(", "),
      );
    }

    const windows: LiveWindow[] = [];
    for (let r = 0; r < config.rounds; r++) {
      await page.goto(`${cp.url}/ui/#/fleet`);
      await renderedAt(page, `live round ${r + 1}`);
      await sleep(config.heartbeatIntervalS * 1000);
      windows.push(await liveWindow(page, cdp, browserPid, cp.pid, "fleet", config.seconds));
      await page.click("nav a[href='#/events']");
      await page.locator("table.events").first().waitFor();
      await sleep(1_000);
      windows.push(await liveWindow(page, cdp, browserPid, cp.pid, "events", config.seconds));
      const [f, e] = windows.slice(-2) as [LiveWindow, LiveWindow];
      log(
        `live round ${r + 1}: fleet ${median(f.coresPerSecond).toFixed(2)} cores median, ` +
          `${f.secondsWithUpdates}/${config.seconds} s with updates; events ${median(e.coresPerSecond).toFixed(2)}`,
      );
    }
    staticPage.close();

    const fleetWindows = windows.filter((w) => w.page === "fleet");
    const eventWindows = windows.filter((w) => w.page === "events");
    const all = (ws: LiveWindow[], pick: (w: LiveWindow) => number[]) => ws.flatMap(pick);
    const fleetCores = all(fleetWindows, (w) => w.coresPerSecond);
    const eventCores = all(eventWindows, (w) => w.coresPerSecond);
    const share = (v: number[]) => v.filter((c) => c > 1).length / Math.max(1, v.length);
    const renderConsole = median(renders.map((r) => r.console));
    const renderStatic = median(renders.map((r) => r.static));
    const fmt = (n: number | undefined, d = 2) => (n === undefined ? "—" : n.toFixed(d));
    const live = (ws: LiveWindow[], cores: number[]) => ({
      coresMedian: median(cores),
      coresP90: quantile(cores, 0.9),
      coresMax: Math.max(...cores),
      overOneCoreShare: share(cores),
      mainThreadMedian: median(all(ws, (w) => w.mainThreadPerSecond)),
      longTasks: ws.reduce((n, w) => n + w.longTasks, 0),
      longTaskMaxMs: Math.max(0, ...ws.map((w) => w.longTaskMaxMs)),
      secondsWithUpdates: ws.reduce((n, w) => n + w.secondsWithUpdates, 0),
      controlPlaneCores: median(ws.map((w) => w.controlPlaneCores)),
      seconds: cores.length,
    });
    const fleetLive = live(fleetWindows, fleetCores);
    const eventsLive = live(eventWindows, eventCores);
    const table = formatTable(
      ["measure", "static HTML / events page", "console fleet page", "ratio"],
      [
        [
          `render, ${config.agents} nodes × ${config.gpusPerNode} GPUs (ms, median of ${config.rounds})`,
          fmt(renderStatic, 0),
          fmt(renderConsole, 0),
          fmt(renderConsole / renderStatic),
        ],
        ["tab CPU, median (cores)", fmt(eventsLive.coresMedian), fmt(fleetLive.coresMedian), ""],
        [
          "tab CPU, p90 / max (cores)",
          `${fmt(eventsLive.coresP90)} / ${fmt(eventsLive.coresMax)}`,
          `${fmt(fleetLive.coresP90)} / ${fmt(fleetLive.coresMax)}`,
          "",
        ],
        [
          "seconds over one core",
          `${fmt(eventsLive.overOneCoreShare * 100, 0)}%`,
          `${fmt(fleetLive.overOneCoreShare * 100, 0)}%`,
          "",
        ],
        [
          "main thread busy, median",
          `${fmt(eventsLive.mainThreadMedian * 100, 0)}%`,
          `${fmt(fleetLive.mainThreadMedian * 100, 0)}%`,
          "",
        ],
        [
          "long tasks (max ms)",
          `${eventsLive.longTasks} (${fmt(eventsLive.longTaskMaxMs, 0)})`,
          `${fleetLive.longTasks} (${fmt(fleetLive.longTaskMaxMs, 0)})`,
          "",
        ],
        [
          "control plane CPU, median of windows (cores)",
          fmt(eventsLive.controlPlaneCores),
          fmt(fleetLive.controlPlaneCores),
          "",
        ],
        [
          "seconds with DOM updates",
          `${eventsLive.secondsWithUpdates}/${eventsLive.seconds}`,
          `${fleetLive.secondsWithUpdates}/${fleetLive.seconds}`,
          "",
        ],
      ],
    );
    const goals: GoalResult[] = [
      {
        goal: `fleet page renders in ≤ ${GOALS.renderMs} ms`,
        measured: `${fmt(renderConsole, 0)} ms`,
        met: renderConsole <= GOALS.renderMs,
      },
      {
        goal: `live at ${config.heartbeatIntervalS} s heartbeats: > 1 core for ≤ ${GOALS.overOneCoreShare * 100}% of seconds`,
        measured: `${fmt(fleetLive.overOneCoreShare * 100, 0)}% of ${fleetLive.seconds} s`,
        met: fleetLive.overOneCoreShare <= GOALS.overOneCoreShare,
      },
    ];
    printReport("console", table, goals, {
      bench: "console",
      quick,
      config,
      cliBuilt: cli.mtime,
      loadAverage: loadAverage(),
      cluster: { replicas, gpusAllocated: status.gpusAllocated, gpusTotal: status.gpusTotal },
      heartbeats: {
        ok: fleet.counters.ok,
        errors: fleet.counters.errors,
        errorKinds: Object.fromEntries(fleet.counters.errorKinds),
      },
      render: { rounds: renders, consoleMedianMs: renderConsole, staticMedianMs: renderStatic },
      live: { fleet: fleetLive, events: eventsLive, windows },
      goals,
    });
  } finally {
    await context?.close().catch(() => {});
    fleet?.stop();
    await cp.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
process.exit(0);
