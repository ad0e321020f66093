/**
 * The benchmark's target processes: the control plane run from the built CLI, and the
 * do-nothing Connect baseline (`noop-agent-service.ts`). Each runs as its own process so its
 * CPU and memory can be read from /proc; their logs go to files, so nothing here drains pipes.
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { closeSync, existsSync, openSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { type Client, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { ClusterService } from "@llmgw/proto";
import { freePort, waitForPort } from "../lib/children.js";

/** The repository root. */
export const repoRoot = fileURLToPath(new URL("../..", import.meta.url));
const cliMain = join(repoRoot, "apps/cli/dist/main.js");
const noopScript = fileURLToPath(new URL("./noop-agent-service.ts", import.meta.url));

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Progress lines go to stderr, so stdout holds only the table and the JSON. */
export const log = (line: string): void => {
  process.stderr.write(`[bench/control-plane] ${line}\n`);
};

/**
 * Makes sure `apps/cli/dist/main.js` exists, building it with `pnpm --filter llmgw build` when
 * it is missing or `rebuild` is set; throws a message saying what to do when that fails.
 */
export function ensureCli(rebuild: boolean): { path: string; built: boolean; mtime: string } {
  let built = false;
  if (rebuild || !existsSync(cliMain)) {
    log(
      `building the CLI (pnpm --filter llmgw build): ${rebuild ? "--rebuild" : "dist is missing"}`,
    );
    try {
      execFileSync("pnpm", ["--filter", "llmgw", "build"], {
        cwd: repoRoot,
        stdio: ["ignore", 2, 2],
      });
      built = true;
    } catch (error) {
      throw new Error(
        `cannot build the llmgw CLI (pnpm --filter llmgw build failed: ${(error as Error).message}); ` +
          `the benchmark runs the control plane from ${cliMain}: build it and rerun`,
      );
    }
    if (!existsSync(cliMain)) {
      throw new Error(`pnpm --filter llmgw build succeeded but ${cliMain} is still missing`);
    }
  }
  return { path: cliMain, built, mtime: statSync(cliMain).mtime.toISOString() };
}

/** A target process of the benchmark. */
export interface TargetProcess {
  readonly proc: ChildProcess;
  readonly pid: number;
  /** Where agents (and, for the control plane, admins) connect. */
  readonly url: string;
  readonly logFile: string;
  /** SIGTERM, SIGKILL after 10 s; resolves once it exited. */
  stop(): Promise<void>;
}

/** The control plane target, with its data dir. */
export interface ControlPlaneProcess extends TargetProcess {
  readonly dataDir: string;
}

function tail(file: string, bytes = 3000): string {
  try {
    return readFileSync(file, "utf8").slice(-bytes);
  } catch {
    return "";
  }
}

function spawnLogged(
  args: string[],
  logFile: string,
): {
  proc: ChildProcess;
  exited: Promise<string>;
  stop: () => Promise<void>;
} {
  const fd = openSync(logFile, "a");
  const proc = spawn(process.execPath, args, { stdio: ["ignore", fd, fd] });
  closeSync(fd);
  const exited = new Promise<string>((resolve) =>
    proc.once("exit", (code, signal) => resolve(`exited with ${code ?? signal}`)),
  );
  const stop = async () => {
    if (proc.exitCode !== null || proc.signalCode !== null) return;
    proc.kill("SIGTERM");
    const t = setTimeout(() => proc.kill("SIGKILL"), 10_000);
    await exited;
    clearTimeout(t);
  };
  return { proc, exited, stop };
}

/** Options of {@link startControlPlaneProcess}. */
export interface ControlPlaneProcessOptions {
  /** A fresh directory; the data dir and the log go inside. */
  readonly dir: string;
  readonly heartbeatIntervalS: number;
  readonly nodeLostAfterS: number;
  /** Extra node flags, e.g. `--inspect=127.0.0.1:PORT` for profiling. */
  readonly nodeFlags?: readonly string[];
  /**
   * False: `--no-public-api` (no in-process router; routers run apart and are the only ones
   * the control plane counts). Default true.
   */
  readonly publicApi?: boolean;
  /** A file holding a `postgres://` URL: the store is PostgreSQL instead of SQLite. */
  readonly storeUrlFile?: string;
}

