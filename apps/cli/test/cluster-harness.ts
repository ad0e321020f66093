/**
 * Real processes for end-to-end tests: the built `llmgw` CLI runs the control plane and
 * agents (simulated nodes, real engine processes) on loopback, and tests drive them through
 * the real admin API. Everything started here is killed by `stopAll()`, engines included.
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { type Client, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { ClusterService, type DeploymentStatus, ReplicaState } from "@llmgw/proto";

const here = path.dirname(fileURLToPath(import.meta.url));
export const repoRoot = path.resolve(here, "..", "..", "..");
export const cliMain = path.join(repoRoot, "apps", "cli", "dist", "main.js");

/** Builds the CLI bundle when it is missing (CI builds it before the tests). */
export function ensureCliBuilt(): void {
  if (existsSync(cliMain)) return;
  execFileSync("pnpm", ["--filter", "llmgw", "build"], { cwd: repoRoot, stdio: "ignore" });
}

export { freePort } from "@llmgw/agent";

export interface Proc {
  readonly child: ChildProcess;
  readonly output: () => string;
  readonly exited: Promise<number | null>;
}

const started = new Set<ChildProcess>();

/** Runs `llmgw …` as a child process, collecting its output. */
export function runLlmgw(args: string[], env: Record<string, string> = {}): Proc {
  const child = spawn(process.execPath, [cliMain, ...args], {
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  started.add(child);
  let out = "";
  child.stdout?.on("data", (d: Buffer) => {
    out += d.toString();
  });
  child.stderr?.on("data", (d: Buffer) => {
    out += d.toString();
  });
  const exited = new Promise<number | null>((resolve) => {
    child.on("exit", (code) => {
      started.delete(child);
      resolve(code);
    });
  });
  return { child, output: () => out, exited };
}

export async function waitFor<T>(
  what: string,
  check: () => Promise<T | undefined> | T | undefined,
  timeoutMs = 30_000,
  intervalMs = 200,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let lastError: unknown;
  for (;;) {
    try {
      const value = await check();
      if (value !== undefined && value !== false) return value;
    } catch (error) {
      lastError = error;
    }
    if (Date.now() > deadline) {
      throw new Error(
        `timed out after ${timeoutMs} ms waiting for ${what}${lastError ? `: ${String(lastError)}` : ""}`,
      );
    }
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

/** A control plane process on fixed loopback ports (kept across restarts). */
export class ControlPlaneProc {
  proc: Proc | undefined;
  readonly dataDir: string;
  constructor(
    readonly root: string,
    readonly controlPort: number,
    readonly publicPort: number,
    readonly extraArgs: string[] = [],
  ) {
    this.dataDir = path.join(root, "cp");
  }
  get controlUrl(): string {
    return `http://127.0.0.1:${this.controlPort}`;
  }
  get publicUrl(): string {
    return `http://127.0.0.1:${this.publicPort}`;
  }
  async start(): Promise<void> {
    this.proc = runLlmgw([
      "control-plane",
      "--data-dir",
      this.dataDir,
      "--listen",
      `127.0.0.1:${this.publicPort}`,
      "--control-listen",
      `127.0.0.1:${this.controlPort}`,
      ...this.extraArgs,
    ]);
    const proc = this.proc;
    await waitFor("the control plane to answer /healthz", async () => {
      if (proc.child.exitCode !== null) throw new Error(`control plane exited:\n${proc.output()}`);
      const res = await fetch(`${this.controlUrl}/healthz`);
      return res.ok ? true : undefined;
    });
  }
  token(admin = false): string {
    return readFileSync(
      path.join(this.dataDir, admin ? "admin-token" : "join-token"),
      "utf8",
    ).trim();
  }
  async stop(signal: NodeJS.Signals = "SIGTERM"): Promise<void> {
    const proc = this.proc;
    if (!proc || proc.child.exitCode !== null) return;
    proc.child.kill(signal);
    await proc.exited;
  }
  admin(): Client<typeof ClusterService> {
    const transport = createConnectTransport({ baseUrl: this.controlUrl, httpVersion: "1.1" });
    return createClient(ClusterService, transport);
  }
  adminHeaders(): { headers: Record<string, string> } {
    return { headers: { authorization: `Bearer ${this.token(true)}` } };
  }
}

/** An agent process on a simulated node. */
export class AgentProc {
  proc: Proc | undefined;
  readonly stateDir: string;
  constructor(
    readonly root: string,
    readonly name: string,
    readonly simulate: string,
    readonly cp: ControlPlaneProc,
  ) {
    this.stateDir = path.join(root, name);
  }
  start(extra: string[] = []): void {
    this.proc = runLlmgw([
      "agent",
      "--control-plane",
      this.cp.controlUrl,
      "--join-token",
      this.cp.token(),
      "--state-dir",
      this.stateDir,
      "--simulate",
      this.simulate,
      "--node-name",
      this.name,
      "--advertise-address",
      "127.0.0.1",
      ...extra,
    ]);
  }
  async kill(signal: NodeJS.Signals = "SIGKILL"): Promise<void> {
    const proc = this.proc;
    if (!proc || proc.child.exitCode !== null) return;
    proc.child.kill(signal);
    await proc.exited;
  }
}

export function tempRoot(prefix: string): string {
  return mkdtempSync(path.join(tmpdir(), prefix));
}

/** Kills every process this harness started and every engine recorded under `roots`. */
export async function stopAll(roots: string[]): Promise<void> {
  for (const child of started) child.kill("SIGKILL");
  for (const root of roots) {
    try {
      const out = execFileSync("sh", ["-c", `cat ${root}/*/pids/*.pid.json 2>/dev/null || true`], {
        encoding: "utf8",
      });
      for (const line of out.split("\n")) {
        if (!line.trim()) continue;
        let record: { pid?: number; pgid?: number };
        try {
          record = JSON.parse(line) as { pid?: number; pgid?: number };
        } catch {
          continue; // one torn pid file must not keep the others' engines alive
        }
        for (const id of [record.pgid ? -record.pgid : undefined, record.pid]) {
          if (id === undefined) continue;
          try {
            process.kill(id, "SIGKILL");
          } catch {
            // already gone
          }
        }
      }
    } catch {
      // nothing recorded
    }
    rmSync(root, { recursive: true, force: true });
  }
}

/** The deployment's status, or undefined when unknown. */
export async function deployment(
  cp: ControlPlaneProc,
  name: string,
): Promise<DeploymentStatus | undefined> {
  const res = await cp.admin().getDeployment({ name }, cp.adminHeaders());
  return res.deployment;
}

/** True when every replica of the deployment is READY (and there are `count` of them). */
export function allReady(d: DeploymentStatus | undefined, count: number): boolean {
  return (
    d !== undefined &&
    d.replicas.length === count &&
    d.replicas.every(
      (r) =>
        r.state === ReplicaState.READY &&
        r.ranks.every((k) => k.status?.state === ReplicaState.READY),
    )
  );
}

/** replica id/rank → engine pid, as reported by agents. */
export function enginePids(d: DeploymentStatus | undefined): Map<string, number> {
  const out = new Map<string, number>();
  for (const r of d?.replicas ?? []) {
    for (const rank of r.ranks) {
      if (rank.status?.pid !== undefined) out.set(`${r.replicaId}/${rank.rank}`, rank.status.pid);
    }
  }
  return out;
}
