/**
 * Spawning and talking to the benchmark child processes of `processes.ts`, plus the small
 * process helpers every benchmark needs (free ports, waiting for a port, finding a binary).
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { readdirSync, readFileSync, rmSync } from "node:fs";
import { createConnection } from "node:net";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { bundleAsShipped } from "./shipped.js";

const processesScript = fileURLToPath(new URL("./processes.ts", import.meta.url));
/** `processes.ts` bundled as shipped, once {@link shipBenchChildren} built it. */
let shippedScript: string | undefined;

/**
 * From now on, children of this tree run from a bundle of `processes.ts` built the way the CLI
 * is (`bundleAsShipped`), with the router's analysis worker built beside it as the CLI's
 * `router-worker.js` is: what `llmgw router` runs. From source under tsx, a router restarted
 * for each measurement compiles its worker's TypeScript during the measurement's first few
 * hundred ms (measured 2026-12-05: the only `unique` TTFTs over 155 ms of three rounds, in
 * both llmgw targets and neither baseline), and every call through esbuild's keepNames
 * wrappers (`__name`) allocates. The bundle goes when this process exits.
 */
export async function shipBenchChildren(): Promise<void> {
  if (shippedScript !== undefined) return;
  const outDir = fileURLToPath(
    new URL(`../../apps/cli/dist/.bench-children-${process.pid}/`, import.meta.url),
  );
  process.once("exit", () => rmSync(outDir, { recursive: true, force: true }));
  await bundleAsShipped(
    {
      processes: processesScript,
      "router-worker": fileURLToPath(
        new URL("../../packages/router/src/worker.ts", import.meta.url),
      ),
    },
    outDir,
  );
  shippedScript = join(outDir, "processes.js");
}

/** How this tree's children run, for a report: bundled once {@link shipBenchChildren} built the bundle. */
export function benchChildrenRunAs(): "bundled as shipped (tsup)" | "from source (tsx)" {
  return shippedScript === undefined ? "from source (tsx)" : "bundled as shipped (tsup)";
}

/** A running `processes.ts` child. */
export interface BenchChild {
  readonly proc: ChildProcess;
  /** URL printed when it became ready (updated by `restart`). */
  url: string;
  /**
   * Every URL the child serves (the `sims` role: one per engine; others: `[url]`), updated by
   * `restart`.
   */
  urls: string[];
  /** The `sims` role with KV events: where it serves its engines' blocks (`KvCacheService`). */
  kvUrl?: string;
  /** The `sims` role: where it serves its engines' loads, parsed (`EngineLoads`). */
  loadsUrl?: string;
  /** Sends an IPC request and resolves with the child's answer. */
  request<T extends Record<string, unknown>>(type: ChildRequestType, config?: unknown): Promise<T>;
  /** SIGTERM, then SIGKILL after 2 s; resolves when it exited. */
  stop(): Promise<void>;
}

/** IPC requests a child answers (`arrivals`: the `remote-router` role only). */
export type ChildRequestType = "restart" | "reset" | "report" | "arrivals";

/** The roles of `processes.ts`. */
export type BenchRole = "sim" | "sims" | "router" | "trivial" | "idle" | "floor" | "remote-router";

/** Where a child's `processes.ts` comes from. */
export interface BenchChildSource {
  /**
   * A checkout of another commit (e.g. a `git worktree` with its own `pnpm install`): its
   * `bench/lib/processes.ts` runs there, resolving that tree's packages, so one run can
   * measure the router of an earlier commit beside today's. Default: this tree.
   */
  readonly tree?: string;
  /** Added to the child's environment (secrets go here, never into the argv config). */
  readonly env?: Readonly<Record<string, string>>;
}