/**
 * `node apps/cli/dist/main.js control-plane` on loopback ports with a fresh data dir; resolves
 * once the control listener accepts connections and both tokens are written.
 */
export async function startControlPlaneProcess(
  options: ControlPlaneProcessOptions,
): Promise<ControlPlaneProcess> {
  const dataDir = join(options.dir, "data");
  const logFile = join(options.dir, "control-plane.log");
  const controlPort = await freePort();
  const publicPort = await freePort();
  const { proc, exited, stop } = spawnLogged(
    [
      ...(options.nodeFlags ?? []),
      cliMain,
      "control-plane",
      "--data-dir",
      dataDir,
      "--listen",
      `127.0.0.1:${publicPort}`,
      "--control-listen",
      `127.0.0.1:${controlPort}`,
      "--heartbeat-interval",
      `${options.heartbeatIntervalS}s`,
      "--node-lost-after",
      `${options.nodeLostAfterS}s`,
      // Every simulated agent connects from 127.0.0.1: up to --transports × 64 sockets for
      // calls, and with streams a watch and a heartbeat stream per agent, a load stream per
      // agent serving a replica.
      "--max-control-connections",
      "8192",
      "--max-control-connections-per-address",
      "8192",
      ...(options.publicApi === false ? ["--no-public-api"] : []),
      ...(options.storeUrlFile === undefined ? [] : ["--store-url-file", options.storeUrlFile]),
    ],
    logFile,
  );
  try {
    await Promise.race([
      waitForPort(controlPort, 60_000),
      exited.then((how) => {
        throw new Error(`it ${how} before listening`);
      }),
    ]);
    for (let i = 0; !existsSync(join(dataDir, "admin-token")); i++) {
      if (i > 200) throw new Error("it listens but wrote no admin-token");
      await sleep(50);
    }
  } catch (error) {
    await stop();
    throw new Error(
      `the control plane did not start: ${(error as Error).message}; its log:\n${tail(logFile)}`,
    );
  }
  return {
    proc,
    pid: proc.pid as number,
    url: `http://127.0.0.1:${controlPort}`,
    dataDir,
    logFile,
    stop,
  };
}

/**
 * Starts the do-nothing `AgentService` baseline (`fast`: its answers through the control
 * plane's fast path); resolves once it printed its URL.
 */
export async function startNoopProcess(
  dir: string,
  intervalMs: number,
  /** Extra node flags, e.g. `--inspect=127.0.0.1:PORT` for profiling. */
  nodeFlags: readonly string[] = [],
  fast = false,
): Promise<TargetProcess> {
  const logFile = join(dir, fast ? "noop-fast.log" : "noop.log");
  const { proc, exited, stop } = spawnLogged(
    [
      ...nodeFlags,
      "--conditions=@llmgw/source",
      "--import",
      "tsx",
      noopScript,
      String(intervalMs),
      ...(fast ? ["fast"] : []),
    ],
    logFile,
  );
  const deadline = Date.now() + 60_000;
  let url: string | undefined;
  let how: string | undefined;
  void exited.then((h) => {
    how = h;
  });
  while (!url) {
    const line = tail(logFile)
      .split("\n")
      .find((l) => l.startsWith('{"url"'));
    if (line) url = (JSON.parse(line) as { url: string }).url;
    else if (how || Date.now() > deadline) {
      await stop();
      throw new Error(
        `the baseline AgentService did not start (${how ?? "timeout"}); its log:\n${tail(logFile)}`,
      );
    } else await sleep(50);
  }
  return { proc, pid: proc.pid as number, url, logFile, stop };
}

/**
 * Reads a token the control plane wrote into its data dir (`join-token`, `admin-token`,
 * `router-token`).
 */
export function readDataDirToken(dataDir: string, kind: "join" | "admin" | "router"): string {
  return readFileSync(join(dataDir, `${kind}-token`), "utf8").trim();
}

/** An admin client of `ClusterService` over HTTP/1.1 with the admin token. */
export function adminClient(controlUrl: string, token: string): Client<typeof ClusterService> {
  return createClient(
    ClusterService,
    createConnectTransport({
      baseUrl: controlUrl,
      httpVersion: "1.1",
      interceptors: [
        (next) => (req) => {
          req.header.set("authorization", `Bearer ${token}`);
          return next(req);
        },
      ],
    }),
  );
}
