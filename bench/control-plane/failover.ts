/**
 * Failover benchmark (issue 19): how long the cluster goes without a control plane when the
 * one serving it is killed with SIGKILL. Side by side in one run:
 *
 * - **sqlite restart**: one control plane on SQLite, killed and restarted at once (what
 *   systemd does at best): the floor any single-instance setup pays.
 * - **postgres failover**: three instances on one PostgreSQL, the leader killed (and started
 *   again afterwards as a follower); nothing is restarted for the cluster to go on.
 *
 * Each round measures, from the kill: a control plane answering as leader again, and the
 * first heartbeat of a real `llmgw agent` (given every instance) that the new one accepted.
 *
 *   node --conditions=@llmgw/source --import tsx bench/control-plane/failover.ts [--rounds N] [--lease-ttl 2s]
 *     (--quick: one round)
 */
import { type ChildProcess, spawn } from "node:child_process";
import {
  closeSync,
  copyFileSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { startTestPostgres } from "@llmgw/control-plane/testing";
import { ClusterService, NodeState } from "@llmgw/proto";
import { createFailoverTransport } from "@llmgw/wire";
import { freePort, waitForPort } from "../lib/children.js";
import { formatTable, quantile } from "../lib/table.js";
import { ensureCli, log, readDataDirToken } from "./processes.js";

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

interface Instance {
  readonly dataDir: string;
  readonly port: number;
  readonly args: readonly string[];
  proc?: ChildProcess;
}

function spawnLogged(
  cli: string,
  args: readonly string[],
  logFile: string,
  env: Record<string, string> = {},
): ChildProcess {
  const fd = openSync(logFile, "a");
  const proc = spawn(process.execPath, [cli, ...args], {
    stdio: ["ignore", fd, fd],
    env: { ...process.env, ...env },
  });
  closeSync(fd);
  return proc;
}

async function start(cli: string, dir: string, i: Instance): Promise<void> {
  i.proc = spawnLogged(
    cli,
    [
      "control-plane",
      "--data-dir",
      i.dataDir,
      "--control-listen",
      `127.0.0.1:${i.port}`,
      "--no-public-api",
      "--heartbeat-interval",
      "500ms",
      "--node-lost-after",
      "300s",
      ...i.args,
    ],
    join(dir, `cp-${i.port}.log`),
  );
  await waitForPort(i.port, 60_000);
}

async function kill(i: Instance): Promise<void> {
  const proc = i.proc;
  if (!proc || proc.exitCode !== null) return;
  const exited = new Promise((r) => proc.once("exit", r));
  proc.kill("SIGKILL");
  await exited;
}

/** Polls `check` every 20 ms until it returns a value; throws after `timeoutMs`. */
async function until<T>(what: string, check: () => Promise<T | undefined>, timeoutMs = 30_000) {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const v = await check().catch(() => undefined);
    if (v !== undefined) return v;
    if (performance.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

interface Round {
  readonly leadsMs: number;
  readonly heartbeatMs: number;
}

/** One setup, `rounds` kills; `instances` share the data dir tokens and `storeArgs`. */
async function measure(
  cli: string,
  dir: string,
  count: number,
  storeArgs: (i: number, port: number) => string[],
  rounds: number,
  restartKilled: "at once" | "after",
): Promise<Round[]> {
  const ports = await Promise.all(Array.from({ length: count }, () => freePort()));
  const instances: Instance[] = ports.map((port, i) => ({
    dataDir: join(dir, `cp${i}`),
    port,
    args: storeArgs(i, port),
  }));
  const [first, ...rest] = instances as [Instance, ...Instance[]];
  let agent: ChildProcess | undefined;
  try {
    await start(cli, dir, first);
    for (const i of rest) {
      mkdirSync(i.dataDir, { recursive: true, mode: 0o700 });
      for (const kind of ["join", "admin", "router"])
        copyFileSync(join(first.dataDir, `${kind}-token`), join(i.dataDir, `${kind}-token`));
      await start(cli, dir, i);
    }
    const urls = instances.map((i) => `http://127.0.0.1:${i.port}`);
    const token = readDataDirToken(first.dataDir, "admin");
    const admin = createClient(
      ClusterService,
      createFailoverTransport({
        urls,
        transportFor: (baseUrl) =>
          createConnectTransport({
            baseUrl,
            httpVersion: "1.1",
            interceptors: [
              (next) => (req) => {
                req.header.set("authorization", `Bearer ${token}`);
                return next(req);
              },
            ],
          }),
      }),
    );
    const leader = async (): Promise<string | undefined> => {
      const s = await admin.getClusterStatus({}, { timeoutMs: 1_000 });
      if (s.store !== "postgres") return urls[0];
      return s.controlPlanes.find((c) => c.leader)?.url;
    };
    agent = spawnLogged(
      cli,
      [
        "agent",
        "--control-plane",
        urls.join(","),
        "--state-dir",
        join(dir, "agent"),
        "--simulate",
        "1xh100-80g",
        "--advertise-address",
        "127.0.0.1",
      ],
      join(dir, "agent.log"),
      { LLMGW_JOIN_TOKEN: readDataDirToken(first.dataDir, "join") },
    );
    const lastBeat = async () => {
      const n = (await admin.listNodes({}, { timeoutMs: 1_000 })).nodes[0];
      return n?.state === NodeState.READY ? Number(n.lastHeartbeatUnixMs) : undefined;
    };
    await until("the agent's node ready", lastBeat, 60_000);
    const out: Round[] = [];
    for (let r = 0; r < rounds; r++) {
      const url = await until("a leader", leader);
      const victim = instances.find((i) => `http://127.0.0.1:${i.port}` === url) as Instance;
      await sleep(1_000);
      const killedAt = Date.now();
      const t0 = performance.now();
      await kill(victim);
      if (restartKilled === "at once") await start(cli, dir, victim);
      await until("a new leader", async () => {
        const l = await leader();
        return l !== undefined && (restartKilled === "at once" || l !== url) ? l : undefined;
      });
      const leadsMs = performance.now() - t0;
      await until("a heartbeat the new leader accepted", async () => {
        const t = await lastBeat();
        return t !== undefined && t > killedAt ? t : undefined;
      });
      const heartbeatMs = performance.now() - t0;
      out.push({ leadsMs, heartbeatMs });
      log(
        `round ${r + 1}: leads after ${leadsMs.toFixed(0)} ms, heartbeat after ${heartbeatMs.toFixed(0)} ms`,
      );
      if (restartKilled === "after") await start(cli, dir, victim);
    }
    return out;
  } finally {
    agent?.kill("SIGKILL");
    for (const i of instances) await kill(i);
  }
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    args: process.argv.slice(2),
    options: {
      quick: { type: "boolean", default: false },
      rounds: { type: "string" },
      "lease-ttl": { type: "string", default: "2s" },
      rebuild: { type: "boolean", default: false },
    },
  });
  const rounds = Number(values.rounds ?? (values.quick ? 1 : 5));
  if (!Number.isInteger(rounds) || rounds < 1)
    throw new Error("--rounds must be a whole number ≥ 1");
  const cli = ensureCli(values.rebuild ?? false).path;
  const dir = mkdtempSync(join(tmpdir(), "llmgw-bench-failover-"));
  const pg = await startTestPostgres();
  try {
    log(`sqlite: one control plane, SIGKILL and restart at once, ${rounds} rounds`);
    const sqliteDir = join(dir, "sqlite");
    mkdirSync(sqliteDir);
    const sqlite = await measure(cli, sqliteDir, 1, () => [], rounds, "at once");
    log(
      `postgres: three instances, SIGKILL of the leader, ${rounds} rounds (--lease-ttl ${values["lease-ttl"]})`,
    );
    const urlFile = join(dir, "store-url");
    writeFileSync(urlFile, `${await pg.createDatabase()}\n`, { mode: 0o600 });
    const pgDir = join(dir, "postgres");
    mkdirSync(pgDir);
    const postgres = await measure(
      cli,
      pgDir,
      3,
      (_, port) => [
        "--store-url-file",
        urlFile,
        "--lease-ttl",
        values["lease-ttl"] as string,
        "--advertise-url",
        `http://127.0.0.1:${port}`,
      ],
      rounds,
      "after",
    );
    const median = (xs: number[]) => quantile(xs, 0.5) ?? Number.NaN;
    const max = (xs: number[]) => Math.max(...xs);
    const row = (name: string, rs: Round[]) => [
      name,
      median(rs.map((r) => r.leadsMs)).toFixed(0),
      max(rs.map((r) => r.leadsMs)).toFixed(0),
      median(rs.map((r) => r.heartbeatMs)).toFixed(0),
      max(rs.map((r) => r.heartbeatMs)).toFixed(0),
    ];
    console.log(
      `\nfailover: SIGKILL of the serving control plane → a leader answering → the agent's first heartbeat it accepted (${rounds} rounds, ms)\n`,
    );
    console.log(
      formatTable(
        ["setup", "leads p50", "leads max", "heartbeat p50", "heartbeat max"],
        [
          row("sqlite: one instance, restarted at once", sqlite),
          row(`postgres: 3 instances, lease ${values["lease-ttl"]}`, postgres),
        ],
      ),
    );
    const goal = max(postgres.map((r) => r.leadsMs)) <= 5_000;
    console.log(
      `\ngoal: a follower leads within 5 s of the leader's kill: ${goal ? "met" : "NOT met"}`,
    );
  } finally {
    pg.destroy();
    rmSync(dir, { recursive: true, force: true });
  }
}

main().catch((error: unknown) => {
  process.stderr.write(
    `bench/control-plane/failover: ${(error as Error).stack ?? String(error)}\n`,
  );
  process.exit(1);
});