/** Starts `processes.ts <role> <config JSON>` and resolves once it printed its URL. */
export function startBenchChild(
  role: BenchRole,
  config: unknown,
  timeoutMs = 60_000,
  source: BenchChildSource = {},
): Promise<BenchChild> {
  // Another commit's tree runs from its own source (it may not have the bundle's entries).
  const script =
    source.tree === undefined
      ? (shippedScript ?? processesScript)
      : join(source.tree, "bench/lib/processes.ts");
  const fromSource = script !== shippedScript;
  const proc = spawn(
    process.execPath,
    [
      ...(fromSource ? ["--conditions=@llmgw/source", "--import", "tsx"] : []),
      script,
      role,
      JSON.stringify(config),
    ],
    {
      stdio: ["ignore", "pipe", "inherit", "ipc"],
      ...(source.tree === undefined ? {} : { cwd: source.tree }),
      ...(source.env === undefined ? {} : { env: { ...process.env, ...source.env } }),
    },
  );
  let nextId = 1;
  const pending = new Map<number, (msg: Record<string, unknown>) => void>();
  proc.on("message", (raw) => {
    const msg = raw as Record<string, unknown>;
    const done = pending.get(msg.id as number);
    if (done) {
      pending.delete(msg.id as number);
      done(msg);
    }
  });
  const exited = new Promise<void>((resolve) => proc.once("exit", () => resolve()));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      proc.kill("SIGKILL");
      reject(new Error(`${role} child did not start within ${timeoutMs} ms`));
    }, timeoutMs);
    let buf = "";
    const onData = (d: Buffer): void => {
      buf += d.toString();
      const line = buf.split("\n").find((l) => l.startsWith('{"url"'));
      if (!line) return;
      clearTimeout(timer);
      proc.stdout?.off("data", onData);
      proc.stdout?.resume();
      const ready = JSON.parse(line) as {
        url: string;
        urls?: string[];
        kvUrl?: string;
        loadsUrl?: string;
      };
      const child: BenchChild = {
        proc,
        url: ready.url,
        urls: ready.urls ?? [ready.url],
        ...(ready.kvUrl === undefined ? {} : { kvUrl: ready.kvUrl }),
        ...(ready.loadsUrl === undefined ? {} : { loadsUrl: ready.loadsUrl }),
        request<T extends Record<string, unknown>>(
          type: ChildRequestType,
          cfg?: unknown,
        ): Promise<T> {
          const id = nextId++;
          return new Promise<T>((res, rej) => {
            const t = setTimeout(
              () => rej(new Error(`${role} child: no answer to ${type}`)),
              30_000,
            );
            pending.set(id, (msg) => {
              clearTimeout(t);
              if (typeof msg.url === "string") child.url = msg.url;
              if (Array.isArray(msg.urls)) child.urls = msg.urls as string[];
              else if (typeof msg.url === "string") child.urls = [msg.url];
              res(msg as T);
            });
            proc.send({ id, type, ...(cfg === undefined ? {} : { config: cfg }) });
          });
        },
        async stop() {
          if (proc.exitCode !== null || proc.signalCode !== null) return;
          proc.kill("SIGTERM");
          const t = setTimeout(() => proc.kill("SIGKILL"), 2000);
          await exited;
          clearTimeout(t);
        },
      };
      resolve(child);
    };
    proc.stdout?.on("data", onData);
    proc.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`${role} child exited with ${String(code)} before it was ready`));
    });
  });
}

/**
 * A TCP port free a moment ago, from below the kernel's ephemeral range (see the supervisor's
 * `freePort`): the bench's smoke tests run in CI beside hundreds of outgoing connections.
 */
export { freePort } from "@llmgw/supervisor";

/** Resolves once 127.0.0.1:port accepts a connection; rejects after `timeoutMs`. */
export async function waitForPort(port: number, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const ok = await new Promise<boolean>((resolve) => {
      const s = createConnection({ port, host: "127.0.0.1" });
      s.once("connect", () => {
        s.destroy();
        resolve(true);
      });
      s.once("error", () => resolve(false));
    });
    if (ok) return;
    if (Date.now() > deadline) throw new Error(`port ${port} did not open in ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Absolute path of `name` on PATH (or in /usr/sbin), or undefined when it is not installed. */
export function findBinary(name: string): string | undefined {
  try {
    return execFileSync("bash", ["-c", `command -v ${name} || ls /usr/sbin/${name}`], {
      encoding: "utf8",
      stdio: ["ignore", "pipe", "ignore"],
    })
      .trim()
      .split("\n")[0];
  } catch {
    return undefined;
  }
}

/** The 1/5/15-minute load averages (Linux), recorded with every result on this shared box. */
export function loadAverage(): string {
  try {
    return readFileSync("/proc/loadavg", "utf8").split(" ").slice(0, 3).join(" ");
  } catch {
    return "unknown";
  }
}

/**
 * CPU time (user + system) of process `pid` and all its descendants, in µs, from /proc
 * (Linux only; undefined elsewhere or when the process is gone). For baselines like nginx,
 * whose worker is a child of the master.
 */
export function processTreeCpuUs(pid: number | undefined): number | undefined {
  const ticksPerSecond = 100; // USER_HZ; the same on every Linux this runs on
  let ticks: number | undefined;
  for (const p of processTree(pid)) {
    let stat: string;
    try {
      stat = readFileSync(`/proc/${p}/stat`, "utf8");
    } catch {
      continue; // exited since it was listed
    }
    // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    ticks = (ticks ?? 0) + Number(fields[11]) + Number(fields[12]);
  }
  return ticks === undefined ? undefined : (ticks * 1e6) / ticksPerSecond;
}

/** `pid` and its descendants (Linux /proc); empty when it is gone, undefined or off Linux. */
export function processTree(pid: number | undefined): number[] {
  if (pid === undefined) return [];
  const out: number[] = [];
  const visit = (p: number): void => {
    let tasks: string[];
    try {
      tasks = readdirSync(`/proc/${p}/task`);
    } catch {
      return;
    }
    out.push(p);
    for (const t of tasks) {
      let children = "";
      try {
        children = readFileSync(`/proc/${p}/task/${t}/children`, "utf8");
      } catch {}
      for (const c of children.split(" ")) if (c.trim() !== "") visit(Number(c));
    }
  };
  visit(pid);
  return out;
}
