/**
 * Real processes for end-to-end tests: the built `llmgw` CLI runs the control plane and
 * agents (simulated nodes, real engine processes) on loopback, and tests drive them through
 * the real admin API. Everything started here is killed by `stopAll()`, engines included.
 */

import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { create } from "@bufbuild/protobuf";
import { type Client, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import {
  ClusterService,
  type Deployment,
  DeploymentSchema,
  type DeploymentStatus,
  Engine,
  NodeState,
  ReplicaState,
} from "@llmgw/proto";
import OpenAI from "openai";

const here = path.dirname(fileURLToPath(import.meta.url));
export const repoRoot = path.resolve(here, "..", "..", "..");
export const cliMain = path.join(repoRoot, "apps", "cli", "dist", "main.js");

/** Builds the CLI bundle when it is missing (CI builds it before the tests). */
export function ensureCliBuilt(): void {
  if (existsSync(cliMain)) return;
  execFileSync("pnpm", ["--filter", "llmgw", "build"], { cwd: repoRoot, stdio: "ignore" });
}

import { freePort } from "@llmgw/agent";

export { freePort };

export interface Proc {
  readonly child: ChildProcess;
  readonly output: () => string;
  readonly exited: Promise<number | null>;
}

const started = new Set<ChildProcess>();

/** Runs `llmgw …` (this build's, or `main` of another) as a child process, collecting its output. */
export function runLlmgw(
  args: string[],
  env: Record<string, string> = {},
  main: string = cliMain,
): Proc {
  const child = spawn(process.execPath, [main, ...args], {
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

/** Thrown by a {@link waitFor} check: the wait ends at once with it (no point waiting on). */
export class GiveUp extends Error {}

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
      if (error instanceof GiveUp) throw error;
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
    /** The CLI bundle to run: this build's, or an earlier release's in mixed-version tests. */
    readonly main: string = cliMain,
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
    this.proc = runLlmgw(
      [
        "control-plane",
        "--data-dir",
        this.dataDir,
        "--listen",
        `127.0.0.1:${this.publicPort}`,
        "--control-listen",
        `127.0.0.1:${this.controlPort}`,
        ...this.extraArgs,
      ],
      {},
      this.main,
    );
    const proc = this.proc;
    await waitFor("the control plane to answer /healthz", async () => {
      if (proc.child.exitCode !== null) throw new GiveUp(`control plane exited:\n${proc.output()}`);
      const res = await fetch(`${this.controlUrl}/healthz`);
      return res.ok ? true : undefined;
    });
  }
  /**
   * A token the control plane wrote into its data dir: the join token (default), the admin
   * token (`true` or "admin") or the router token ("router").
   */
  token(kind: boolean | "join" | "admin" | "router" = "join"): string {
    const name = kind === true ? "admin" : kind === false ? "join" : kind;
    return readFileSync(path.join(this.dataDir, `${name}-token`), "utf8").trim();
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
  /** `--control-plane`: default the control plane's URL; a comma list for several instances. */
  controlPlane: string | undefined;
  /** The CLI bundle to run: this build's, or an earlier release's. */
  main: string = cliMain;
  start(extra: string[] = []): void {
    this.proc = runLlmgw(
      [
        "agent",
        "--control-plane",
        this.controlPlane ?? this.cp.controlUrl,
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
      ],
      {},
      this.main,
    );
  }
  async kill(signal: NodeJS.Signals = "SIGKILL"): Promise<void> {
    const proc = this.proc;
    if (!proc || proc.child.exitCode !== null) return;
    proc.child.kill(signal);
    await proc.exited;
  }
}

/** What `/readyz` of a router answered. */
export interface RouterReadiness {
  readonly status: number;
  readonly body: {
    readonly status?: string;
    readonly ready?: boolean;
    readonly source?: "live" | "saved" | "none";
    readonly stateAgeMs?: number;
    readonly epoch?: string;
    readonly version?: number;
    readonly connected?: boolean;
    readonly controlPlane?: string;
  };
}

/** How a {@link RouterProc} gets its router token. */
export interface RouterProcOptions {
  /** `--router-token-file` (default: a 0600 file in the test root) or `LLMGW_ROUTER_TOKEN`. */
  readonly tokenVia?: "file" | "env";
  /** The token to present; default the control plane's router token, read at each start. */
  readonly token?: string;
  /** Control-plane URLs; default the control plane's control URL. */
  readonly controlPlanes?: readonly string[];
  /** More `llmgw router` flags. */
  readonly extraArgs?: readonly string[];
  /** `--state-dir`; default `<root>/<id>`. */
  readonly stateDir?: string;
}

/**
 * An `llmgw router` process on fixed loopback ports and a fixed state dir (kept across
 * restarts, so a restarted router finds its saved state), watching `cp`.
 */
export class RouterProc {
  proc: Proc | undefined;
  readonly stateDir: string;
  readonly tokenFile: string;
  constructor(
    readonly root: string,
    readonly id: string,
    readonly cp: ControlPlaneProc,
    readonly port: number,
    readonly metricsPort: number,
    public options: RouterProcOptions = {},
  ) {
    this.stateDir = options.stateDir ?? path.join(root, id);
    this.tokenFile = path.join(root, `${id}.router-token`);
  }
  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }
  get metricsUrl(): string {
    return `http://127.0.0.1:${this.metricsPort}`;
  }
  /** Everything the current process wrote (stdout and stderr). */
  output(): string {
    return this.proc?.output() ?? "";
  }
  get running(): boolean {
    return this.proc !== undefined && this.proc.child.exitCode === null;
  }
  /**
   * Starts the router and waits until it listens (`/healthz`); with `ready` (default) also
   * until `/readyz` answers 200. A router that exits meanwhile fails the wait with its output.
   */
  async start(opts: { ready?: boolean; timeoutMs?: number } = {}): Promise<void> {
    const token = this.options.token ?? this.cp.token("router");
    const env: Record<string, string> = {};
    const tokenArgs: string[] = [];
    if (this.options.tokenVia === "env") {
      env.LLMGW_ROUTER_TOKEN = token;
    } else {
      writeFileSync(this.tokenFile, `${token}\n`, { mode: 0o600 });
      tokenArgs.push("--router-token-file", this.tokenFile);
    }
    this.proc = runLlmgw(
      [
        "router",
        "--control-plane",
        (this.options.controlPlanes ?? [this.cp.controlUrl]).join(","),
        ...tokenArgs,
        "--listen",
        `127.0.0.1:${this.port}`,
        "--metrics-listen",
        `127.0.0.1:${this.metricsPort}`,
        "--address",
        `127.0.0.1:${this.port}`,
        "--state-dir",
        this.stateDir,
        "--router-id",
        this.id,
        ...(this.options.extraArgs ?? []),
      ],
      env,
    );
    const proc = this.proc;
    const timeoutMs = opts.timeoutMs ?? 30_000;
    await waitFor(
      `router ${this.id} to answer /healthz`,
      async () => {
        if (proc.child.exitCode !== null)
          throw new GiveUp(`router ${this.id} exited:\n${proc.output()}`);
        const res = await fetch(`${this.url}/healthz`);
        await res.arrayBuffer();
        return res.ok ? true : undefined;
      },
      timeoutMs,
      50,
    );
    if (opts.ready ?? true) await this.waitReady(timeoutMs);
  }
  /** `/readyz` of the public listener. */
  async readiness(): Promise<RouterReadiness> {
    const res = await fetch(`${this.url}/readyz`);
    return { status: res.status, body: (await res.json()) as RouterReadiness["body"] };
  }
  /** Waits until `/readyz` answers 200 (and `accept` takes it); returns that answer. */
  async waitReady(
    timeoutMs = 30_000,
    accept: (r: RouterReadiness) => boolean = () => true,
  ): Promise<RouterReadiness> {
    const proc = this.proc;
    return waitFor(
      `router ${this.id} to be ready`,
      async () => {
        if (proc === undefined || proc.child.exitCode !== null)
          throw new GiveUp(`router ${this.id} is not running:\n${proc?.output() ?? ""}`);
        const r = await this.readiness();
        return r.status === 200 && accept(r) ? r : undefined;
      },
      timeoutMs,
      50,
    );
  }
  /** `/metrics` of the metrics listener, as text. */
  async metrics(): Promise<string> {
    const res = await fetch(`${this.metricsUrl}/metrics`);
    return res.text();
  }
  /** Stops the router (SIGTERM: a graceful stop) and waits for it to exit; returns its exit code. */
  async stop(signal: NodeJS.Signals = "SIGTERM"): Promise<number | null> {
    const proc = this.proc;
    if (!proc || proc.child.exitCode !== null) return proc?.child.exitCode ?? null;
    proc.child.kill(signal);
    return proc.exited;
  }
  /** SIGKILLs the router and waits for it to be gone. */
  async kill(): Promise<void> {
    await this.stop("SIGKILL");
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

/** A deployment of the simulated engine serving `sim/NAME` (more fields in `fields`). */
export function simDeployment(name: string, fields: Record<string, unknown> = {}): Deployment {
  return create(DeploymentSchema, { name, model: `sim/${name}`, engine: Engine.SIM, ...fields });
}

/** True when every replica of the deployment is READY (and there are `count` of them). */
/**
 * Applies a one-replica simulated deployment on an h100-80g (any release's control plane takes
 * it) and waits until its replica is ready; returns its status.
 */
export async function deploySimReady(
  cp: ControlPlaneProc,
  name = "chat",
): Promise<DeploymentStatus> {
  const admin = cp.admin();
  const auth = cp.adminHeaders();
  await admin.applyDeployment(
    { deployment: simDeployment(name, { gpuClass: "h100-80g", replicas: 1 }) },
    auth,
  );
  return waitFor(`${name}'s replica ready`, async () => {
    const d = (await admin.getDeployment({ name }, auth)).deployment;
    return allReady(d, 1) ? d : undefined;
  });
}

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

/** The engine API key the agent handed engine process `pid` (read from its environment). */
export function engineKeyOf(pid: number): string | undefined {
  const entry = readFileSync(`/proc/${pid}/environ`, "utf8")
    .split("\0")
    .find((e) => e.startsWith("LLMGW_ENGINE_API_KEY="));
  return entry?.slice("LLMGW_ENGINE_API_KEY=".length);
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

/** One request of a {@link ClosedLoopTraffic}: when, through which router, and how it ended. */
export interface TrafficOutcome {
  readonly router: string;
  /** `performance.now()` when it was sent and when its answer was read whole. */
  readonly startedAt: number;
  readonly endedAt: number;
  /** True for a 200 with a complete answer (content, finish reason, usage). */
  readonly ok: boolean;
  readonly status: number | undefined;
  readonly replica: string | undefined;
  /** What was wrong, for a failure. */
  readonly error: string | undefined;
}

/** A chat answer is complete when it has content, a finish reason and usage. */
function incomplete(data: {
  choices?: { message?: { content?: string | null }; finish_reason?: string | null }[];
  usage?: { completion_tokens?: number } | null;
}): string | undefined {
  const choice = data.choices?.[0];
  if (!choice?.message?.content) return "no content";
  if (choice.finish_reason !== "stop" && choice.finish_reason !== "length")
    return `finish_reason ${String(choice.finish_reason)}`;
  if (
    !data.usage ||
    !(data.usage.completion_tokens !== undefined && data.usage.completion_tokens > 0)
  )
    return "no usage";
  return undefined;
}

/**
 * Closed-loop OpenAI traffic (the official client, no retries) against routers: `loops`
 * clients per router, each sending its next chat completion when the last one ended. Every
 * outcome is recorded; `stop()` ends the loops after their current request.
 */
export class ClosedLoopTraffic {
  readonly outcomes: TrafficOutcome[] = [];
  #running = false;
  #loops: Promise<void>[] = [];
  /** Requests sent and not yet ended, per router id. */
  readonly #inFlight = new Map<string, number>();
  constructor(
    readonly routers: readonly RouterProc[],
    readonly apiKey: string,
    readonly model: string,
    readonly options: {
      loops?: number;
      maxTokens?: number;
      timeoutMs?: number;
      /** Every other loop streams (`stream: true`); a stream is ok only if it ends whole. */
      streams?: boolean;
    } = {},
  ) {}
  start(): void {
    this.#running = true;
    for (const router of this.routers) {
      const client = new OpenAI({
        baseURL: `${router.url}/v1`,
        apiKey: this.apiKey,
        maxRetries: 0,
        timeout: this.options.timeoutMs ?? 30_000,
      });
      for (let i = 0; i < (this.options.loops ?? 2); i++)
        this.#loops.push(this.#loop(router.id, client, i));
    }
  }
  async #loop(router: string, client: OpenAI, loop: number): Promise<void> {
    let n = 0;
    while (this.#running) {
      n += 1;
      const startedAt = performance.now();
      let outcome: Omit<TrafficOutcome, "router" | "startedAt" | "endedAt">;
      const content = `${router} loop ${loop} request ${n}`;
      this.#inFlight.set(router, (this.#inFlight.get(router) ?? 0) + 1);
      try {
        if (this.options.streams === true && loop % 2 === 1) {
          outcome = await this.#stream(client, content);
        } else {
          const { data, response } = await client.chat.completions
            .create({
              model: this.model,
              max_tokens: this.options.maxTokens ?? 8,
              messages: [{ role: "user", content }],
            })
            .withResponse();
          const error = incomplete(data);
          outcome = {
            ok: error === undefined,
            status: response.status,
            replica: response.headers.get("x-llmgw-replica") ?? undefined,
            error,
          };
        }
      } catch (error) {
        const status = (error as { status?: number }).status;
        outcome = { ok: false, status, replica: undefined, error: String(error) };
      }
      this.#inFlight.set(router, (this.#inFlight.get(router) ?? 1) - 1);
      this.outcomes.push({ router, startedAt, endedAt: performance.now(), ...outcome });
      // A refusal comes back in a millisecond: without a pause, a loop waiting for the routers
      // to learn a deployment would send hundreds a second and starve the box it waits on.
      if (!outcome.ok && this.#running) await new Promise((r) => setTimeout(r, 25));
    }
  }
  /**
   * One streamed completion, read to its end: ok when content arrived, the last choice chunk
   * has a finish reason and the stream ended without an error (a cut stream is not ok).
   */
  async #stream(
    client: OpenAI,
    content: string,
  ): Promise<Omit<TrafficOutcome, "router" | "startedAt" | "endedAt">> {
    const { data: stream, response } = await client.chat.completions
      .create({
        model: this.model,
        max_tokens: this.options.maxTokens ?? 8,
        stream: true,
        stream_options: { include_usage: true },
        messages: [{ role: "user", content }],
      })
      .withResponse();
    let text = "";
    let finish: string | null | undefined;
    for await (const chunk of stream) {
      const choice = chunk.choices[0];
      text += choice?.delta?.content ?? "";
      if (choice?.finish_reason) finish = choice.finish_reason;
    }
    const error =
      text === ""
        ? "stream: no content"
        : finish !== "stop" && finish !== "length"
          ? `stream: truncated (finish_reason ${String(finish)})`
          : undefined;
    return {
      ok: error === undefined,
      status: response.status,
      replica: response.headers.get("x-llmgw-replica") ?? undefined,
      error,
    };
  }
  /** Outcomes through `router` (all routers when undefined) that ended after `since`. */
  since(since: number, router?: string): TrafficOutcome[] {
    return this.outcomes.filter(
      (o) => o.endedAt > since && (router === undefined || o.router === router),
    );
  }
  failures(): TrafficOutcome[] {
    return this.outcomes.filter((o) => !o.ok);
  }
  /** Waits until every router has answered `count` requests well after `since`. */
  async waitForSuccesses(count: number, since: number, timeoutMs = 60_000): Promise<void> {
    const successes = (router: string) =>
      this.since(since, router).filter((o) => o.ok && o.startedAt > since).length;
    try {
      await waitFor(
        `${count} successful requests through each router`,
        () => this.routers.every((r) => successes(r.id) >= count) || undefined,
        timeoutMs,
        50,
      );
    } catch (error) {
      // Say what the loops saw: a timeout alone does not tell a stuck router from a failing one.
      const counts = this.routers
        .map((r) => `${r.id} ${successes(r.id)} ok, ${this.#inFlight.get(r.id) ?? 0} in flight`)
        .join("; ");
      const failed = this.since(since).filter((o) => !o.ok);
      const logs = this.routers
        .map((r) => `--- ${r.id}, last lines:\n${r.output().split("\n").slice(-25).join("\n")}`)
        .join("\n");
      throw new Error(
        `${(error as Error).message} (${counts}; ${failed.length} failed since)\n${describeFailures(failed.slice(-20), since)}\n${logs}`,
      );
    }
  }
  async stop(): Promise<TrafficOutcome[]> {
    this.#running = false;
    await Promise.all(this.#loops);
    this.#loops = [];
    return this.outcomes;
  }
}

/** `failures` one per line, for an assertion's message. */
export function describeFailures(failures: readonly TrafficOutcome[], t0 = 0): string {
  return failures
    .slice(0, 20)
    .map(
      (f) =>
        `${f.router} ${Math.round(f.startedAt - t0)}..${Math.round(f.endedAt - t0)} ms: ${f.status ?? "-"} ${f.error ?? ""}`,
    )
    .join("\n");
}

/** `name{labels} value` samples of one family in a Prometheus text exposition. */
export function metricSamples(
  text: string,
  name: string,
): { labels: Record<string, string>; value: number }[] {
  const out: { labels: Record<string, string>; value: number }[] = [];
  for (const line of text.split("\n")) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    const m = /^[^{\s]+(?:\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels: Record<string, string> = {};
    for (const l of (m[1] ?? "").matchAll(/([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"/g))
      labels[l[1] as string] = l[2] as string;
    out.push({ labels, value: Number(m[2]) });
  }
  return out;
}

/**
 * The routers' acceptance cluster: a control plane without a public API (`--no-public-api`),
 * two agents on simulated nodes, `routers` `llmgw router` processes, and an API key. Every
 * port is fixed for the root's lifetime, so each process can be restarted in place.
 */
export interface RoutersCluster {
  readonly root: string;
  readonly cp: ControlPlaneProc;
  readonly agents: readonly AgentProc[];
  readonly routers: readonly RouterProc[];
  readonly apiKey: string;
}

/** Starts a {@link RoutersCluster}; the routers are ready (a live snapshot) when it resolves. */
export async function startRoutersCluster(
  root: string,
  options: {
    nodeLostAfter?: string;
    routers?: number;
    nodes?: readonly string[];
    /** Each router the others' peer (`--peer`, one `--peer-key-file` for all). */
    peers?: boolean;
    /** More flags for every router. */
    routerArgs?: readonly string[];
  } = {},
): Promise<RoutersCluster> {
  ensureCliBuilt();
  const cp = new ControlPlaneProc(root, await freePort(), await freePort(), [
    "--heartbeat-interval",
    "500ms",
    "--node-lost-after",
    options.nodeLostAfter ?? "120s",
    "--no-public-api",
  ]);
  await cp.start();
  const agents = (options.nodes ?? ["4xh100-80g", "4xh100-80g"]).map(
    (spec, i) => new AgentProc(root, `node-${String.fromCharCode(97 + i)}`, spec, cp),
  );
  for (const agent of agents) agent.start();
  await waitFor("every agent to register", async () => {
    const res = await cp.admin().listNodes({}, cp.adminHeaders());
    return res.nodes.filter((n) => n.state === NodeState.READY).length === agents.length
      ? true
      : undefined;
  });
  const apiKey = (await cp.admin().createApiKey({ name: "routers-e2e" }, cp.adminHeaders())).secret;
  const routers: RouterProc[] = [];
  for (let i = 0; i < (options.routers ?? 2); i++) {
    routers.push(new RouterProc(root, `router-${i + 1}`, cp, await freePort(), await freePort()));
  }
  const keyFile = path.join(root, "peer-key");
  if (options.peers === true)
    writeFileSync(keyFile, `${randomBytes(32).toString("hex")}\n`, { mode: 0o600 });
  for (const r of routers) {
    const peers =
      options.peers === true
        ? [
            ...routers.filter((o) => o !== r).flatMap((o) => ["--peer", o.url]),
            "--peer-key-file",
            keyFile,
          ]
        : [];
    r.options = { ...r.options, extraArgs: [...peers, ...(options.routerArgs ?? [])] };
  }
  await Promise.all(routers.map((r) => r.start()));
  return { root, cp, agents, routers, apiKey };
}
