/**
 * The soak's data plane apart from the control plane: `llmgw router` processes (the built CLI)
 * watching the control plane with the router token, behind HAProxy round robin with a
 * `/readyz` health check, as docs/operations.md runs them.
 */
import path from "node:path";
import {
  type ControlPlaneProc,
  type Proc,
  runLlmgw,
  waitFor,
} from "../../apps/cli/test/cluster-harness.js";
import { type RunningProxy, startHaproxy } from "../lib/proxies.js";

/** What a router's `/readyz` says (RoutingReadiness plus a status). */
export interface RouterReadiness {
  readonly status: "ready" | "not_ready";
  readonly ready: boolean;
  readonly source: "live" | "saved" | "none";
  readonly connected: boolean;
  readonly stateAgeMs?: number;
  readonly version: number;
}

/** One `llmgw router` process on a fixed loopback port and state dir (kept across restarts). */
export class RouterProc {
  proc: Proc | undefined;
  readonly stateDir: string;
  /** The other routers and the shared key file (`--peer`, `--peer-key-file`), as docs/operations.md sets them. */
  peers: { readonly urls: readonly string[]; readonly keyFile: string } | undefined;
  constructor(
    readonly root: string,
    readonly name: string,
    readonly port: number,
    readonly cp: ControlPlaneProc,
  ) {
    this.stateDir = path.join(root, name);
  }
  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }
  /** Starts the process; resolves once it listens (ready or not: see {@link readiness}). */
  async start(): Promise<void> {
    this.proc = runLlmgw([
      "router",
      "--control-plane",
      this.cp.controlUrl,
      // The file, not the token: argv is visible in ps.
      "--router-token-file",
      path.join(this.cp.dataDir, "router-token"),
      "--state-dir",
      this.stateDir,
      "--router-id",
      this.name,
      "--listen",
      `127.0.0.1:${this.port}`,
      "--metrics-listen",
      "off",
      // Behind a balancer every client comes from one address.
      "--max-connections-per-address",
      "4096",
      ...(this.peers === undefined
        ? []
        : [
            ...this.peers.urls.flatMap((u) => ["--peer", u]),
            "--peer-key-file",
            this.peers.keyFile,
          ]),
    ]);
    const proc = this.proc;
    await waitFor(`router ${this.name} to answer /healthz`, async () => {
      if (proc.child.exitCode !== null) throw new Error(`router exited:\n${proc.output()}`);
      const res = await fetch(`${this.url}/healthz`);
      return res.ok ? true : undefined;
    });
  }
  /** The router's `/readyz` body, or undefined when it does not answer. */
  async readiness(): Promise<RouterReadiness | undefined> {
    try {
      const res = await fetch(`${this.url}/readyz`, { signal: AbortSignal.timeout(2_000) });
      return (await res.json()) as RouterReadiness;
    } catch {
      return undefined;
    }
  }
  /** True once the router streams live state from a control plane. */
  async live(): Promise<boolean> {
    const r = await this.readiness();
    return r?.ready === true && r.source === "live" && r.connected;
  }
  async kill(signal: NodeJS.Signals = "SIGKILL"): Promise<void> {
    const proc = this.proc;
    if (!proc || proc.child.exitCode !== null || proc.child.signalCode !== null) return;
    proc.child.kill(signal);
    await proc.exited;
  }
}

/** HAProxy health-check timing in front of the routers (the operations example's). */
export const ROUTER_CHECK = { path: "/readyz", intervalMs: 1_000, fall: 2, rise: 2 } as const;

/** HAProxy round robin over the routers, checking `/readyz`. */
export function startRouterBalancer(
  routers: readonly RouterProc[],
  mode: "http" | "tcp",
): Promise<RunningProxy> {
  return startHaproxy({
    upstreams: routers.map((r) => r.url),
    balance: "roundrobin",
    mode,
    healthCheck: ROUTER_CHECK,
  });
}
